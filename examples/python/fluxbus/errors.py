"""The exceptions of the fluxbus package, keyed by the protocol's error codes (SPEC §11).

Every exception is a :class:`FluxError` (``.code``, ``.message``, ``.fatal``, ``.ref``)::

    FluxError
    ├── one subclass per SPEC §11 code: BadFrameError ... UnresponsiveError (see ERROR_CLASSES)
    ├── ActionRejectedError       a target store rejected a settled action (the store's code and message)
    ├── FluxConnectionError       no connection: nothing listens at the path, ... (code ``no-fluxd``)
    │   ├── Disconnected          the connection ended; calls on it raise this (code ``disconnected``)
    │   ├── WrongServerUIDError   fluxd runs as another uid than expected (``wrong-server-uid``)
    │   ├── TooManyConnectionsError   fluxd refused the connection (``too-many-connections``)
    │   ├── NotSentError          a dispatch lost with the connection never reached fluxd (``not-sent``)
    │   └── OutcomeUnknownError   a dispatch lost with the connection may or may not have been accepted
    │                             (``outcome-unknown``)
    ├── StateTooLargeError        a store's state cannot be published in frames of ``maxFrame`` bytes
    │                             (``state-too-large``, SPEC §16.6)
    └── FluxTimeoutError          a call's time ran out; also a builtin ``TimeoutError`` (code ``timed-out``)

An error fluxd sends becomes the class of its code (:func:`error_class`); a code this library does not know
becomes a plain :class:`FluxError` (SPEC §11: receivers handle unknown codes generically, by ``fatal``).
"""
from __future__ import annotations

import errno as _errno
import os
import stat
from typing import Any, Dict, Mapping, Optional, Type

from .protocol import ErrorCode

#: Codes of errors this library raises itself (never sent by fluxd).
NO_FLUXD = "no-fluxd"
DISCONNECTED = "disconnected"
TIMED_OUT = "timed-out"
WRONG_SERVER_UID = "wrong-server-uid"
NOT_SENT = "not-sent"
OUTCOME_UNKNOWN = "outcome-unknown"
STATE_TOO_LARGE = "state-too-large"

_DESCRIPTIONS = {
    ErrorCode.LIMIT_EXCEEDED: "a per-connection limit of fluxd was reached (live queries, query bytes, "
                              "subscriptions or waitFor stores; see welcome.limits); the request was refused, the "
                              "connection stays",
    ErrorCode.TOO_MANY_CONNECTIONS: "fluxd refused the connection: too many connections (in total, for this user "
                                    "or in the handshake), or no room in its memory budget",
    ErrorCode.UNRESPONSIVE: "fluxd closed the connection as unresponsive: heartbeat pings went unanswered, or a "
                            "store left an action unanswered too long",
    ErrorCode.MEMORY_BUDGET: "fluxd's memory budget had no room for this peer's request or backlog (fatal: the "
                             "connection was closed; otherwise only the request was refused)",
}


class FluxError(Exception):
    """An ``error`` from fluxd (SPEC §8.9, codes in §11), or a failure of this library with a code of its own.

    Attributes: ``code`` (stable string), ``message`` (human text), ``fatal`` (fluxd closes the connection),
    ``ref`` (the offending request's id or store, if any). Catch a subclass for one code (e.g.
    :class:`NoHandlerError`) or ``FluxError`` for all; unknown codes arrive as a plain ``FluxError``.
    """

    #: The code instances of this class carry unless given another (set by each subclass).
    default_code = ""
    #: Whether ``str(error)`` starts with the code (not for this library's own errors whose message says all).
    _code_in_text = True

    def __init__(self, code: str, message: str = "", fatal: bool = False, ref: Optional[str] = None):
        text = f"{code}: {message}" if message and self._code_in_text else (message or code)
        if code in _DESCRIPTIONS:
            text += f" ({_DESCRIPTIONS[code]})"
        super().__init__(text)
        self.code = code
        self.message = message
        self.fatal = fatal
        self.ref = ref

    @classmethod
    def from_frame(cls, msg: Mapping[str, Any]) -> "FluxError":
        """The exception for an ``error`` message: an instance of :func:`error_class` of its code."""
        return error_from_code(str(msg.get("code", "")), str(msg.get("message", "")), msg.get("fatal") is True,
                               msg.get("ref") if isinstance(msg.get("ref"), str) else None)


class _CodedError(FluxError):
    """A FluxError whose class fixes the code: constructed as ``Cls(message, fatal=False, ref=None)``."""

    def __init__(self, message: str = "", fatal: bool = False, ref: Optional[str] = None,
                 code: Optional[str] = None):
        super().__init__(code or self.default_code, message, fatal, ref)


# -- connection and time ---------------------------------------------------------------------------------------

class FluxConnectionError(_CodedError):
    """No usable connection to fluxd. Raised by ``connect`` when nothing listens at the socket path (the message
    names the path, where it came from and what to do; ``path``, ``source`` and ``errno`` say the same for
    code), and the base of :class:`Disconnected`, :class:`WrongServerUIDError` and
    :class:`TooManyConnectionsError`."""
    default_code = NO_FLUXD
    _code_in_text = False

    def __init__(self, message: str = "", fatal: bool = True, ref: Optional[str] = None,
                 code: Optional[str] = None, path: Optional[str] = None, source: Optional[str] = None,
                 errno: Optional[int] = None):
        super().__init__(message, fatal, ref, code)
        self.path = path
        self.source = source
        self.errno = errno


class Disconnected(FluxConnectionError):
    """The connection to fluxd ended (closed locally, fluxd said ``bye``, or the socket dropped); every call on
    it raises this. ``code`` is ``disconnected``; when fluxd ended it with a fatal ``error`` (e.g.
    ``unresponsive``, ``memory-budget``, ``slow-consumer``), that error is :attr:`error` (``error.code`` says
    why)."""
    default_code = DISCONNECTED
    _code_in_text = True
    #: The ``reason`` of fluxd's ``bye`` when the connection ended with one (``shutdown``, ``restart``), else None.
    bye_reason: Optional[str] = None

    def __init__(self, message: str = "connection closed", error: Optional[FluxError] = None,
                 bye_reason: Optional[str] = None):
        super().__init__(message, True)
        self.error = error
        self.bye_reason = bye_reason


#: Another name for :class:`Disconnected`: a call on a connection that is not (or no longer) open.
NotConnectedError = Disconnected


class WrongServerUIDError(FluxConnectionError):
    """``connect`` refused fluxd: its listener runs as another uid than expected (``SO_PEERCRED``)."""
    default_code = WRONG_SERVER_UID
    _code_in_text = True


class NotSentError(FluxConnectionError):
    """A dispatch made with settlement did not reach fluxd: the connection was lost before fluxd accepted it
    (fluxd answered ``recover`` with ``unknown`` for its id, or it said ``bye`` before reading it, SPEC §8.8,
    §15.4). Nothing happened; the caller may dispatch it again. Code ``not-sent``; ``ref`` is the dispatch id.
    Not fatal: the client carries on (it has reconnected, or is reconnecting)."""
    default_code = NOT_SENT
    _code_in_text = True

    def __init__(self, message: str = "", fatal: bool = False, ref: Optional[str] = None,
                 code: Optional[str] = None):
        super().__init__(message, fatal, ref, code)


#: Another name for :class:`NotSentError`.
NotSent = NotSentError


class OutcomeUnknownError(FluxConnectionError):
    """A dispatch made with settlement was sent, the connection was lost before its settlement, and fluxd cannot
    say what became of it: a fluxd that restarted without its journal (a new ``welcome.epoch``, or an older fluxd
    without sessions), one that refused ``recover``, or a client that stopped reconnecting. The action may or may
    not have been accepted and applied. Code ``outcome-unknown``; ``ref`` is the dispatch id."""
    default_code = OUTCOME_UNKNOWN
    _code_in_text = True

    def __init__(self, message: str = "", fatal: bool = False, ref: Optional[str] = None,
                 code: Optional[str] = None):
        super().__init__(message, fatal, ref, code)


class StateTooLargeError(_CodedError, ValueError):
    """A store's state cannot be published within fluxd's ``welcome.limits.maxFrame`` (SPEC §16.6): a root that is
    a string or number, or one string or number (or member name) whose ``add`` alone does not fit in a frame, or
    a fluxd that does not take patches (older than 0.4.0) for a state larger than one frame. Nothing was sent for
    it; the store does not retry. Code ``state-too-large``; ``ref`` is the store. Also a :class:`ValueError`."""
    default_code = STATE_TOO_LARGE
    _code_in_text = True


class FluxTimeoutError(_CodedError, TimeoutError):
    """A call did not finish within its timeout (which covers the whole call: sending, the reply and any wait).
    Also a builtin :class:`TimeoutError`, so ``except TimeoutError`` catches it. Code ``timed-out``."""
    default_code = TIMED_OUT
    _code_in_text = False

    def __init__(self, message: str = "", fatal: bool = False, ref: Optional[str] = None,
                 code: Optional[str] = None):
        super().__init__(message, fatal, ref, code)


# -- a store's rejection ---------------------------------------------------------------------------------------

class ActionRejectedError(FluxError):
    """A target store rejected the action (a ``rejected`` result of ``settled``), raised by
    ``Settlement.raise_for_status()``. ``code`` and ``message`` are the store's own (e.g. ``todo/empty-title``,
    ``store/unhandled-action``), :attr:`error` the whole error object it sent (extra members included),
    :attr:`store` the store, :attr:`seq` the action's seq."""

    def __init__(self, store: str, error: Mapping[str, Any], seq: Optional[int] = None):
        code = error.get("code") if isinstance(error.get("code"), str) else ""
        message = error.get("message") if isinstance(error.get("message"), str) else ""
        super().__init__(code, message, False, None)
        self.args = (f"store {store!r} rejected the action: {code}" + (f": {message}" if message else ""),)
        self.store = store
        self.error: Dict[str, Any] = dict(error)
        self.seq = seq

    @property
    def details(self) -> Dict[str, Any]:
        """The members of the store's error object besides ``code`` and ``message``."""
        return {k: v for k, v in self.error.items() if k not in ("code", "message")}


# -- one class per SPEC §11 code -------------------------------------------------------------------------------

class BadFrameError(_CodedError):
    """``bad-frame``: a zero-length frame (the connection survives)."""
    default_code = ErrorCode.BAD_FRAME


class FrameTooLargeError(_CodedError):
    """``too-large``: a frame longer than ``welcome.limits["maxFrame"]`` (the connection is closed)."""
    default_code = ErrorCode.TOO_LARGE


class BadJSONError(_CodedError):
    """``bad-json``: a frame body that is not valid JSON (SPEC §3.2)."""
    default_code = ErrorCode.BAD_JSON


class BadMessageError(_CodedError):
    """``bad-message``: valid JSON but not a valid message (missing or ill-typed field, bad name, ...)."""
    default_code = ErrorCode.BAD_MESSAGE


class UnknownOpError(_CodedError):
    """``unknown-op``: an ``op`` fluxd does not receive in protocol 1."""
    default_code = ErrorCode.UNKNOWN_OP


class HandshakeRequiredError(_CodedError):
    """``handshake-required``: the first frame was not a ``hello`` (closed)."""
    default_code = ErrorCode.HANDSHAKE_REQUIRED


class UnsupportedVersionError(_CodedError):
    """``unsupported-version``: ``hello.protocol`` is not one fluxd speaks (closed)."""
    default_code = ErrorCode.UNSUPPORTED_VERSION


class HandshakeTimeoutError(_CodedError):
    """``timeout``: fluxd got no ``hello`` within ``handshakeTimeout`` (closed). Not a :class:`FluxTimeoutError`:
    that one is a call of this library running out of time."""
    default_code = ErrorCode.TIMEOUT


class ForbiddenError(_CodedError):
    """``forbidden``: the op is not allowed for this role, or the store is not owned by this connection."""
    default_code = ErrorCode.FORBIDDEN


class NameTakenError(_CodedError):
    """``name-taken``: ``register`` of a store name a live connection owns."""
    default_code = ErrorCode.NAME_TAKEN


class CycleError(_CodedError):
    """``cycle``: ``register`` whose ``waitFor`` would make a cycle."""
    default_code = ErrorCode.CYCLE


class UnknownStoreError(_CodedError):
    """``unknown-store``: ``get`` of a store with no retained snapshot."""
    default_code = ErrorCode.UNKNOWN_STORE


class NoHandlerError(_CodedError):
    """``no-handler``: no registered store handles the dispatched action type."""
    default_code = ErrorCode.NO_HANDLER


class OverloadedError(_CodedError):
    """``overloaded``: too many unsettled actions from this connection, or a target store's queue is full."""
    default_code = ErrorCode.OVERLOADED


class StoreUnavailableError(_CodedError):
    """``store-unavailable``: a target store was down past ``queueTimeout`` or its queue was full (a settlement
    result; raised by ``Settlement.raise_for_status()``, with :attr:`store` set)."""
    default_code = ErrorCode.STORE_UNAVAILABLE
    store: Optional[str] = None


class ShuttingDownError(_CodedError):
    """``shutting-down``: fluxd is shutting down (a refused dispatch, or a settlement result cut short)."""
    default_code = ErrorCode.SHUTTING_DOWN
    store: Optional[str] = None


class UnknownWorkerError(_CodedError):
    """``unknown-worker``: ``restart-worker``/``stop-worker`` naming no worker of fluxd's config."""
    default_code = ErrorCode.UNKNOWN_WORKER


class ReloadRefusedError(_CodedError):
    """``reload-refused`` (since fluxd 0.4.0): ``reload`` changed nothing: no config file, a bad file, or a change
    that takes a restart (the message says which)."""
    default_code = ErrorCode.RELOAD_REFUSED


class OutcomeQuotaError(_CodedError):
    """``outcome-quota`` (since fluxd 0.4.0, SPEC §15.4): the dispatch was not sent: its user already holds
    ``maxOutcomes`` dispatch outcomes kept for ``recover`` (each for the outcome window after it settles)."""
    default_code = ErrorCode.OUTCOME_QUOTA


class DiskQuotaError(_CodedError):
    """``disk-quota`` (since fluxd 0.4.0, SPEC §15.2): this user holds its share of fluxd's journal
    (``--disk-per-user``); its new work is refused until checkpoints free it (a store's state outside an action
    closes the store; answers to accepted actions are still journaled)."""
    default_code = ErrorCode.DISK_QUOTA


class StoreIsUpError(_CodedError):
    """``store-is-up`` (since fluxd 0.4.0, SPEC §10): ``forget`` of a store that a live connection owns; only a
    store that is down can be forgotten."""
    default_code = ErrorCode.STORE_IS_UP


class SlowConsumerError(_CodedError):
    """``slow-consumer``: more than ``maxBacklog`` bytes waited unwritten for this connection (closed)."""
    default_code = ErrorCode.SLOW_CONSUMER


class LimitExceededError(_CodedError):
    """``limit-exceeded``: a per-connection limit of ``welcome.limits`` would be passed (the request is refused,
    the connection stays)."""
    default_code = ErrorCode.LIMIT_EXCEEDED


class TooManyConnectionsError(FluxConnectionError):
    """``too-many-connections``: fluxd refused the connection instead of sending ``welcome`` (closed). A
    :class:`FluxConnectionError` too: ``connect`` raises it."""
    default_code = ErrorCode.TOO_MANY_CONNECTIONS
    _code_in_text = True


class MemoryBudgetError(_CodedError):
    """``memory-budget``: fluxd's memory budget had no room for the request (or, fatal, for the connection)."""
    default_code = ErrorCode.MEMORY_BUDGET


class UnresponsiveError(_CodedError):
    """``unresponsive``: heartbeat pings went unanswered, or a store stalled (closed)."""
    default_code = ErrorCode.UNRESPONSIVE


class DiskFullError(_CodedError):
    """``disk-full``: a durable fluxd's journal disk is full; the dispatch (or a new store's registration) was
    refused, what was accepted before is kept, and fluxd accepts again once a journal write succeeds."""
    default_code = ErrorCode.DISK_FULL


class JournalFailedError(_CodedError):
    """``journal-failed``: a durable fluxd could not sync its journal; it accepts nothing more until restarted."""
    default_code = ErrorCode.JOURNAL_FAILED


class NotRetainedError(_CodedError):
    """``not-retained``: ``history`` or ``state-at`` asked for what the journal no longer keeps (or an ephemeral
    fluxd, which keeps none)."""
    default_code = ErrorCode.NOT_RETAINED


class PatchFailedError(_CodedError):
    """``patch-failed`` (since fluxd 0.4.0, SPEC §16.2): a store's patch did not apply, named a ``base`` that is not
    the retained version, or patched a store with no retained state. Fatal: fluxd closes the store's connection;
    the store library reconnects, registers again and adopts the retained snapshot."""
    default_code = ErrorCode.PATCH_FAILED


#: SPEC §11 code -> its exception class.
ERROR_CLASSES: Dict[str, Type[FluxError]] = {cls.default_code: cls for cls in (
    BadFrameError, FrameTooLargeError, BadJSONError, BadMessageError, UnknownOpError, HandshakeRequiredError,
    UnsupportedVersionError, HandshakeTimeoutError, ForbiddenError, NameTakenError, CycleError, UnknownStoreError,
    NoHandlerError, OverloadedError, StoreUnavailableError, ShuttingDownError, UnknownWorkerError, ReloadRefusedError,
    SlowConsumerError, LimitExceededError, TooManyConnectionsError, MemoryBudgetError, UnresponsiveError,
    DiskFullError, JournalFailedError, NotRetainedError, PatchFailedError, OutcomeQuotaError, DiskQuotaError,
    StoreIsUpError,
)}


def error_class(code: str) -> Type[FluxError]:
    """The exception class of an error code: the SPEC §11 code's subclass, else :class:`FluxError` itself (an
    unknown code is handled generically)."""
    return ERROR_CLASSES.get(code, FluxError)


def error_from_code(code: str, message: str = "", fatal: bool = False, ref: Optional[str] = None) -> FluxError:
    """An instance of :func:`error_class` of ``code``."""
    cls = error_class(code)
    if cls is FluxError:
        return FluxError(code, message, fatal, ref)
    return cls(message, fatal=fatal, ref=ref)  # type: ignore[call-arg]


# -- connect errors ----------------------------------------------------------------------------------------------

def _why_not_connected(path: str, error: OSError) -> str:
    code = error.errno
    if code == _errno.ECONNREFUSED or code == _errno.ENOTSOCK:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            mode = None
        if mode is not None and stat.S_ISDIR(mode):
            return "it is a directory, not a socket"
        if mode is not None and not stat.S_ISSOCK(mode):
            return "it is a file, not a socket"
        return "the socket exists but no fluxd is listening on it"
    if code == _errno.ENOENT:
        return "no such socket"
    if code == _errno.ENOTDIR:
        return "a part of the path is not a directory"
    if code in (_errno.EACCES, _errno.EPERM):
        return "permission denied"
    if code is None and "too long" in str(error):
        return f"the path is too long for a Unix socket ({len(os.fsencode(path))} bytes; at most 107)"
    return os.strerror(code) if code else str(error)


def connect_error(path: str, source: str, error: OSError) -> FluxConnectionError:
    """The error ``connect`` raises when the socket at ``path`` (which came from ``source``: ``socket_path``,
    ``$FLUXBUS_SOCKET``, ...) cannot be connected to: it says why and what to do, as fluxctl does."""
    why = _why_not_connected(path, error)
    suggested = path
    if why.startswith("it is a directory"):
        suggested = path.rstrip("/") + "/fluxd.sock"
    message = (f"no fluxd at {path} (from {source}): {why}\n"
               f"  start one with:  fluxd --socket {suggested}\n"
               f"  or point the client at a running one with socket_path=PATH or FLUXBUS_SOCKET=PATH")
    return FluxConnectionError(message, path=path, source=source, errno=error.errno)


def server_uid_error(path: str, actual: int, expected: int) -> WrongServerUIDError:
    """The refusal a client raises when fluxd's listener runs as ``actual`` instead of ``expected``."""
    return WrongServerUIDError(f"fluxd at {path} is run by uid {actual}, expected {expected}; "
                               f"set FLUXBUS_SERVER_UID={actual} to accept", True)
