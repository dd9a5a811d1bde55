"""The asyncio FluxBus client."""
from __future__ import annotations

import asyncio
import socket
import time
from typing import Any, AsyncIterator, Dict, Optional

from ._core import ClientCore, Message, QueryReceiptCore, SubscriptionCore
from .wire import (Disconnected, FluxError, FrameDecoder, Settlement, Snapshot, Welcome, check_server_uid,
                   default_socket_path, expected_server_uid, loads)


_expected_server_uid = expected_server_uid


async def _refusal(loop: asyncio.AbstractEventLoop, sock: socket.socket, timeout: Optional[float],
                   error: OSError) -> FluxError:
    """What fluxd said before it closed a connection whose hello could not be sent (its fatal error, if any)."""
    decoder = FrameDecoder()
    deadline = None if timeout is None else loop.time() + timeout
    try:
        while True:
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            data = await asyncio.wait_for(loop.sock_recv(sock, 65536), remaining)
            if not data:
                break
            for kind, body in decoder.feed(data):
                if kind == "frame":
                    msg = loads(body)  # type: ignore[arg-type]
                    if isinstance(msg, dict) and msg.get("op") == "error":
                        return FluxError.from_frame(msg)
    except (OSError, ValueError, asyncio.TimeoutError):
        pass
    return Disconnected(f"fluxd closed the connection before the handshake: {error}")


class AsyncClient(ClientCore):
    """An asyncio connection to fluxd (protocol 1). Create one with ``await AsyncClient.connect(...)``.

    A reader task routes every frame: replies resolve the awaiting call (matched by the id the client generated),
    snapshots go to subscriptions, other errors to :attr:`errors`. When the connection ends, pending calls raise
    :class:`Disconnected` and subscriptions stop. Use ``async with`` or ``await client.close()``.

    The reader task also answers fluxd's heartbeat ``ping`` (``heartbeat=True``, the default) as soon as it reads
    it; that needs the event loop to run, so code on the loop must not block it for longer than
    ``welcome.limits["pingInterval"]`` × ``maxPingsOut`` ms.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str, role: str):
        super().__init__()
        self._reader = reader
        self._writer = writer
        self.name = name
        self.role = role
        self._pending: Dict[str, asyncio.Future] = {}
        self._subscriptions: Dict[str, "AsyncSubscription"] = {}
        self.errors: "asyncio.Queue[FluxError]" = asyncio.Queue()
        self._welcome: "asyncio.Future[Message]" = asyncio.get_running_loop().create_future()
        self._task: Optional[asyncio.Task] = None
        self.welcome: Welcome

    @classmethod
    async def connect(cls, socket_path: Optional[str] = None, name: str = "", role: str = "client",
                      timeout: Optional[float] = 30.0, heartbeat: bool = True,
                      expected_server_uid: Optional[int] = None) -> "AsyncClient":
        """Connects to fluxd and does the handshake; raises :class:`FluxError` if fluxd refuses (e.g.
        ``too-many-connections``). ``heartbeat`` and ``expected_server_uid`` are as in ``Client.connect``: the
        server uid (else ``$FLUXBUS_SERVER_UID``, else 0 when root) is checked with ``SO_PEERCRED`` before
        ``hello``."""
        path = socket_path or default_socket_path()
        expected = _expected_server_uid(expected_server_uid)
        loop = asyncio.get_running_loop()
        # The hello is sent on the bare socket, before the stream exists: fluxd may refuse a connection before it
        # says anything (too-many-connections) and close it, and a stream whose write fails discards what was
        # still to be read, the refusal included.
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, path)
            check_server_uid(sock, path, expected)
            try:
                await loop.sock_sendall(sock, cls._hello_frame(role, name, heartbeat))
            except OSError as error:
                raise await _refusal(loop, sock, timeout, error) from None
            reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 26)
        except BaseException:
            sock.close()
            raise
        client = cls(reader, writer, name, role)
        client._task = asyncio.ensure_future(client._read_loop())
        try:
            msg = await asyncio.wait_for(asyncio.shield(client._welcome), timeout)
        except Disconnected as ended:
            await client.close()
            raise (ended.error or ended) from None
        except BaseException:
            await client.close()
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
                self._send({"op": "bye"})
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            except (asyncio.TimeoutError, FluxError, OSError):
                pass
        self._finish(Disconnected("closed locally"))
        if self._task is not None and not self._task.done():
            self._task.cancel()
        try:
            await self._writer.wait_closed()
        except (OSError, asyncio.CancelledError):
            pass

    # -- operations ---------------------------------------------------------------------------------------------

    def dispatch(self, type: str, payload: Any = None, cause: Optional[int] = None) -> str:
        """Dispatches without waiting; returns the id (refusals arrive on :attr:`errors` with it as ``ref``)."""
        ident = self._check_action(type)
        self._send_raw(self._dispatch_frame(ident, type, payload, cause, False))
        return ident

    async def dispatch_and_settle(self, type: str, payload: Any = None, cause: Optional[int] = None,
                                  timeout: Optional[float] = None) -> Settlement:
        """Dispatches and awaits the settlement (every target store's result); raises :class:`FluxError` if
        fluxd refused the action. Read your writes: this client's subscriptions already hold the new snapshots."""
        ident = self._check_action(type)
        future = self._expect(ident)
        self._send_raw(self._dispatch_frame(ident, type, payload, cause, True))
        return Settlement.from_frame(await self._await(future, timeout))

    async def subscribe(self, store: str, timeout: Optional[float] = None) -> "AsyncSubscription":
        """Subscribes to a store; ``async for snapshot in subscription`` yields the retained snapshot, then every
        newer one. ``await subscription.close()`` (or ``async with``) unsubscribes."""
        self._check_store(store)
        sub = self._subscriptions.get(store)
        if sub is None:
            sub = AsyncSubscription(self, store)
            self._subscriptions[store] = sub
        future = self._expect(f"subscribed:{store}")
        self._send({"op": "subscribe", "store": store})
        sub.status = (await self._await(future, timeout)).get("status")
        return sub

    async def _unsubscribe(self, store: str) -> None:
        self._subscriptions.pop(store, None)
        if self._closed is None:
            future = self._expect(f"unsubscribed:{store}")
            self._send({"op": "unsubscribe", "store": store})
            await self._await(future, None)

    async def query(self, store: str, query: Any, timeout: Optional[float] = None) -> "AsyncQueryReceipt":
        """Declares a query; withdrawn by ``await receipt.close()`` (or ``async with``) or when the connection
        ends."""
        self._check_store(store)
        ident = self._next_id("q")
        future = self._expect(ident)
        self._send_raw(self._query_frame(ident, store, query))
        await self._await(future, timeout)
        return AsyncQueryReceipt(self, ident, store, query)

    async def _unquery(self, ident: str) -> None:
        if self._closed is None:
            future = self._expect(ident)
            self._send({"op": "unquery", "id": ident})
            await self._await(future, None)

    async def info(self, timeout: Optional[float] = None) -> Message:
        """fluxd's introspection data (SPEC §8.7)."""
        return await self._request({"op": "info"}, timeout)

    async def get(self, store: str, timeout: Optional[float] = None) -> Snapshot:
        """Reads a store's retained snapshot once (``unknown-store`` if none)."""
        return self._snapshot_from(await self._request({"op": "get", "store": store}, timeout))

    async def ping(self, timeout: Optional[float] = None) -> float:
        """Round trip in seconds; a barrier for earlier replies."""
        start = time.monotonic()
        await self._request({"op": "ping"}, timeout)
        return time.monotonic() - start

    # -- internals ----------------------------------------------------------------------------------------------

    async def _request(self, fields: Message, timeout: Optional[float]) -> Message:
        ident = self._next_id("r")
        fields["id"] = ident
        future = self._expect(ident)
        self._send(fields)
        return await self._await(future, timeout)

    def _expect(self, key: str) -> asyncio.Future:
        if self._closed is not None:
            raise self._closed
        future = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        return future

    async def _await(self, future: asyncio.Future, timeout: Optional[float]) -> Message:
        msg = await asyncio.wait_for(future, timeout)
        if msg.get("op") == "error":
            raise FluxError.from_frame(msg)
        return msg

    def _send_raw(self, frame: bytes) -> None:
        if self._closed is not None:
            raise self._closed
        self._writer.write(frame)

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

    def _on_error(self, key: Optional[str], msg: Message, error: FluxError) -> None:
        future = None
        if key is not None:
            future = self._pending.pop(key, None) or self._pending.pop(f"subscribed:{key}", None)
        if future is not None and not future.done():
            future.set_result(msg)
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
            sub._queue.put_nowait(None)
        try:
            self._writer.close()
        except (OSError, RuntimeError):
            pass


class AsyncSubscription(SubscriptionCore):
    """An async iterator of a store's :class:`Snapshot` objects (retained first, then every newer version);
    ``status`` follows ``store-down``/``store-up`` (kept in :attr:`events`). Ends when the connection ends."""

    client: AsyncClient

    def __init__(self, client: AsyncClient, store: str):
        super().__init__(client, store)
        self._queue: "asyncio.Queue[Optional[Snapshot]]" = asyncio.Queue()

    def _enqueue(self, snap: Snapshot) -> None:
        self._queue.put_nowait(snap)

    def __aiter__(self) -> AsyncIterator[Snapshot]:
        return self

    async def __anext__(self) -> Snapshot:
        snap = await self._queue.get()
        if snap is None:
            self._queue.put_nowait(None)
            raise StopAsyncIteration
        return snap

    async def next(self, timeout: Optional[float] = None) -> Snapshot:
        """The next snapshot, waiting at most ``timeout`` seconds."""
        return await asyncio.wait_for(self.__anext__(), timeout)

    async def close(self) -> None:
        """Unsubscribes."""
        if self.client._subscriptions.get(self.store) is self:
            await self.client._unsubscribe(self.store)
        self._queue.put_nowait(None)

    async def __aenter__(self) -> "AsyncSubscription":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncQueryReceipt(QueryReceiptCore):
    """An active query; ``await close()`` (or leaving ``async with``) withdraws it."""

    client: AsyncClient

    async def close(self) -> None:
        """Withdraws the query; idempotent."""
        if self.active:
            self.active = False
            await self.client._unquery(self.id)

    async def __aenter__(self) -> "AsyncQueryReceipt":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
