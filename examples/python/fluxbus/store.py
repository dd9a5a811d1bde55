"""The ``Store`` base class: a FluxBus store worker in Python."""
from __future__ import annotations

import copy
import threading
from typing import Any, Callable, Dict, List, Optional

from .client import Client
from .wire import ActiveQuery, Disconnected, FluxError, QuerySet, Snapshot, dumps, pattern_matches

Handler = Callable[..., Any]


class Reject(Exception):
    """Raise from a handler to reject the action: the store answers ``reject`` with ``{"code", "message"}``
    (plus ``details`` members) and its state stays as it was."""

    def __init__(self, code: str, message: str = "", **details: Any):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = details

    def error_object(self) -> Dict[str, Any]:
        error = {"code": self.code, **self.details}
        if self.message:
            error["message"] = self.message
        return error


def on(*types: str) -> Callable[[Handler], Handler]:
    """Marks a :class:`Store` method as the handler of the given action types (exact types or ``prefix*``
    patterns). The method is called as ``handler(state, payload, ctx)`` and returns the new state, or ``None``
    to keep it."""
    def mark(function: Handler) -> Handler:
        function.__flux_types__ = getattr(function, "__flux_types__", ()) + types  # type: ignore[attr-defined]
        return function
    return mark


class ActionContext:
    """What a handler knows about the action it handles, and how it dispatches follow-ups."""

    def __init__(self, store: "Store", msg: Dict[str, Any]):
        self.store = store
        self.seq: int = msg["seq"]
        self.type: str = msg["type"]
        self.origin: int = msg["origin"]
        self.cause: Optional[int] = msg.get("cause")
        self.redelivered: bool = msg.get("redelivered") is True
        self.follow_ups: List[tuple] = []

    def dispatch(self, type: str, payload: Any = None) -> None:
        """Dispatches a follow-up action with ``cause`` = this action's seq. It is sent after this action's
        answer, and only if the handler does not reject."""
        self.follow_ups.append((type, payload))


class Store:
    """Base class of a store worker: subclass it, set :attr:`name`, :attr:`handles` (patterns),
    :attr:`initial_state` and optionally :attr:`wait_for`, and write handlers with :func:`on`::

        class Counter(Store):
            name = "counter"
            handles = ["counter/*"]
            initial_state = {"value": 0}

            @on("counter/add")
            def add(self, state, payload, ctx):
                if payload["by"] <= 0:
                    raise Reject("counter/bad-step", "step must be positive")
                return {**state, "value": state["value"] + payload["by"]}

        Counter().run()

    Each action delivered is handled once, in order, and answered: ``done`` (carrying ``state`` only when the
    handler changed it, so one action makes at most one new snapshot), or ``reject`` when the handler raises
    :class:`Reject` (any other exception is rejected as ``store/error``). Handlers get a deep copy of the state,
    so a failed handler leaves no trace. An action type the store handles but has no handler for is answered
    ``done`` without change. :meth:`on_queries` is called when the set of active queries changes;
    :meth:`publish` sends a new state outside an action (e.g. after fetching what a query asked for).

    The store registers with ``"queryDeltas": true`` (:attr:`query_deltas`): after the first full ``queries``
    fluxd sends only the queries whose count changed (``queries-changed``), and the store keeps the whole set
    itself, so :attr:`queries` and :meth:`on_queries` see the full set exactly as before. Its connection asks
    for heartbeats (:attr:`heartbeat`); the client's reader thread answers them even while a handler runs.
    """

    name: str = ""
    handles: List[str] = []
    wait_for: List[str] = []
    initial_state: Any = None
    #: Ask fluxd for ``queries-changed`` deltas instead of the whole set on every change.
    query_deltas: bool = True
    #: Ask fluxd to ping the connection when it is silent (answered by the client's reader thread).
    heartbeat: bool = True

    def __init__(self, socket_path: Optional[str] = None, client_name: Optional[str] = None,
                 expected_server_uid: Optional[int] = None):
        self.socket_path = socket_path
        self.client_name = client_name or f"{self.name}-py"
        self.expected_server_uid = expected_server_uid
        self.state: Any = None
        self.version = 0
        self.queries: List[ActiveQuery] = []
        self._query_set = QuerySet()
        self.client: Optional[Client] = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._handlers: List[tuple] = []
        for attribute in dir(type(self)):
            function = getattr(type(self), attribute, None)
            for pattern in getattr(function, "__flux_types__", ()):
                self._handlers.append((pattern, getattr(self, attribute)))
        self.ready = threading.Event()

    # -- hooks --------------------------------------------------------------------------------------------------

    def on_queries(self, queries: List[ActiveQuery]) -> None:
        """Called (on the store's thread) whenever the active queries change; default: nothing."""

    def on_registered(self, resumed: bool) -> None:
        """Called once registration is complete and the retained state adopted."""

    # -- running ------------------------------------------------------------------------------------------------

    def connect(self) -> Client:
        """Connects and registers (``registered``, adopt the retained snapshot, ``queries``)."""
        client = Client.connect(self.socket_path, self.client_name, role="store", heartbeat=self.heartbeat,
                                expected_server_uid=self.expected_server_uid)
        self.client = client
        register: Dict[str, Any] = {"op": "register", "store": self.name, "handles": list(self.handles),
                                    "waitFor": list(self.wait_for)}
        if self.query_deltas:
            register["queryDeltas"] = True
        if self.initial_state is not None:
            register["state"] = self.initial_state
        inbox = client._store_inbox.setdefault(self.name, __import__("collections").deque())
        client._send(register)
        registered = client._wait(lambda: inbox.popleft() if inbox else None, None, "registered")
        if registered.get("op") == "error":
            raise FluxError.from_frame(registered)
        while True:
            msg = client._wait(lambda: inbox.popleft() if inbox else None, None, "registration")
            if msg["op"] == "snapshot":
                self._adopt(msg)
            elif msg["op"] == "queries":
                self._queries(msg)
                break
        self.on_registered(registered.get("resumed") is True)
        self.ready.set()
        return client

    def run(self) -> None:
        """Connects, registers and serves actions until :meth:`stop` or the connection ends."""
        client = self.client or self.connect()
        inbox = client._store_inbox[self.name]
        try:
            while not self._stop.is_set():
                try:
                    msg = client._wait(lambda: inbox.popleft() if inbox else (None if not self._stop.is_set() else {"op": "stop"}),
                                       0.2, "an action")
                except TimeoutError:
                    continue
                self.handle_message(msg)
        except Disconnected:
            if not self._stop.is_set():
                raise
        finally:
            if self._stop.is_set():
                client.close()

    def start(self) -> threading.Thread:
        """Runs the store on a daemon thread; returns once it is registered."""
        self.connect()
        thread = threading.Thread(target=self._run_quietly, name=f"store-{self.name}", daemon=True)
        thread.start()
        return thread

    def _run_quietly(self) -> None:
        try:
            self.run()
        except Disconnected:
            pass

    def stop(self) -> None:
        """Asks :meth:`run` to return (it closes the connection)."""
        self._stop.set()

    def publish(self, state: Any) -> None:
        """Publishes a new full state outside an action (``state`` op); nothing is sent if it is unchanged.
        Safe to call from another thread."""
        with self._lock:
            if dumps(state) == dumps(self.state):
                return
            self.state = state
            assert self.client is not None
            self.client._send({"op": "state", "store": self.name, "state": state})

    # -- handling -----------------------------------------------------------------------------------------------

    def handle_message(self, msg: Dict[str, Any]) -> None:
        op = msg.get("op")
        if op == "action":
            self._handle_action(msg)
        elif op in ("queries", "queries-changed"):
            self._queries(msg)
        elif op == "snapshot":
            self._adopt(msg)
        elif op == "error":
            assert self.client is not None
            self.client.errors.append(FluxError.from_frame(msg))

    def handler_for(self, action_type: str) -> Optional[Handler]:
        """The handler of an action type: an exact registration wins over patterns, else the longest pattern."""
        best = None
        for pattern, handler in self._handlers:
            if pattern_matches(pattern, action_type):
                rank = (not pattern.endswith("*"), len(pattern))
                if best is None or rank > best[0]:
                    best = (rank, handler)
        return best[1] if best else None

    def _handle_action(self, msg: Dict[str, Any]) -> None:
        assert self.client is not None
        ctx = ActionContext(self, msg)
        handler = self.handler_for(ctx.type)
        with self._lock:
            answer: Dict[str, Any] = {"op": "done", "store": self.name, "seq": ctx.seq}
            try:
                new_state = handler(copy.deepcopy(self.state), msg.get("payload"), ctx) if handler else None
            except Reject as rejection:
                self.client._send({"op": "reject", "store": self.name, "seq": ctx.seq,
                                   "error": rejection.error_object()})
                return
            except Exception as error:  # a bug in a handler must not wedge the store
                self.client._send({"op": "reject", "store": self.name, "seq": ctx.seq,
                                   "error": {"code": "store/error", "message": f"{type(error).__name__}: {error}"}})
                return
            if new_state is not None and dumps(new_state) != dumps(self.state):
                self.state = new_state
                answer["state"] = new_state
            self.client._send(answer)
        for follow_type, payload in ctx.follow_ups:
            self.client.dispatch(follow_type, payload, cause=ctx.seq)

    def _adopt(self, msg: Dict[str, Any]) -> None:
        with self._lock:
            if msg["version"] >= self.version:
                self.version = msg["version"]
                self.state = msg.get("state")

    def _queries(self, msg: Dict[str, Any]) -> None:
        """A full ``queries`` set, or a ``queries-changed`` delta applied to the set kept so far."""
        if msg.get("op") == "queries-changed":
            self._query_set.apply(msg.get("changes", []))
        else:
            self._query_set.replace(msg.get("queries", []))
        self.queries = self._query_set.active
        self.on_queries(list(self.queries))
