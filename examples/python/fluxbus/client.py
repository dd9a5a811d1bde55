"""The synchronous FluxBus client: one Unix-socket connection to fluxd, driven by the calling thread."""
from __future__ import annotations

import collections
import select
import socket
import threading
import time
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Mapping, Optional, Union

from ._core import (NO_LIMIT, ClientCore, acknowledges, waiting_note, Deadline, Message, QueryReceiptCore, RegistrationCore, SubscriptionCore,
                    _max_frame, describe, format_seconds, resolve_socket_path)
from .errors import BadJSONError, Disconnected, FluxError, FluxTimeoutError, NameTakenError, NotSentError, connect_error
from .protocol import Op
from .reconnect import ConnectionCallback, ConnectionEvent, ReconnectOption
from .wire import (FrameDecoder, Settlement, Snapshot, Welcome, check_server_uid, encode_frame, loads,
                   subscription_key)
from .wire import expected_server_uid as _expected_server_uid

#: Put in the incoming queue to wake the thread waiting in a call (see :meth:`StoreRegistration.interrupt`).
_WAKE = object()
#: What the reader thread hands to the calling thread: a decoded message, an unreadable body, the end, a wake-up.
_Incoming = Union[Message, bytes, Disconnected, object]
#: What a wait raises when its deadline passes: a message (``timed out after N s <what>``) or a ready error.
_What = Union[str, Callable[[], FluxError]]


def _connect_socket(sock: socket.socket, path: str, source: str, deadline: Deadline) -> None:
    """Connects ``sock`` to ``path`` before ``deadline``; a failure says where and what to do."""
    sock.settimeout(deadline.remaining())
    try:
        sock.connect(path)
    except socket.timeout:
        raise deadline.error(f"connecting to fluxd at {path}") from None
    except OSError as error:
        raise connect_error(path, source, error) from None
    finally:
        sock.settimeout(None)


class _Lost:
    """Queued by the reader thread when connection ``gen`` ended and the client reconnects."""
    __slots__ = ("gen", "reason")

    def __init__(self, gen: int, reason: Disconnected):
        self.gen = gen
        self.reason = reason


class _Reconnected:
    """Queued by the reader thread before any frame of connection ``gen``: its ``welcome``, whether the epoch
    changed, and (if it did) the settle dispatches that cannot be recovered, with why the last one ended."""
    __slots__ = ("gen", "welcome", "epoch_changed", "unresolved", "lost")

    def __init__(self, gen: int, welcome: Message, epoch_changed: bool, unresolved: List[str],
                 lost: Disconnected):
        self.gen = gen
        self.welcome = welcome
        self.epoch_changed = epoch_changed
        self.unresolved = unresolved
        self.lost = lost


#: What a call's wait returns when the connection its request went out on was lost before the reply.
_LOST = object()


class Client(ClientCore):
    """A connection to fluxd speaking protocol 1 (see ``protocol/SPEC.md``).

    Create one with :meth:`connect`. A daemon reader thread (``fluxbus-reader``) reads the socket: it answers
    fluxd's heartbeat ``ping`` with ``pong`` itself, at once, and hands every other message to the calling
    thread, which routes it when a call waits (every call waits until its answer arrives, and keeps what else
    arrived, snapshots, settlements, store messages, for whoever asks for it). So a caller that is busy, or a
    store handler or callback that blocks, never keeps the connection from answering pings. Messages the caller
    has not taken yet are held up to ``max_buffered`` bytes; beyond that the reader stops reading (and so stops
    answering pings) until the caller catches up, so a client that never reads is treated by fluxd as a slow
    consumer rather than growing without bound. Use a client from one thread at a time (sends are locked, so a
    store may publish from a worker thread).

    **Reconnection** (on by default; ``reconnect=`` takes a :class:`fluxbus.Reconnect` policy or ``False``).
    When the connection ends without :meth:`close` (the socket dropped, fluxd said ``bye`` or sent a fatal
    error), the reader thread reconnects with backoff, says ``hello`` with the same :attr:`session`, and before
    anything else subscribes again, declares the live queries again, registers the stores again and
    ``recover``\\ s the settlements still awaited (SPEC §15.5). Calls made meanwhile wait for the new connection
    within their timeout; a request whose reply was lost with the connection is sent again; a subscription
    never delivers a version twice. :attr:`connection_events` and ``on_connection_event`` report
    ``disconnected``, ``reconnecting``, ``reconnected`` and ``gave-up`` (:class:`fluxbus.ConnectionEvent`);
    the callback runs on the reader thread, so it should only hand the event on (e.g. to a UI's queue).

    Errors from fluxd are raised by the call they answer, as the :class:`~fluxbus.errors.FluxError` subclass of
    their code (e.g. :class:`~fluxbus.errors.NoHandlerError`). Errors that answer no call (e.g. ``no-handler``
    for a fire-and-forget :meth:`dispatch`) are kept in :attr:`errors` (``ref`` = the id ``dispatch`` returned).

    Every call takes an optional ``timeout`` in seconds (``None`` = the client's :attr:`timeout`, set by
    :meth:`connect`); it covers the whole call: sending, the reply and any wait. A call that runs out of time
    raises :class:`~fluxbus.errors.FluxTimeoutError` (a builtin ``TimeoutError`` too).
    """

    #: Bytes of messages the reader thread holds for the caller before it stops reading (see the class doc).
    DEFAULT_MAX_BUFFERED = 64 << 20

    def __init__(self, sock: socket.socket, name: str, role: str, timeout: Optional[float],
                 max_buffered: int = DEFAULT_MAX_BUFFERED, *, reconnect: ReconnectOption = None,
                 on_connection_event: Optional[ConnectionCallback] = None, session: Optional[str] = None,
                 socket_path: Optional[str] = None, source: str = "socket_path", heartbeat: bool = True,
                 expected_server_uid: Optional[int] = None):
        super().__init__(reconnect, on_connection_event, session)
        self._sock: Optional[socket.socket] = sock
        self.name = name
        self.role = role
        self.timeout = timeout
        self.max_buffered = max_buffered
        self.socket_path = socket_path
        self._source = source
        self._heartbeat = heartbeat
        self._expected_uid = expected_server_uid
        # _link guards the socket and the connection state; sends hold it (it is also _send_lock).
        self._link = threading.Condition(threading.RLock())
        self._send_lock = self._link
        self._connected = True  # the current socket may be written to
        self._conn_gen = 1  # generation of the current connection (1, 2, ... one per successful handshake)
        self._drop_reason: Optional[str] = None  # why this client ended the current connection itself
        self._pending_sock: Optional[socket.socket] = None  # a reconnection attempt's socket
        self._stop = threading.Event()  # set by close(): ends a reconnection backoff at once
        self._cond = threading.Condition()
        self._incoming: Deque[_Incoming] = collections.deque()
        self._incoming_bytes = 0
        # What the calling thread has routed: frames of connection _route_gen; connection _lost_gen has ended.
        self._route_gen = 1
        self._lost_gen = 0
        self._lost_reason: Optional[Disconnected] = None
        #: Heartbeat pings answered by the reader thread.
        self.pings_answered = 0
        self._handshaking = False
        self._reader = threading.Thread(target=self._read_loop, name="fluxbus-reader", daemon=True)
        self._replies: Dict[str, Any] = {}
        self._awaited: set = set()
        self._subscriptions: Dict[str, "Subscription"] = {}
        self._stores: Dict[str, "StoreRegistration"] = {}
        self.errors: Deque[FluxError] = collections.deque(maxlen=256)
        self.welcome: Welcome

    # -- connection ---------------------------------------------------------------------------------------------

    @classmethod
    def connect(cls, socket_path: Optional[str] = None, name: str = "", role: str = "client",
                timeout: Optional[float] = 30.0, heartbeat: bool = True,
                expected_server_uid: Optional[int] = None, *, reconnect: ReconnectOption = None,
                on_connection_event: Optional[ConnectionCallback] = None,
                session: Optional[str] = None) -> "Client":
        """Connects to fluxd (``socket_path`` or :func:`~fluxbus.default_socket_path`) and does the handshake.
        ``role`` is ``client``, ``store`` or ``monitor``. ``timeout`` covers connecting and the handshake, and is
        the default timeout of every later call (``None``: no limit).

        Raises :class:`~fluxbus.errors.FluxConnectionError` when nothing listens at the path (its message names
        the path, where it came from and how to start fluxd),
        :class:`~fluxbus.errors.TooManyConnectionsError` if fluxd refuses the connection, and
        :class:`~fluxbus.errors.FluxTimeoutError` when ``timeout`` passes. (The first connection is not retried:
        reconnecting starts once a connection was made.)

        ``heartbeat`` (default on) asks fluxd to ping this connection when it is silent; the reader thread
        answers. ``expected_server_uid`` (else ``$FLUXBUS_SERVER_UID``, else 0 when running as root; else no
        check) is the uid fluxd must run as: it is checked with ``SO_PEERCRED`` before ``hello`` is sent, and a
        mismatch raises :class:`~fluxbus.errors.WrongServerUIDError` (code ``wrong-server-uid``).

        ``reconnect`` (default on: :class:`fluxbus.Reconnect`), ``on_connection_event`` and ``session`` (default:
        a random id, the same on every connection of this client) are described in the class doc."""
        deadline = Deadline(timeout)
        path, source = resolve_socket_path(socket_path)
        expected = _expected_server_uid(expected_server_uid)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            _connect_socket(sock, path, source, deadline)
            check_server_uid(sock, path, expected)
        except BaseException:
            sock.close()
            raise
        client = cls(sock, name, role, timeout, reconnect=reconnect, on_connection_event=on_connection_event,
                     session=session, socket_path=path, source=source, heartbeat=heartbeat,
                     expected_server_uid=expected)
        client._reader.start()
        try:
            # fluxd may refuse a connection before it says anything (too-many-connections) and close it, so the
            # hello can fail to send: the reader thread still delivers the refusal, which _wait then raises.
            client._handshaking = True
            client._send_raw(client._hello_frame(role, name, heartbeat, client.session), deadline)
            client._handshaking = False
            msg = client._wait(lambda: client._welcome_msg, deadline, f"waiting for fluxd's welcome at {path}")
        except Disconnected as ended:
            client._finish(ended)
            raise (ended.error or ended) from None  # a refusal (fatal error) is raised as itself
        except BaseException:
            client._finish(Disconnected("handshake failed"))
            raise
        client.welcome = client._welcome_from(msg)
        client.epoch = client.welcome.epoch
        client._established = True
        return client

    _welcome_msg: Optional[Message] = None

    @property
    def connected(self) -> bool:
        """Whether the client has a working connection now (``False`` while it reconnects, and once closed)."""
        return self._connected and self._closed is None

    @property
    def state(self) -> str:
        """``connected``, ``reconnecting`` or ``closed``."""
        if self._closed is not None:
            return "closed"
        return "connected" if self._connected else "reconnecting"

    def close(self, timeout: float = 2.0) -> None:
        """Says ``bye``, waits (at most ``timeout`` s) for fluxd to close the connection, then closes it. Ends
        reconnecting too."""
        self._user_closed = self._closing = True
        self._stop.set()
        if self._closed is None:
            deadline = Deadline(timeout)
            try:
                if self._send_raw(self._frame({"op": Op.BYE}), deadline, wait=False):
                    while self._closed is None and not deadline.expired():
                        self._pump(deadline.remaining())
            except (OSError, FluxError):
                pass
        self._finish(Disconnected("closed locally"))

    def abort(self) -> None:
        """Closes the socket at once, without ``bye`` (to fluxd this looks like a crash); no reconnecting."""
        self._user_closed = True
        self._finish(Disconnected("aborted"))

    def drop_connection(self, reason: str = "dropped by the client") -> None:
        """Ends the current connection as if it had been lost (no ``bye``): the client reconnects as it would
        after a crash of fluxd or a broken socket (or closes, without reconnection). For tests and tools."""
        with self._link:
            gen = self._conn_gen
        self._drop(gen, reason)

    def wait_connected(self, timeout: Optional[float] = None) -> None:
        """Waits until the client is connected (returns at once if it is); raises
        :class:`~fluxbus.errors.FluxTimeoutError` or, once closed, :class:`Disconnected`."""
        deadline = self._deadline(timeout)
        with self._link:
            while not self._connected:
                if self._closed is not None:
                    raise self._closed
                if deadline.expired():
                    raise deadline.error(f"waiting to reconnect to fluxd ({self._why_disconnected()})")
                self._link.wait(deadline.remaining())
        if self._closed is not None:
            raise self._closed

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- actions ------------------------------------------------------------------------------------------------

    def dispatch(self, type: str, payload: Any = None, cause: Optional[int] = None,
                 timeout: Optional[float] = None, *, ack: Optional[bool] = None) -> str:
        """Dispatches an action without waiting for its result; returns the id it was sent with.

        With a fluxd that acknowledges dispatches (0.4.0, SPEC §8.3), it waits one round trip for fluxd to accept
        the action and raises the refusal to the caller (e.g. :class:`~fluxbus.errors.NoHandlerError` when no
        store handles the type); :attr:`last_seq` is then the seq the action got. ``ack=False`` (or an older
        fluxd) sends it without waiting: a refusal then arrives later in :attr:`errors` with the id as ``ref``.
        If the connection is lost before fluxd answered, :class:`~fluxbus.errors.Disconnected` is raised (the
        action may or may not have been accepted). ``timeout`` covers sending (and, while the client reconnects,
        waiting for the new connection) and the acceptance."""
        ident = self._check_action(type)
        if ack is None:
            ack = acknowledges(getattr(self, "welcome", None))
        if not ack:
            self._send_raw(self._dispatch_frame(ident, type, payload, cause, False), self._deadline(timeout))
            return ident
        msg = self._call(ident, self._dispatch_frame(ident, type, payload, cause, False, ack=True),
                         self._deadline(timeout), f"waiting for fluxd to accept {type} ({ident})", on_lost="raise")
        self.last_seq = msg.get("seq")
        return ident

    def dispatch_and_settle(self, type: str, payload: Any = None, cause: Optional[int] = None,
                            timeout: Optional[float] = None) -> Settlement:
        """Dispatches an action and waits for its settlement: every target store's result (SPEC §8.3). When it
        returns, every subscription of this client on a store that answered ``done`` already holds the snapshot
        it produced (read your writes). Raises the error fluxd refused the action with (e.g.
        :class:`~fluxbus.errors.NoHandlerError`); a store's rejection is a result, not an exception
        (``settlement.raise_for_status()`` raises it).

        If the connection is lost after the dispatch went out, the client asks the next connection's fluxd
        (``recover``, SPEC §15.4) and returns the settlement, or raises
        :class:`~fluxbus.errors.NotSentError` (fluxd never accepted it: dispatch it again if you like) or
        :class:`~fluxbus.errors.OutcomeUnknownError` (fluxd restarted without its history, or cannot say)."""
        ident = self._check_action(type)
        frame = self._dispatch_frame(ident, type, payload, cause, True)
        try:
            msg = self._call(ident, frame, self._deadline(timeout), f"waiting for the settlement of {type} ({ident})",
                             on_lost="recover", track=ident)
        except FluxTimeoutError as timed_out:
            # What the action still waits for, as fluxd's info tells (like fluxctl).
            try:
                note = waiting_note(self.info(timeout=2), type)
            except FluxError:
                note = ""
            if not note:
                raise
            raise FluxTimeoutError(str(timed_out) + note, ref=ident) from None
        return Settlement.from_frame(msg)

    # -- subscriptions ------------------------------------------------------------------------------------------

    def subscribe(self, store: str, timeout: Optional[float] = None, *, path: Optional[str] = None,
                  deltas: Optional[bool] = None) -> "Subscription":
        """Subscribes to a store's snapshots. The returned :class:`Subscription` iterates the retained snapshot
        (if any) and then every newer one; it is also a context manager (``close()`` unsubscribes).

        With a fluxd that speaks SPEC §16 (0.4.0 or newer) the subscription asks for deltas (``deltas=False``
        does not): fluxd then sends the changes the store published as patches, and the subscription applies
        them to the state it holds, so each :class:`Snapshot` still carries the whole state (which shares what
        did not change with the one before: treat states as read-only). ``path`` (a JSON Pointer such as
        ``"/todos/3"``) subscribes to that value only (SPEC §16.4): iteration yields :class:`Subtree` values
        (``exists``, ``value``), one for the retained version and one for each change that touches the path.

        A store need not have registered yet (clients may start before stores): ``subscription.status`` is then
        ``unknown`` and turns ``up`` when it registers. ``timeout`` covers the request and, when given, the wait
        for the first snapshot too (counted from this call) and each later wait of iteration or ``next()``; a
        wait that runs out raises :class:`~fluxbus.errors.FluxTimeoutError` saying why (e.g. ``no store named
        'x' has registered yet``). Without ``timeout``, the request takes the client's default and iteration
        waits without limit. The subscription lasts across reconnections."""
        key = self._new_subscription(store, path, deltas)
        deadline = self._deadline(timeout)
        sub = self._subscriptions.get(key)
        created = sub is None
        if sub is None:
            sub = Subscription(self, store, path, bool(path is None and deltas is not False and
                                                       self.speaks_deltas()))
            self._subscriptions[key] = sub
        what = f"{store!r}" if path is None else f"{path!r} in {store!r}"
        try:
            msg = self._call(f"subscribed:{key}", sub._subscribe_frame(), deadline,
                             f"waiting for fluxd to confirm the subscription to {what}")
        except BaseException:
            if created and self._subscriptions.get(key) is sub:
                del self._subscriptions[key]
            raise
        sub._subscribed(msg, timeout, deadline)
        return sub

    def _unsubscribe(self, store: str, timeout: Optional[float], path: Optional[str] = None) -> None:
        key = subscription_key(store, path)
        self._subscriptions.pop(key, None)
        if self._closed is None:  # a lost connection took the subscription with it
            fields: Message = {"op": Op.UNSUBSCRIBE, "store": store}
            if path is not None:
                fields["path"] = path
            self._call(f"unsubscribed:{key}", self._frame(fields), self._deadline(timeout),
                       f"waiting for fluxd to confirm unsubscribing from {store!r}", on_lost="done")

    def _resync(self, sub: "SubscriptionCore") -> None:
        try:
            self._send_raw(sub._subscribe_frame(), wait=False)
        except FluxError:
            pass  # closed: nothing to resynchronise

    # -- queries ------------------------------------------------------------------------------------------------

    def query(self, store: str, query: Any, timeout: Optional[float] = None) -> "QueryReceipt":
        """Declares a query on a store (encoded canonically, so equal queries are deduplicated by fluxd). It
        stays active until the returned :class:`QueryReceipt` is closed (or used as a context manager) or the
        client is closed; the client declares it again on every new connection. Subscribe separately to see
        the data the store fetches."""
        self._check_store(store)
        ident = self._next_id("q")
        frame = self._query_frame(ident, store, query)
        self._call(ident, frame, self._deadline(timeout), f"waiting for fluxd to accept the query on {store!r}")
        self._live_queries[ident] = frame
        return QueryReceipt(self, ident, store, query)

    def _unquery(self, ident: str, timeout: Optional[float]) -> None:
        self._live_queries.pop(ident, None)
        if self._closed is None:
            self._call(ident, self._frame({"op": Op.UNQUERY, "id": ident}), self._deadline(timeout),
                       f"waiting for fluxd to withdraw query {ident}", on_lost="done")

    # -- stores -------------------------------------------------------------------------------------------------

    def register(self, store: str, handles: Iterable[str], wait_for: Iterable[str] = (), state: Any = None,
                 query_deltas: bool = False, timeout: Optional[float] = None, *,
                 confirm: bool = True) -> "StoreRegistration":
        """Registers a store on this (``store``-role) connection (SPEC §8.2) and waits for ``registered``.
        Returns the :class:`StoreRegistration` through which the store takes what fluxd sends it and answers.
        Raises e.g. :class:`~fluxbus.errors.NameTakenError` or :class:`~fluxbus.errors.CycleError`.
        The client registers the store again on every new connection (the registration then gets
        ``registered``, the retained snapshot and ``queries`` again, see :meth:`StoreRegistration.next`).
        :class:`fluxbus.Store` does all of this for you.

        ``state`` goes in the ``register`` frame only if that frame fits in ``welcome.limits.maxFrame``
        (SPEC §16.6); otherwise it is left out (``registration.state_omitted``) and, when fluxd retains nothing
        (``registration.version`` 0), it is yours to publish (in pieces: :class:`fluxbus.Store` does).
        ``confirm=False``: the registration counts as succeeded, for the backoff after refused registrations, only
        once :meth:`StoreRegistration.confirm` is called (after what the store publishes on registering)."""
        self._check_store(store)
        if store in self._stores:
            raise NameTakenError(f"this connection has already registered {store!r}", ref=store)
        deadline = self._deadline(timeout)
        registration = StoreRegistration(self, store)
        registration.confirm_on_registered = confirm
        registration._fields = self._register_fields(store, list(handles), list(wait_for), state, query_deltas)
        frame, registration.state_omitted = registration._fitting_frame(registration._fields,
                                                                        _max_frame(self.welcome))
        if registration.state_omitted:  # on later connections too, unless it is offered again
            registration._fields.pop("state", None)
        self._stores[store] = registration

        def sent(gen: int) -> None:
            registration._sent = True  # from now on a new connection registers it again
        try:
            with self._link:
                registration._register_sent(self._conn_gen)  # before fluxd can answer
            self._send_raw(frame, deadline, on_sent=sent)
            inbox = registration._inbox
            msg = self._wait(lambda: inbox.popleft() if inbox else None, deadline,
                             f"waiting for fluxd to register {store!r}")
            if msg.get("op") == Op.ERROR:
                raise FluxError.from_frame(msg)
        except BaseException:
            if self._stores.get(store) is registration:
                del self._stores[store]
            raise
        return registration

    def _barrier(self, generation: int, timeout: Optional[float] = None) -> bool:
        """Sends ``ping`` on connection ``generation`` only and waits for its ``pong``: ``True`` once it came
        (fluxd has handled every frame sent before it on that connection, SPEC §2), ``False`` when that
        connection is gone (or was never current)."""
        ident = self._next_id("r")
        frame = self._frame({"op": Op.PING, "id": ident})
        deadline = self._deadline(timeout)
        self._awaited.add(ident)
        try:
            if not self._send_raw(frame, deadline, only_gen=generation):
                return False

            def ready() -> Any:
                reply = self._replies.pop(ident, None)
                if reply is None and self._lost_gen >= generation:
                    return _LOST
                return reply
            msg = self._wait(ready, deadline, "waiting for fluxd's pong")
            return msg is not _LOST and msg.get("op") == Op.PONG
        finally:
            self._awaited.discard(ident)
            self._replies.pop(ident, None)

    # -- introspection ------------------------------------------------------------------------------------------

    def info(self, timeout: Optional[float] = None) -> Message:
        """fluxd's introspection data (SPEC §8.7 ``info``): stores, peers, counters."""
        return self._request({"op": Op.INFO}, timeout, "waiting for fluxd's info")

    def get(self, store: str, timeout: Optional[float] = None) -> Snapshot:
        """Reads a store's retained snapshot once. Raises :class:`~fluxbus.errors.UnknownStoreError` if there is
        none."""
        return self._snapshot_from(self._request({"op": Op.GET, "store": store}, timeout,
                                                 f"waiting for the snapshot of {store!r}"))

    def ping(self, timeout: Optional[float] = None) -> float:
        """Round trip to fluxd; returns the seconds it took. Also a barrier: every reply to an earlier request
        has arrived when it returns (SPEC §8.7)."""
        start = time.monotonic()
        self._request({"op": Op.PING}, timeout, "waiting for fluxd's pong")
        return time.monotonic() - start

    def poll(self, timeout: float = 0.0) -> None:
        """Reads and routes whatever arrives within ``timeout`` seconds (subscriptions' ``status`` and
        ``events``, :attr:`errors`), without waiting for anything in particular."""
        self._pump(timeout)

    def send_raw(self, body: bytes, timeout: Optional[float] = None) -> None:
        """Sends ``body`` as one frame, as it is (for tests and tools)."""
        self._send_raw(encode_frame(body), self._deadline(timeout))

    # -- internals: calls ---------------------------------------------------------------------------------------

    def _request(self, fields: Message, timeout: Optional[float], what: str) -> Message:
        ident = self._next_id("r")
        fields["id"] = ident
        return self._call(ident, self._frame(fields), self._deadline(timeout), what)

    def _call(self, key: str, frame: bytes, deadline: Deadline, what: str, on_lost: str = "resend",
              track: Optional[str] = None) -> Message:
        """Sends ``frame`` and waits for the reply routed under ``key``, all before ``deadline``; raises the
        error that answers it. If the connection is lost before the reply: ``on_lost`` ``resend`` sends the
        request again on the next connection (requests that may be repeated), ``done`` returns ``{}`` (the loss
        did what was asked: unsubscribe, unquery), ``recover`` keeps waiting for what ``recover`` says (a settle
        dispatch whose id is ``track``)."""
        self._awaited.add(key)
        on_sent = None
        if track is not None:
            def on_sent(gen: int) -> None:
                self._unsettled[track] = gen  # from now on a new connection recovers its settlement
        try:
            while True:
                gen = self._send_raw(frame, deadline, wait=on_lost != "done", on_sent=on_sent)
                if not gen:
                    return {}  # not connected: nothing to undo on fluxd

                def ready() -> Any:
                    reply = self._replies.pop(key, None)
                    if reply is None and on_lost != "recover" and self._lost_gen >= gen:
                        return _LOST
                    return reply
                msg = self._wait(ready, deadline, what)
                if msg is not _LOST:
                    break
                if on_lost == "done":
                    return {}
                if on_lost == "raise":
                    raise Disconnected(f"the connection was lost before fluxd answered ({what}): it may or may not have been taken")
        except Disconnected as ended:
            if track is not None and track in self._unsettled:  # sent, and no connection left to ask
                raise self._lost_dispatch_error(track, ended, "the connection was lost") from None
            raise
        finally:
            self._awaited.discard(key)
            self._replies.pop(key, None)
            if track is not None:
                self._unsettled.pop(track, None)
        if isinstance(msg, FluxError):
            raise msg
        if msg.get("op") == Op.ERROR:
            raise FluxError.from_frame(msg)
        return msg

    def _resolve(self, ident: str, outcome: Any) -> None:
        """Hands a call waiting under ``ident`` its outcome (a message or an error), unless it has one."""
        if ident in self._awaited and ident not in self._replies:
            self._replies[ident] = outcome

    # -- internals: sending -------------------------------------------------------------------------------------

    def _live_generation(self) -> int:
        return self._conn_gen if self._connected and self._closed is None else -1

    def _why_disconnected(self) -> str:
        return describe(self._lost_reason) if self._lost_reason is not None else "the connection was lost"

    def _send_raw(self, frame: bytes, deadline: Deadline = NO_LIMIT, *, wait: bool = True,
                  only_gen: Optional[int] = None, on_sent: Optional[Callable[[int], None]] = None) -> int:
        """Sends ``frame``; returns the generation of the connection it went out on, or 0 when it was not sent:
        not connected and ``wait`` is false, or ``only_gen`` is given and is not the current connection (an
        answer to an action of a lost connection). Otherwise, while the client reconnects, waits for the new
        connection before ``deadline``. ``on_sent(gen)`` runs once the whole frame is written, before any other
        frame can follow it."""
        while True:
            failure: Optional[OSError] = None
            with self._link:
                while not self._connected:
                    if self._closed is not None:
                        raise self._closed
                    if only_gen is not None or not wait:
                        return 0
                    if deadline.expired():
                        raise deadline.error(f"waiting to reconnect to fluxd ({self._why_disconnected()})")
                    self._link.wait(deadline.remaining())
                if self._closed is not None:
                    raise self._closed
                gen = self._conn_gen
                if only_gen is not None and only_gen != gen:
                    return 0
                sock = self._sock
                assert sock is not None
                sent = len(frame)
                try:
                    if deadline.at is None:
                        sock.sendall(frame)
                    else:
                        sent = self._send_before(sock, frame, deadline)
                except OSError as error:
                    failure = error
                if failure is None and sent == len(frame):
                    if on_sent is not None:
                        on_sent(gen)
                    return gen
            if failure is not None:  # handled outside the lock: _finish joins the reader, which may want it
                if self._handshaking:
                    return gen  # the reader reports why fluxd closed the connection (see connect)
                if self._reconnects():  # the frame did not go out whole: on the next connection, or not at all
                    self._drop(gen, f"send failed: {failure}")
                    if only_gen is not None or not wait:
                        return 0
                    continue
                self._finish(Disconnected(f"send failed: {failure}"))
                raise self._closed  # type: ignore[misc]
            what = "sending to fluxd (it is not reading this connection)"
            if sent > 0:  # the stream now ends inside a frame: it cannot be used any more
                what += "; the frame was sent in part, so the connection was closed"
                reason = f"a frame was cut short: {what} timed out"
                if self._reconnects():
                    self._drop(gen, reason)
                else:
                    self._finish(Disconnected(reason))
            raise deadline.error(what)

    def _send_before(self, sock: socket.socket, frame: bytes, deadline: Deadline) -> int:
        """Sends as much of ``frame`` as the socket takes before ``deadline``; returns the bytes sent."""
        view = memoryview(frame)
        sent = 0
        poller = None
        while sent < len(frame):
            try:
                sent += sock.send(view[sent:], socket.MSG_DONTWAIT)
                continue
            except BlockingIOError:
                pass
            remaining = deadline.remaining()
            if not remaining:
                break
            if poller is None:
                poller = select.poll()
                poller.register(sock.fileno(), select.POLLOUT)
            poller.poll(remaining * 1000)
        return sent

    def _drop(self, gen: int, reason: str) -> None:
        """Ends connection ``gen`` (if it is still the current one) without ``bye``: the reader sees the end."""
        with self._link:
            if self._conn_gen != gen or not self._connected or self._sock is None:
                return
            self._drop_reason = reason
            self._connected = False
            sock = self._sock
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if not self._reconnects():
            self._finish(Disconnected(reason))

    # -- internals: the calling thread --------------------------------------------------------------------------

    def _wait(self, ready: Callable[[], Any], deadline: Deadline, what: _What) -> Any:
        """Pumps frames until ``ready()`` returns something, ``deadline`` passes (raises
        :class:`FluxTimeoutError`) or the client is closed (raises :class:`Disconnected`)."""
        last_look = False
        while True:
            value = ready()
            if value is not None:
                return value
            if self._closed is not None:
                raise self._closed
            if deadline.expired():
                if last_look:
                    raise deadline.error(what) if isinstance(what, str) else what()
                last_look = True  # route what has arrived already before giving up
            self._pump(deadline.remaining())

    def _wake(self) -> None:
        """Wakes the thread waiting in a call of this client, so that it checks what it waits for again."""
        with self._cond:
            self._incoming.append(_WAKE)
            self._cond.notify_all()

    def _pump(self, timeout: Optional[float]) -> None:
        """Takes what the reader thread has received (waiting at most ``timeout``) and routes it."""
        if self._closed is not None:
            return
        with self._cond:
            if not self._incoming:
                self._cond.wait(timeout)
            batch: List[_Incoming] = list(self._incoming)
            self._incoming.clear()
            self._incoming_bytes = 0
            self._cond.notify_all()  # room again for a reader that waits for it
        for item in batch:
            if item is _WAKE:
                continue
            if isinstance(item, Disconnected):
                self._finish(item)
            elif isinstance(item, _Lost):
                self._on_lost(item)
            elif isinstance(item, _Reconnected):
                self._on_reconnected(item)
            elif isinstance(item, bytes):
                self._keep_error(BadJSONError(f"unreadable frame from fluxd: {item[:80]!r}"))
            else:
                self._route_message(item)

    def _on_lost(self, lost: _Lost) -> None:
        """Connection ``lost.gen`` has ended and every frame it brought has been routed."""
        self._lost_gen = max(self._lost_gen, lost.gen)
        self._lost_reason = lost.reason
        for registration in list(self._stores.values()):
            registration._connection_lost()

    def _on_reconnected(self, item: _Reconnected) -> None:
        """Connection ``item.gen`` is up: what follows in the queue is its frames."""
        self._route_gen = item.gen
        self.welcome = self._welcome_from(item.welcome)
        if item.epoch_changed:
            for sub in list(self._subscriptions.values()):
                sub._epoch_changed()
        for ident in item.unresolved:
            self._resolve(ident, self._lost_dispatch_error(ident, item.lost, "fluxd restarted without its history"))

    def _push(self, item: _Incoming, size: int = 0) -> None:
        with self._cond:
            self._incoming.append(item)
            self._incoming_bytes += size
            self._cond.notify_all()

    # -- internals: the reader thread ---------------------------------------------------------------------------

    def _read_loop(self) -> None:
        """The reader thread: reads each connection's frames, answers heartbeat pings at once, queues the rest
        for the caller; when a connection ends and the client reconnects, makes the next one."""
        sock: Optional[socket.socket] = self._sock
        decoder = FrameDecoder()
        leftovers: List[bytes] = []
        gen = 1
        while True:
            assert sock is not None
            end = self._read_connection(sock, decoder, leftovers, gen)
            self._registrations_ended(gen, end)
            if not self._reconnects():
                self._ended_for_good(end)
                self._push(end)
                return
            with self._link:
                self._connected = False
                self._sock = None
                self._drop_reason = None
                self._link.notify_all()
            try:
                sock.close()
            except OSError:
                pass
            self._lost_reason = end
            self._push(_Lost(gen, end))
            self._emit(ConnectionEvent(ConnectionEvent.DISCONNECTED, reason=describe(end), will_reconnect=True,
                                       error=end.error))
            result = self._reconnect_loop(end)
            if result is None:
                self._push(self._closed or self._gave_up or Disconnected("closed locally"))
                return
            sock, gen, decoder, leftovers = result

    _gave_up: Optional[Disconnected] = None

    def _read_connection(self, sock: socket.socket, decoder: FrameDecoder, leftovers: List[bytes],
                         gen: int = 1) -> Disconnected:
        """Reads connection ``gen`` until it ends; returns why it ended."""
        end = Disconnected("fluxd closed the connection")
        ending: Optional[Disconnected] = None  # fluxd's bye or fatal error, when it sent one
        try:
            bodies: Iterable[bytes] = leftovers
            while self._closed is None:
                for body in bodies:
                    try:
                        item: _Incoming = loads(body)
                    except ValueError:
                        item = body
                    if isinstance(item, dict):
                        op = item.get("op")
                        if op == Op.PING:
                            self._answer_ping(item)
                            continue
                        if op == Op.BYE:
                            reason = item.get("reason") if isinstance(item.get("reason"), str) else None
                            ending = Disconnected(f"fluxd said bye ({reason})", bye_reason=reason)
                        elif op == Op.ERROR and item.get("fatal") is True:
                            error = FluxError.from_frame(item)
                            ending = Disconnected(f"fluxd closed the connection: {error}", error)
                        if op in (Op.REGISTERED, Op.ERROR):
                            refused = self._store_frame_read(item, gen)
                            if refused is not None:  # register again after the wait, on a new connection
                                self._drop(gen, refused)
                    with self._cond:
                        self._incoming.append(item)
                        self._incoming_bytes += len(body)
                        self._cond.notify_all()
                        while self._incoming_bytes > self.max_buffered and self._closed is None:
                            self._cond.wait()
                data = sock.recv(262144)
                if not data:
                    break
                bodies = [body for kind, body in decoder.feed(data) if kind == "frame"]  # type: ignore[misc]
        except (OSError, ValueError) as error:
            end = Disconnected(f"receive failed: {error}")
        except Exception as error:  # never leave the caller waiting for a reader that died
            end = Disconnected(f"reader thread failed: {type(error).__name__}: {error}")
        if self._drop_reason is not None:
            return Disconnected(self._drop_reason)
        return ending or end

    def _reconnect_loop(self, lost: Disconnected) -> Optional[tuple]:
        """Reconnects with backoff; returns the new connection, or ``None`` when closed or given up."""
        policy = self.reconnect
        started = time.monotonic()
        attempt = 0
        last: BaseException = lost
        while not self._closing and self._closed is None:
            attempt += 1
            delay = policy.delay(attempt)
            if policy.max_attempts is not None and attempt > policy.max_attempts:
                return self._give_up(lost, last, f"after {attempt - 1} attempt(s)")
            if policy.give_up_after is not None and time.monotonic() - started + delay > policy.give_up_after:
                return self._give_up(lost, last, f"after {format_seconds(policy.give_up_after)} s")
            delay = max(delay, self._registration_hold())  # a refused registration waits longer (SPEC §16.6)
            self._emit(ConnectionEvent(ConnectionEvent.RECONNECTING, reason=describe(last), attempt=attempt, delay=delay))
            if self._stop.wait(delay):
                return None
            try:
                result = self._handshake_again(lost, attempt)
            except (OSError, FluxError) as error:
                last = error
                continue
            if result is not None:
                return result
        return None

    def _give_up(self, lost: Disconnected, last: BaseException, how: str) -> None:
        reason = f"gave up reconnecting to fluxd {how}: {describe(last)}"
        self._gave_up = Disconnected(reason, lost.error, bye_reason=lost.bye_reason)
        self._emit(ConnectionEvent(ConnectionEvent.GAVE_UP, reason=reason))
        return None

    def _handshake_again(self, lost: Disconnected, attempt: int) -> Optional[tuple]:
        """One attempt: connect, check fluxd's uid, ``hello`` with the session, read the ``welcome``; then make
        it the client's connection (see :meth:`_adopt_connection`)."""
        path = self.socket_path or resolve_socket_path(None)[0]
        deadline = Deadline(self.reconnect.handshake_timeout)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._pending_sock = sock
        try:
            if self._closed is not None:
                raise self._closed
            _connect_socket(sock, path, self._source, deadline)
            check_server_uid(sock, path, self._expected_uid)
            sock.settimeout(deadline.remaining())
            sock.sendall(self._hello_frame(self.role, self.name, self._heartbeat, self.session))
            decoder = FrameDecoder()
            welcome: Optional[Message] = None
            leftovers: List[bytes] = []
            while welcome is None:
                remaining = deadline.remaining()
                if not remaining:
                    raise deadline.error(f"waiting for fluxd's welcome at {path}")
                sock.settimeout(remaining)
                data = sock.recv(65536)
                if not data:
                    raise Disconnected("fluxd closed the connection during the handshake")
                for kind, body in decoder.feed(data):
                    if kind != "frame":
                        continue
                    assert isinstance(body, bytes)
                    if welcome is not None:
                        leftovers.append(body)
                        continue
                    msg = loads(body)
                    if isinstance(msg, dict) and msg.get("op") == Op.WELCOME:
                        welcome = msg
                    elif isinstance(msg, dict) and msg.get("op") == Op.ERROR:
                        raise FluxError.from_frame(msg)
            sock.settimeout(None)
        except socket.timeout:
            sock.close()
            raise deadline.error(f"waiting for fluxd's welcome at {path}") from None
        except BaseException:
            sock.close()
            raise
        finally:
            self._pending_sock = None
        return self._adopt_connection(sock, welcome, decoder, leftovers, lost, attempt)

    def _adopt_connection(self, sock: socket.socket, msg: Message, decoder: FrameDecoder, leftovers: List[bytes],
                          lost: Disconnected, attempt: int) -> Optional[tuple]:
        """Makes ``sock`` the client's connection: queues the ``_Reconnected`` marker, sends the replay frames
        (subscriptions, queries, stores, ``recover``) before any other frame, then lets calls send."""
        epoch = msg.get("epoch") if isinstance(msg.get("epoch"), str) else None
        with self._link:
            if self._closing or self._closed is not None:
                sock.close()
                return None
            changed = self._epoch_changed(epoch)
            gen = self._conn_gen + 1
            frames, unresolved = self._replay_frames(changed, msg, gen)
            self._sock = sock
            self._conn_gen = gen
            self._push(_Reconnected(gen, msg, changed, unresolved, lost))
            try:
                sock.settimeout(self.reconnect.handshake_timeout)  # fluxd reads; if not, this connection is no good
                for frame in frames:
                    sock.sendall(frame)
                sock.settimeout(None)
            except OSError as error:  # lost again already (or timed out): the reader sees the end of this one
                self._drop_reason = f"send failed: {error}"
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.epoch = epoch
            self._connected = True
            self._link.notify_all()
        self._emit(ConnectionEvent(ConnectionEvent.RECONNECTED, attempt=attempt, epoch=epoch, epoch_changed=changed))
        return sock, gen, decoder, leftovers

    def _answer_ping(self, msg: Message) -> None:
        if self._closed is not None:
            return
        with self._link:
            sock = self._sock
            if sock is None or not self._connected:
                return
            try:
                sock.sendall(self._pong_frame(msg))
                self.pings_answered += 1
            except OSError:
                pass  # the connection is going; recv will say so

    # -- internals: routing -------------------------------------------------------------------------------------

    def _keep_error(self, error: FluxError) -> None:
        self.errors.append(error)

    def _on_welcome(self, msg: Message) -> None:
        self._welcome_msg = msg

    def _on_reply(self, key: str, msg: Message) -> None:
        if key in self._recovering:
            for ident, outcome in self._recovered_outcomes(key, msg):
                self._resolve(ident, outcome)
            return
        if key.startswith("subscribed:") and key not in self._awaited:
            sub = self._subscriptions.get(key[len("subscribed:"):])
            if sub is not None:  # the subscription made again on a new connection
                sub._resubscribed(msg)
            return
        if key in self._awaited:  # a reply nobody waits for any more (its call timed out) is dropped
            self._replies[key] = msg

    def _on_subscription(self, key: Optional[str], msg: Message) -> None:
        op = msg.get("op")
        if op == Op.SUBTREE:
            sub = self._subscriptions.get(subscription_key(key, msg.get("path")))
            if sub is not None:
                sub._deliver(msg)
            return
        if op == Op.STORE_DOWN or op == Op.STORE_UP:  # once per connection and store, for all it holds (§16.4)
            for each in [s for s in self._subscriptions.values() if s.store == key]:
                each._deliver(msg)
        else:
            sub = self._subscriptions.get(key)  # type: ignore[arg-type]
            if sub is not None:
                sub._deliver(msg)
        registration = self._stores.get(key)  # type: ignore[arg-type]
        if msg.get("op") == Op.SNAPSHOT and registration is not None:
            registration._inbox.append(msg)

    def _on_store(self, key: Optional[str], msg: Message) -> None:
        registration = self._stores.get(key)  # type: ignore[arg-type]
        if registration is not None:
            if msg.get("op") == Op.REGISTERED:
                registration._registered(msg, self._route_gen)
            registration._inbox.append(msg)

    def _on_error(self, key: Optional[str], msg: Message, error: FluxError) -> None:
        if key is not None and key in self._recovering:
            for ident, outcome in self._recovered_outcomes(key, msg):
                self._resolve(ident, outcome)
        elif key is not None and key in self._awaited:
            self._replies[key] = msg
        elif key is not None and key in self._stores:
            self._stores[key]._inbox.append(msg)
        elif key is not None and f"subscribed:{key}" in self._awaited:
            self._replies[f"subscribed:{key}"] = msg
        elif key is not None and any(k.startswith(f"subscribed:{key}|") for k in self._awaited):
            self._replies[next(k for k in self._awaited if k.startswith(f"subscribed:{key}|"))] = msg
        else:
            self.errors.append(error)

    def _finish(self, reason: Disconnected) -> None:
        if self._closed is None:
            self._closed = reason
            self._closing = True
            self._stop.set()
            with self._link:
                self._connected = False
                sock = self._sock
                self._link.notify_all()
            for each in (sock, self._pending_sock):
                if each is None:
                    continue
                try:
                    each.shutdown(socket.SHUT_RDWR)  # wakes the reader thread's recv
                except OSError:
                    pass
            with self._cond:
                self._cond.notify_all()  # and a reader waiting for room
            if self._reader.is_alive() and threading.current_thread() is not self._reader:
                self._reader.join(5)
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass


class Subscription(SubscriptionCore):
    """A subscription to one store: iterate it for :class:`Snapshot` objects (the retained one first, then each
    newer version; never an older one). Iteration ends when the connection ends or the subscription is closed.

    ``status`` is ``up``, ``down`` or ``unknown`` (no store of that name has registered yet) and follows
    ``store-down``/``store-up`` as this client reads (during any call, or :meth:`Client.poll`); :attr:`events`
    keeps those events. ``latest`` is the newest snapshot received, ``first_snapshot`` the first one. How long
    waits may take: see :meth:`Client.subscribe`."""

    client: Client

    def __init__(self, client: Client, store: str, path: Optional[str] = None, deltas: bool = False):
        super().__init__(client, store, path, deltas)
        self._queue: Deque[Snapshot] = collections.deque()
        self._open = True

    def _enqueue(self, snap: Snapshot) -> None:
        self._queue.append(snap)

    def _take(self, deadline: Deadline) -> Snapshot:
        def ready() -> Optional[Snapshot]:
            if self._queue:
                return self._queue.popleft()
            if not self._open:
                raise RuntimeError(f"the subscription to {self.store!r} is closed")
            return None
        return self.client._wait(ready, deadline, lambda: self._timeout_error(deadline))

    def next(self, timeout: Optional[float] = None) -> Snapshot:
        """The next snapshot. Waits up to ``timeout`` s (default: as the ``subscribe`` call's timeout says, else
        the client's default); raises :class:`~fluxbus.errors.FluxTimeoutError` saying why nothing came (e.g.
        ``no store named 'x' has registered yet``), or :class:`Disconnected` when the connection ended and
        nothing is left."""
        return self._take(self._wait_deadline(timeout, self.client.timeout))

    def first(self, timeout: Optional[float] = None) -> Snapshot:
        """The subscription's first snapshot (the retained one, or the first one the store makes), waiting for
        it as :meth:`next` does. It does not take it from the iteration."""
        deadline = self._wait_deadline(timeout, self.client.timeout)
        return self.client._wait(lambda: self.first_snapshot, deadline, lambda: self._timeout_error(deadline))

    def wait_status(self, *statuses: str, timeout: Optional[float] = None) -> str:
        """Waits until :attr:`status` is one of ``statuses`` (e.g. ``"up"``) and returns it; ``timeout`` as for
        :meth:`next` (raises :class:`~fluxbus.errors.FluxTimeoutError` saying what the status is)."""
        deadline = self._wait_deadline(timeout, self.client.timeout)
        return self.client._wait(lambda: self.status if self.status in statuses else None, deadline,
                                 lambda: self._status_timeout_error(deadline, statuses))

    def until(self, predicate: Callable[[Snapshot], bool], timeout: Optional[float] = None) -> Snapshot:
        """Reads snapshots until one satisfies ``predicate(snapshot)`` and returns it; ``timeout`` covers all of
        it (default: each wait as :meth:`next`)."""
        deadline = None if timeout is None else Deadline(timeout)
        while True:
            snap = self._take(deadline or self._wait_deadline(None, self.client.timeout))
            if predicate(snap):
                return snap

    def __iter__(self) -> Iterator[Snapshot]:
        while self._open:
            try:
                yield self._take(self._wait_deadline(None, None))
            except Disconnected:
                return

    def close(self, timeout: Optional[float] = None) -> None:
        """Unsubscribes (idempotent)."""
        if self._open:
            self._open = False
            self.client._unsubscribe(self.store, timeout, self.path)

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class QueryReceipt(QueryReceiptCore):
    """An active query (WordPressFlux's Receipt). ``close()`` (or leaving the ``with`` block) withdraws it."""

    client: Client

    def close(self, timeout: Optional[float] = None) -> None:
        """Withdraws the query (``unquery``); idempotent."""
        if self.active:
            self.active = False
            self.client._unquery(self.id, timeout)

    def __enter__(self) -> "QueryReceipt":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class StoreRegistration(RegistrationCore):
    """A store this connection registered (:meth:`Client.register`): what fluxd sends the store, and how the
    store answers. ``version``, ``seq`` and ``resumed`` are those of fluxd's last ``registered`` (SPEC §8.2).

    :class:`fluxbus.Store` is built on it; use it directly for a store loop of your own. :meth:`next` may be
    called from one thread (the store's); :meth:`interrupt` and the sending methods from any.

    After a lost connection the client registers the store again: :meth:`next` then yields ``registered``,
    the retained ``snapshot`` (adopt it: SPEC §15.3) and ``queries`` again before the actions. Messages of the
    lost connection not yet taken are dropped, and an answer to an action of the lost connection is not sent
    (fluxd delivers the action again)."""

    client: Client

    def __init__(self, client: Client, store: str):
        super().__init__(client, store)
        self._inbox: Deque[Message] = collections.deque()
        self._interrupted = False

    def _connection_lost(self) -> None:
        self._inbox.clear()  # what the lost connection delivered is delivered again after registering again

    def next(self, timeout: Optional[float] = None) -> Optional[Message]:
        """The next message fluxd sent for this store, as a dict, in order: the retained ``snapshot`` and the
        ``queries`` that follow registration, then ``action``, ``queries``/``queries-changed``, ``snapshot`` (when
        this connection also subscribes) and ``error`` (an answer fluxd refused; ``ref`` = the store); after a
        reconnection ``registered`` again, and so on. Waits without limit unless ``timeout`` is given (then
        raises :class:`~fluxbus.errors.FluxTimeoutError`). Returns ``None`` once :meth:`interrupt` was called;
        raises :class:`Disconnected` when the client is closed (or gave up reconnecting)."""
        def ready() -> Any:
            if self._interrupted:
                return _WAKE
            return self._inbox.popleft() if self._inbox else None
        msg = self.client._wait(ready, Deadline(timeout), f"waiting for a message for store {self.store!r}")
        if msg is _WAKE:
            return None
        self._handed_out(msg)
        return msg

    def interrupt(self) -> None:
        """Makes :meth:`next` return ``None`` (now, if a thread waits in it, and from then on). Thread-safe."""
        self._interrupted = True
        self.client._wake()

    def done(self, seq: int, state: Any = None, timeout: Optional[float] = None, *, patch: Any = None,
             base: Optional[int] = None) -> bool:
        """Answers the action ``seq`` as handled, with the store's new full ``state`` (``None``: unchanged) and/or,
        with a fluxd that speaks SPEC §16, the ``patch`` from the retained state to the new one and the ``base``
        version it applies to (``state`` and ``patch`` may be given as encoded JSON bytes). Returns ``False``
        when the action came on a connection that is gone (nothing is sent: fluxd delivers it again)."""
        frame = self.client._change_frame({"op": Op.DONE, "store": self.store, "seq": seq}, state, patch, base)
        return bool(self.client._send_raw(frame, self.client._deadline(timeout),
                                          only_gen=self._answer_generation(seq) or None))

    def barrier(self, timeout: Optional[float] = None) -> bool:
        """Sends ``ping`` on the connection the store is registered on and waits for the ``pong``: returns
        ``True`` once it came (fluxd has handled every frame sent before it on that connection, SPEC §2), ``False``
        when that connection is gone (a new one registers the store again)."""
        return self.client._barrier(self._generation, timeout) if self._generation else False

    def reject(self, seq: int, error: Mapping[str, Any], timeout: Optional[float] = None) -> bool:
        """Answers the action ``seq`` as rejected with ``error`` (``{"code": ..., "message": ..., ...}``);
        returns ``False`` as :meth:`done` does."""
        return self._answer(seq, {"op": Op.REJECT, "store": self.store, "seq": seq, "error": dict(error)}, timeout)

    def publish(self, state: Any, timeout: Optional[float] = None) -> None:
        """Publishes a new full state outside an action (``state``, SPEC §8.4). Raises
        :class:`~fluxbus.errors.NotSentError` while the store is not registered on the current connection
        (reconnecting): on registering again it adopts the retained snapshot, so publish again then."""
        frame = self.client._change_frame({"op": Op.STATE, "store": self.store}, state if state is not None else b"null")
        if not self.client._send_raw(frame, self.client._deadline(timeout), only_gen=self._generation or None):
            raise NotSentError(f"state of store {self.store!r} not sent: the store is not registered on the current "
                               f"connection (reconnecting); it adopts the retained snapshot when it registers "
                               f"again", ref=self.store)

    def publish_patch(self, patch: Any, base: Optional[int] = None, timeout: Optional[float] = None) -> None:
        """Publishes a change outside an action as a ``patch`` (SPEC §16.2; ``patch`` a list of operations or its
        encoded JSON bytes) from the retained version ``base`` (``None``: whatever is retained). A patch that does
        not apply makes fluxd answer ``patch-failed`` and close the connection. Raises
        :class:`~fluxbus.errors.NotSentError` as :meth:`publish` does."""
        frame = self.client._change_frame({"op": Op.PATCH, "store": self.store}, None, patch, base)
        if not self.client._send_raw(frame, self.client._deadline(timeout), only_gen=self._generation or None):
            raise NotSentError(f"patch of store {self.store!r} not sent: the store is not registered on the current "
                               f"connection (reconnecting); it adopts the retained snapshot when it registers "
                               f"again", ref=self.store)

    def unregister(self, timeout: Optional[float] = None) -> None:
        """Takes the store down (``unregister``, SPEC §8.2); fluxd sends no reply. Not registered again after a
        reconnection."""
        if self.client._stores.get(self.store) is self:
            del self.client._stores[self.store]
        self._send({"op": Op.UNREGISTER, "store": self.store}, timeout, self._generation or None)

    def _answer(self, seq: int, fields: Message, timeout: Optional[float]) -> bool:
        return self._send(fields, timeout, self._answer_generation(seq) or None)

    def _send(self, fields: Message, timeout: Optional[float], only_gen: Optional[int]) -> bool:
        return bool(self.client._send_raw(self.client._frame(fields), self.client._deadline(timeout),
                                          only_gen=only_gen))


def connect(socket_path: Optional[str] = None, name: str = "", role: str = "client",
            timeout: Optional[float] = 30.0, heartbeat: bool = True,
            expected_server_uid: Optional[int] = None, **options: Any) -> Client:
    """Shorthand for :meth:`Client.connect` (``options``: ``reconnect``, ``on_connection_event``, ``session``)."""
    return Client.connect(socket_path, name, role, timeout, heartbeat, expected_server_uid, **options)

