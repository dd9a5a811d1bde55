"""The I/O-free part of the synchronous and asyncio clients: request ids, outgoing frames, the handshake reply,
routing what fluxd sends, and subscription and query bookkeeping. ``client.py`` and ``aio.py`` add the socket."""
from __future__ import annotations

import itertools
from typing import Any, Dict, Iterator, List, Optional

from .wire import (PROTOCOL_VERSION, Disconnected, FluxError, Snapshot, SubscriptionEvent, Welcome, dumps,
                   encode_frame, is_valid_action_type, is_valid_store_name, loads, route_key)

Message = Dict[str, Any]


class ClientCore:
    """What both clients do without touching the socket. A subclass provides ``_send_raw(frame)``,
    ``_finish(reason)`` and the ``_on_*`` hooks that :meth:`_route` calls."""

    _closed: Optional[Disconnected]

    def __init__(self) -> None:
        self._ids: Iterator[int] = itertools.count(1)
        self._closed = None

    @property
    def closed(self) -> bool:
        """Whether the connection has ended."""
        return self._closed is not None

    # -- outgoing -----------------------------------------------------------------------------------------------

    def _send_raw(self, frame: bytes) -> None:
        raise NotImplementedError

    def _send(self, fields: Message) -> None:
        self._send_raw(encode_frame(dumps(fields)))

    def _send_hello(self, role: str, name: str, heartbeat: bool = True) -> None:
        self._send_raw(self._hello_frame(role, name, heartbeat))

    @staticmethod
    def _hello_frame(role: str, name: str, heartbeat: bool = True) -> bytes:
        fields: Message = {"op": "hello", "protocol": PROTOCOL_VERSION, "role": role, "name": name}
        if heartbeat:
            fields["heartbeat"] = True  # fluxd pings us when it heard nothing for welcome.limits.pingInterval
        return encode_frame(dumps(fields))

    @staticmethod
    def _pong_frame(msg: Message) -> bytes:
        """The answer to fluxd's heartbeat ``ping``: a ``pong`` with the same id."""
        fields: Message = {"op": "pong"}
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
        fields: Message = {"op": "dispatch", "id": ident, "type": type}
        if settle:
            fields["settle"] = True
        if cause is not None:
            fields["cause"] = cause
        return ClientCore._frame_with_raw(fields, "payload", dumps(payload))

    @staticmethod
    def _query_frame(ident: str, store: str, query: Any) -> bytes:
        return ClientCore._frame_with_raw({"op": "query", "id": ident, "store": store}, "query", dumps(query))

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
            self._keep_error(FluxError("bad-json", f"unreadable frame from fluxd: {body[:80]!r}"))
            return
        self._route_message(msg)

    def _route_message(self, msg: Any) -> None:
        if not isinstance(msg, dict):
            return
        if msg.get("op") == "welcome":
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
    """A subscription's state: ``status``, the ``latest`` snapshot and the ``store-down``/``store-up``
    ``events``. A subclass queues each newer snapshot in ``_enqueue``."""

    def __init__(self, client: Any, store: str):
        self.client = client
        self.store = store
        self.status: Optional[str] = None
        self.latest: Optional[Snapshot] = None
        self.events: List[SubscriptionEvent] = []

    def _enqueue(self, snap: Snapshot) -> None:
        raise NotImplementedError

    def _deliver(self, msg: Message) -> None:
        op = msg["op"]
        if op == "snapshot":
            snap = Snapshot(msg["store"], msg["version"], msg["seq"], msg.get("state"))
            if self.latest is None or snap.version > self.latest.version:
                self.latest = snap
                self._enqueue(snap)
        elif op == "store-down":
            self.status = "down"
            self.events.append(SubscriptionEvent("store-down", self.store, reason=msg.get("reason")))
        elif op == "store-up":
            self.status = "up"
            self.events.append(SubscriptionEvent("store-up", self.store, version=msg.get("version")))


class QueryReceiptCore:
    """An active query's identity: ``id``, ``store``, ``query``, and whether it is still ``active``."""

    def __init__(self, client: Any, ident: str, store: str, query: Any):
        self.client = client
        self.id = ident
        self.store = store
        self.query = query
        self.active = True
