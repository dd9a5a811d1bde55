"""Store workers in Python: :class:`Store` (a thread on the synchronous client) and :class:`AsyncStore` (a task on
the asyncio client). Both take the same class attributes and the same ``@on`` handlers."""
from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import logging
import threading
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Tuple

from ._core import FINAL_REFUSALS, _max_frame
from .aio import AsyncClient, AsyncStoreRegistration
from .client import Client, StoreRegistration
from .errors import Disconnected, FluxError, NotSentError, StateTooLargeError
from .protocol import STORE_BAD_PAYLOAD, STORE_ERROR, STORE_UNHANDLED_ACTION, Op
from .reconnect import ConnectionEvent, ReconnectOption
from .draft import draft, finish
from .patch import MAX_DEPTH, _depth, json_equal, plain
from .pieces import Pieces, fits, split_state, state_frame_length
from .wire import ActiveQuery, QuerySet, dumps, is_valid_action_type, pattern_matches

Handler = Callable[..., Any]
#: A handler's outcome: ``("done", new state or None)`` or ``("reject", error object)``.
Answer = Tuple[str, Any]

log = logging.getLogger("fluxbus.store")

#: The values of :attr:`Store.unhandled`.
UNHANDLED_MODES = ("reject", "ignore")
#: The values of :attr:`Store.handler_state`.
HANDLER_STATES = ("draft", "shared", "copy")
_MAX_MESSAGE = 1000


class Reject(Exception):
    """Raise from a handler to reject the action: the store answers ``reject`` with ``{"code", "message"}``
    (plus ``details`` members), passed on unchanged, and its state stays as it was."""

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
    """Marks a store method as the handler of the given action types (exact types or ``prefix*`` patterns). The
    method is called as ``handler(state, payload, ctx)`` and returns the new state, or ``None`` to keep it (an
    :class:`AsyncStore` handler may be ``async def``)."""
    def mark(function: Handler) -> Handler:
        function.__flux_types__ = getattr(function, "__flux_types__", ()) + types  # type: ignore[attr-defined]
        return function
    return mark


class ActionContext:
    """What a handler knows about the action it handles, and how it dispatches follow-ups."""

    def __init__(self, store: Any, msg: Dict[str, Any]):
        self.store = store
        self.seq: int = msg["seq"]
        self.type: str = msg["type"]
        self.origin: int = msg["origin"]
        self.cause: Optional[int] = msg.get("cause")
        self.redelivered: bool = msg.get("redelivered") is True
        self.follow_ups: List[tuple] = []

    def dispatch(self, type: str, payload: Any = None) -> None:
        """Dispatches a follow-up action with ``cause`` = this action's seq. It is sent after this action's
        answer, and only if the handler does not reject. An invalid type raises ``ValueError`` here, in the
        handler (so the action is rejected), not later."""
        if not is_valid_action_type(type):
            raise ValueError(f"invalid follow-up action type {type!r}")
        dumps(payload)  # not JSON: raises here too
        self.follow_ups.append((type, payload))


def unhandled_message(action_type: str, handled: List[str]) -> str:
    """The message of a ``store/unhandled-action`` rejection: which type, and which ones the store handles."""
    if not handled:
        return f"no handler for {action_type!r}; this store has no action handlers"
    return f"no handler for {action_type!r}; this store handles: {', '.join(handled)}"


def failure_error(action_type: str, error: BaseException, payload: Any) -> Dict[str, Any]:
    """The rejection a handler's exception is answered with, written for whoever dispatched the action:
    ``store/bad-payload`` ``todo/add failed: payload is missing field 'title'`` (with ``"field": "title"``) for a
    ``KeyError`` of a field the payload lacks, or ``... the action has no payload ...`` when it had none (as the
    Swift and Node libraries say when a payload does not decode); else ``store/error``
    ``todo/add failed: ValueError: <message>``."""
    kind = type(error).__name__
    text = str(error)
    result: Dict[str, Any] = {"code": STORE_ERROR}
    key = error.args[0] if isinstance(error, KeyError) and len(error.args) == 1 else None
    if isinstance(payload, dict) and isinstance(key, str) and key not in payload:
        result["code"] = STORE_BAD_PAYLOAD
        result["message"] = f"{action_type} failed: payload is missing field {key!r}"
        result["field"] = key
    elif payload is None and isinstance(error, (TypeError, AttributeError, KeyError)):
        result["code"] = STORE_BAD_PAYLOAD
        result["message"] = f"{action_type} failed: the action has no payload ({kind}: {text})"
    else:
        result["message"] = f"{action_type} failed: {kind}" + (f": {text}" if text else "")
    if len(result["message"]) > _MAX_MESSAGE:
        result["message"] = result["message"][:_MAX_MESSAGE - 3] + "..."
    return result


class _Publication:
    """A state a store publishes after registering, because fluxd retains nothing for it (SPEC §16.6): whole in
    one ``state`` if that fits in a frame, else in pieces (:class:`fluxbus.pieces.Pieces`)."""

    def __init__(self, target: Any):
        self.target = target
        self.pieces: Optional[Pieces] = None
        self.first_version = 0  # the version the pieces' root state made (0: not sent yet)
        self.sent = 0  # patches sent after the root
        self.epoch: Optional[str] = None  # the epoch the root was sent in
        self.done = False  # sent whole

    def resumes(self, msg: Dict[str, Any], epoch: Optional[str]) -> bool:
        """Whether the snapshot ``msg`` (after ``registered``) is what this publication's pieces made, up to one of
        them, in this epoch: then the store goes on with the next piece instead of adopting it (SPEC §16.6)."""
        version = msg.get("version")
        if self.pieces is None or not self.first_version or epoch is None or epoch != self.epoch:
            return False
        made = version - self.first_version if isinstance(version, int) else -1
        if not 0 <= made <= len(self.pieces.patches):
            return False
        return json_equal(msg.get("state"), self.pieces.state_after(made))


class StoreBase:
    """What :class:`Store` and :class:`AsyncStore` share: the class attributes, handler lookup, the answer to an
    action, and the store's state, version and active queries."""

    name: str = ""
    handles: List[str] = []
    wait_for: List[str] = []
    initial_state: Any = None
    #: Ask fluxd for ``queries-changed`` deltas instead of the whole set on every change.
    query_deltas: bool = True
    #: Ask fluxd to ping the connection when it is silent (answered by the client).
    heartbeat: bool = True
    #: What an action whose type matches :attr:`handles` but none of the handlers gets: ``"reject"`` (the
    #: default) rejects it with ``store/unhandled-action`` naming the type and the handled types, so that a
    #: typo does not look like success; ``"ignore"`` answers ``done`` without a change.
    unhandled: str = "reject"
    #: Reconnect when the connection is lost (a :class:`fluxbus.Reconnect` policy, ``True`` or ``False``).
    reconnect: ReconnectOption = True
    #: What a handler is given as ``state`` (SPEC §16: the store sends what changed, as a patch):
    #: ``"draft"`` (the default): a draft (``fluxbus.draft``) that records what the handler changes, whether it
    #: changes it in place or returns a new state; the patch costs what the handler reads and writes.
    #: ``"shared"``: the store's state itself, which the handler must not modify: it returns a new state that
    #: shares what did not change (``{**state, "todos": todos}``); the cheapest, diffed skipping shared subtrees.
    #: ``"copy"``: a deep copy, as before 0.4 (the diff then compares the whole state).
    handler_state: str = "draft"
    #: Publish changes as patches (``done.patch``, the ``patch`` op) when fluxd speaks SPEC §16 (0.4.0 or newer:
    #: ``welcome.limits.deltaHistory``); ``False``: always whole states.
    patches: bool = True

    def __init__(self, socket_path: Optional[str] = None, client_name: Optional[str] = None,
                 expected_server_uid: Optional[int] = None, unhandled: Optional[str] = None,
                 reconnect: ReconnectOption = None):
        self.socket_path = socket_path
        self.client_name = client_name or f"{self.name}-py"
        self.expected_server_uid = expected_server_uid
        if reconnect is not None:
            self.reconnect = reconnect
        if unhandled is not None:
            self.unhandled = unhandled
        if self.unhandled not in UNHANDLED_MODES:
            raise ValueError(f"unhandled must be one of {', '.join(map(repr, UNHANDLED_MODES))}, "
                             f"not {self.unhandled!r}")
        if self.handler_state not in HANDLER_STATES:
            raise ValueError(f"handler_state must be one of {', '.join(map(repr, HANDLER_STATES))}, "
                             f"not {self.handler_state!r}")
        self.state: Any = None
        self._state_json: Optional[bytes] = dumps(None)  # the state's canonical JSON (None: not computed)
        #: The version of the state, as fluxd numbers it: the one adopted at registration, plus one for every
        #: non-empty patch sent (the ``base`` of the next patch, SPEC §16.2); 0: fluxd retains no state.
        self.version = 0
        self._base_known = False  # False after a whole state was published: its version is not known
        #: Changes sent as patches and as whole states (SPEC §16.2).
        self.patches_sent = 0
        self.states_sent = 0
        #: The seq of the snapshot adopted at the last registration (``registered.seq`` if there was none):
        #: actions up to it are already in the state, and are answered ``done`` without running the handler.
        self.adopted_seq = 0
        #: Actions answered without running their handler because the adopted snapshot included them.
        self.skipped_actions = 0
        #: How many times the store registered (1, then one more after each reconnection).
        self.registrations = 0
        self.queries: List[ActiveQuery] = []
        self._query_set = QuerySet()
        self._registering = False
        self._adopt_next = False
        self._resumed = False
        self._starting = False  # connect() runs: a state that cannot be published is raised, not only logged
        self._has_state = False  # self.state is the store's (adopted or published), not the initial state yet
        #: SPEC §16.6: the state to publish once this registration is complete (fluxd retains nothing), and the
        #: one whose pieces are being sent (kept until fluxd confirmed them all, to go on after a lost connection).
        self._to_publish: Optional[_Publication] = None
        self._publication: Optional[_Publication] = None
        self._handlers: List[Tuple[str, Handler]] = []
        for attribute in dir(type(self)):
            function = getattr(type(self), attribute, None)
            for pattern in getattr(function, "__flux_types__", ()):
                self._handlers.append((pattern, getattr(self, attribute)))

    def handler_for(self, action_type: str) -> Optional[Handler]:
        """The handler of an action type: an exact registration wins over patterns, else the longest pattern."""
        best = None
        for pattern, handler in self._handlers:
            if pattern_matches(pattern, action_type):
                rank = (not pattern.endswith("*"), len(pattern))
                if best is None or rank > best[0]:
                    best = (rank, handler)
        return best[1] if best else None

    def handled_types(self) -> List[str]:
        """The types and patterns of this store's handlers, sorted."""
        return sorted({pattern for pattern, _ in self._handlers})

    # -- answers ------------------------------------------------------------------------------------------------

    def _unhandled_answer(self, ctx: ActionContext) -> Answer:
        if self.unhandled == "ignore":
            return ("done", None)
        return ("reject", {"code": STORE_UNHANDLED_ACTION,
                           "message": unhandled_message(ctx.type, self.handled_types())})

    def _handler_state(self) -> Any:
        """What a handler is given (:attr:`handler_state`)."""
        if self.handler_state == "draft":
            return draft(self.state)
        if self.handler_state == "shared":
            return self.state
        return copy.deepcopy(self.state)

    def _patching(self) -> bool:
        """Whether a change goes out as a patch: fluxd speaks SPEC §16 and retains a state to patch."""
        client = getattr(self, "client", None)
        return self.patches and self.version > 0 and client is not None and client.speaks_deltas()

    def _change(self, new_state: Any, what: str) -> Optional[Dict[str, Any]]:
        """The change from :attr:`state` to ``new_state`` (a handler's result or a published state), as the fields
        to send (``patch`` and ``base``, or ``state``), or ``None`` when nothing changed. Commits it: the store's
        state, version and counters are those after sending it. Raises ``ValueError`` when the new state is not
        JSON."""
        if self._patching():
            final, ops = finish(self.state, new_state)
            if not ops:
                return None
            encoded = dumps(ops)  # not JSON (a set, NaN, an object): ValueError or TypeError
            for op in ops:
                if "value" in op:
                    room = MAX_DEPTH - op["path"].count("/")
                    if _depth(op["value"], room) > room:
                        raise ValueError(f"the {what} nests deeper than {MAX_DEPTH}")
            change: Dict[str, Any] = {"patch": encoded}
            if self._base_known:
                change["base"] = self.version
            self.state = final
            self._state_json = None
            self._has_state = True
            self.version += 1
            self.patches_sent += 1
            return change
        final = plain(new_state) if self.handler_state == "draft" else new_state  # (no drafts otherwise)
        encoded = dumps(final)
        if self._state_json is None:
            self._state_json = dumps(self.state)
        if encoded == self._state_json:
            return None
        if self.version == 0:  # fluxd retained nothing: this state is version 1
            self.version, self._base_known = 1, True
        else:  # the version it makes depends on the bytes fluxd retains: not known here
            self._base_known = False
        self.state = final
        self._state_json = encoded
        self._has_state = True
        self.states_sent += 1
        return {"state": encoded}

    def _result_answer(self, ctx: ActionContext, new_state: Any) -> Answer:
        """``done`` for a handler's result (with the change, as a patch or the whole state, only when there is
        one), or ``store/error`` when it is not JSON."""
        if new_state is None:
            return ("done", None)
        try:
            return ("done", self._change(new_state, "state"))
        except (TypeError, ValueError, RecursionError) as error:
            return ("reject", {"code": STORE_ERROR,
                               "message": f"{ctx.type} failed: the handler returned a state that is not JSON "
                                          f"({error})"})

    def _saved(self) -> Tuple[Any, ...]:
        return (self.state, self._state_json, self.version, self._base_known, self.patches_sent, self.states_sent,
                self._has_state)

    def _restore(self, saved: Tuple[Any, ...]) -> None:
        (self.state, self._state_json, self.version, self._base_known, self.patches_sent,
         self.states_sent, self._has_state) = saved

    def _published_change(self, state: Any) -> Optional[Dict[str, Any]]:
        """The change :meth:`publish` sends (see :meth:`_change`). A state that is the store's own object,
        modified in place, cannot be diffed: it goes out whole."""
        if state is self.state and self._patching():
            encoded = dumps(state)
            self._base_known = False  # fluxd makes a version only if its bytes differ: the next patch has no base
            self._state_json = encoded
            self.states_sent += 1
            return {"state": encoded}
        return self._change(state, "published state")

    def _failure_answer(self, ctx: ActionContext, error: BaseException, payload: Any) -> Answer:
        if isinstance(error, Reject):
            return ("reject", error.error_object())
        log.error("store %s: the handler of %s (seq %d) failed", self.name, ctx.type, ctx.seq, exc_info=error)
        return ("reject", failure_error(ctx.type, error, payload))

    def _adopt(self, msg: Dict[str, Any]) -> None:
        """A snapshot of the store: the one that follows ``registered`` is adopted whatever it holds (SPEC §15.3
        rule 1: after fluxd restarted, a store that stayed alive rewinds to the retained snapshot; the actions it
        applied since are delivered again), unless it is what the pieces of a publication cut short made (SPEC
        §16.6: the store goes on with the next piece); later ones only when newer."""
        if self._adopt_next:
            self._adopt_next = False
            publication = self._publication
            if publication is not None and publication.resumes(msg, self._epoch()):
                log.info("store %s: fluxd holds version %d of the state it was publishing in pieces (%d of %d "
                         "sent): sending the rest", self.name, msg["version"], msg["version"] -
                         publication.first_version, len(publication.pieces.patches))  # type: ignore[union-attr]
                publication.sent = msg["version"] - publication.first_version
                self._to_publish = publication
                self.version, self._base_known = msg["version"], True
                self.state, self._state_json, self._has_state = publication.target, None, True
                self.adopted_seq = msg["seq"]
                return
            self._publication = None
            if self.version and msg["version"] < self.version:
                log.info("store %s: rewinding from version %d to fluxd's retained version %d (seq %d)", self.name,
                         self.version, msg["version"], msg["seq"])
            self.version = msg["version"]
            self.state = msg.get("state")
            self._state_json = None
            self._has_state = True
            self._base_known = True
            self.adopted_seq = msg["seq"]
        elif msg["version"] >= self.version:
            self.version = msg["version"]
            self.state = msg.get("state")
            self._state_json = None
            self._has_state = True
            self._base_known = True

    def _epoch(self) -> Optional[str]:
        client = getattr(self, "client", None)
        return getattr(client, "epoch", None)

    def _begin_registration(self, msg: Dict[str, Any]) -> None:
        """fluxd answered ``registered``: the retained snapshot (if any) follows, then ``queries``. When fluxd
        retains nothing, the store publishes its state (or the initial one) once registered (SPEC §16.6)."""
        self._registering = True
        self._resumed = msg.get("resumed") is True
        self._adopt_next = msg.get("version", 0) > 0
        self._to_publish = None
        if not self._adopt_next:  # fluxd retains nothing: the store's state is published, whole or in pieces
            target = self._state_to_offer()
            self._publication = None
            self.version, self._base_known = 0, True
            if target is not None:
                self._to_publish = _Publication(target)
                self.state, self._state_json, self._has_state = target, None, True
        self.adopted_seq = msg.get("seq", 0)  # replaced by the snapshot's seq when one follows
        self.registrations += 1

    def _next_piece(self, publication: _Publication) -> Optional[Tuple[str, bytes, Optional[int]]]:
        """The next frame that publishes ``publication`` (SPEC §16.6): ``("state", state, None)`` or ``("patch",
        patch, base)``, or ``None`` once all is sent. Raises :class:`StateTooLargeError` when it cannot be."""
        if publication.done:
            return None
        client = self.client  # type: ignore[attr-defined]
        if publication.pieces is None:
            encoded = dumps(publication.target)
            max_frame = _max_frame(client.welcome)
            if fits(state_frame_length(self.name, encoded), max_frame):
                return ("state", encoded, None)
            assert max_frame is not None
            if not client.speaks_deltas():
                raise StateTooLargeError(
                    f"store {self.name!r}: its state ({len(encoded)} bytes) is larger than fluxd's maxFrame "
                    f"({max_frame} bytes) and this fluxd takes no patches (0.4.0 or newer does), so it cannot be "
                    f"published", ref=self.name)
            publication.pieces = split_state(publication.target, self.name, max_frame)
        if not publication.first_version:
            return ("state", publication.pieces.root, None)
        sent = publication.sent
        if sent < len(publication.pieces.patches):
            return ("patch", publication.pieces.patches[sent], publication.first_version + sent)
        return None

    def _piece_sent(self, publication: _Publication, piece: Tuple[str, bytes, Optional[int]]) -> None:
        kind, body, base = piece
        if kind == "state":  # fluxd retained nothing: this is version 1
            self.version, self._base_known = 1, True
            self.states_sent += 1
            self.state, self._has_state = publication.target, True
            if publication.pieces is None:
                publication.done = True
                self._state_json = body
            else:
                publication.first_version, publication.epoch = 1, self._epoch()
                self._publication = publication
                self._state_json = None
        else:
            assert base is not None
            publication.sent += 1
            self.version = base + 1
            self.patches_sent += 1
            if publication.pieces is not None and publication.sent == len(publication.pieces.patches):
                log.info("store %s: published its state in %d pieces (fluxd retained none and it does not fit in "
                         "one frame)", self.name, publication.sent + 1)

    def _pending_publication(self, state: Any) -> bool:
        """:meth:`publish` while the store registers and fluxd retains no state: the state published becomes the
        one published on registering (SPEC §16.6). Returns whether it was taken so."""
        publication = self._to_publish
        if publication is None or publication.pieces is not None or publication.done:
            return False
        dumps(state)  # not JSON: raises here
        publication.target = plain(state) if self.handler_state == "draft" else state
        self.state, self._state_json, self._has_state = publication.target, None, True
        return True

    def _unpublishable(self, error: StateTooLargeError) -> None:
        """The state cannot be published (SPEC §16.6): raised from ``connect``; later logged and kept in the
        client's errors. The store stays registered (fluxd holds no state for it) and does not retry."""
        self._to_publish = self._publication = None
        if self._starting:
            raise error
        log.error("store %s: %s", self.name, error)
        self._keep_error(error)
        self.registration.confirm()  # type: ignore[attr-defined]

    def _keep_error(self, error: FluxError) -> None:
        raise NotImplementedError

    def _already_applied(self, ctx: "ActionContext") -> bool:
        """SPEC §15.3 rule 2: an action whose seq is at most the adopted snapshot's is already in the state."""
        if ctx.seq > self.adopted_seq:
            return False
        self.skipped_actions += 1
        log.debug("store %s: action %d (%s) is already in the adopted snapshot (seq %d): answered done without "
                  "running the handler", self.name, ctx.seq, ctx.type, self.adopted_seq)
        return True

    def _retry_registration(self, error: FluxError) -> bool:
        """A registration made again after reconnecting was refused (``name-taken``: fluxd may not have seen the
        end of the old connection yet; ``memory-budget``, ...): the client logged it and registers again after a
        wait that grows with each refusal in a row (SPEC §16.6). Codes no retry can cure are reported instead."""
        registration = self.registration
        if registration is None or registration.live or registration.registrations == 0:
            return False
        return error.code not in FINAL_REFUSALS

    def _state_to_offer(self) -> Any:
        """The ``register.state`` offered when registering again after a lost connection: the current state (or
        the one being published), else the initial one. fluxd uses it only if it retains no snapshot, e.g. an
        ephemeral fluxd that restarted, and only if the frame fits in ``maxFrame``; otherwise the store publishes
        it after registering, in pieces if need be (SPEC §16.6)."""
        if self._publication is not None:
            return self._publication.target
        return self.state if self._has_state else self.initial_state

    def on_connection_event(self, event: ConnectionEvent) -> Any:
        """Called with each :class:`fluxbus.ConnectionEvent` of the store's connection (``disconnected``,
        ``reconnecting``, ``reconnected``, ``gave-up``): on the client's reader thread for :class:`Store`, on the
        loop for :class:`AsyncStore`. Default: nothing at info level: the client logs each event once (logger
        ``fluxbus``: the loss and the return at notice, giving up at warning); this adds a debug line."""
        if event.kind in (ConnectionEvent.DISCONNECTED, ConnectionEvent.GAVE_UP):
            log.debug("store %s: %s (the client logged it)", self.name, event)

    def _apply_queries(self, msg: Dict[str, Any]) -> List[ActiveQuery]:
        """A full ``queries`` set, or a ``queries-changed`` delta applied to the set kept so far."""
        if msg.get("op") == Op.QUERIES_CHANGED:
            self._query_set.apply(msg.get("changes", []))
        else:
            self._query_set.replace(msg.get("queries", []))
        self.queries = self._query_set.active
        return list(self.queries)

    def _not_connected(self) -> Disconnected:
        return Disconnected(f"store {self.name!r} is not connected: call connect(), start() or run() first")


class Store(StoreBase):
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
    :class:`Reject` (passed on as it is). Any other exception is rejected as ``store/error`` with a message for
    whoever dispatched (``counter/add failed: payload is missing field 'by'``; see :func:`failure_error`) and
    logged with its traceback (logger ``fluxbus.store``). Handlers get a deep copy of the state, so a failed
    handler leaves no trace. An action whose type matches :attr:`handles` but no handler (``counter/ad``) is
    rejected with ``store/unhandled-action`` unless :attr:`unhandled` is ``"ignore"``. :meth:`on_queries` is
    called when the set of active queries changes; :meth:`publish` sends a new state outside an action (e.g.
    after fetching what a query asked for).

    The store registers with ``"queryDeltas": true`` (:attr:`query_deltas`): after the first full ``queries``
    fluxd sends only the queries whose count changed (``queries-changed``), and the store keeps the whole set
    itself, so :attr:`queries` and :meth:`on_queries` see the full set exactly as before. Its connection asks
    for heartbeats (:attr:`heartbeat`); the client's reader thread answers them even while a handler runs.

    The store's thread waits for fluxd's messages without polling; :meth:`stop` wakes it.

    **Reconnecting** (:attr:`reconnect`, on by default). When the connection is lost (fluxd restarted, the
    socket dropped) the store keeps running: its client reconnects with backoff and registers the store again,
    offering its current state (used by fluxd only if it retains none, and sent only if the frame fits in
    ``maxFrame``: otherwise the store publishes it after registering, in pieces, SPEC §16.6; a refused
    registration is tried again after a wait that doubles up to 30 s). The store then adopts the snapshot
    fluxd sends after ``registered``, even one older than its state in memory (SPEC §15.3 rule 1), and answers
    ``done`` without running the handler to an action whose seq is at most that snapshot's seq
    (:attr:`adopted_seq`; rule 2), so each action takes effect on the state exactly once. :meth:`on_registered`
    is called after each registration, :meth:`on_connection_event` with each connection event. Effects outside
    the state happen again when an action is delivered again (``ctx.redelivered``): make them idempotent, keyed
    by ``ctx.seq``.
    """

    def __init__(self, socket_path: Optional[str] = None, client_name: Optional[str] = None,
                 expected_server_uid: Optional[int] = None, unhandled: Optional[str] = None,
                 reconnect: ReconnectOption = None):
        super().__init__(socket_path, client_name, expected_server_uid, unhandled, reconnect)
        self.client: Optional[Client] = None
        self.registration: Optional[StoreRegistration] = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self.ready = threading.Event()

    # -- hooks --------------------------------------------------------------------------------------------------

    def on_queries(self, queries: List[ActiveQuery]) -> None:
        """Called (on the store's thread) whenever the active queries change; default: nothing."""

    def on_registered(self, resumed: bool) -> None:
        """Called each time registration is complete and the retained state adopted (after the first
        connection, and after each reconnection)."""

    # -- running ------------------------------------------------------------------------------------------------

    def connect(self) -> Client:
        """Connects and registers (``registered``, adopt the retained snapshot, ``queries``)."""
        client = Client.connect(self.socket_path, self.client_name, role="store", heartbeat=self.heartbeat,
                                expected_server_uid=self.expected_server_uid, reconnect=self.reconnect,
                                on_connection_event=self.on_connection_event)
        self._starting = True
        try:
            registration = client.register(self.name, self.handles, self.wait_for, self.initial_state,
                                           self.query_deltas, confirm=False)
            registration.offer_state = self._state_to_offer
            self.client, self.registration = client, registration
            self._begin_registration({"version": registration.version, "seq": registration.seq,
                                      "resumed": registration.resumed})
            while self._registering:
                msg = registration.next(timeout=client.timeout)
                if msg is None:  # stop() during registration
                    break
                if msg.get("op") == Op.ERROR:
                    raise FluxError.from_frame(msg)
                self._handle(msg)  # (not handle_message: overrides see what follows the first registration)
        except BaseException:
            self.client = self.registration = None
            client.close()
            raise
        finally:
            self._starting = False
        return client

    def run(self) -> None:
        """Connects, registers and serves actions until :meth:`stop` or the connection ends."""
        if self.client is None:
            self.connect()
        client, registration = self.client, self.registration
        assert client is not None and registration is not None
        try:
            while not self._stop.is_set():
                msg = registration.next()
                if msg is None:
                    break
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
        """Asks :meth:`run` to return (it closes the connection); wakes it at once. Thread-safe."""
        self._stop.set()
        registration = self.registration
        if registration is not None:
            registration.interrupt()

    def publish(self, state: Any) -> None:
        """Publishes a new full state outside an action (``state`` op); nothing is sent if it is unchanged.
        Safe to call from another thread. Raises :class:`~fluxbus.errors.NotSentError` (and keeps the state)
        while the store is reconnecting: it adopts the retained snapshot when it registers again, so publish
        again from :meth:`on_registered` if need be."""
        with self._lock:
            if self.registration is None:
                raise self._not_connected()
            if self._pending_publication(state):
                return
            registration = self.registration
            saved = self._saved()
            change = self._published_change(state)
            if change is None:
                return
            try:
                if "patch" in change:
                    registration.publish_patch(change["patch"], change.get("base"))
                else:
                    registration.publish(change["state"])
            except BaseException:
                self._restore(saved)
                raise

    # -- handling -----------------------------------------------------------------------------------------------

    def handle_message(self, msg: Dict[str, Any]) -> None:
        """Handles one message fluxd sent the store (after registration): actions, ``queries``, and after a
        reconnection ``registered`` again and the snapshot to adopt."""
        self._handle(msg)

    def _handle(self, msg: Dict[str, Any]) -> None:
        op = msg.get("op")
        if op == Op.ACTION:
            self._handle_action(msg)
        elif op in (Op.QUERIES, Op.QUERIES_CHANGED):
            completing = self._registering and op == Op.QUERIES
            if completing:
                self._finish_registration()
            self._queries(msg)
            if completing:
                self._registering = False
                self.on_registered(self._resumed)
                self.ready.set()
        elif op == Op.SNAPSHOT:
            with self._lock:
                self._adopt(msg)
        elif op == Op.REGISTERED:
            with self._lock:
                self._begin_registration(msg)
        elif op == Op.ERROR:
            error = FluxError.from_frame(msg)
            if self._retry_registration(error):
                return
            log.warning("store %s: fluxd refused an answer, state or registration: %s", self.name, error)
            assert self.client is not None
            self.client.errors.append(error)

    def _handle_action(self, msg: Dict[str, Any]) -> None:
        assert self.client is not None and self.registration is not None
        ctx = ActionContext(self, msg)
        handler = self.handler_for(ctx.type)
        payload = msg.get("payload")
        with self._lock:
            if self._already_applied(ctx):
                self.registration.done(ctx.seq)
                return
            if handler is None:
                kind, body = self._unhandled_answer(ctx)
            else:
                try:
                    result = handler(self._handler_state(), payload, ctx)
                    if inspect.isawaitable(result):
                        if inspect.iscoroutine(result):
                            result.close()
                        raise TypeError("the handler is a coroutine function: async handlers need fluxbus.AsyncStore")
                    kind, body = self._result_answer(ctx, result)
                except Exception as error:  # a bug in a handler must not wedge the store
                    kind, body = self._failure_answer(ctx, error, payload)
            if kind == "done":
                answered = self.registration.done(ctx.seq, **(body or {}))
            else:
                answered = self.registration.reject(ctx.seq, body)
        if kind == "done" and answered:  # not when the action's connection was lost: it comes again
            for follow_type, follow_payload in ctx.follow_ups:
                self.client.dispatch(follow_type, follow_payload, cause=ctx.seq)

    def _queries(self, msg: Dict[str, Any]) -> None:
        self.on_queries(self._apply_queries(msg))

    def _finish_registration(self) -> None:
        """Registration is complete (``queries`` came): publishes the state when fluxd retains none, before any
        action is answered (SPEC §16.6), then confirms the registration once fluxd has taken it (a ``ping``
        answered after the last piece), which resets the backoff after refused registrations."""
        registration = self.registration
        assert registration is not None
        with self._lock:
            publication, self._to_publish = self._to_publish, None
            if publication is None:
                registration.confirm()
                return
            try:
                while (piece := self._next_piece(publication)) is not None:
                    kind, body, base = piece
                    if kind == "state":
                        registration.publish(body)
                    else:
                        registration.publish_patch(body, base)
                    self._piece_sent(publication, piece)
            except StateTooLargeError as error:
                self._unpublishable(error)
                return
            except NotSentError:
                return  # the connection is gone: the next registration goes on (SPEC §16.6)
        if registration.barrier():
            registration.confirm()
            if self._publication is publication:
                self._publication = None

    def _keep_error(self, error: FluxError) -> None:
        assert self.client is not None
        self.client.errors.append(error)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class AsyncStore(StoreBase):
    """A store worker on asyncio: the same class attributes, ``@on`` handlers and answers as :class:`Store`, and
    handlers may be plain or ``async def`` (so are :meth:`on_queries` and :meth:`on_registered`)::

        class Counter(AsyncStore):
            name = "counter"
            handles = ["counter/*"]
            initial_state = {"value": 0}

            @on("counter/add")
            async def add(self, state, payload, ctx):
                return {**state, "value": state["value"] + payload["by"]}

        await Counter().run()          # or: task = await store.start(); ...; await store.stop()

    Actions are handled one at a time, in order, on the event loop; while an ``async`` handler awaits, the
    connection keeps answering heartbeats, and :meth:`publish` from other tasks waits until the action is
    answered. Every call that talks to fluxd is a coroutine (:meth:`publish`, :meth:`stop`).

    Reconnecting, adopting the retained snapshot and skipping actions already in it work as in :class:`Store`.
    """

    def __init__(self, socket_path: Optional[str] = None, client_name: Optional[str] = None,
                 expected_server_uid: Optional[int] = None, unhandled: Optional[str] = None,
                 reconnect: ReconnectOption = None):
        super().__init__(socket_path, client_name, expected_server_uid, unhandled, reconnect)
        self.client: Optional[AsyncClient] = None
        self.registration: Optional[AsyncStoreRegistration] = None
        self._stopping = False
        self._lock: Optional[asyncio.Lock] = None
        self._lock_owner: Optional[asyncio.Task] = None
        self._ready: Optional[asyncio.Event] = None
        self._run_task: Optional[asyncio.Task] = None

    @property
    def ready(self) -> asyncio.Event:
        """Set once the store is registered (created on first use, on the running loop)."""
        if self._ready is None:
            self._ready = asyncio.Event()
        return self._ready

    # -- hooks --------------------------------------------------------------------------------------------------

    def on_queries(self, queries: List[ActiveQuery]) -> Any:
        """Called whenever the active queries change (may be ``async def``); default: nothing."""

    def on_registered(self, resumed: bool) -> Any:
        """Called each time registration is complete and the retained state adopted (may be ``async def``)."""

    # -- running ------------------------------------------------------------------------------------------------

    async def connect(self) -> AsyncClient:
        """Connects and registers (``registered``, adopt the retained snapshot, ``queries``)."""
        client = await AsyncClient.connect(self.socket_path, self.client_name, role="store",
                                           heartbeat=self.heartbeat, expected_server_uid=self.expected_server_uid,
                                           reconnect=self.reconnect, on_connection_event=self.on_connection_event)
        self._starting = True
        try:
            registration = await client.register(self.name, self.handles, self.wait_for, self.initial_state,
                                                 self.query_deltas, confirm=False)
            registration.offer_state = self._state_to_offer
            self.client, self.registration = client, registration
            self._begin_registration({"version": registration.version, "seq": registration.seq,
                                      "resumed": registration.resumed})
            while self._registering:
                msg = await registration.next(timeout=client.timeout)
                if msg is None:  # stop() during registration
                    break
                if msg.get("op") == Op.ERROR:
                    raise FluxError.from_frame(msg)
                await self._handle(msg)  # (not handle_message, as in Store.connect)
        except BaseException:
            self.client = self.registration = None
            await client.close()
            raise
        finally:
            self._starting = False
        return client

    async def run(self) -> None:
        """Connects, registers and serves actions until :meth:`stop` or the connection ends."""
        self._run_task = asyncio.current_task()
        if self.client is None:
            await self.connect()
        client, registration = self.client, self.registration
        assert client is not None and registration is not None
        try:
            while not self._stopping:
                msg = await registration.next()
                if msg is None:
                    break
                await self.handle_message(msg)
        except Disconnected:
            if not self._stopping:
                raise
        finally:
            if self._stopping:
                await client.close()

    async def start(self) -> "asyncio.Task[None]":
        """Connects, registers, then serves in a task (returned) on the running loop."""
        await self.connect()
        self._run_task = asyncio.ensure_future(self.run())
        return self._run_task

    async def stop(self) -> None:
        """Asks :meth:`run` to return, and waits until it has closed the connection."""
        self._stopping = True
        if self.registration is not None:
            self.registration.interrupt()
        task = self._run_task
        if task is not None and task is not asyncio.current_task():
            with contextlib.suppress(Disconnected, asyncio.CancelledError):
                await task
        elif task is None and self.client is not None:
            await self.client.close()

    async def publish(self, state: Any) -> None:
        """Publishes a new full state outside an action (``state`` op); nothing is sent if it is unchanged.
        Raises :class:`~fluxbus.errors.NotSentError` while reconnecting, as :meth:`Store.publish`."""
        async with self._locked():
            if self.registration is None:
                raise self._not_connected()
            if self._pending_publication(state):
                return
            registration = self.registration
            saved = self._saved()
            change = self._published_change(state)
            if change is None:
                return
            try:
                if "patch" in change:
                    await registration.publish_patch(change["patch"], change.get("base"))
                else:
                    await registration.publish(change["state"])
            except BaseException:
                self._restore(saved)
                raise

    # -- handling -----------------------------------------------------------------------------------------------

    async def handle_message(self, msg: Dict[str, Any]) -> None:
        """Handles one message fluxd sent the store (after registration): actions, ``queries``, and after a
        reconnection ``registered`` again and the snapshot to adopt."""
        await self._handle(msg)

    async def _handle(self, msg: Dict[str, Any]) -> None:
        op = msg.get("op")
        if op == Op.ACTION:
            await self._handle_action(msg)
        elif op in (Op.QUERIES, Op.QUERIES_CHANGED):
            completing = self._registering and op == Op.QUERIES
            if completing:
                await self._finish_registration()
            await self._queries(msg)
            if completing:
                self._registering = False
                await _maybe_await(self.on_registered(self._resumed))
                self.ready.set()
        elif op == Op.SNAPSHOT:
            async with self._locked():
                self._adopt(msg)
        elif op == Op.REGISTERED:
            async with self._locked():
                self._begin_registration(msg)
        elif op == Op.ERROR:
            error = FluxError.from_frame(msg)
            if self._retry_registration(error):
                return
            log.warning("store %s: fluxd refused an answer, state or registration: %s", self.name, error)
            assert self.client is not None
            self.client.errors.put_nowait(error)

    @contextlib.asynccontextmanager
    async def _locked(self) -> AsyncIterator[None]:
        """The store's state lock; taken again by the task that holds it (a handler that publishes) it is a
        no-op."""
        task = asyncio.current_task()
        if self._lock_owner is not None and self._lock_owner is task:
            yield
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            self._lock_owner = task
            try:
                yield
            finally:
                self._lock_owner = None

    async def _handle_action(self, msg: Dict[str, Any]) -> None:
        assert self.client is not None and self.registration is not None
        ctx = ActionContext(self, msg)
        handler = self.handler_for(ctx.type)
        payload = msg.get("payload")
        async with self._locked():
            if self._already_applied(ctx):
                await self.registration.done(ctx.seq)
                return
            if handler is None:
                kind, body = self._unhandled_answer(ctx)
            else:
                try:
                    result = await _maybe_await(handler(self._handler_state(), payload, ctx))
                    kind, body = self._result_answer(ctx, result)
                except Exception as error:  # a bug in a handler must not wedge the store
                    kind, body = self._failure_answer(ctx, error, payload)
            if kind == "done":
                answered = await self.registration.done(ctx.seq, **(body or {}))
            else:
                answered = await self.registration.reject(ctx.seq, body)
        if kind == "done" and answered:  # not when the action's connection was lost: it comes again
            for follow_type, follow_payload in ctx.follow_ups:
                await self.client.dispatch(follow_type, follow_payload, cause=ctx.seq)

    async def _queries(self, msg: Dict[str, Any]) -> None:
        await _maybe_await(self.on_queries(self._apply_queries(msg)))

    async def _finish_registration(self) -> None:
        """As :meth:`Store._finish_registration`: publishes the state when fluxd retains none (SPEC §16.6), then
        confirms the registration once fluxd has taken it."""
        registration = self.registration
        assert registration is not None
        async with self._locked():
            publication, self._to_publish = self._to_publish, None
            if publication is None:
                registration.confirm()
                return
            try:
                while (piece := self._next_piece(publication)) is not None:
                    kind, body, base = piece
                    if kind == "state":
                        await registration.publish(body)
                    else:
                        await registration.publish_patch(body, base)
                    self._piece_sent(publication, piece)
            except StateTooLargeError as error:
                self._unpublishable(error)
                return
            except NotSentError:
                return  # the connection is gone: the next registration goes on (SPEC §16.6)
        if await registration.barrier():
            registration.confirm()
            if self._publication is publication:
                self._publication = None

    def _keep_error(self, error: FluxError) -> None:
        assert self.client is not None
        self.client.errors.put_nowait(error)
