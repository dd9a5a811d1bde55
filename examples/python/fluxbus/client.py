"""The synchronous FluxBus client: one Unix-socket connection to fluxd, driven by the calling thread."""
from __future__ import annotations

import collections
import select
import socket
import threading
import time
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Mapping, Optional, Union

from ._core import NO_LIMIT, ClientCore, Deadline, Message, QueryReceiptCore, SubscriptionCore, resolve_socket_path
from .errors import BadJSONError, Disconnected, FluxError, NameTakenError, connect_error
from .protocol import Op
from .wire import (FrameDecoder, Settlement, Snapshot, Welcome, check_server_uid, encode_frame, loads)
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
        self._stores: Dict[str, "StoreRegistration"] = {}
        self.errors: Deque[FluxError] = collections.deque(maxlen=256)
        self.welcome: Welcome

    # -- connection ---------------------------------------------------------------------------------------------

    @classmethod
    def connect(cls, socket_path: Optional[str] = None, name: str = "", role: str = "client",
                timeout: Optional[float] = 30.0, heartbeat: bool = True,
                expected_server_uid: Optional[int] = None) -> "Client":
        """Connects to fluxd (``socket_path`` or :func:`~fluxbus.default_socket_path`) and does the handshake.
        ``role`` is ``client``, ``store`` or ``monitor``. ``timeout`` covers connecting and the handshake, and is
        the default timeout of every later call (``None``: no limit).

        Raises :class:`~fluxbus.errors.FluxConnectionError` when nothing listens at the path (its message names
        the path, where it came from and how to start fluxd),
        :class:`~fluxbus.errors.TooManyConnectionsError` if fluxd refuses the connection, and
        :class:`~fluxbus.errors.FluxTimeoutError` when ``timeout`` passes.

        ``heartbeat`` (default on) asks fluxd to ping this connection when it is silent; the reader thread
        answers. ``expected_server_uid`` (else ``$FLUXBUS_SERVER_UID``, else 0 when running as root; else no
        check) is the uid fluxd must run as: it is checked with ``SO_PEERCRED`` before ``hello`` is sent, and a
        mismatch raises :class:`~fluxbus.errors.WrongServerUIDError` (code ``wrong-server-uid``)."""
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
        client = cls(sock, name, role, timeout)
        client._reader.start()
        try:
            # fluxd may refuse a connection before it says anything (too-many-connections) and close it, so the
            # hello can fail to send: the reader thread still delivers the refusal, which _wait then raises.
            client._handshaking = True
            client._send_raw(client._hello_frame(role, name, heartbeat), deadline)
            client._handshaking = False
            msg = client._wait(lambda: client._welcome_msg, deadline, f"waiting for fluxd's welcome at {path}")
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
            deadline = Deadline(timeout)
            try:
                self._send_raw(self._frame({"op": Op.BYE}), deadline)
                while self._closed is None and not deadline.expired():
                    self._pump(deadline.remaining())
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

    def dispatch(self, type: str, payload: Any = None, cause: Optional[int] = None,
                 timeout: Optional[float] = None) -> str:
        """Dispatches an action without waiting for it; returns the id it was sent with. A refusal (e.g.
        ``no-handler``) arrives later in :attr:`errors` with that id as ``ref``. ``timeout`` covers sending."""
        ident = self._check_action(type)
        self._send_raw(self._dispatch_frame(ident, type, payload, cause, False), self._deadline(timeout))
        return ident

    def dispatch_and_settle(self, type: str, payload: Any = None, cause: Optional[int] = None,
                            timeout: Optional[float] = None) -> Settlement:
        """Dispatches an action and waits for its settlement: every target store's result (SPEC §8.3). When it
        returns, every subscription of this client on a store that answered ``done`` already holds the snapshot
        it produced (read your writes). Raises the error fluxd refused the action with (e.g.
        :class:`~fluxbus.errors.NoHandlerError`); a store's rejection is a result, not an exception
        (``settlement.raise_for_status()`` raises it)."""
        ident = self._check_action(type)
        frame = self._dispatch_frame(ident, type, payload, cause, True)
        msg = self._call(ident, frame, self._deadline(timeout), f"waiting for the settlement of {type} ({ident})")
        return Settlement.from_frame(msg)

    # -- subscriptions ------------------------------------------------------------------------------------------

    def subscribe(self, store: str, timeout: Optional[float] = None) -> "Subscription":
        """Subscribes to a store's snapshots. The returned :class:`Subscription` iterates the retained snapshot
        (if any) and then every newer one; it is also a context manager (``close()`` unsubscribes).

        A store need not have registered yet (clients may start before stores): ``subscription.status`` is then
        ``unknown`` and turns ``up`` when it registers. ``timeout`` covers the request and, when given, the wait
        for the first snapshot too (counted from this call) and each later wait of iteration or ``next()``; a
        wait that runs out raises :class:`~fluxbus.errors.FluxTimeoutError` saying why (e.g. ``no store named
        'x' has registered yet``). Without ``timeout``, the request takes the client's default and iteration
        waits without limit."""
        self._check_store(store)
        deadline = self._deadline(timeout)
        sub = self._subscriptions.get(store)
        created = sub is None
        if sub is None:
            sub = Subscription(self, store)
            self._subscriptions[store] = sub
        try:
            msg = self._call(f"subscribed:{store}", self._frame({"op": Op.SUBSCRIBE, "store": store}), deadline,
                             f"waiting for fluxd to confirm the subscription to {store!r}")
        except BaseException:
            if created and self._subscriptions.get(store) is sub:
                del self._subscriptions[store]
            raise
        sub._subscribed(msg, timeout, deadline)
        return sub

    def _unsubscribe(self, store: str, timeout: Optional[float]) -> None:
        self._subscriptions.pop(store, None)
        if self._closed is None:
            self._call(f"unsubscribed:{store}", self._frame({"op": Op.UNSUBSCRIBE, "store": store}),
                       self._deadline(timeout), f"waiting for fluxd to confirm unsubscribing from {store!r}")

    # -- queries ------------------------------------------------------------------------------------------------

    def query(self, store: str, query: Any, timeout: Optional[float] = None) -> "QueryReceipt":
        """Declares a query on a store (encoded canonically, so equal queries are deduplicated by fluxd). It
        stays active until the returned :class:`QueryReceipt` is closed (or used as a context manager) or the
        connection ends. Subscribe separately to see the data the store fetches."""
        self._check_store(store)
        ident = self._next_id("q")
        self._call(ident, self._query_frame(ident, store, query), self._deadline(timeout),
                   f"waiting for fluxd to accept the query on {store!r}")
        return QueryReceipt(self, ident, store, query)

    def _unquery(self, ident: str, timeout: Optional[float]) -> None:
        if self._closed is None:
            self._call(ident, self._frame({"op": Op.UNQUERY, "id": ident}), self._deadline(timeout),
                       f"waiting for fluxd to withdraw query {ident}")

    # -- stores -------------------------------------------------------------------------------------------------

    def register(self, store: str, handles: Iterable[str], wait_for: Iterable[str] = (), state: Any = None,
                 query_deltas: bool = False, timeout: Optional[float] = None) -> "StoreRegistration":
        """Registers a store on this (``store``-role) connection (SPEC §8.2) and waits for ``registered``.
        Returns the :class:`StoreRegistration` through which the store takes what fluxd sends it and answers.
        Raises e.g. :class:`~fluxbus.errors.NameTakenError` or :class:`~fluxbus.errors.CycleError`.
        :class:`fluxbus.Store` does all of this for you."""
        self._check_store(store)
        if store in self._stores:
            raise NameTakenError(f"this connection has already registered {store!r}", ref=store)
        deadline = self._deadline(timeout)
        registration = StoreRegistration(self, store)
        self._stores[store] = registration
        try:
            self._send_raw(self._frame(self._register_fields(store, list(handles), list(wait_for), state,
                                                             query_deltas)), deadline)
            inbox = registration._inbox
            msg = self._wait(lambda: inbox.popleft() if inbox else None, deadline,
                             f"waiting for fluxd to register {store!r}")
            if msg.get("op") == Op.ERROR:
                raise FluxError.from_frame(msg)
        except BaseException:
            if self._stores.get(store) is registration:
                del self._stores[store]
            raise
        registration._registered(msg)
        return registration

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

    # -- internals ----------------------------------------------------------------------------------------------

    def _request(self, fields: Message, timeout: Optional[float], what: str) -> Message:
        ident = self._next_id("r")
        fields["id"] = ident
        return self._call(ident, self._frame(fields), self._deadline(timeout), what)

    def _call(self, key: str, frame: bytes, deadline: Deadline, what: str) -> Message:
        """Sends ``frame`` and waits for the reply routed under ``key``, all before ``deadline``; raises the
        error that answers it."""
        self._awaited.add(key)
        try:
            self._send_raw(frame, deadline)
            msg = self._wait(lambda: self._replies.pop(key, None), deadline, what)
        finally:
            self._awaited.discard(key)
            self._replies.pop(key, None)
        if msg.get("op") == Op.ERROR:
            raise FluxError.from_frame(msg)
        return msg

    def _send_raw(self, frame: bytes, deadline: Deadline = NO_LIMIT) -> None:
        if self._closed is not None:
            raise self._closed
        failure: Optional[OSError] = None
        sent = len(frame)
        with self._send_lock:
            try:
                if deadline.at is None:
                    self._sock.sendall(frame)
                else:
                    sent = self._send_before(frame, deadline)
            except OSError as error:
                failure = error
        if failure is not None and self._handshaking:
            return  # the reader reports why fluxd closed the connection (see connect)
        if failure is not None:  # finished outside the lock: _finish joins the reader, which may want it
            self._finish(Disconnected(f"send failed: {failure}"))
            raise self._closed  # type: ignore[misc]
        if sent < len(frame):
            what = "sending to fluxd (it is not reading this connection)"
            if sent > 0:  # the stream now ends inside a frame: it cannot be used any more
                self._finish(Disconnected(f"a frame was cut short: {what} timed out"))
                what += "; the frame was sent in part, so the connection was closed"
            raise deadline.error(what)

    def _send_before(self, frame: bytes, deadline: Deadline) -> int:
        """Sends as much of ``frame`` as the socket takes before ``deadline``; returns the bytes sent."""
        view = memoryview(frame)
        sent = 0
        poller = None
        while sent < len(frame):
            try:
                sent += self._sock.send(view[sent:], socket.MSG_DONTWAIT)
                continue
            except BlockingIOError:
                pass
            remaining = deadline.remaining()
            if not remaining:
                break
            if poller is None:
                poller = select.poll()
                poller.register(self._sock.fileno(), select.POLLOUT)
            poller.poll(remaining * 1000)
        return sent

    def _wait(self, ready: Callable[[], Any], deadline: Deadline, what: _What) -> Any:
        """Pumps frames until ``ready()`` returns something, ``deadline`` passes (raises
        :class:`FluxTimeoutError`) or the connection ends (raises :class:`Disconnected`)."""
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
            elif isinstance(item, bytes):
                self._keep_error(BadJSONError(f"unreadable frame from fluxd: {item[:80]!r}"))
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
                    if isinstance(item, dict) and item.get("op") == Op.PING:
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
        if key in self._awaited:  # a reply nobody waits for any more (its call timed out) is dropped
            self._replies[key] = msg

    def _on_subscription(self, key: Optional[str], msg: Message) -> None:
        sub = self._subscriptions.get(key)  # type: ignore[arg-type]
        if sub is not None:
            sub._deliver(msg)
        registration = self._stores.get(key)  # type: ignore[arg-type]
        if msg.get("op") == Op.SNAPSHOT and registration is not None:
            registration._inbox.append(msg)

    def _on_store(self, key: Optional[str], msg: Message) -> None:
        registration = self._stores.get(key)  # type: ignore[arg-type]
        if registration is not None:
            registration._inbox.append(msg)

    def _on_error(self, key: Optional[str], msg: Message, error: FluxError) -> None:
        if key is not None and key in self._awaited:
            self._replies[key] = msg
        elif key is not None and key in self._stores:
            self._stores[key]._inbox.append(msg)
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
    newer version; never an older one). Iteration ends when the connection ends or the subscription is closed.

    ``status`` is ``up``, ``down`` or ``unknown`` (no store of that name has registered yet) and follows
    ``store-down``/``store-up`` as this client reads (during any call, or :meth:`Client.poll`); :attr:`events`
    keeps those events. ``latest`` is the newest snapshot received, ``first_snapshot`` the first one. How long
    waits may take: see :meth:`Client.subscribe`."""

    client: Client

    def __init__(self, client: Client, store: str):
        super().__init__(client, store)
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


class StoreRegistration:
    """A store this connection registered (:meth:`Client.register`): what fluxd sends the store, and how the
    store answers. ``version``, ``seq`` and ``resumed`` are those of fluxd's ``registered`` (SPEC §8.2).

    :class:`fluxbus.Store` is built on it; use it directly for a store loop of your own. :meth:`next` may be
    called from one thread (the store's); :meth:`interrupt` and the sending methods from any."""

    def __init__(self, client: Client, store: str):
        self.client = client
        self.store = store
        self.version = 0
        self.seq = 0
        self.resumed = False
        self._inbox: Deque[Message] = collections.deque()
        self._interrupted = False

    def _registered(self, msg: Message) -> None:
        self.version = msg.get("version", 0)
        self.seq = msg.get("seq", 0)
        self.resumed = msg.get("resumed") is True

    def next(self, timeout: Optional[float] = None) -> Optional[Message]:
        """The next message fluxd sent for this store, as a dict, in order: the retained ``snapshot`` and the
        ``queries`` that follow registration, then ``action``, ``queries``/``queries-changed``, ``snapshot`` (when
        this connection also subscribes) and ``error`` (an answer fluxd refused; ``ref`` = the store). Waits
        without limit unless ``timeout`` is given (then raises :class:`~fluxbus.errors.FluxTimeoutError`).
        Returns ``None`` once :meth:`interrupt` was called; raises :class:`Disconnected` when the connection
        ends."""
        def ready() -> Any:
            if self._interrupted:
                return _WAKE
            return self._inbox.popleft() if self._inbox else None
        msg = self.client._wait(ready, Deadline(timeout), f"waiting for a message for store {self.store!r}")
        return None if msg is _WAKE else msg

    def interrupt(self) -> None:
        """Makes :meth:`next` return ``None`` (now, if a thread waits in it, and from then on). Thread-safe."""
        self._interrupted = True
        self.client._wake()

    def done(self, seq: int, state: Any = None, timeout: Optional[float] = None) -> None:
        """Answers the action ``seq`` as handled, with the store's new full ``state`` (``None``: unchanged)."""
        fields: Message = {"op": Op.DONE, "store": self.store, "seq": seq}
        if state is not None:
            fields["state"] = state
        self._send(fields, timeout)

    def reject(self, seq: int, error: Mapping[str, Any], timeout: Optional[float] = None) -> None:
        """Answers the action ``seq`` as rejected with ``error`` (``{"code": ..., "message": ..., ...}``)."""
        self._send({"op": Op.REJECT, "store": self.store, "seq": seq, "error": dict(error)}, timeout)

    def publish(self, state: Any, timeout: Optional[float] = None) -> None:
        """Publishes a new full state outside an action (``state``, SPEC §8.4)."""
        self._send({"op": Op.STATE, "store": self.store, "state": state}, timeout)

    def unregister(self, timeout: Optional[float] = None) -> None:
        """Takes the store down (``unregister``, SPEC §8.2); fluxd sends no reply."""
        if self.client._stores.get(self.store) is self:
            del self.client._stores[self.store]
        self._send({"op": Op.UNREGISTER, "store": self.store}, timeout)

    def _send(self, fields: Message, timeout: Optional[float]) -> None:
        self.client._send_raw(self.client._frame(fields), self.client._deadline(timeout))


def connect(socket_path: Optional[str] = None, name: str = "", role: str = "client",
            timeout: Optional[float] = 30.0, heartbeat: bool = True,
            expected_server_uid: Optional[int] = None) -> Client:
    """Shorthand for :meth:`Client.connect`."""
    return Client.connect(socket_path, name, role, timeout, heartbeat, expected_server_uid)

