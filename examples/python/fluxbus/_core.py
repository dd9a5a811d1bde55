"""The I/O-free part of the synchronous and asyncio clients: request ids, outgoing frames, the handshake reply,
routing what fluxd sends, deadlines, and subscription and query bookkeeping. ``client.py`` and ``aio.py`` add
the socket."""
from __future__ import annotations

import collections
import itertools
import logging
import os
import time
import uuid
from typing import Any, Callable, Deque, Dict, Iterator, List, Mapping, Optional, Tuple, Union

from .errors import (BadJSONError, Disconnected, FluxError, FluxTimeoutError, NotSentError, OutcomeUnknownError)
from .log_format import NOTICE
from .protocol import BYE_RESTART, Op, RecoverStatus, StoreStatus
from .reconnect import ConnectionCallback, ConnectionEvent, Reconnect, ReconnectOption, reconnect_policy
from .patch import PatchError, apply as apply_patch, parse_pointer
from .pieces import REFUSAL_FIRST_DELAY, REFUSAL_MAX_DELAY, fits, refusal_delay
from .wire import (PROTOCOL_VERSION, Snapshot, SubscriptionEvent, Subtree, Welcome, default_socket_path, dumps,
                   encode_frame, is_valid_action_type, is_valid_store_name, loads, route_key, subscription_key)

Message = Dict[str, Any]
log = logging.getLogger("fluxbus")
#: Ids one ``recover`` may carry (SPEC §8.12).
MAX_RECOVER_IDS = 4096
#: Codes of a refused registration that registering again cannot cure: not retried (SPEC §16.6).
FINAL_REFUSALS = frozenset({"bad-message", "forbidden", "cycle"})


def format_seconds(seconds: float) -> str:
    """``1`` for 1.0, ``0.25`` for 0.25: seconds as people write them."""
    return f"{seconds:g}"


def _max_frame(welcome: Any) -> Optional[int]:
    """``welcome.limits.maxFrame`` of a ``welcome`` (a message or a :class:`Welcome`), or ``None``."""
    limits = welcome.get("limits") if isinstance(welcome, dict) else getattr(welcome, "limits", None)
    value = limits.get("maxFrame") if isinstance(limits, dict) else None
    return value if isinstance(value, int) and value > 0 else None


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


def describe(error: BaseException) -> str:
    """An error in one line for a connection event: its message without the code, first line only."""
    text = error.message if isinstance(error, FluxError) and error.message else str(error)
    return text.splitlines()[0] if text else type(error).__name__


def _event_line(event: ConnectionEvent) -> Tuple[int, str]:
    """The level and message of the log line for a connection event: the loss and the return once each (notice:
    reconnecting is by design, not a warning), each attempt at debug, giving up at warning (docs/logging.md)."""
    if event.kind == ConnectionEvent.DISCONNECTED:
        if event.will_reconnect:
            return NOTICE, f"connection to fluxd lost ({event.reason}); reconnecting"
        return NOTICE, f"connection to fluxd ended ({event.reason})"
    if event.kind == ConnectionEvent.RECONNECTED:
        epoch = " (another epoch: fluxd's history changed)" if event.epoch_changed else ""
        return NOTICE, f"reconnected to fluxd after {event.attempt} attempt(s){epoch}"
    if event.kind == ConnectionEvent.GAVE_UP:
        return logging.WARNING, str(event)
    return logging.DEBUG, str(event)


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
    ``_finish(reason)`` and the ``_on_*`` hooks that :meth:`_route` calls.

    Reconnection bookkeeping lives here too: the session id sent as ``hello.session`` on every connection, the
    live queries and the unsettled dispatches to declare and ``recover`` again, the frames that re-establish a
    connection's subscriptions, queries and stores (:meth:`_replay_frames`), and the connection events."""

    _closed: Optional[Disconnected]
    #: The default timeout of a call, in seconds (``None``: no limit).
    timeout: Optional[float] = None
    _subscriptions: Dict[str, Any]
    _stores: Dict[str, Any]

    def __init__(self, reconnect: ReconnectOption = None, on_connection_event: Optional[ConnectionCallback] = None,
                 session: Optional[str] = None) -> None:
        self._ids: Iterator[int] = itertools.count(1)
        self._closed = None
        #: The reconnection policy (:class:`fluxbus.Reconnect`).
        self.reconnect: Reconnect = reconnect_policy(reconnect)
        #: This client's session (``hello.session``, SPEC §15.4): the same on every connection it makes.
        self.session: str = session or uuid.uuid4().hex
        #: Called with each :class:`fluxbus.ConnectionEvent` (see :attr:`connection_events`).
        self.on_connection_event: Optional[ConnectionCallback] = on_connection_event
        #: The latest connection events, oldest first.
        self.connection_events: Deque[ConnectionEvent] = collections.deque(maxlen=64)
        #: ``welcome.epoch`` of the current (or last) connection; ``None`` from a fluxd older than 0.3.0.
        self.epoch: Optional[str] = None
        #: The seq fluxd gave the last action :meth:`dispatch` waited for the acceptance of (SPEC §8.3).
        self.last_seq: Optional[int] = None
        self._live_queries: Dict[str, bytes] = {}  # query id -> its query frame, declared again on reconnecting
        self._unsettled: Dict[str, int] = {}  # id of a settle dispatch sent -> generation of the connection
        self._recovering: Dict[str, List[str]] = {}  # id of a recover request -> the dispatch ids it asks about
        self._closing = False  # close() was called, or the client ended: the end of a connection is not a loss
        self._user_closed = False  # close() or abort() was called
        self._established = False  # the first handshake succeeded (reconnecting needs one)

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
    def _hello_frame(role: str, name: str, heartbeat: bool = True, session: Optional[str] = None) -> bytes:
        fields: Message = {"op": Op.HELLO, "protocol": PROTOCOL_VERSION, "role": role, "name": name}
        if heartbeat:
            fields["heartbeat"] = True  # fluxd pings us when it heard nothing for welcome.limits.pingInterval
        if session:
            fields["session"] = session  # settlements survive a lost connection (SPEC §15.4)
        return encode_frame(dumps(fields))

    @staticmethod
    def _pong_frame(msg: Message) -> bytes:
        """The answer to fluxd's heartbeat ``ping``: a ``pong`` with the same id."""
        fields: Message = {"op": Op.PONG}
        if "id" in msg:
            fields["id"] = msg["id"]
        return encode_frame(dumps(fields))

    def speaks_deltas(self) -> bool:
        """Whether fluxd speaks SPEC §16 (patches, delta and path subscriptions): it announces
        ``limits.deltaHistory`` in ``welcome`` (since fluxd 0.4.0)."""
        welcome = getattr(self, "welcome", None)
        return welcome is not None and "deltaHistory" in welcome.limits

    def _new_subscription(self, store: str, path: Optional[str], deltas: Optional[bool]) -> Any:
        """Checks a subscription's arguments; returns its key."""
        self._check_store(store)
        if path is not None:
            if not isinstance(path, str) or len(path.encode("utf-8")) > 1024:
                raise ValueError(f"invalid path {path!r}: a JSON Pointer of at most 1024 bytes")
            parse_pointer(path)  # raises PointerError (a ValueError) when malformed
            if deltas:
                raise ValueError("a path subscription cannot ask for deltas (SPEC §16.3)")
            if not self.speaks_deltas():
                raise ValueError("this fluxd does not support path subscriptions (fluxd 0.4.0 or newer does)")
        return subscription_key(store, path)

    def _resync(self, sub: Any) -> None:
        """Sends ``subscribe`` again for ``sub`` (without ``from``): fluxd answers with the whole retained snapshot.
        Called while routing, when a delta does not follow the version held."""
        raise NotImplementedError

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
    def _dispatch_frame(ident: str, type: str, payload: Any, cause: Optional[int], settle: bool,
                        ack: bool = False) -> bytes:
        fields: Message = {"op": Op.DISPATCH, "id": ident, "type": type}
        if settle:
            fields["settle"] = True
        if ack:
            fields["ack"] = True
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

    @staticmethod
    def _change_frame(fields: Message, state: Any = None, patch: Any = None, base: Optional[int] = None) -> bytes:
        """A ``done``, ``state`` or ``patch`` frame: ``fields`` plus the new ``state`` and/or the ``patch`` to it
        (SPEC §16.2; either may be given already encoded, as bytes) and the ``base`` version the patch applies
        to."""
        fields = dict(fields)
        if base is not None:
            fields["base"] = base
        raws: List[Tuple[str, bytes]] = []
        for key, value in (("patch", patch), ("state", state)):
            if isinstance(value, (bytes, bytearray)):
                raws.append((key, bytes(value)))
            elif value is not None:
                fields[key] = value
        body = dumps(fields)
        if raws:
            body = body[:-1] + b"".join(b',"' + key.encode() + b'":' + raw for key, raw in raws) + b"}"
        return encode_frame(body)

    # -- reconnecting -------------------------------------------------------------------------------------------

    def _reconnects(self) -> bool:
        """Whether a connection that ends now is followed by reconnecting."""
        return (self.reconnect.enabled and self._established and not self._closing and self._closed is None)

    def _emit(self, event: ConnectionEvent) -> None:
        """Records a connection event and hands it to :attr:`on_connection_event` (whose failures are logged)."""
        self.connection_events.append(event)
        level, text = _event_line(event)
        log.log(level, text, extra={"client": self.name or self.role})  # type: ignore[attr-defined]
        callback = self.on_connection_event
        if callback is not None:
            try:
                self._deliver_event(callback, event)
            except Exception:  # a UI callback must not break the connection
                log.exception("the connection event callback failed")

    def _ended_for_good(self, end: Disconnected) -> None:
        """A connection ended and the client does not reconnect (reconnection off): tells the UI, unless the
        user closed the client."""
        if self._established and not self._user_closed:
            self._emit(ConnectionEvent(ConnectionEvent.DISCONNECTED, reason=describe(end), will_reconnect=False,
                                       error=end.error))

    def _deliver_event(self, callback: ConnectionCallback, event: ConnectionEvent) -> None:
        callback(event)

    def _epoch_changed(self, epoch: Optional[str]) -> bool:
        """Whether a connection with ``welcome.epoch`` = ``epoch`` belongs to another history than the last one
        (an epoch missing on either side counts as changed: an older fluxd does not keep seqs across runs)."""
        return epoch is None or self.epoch is None or epoch != self.epoch

    def _replay_frames(self, epoch_changed: bool, welcome: Optional[Message] = None,
                       generation: int = 0) -> Tuple[List[bytes], List[str]]:
        """What a new connection (``generation``, whose ``welcome`` it is) sends right after ``welcome``, before
        anything else (SPEC §15.5): ``subscribe`` for every subscription, the live queries again, ``register`` for
        every store (with its state only if the frame fits in ``maxFrame``, SPEC §16.6), then (same epoch)
        ``recover`` for the settle dispatches sent and not settled. Returns the frames and, when the epoch
        changed, the ids that cannot be recovered."""
        frames = [sub._subscribe_frame(resume=not epoch_changed) for sub in list(self._subscriptions.values())]
        frames += list(self._live_queries.values())
        max_frame = _max_frame(welcome)
        for registration in list(self._stores.values()):
            if registration._sent:
                frames.append(registration._register_frame(max_frame))
                registration._register_sent(generation)
        ids = list(self._unsettled)
        if epoch_changed:
            return frames, ids
        for start in range(0, len(ids), MAX_RECOVER_IDS):
            chunk = ids[start:start + MAX_RECOVER_IDS]
            key = self._next_id("rc")
            self._recovering[key] = chunk
            frames.append(self._frame({"op": Op.RECOVER, "id": key, "ids": chunk}))
        return frames, []

    def _registration_hold(self) -> float:
        """Seconds to wait, at least, before reconnecting: the longest wait a refused registration asks for."""
        latest = max((registration.retry_at for registration in list(self._stores.values())), default=0.0)
        return max(0.0, latest - time.monotonic())

    def _store_frame_read(self, msg: Any, generation: int) -> Optional[str]:
        """Where frames are read, before they are routed: ``registered`` confirms a registration, an ``error``
        naming a store whose registration is awaited refuses it (SPEC §16.6). Returns why the connection must be
        ended to register again after the wait (a refusal the connection survived), else ``None``."""
        if not isinstance(msg, dict) or not self._stores:
            return None
        op = msg.get("op")
        if op == Op.REGISTERED:
            registration = self._stores.get(msg.get("store"))  # type: ignore[arg-type]
            if registration is not None:
                registration._seen_registered(generation)
        elif op == Op.ERROR and isinstance(msg.get("ref"), str):
            registration = self._stores.get(msg["ref"])
            if registration is not None:
                return registration._seen_error(msg, generation)
        return None

    def _registrations_ended(self, generation: int, end: Any) -> None:
        """Connection ``generation`` ended: registrations awaited on it were refused (SPEC §16.6)."""
        if self._closing:
            return  # closed by the user: nothing is registered again
        for registration in list(self._stores.values()):
            registration._connection_ended(generation, end)

    @staticmethod
    def _lost_dispatch_error(ident: str, lost: Optional[Disconnected], why: str) -> FluxError:
        """The error of a settle dispatch whose connection was lost and whose outcome fluxd cannot give: not sent
        when fluxd said ``bye`` (other than ``restart``) on that connection, since fluxd settles everything it
        accepted before its ``bye`` (SPEC §8.8); else outcome unknown."""
        reason = str(lost) if lost is not None else "connection lost"
        bye = lost.bye_reason if lost is not None else None
        if bye is not None and bye != BYE_RESTART:
            return NotSentError(f"dispatch {ident} was not sent: fluxd said bye ({bye}) before accepting it; "
                                f"it may be dispatched again", ref=ident)
        return OutcomeUnknownError(f"the outcome of dispatch {ident} is unknown: {why} ({reason}); the action may "
                                   f"or may not have been applied", ref=ident)

    def _recovered_outcomes(self, key: str, msg: Message) -> List[Tuple[str, Union[Message, FluxError]]]:
        """What a ``recovered`` reply (or an ``error`` answering ``recover``) says of each dispatch id it was
        asked about: the ``settled`` message to hand to the waiting call, or the error to raise. Ids still
        ``pending`` are left out (their ``settled`` follows on this connection)."""
        ids = self._recovering.pop(key, [])
        if msg.get("op") == Op.ERROR:  # an older fluxd (unknown-op), or one that refused it (bad-message)
            error = FluxError.from_frame(msg)
            return [(ident, OutcomeUnknownError(f"the outcome of dispatch {ident} is unknown: fluxd refused to "
                                                f"recover it ({error})", ref=ident)) for ident in ids]
        found: List[Tuple[str, Union[Message, FluxError]]] = []
        for outcome in msg.get("outcomes", []):
            if not isinstance(outcome, dict) or not isinstance(outcome.get("id"), str):
                continue
            ident, status = outcome["id"], outcome.get("status")
            if status == RecoverStatus.SETTLED:
                found.append((ident, {"op": Op.SETTLED, "id": ident, "seq": outcome.get("seq", 0),
                                      "results": outcome.get("results", [])}))
            elif status == RecoverStatus.UNKNOWN:
                found.append((ident, NotSentError(f"dispatch {ident} was not sent: fluxd never accepted it before "
                                                  f"the connection was lost; it may be dispatched again",
                                                  ref=ident)))
        return found

    # -- incoming -----------------------------------------------------------------------------------------------

    @staticmethod
    def _welcome_from(msg: Message) -> Welcome:
        return Welcome.from_frame(msg)

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
                self._connection_ending(Disconnected(f"fluxd closed the connection: {error}", error))
        elif kind == "ping":
            try:
                self._send_raw(self._pong_frame(msg))
            except FluxError:
                pass  # the connection is ending; the reader will see it
        elif kind == "bye":
            reason = msg.get("reason") if isinstance(msg.get("reason"), str) else None
            self._connection_ending(Disconnected(f"fluxd said bye ({reason})", bye_reason=reason))

    def _connection_ending(self, reason: Disconnected) -> None:
        """fluxd said ``bye`` or sent a fatal error: the connection is about to end. Without reconnection that
        ends the client; with it, the reader notices the end and reconnects."""
        if not self._reconnects():
            self._finish(reason)


class SubscriptionCore:
    """A subscription's state: ``status`` (``up``, ``down`` or ``unknown``: no store of that name has registered
    yet), the ``latest`` and ``first_snapshot`` snapshots and the ``store-down``/``store-up`` ``events``. A
    subclass queues each newer snapshot in ``_enqueue``.

    ``timeout`` is the one given to ``subscribe``: when set, waiting for the first snapshot must end within it
    counted from the ``subscribe`` call, and each later wait of ``next()`` or of iteration within it."""

    def __init__(self, client: Any, store: str, path: Optional[str] = None, deltas: bool = False):
        self.client = client
        self.store = store
        #: The JSON Pointer of a path subscription (SPEC §16.4; it yields :class:`Subtree` values), else ``None``.
        self.path = path
        #: Whether this subscription asks fluxd for ``delta`` frames (SPEC §16.3) and applies them to the state it
        #: holds.
        self.deltas = deltas
        #: Deltas applied, and resynchronisations asked for (a delta that did not follow the version held).
        self.deltas_applied = 0
        self.resyncs = 0
        self._resyncing = False
        self.status: Optional[str] = None
        self.latest: Optional[Any] = None
        self.first_snapshot: Optional[Any] = None
        self.events: List[SubscriptionEvent] = []
        self.timeout: Optional[float] = None
        self._first_deadline: Optional[Deadline] = None
        self._down_reason: Optional[str] = None
        self._take_any = False  # after reconnecting to another epoch: the next snapshot whatever its version

    def _enqueue(self, snap: Any) -> None:
        raise NotImplementedError

    def _subscribe_frame(self, resume: bool = False) -> bytes:
        """The ``subscribe`` frame of this subscription; with ``resume`` (a new connection to the same history),
        ``from`` = the version held, so fluxd sends only what is newer (SPEC §16.3)."""
        fields: Message = {"op": Op.SUBSCRIBE, "store": self.store}
        if self.path is not None:
            fields["path"] = self.path
        if self.deltas:
            fields["deltas"] = True
        if (resume and self.path is None and self.latest is not None and not self._take_any
                and self.client.speaks_deltas()):
            fields["from"] = self.latest.version
        return ClientCore._frame(fields)

    def _status_changed(self) -> None:
        """Called after ``status`` changed (subclasses wake whoever waits for it)."""

    def _subscribed(self, msg: Message, timeout: Optional[float], deadline: Deadline) -> None:
        """Takes the ``subscribed`` reply of a ``subscribe`` call made with ``timeout`` and ``deadline``."""
        status = msg.get("status")
        self.status = status if isinstance(status, str) else StoreStatus.UNKNOWN
        self.timeout = timeout
        self._first_deadline = deadline if timeout is not None else None
        self._status_changed()

    def _resubscribed(self, msg: Message) -> None:
        """fluxd's ``subscribed`` for the subscription made again after reconnecting."""
        status = msg.get("status")
        self.status = status if isinstance(status, str) else StoreStatus.UNKNOWN
        self.events.append(SubscriptionEvent("resubscribed", self.store, status=self.status,
                                             version=msg.get("version")))
        self._status_changed()

    def _epoch_changed(self) -> None:
        """The client reconnected to another history: versions start over, so the next snapshot is taken
        whatever its version (SPEC §15.1)."""
        self._take_any = True

    def _accept(self, snap: Any) -> None:
        # Never a version twice, nor an older one: a subscription made again after reconnecting is sent the
        # retained snapshot, which this one may already have delivered (SPEC §15.5).
        if self.latest is None or snap.version > self.latest.version or self._take_any:
            self._take_any = False
            self.latest = snap
            if self.first_snapshot is None:
                self.first_snapshot = snap
            self._enqueue(snap)

    def _delta(self, msg: Message) -> None:
        """A ``delta`` (SPEC §16.3): applied to the state held when it follows it; skipped when its version is held
        already (frames of a lost connection routed after resuming); otherwise the subscription resynchronises."""
        if self._resyncing or self._take_any:
            return  # the whole snapshot asked for (or the first one of a new history) comes first
        held = self.latest
        version, base = msg.get("version"), msg.get("from")
        if held is not None and isinstance(version, int) and version <= held.version:
            return
        if held is not None and base == held.version:
            try:
                state = apply_patch(held.state, msg.get("patch"))
            except PatchError as error:
                log.warning("delta %s -> %s of %r does not apply (%s): resynchronising", base, version,
                            self.store, error)
            else:
                self.deltas_applied += 1
                self._accept(Snapshot(msg["store"], version, msg["seq"], state))
                return
        self.resyncs += 1
        self._resyncing = True
        self.client._resync(self)

    def _deliver(self, msg: Message) -> None:
        op = msg["op"]
        if op == Op.SNAPSHOT:
            self._resyncing = False
            self._accept(Snapshot(msg["store"], msg["version"], msg["seq"], msg.get("state")))
        elif op == Op.DELTA:
            self._delta(msg)
        elif op == Op.SUBTREE:
            self._accept(Subtree(msg["store"], msg.get("path", self.path), msg["version"], msg["seq"],
                               msg.get("exists") is True, msg.get("value")))
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

    @property
    def state(self) -> Any:
        """The newest state held (a path subscription: the newest value; ``None`` before the first)."""
        return None if self.latest is None else self.latest.state

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
        what = f"the value at {self.path!r} in {self.store!r}" if self.path is not None else repr(self.store)
        return deadline.error(f"waiting for a snapshot of {what}: {self.why_no_snapshot()}")

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


class RegistrationCore:
    """What a store registration keeps to register again on a new connection, and which connection it is
    registered on. ``version``, ``seq`` and ``resumed`` are those of fluxd's last ``registered`` (SPEC §8.2);
    :attr:`registrations` counts them (1, then one more after each reconnection).

    Answers (``done``, ``reject``) belong to the connection that delivered the action: one delivered on a lost
    connection is not answered on the next (fluxd delivers it again, marked ``redelivered``).

    **Refusals** (SPEC §16.6). A registration made again after a lost connection is refused when fluxd answers
    ``register`` with an ``error`` (``name-taken``, ``memory-budget``, ``too-large``, ...) or closes the connection
    before the registration is confirmed: at ``registered``, or, with ``confirm=False`` given to ``register``, when
    :meth:`confirm` is called (:class:`fluxbus.Store` confirms once fluxd has taken the state it publishes after
    registering). Each refusal is logged with its code; the client then waits :attr:`retry_delay` (100 ms doubling
    up to 30 s, with jitter) before it connects and registers again, and :attr:`refusals` counts them until a
    registration is confirmed. A refusal no retry can cure (``bad-message``, ``forbidden``, ``cycle``) is not
    retried: the store gets the error."""

    #: The first wait after a refused registration and the longest, in seconds (SPEC §16.6).
    REFUSAL_FIRST_DELAY = REFUSAL_FIRST_DELAY
    REFUSAL_MAX_DELAY = REFUSAL_MAX_DELAY

    def __init__(self, client: Any, store: str):
        self.client = client
        self.store = store
        self.version = 0
        self.seq = 0
        self.resumed = False
        #: How many times fluxd answered ``registered`` for this registration (re-registrations included).
        self.registrations = 0
        #: Returns the state to offer as ``register.state`` when registering again after a lost connection
        #: (``None``: the one given to ``register``). fluxd uses it only when it retains no snapshot of the
        #: store, e.g. after an ephemeral fluxd restarted. :class:`fluxbus.Store` offers its current state.
        #: A state whose ``register`` frame would be larger than ``welcome.limits.maxFrame`` is left out
        #: (:attr:`state_omitted`; SPEC §16.6).
        self.offer_state: Optional[Callable[[], Any]] = None
        #: Whether the last ``register`` sent left out the state offered because the frame would have been larger
        #: than ``maxFrame`` (SPEC §16.6): when fluxd then retains nothing (``version`` 0), publish it (in pieces:
        #: :class:`fluxbus.Store` does).
        self.state_omitted = False
        #: Whether ``registered`` confirms the registration (else :meth:`confirm` does).
        self.confirm_on_registered = True
        #: Refused registrations in a row (SPEC §16.6), and the wait chosen after the last one (s).
        self.refusals = 0
        self.retry_delay = 0.0
        #: When (``time.monotonic()``) the store may be registered again after a refusal (0: at once).
        self.retry_at = 0.0
        self._awaiting_gen = 0  # the connection a register went out on, until the registration is confirmed
        self._fields: Message = {}
        self._sent = False  # the first register went out: a new connection registers the store again
        self._generation = 0  # the connection (generation) the store is registered on; 0: none yet
        self._action_gens: Dict[int, int] = {}  # seq of an action handed out -> the connection it came on

    def _register_frame(self, max_frame: Optional[int] = None) -> bytes:
        """The ``register`` frame sent on a new connection: with the state offered only when the frame fits in
        ``max_frame`` (SPEC §16.6)."""
        fields = dict(self._fields)
        if self.offer_state is not None:
            try:
                state = self.offer_state()
                dumps(state)
            except Exception:  # noqa: BLE001 (keep the original initial state)
                log.exception("store %s: offer_state failed", self.store)
            else:
                if state is None:
                    fields.pop("state", None)
                else:
                    fields["state"] = state
        frame, self.state_omitted = self._fitting_frame(fields, max_frame)
        return frame

    @staticmethod
    def _fitting_frame(fields: Message, max_frame: Optional[int]) -> Tuple[bytes, bool]:
        """The ``register`` frame of ``fields``, without ``state`` if the frame would not fit in ``max_frame``
        (SPEC §16.6); and whether the state was left out."""
        frame = ClientCore._frame(fields)
        if "state" in fields and not fits(len(frame) - 4, max_frame):
            fields = {key: value for key, value in fields.items() if key != "state"}
            return ClientCore._frame(fields), True
        return frame, False

    def _registered(self, msg: Message, generation: int) -> None:
        self.version = msg.get("version", 0)
        self.seq = msg.get("seq", 0)
        self.resumed = msg.get("resumed") is True
        self._generation = generation
        self.registrations += 1

    # -- refusals (SPEC §16.6); called where the client reads frames, before it reconnects ----------------------

    def _register_sent(self, generation: int) -> None:
        """A ``register`` goes out on connection ``generation``: it is awaited until confirmed."""
        self._awaiting_gen = generation

    def _seen_registered(self, generation: int) -> None:
        if self.confirm_on_registered and self._awaiting_gen == generation:
            self.confirm()

    def confirm(self) -> None:
        """The registration succeeded: the refusal backoff starts over. Called at ``registered``, or, for a
        registration made with ``confirm=False``, by its owner once fluxd has taken what it publishes after
        registering (SPEC §16.6)."""
        self._awaiting_gen = 0
        self.refusals = 0
        self.retry_delay = 0.0
        self.retry_at = 0.0

    def _seen_error(self, msg: Message, generation: int) -> Optional[str]:
        """An ``error`` naming this store on connection ``generation``. While the registration is awaited, it is a
        refusal: counted, logged, and (for a registration made again, with a code a retry may cure) the reason to
        end the connection and register again after the wait; else ``None``."""
        if self._awaiting_gen != generation or generation == 0:
            return None
        code = str(msg.get("code", ""))
        self._awaiting_gen = 0
        if self.registrations == 0:
            return None  # the first registration: register() raises it
        if code in FINAL_REFUSALS:
            log.error("store %s: registering again was refused (%s: %s); not retrying: no retry can cure it",
                      self.store, code, msg.get("message", ""))
            return None
        self._refused(f"{code}: {msg.get('message', '')}")
        if msg.get("fatal") is True:
            return None  # fluxd closes the connection itself
        return f"store {self.store!r} was refused ({code}): registering again later"

    def _connection_ended(self, generation: int, end: Any) -> None:
        """Connection ``generation`` ended: a registration still awaited on it was refused."""
        if self._awaiting_gen != generation or generation == 0:
            return
        self._awaiting_gen = 0
        error = getattr(end, "error", None)
        self._refused(f"{error.code}: {error.message}" if error is not None else
                      f"the connection ended before the registration was complete ({end})")

    def _refused(self, why: str) -> None:
        self.refusals += 1
        self.retry_delay = refusal_delay(self.refusals, first=self.REFUSAL_FIRST_DELAY,
                                         longest=self.REFUSAL_MAX_DELAY)
        self.retry_at = time.monotonic() + self.retry_delay
        log.warning("store %s: registration refused (%s); registering again in %.2f s (refusal %d in a row)",
                    self.store, why, self.retry_delay, self.refusals)

    def _handed_out(self, msg: Any) -> None:
        """Remembers which connection an action handed to the store came on."""
        if isinstance(msg, dict) and msg.get("op") == Op.ACTION and isinstance(msg.get("seq"), int):
            self._action_gens[msg["seq"]] = self._generation

    def _answer_generation(self, seq: int) -> int:
        return self._action_gens.pop(seq, self._generation)

    @property
    def live(self) -> bool:
        """Whether the store is registered on the client's current connection."""
        return self._generation != 0 and self._generation == self.client._live_generation()


def acknowledges(welcome: Any) -> bool:
    """Whether the fluxd behind ``welcome`` answers ``dispatch.ack`` with ``accepted`` (SPEC §8.3: fluxd 0.4.0,
    which is also the one that announces ``deltaHistory``)."""
    limits = getattr(welcome, "limits", None) or {}
    return "deltaHistory" in limits


def waiting_note(info: Any, action_type: str) -> str:
    """What a settlement of ``action_type`` is still waiting for, from fluxd's ``info``: the stores handling it that
    are down (fluxd keeps the action queued until they are back or their queue timeout ends), stalled, or busy, as
    ``; still waiting for store "stats", which is down (1 action queued for it; ...)``; "" when nothing is."""
    from .wire import pattern_matches

    def actions(n: int) -> str:
        return "1 action" if n == 1 else f"{n} actions"

    notes = []
    for s in (info or {}).get("stores") or []:
        if not any(isinstance(p, str) and pattern_matches(p, action_type) for p in s.get("handles") or []):
            continue
        name = s.get("name")
        if s.get("status") == "down":
            notes.append(f'store "{name}", which is down ({actions(s.get("queued") or 0)} queued for it; fluxd keeps '
                         "them queued until the store is back or its queue timeout ends)")
        elif s.get("stalled"):
            notes.append(f'store "{name}", which is stalled (an action unanswered for {(s.get("stalledFor") or 0) // 1000} s)')
        elif (s.get("queued") or 0) + (s.get("inflight") or 0) > 0:
            notes.append(f'store "{name}", which has {actions((s.get("queued") or 0) + (s.get("inflight") or 0))} to answer before this one')
    return "; still waiting for " + "; ".join(notes) if notes else ""
