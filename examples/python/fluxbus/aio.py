"""The asyncio FluxBus client: every call that talks to fluxd is a coroutine."""
from __future__ import annotations

import asyncio
import socket
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Iterable, Mapping, Optional, TypeVar, Union

from ._core import NO_LIMIT, ClientCore, Deadline, Message, QueryReceiptCore, SubscriptionCore, resolve_socket_path
from .errors import Disconnected, FluxError, FluxTimeoutError, NameTakenError, connect_error
from .protocol import Op
from .wire import FrameDecoder, Settlement, Snapshot, Welcome, check_server_uid, expected_server_uid, loads

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


class AsyncClient(ClientCore):
    """An asyncio connection to fluxd (protocol 1). Create one with ``await AsyncClient.connect(...)``.

    Every call that talks to fluxd is a coroutine (``await client.dispatch(...)`` too: it waits until the frame
    is handed to the socket, so a writer that fluxd does not keep up with is slowed down instead of buffering
    without bound). A reader task routes every frame: replies resolve the awaiting call (matched by the id the
    client generated), snapshots go to subscriptions, other errors to :attr:`errors`. When the connection ends,
    pending calls raise :class:`~fluxbus.errors.Disconnected` and subscriptions stop. Use ``async with`` or
    ``await client.close()``.

    Errors from fluxd are raised as the :class:`~fluxbus.errors.FluxError` subclass of their code. Every call
    takes an optional ``timeout`` (``None``: the client's :attr:`timeout`, set by :meth:`connect`) covering the
    whole call; running out raises :class:`~fluxbus.errors.FluxTimeoutError` (a builtin ``TimeoutError`` too).

    The reader task also answers fluxd's heartbeat ``ping`` (``heartbeat=True``, the default) as soon as it reads
    it; that needs the event loop to run, so code on the loop must not block it for longer than
    ``welcome.limits["pingInterval"]`` × ``maxPingsOut`` ms.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str, role: str,
                 timeout: Optional[float] = None):
        super().__init__()
        self._reader = reader
        self._writer = writer
        self.name = name
        self.role = role
        self.timeout = timeout
        self._pending: Dict[str, asyncio.Future] = {}
        self._subscriptions: Dict[str, "AsyncSubscription"] = {}
        self._stores: Dict[str, "AsyncStoreRegistration"] = {}
        self.errors: "asyncio.Queue[FluxError]" = asyncio.Queue()
        self._welcome: "asyncio.Future[Message]" = asyncio.get_running_loop().create_future()
        self._drain_lock = asyncio.Lock()
        self._task: Optional[asyncio.Task] = None
        self.welcome: Welcome

    @classmethod
    async def connect(cls, socket_path: Optional[str] = None, name: str = "", role: str = "client",
                      timeout: Optional[float] = 30.0, heartbeat: bool = True,
                      expected_server_uid: Optional[int] = None) -> "AsyncClient":
        """Connects to fluxd and does the handshake. ``timeout`` covers both and is the default timeout of every
        later call (``None``: no limit). Raises what :meth:`fluxbus.Client.connect` raises:
        :class:`~fluxbus.errors.FluxConnectionError` naming the path and what to do when nothing listens there,
        :class:`~fluxbus.errors.TooManyConnectionsError` if fluxd refuses, :class:`FluxTimeoutError`.
        ``heartbeat`` and ``expected_server_uid`` are as in ``Client.connect``: the server uid (else
        ``$FLUXBUS_SERVER_UID``, else 0 when root) is checked with ``SO_PEERCRED`` before ``hello``."""
        path, source = resolve_socket_path(socket_path)
        expected = _expected_server_uid(expected_server_uid)
        return await _timed(cls._open(path, source, name, role, timeout, heartbeat, expected), Deadline(timeout),
                            f"connecting to fluxd at {path}")

    @classmethod
    async def _open(cls, path: str, source: str, name: str, role: str, timeout: Optional[float], heartbeat: bool,
                    expected: Optional[int]) -> "AsyncClient":
        loop = asyncio.get_running_loop()
        # The hello is sent on the bare socket, before the stream exists: fluxd may refuse a connection before it
        # says anything (too-many-connections) and close it, and a stream whose write fails discards what was
        # still to be read, the refusal included.
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            try:
                await loop.sock_connect(sock, path)
            except OSError as error:
                raise connect_error(path, source, error) from None
            check_server_uid(sock, path, expected)
            try:
                await loop.sock_sendall(sock, cls._hello_frame(role, name, heartbeat))
            except OSError as error:
                raise await _refusal(loop, sock, error) from None
            reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 26)
        except BaseException:
            sock.close()
            raise
        client = cls(reader, writer, name, role, timeout)
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
        return client

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self, timeout: float = 2.0) -> None:
        """Says ``bye``, waits (at most ``timeout`` s) for fluxd to close, then closes."""
        if self._closed is None and self._task is not None:
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
        """Ends the connection at once (no ``bye``)."""
        self._finish(reason)
        if self._task is not None and not self._task.done():
            self._task.cancel()

    # -- operations ---------------------------------------------------------------------------------------------

    async def dispatch(self, type: str, payload: Any = None, cause: Optional[int] = None,
                       timeout: Optional[float] = None) -> str:
        """Dispatches without waiting for the action's result; returns the id (refusals arrive on
        :attr:`errors` with it as ``ref``). Returns once the frame is handed to the socket."""
        ident = self._check_action(type)
        frame = self._dispatch_frame(ident, type, payload, cause, False)
        await _timed(self._write(frame), self._deadline(timeout), "sending to fluxd (it is not reading)")
        return ident

    async def dispatch_and_settle(self, type: str, payload: Any = None, cause: Optional[int] = None,
                                  timeout: Optional[float] = None) -> Settlement:
        """Dispatches and awaits the settlement (every target store's result); raises the error fluxd refused
        the action with (e.g. :class:`~fluxbus.errors.NoHandlerError`). A store's rejection is a result
        (``settlement.raise_for_status()`` raises it). Read your writes: this client's subscriptions already
        hold the new snapshots."""
        ident = self._check_action(type)
        frame = self._dispatch_frame(ident, type, payload, cause, True)
        msg = await self._call(ident, frame, self._deadline(timeout),
                               f"waiting for the settlement of {type} ({ident})")
        return Settlement.from_frame(msg)

    async def subscribe(self, store: str, timeout: Optional[float] = None) -> "AsyncSubscription":
        """Subscribes to a store; ``async for snapshot in subscription`` yields the retained snapshot, then every
        newer one. ``await subscription.close()`` (or ``async with``) unsubscribes. The store need not have
        registered yet: ``subscription.status`` is then ``unknown``. ``timeout`` is as in
        :meth:`fluxbus.Client.subscribe`: it covers the request and, when given, the wait for the first snapshot
        (from this call) and each later wait."""
        self._check_store(store)
        deadline = self._deadline(timeout)
        sub = self._subscriptions.get(store)
        created = sub is None
        if sub is None:
            sub = AsyncSubscription(self, store)
            self._subscriptions[store] = sub
        try:
            msg = await self._call(f"subscribed:{store}", self._frame({"op": Op.SUBSCRIBE, "store": store}),
                                   deadline, f"waiting for fluxd to confirm the subscription to {store!r}")
        except BaseException:
            if created and self._subscriptions.get(store) is sub:
                del self._subscriptions[store]
            raise
        sub._subscribed(msg, timeout, deadline)
        return sub

    async def _unsubscribe(self, store: str, timeout: Optional[float]) -> None:
        self._subscriptions.pop(store, None)
        if self._closed is None:
            await self._call(f"unsubscribed:{store}", self._frame({"op": Op.UNSUBSCRIBE, "store": store}),
                             self._deadline(timeout), f"waiting for fluxd to confirm unsubscribing from {store!r}")

    async def query(self, store: str, query: Any, timeout: Optional[float] = None) -> "AsyncQueryReceipt":
        """Declares a query; withdrawn by ``await receipt.close()`` (or ``async with``) or when the connection
        ends."""
        self._check_store(store)
        ident = self._next_id("q")
        await self._call(ident, self._query_frame(ident, store, query), self._deadline(timeout),
                         f"waiting for fluxd to accept the query on {store!r}")
        return AsyncQueryReceipt(self, ident, store, query)

    async def _unquery(self, ident: str, timeout: Optional[float]) -> None:
        if self._closed is None:
            await self._call(ident, self._frame({"op": Op.UNQUERY, "id": ident}), self._deadline(timeout),
                             f"waiting for fluxd to withdraw query {ident}")

    async def register(self, store: str, handles: Iterable[str], wait_for: Iterable[str] = (), state: Any = None,
                       query_deltas: bool = False, timeout: Optional[float] = None) -> "AsyncStoreRegistration":
        """Registers a store on this (``store``-role) connection and waits for ``registered``; returns the
        :class:`AsyncStoreRegistration` the store reads and answers through (:class:`fluxbus.AsyncStore` does
        all of this for you). Raises e.g. :class:`~fluxbus.errors.NameTakenError`."""
        self._check_store(store)
        if store in self._stores:
            raise NameTakenError(f"this connection has already registered {store!r}", ref=store)
        registration = AsyncStoreRegistration(self, store)
        self._stores[store] = registration
        frame = self._frame(self._register_fields(store, list(handles), list(wait_for), state, query_deltas))

        async def exchange() -> Any:
            await self._write(frame)
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
        registration._registered(msg)
        return registration

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

    # -- internals ----------------------------------------------------------------------------------------------

    async def _request(self, fields: Message, timeout: Optional[float], what: str) -> Message:
        ident = self._next_id("r")
        fields["id"] = ident
        return await self._call(ident, self._frame(fields), self._deadline(timeout), what)

    async def _call(self, key: str, frame: bytes, deadline: Deadline, what: str) -> Message:
        """Sends ``frame`` and awaits the reply routed under ``key``, all before ``deadline``."""
        future = self._expect(key)

        async def exchange() -> Message:
            await self._write(frame)
            return await future
        try:
            msg = await _timed(exchange(), deadline, what)
        finally:
            if self._pending.get(key) is future:
                del self._pending[key]  # a timed-out call leaves nothing behind
        if msg.get("op") == Op.ERROR:
            raise FluxError.from_frame(msg)
        return msg

    def _expect(self, key: str) -> asyncio.Future:
        if self._closed is not None:
            raise self._closed
        future = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        return future

    def _send_raw(self, frame: bytes, deadline: Deadline = NO_LIMIT) -> None:
        """Queues ``frame`` on the transport without waiting (pongs, bye); calls use :meth:`_write`."""
        if self._closed is not None:
            raise self._closed
        self._writer.write(frame)

    async def _write(self, frame: bytes) -> None:
        """Writes ``frame`` and waits until the transport's buffer is below its high-water mark again."""
        self._send_raw(frame)
        try:
            async with self._drain_lock:
                await self._writer.drain()
        except (ConnectionError, OSError) as error:
            self._finish(Disconnected(f"send failed: {error}"))
            raise self._closed from None  # type: ignore[misc]

    async def _read_loop(self) -> None:
        decoder = FrameDecoder()
        try:
            while self._closed is None:
                data = await self._reader.read(262144)
                if not data:
                    self._finish(Disconnected("fluxd closed the connection"))
                    return
                for kind, value in decoder.feed(data):
                    if kind == "frame":
                        self._route(value)  # type: ignore[arg-type]
        except (OSError, asyncio.IncompleteReadError) as error:
            self._finish(Disconnected(f"receive failed: {error}"))

    def _keep_error(self, error: FluxError) -> None:
        self.errors.put_nowait(error)

    def _on_welcome(self, msg: Message) -> None:
        if not self._welcome.done():
            self._welcome.set_result(msg)

    def _on_reply(self, key: str, msg: Message) -> None:
        future = self._pending.pop(key, None)
        if future is not None and not future.done():
            future.set_result(msg)

    def _on_subscription(self, key: Optional[str], msg: Message) -> None:
        sub = self._subscriptions.get(key)  # type: ignore[arg-type]
        if sub is not None:
            sub._deliver(msg)
        registration = self._stores.get(key)  # type: ignore[arg-type]
        if registration is not None and msg.get("op") == Op.SNAPSHOT:
            registration._queue.put_nowait(msg)

    def _on_store(self, key: Optional[str], msg: Message) -> None:
        registration = self._stores.get(key)  # type: ignore[arg-type]
        if registration is not None:
            registration._queue.put_nowait(msg)

    def _on_error(self, key: Optional[str], msg: Message, error: FluxError) -> None:
        future = None
        if key is not None:
            future = self._pending.pop(key, None)
            if future is None and key not in self._stores:
                future = self._pending.pop(f"subscribed:{key}", None)
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
        if not self._welcome.done():
            self._welcome.set_exception(reason)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(reason)
        self._pending.clear()
        for sub in list(self._subscriptions.values()):
            sub._end()
        for registration in list(self._stores.values()):
            registration._queue.put_nowait(reason)
        try:
            self._writer.transport.abort()  # what is still unsent is dropped: nobody will wait for it
        except (OSError, RuntimeError):
            pass


class AsyncSubscription(SubscriptionCore):
    """An async iterator of a store's :class:`Snapshot` objects (retained first, then every newer version). Ends
    when the connection ends or the subscription is closed.

    ``status`` is ``up``, ``down`` or ``unknown`` (no store of that name has registered yet) and follows
    ``store-down``/``store-up`` (kept in :attr:`events`); ``latest`` and ``first_snapshot`` as in the sync
    ``Subscription``. How long waits may take: see :meth:`AsyncClient.subscribe`."""

    client: AsyncClient

    def __init__(self, client: AsyncClient, store: str):
        super().__init__(client, store)
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
                if self.client._subscriptions.get(self.store) is self:
                    await self.client._unsubscribe(self.store, timeout)
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


class AsyncStoreRegistration:
    """A store this connection registered (:meth:`AsyncClient.register`); the asyncio twin of
    :class:`fluxbus.client.StoreRegistration`. Use it from the event loop's thread."""

    def __init__(self, client: AsyncClient, store: str):
        self.client = client
        self.store = store
        self.version = 0
        self.seq = 0
        self.resumed = False
        self._queue: "asyncio.Queue[Any]" = asyncio.Queue()
        self._interrupted = False

    def _registered(self, msg: Message) -> None:
        self.version = msg.get("version", 0)
        self.seq = msg.get("seq", 0)
        self.resumed = msg.get("resumed") is True

    async def next(self, timeout: Optional[float] = None) -> Optional[Message]:
        """The next message fluxd sent for this store (as :meth:`fluxbus.client.StoreRegistration.next`): waits
        without limit unless ``timeout``; ``None`` once :meth:`interrupt` was called; raises
        :class:`Disconnected` when the connection ends."""
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
        return item

    def interrupt(self) -> None:
        """Makes :meth:`next` return ``None`` (now, if a task waits in it, and from then on)."""
        self._interrupted = True
        self._queue.put_nowait(_INTERRUPT)

    async def done(self, seq: int, state: Any = None, timeout: Optional[float] = None) -> None:
        """Answers the action ``seq`` as handled, with the store's new full ``state`` (``None``: unchanged)."""
        fields: Message = {"op": Op.DONE, "store": self.store, "seq": seq}
        if state is not None:
            fields["state"] = state
        await self._send(fields, timeout)

    async def reject(self, seq: int, error: Mapping[str, Any], timeout: Optional[float] = None) -> None:
        """Answers the action ``seq`` as rejected with ``error`` (``{"code": ..., "message": ..., ...}``)."""
        await self._send({"op": Op.REJECT, "store": self.store, "seq": seq, "error": dict(error)}, timeout)

    async def publish(self, state: Any, timeout: Optional[float] = None) -> None:
        """Publishes a new full state outside an action (``state``, SPEC §8.4)."""
        await self._send({"op": Op.STATE, "store": self.store, "state": state}, timeout)

    async def unregister(self, timeout: Optional[float] = None) -> None:
        """Takes the store down (``unregister``); fluxd sends no reply."""
        if self.client._stores.get(self.store) is self:
            del self.client._stores[self.store]
        await self._send({"op": Op.UNREGISTER, "store": self.store}, timeout)

    async def _send(self, fields: Message, timeout: Optional[float]) -> None:
        await _timed(self.client._write(self.client._frame(fields)), self.client._deadline(timeout),
                     "sending to fluxd (it is not reading)")
