"""The asyncio FluxBus client: every call that talks to fluxd is a coroutine."""
from __future__ import annotations

import asyncio
import inspect
import socket
import time
import uuid
from typing import (Any, AsyncIterator, Awaitable, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, TypeVar,
                    Union)

from ._core import (NO_LIMIT, ClientCore, acknowledges, waiting_note, Deadline, Message, QueryReceiptCore, RegistrationCore, SubscriptionCore,
                    _max_frame, describe, format_seconds, resolve_socket_path)
from .errors import Disconnected, FluxError, FluxTimeoutError, NameTakenError, NotSentError, connect_error
from .protocol import Op
from .reconnect import ConnectionCallback, ConnectionEvent, ReconnectOption
from .wire import (FrameDecoder, Settlement, Snapshot, Welcome, check_server_uid, expected_server_uid, loads,
                   subscription_key)

_expected_server_uid = expected_server_uid
T = TypeVar("T")
#: What a wait raises when its deadline passes: a message (``timed out after N s <what>``) or a ready error.
_What = Union[str, Callable[[], FluxError]]
#: Put in a registration's queue by :meth:`AsyncStoreRegistration.interrupt`.
_INTERRUPT = object()


async def _timed(awaitable: Awaitable[T], deadline: Deadline, what: _What) -> T:
    """Awaits ``awaitable`` until ``deadline``; then cancels it and raises :class:`FluxTimeoutError`."""
    if deadline.at is None:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, deadline.remaining())
    except FluxTimeoutError:
        raise  # an inner call's own deadline
    except asyncio.TimeoutError:
        raise (deadline.error(what) if isinstance(what, str) else what()) from None


async def _refusal(loop: asyncio.AbstractEventLoop, sock: socket.socket, error: OSError) -> FluxError:
    """What fluxd said before it closed a connection whose hello could not be sent (its fatal error, if any)."""
    decoder = FrameDecoder()
    try:
        while True:
            data = await loop.sock_recv(sock, 65536)
            if not data:
                break
            for kind, body in decoder.feed(data):
                if kind == "frame":
                    msg = loads(body)  # type: ignore[arg-type]
                    if isinstance(msg, dict) and msg.get("op") == Op.ERROR:
                        return FluxError.from_frame(msg)
    except (OSError, ValueError):
        pass
    return Disconnected(f"fluxd closed the connection before the handshake: {error}")


async def _open_stream(path: str, source: str, expected: Optional[int],
                       hello: bytes) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connects to fluxd at ``path``, checks its uid and sends ``hello`` on the bare socket (so that a refusal
    fluxd sends before reading anything is still read, see :func:`_refusal`), then makes the stream."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        try:
            await loop.sock_connect(sock, path)
        except OSError as error:
            raise connect_error(path, source, error) from None
        check_server_uid(sock, path, expected)
        try:
            await loop.sock_sendall(sock, hello)
        except OSError as error:
            raise await _refusal(loop, sock, error) from None
        return await asyncio.open_unix_connection(sock=sock, limit=1 << 26)
    except BaseException:
        sock.close()
        raise


class _ConnectionLost(Exception):
    """Set on a call's future when the connection its request went out on was lost before the reply."""


class AsyncClient(ClientCore):
    """An asyncio connection to fluxd (protocol 1). Create one with ``await AsyncClient.connect(...)``.

    Every call that talks to fluxd is a coroutine (``await client.dispatch(...)`` too: it waits until the frame
    is handed to the socket, so a writer that fluxd does not keep up with is slowed down instead of buffering
    without bound). A reader task routes every frame: replies resolve the awaiting call (matched by the id the
    client generated), snapshots go to subscriptions, other errors to :attr:`errors`. When the client is closed
    (or gives up reconnecting), pending calls raise :class:`~fluxbus.errors.Disconnected` and subscriptions
    stop. Use ``async with`` or ``await client.close()``.

    **Reconnection** is on by default, as in :class:`fluxbus.Client`: the reader task reconnects with backoff
    (waiting without blocking the loop), says ``hello`` with the same :attr:`session`, subscribes again,
    declares the live queries again, registers the stores again and ``recover``\\ s awaited settlements; calls
    made meanwhile wait for the new connection within their timeout. ``on_connection_event`` is called on the
    loop with each :class:`fluxbus.ConnectionEvent` (a coroutine function's result is run as a task);
    :attr:`connection_events` keeps the latest.

    Errors from fluxd are raised as the :class:`~fluxbus.errors.FluxError` subclass of their code. Every call
    takes an optional ``timeout`` (``None``: the client's :attr:`timeout`, set by :meth:`connect`) covering the
    whole call; running out raises :class:`~fluxbus.errors.FluxTimeoutError` (a builtin ``TimeoutError`` too).

    The reader task also answers fluxd's heartbeat ``ping`` (``heartbeat=True``, the default) as soon as it reads
    it; that needs the event loop to run, so code on the loop must not block it for longer than
    ``welcome.limits["pingInterval"]`` × ``maxPingsOut`` ms.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str, role: str,
                 timeout: Optional[float] = None, *, reconnect: ReconnectOption = None,
                 on_connection_event: Optional[ConnectionCallback] = None, session: Optional[str] = None,
                 socket_path: Optional[str] = None, source: str = "socket_path", heartbeat: bool = True,
                 expected_server_uid: Optional[int] = None):
        super().__init__(reconnect, on_connection_event, session)
        self._reader = reader
        self._writer = writer
        self.name = name
        self.role = role
        self.timeout = timeout
        self.socket_path = socket_path
        self._source = source
        self._heartbeat = heartbeat
        self._expected_uid = expected_server_uid
        self._pending: Dict[str, asyncio.Future] = {}
        self._lost_policy: Dict[str, str] = {}  # key of a pending call -> what a lost connection does to it
        self._subscriptions: Dict[str, "AsyncSubscription"] = {}
        self._stores: Dict[str, "AsyncStoreRegistration"] = {}
        self.errors: "asyncio.Queue[FluxError]" = asyncio.Queue()
        self._welcome: "asyncio.Future[Message]" = asyncio.get_running_loop().create_future()
        self._drain_lock = asyncio.Lock()
        self._task: Optional[asyncio.Task] = None
        self._connected = asyncio.Event()  # set while the writer may be used (and once closed, to wake waiters)
        self._connected.set()
        self._conn_gen = 1
        self._stop = asyncio.Event()  # set by close(): ends a reconnection backoff at once
        self._end_reason: Optional[Disconnected] = None  # fluxd's bye or fatal error on this connection
        self._drop_reason: Optional[str] = None  # why this client ended the connection itself
        self._lost_reason: Optional[Disconnected] = None
        self._gave_up: Optional[Disconnected] = None
        self.welcome: Welcome

    @classmethod
    async def connect(cls, socket_path: Optional[str] = None, name: str = "", role: str = "client",
                      timeout: Optional[float] = 30.0, heartbeat: bool = True,
                      expected_server_uid: Optional[int] = None, *, reconnect: ReconnectOption = None,
                      on_connection_event: Optional[ConnectionCallback] = None,
                      session: Optional[str] = None) -> "AsyncClient":
        """Connects to fluxd and does the handshake. ``timeout`` covers both and is the default timeout of every
        later call (``None``: no limit). Raises what :meth:`fluxbus.Client.connect` raises:
        :class:`~fluxbus.errors.FluxConnectionError` naming the path and what to do when nothing listens there,
        :class:`~fluxbus.errors.TooManyConnectionsError` if fluxd refuses, :class:`FluxTimeoutError`.
        ``heartbeat`` and ``expected_server_uid`` are as in ``Client.connect``: the server uid (else
        ``$FLUXBUS_SERVER_UID``, else 0 when root) is checked with ``SO_PEERCRED`` before ``hello``; so are
        ``reconnect``, ``on_connection_event`` and ``session``."""
        path, source = resolve_socket_path(socket_path)
        expected = _expected_server_uid(expected_server_uid)
        options = dict(reconnect=reconnect, on_connection_event=on_connection_event,
                       session=session or uuid.uuid4().hex, socket_path=path, source=source, heartbeat=heartbeat,
                       expected_server_uid=expected)
        return await _timed(cls._open(path, source, name, role, timeout, heartbeat, expected, options),
                            Deadline(timeout), f"connecting to fluxd at {path}")

    @classmethod
    async def _open(cls, path: str, source: str, name: str, role: str, timeout: Optional[float], heartbeat: bool,
                    expected: Optional[int], options: Optional[Dict[str, Any]] = None) -> "AsyncClient":
        options = dict(options or {})
        session = options["session"] = options.get("session") or uuid.uuid4().hex
        # The hello is sent on the bare socket, before the stream exists: fluxd may refuse a connection before it
        # says anything (too-many-connections) and close it, and a stream whose write fails discards what was
        # still to be read, the refusal included.
        reader, writer = await _open_stream(path, source, expected, cls._hello_frame(role, name, heartbeat, session))
        client = cls(reader, writer, name, role, timeout, **options)
        client._task = asyncio.ensure_future(client._read_loop())
        try:
            msg = await asyncio.shield(client._welcome)
        except Disconnected as ended:
            client._abort(ended)
            raise (ended.error or ended) from None
        except BaseException:
            client._abort(Disconnected("handshake failed"))
            if client._welcome.done() and not client._welcome.cancelled():
                client._welcome.exception()  # retrieved: nobody awaits it any more (e.g. connect timed out)
            raise
        client.welcome = client._welcome_from(msg)
        client.epoch = client.welcome.epoch
        client._established = True
        return client

    @property
    def connected(self) -> bool:
        """Whether the client has a working connection now (``False`` while it reconnects, and once closed)."""
        return self._connected.is_set() and self._closed is None

    @property
    def state(self) -> str:
        """``connected``, ``reconnecting`` or ``closed``."""
        if self._closed is not None:
            return "closed"
        return "connected" if self._connected.is_set() else "reconnecting"

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self, timeout: float = 2.0) -> None:
        """Says ``bye``, waits (at most ``timeout`` s) for fluxd to close, then closes. Ends reconnecting too."""
        self._user_closed = self._closing = True
        self._stop.set()
        if self._closed is None and self._task is not None and self.connected:
            try:
                self._send_raw(self._frame({"op": Op.BYE}))
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            except (asyncio.TimeoutError, FluxError, OSError):
                pass
        self._abort(Disconnected("closed locally"))
        try:
            await self._writer.wait_closed()
        except OSError:
            pass

    def _abort(self, reason: Disconnected) -> None:
        """Ends the connection at once (no ``bye``), and reconnecting."""
        self._finish(reason)
        if self._task is not None and not self._task.done() and self._task is not asyncio.current_task():
            self._task.cancel()

    def drop_connection(self, reason: str = "dropped by the client") -> None:
        """Ends the current connection as if it had been lost (no ``bye``): the client reconnects as it would
        after a crash of fluxd or a broken socket (or closes, without reconnection). For tests and tools."""
        self._drop(self._conn_gen, reason)

    async def wait_connected(self, timeout: Optional[float] = None) -> None:
        """Waits until the client is connected (returns at once if it is); raises
        :class:`~fluxbus.errors.FluxTimeoutError` or, once closed, :class:`Disconnected`."""
        deadline = self._deadline(timeout)

        async def until() -> None:
            while self._closed is None and not self._connected.is_set():
                await self._connected.wait()
        await _timed(until(), deadline, f"waiting to reconnect to fluxd ({self._why_disconnected()})")
        if self._closed is not None:
            raise self._closed

    # -- operations ---------------------------------------------------------------------------------------------

    async def dispatch(self, type: str, payload: Any = None, cause: Optional[int] = None,
                       timeout: Optional[float] = None, *, ack: Optional[bool] = None) -> str:
        """Dispatches without waiting for the action's result; returns the id. With a fluxd that acknowledges
        dispatches (0.4.0, SPEC §8.3) it awaits fluxd's acceptance (one round trip) and raises the refusal (e.g.
        :class:`~fluxbus.errors.NoHandlerError`); :attr:`last_seq` is the seq the action got. ``ack=False`` (or an
        older fluxd): returns once the frame is handed to the socket, refusals arriving on :attr:`errors` with the
        id as ``ref``. ``timeout`` covers the wait for a connection, sending and the acceptance."""
        ident = self._check_action(type)
        if ack is None:
            ack = acknowledges(getattr(self, "welcome", None))
        if not ack:
            frame = self._dispatch_frame(ident, type, payload, cause, False)
            await _timed(self._write(frame), self._deadline(timeout), "sending to fluxd (it is not reading)")
            return ident
        msg = await self._call(ident, self._dispatch_frame(ident, type, payload, cause, False, ack=True),
                               self._deadline(timeout), f"waiting for fluxd to accept {type} ({ident})", on_lost="raise")
        self.last_seq = msg.get("seq")
        return ident

    async def dispatch_and_settle(self, type: str, payload: Any = None, cause: Optional[int] = None,
                                  timeout: Optional[float] = None) -> Settlement:
        """Dispatches and awaits the settlement (every target store's result); raises the error fluxd refused
        the action with (e.g. :class:`~fluxbus.errors.NoHandlerError`). A store's rejection is a result
        (``settlement.raise_for_status()`` raises it). Read your writes: this client's subscriptions already
        hold the new snapshots. A connection lost meanwhile is handled as in
        :meth:`fluxbus.Client.dispatch_and_settle` (``recover``; :class:`~fluxbus.errors.NotSentError`,
        :class:`~fluxbus.errors.OutcomeUnknownError`)."""
        ident = self._check_action(type)
        frame = self._dispatch_frame(ident, type, payload, cause, True)
        try:
            msg = await self._call(ident, frame, self._deadline(timeout),
                                   f"waiting for the settlement of {type} ({ident})", on_lost="recover", track=ident)
        except FluxTimeoutError as timed_out:
            # What the action still waits for, as fluxd's info tells (like fluxctl).
            try:
                note = waiting_note(await self.info(timeout=2), type)
            except FluxError:
                note = ""
            if not note:
                raise
            raise FluxTimeoutError(str(timed_out) + note, ref=ident) from None
        return Settlement.from_frame(msg)

    async def subscribe(self, store: str, timeout: Optional[float] = None, *, path: Optional[str] = None,
                        deltas: Optional[bool] = None) -> "AsyncSubscription":
        """Subscribes to a store; ``async for snapshot in subscription`` yields the retained snapshot, then every
        newer one. ``await subscription.close()`` (or ``async with``) unsubscribes. The store need not have
        registered yet: ``subscription.status`` is then ``unknown``. ``timeout`` is as in
        :meth:`fluxbus.Client.subscribe`: it covers the request and, when given, the wait for the first snapshot
        (from this call) and each later wait. The subscription lasts across reconnections. ``deltas`` and
        ``path`` (SPEC §16) as in :meth:`fluxbus.Client.subscribe`."""
        key = self._new_subscription(store, path, deltas)
        deadline = self._deadline(timeout)
        sub = self._subscriptions.get(key)
        created = sub is None
        if sub is None:
            sub = AsyncSubscription(self, store, path, bool(path is None and deltas is not False and
                                                            self.speaks_deltas()))
            self._subscriptions[key] = sub
        what = f"{store!r}" if path is None else f"{path!r} in {store!r}"
        try:
            msg = await self._call(f"subscribed:{key}", sub._subscribe_frame(), deadline,
                                   f"waiting for fluxd to confirm the subscription to {what}")
        except BaseException:
            if created and self._subscriptions.get(key) is sub:
                del self._subscriptions[key]
            raise
        sub._subscribed(msg, timeout, deadline)
        return sub

    async def _unsubscribe(self, store: str, timeout: Optional[float], path: Optional[str] = None) -> None:
        key = subscription_key(store, path)
        self._subscriptions.pop(key, None)
        if self._closed is None:
            fields: Message = {"op": Op.UNSUBSCRIBE, "store": store}
            if path is not None:
                fields["path"] = path
            await self._call(f"unsubscribed:{key}", self._frame(fields), self._deadline(timeout),
                             f"waiting for fluxd to confirm unsubscribing from {store!r}", on_lost="done")

    def _resync(self, sub: "SubscriptionCore") -> None:
        try:
            self._send_raw(sub._subscribe_frame())
        except FluxError:
            pass  # closed: nothing to resynchronise

    async def query(self, store: str, query: Any, timeout: Optional[float] = None) -> "AsyncQueryReceipt":
        """Declares a query; withdrawn by ``await receipt.close()`` (or ``async with``) or when the client is
        closed; declared again on every new connection."""
        self._check_store(store)
        ident = self._next_id("q")
        frame = self._query_frame(ident, store, query)
        await self._call(ident, frame, self._deadline(timeout), f"waiting for fluxd to accept the query on {store!r}")
        self._live_queries[ident] = frame
        return AsyncQueryReceipt(self, ident, store, query)

    async def _unquery(self, ident: str, timeout: Optional[float]) -> None:
        self._live_queries.pop(ident, None)
        if self._closed is None:
            await self._call(ident, self._frame({"op": Op.UNQUERY, "id": ident}), self._deadline(timeout),
                             f"waiting for fluxd to withdraw query {ident}", on_lost="done")

    async def register(self, store: str, handles: Iterable[str], wait_for: Iterable[str] = (), state: Any = None,
                       query_deltas: bool = False, timeout: Optional[float] = None, *,
                       confirm: bool = True) -> "AsyncStoreRegistration":
        """Registers a store on this (``store``-role) connection and waits for ``registered``; returns the
        :class:`AsyncStoreRegistration` the store reads and answers through (:class:`fluxbus.AsyncStore` does
        all of this for you). Raises e.g. :class:`~fluxbus.errors.NameTakenError`. The client registers the
        store again on every new connection. ``state`` is sent only if the frame fits in ``maxFrame``, and
        ``confirm`` is as in :meth:`fluxbus.Client.register` (SPEC §16.6)."""
        self._check_store(store)
        if store in self._stores:
            raise NameTakenError(f"this connection has already registered {store!r}", ref=store)
        registration = AsyncStoreRegistration(self, store)
        registration.confirm_on_registered = confirm
        registration._fields = self._register_fields(store, list(handles), list(wait_for), state, query_deltas)
        frame, registration.state_omitted = registration._fitting_frame(registration._fields,
                                                                        _max_frame(self.welcome))
        if registration.state_omitted:
            registration._fields.pop("state", None)
        self._stores[store] = registration

        def sent(gen: int) -> None:
            registration._sent = True  # from now on a new connection registers it again
            registration._register_sent(gen)

        async def exchange() -> Any:
            await self._write(frame, on_sent=sent)
            return await registration._queue.get()
        try:
            msg = await _timed(exchange(), self._deadline(timeout), f"waiting for fluxd to register {store!r}")
            if isinstance(msg, Disconnected):
                raise msg
            if msg.get("op") == Op.ERROR:
                raise FluxError.from_frame(msg)
        except BaseException:
            if self._stores.get(store) is registration:
                del self._stores[store]
            raise
        return registration

    async def _barrier(self, generation: int, timeout: Optional[float] = None) -> bool:
        """Sends ``ping`` on connection ``generation`` only and awaits its ``pong``: ``True`` once it came (fluxd
        has handled every frame sent before it on that connection), ``False`` when that connection is gone."""
        ident = self._next_id("r")
        frame = self._frame({"op": Op.PING, "id": ident})
        future = self._expect(ident, "done")
        try:
            if not await self._write(frame, only_gen=generation):
                return False
            try:
                msg = await _timed(asyncio.shield(future), self._deadline(timeout), "waiting for fluxd's pong")
            except _ConnectionLost:
                return False
            return isinstance(msg, dict) and msg.get("op") == Op.PONG
        finally:
            if self._pending.get(ident) is future:
                del self._pending[ident]
            self._lost_policy.pop(ident, None)
            if future.done() and not future.cancelled():
                future.exception()  # retrieved

    async def info(self, timeout: Optional[float] = None) -> Message:
        """fluxd's introspection data (SPEC §8.7)."""
        return await self._request({"op": Op.INFO}, timeout, "waiting for fluxd's info")

    async def get(self, store: str, timeout: Optional[float] = None) -> Snapshot:
        """Reads a store's retained snapshot once (:class:`~fluxbus.errors.UnknownStoreError` if none)."""
        return self._snapshot_from(await self._request({"op": Op.GET, "store": store}, timeout,
                                                       f"waiting for the snapshot of {store!r}"))

    async def ping(self, timeout: Optional[float] = None) -> float:
        """Round trip in seconds; a barrier for earlier replies."""
        start = time.monotonic()
        await self._request({"op": Op.PING}, timeout, "waiting for fluxd's pong")
        return time.monotonic() - start

    # -- internals: calls ---------------------------------------------------------------------------------------

    async def _request(self, fields: Message, timeout: Optional[float], what: str) -> Message:
        ident = self._next_id("r")
        fields["id"] = ident
        return await self._call(ident, self._frame(fields), self._deadline(timeout), what)

    async def _call(self, key: str, frame: bytes, deadline: Deadline, what: str, on_lost: str = "resend",
                    track: Optional[str] = None) -> Message:
        """Sends ``frame`` and awaits the reply routed under ``key``, all before ``deadline``. ``on_lost`` and
        ``track`` as in :meth:`fluxbus.Client._call`."""
        current: List[asyncio.Future] = []
        on_sent = None
        if track is not None:
            def on_sent(gen: int) -> None:
                self._unsettled[track] = gen  # from now on a new connection recovers its settlement

        async def exchange() -> Any:
            while True:
                future = self._expect(key, on_lost)
                current[:] = [future]
                if not await self._write(frame, wait=on_lost != "done", on_sent=on_sent):
                    return {}  # not connected: nothing to undo on fluxd
                try:
                    return await future
                except _ConnectionLost:
                    if on_lost == "done":
                        return {}
                    if on_lost == "raise":
                        raise Disconnected(f"the connection was lost before fluxd answered ({what}): it may or may not have been taken")
        try:
            msg = await _timed(exchange(), deadline, what)
        except Disconnected as ended:
            if track is not None and track in self._unsettled:  # sent, and no connection left to ask
                raise self._lost_dispatch_error(track, ended, "the connection was lost") from None
            raise
        finally:
            for future in current:
                if self._pending.get(key) is future:
                    del self._pending[key]  # a timed-out call leaves nothing behind
                if key not in self._pending:
                    self._lost_policy.pop(key, None)
                if future.done() and not future.cancelled():
                    future.exception()  # retrieved
            if track is not None:
                self._unsettled.pop(track, None)
        if isinstance(msg, FluxError):
            raise msg
        if msg.get("op") == Op.ERROR:
            raise FluxError.from_frame(msg)
        return msg

    def _expect(self, key: str, on_lost: str = "resend") -> asyncio.Future:
        if self._closed is not None:
            raise self._closed
        future = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        self._lost_policy[key] = on_lost
        return future

    def _resolve(self, ident: str, outcome: Any) -> None:
        """Hands the call waiting under ``ident`` its outcome (a message or an error), unless it has one."""
        future = self._pending.get(ident)
        if future is not None and not future.done():
            del self._pending[ident]
            future.set_result(outcome)

    # -- internals: sending -------------------------------------------------------------------------------------

    def _live_generation(self) -> int:
        return self._conn_gen if self.connected else -1

    def _why_disconnected(self) -> str:
        return describe(self._lost_reason) if self._lost_reason is not None else "the connection was lost"

    def _send_raw(self, frame: bytes, deadline: Deadline = NO_LIMIT) -> None:
        """Queues ``frame`` on the transport without waiting (pongs, bye); calls use :meth:`_write`. Nothing is
        sent while the client reconnects."""
        if self._closed is not None:
            raise self._closed
        if self._connected.is_set():
            self._writer.write(frame)

    async def _write(self, frame: bytes, *, wait: bool = True, only_gen: Optional[int] = None,
                     on_sent: Optional[Callable[[int], None]] = None) -> int:
        """Writes ``frame`` and waits until the transport's buffer is below its high-water mark again; returns
        the generation of the connection it went out on, or 0 when it was not sent (as
        :meth:`fluxbus.Client._send_raw`: ``wait`` false or ``only_gen`` not current while reconnecting).
        Otherwise, while the client reconnects, waits for the new connection first."""
        while True:
            if self._closed is not None:
                raise self._closed
            if self._connected.is_set():
                break
            if only_gen is not None or not wait:
                return 0
            await self._connected.wait()
        gen = self._conn_gen
        if only_gen is not None and only_gen != gen:
            return 0
        writer = self._writer
        writer.write(frame)
        if on_sent is not None:
            on_sent(gen)
        try:
            async with self._drain_lock:
                await writer.drain()
        except (ConnectionError, OSError) as error:
            if self._reconnects():
                self._drop(gen, f"send failed: {error}")  # the reply will not come: the call sees it
            else:
                self._finish(Disconnected(f"send failed: {error}"))
                raise self._closed from None  # type: ignore[misc]
        return gen

    def _drop(self, gen: int, reason: str) -> None:
        """Ends connection ``gen`` (if it is still the current one) without ``bye``: the reader sees the end."""
        if gen != self._conn_gen or not self._connected.is_set() or self._closed is not None:
            return
        if not self._reconnects():
            self._finish(Disconnected(reason))
            return
        self._drop_reason = reason
        self._connected.clear()
        try:
            self._writer.transport.abort()
        except (OSError, RuntimeError):
            pass

    # -- internals: the reader task -----------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        decoder = FrameDecoder()
        leftovers: List[bytes] = []
        while True:
            end = await self._read_connection(decoder, leftovers)
            self._registrations_ended(self._conn_gen, end)
            if not self._reconnects():
                self._ended_for_good(self._closed or end)
                self._finish(end)
                return
            self._lost(end)
            result = await self._reconnect_loop(end)
            if result is None:
                self._finish(self._closed or self._gave_up or Disconnected("closed locally"))
                return
            decoder, leftovers = result

    async def _read_connection(self, decoder: FrameDecoder, leftovers: List[bytes]) -> Disconnected:
        """Routes one connection's frames until it ends; returns why it ended."""
        end = Disconnected("fluxd closed the connection")
        try:
            for body in leftovers:
                self._route(body)
            while self._closed is None:
                data = await self._reader.read(262144)
                if not data:
                    break
                for kind, value in decoder.feed(data):
                    if kind == "frame":
                        self._route(value)  # type: ignore[arg-type]
        except (OSError, asyncio.IncompleteReadError) as error:
            end = Disconnected(f"receive failed: {error}")
        if self._drop_reason is not None:
            end = Disconnected(self._drop_reason)
        elif self._end_reason is not None:
            end = self._end_reason
        self._drop_reason = self._end_reason = None
        return end

    def _connection_ending(self, reason: Disconnected) -> None:
        if self._reconnects():
            self._end_reason = reason  # the reader reports it when the connection ends, then reconnects
        else:
            self._finish(reason)

    def _lost(self, end: Disconnected) -> None:
        """The current connection ended and the client reconnects: requests in flight are sent again on the
        next one (or done, for unsubscribe/unquery); settle dispatches wait for ``recover``."""
        self._connected.clear()
        self._lost_reason = end
        try:
            self._writer.transport.abort()
        except (OSError, RuntimeError):
            pass
        for key, future in list(self._pending.items()):
            if self._lost_policy.get(key) != "recover" and not future.done():
                del self._pending[key]
                future.set_exception(_ConnectionLost())
        for registration in list(self._stores.values()):
            registration._connection_lost()
        self._emit(ConnectionEvent(ConnectionEvent.DISCONNECTED, reason=describe(end), will_reconnect=True,
                                   error=end.error))

    async def _reconnect_loop(self, lost: Disconnected) -> Optional[Tuple[FrameDecoder, List[bytes]]]:
        """Reconnects with backoff; returns the new connection's decoder and the frames that came with its
        ``welcome``, or ``None`` when closed or given up."""
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
            try:
                await asyncio.wait_for(self._stop.wait(), delay)
                return None  # closed during the backoff
            except asyncio.TimeoutError:
                pass
            try:
                result = await self._handshake_again(lost, attempt)
            except (OSError, FluxError) as error:
                last = error
                continue
            return result
        return None

    def _give_up(self, lost: Disconnected, last: BaseException, how: str) -> None:
        reason = f"gave up reconnecting to fluxd {how}: {describe(last)}"
        self._gave_up = Disconnected(reason, lost.error, bye_reason=lost.bye_reason)
        self._emit(ConnectionEvent(ConnectionEvent.GAVE_UP, reason=reason))
        return None

    async def _handshake_again(self, lost: Disconnected, attempt: int) -> Optional[Tuple[FrameDecoder, List[bytes]]]:
        """One attempt: connect, check fluxd's uid, ``hello`` with the session, read the ``welcome``; then the
        new connection replaces the old one and gets the replay frames before any other (SPEC §15.5)."""
        path = self.socket_path or resolve_socket_path(None)[0]
        hello = self._hello_frame(self.role, self.name, self._heartbeat, self.session)

        async def handshake() -> Tuple[asyncio.StreamReader, asyncio.StreamWriter, Message, FrameDecoder,
                                       List[bytes]]:
            reader, writer = await _open_stream(path, self._source, self._expected_uid, hello)
            try:
                decoder = FrameDecoder()
                welcome: Optional[Message] = None
                leftovers: List[bytes] = []
                while welcome is None:
                    data = await reader.read(65536)
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
                return reader, writer, welcome, decoder, leftovers
            except BaseException:
                writer.transport.abort()
                raise
        reader, writer, msg, decoder, leftovers = await _timed(
            handshake(), Deadline(self.reconnect.handshake_timeout), f"waiting for fluxd's welcome at {path}")
        if self._closing or self._closed is not None:
            writer.transport.abort()
            return None
        epoch = msg.get("epoch") if isinstance(msg.get("epoch"), str) else None
        changed = self._epoch_changed(epoch)
        frames, unresolved = self._replay_frames(changed, msg, self._conn_gen + 1)
        self._reader, self._writer = reader, writer
        self._conn_gen += 1
        self.welcome = self._welcome_from(msg)
        self.epoch = epoch
        if changed:
            for sub in list(self._subscriptions.values()):
                sub._epoch_changed()
        for ident in unresolved:
            self._resolve(ident, self._lost_dispatch_error(ident, lost, "fluxd restarted without its history"))
        for frame in frames:
            writer.write(frame)
        self._connected.set()
        self._emit(ConnectionEvent(ConnectionEvent.RECONNECTED, attempt=attempt, epoch=epoch, epoch_changed=changed))
        return decoder, leftovers

    def _deliver_event(self, callback: ConnectionCallback, event: ConnectionEvent) -> None:
        result = callback(event)
        if inspect.isawaitable(result):
            asyncio.ensure_future(result)

    # -- internals: routing -------------------------------------------------------------------------------------

    def _keep_error(self, error: FluxError) -> None:
        self.errors.put_nowait(error)

    def _route_message(self, msg: Any) -> None:
        if isinstance(msg, dict) and msg.get("op") in (Op.REGISTERED, Op.ERROR):
            gen = self._conn_gen
            refused = self._store_frame_read(msg, gen)
            if refused is not None:  # register again after the wait, on a new connection (SPEC §16.6)
                self._drop(gen, refused)
        super()._route_message(msg)

    def _on_welcome(self, msg: Message) -> None:
        if not self._welcome.done():
            self._welcome.set_result(msg)

    def _on_reply(self, key: str, msg: Message) -> None:
        if key in self._recovering:
            for ident, outcome in self._recovered_outcomes(key, msg):
                self._resolve(ident, outcome)
            return
        future = self._pending.pop(key, None)
        if future is not None and not future.done():
            future.set_result(msg)
        elif key.startswith("subscribed:"):
            sub = self._subscriptions.get(key[len("subscribed:"):])
            if sub is not None:  # the subscription made again on a new connection
                sub._resubscribed(msg)

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
        if registration is not None and msg.get("op") == Op.SNAPSHOT:
            registration._queue.put_nowait(msg)

    def _on_store(self, key: Optional[str], msg: Message) -> None:
        registration = self._stores.get(key)  # type: ignore[arg-type]
        if registration is not None:
            if msg.get("op") == Op.REGISTERED:
                registration._registered(msg, self._conn_gen)
            registration._queue.put_nowait(msg)

    def _on_error(self, key: Optional[str], msg: Message, error: FluxError) -> None:
        if key is not None and key in self._recovering:
            for ident, outcome in self._recovered_outcomes(key, msg):
                self._resolve(ident, outcome)
            return
        future = None
        if key is not None:
            future = self._pending.pop(key, None)
            if future is None and key not in self._stores:
                future = self._pending.pop(f"subscribed:{key}", None)
                if future is None:
                    path_key = next((k for k in self._pending if k.startswith(f"subscribed:{key}|")), None)
                    future = self._pending.pop(path_key, None) if path_key is not None else None
        if future is not None and not future.done():
            future.set_result(msg)
        elif key is not None and key in self._stores:
            self._stores[key]._queue.put_nowait(msg)
        else:
            self.errors.put_nowait(error)
        if not self._welcome.done():
            self._welcome.set_exception(error)

    def _finish(self, reason: Disconnected) -> None:
        if self._closed is not None:
            return
        self._closed = reason
        self._closing = True
        self._stop.set()
        if not self._welcome.done():
            self._welcome.set_exception(reason)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(reason)
        self._pending.clear()
        self._lost_policy.clear()
        for sub in list(self._subscriptions.values()):
            sub._end()
        for registration in list(self._stores.values()):
            registration._queue.put_nowait(reason)
        try:
            self._writer.transport.abort()  # what is still unsent is dropped: nobody will wait for it
        except (OSError, RuntimeError):
            pass
        self._connected.set()  # wakes the calls waiting for a connection: they see _closed


class AsyncSubscription(SubscriptionCore):
    """An async iterator of a store's :class:`Snapshot` objects (retained first, then every newer version). Ends
    when the connection ends or the subscription is closed.

    ``status`` is ``up``, ``down`` or ``unknown`` (no store of that name has registered yet) and follows
    ``store-down``/``store-up`` (kept in :attr:`events`); ``latest`` and ``first_snapshot`` as in the sync
    ``Subscription``. How long waits may take: see :meth:`AsyncClient.subscribe`."""

    client: AsyncClient

    def __init__(self, client: AsyncClient, store: str, path: Optional[str] = None, deltas: bool = False):
        super().__init__(client, store, path, deltas)
        self._queue: "asyncio.Queue[Optional[Snapshot]]" = asyncio.Queue()
        self._first = asyncio.Event()
        self._status_event = asyncio.Event()
        self._open = True

    def _enqueue(self, snap: Snapshot) -> None:
        self._queue.put_nowait(snap)
        self._first.set()

    def _status_changed(self) -> None:
        self._status_event.set()
        self._status_event = asyncio.Event()

    async def wait_status(self, *statuses: str, timeout: Optional[float] = None) -> str:
        """Waits until :attr:`status` is one of ``statuses`` (e.g. ``"up"``) and returns it; ``timeout`` as for
        :meth:`next` (raises :class:`~fluxbus.errors.FluxTimeoutError` saying what the status is)."""
        deadline = self._wait_deadline(timeout, self.client.timeout)

        async def changes() -> str:
            while self.status not in statuses:
                if self.client._closed is not None or not self._open:
                    raise self._ended()
                await self._status_event.wait()
            return self.status  # type: ignore[return-value]
        return await _timed(changes(), deadline, lambda: self._status_timeout_error(deadline, statuses))

    async def _take(self, deadline: Deadline) -> Optional[Snapshot]:
        """The next snapshot, or ``None`` at the end (the end marker stays for the next reader)."""
        if self._queue.empty():
            snap = await _timed(self._queue.get(), deadline, lambda: self._timeout_error(deadline))
        else:
            snap = self._queue.get_nowait()
        if snap is None:
            self._queue.put_nowait(None)
        return snap

    def __aiter__(self) -> AsyncIterator[Snapshot]:
        return self

    async def __anext__(self) -> Snapshot:
        snap = await self._take(self._wait_deadline(None, None))
        if snap is None:
            raise StopAsyncIteration
        return snap

    def _ended(self) -> Exception:
        if self.client._closed is not None:
            return self.client._closed
        return RuntimeError(f"the subscription to {self.store!r} is closed")

    async def next(self, timeout: Optional[float] = None) -> Snapshot:
        """The next snapshot, waiting at most ``timeout`` seconds (default: as the ``subscribe`` call's timeout
        says, else the client's default); raises :class:`~fluxbus.errors.FluxTimeoutError` saying why nothing
        came (e.g. ``no store named 'x' has registered yet``), :class:`Disconnected` when the connection has
        ended."""
        snap = await self._take(self._wait_deadline(timeout, self.client.timeout))
        if snap is None:
            raise self._ended()
        return snap

    async def first(self, timeout: Optional[float] = None) -> Snapshot:
        """The subscription's first snapshot (the retained one, or the first one the store makes), waiting for
        it as :meth:`next` does; it stays in the iteration."""
        if self.first_snapshot is None:
            deadline = self._wait_deadline(timeout, self.client.timeout)
            await _timed(self._first.wait(), deadline, lambda: self._timeout_error(deadline))
            if self.first_snapshot is None:
                raise self._ended()
        return self.first_snapshot

    async def until(self, predicate: Callable[[Snapshot], bool], timeout: Optional[float] = None) -> Snapshot:
        """Reads snapshots until one satisfies ``predicate(snapshot)`` and returns it; ``timeout`` covers all of
        it (default: each wait as :meth:`next`)."""
        deadline = None if timeout is None else Deadline(timeout)
        while True:
            snap = await self._take(deadline or self._wait_deadline(None, self.client.timeout))
            if snap is None:
                raise self._ended()
            if predicate(snap):
                return snap

    def _end(self) -> None:
        """No more snapshots: the connection ended or the subscription was closed."""
        self._queue.put_nowait(None)
        self._first.set()
        self._status_event.set()

    async def close(self, timeout: Optional[float] = None) -> None:
        """Unsubscribes (idempotent)."""
        if self._open:
            self._open = False
            try:
                if self.client._subscriptions.get(subscription_key(self.store, self.path)) is self:
                    await self.client._unsubscribe(self.store, timeout, self.path)
            finally:
                self._end()

    async def __aenter__(self) -> "AsyncSubscription":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncQueryReceipt(QueryReceiptCore):
    """An active query; ``await close()`` (or leaving ``async with``) withdraws it."""

    client: AsyncClient

    async def close(self, timeout: Optional[float] = None) -> None:
        """Withdraws the query; idempotent."""
        if self.active:
            self.active = False
            await self.client._unquery(self.id, timeout)

    async def __aenter__(self) -> "AsyncQueryReceipt":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncStoreRegistration(RegistrationCore):
    """A store this connection registered (:meth:`AsyncClient.register`); the asyncio twin of
    :class:`fluxbus.client.StoreRegistration` (registered again after a lost connection, in the same way). Use it
    from the event loop's thread."""

    client: AsyncClient

    def __init__(self, client: AsyncClient, store: str):
        super().__init__(client, store)
        self._queue: "asyncio.Queue[Any]" = asyncio.Queue()
        self._interrupted = False

    def _connection_lost(self) -> None:
        """Drops what the lost connection delivered and the store has not taken (it is delivered again)."""
        kept = []
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is _INTERRUPT or isinstance(item, Disconnected):
                kept.append(item)
        for item in kept:
            self._queue.put_nowait(item)

    async def next(self, timeout: Optional[float] = None) -> Optional[Message]:
        """The next message fluxd sent for this store (as :meth:`fluxbus.client.StoreRegistration.next`): waits
        without limit unless ``timeout``; ``None`` once :meth:`interrupt` was called; raises
        :class:`Disconnected` when the client is closed."""
        if self._interrupted:
            return None
        if self._queue.empty():
            deadline = Deadline(timeout)
            item = await _timed(self._queue.get(), deadline, f"waiting for a message for store {self.store!r}")
        else:
            item = self._queue.get_nowait()
        if item is _INTERRUPT or self._interrupted:
            return None
        if isinstance(item, Disconnected):
            self._queue.put_nowait(item)
            raise item
        self._handed_out(item)
        return item

    def interrupt(self) -> None:
        """Makes :meth:`next` return ``None`` (now, if a task waits in it, and from then on)."""
        self._interrupted = True
        self._queue.put_nowait(_INTERRUPT)

    async def done(self, seq: int, state: Any = None, timeout: Optional[float] = None, *, patch: Any = None,
                   base: Optional[int] = None) -> bool:
        """Answers the action ``seq`` as handled, with the store's new full ``state`` (``None``: unchanged) and/or
        the ``patch`` to it from version ``base`` (as :meth:`fluxbus.client.StoreRegistration.done`). Returns
        ``False`` when the action came on a connection that is gone (nothing is sent)."""
        frame = self.client._change_frame({"op": Op.DONE, "store": self.store, "seq": seq}, state, patch, base)
        return bool(await _timed(self.client._write(frame, only_gen=self._answer_generation(seq) or None),
                                 self.client._deadline(timeout), "sending to fluxd (it is not reading)"))

    async def barrier(self, timeout: Optional[float] = None) -> bool:
        """As :meth:`fluxbus.client.StoreRegistration.barrier`: ``True`` once fluxd answered a ``ping`` sent on the
        connection the store is registered on, ``False`` when that connection is gone."""
        return await self.client._barrier(self._generation, timeout) if self._generation else False

    async def reject(self, seq: int, error: Mapping[str, Any], timeout: Optional[float] = None) -> bool:
        """Answers the action ``seq`` as rejected with ``error`` (``{"code": ..., "message": ..., ...}``)."""
        return await self._send({"op": Op.REJECT, "store": self.store, "seq": seq, "error": dict(error)}, timeout,
                                self._answer_generation(seq) or None)

    async def publish(self, state: Any, timeout: Optional[float] = None) -> None:
        """Publishes a new full state outside an action (``state``, SPEC §8.4); raises
        :class:`~fluxbus.errors.NotSentError` while the store is not registered on the current connection."""
        frame = self.client._change_frame({"op": Op.STATE, "store": self.store}, state if state is not None else b"null")
        if not await _timed(self.client._write(frame, only_gen=self._generation or None),
                            self.client._deadline(timeout), "sending to fluxd (it is not reading)"):
            raise NotSentError(f"state of store {self.store!r} not sent: the store is not registered on the current "
                               f"connection (reconnecting); it adopts the retained snapshot when it registers "
                               f"again", ref=self.store)

    async def publish_patch(self, patch: Any, base: Optional[int] = None, timeout: Optional[float] = None) -> None:
        """Publishes a change outside an action as a ``patch`` (as
        :meth:`fluxbus.client.StoreRegistration.publish_patch`)."""
        frame = self.client._change_frame({"op": Op.PATCH, "store": self.store}, None, patch, base)
        if not await _timed(self.client._write(frame, only_gen=self._generation or None),
                            self.client._deadline(timeout), "sending to fluxd (it is not reading)"):
            raise NotSentError(f"patch of store {self.store!r} not sent: the store is not registered on the current "
                               f"connection (reconnecting); it adopts the retained snapshot when it registers "
                               f"again", ref=self.store)

    async def unregister(self, timeout: Optional[float] = None) -> None:
        """Takes the store down (``unregister``); fluxd sends no reply. Not registered again after a
        reconnection."""
        if self.client._stores.get(self.store) is self:
            del self.client._stores[self.store]
        await self._send({"op": Op.UNREGISTER, "store": self.store}, timeout, self._generation or None)

    async def _send(self, fields: Message, timeout: Optional[float], only_gen: Optional[int]) -> bool:
        return bool(await _timed(self.client._write(self.client._frame(fields), only_gen=only_gen),
                                 self.client._deadline(timeout), "sending to fluxd (it is not reading)"))
