"""The I/O-free part of the synchronous and asyncio clients: request ids, outgoing frames, the handshake reply,
routing what fluxd sends, deadlines, and subscription and query bookkeeping. ``client.py`` and ``aio.py`` add
the socket."""
from __future__ import annotations

import itertools
import os
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from .errors import BadJSONError, Disconnected, FluxError, FluxTimeoutError
from .protocol import Op, StoreStatus
from .wire import (PROTOCOL_VERSION, Snapshot, SubscriptionEvent, Welcome, default_socket_path, dumps, encode_frame,
                   is_valid_action_type, is_valid_store_name, loads, route_key)

Message = Dict[str, Any]


def format_seconds(seconds: float) -> str:
    """``1`` for 1.0, ``0.25`` for 0.25: seconds as people write them."""
    return f"{seconds:g}"


class Deadline:
    """When a call must be finished: ``timeout`` seconds from now (``None``: no limit)."""

    __slots__ = ("timeout", "at")

    def __init__(self, timeout: Optional[float]):
        self.timeout = timeout
        self.at = None if timeout is None else time.monotonic() + max(0.0, timeout)

    def remaining(self) -> Optional[float]:
        """Seconds left (never below 0), or ``None`` for no limit."""
        return None if self.at is None else max(0.0, self.at - time.monotonic())

    def expired(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at

    def error(self, what: str) -> FluxTimeoutError:
        """The timeout error of a call that was ``what`` (e.g. ``waiting for the reply to info``)."""
        return FluxTimeoutError(f"timed out after {format_seconds(self.timeout or 0)} s {what}")


NO_LIMIT = Deadline(None)


def resolve_socket_path(socket_path: Optional[str], env: Optional[Mapping[str, str]] = None) -> Tuple[str, str]:
    """The socket to connect to and where that came from, for error messages: ``socket_path`` if given, else
    :func:`default_socket_path` (from ``$FLUXBUS_SOCKET``, ``$XDG_RUNTIME_DIR`` or the default path)."""
    if socket_path:
        return socket_path, "socket_path"
    env = os.environ if env is None else env
    if env.get("FLUXBUS_SOCKET"):
        source = "$FLUXBUS_SOCKET"
    elif env.get("XDG_RUNTIME_DIR"):
        source = "$XDG_RUNTIME_DIR"
    else:
        source = "the default path"
    return default_socket_path(env), source


class ClientCore:
    """What both clients do without touching the socket. A subclass provides ``_send_raw(frame)``,
    ``_finish(reason)`` and the ``_on_*`` hooks that :meth:`_route` calls."""

    _closed: Optional[Disconnected]
    #: The default timeout of a call, in seconds (``None``: no limit).
    timeout: Optional[float] = None

    def __init__(self) -> None:
        self._ids: Iterator[int] = itertools.count(1)
        self._closed = None

    def _deadline(self, timeout: Optional[float]) -> Deadline:
        """The deadline of a call given ``timeout`` (``None``: the client's default :attr:`timeout`)."""
        return Deadline(self.timeout if timeout is None else timeout)

    @property
    def closed(self) -> bool:
        """Whether the connection has ended."""
        return self._closed is not None

    # -- outgoing -----------------------------------------------------------------------------------------------

    def _send_raw(self, frame: bytes, deadline: Deadline = NO_LIMIT) -> None:
        raise NotImplementedError

    @staticmethod
    def _frame(fields: Message) -> bytes:
        return encode_frame(dumps(fields))

    @staticmethod
    def _hello_frame(role: str, name: str, heartbeat: bool = True) -> bytes:
        fields: Message = {"op": Op.HELLO, "protocol": PROTOCOL_VERSION, "role": role, "name": name}
        if heartbeat:
            fields["heartbeat"] = True  # fluxd pings us when it heard nothing for welcome.limits.pingInterval
        return encode_frame(dumps(fields))

    @staticmethod
    def _pong_frame(msg: Message) -> bytes:
        """The answer to fluxd's heartbeat ``ping``: a ``pong`` with the same id."""
        fields: Message = {"op": Op.PONG}
        if "id" in msg:
            fields["id"] = msg["id"]
        return encode_frame(dumps(fields))

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    def _check_action(self, type: str) -> str:
        if not is_valid_action_type(type):
            raise ValueError(f"invalid action type {type!r}")
        return self._next_id("d")

    @staticmethod
    def _check_store(store: str) -> None:
        if not is_valid_store_name(store):
            raise ValueError(f"invalid store name {store!r}")

    @staticmethod
    def _dispatch_frame(ident: str, type: str, payload: Any, cause: Optional[int], settle: bool) -> bytes:
        fields: Message = {"op": Op.DISPATCH, "id": ident, "type": type}
        if settle:
            fields["settle"] = True
        if cause is not None:
            fields["cause"] = cause
        return ClientCore._frame_with_raw(fields, "payload", dumps(payload))

    @staticmethod
    def _query_frame(ident: str, store: str, query: Any) -> bytes:
        return ClientCore._frame_with_raw({"op": Op.QUERY, "id": ident, "store": store}, "query", dumps(query))

    @staticmethod
    def _register_fields(store: str, handles: List[str], wait_for: List[str], state: Any,
                         query_deltas: bool) -> Message:
        fields: Message = {"op": Op.REGISTER, "store": store, "handles": list(handles), "waitFor": list(wait_for)}
        if query_deltas:
            fields["queryDeltas"] = True
        if state is not None:
            fields["state"] = state
        return fields

    @staticmethod
    def _frame_with_raw(fields: Message, key: str, raw: bytes) -> bytes:
        head = dumps(fields)[:-1]  # canonical envelope without its closing brace
        return encode_frame(head + b',"' + key.encode() + b'":' + raw + b"}")

    # -- incoming -----------------------------------------------------------------------------------------------

    @staticmethod
    def _welcome_from(msg: Message) -> Welcome:
        return Welcome(msg["peer"], msg.get("server", ""), dict(msg.get("limits", {})), msg["protocol"])

    @staticmethod
    def _snapshot_from(msg: Message) -> Snapshot:
        return Snapshot(msg["store"], msg["version"], msg["seq"], msg["state"])

    def _finish(self, reason: Disconnected) -> None:
        raise NotImplementedError

    def _keep_error(self, error: FluxError) -> None:
        """Keeps an error that answers no call (the client's ``errors``)."""
        raise NotImplementedError

    def _on_welcome(self, msg: Message) -> None:
        raise NotImplementedError

    def _on_reply(self, key: str, msg: Message) -> None:
        raise NotImplementedError

    def _on_subscription(self, key: Optional[str], msg: Message) -> None:
        raise NotImplementedError

    def _on_store(self, key: Optional[str], msg: Message) -> None:
        """A message for the store this connection registered (only store workers care)."""

    def _on_error(self, key: Optional[str], msg: Message, error: FluxError) -> None:
        """Hands an ``error`` to the call or store it answers, else keeps it."""
        raise NotImplementedError

    def _route(self, body: bytes) -> None:
        try:
            msg = loads(body)
        except ValueError:
            self._keep_error(BadJSONError(f"unreadable frame from fluxd: {body[:80]!r}"))
            return
        self._route_message(msg)

    def _route_message(self, msg: Any) -> None:
        if not isinstance(msg, dict):
            return
        if msg.get("op") == Op.WELCOME:
            self._on_welcome(msg)
            return
        kind, key = route_key(msg)
        if kind == "reply" and key is not None:
            self._on_reply(key, msg)
        elif kind == "subscription":
            self._on_subscription(key, msg)
        elif kind == "store":
            self._on_store(key, msg)
        elif kind == "error":
            error = FluxError.from_frame(msg)
            self._on_error(key, msg, error)
            if error.fatal:
                self._finish(Disconnected(f"fluxd closed the connection: {error}", error))
        elif kind == "ping":
            try:
                self._send_raw(self._pong_frame(msg))
            except FluxError:
                pass  # the connection is ending; the reader will see it
        elif kind == "bye":
            self._finish(Disconnected(f"fluxd said bye ({msg.get('reason')})"))


class SubscriptionCore:
    """A subscription's state: ``status`` (``up``, ``down`` or ``unknown``: no store of that name has registered
    yet), the ``latest`` and ``first_snapshot`` snapshots and the ``store-down``/``store-up`` ``events``. A
    subclass queues each newer snapshot in ``_enqueue``.

    ``timeout`` is the one given to ``subscribe``: when set, waiting for the first snapshot must end within it
    counted from the ``subscribe`` call, and each later wait of ``next()`` or of iteration within it."""

    def __init__(self, client: Any, store: str):
        self.client = client
        self.store = store
        self.status: Optional[str] = None
        self.latest: Optional[Snapshot] = None
        self.first_snapshot: Optional[Snapshot] = None
        self.events: List[SubscriptionEvent] = []
        self.timeout: Optional[float] = None
        self._first_deadline: Optional[Deadline] = None
        self._down_reason: Optional[str] = None

    def _enqueue(self, snap: Snapshot) -> None:
        raise NotImplementedError

    def _status_changed(self) -> None:
        """Called after ``status`` changed (subclasses wake whoever waits for it)."""

    def _subscribed(self, msg: Message, timeout: Optional[float], deadline: Deadline) -> None:
        """Takes the ``subscribed`` reply of a ``subscribe`` call made with ``timeout`` and ``deadline``."""
        status = msg.get("status")
        self.status = status if isinstance(status, str) else StoreStatus.UNKNOWN
        self.timeout = timeout
        self._first_deadline = deadline if timeout is not None else None
        self._status_changed()

    def _deliver(self, msg: Message) -> None:
        op = msg["op"]
        if op == Op.SNAPSHOT:
            snap = Snapshot(msg["store"], msg["version"], msg["seq"], msg.get("state"))
            if self.latest is None or snap.version > self.latest.version:
                self.latest = snap
                if self.first_snapshot is None:
                    self.first_snapshot = snap
                self._enqueue(snap)
        elif op == Op.STORE_DOWN:
            self.status = StoreStatus.DOWN
            self._down_reason = msg.get("reason") if isinstance(msg.get("reason"), str) else None
            self.events.append(SubscriptionEvent("store-down", self.store, reason=msg.get("reason")))
            self._status_changed()
        elif op == Op.STORE_UP:
            self.status = StoreStatus.UP
            self.events.append(SubscriptionEvent("store-up", self.store, version=msg.get("version")))
            self._status_changed()

    def _wait_deadline(self, timeout: Optional[float], default: Optional[float]) -> Deadline:
        """How long a wait for a snapshot may take: ``timeout`` if given; else, for a subscription made with a
        timeout, what is left of it until the first snapshot and the whole timeout for each later one; else
        ``default``."""
        if timeout is not None:
            return Deadline(timeout)
        if self.timeout is not None:
            if self.first_snapshot is None and self._first_deadline is not None:
                return self._first_deadline
            return Deadline(self.timeout)
        return Deadline(default)

    def why_no_snapshot(self) -> str:
        """Why no (newer) snapshot is there, in words: e.g. ``no store named 'x' has registered yet``."""
        if self.status == StoreStatus.UNKNOWN:
            return f"no store named {self.store!r} has registered yet"
        if self.status == StoreStatus.DOWN:
            reason = f" ({self._down_reason})" if self._down_reason else ""
            return f"store {self.store!r} is down{reason}"
        if self.latest is None:
            return f"store {self.store!r} is up but has no state yet"
        return f"store {self.store!r} made no version after {self.latest.version}"

    def _timeout_error(self, deadline: Deadline) -> FluxTimeoutError:
        return deadline.error(f"waiting for a snapshot of {self.store!r}: {self.why_no_snapshot()}")

    def _status_timeout_error(self, deadline: Deadline, wanted: Tuple[str, ...]) -> FluxTimeoutError:
        why = self.why_no_snapshot() if self.status != StoreStatus.UP else f"store {self.store!r} is up"
        return deadline.error(f"waiting for store {self.store!r} to be {' or '.join(wanted)}: {why}")


class QueryReceiptCore:
    """An active query's identity: ``id``, ``store``, ``query``, and whether it is still ``active``."""

    def __init__(self, client: Any, ident: str, store: str, query: Any):
        self.client = client
        self.id = ident
        self.store = store
        self.query = query
        self.active = True
