"""The asyncio FluxBus client."""
from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any, AsyncIterator, Dict, List, Optional

from .wire import (PROTOCOL_VERSION, Disconnected, FluxError, FrameDecoder, Settlement, Snapshot,
                   SubscriptionEvent, Welcome, default_socket_path, dumps, encode_frame, is_valid_action_type,
                   is_valid_store_name, loads, route_key)

Message = Dict[str, Any]


class AsyncClient:
    """An asyncio connection to fluxd (protocol 1). Create one with ``await AsyncClient.connect(...)``.

    A reader task routes every frame: replies resolve the awaiting call (matched by the id the client generated),
    snapshots go to subscriptions, other errors to :attr:`errors`. When the connection ends, pending calls raise
    :class:`Disconnected` and subscriptions stop. Use ``async with`` or ``await client.close()``.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str, role: str):
        self._reader = reader
        self._writer = writer
        self.name = name
        self.role = role
        self._ids = itertools.count(1)
        self._pending: Dict[str, asyncio.Future] = {}
        self._subscriptions: Dict[str, "AsyncSubscription"] = {}
        self.errors: "asyncio.Queue[FluxError]" = asyncio.Queue()
        self._closed: Optional[Disconnected] = None
        self._welcome: "asyncio.Future[Message]" = asyncio.get_running_loop().create_future()
        self._task: Optional[asyncio.Task] = None
        self.welcome: Welcome

    @classmethod
    async def connect(cls, socket_path: Optional[str] = None, name: str = "", role: str = "client",
                      timeout: Optional[float] = 30.0) -> "AsyncClient":
        """Connects to fluxd and does the handshake; raises :class:`FluxError` if fluxd refuses."""
        reader, writer = await asyncio.open_unix_connection(socket_path or default_socket_path(), limit=1 << 26)
        client = cls(reader, writer, name, role)
        client._task = asyncio.ensure_future(client._read_loop())
        client._send({"op": "hello", "protocol": PROTOCOL_VERSION, "role": role, "name": name})
        msg = await asyncio.wait_for(asyncio.shield(client._welcome), timeout)
        client.welcome = Welcome(msg["peer"], msg.get("server", ""), dict(msg.get("limits", {})), msg["protocol"])
        return client

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """Whether the connection has ended."""
        return self._closed is not None

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
        if not is_valid_store_name(store):
            raise ValueError(f"invalid store name {store!r}")
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
        if not is_valid_store_name(store):
            raise ValueError(f"invalid store name {store!r}")
        ident = f"q-{next(self._ids)}"
        future = self._expect(ident)
        head = dumps({"op": "query", "id": ident, "store": store})[:-1]
        self._send_raw(encode_frame(head + b',"query":' + dumps(query) + b"}"))
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
        msg = await self._request({"op": "get", "store": store}, timeout)
        return Snapshot(msg["store"], msg["version"], msg["seq"], msg["state"])

    async def ping(self, timeout: Optional[float] = None) -> float:
        """Round trip in seconds; a barrier for earlier replies."""
        start = time.monotonic()
        await self._request({"op": "ping"}, timeout)
        return time.monotonic() - start

    # -- internals ----------------------------------------------------------------------------------------------

    def _check_action(self, type: str) -> str:
        if not is_valid_action_type(type):
            raise ValueError(f"invalid action type {type!r}")
        return f"d-{next(self._ids)}"

    @staticmethod
    def _dispatch_frame(ident: str, type: str, payload: Any, cause: Optional[int], settle: bool) -> bytes:
        fields: Message = {"op": "dispatch", "id": ident, "type": type}
        if settle:
            fields["settle"] = True
        if cause is not None:
            fields["cause"] = cause
        return encode_frame(dumps(fields)[:-1] + b',"payload":' + dumps(payload) + b"}")

    async def _request(self, fields: Message, timeout: Optional[float]) -> Message:
        ident = f"r-{next(self._ids)}"
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

    def _send(self, fields: Message) -> None:
        self._send_raw(encode_frame(dumps(fields)))

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

    def _route(self, body: bytes) -> None:
        try:
            msg = loads(body)
        except ValueError:
            self.errors.put_nowait(FluxError("bad-json", f"unreadable frame from fluxd: {body[:80]!r}"))
            return
        if not isinstance(msg, dict):
            return
        if msg.get("op") == "welcome":
            if not self._welcome.done():
                self._welcome.set_result(msg)
            return
        kind, key = route_key(msg)
        if kind == "reply" and key is not None:
            future = self._pending.pop(key, None)
            if future is not None and not future.done():
                future.set_result(msg)
        elif kind == "subscription":
            sub = self._subscriptions.get(key)  # type: ignore[arg-type]
            if sub is not None:
                sub._deliver(msg)
        elif kind == "error":
            error = FluxError.from_frame(msg)
            future = None
            if key is not None:
                future = self._pending.pop(key, None) or self._pending.pop(f"subscribed:{key}", None)
            if future is not None and not future.done():
                future.set_result(msg)
            else:
                self.errors.put_nowait(error)
            if not self._welcome.done():
                self._welcome.set_exception(error)
            if error.fatal:
                self._finish(Disconnected(f"fluxd closed the connection: {error}"))
        elif kind == "bye":
            self._finish(Disconnected(f"fluxd said bye ({msg.get('reason')})"))

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


class AsyncSubscription:
    """An async iterator of a store's :class:`Snapshot` objects (retained first, then every newer version);
    ``status`` follows ``store-down``/``store-up`` (kept in :attr:`events`). Ends when the connection ends."""

    def __init__(self, client: AsyncClient, store: str):
        self.client = client
        self.store = store
        self.status: Optional[str] = None
        self.latest: Optional[Snapshot] = None
        self.events: List[SubscriptionEvent] = []
        self._queue: "asyncio.Queue[Optional[Snapshot]]" = asyncio.Queue()

    def _deliver(self, msg: Message) -> None:
        op = msg["op"]
        if op == "snapshot":
            snap = Snapshot(msg["store"], msg["version"], msg["seq"], msg.get("state"))
            if self.latest is None or snap.version > self.latest.version:
                self.latest = snap
                self._queue.put_nowait(snap)
        elif op == "store-down":
            self.status = "down"
            self.events.append(SubscriptionEvent("store-down", self.store, reason=msg.get("reason")))
        elif op == "store-up":
            self.status = "up"
            self.events.append(SubscriptionEvent("store-up", self.store, version=msg.get("version")))

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


class AsyncQueryReceipt:
    """An active query; ``await close()`` (or leaving ``async with``) withdraws it."""

    def __init__(self, client: AsyncClient, ident: str, store: str, query: Any):
        self.client = client
        self.id = ident
        self.store = store
        self.query = query
        self.active = True

    async def close(self) -> None:
        """Withdraws the query; idempotent."""
        if self.active:
            self.active = False
            await self.client._unquery(self.id)

    async def __aenter__(self) -> "AsyncQueryReceipt":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
