"""The synchronous FluxBus client: one Unix-socket connection to fluxd, driven by the calling thread."""
from __future__ import annotations

import collections
import socket
import threading
import time
from typing import Any, Deque, Dict, Iterator, List, Optional, Union

from ._core import ClientCore, Message, QueryReceiptCore, SubscriptionCore
from .wire import (Disconnected, FluxError, FrameDecoder, Settlement, Snapshot, Welcome, check_server_uid,
                   default_socket_path, encode_frame, loads)
from .wire import expected_server_uid as _expected_server_uid

#: What the reader thread hands to the calling thread: a decoded message, an unreadable body, or the end.
_Incoming = Union[Message, bytes, Disconnected]


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

    Errors from fluxd become :class:`FluxError` raised by the call they answer. Errors that answer no call
    (e.g. ``no-handler`` for a fire-and-forget :meth:`dispatch`) are kept in :attr:`errors` (``ref`` = the id
    ``dispatch`` returned). Calls take an optional ``timeout`` in seconds (``None`` = the client's default).
    """

    #: Bytes of messages the reader thread holds for the caller before it stops reading (see the class doc).
    DEFAULT_MAX_BUFFERED = 64 << 20

    def __init__(self, sock: socket.socket, name: str, role: str, timeout: Optional[float],
                 max_buffered: int = DEFAULT_MAX_BUFFERED):
        super().__init__()
        self._sock = sock
        self.name = name
        self.role = role
        self.timeout = timeout
        self.max_buffered = max_buffered
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._incoming: Deque[_Incoming] = collections.deque()
        self._incoming_bytes = 0
        #: Heartbeat pings answered by the reader thread.
        self.pings_answered = 0
        self._handshaking = False
        self._reader = threading.Thread(target=self._read_loop, name="fluxbus-reader", daemon=True)
        self._replies: Dict[str, Message] = {}
        self._awaited: set = set()
        self._subscriptions: Dict[str, "Subscription"] = {}
        self._store_inbox: Dict[str, Deque[Message]] = {}
        self.errors: Deque[FluxError] = collections.deque(maxlen=256)
        self.welcome: Welcome

    # -- connection ---------------------------------------------------------------------------------------------

    @classmethod
    def connect(cls, socket_path: Optional[str] = None, name: str = "", role: str = "client",
                timeout: Optional[float] = 30.0, heartbeat: bool = True,
                expected_server_uid: Optional[int] = None) -> "Client":
        """Connects to fluxd (``socket_path`` or :func:`default_socket_path`) and does the handshake.
        ``role`` is ``client``, ``store`` or ``monitor``. Raises :class:`FluxError` if fluxd refuses (e.g.
        ``too-many-connections``).

        ``heartbeat`` (default on) asks fluxd to ping this connection when it is silent; the reader thread
        answers. ``expected_server_uid`` (else ``$FLUXBUS_SERVER_UID``, else 0 when running as root; else no
        check) is the uid fluxd must run as: it is checked with ``SO_PEERCRED`` before ``hello`` is sent, and a
        mismatch raises :class:`FluxError` ``wrong-server-uid``."""
        path = socket_path or default_socket_path()
        expected = _expected_server_uid(expected_server_uid)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            check_server_uid(sock, path, expected)
        except BaseException:
            sock.close()
            raise
        client = cls(sock, name, role, timeout)
        client._reader.start()
        try:
            # fluxd may refuse a connection before it says anything (too-many-connections) and close it, so the
            # hello can fail to send: the reader thread still delivers the refusal, which _wait then raises.
            client._handshaking = True
            client._send_hello(role, name, heartbeat)
            client._handshaking = False
            msg = client._wait(lambda: client._welcome_msg, timeout, "welcome")
        except Disconnected as ended:
            client._finish(ended)
            raise (ended.error or ended) from None  # a refusal (fatal error) is raised as itself
        except BaseException:
            client._finish(Disconnected("handshake failed"))
            raise
        client.welcome = client._welcome_from(msg)
        return client

    _welcome_msg: Optional[Message] = None

    def close(self, timeout: float = 2.0) -> None:
        """Says ``bye``, waits (at most ``timeout`` s) for fluxd to close the connection, then closes it."""
        if self._closed is None:
            try:
                self._send({"op": "bye"})
                deadline = time.monotonic() + timeout
                while self._closed is None and time.monotonic() < deadline:
                    self._pump(deadline - time.monotonic())
            except (OSError, FluxError):
                pass
        self._finish(Disconnected("closed locally"))

    def abort(self) -> None:
        """Closes the socket at once, without ``bye`` (to fluxd this looks like a crash)."""
        self._finish(Disconnected("aborted"))

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- actions ------------------------------------------------------------------------------------------------

    def dispatch(self, type: str, payload: Any = None, cause: Optional[int] = None) -> str:
        """Dispatches an action without waiting for it; returns the id it was sent with. A refusal (e.g.
        ``no-handler``) arrives later in :attr:`errors` with that id as ``ref``."""
        ident = self._check_action(type)
        self._send_raw(self._dispatch_frame(ident, type, payload, cause, False))
        return ident

    def dispatch_and_settle(self, type: str, payload: Any = None, cause: Optional[int] = None,
                            timeout: Optional[float] = None) -> Settlement:
        """Dispatches an action and waits for its settlement: every target store's result (SPEC §8.3). When it
        returns, every subscription of this client on a store that answered ``done`` already holds the snapshot
        it produced (read your writes). Raises :class:`FluxError` if fluxd refused the action."""
        ident = self._check_action(type)
        self._awaited.add(ident)
        self._send_raw(self._dispatch_frame(ident, type, payload, cause, True))
        return Settlement.from_frame(self._reply(ident, timeout))

    # -- subscriptions ------------------------------------------------------------------------------------------

    def subscribe(self, store: str, timeout: Optional[float] = None) -> "Subscription":
        """Subscribes to a store's snapshots. The returned :class:`Subscription` iterates the retained snapshot
        (if any) and then every newer one; it is also a context manager (``close()`` unsubscribes)."""
        self._check_store(store)
        sub = self._subscriptions.get(store)
        if sub is None:
            sub = Subscription(self, store)
            self._subscriptions[store] = sub
        self._send({"op": "subscribe", "store": store})
        msg = self._reply(f"subscribed:{store}", timeout)
        sub.status = msg.get("status")
        return sub

    def _unsubscribe(self, store: str, timeout: Optional[float]) -> None:
        self._subscriptions.pop(store, None)
        if self._closed is None:
            self._send({"op": "unsubscribe", "store": store})
            self._reply(f"unsubscribed:{store}", timeout)

    # -- queries ------------------------------------------------------------------------------------------------

    def query(self, store: str, query: Any, timeout: Optional[float] = None) -> "QueryReceipt":
        """Declares a query on a store (encoded canonically, so equal queries are deduplicated by fluxd). It
        stays active until the returned :class:`QueryReceipt` is closed (or used as a context manager) or the
        connection ends. Subscribe separately to see the data the store fetches."""
        self._check_store(store)
        ident = self._next_id("q")
        self._awaited.add(ident)
        self._send_raw(self._query_frame(ident, store, query))
        self._reply(ident, timeout)
        return QueryReceipt(self, ident, store, query)

    def _unquery(self, ident: str, timeout: Optional[float]) -> None:
        if self._closed is None:
            self._awaited.add(ident)
            self._send({"op": "unquery", "id": ident})
            self._reply(ident, timeout)

    # -- introspection ------------------------------------------------------------------------------------------

    def info(self, timeout: Optional[float] = None) -> Message:
        """fluxd's introspection data (SPEC §8.7 ``info``): stores, peers, counters."""
        ident = self._request({"op": "info"})
        return self._reply(ident, timeout)

    def get(self, store: str, timeout: Optional[float] = None) -> Snapshot:
        """Reads a store's retained snapshot once. Raises ``FluxError`` ``unknown-store`` if there is none."""
        ident = self._request({"op": "get", "store": store})
        return self._snapshot_from(self._reply(ident, timeout))

    def ping(self, timeout: Optional[float] = None) -> float:
        """Round trip to fluxd; returns the seconds it took. Also a barrier: every reply to an earlier request
        has arrived when it returns (SPEC §8.7)."""
        start = time.monotonic()
        self._reply(self._request({"op": "ping"}), timeout)
        return time.monotonic() - start

    def poll(self, timeout: float = 0.0) -> None:
        """Reads and routes whatever arrives within ``timeout`` seconds (subscriptions' ``status`` and
        ``events``, :attr:`errors`), without waiting for anything in particular."""
        self._pump(timeout)

    def send_raw(self, body: bytes) -> None:
        """Sends ``body`` as one frame, as it is (for tests and tools)."""
        self._send_raw(encode_frame(body))

    # -- internals ----------------------------------------------------------------------------------------------

    def _request(self, fields: Message) -> str:
        ident = self._next_id("r")
        fields["id"] = ident
        self._awaited.add(ident)
        self._send(fields)
        return ident

    def _send_raw(self, frame: bytes) -> None:
        if self._closed is not None:
            raise self._closed
        failure: Optional[OSError] = None
        with self._send_lock:
            try:
                self._sock.sendall(frame)
            except OSError as error:
                failure = error
        if failure is not None and self._handshaking:
            return  # the reader reports why fluxd closed the connection (see connect)
        if failure is not None:  # finished outside the lock: _finish joins the reader, which may want it
            self._finish(Disconnected(f"send failed: {failure}"))
            raise self._closed  # type: ignore[misc]

    def _reply(self, key: str, timeout: Optional[float]) -> Message:
        self._awaited.add(key)
        try:
            msg = self._wait(lambda: self._replies.pop(key, None), timeout, key)
        finally:
            self._awaited.discard(key)
        if msg.get("op") == "error":
            raise FluxError.from_frame(msg)
        return msg

    def _wait(self, ready: Any, timeout: Optional[float], what: str) -> Any:
        """Pumps frames until ``ready()`` returns something, the deadline passes or the connection ends."""
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            value = ready()
            if value is not None:
                return value
            if self._closed is not None:
                raise self._closed
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"timed out waiting for {what}")
            self._pump(remaining)

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
            if isinstance(item, Disconnected):
                self._finish(item)
            elif isinstance(item, bytes):
                self._keep_error(FluxError("bad-json", f"unreadable frame from fluxd: {item[:80]!r}"))
            else:
                self._route_message(item)

    def _read_loop(self) -> None:
        """The reader thread: reads frames, answers heartbeat pings at once, queues the rest for the caller."""
        decoder = FrameDecoder()
        end = Disconnected("fluxd closed the connection")
        try:
            while self._closed is None:
                data = self._sock.recv(262144)
                if not data:
                    break
                for kind, body in decoder.feed(data):
                    if kind != "frame":
                        continue
                    assert isinstance(body, bytes)
                    try:
                        item: _Incoming = loads(body)
                    except ValueError:
                        item = body
                    if isinstance(item, dict) and item.get("op") == "ping":
                        self._answer_ping(item)
                        continue
                    with self._cond:
                        self._incoming.append(item)
                        self._incoming_bytes += len(body)
                        self._cond.notify_all()
                        while self._incoming_bytes > self.max_buffered and self._closed is None:
                            self._cond.wait()
        except (OSError, ValueError) as error:
            end = Disconnected(f"receive failed: {error}")
        except Exception as error:  # never leave the caller waiting for a reader that died
            end = Disconnected(f"reader thread failed: {type(error).__name__}: {error}")
        with self._cond:
            self._incoming.append(end)
            self._cond.notify_all()

    def _answer_ping(self, msg: Message) -> None:
        if self._closed is not None:
            return
        with self._send_lock:
            try:
                self._sock.sendall(self._pong_frame(msg))
                self.pings_answered += 1
            except OSError:
                pass  # the connection is going; recv will say so

    def _keep_error(self, error: FluxError) -> None:
        self.errors.append(error)

    def _on_welcome(self, msg: Message) -> None:
        self._welcome_msg = msg

    def _on_reply(self, key: str, msg: Message) -> None:
        self._replies[key] = msg

    def _on_subscription(self, key: Optional[str], msg: Message) -> None:
        sub = self._subscriptions.get(key)  # type: ignore[arg-type]
        if sub is not None:
            sub._deliver(msg)
        if msg.get("op") == "snapshot" and key in self._store_inbox:
            self._store_inbox[key].append(msg)  # type: ignore[index]

    def _on_store(self, key: Optional[str], msg: Message) -> None:
        self._store_inbox.setdefault(key, collections.deque()).append(msg)  # type: ignore[arg-type]

    def _on_error(self, key: Optional[str], msg: Message, error: FluxError) -> None:
        if key is not None and key in self._awaited:
            self._replies[key] = msg
        elif key is not None and key in self._store_inbox:
            self._store_inbox[key].append(msg)
        elif key is not None and f"subscribed:{key}" in self._awaited:
            self._replies[f"subscribed:{key}"] = msg
        else:
            self.errors.append(error)

    def _finish(self, reason: Disconnected) -> None:
        if self._closed is None:
            self._closed = reason
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes the reader thread's recv
            except OSError:
                pass
            with self._cond:
                self._cond.notify_all()  # and a reader waiting for room
            if self._reader.is_alive() and threading.current_thread() is not self._reader:
                self._reader.join(5)
            try:
                self._sock.close()
            except OSError:
                pass


class Subscription(SubscriptionCore):
    """A subscription to one store: iterate it for :class:`Snapshot` objects (the retained one first, then each
    newer version; never an older one). ``status`` is ``up``/``down``/``unknown`` and follows
    ``store-down``/``store-up``; :attr:`events` keeps those events. Iteration ends when the connection ends."""

    client: Client

    def __init__(self, client: Client, store: str):
        super().__init__(client, store)
        self._queue: Deque[Snapshot] = collections.deque()
        self._open = True

    def _enqueue(self, snap: Snapshot) -> None:
        self._queue.append(snap)

    def next(self, timeout: Optional[float] = None) -> Snapshot:
        """The next snapshot (waits up to ``timeout`` s; raises ``TimeoutError``, or ``Disconnected`` when the
        connection ended and nothing is left)."""
        return self.client._wait(lambda: self._queue.popleft() if self._queue else None, timeout,
                                 f"a snapshot of {self.store}")

    def until(self, predicate: Any, timeout: Optional[float] = None) -> Snapshot:
        """Reads snapshots until one satisfies ``predicate(snapshot)`` and returns it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            snap = self.next(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if predicate(snap):
                return snap

    def __iter__(self) -> Iterator[Snapshot]:
        while self._open:
            try:
                yield self.next(timeout=None if self.client.timeout is None else 1e9)
            except Disconnected:
                return

    def close(self, timeout: Optional[float] = None) -> None:
        """Unsubscribes (idempotent)."""
        if self._open:
            self._open = False
            self.client._unsubscribe(self.store, timeout)

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


def connect(socket_path: Optional[str] = None, name: str = "", role: str = "client",
            timeout: Optional[float] = 30.0, heartbeat: bool = True,
            expected_server_uid: Optional[int] = None) -> Client:
    """Shorthand for :meth:`Client.connect`."""
    return Client.connect(socket_path, name, role, timeout, heartbeat, expected_server_uid)
