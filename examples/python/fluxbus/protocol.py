"""The wire vocabulary of protocol 1 in one place: ops (by direction), roles, store and result statuses, worker
states and error codes.

The source of truth is ``protocol/``: ``schemas/index.json`` lists every (op, direction) and the schemas' enums
give the roles and statuses; the first column of the table in ``SPEC.md`` §11 lists the error codes.
``tests/test_protocol.py`` fails when this module and ``protocol/`` disagree.
"""
from __future__ import annotations

from typing import FrozenSet, Tuple

PROTOCOL_VERSION = 1


class Op:
    """Every ``op`` of protocol 1 (some names are used in two directions, e.g. ``info`` and ``ping``)."""
    ACCEPTED = "accepted"
    ACTION = "action"
    BYE = "bye"
    DELTA = "delta"
    DISPATCH = "dispatch"
    DONE = "done"
    ERROR = "error"
    EVENT = "event"
    FORGET = "forget"
    FORGOTTEN = "forgotten"
    GET = "get"
    GOT = "got"
    HELLO = "hello"
    HISTORY = "history"
    INFO = "info"
    MISSED = "missed"
    PATCH = "patch"
    PING = "ping"
    PONG = "pong"
    QUERIES = "queries"
    QUERIES_CHANGED = "queries-changed"
    QUERY = "query"
    QUERY_OK = "query-ok"
    RECOVER = "recover"
    RECOVERED = "recovered"
    REGISTER = "register"
    REGISTERED = "registered"
    REJECT = "reject"
    RELOAD = "reload"
    RELOADED = "reloaded"
    RESTART_WORKER = "restart-worker"
    SETTLED = "settled"
    SNAPSHOT = "snapshot"
    STATE = "state"
    STATE_AT = "state-at"
    STOP_WORKER = "stop-worker"
    STORE_DOWN = "store-down"
    STORE_UP = "store-up"
    SUBSCRIBE = "subscribe"
    SUBSCRIBED = "subscribed"
    SUBTREE = "subtree"
    UNQUERY = "unquery"
    UNQUERY_OK = "unquery-ok"
    UNREGISTER = "unregister"
    UNSUBSCRIBE = "unsubscribe"
    UNSUBSCRIBED = "unsubscribed"
    WELCOME = "welcome"
    WORKER = "worker"
    WORKERS = "workers"


#: Ops any peer sends to fluxd (direction ``c2d`` of ``schemas/index.json``).
OPS_TO_FLUXD: FrozenSet[str] = frozenset({
    Op.BYE, Op.DISPATCH, Op.FORGET, Op.GET, Op.HELLO, Op.HISTORY, Op.INFO, Op.PING, Op.PONG, Op.QUERY, Op.RECOVER,
    Op.RELOAD, Op.RESTART_WORKER, Op.STATE_AT, Op.STOP_WORKER, Op.SUBSCRIBE, Op.UNQUERY, Op.UNSUBSCRIBE, Op.WORKERS,
})
#: Ops only a store-role peer sends to fluxd (``s2d``).
OPS_FROM_STORE: FrozenSet[str] = frozenset({Op.DONE, Op.PATCH, Op.REGISTER, Op.REJECT, Op.STATE, Op.UNREGISTER})
#: Ops fluxd sends to a peer (``d2c``).
OPS_FROM_FLUXD: FrozenSet[str] = frozenset({
    Op.ACCEPTED, Op.ACTION, Op.BYE, Op.DELTA, Op.ERROR, Op.EVENT, Op.FORGOTTEN, Op.GOT, Op.HISTORY, Op.INFO, Op.MISSED, Op.PING, Op.PONG, Op.QUERIES,
    Op.QUERIES_CHANGED, Op.QUERY_OK, Op.RECOVERED, Op.REGISTERED, Op.RELOADED, Op.SETTLED, Op.SNAPSHOT, Op.STATE_AT,
    Op.STORE_DOWN, Op.STORE_UP, Op.SUBSCRIBED, Op.SUBTREE, Op.UNQUERY_OK, Op.UNSUBSCRIBED, Op.WELCOME, Op.WORKER, Op.WORKERS,
})
#: Direction name (as in ``schemas/index.json``) -> the ops sent that way.
OPS_BY_DIRECTION = {"c2d": OPS_TO_FLUXD, "s2d": OPS_FROM_STORE, "d2c": OPS_FROM_FLUXD}


class Role:
    """``hello.role`` (SPEC §1, §8.1)."""
    CLIENT = "client"
    STORE = "store"
    MONITOR = "monitor"


ROLES: Tuple[str, ...] = (Role.CLIENT, Role.STORE, Role.MONITOR)


class StoreStatus:
    """A store as a subscriber sees it (``subscribed.status``; ``store-up``/``store-down`` change it)."""
    UP = "up"            #: owned by a live connection
    DOWN = "down"        #: registered before, its owner is gone
    UNKNOWN = "unknown"  #: never registered (in this fluxd run)


STORE_STATUSES: Tuple[str, ...] = (StoreStatus.UP, StoreStatus.DOWN, StoreStatus.UNKNOWN)


class ResultStatus:
    """One target store's result in ``settled`` (SPEC §8.3)."""
    DONE = "done"
    REJECTED = "rejected"
    UNAVAILABLE = "unavailable"


RESULT_STATUSES: Tuple[str, ...] = (ResultStatus.DONE, ResultStatus.REJECTED, ResultStatus.UNAVAILABLE)

class RecoverStatus:
    """One outcome of ``recovered`` (SPEC §8.12, §15.4)."""
    SETTLED = "settled"  #: the action's seq and results, as ``settled`` carries them
    PENDING = "pending"  #: accepted, not final yet: its ``settled`` follows on this connection
    UNKNOWN = "unknown"  #: fluxd never accepted a dispatch with this id in this session: it was not sent


RECOVER_STATUSES: Tuple[str, ...] = (RecoverStatus.SETTLED, RecoverStatus.PENDING, RecoverStatus.UNKNOWN)

#: ``welcome.durability`` (SPEC §8.12): a durable fluxd's sync mode, or ``ephemeral`` (memory only).
DURABILITY_MODES: Tuple[str, ...] = ("always", "batch", "none", "ephemeral")

#: ``bye.reason`` of a durable fluxd that stops: its accepted actions continue when it runs again (SPEC §8.12).
BYE_RESTART = "restart"
#: ``bye.reason`` of a fluxd that exits: every action it accepted was settled before this ``bye`` (SPEC §8.8).
BYE_SHUTDOWN = "shutdown"

#: A supervised worker's ``state`` (``worker``/``workers`` replies, SPEC §8.11).
WORKER_STATES: Tuple[str, ...] = ("starting", "running", "backing-off", "stopping", "stopped", "failed")


class ErrorCode:
    """The error codes of SPEC §11, in the table's order. Receivers handle other codes generically (§13)."""
    BAD_FRAME = "bad-frame"
    TOO_LARGE = "too-large"
    BAD_JSON = "bad-json"
    BAD_MESSAGE = "bad-message"
    UNKNOWN_OP = "unknown-op"
    HANDSHAKE_REQUIRED = "handshake-required"
    UNSUPPORTED_VERSION = "unsupported-version"
    TIMEOUT = "timeout"
    FORBIDDEN = "forbidden"
    NAME_TAKEN = "name-taken"
    CYCLE = "cycle"
    UNKNOWN_STORE = "unknown-store"
    NO_HANDLER = "no-handler"
    OVERLOADED = "overloaded"
    STORE_UNAVAILABLE = "store-unavailable"
    SHUTTING_DOWN = "shutting-down"
    UNKNOWN_WORKER = "unknown-worker"
    STORE_IS_UP = "store-is-up"
    RELOAD_REFUSED = "reload-refused"
    OUTCOME_QUOTA = "outcome-quota"
    DISK_QUOTA = "disk-quota"
    SLOW_CONSUMER = "slow-consumer"
    LIMIT_EXCEEDED = "limit-exceeded"
    TOO_MANY_CONNECTIONS = "too-many-connections"
    MEMORY_BUDGET = "memory-budget"
    UNRESPONSIVE = "unresponsive"
    DISK_FULL = "disk-full"
    JOURNAL_FAILED = "journal-failed"
    NOT_RETAINED = "not-retained"
    PATCH_FAILED = "patch-failed"


#: Every code of the SPEC §11 table, in its order.
ERROR_CODES: Tuple[str, ...] = (
    ErrorCode.BAD_FRAME, ErrorCode.TOO_LARGE, ErrorCode.BAD_JSON, ErrorCode.BAD_MESSAGE, ErrorCode.UNKNOWN_OP,
    ErrorCode.HANDSHAKE_REQUIRED, ErrorCode.UNSUPPORTED_VERSION, ErrorCode.TIMEOUT, ErrorCode.FORBIDDEN,
    ErrorCode.NAME_TAKEN, ErrorCode.CYCLE, ErrorCode.UNKNOWN_STORE, ErrorCode.NO_HANDLER, ErrorCode.OVERLOADED,
    ErrorCode.STORE_UNAVAILABLE, ErrorCode.SHUTTING_DOWN, ErrorCode.UNKNOWN_WORKER, ErrorCode.STORE_IS_UP,
    ErrorCode.RELOAD_REFUSED,
    ErrorCode.OUTCOME_QUOTA, ErrorCode.DISK_QUOTA, ErrorCode.SLOW_CONSUMER,
    ErrorCode.LIMIT_EXCEEDED, ErrorCode.TOO_MANY_CONNECTIONS, ErrorCode.MEMORY_BUDGET, ErrorCode.UNRESPONSIVE,
    ErrorCode.DISK_FULL, ErrorCode.JOURNAL_FAILED, ErrorCode.NOT_RETAINED, ErrorCode.PATCH_FAILED,
)

# Codes the store libraries (Swift, Python, Node) put in a ``reject``'s error object. Not SPEC §11 codes: a
# store's codes are its own (§8.3); these are the ones every FluxBus store library uses alike.
#: A handler raised an exception that is not a deliberate rejection.
STORE_ERROR = "store/error"
#: A store rejected an action whose payload lacks what its handler needs (SPEC §8.3, informative).
STORE_BAD_PAYLOAD = "store/bad-payload"
#: The action's type matches the store's ``handles`` patterns but no handler of the store.
STORE_UNHANDLED_ACTION = "store/unhandled-action"
