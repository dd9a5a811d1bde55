"""FluxBus for Python: clients and store workers for fluxd (wire protocol 1, ``protocol/SPEC.md``).

Standard library only, Python 3.9+.

- :class:`Client` (``fluxbus.client``): synchronous client.
- :class:`AsyncClient` (``fluxbus.aio``): asyncio client; every call that talks to fluxd is a coroutine.
- :class:`Store`, :class:`AsyncStore`, :func:`on`, :class:`Reject` (``fluxbus.store``): write a store worker.
- ``fluxbus.errors``: :class:`FluxError` and one subclass per protocol error code, :class:`ActionRejectedError`,
  :class:`FluxConnectionError`, :class:`FluxTimeoutError`, :class:`NotSentError`, :class:`OutcomeUnknownError`.
- ``fluxbus.reconnect``: :class:`Reconnect` (how clients and stores reconnect) and :class:`ConnectionEvent`.
- ``fluxbus.protocol``: the wire vocabulary (ops, roles, statuses, error codes), checked against ``protocol/``.
- ``fluxbus.wire``: frames, the strict envelope check, message types.
- ``fluxbus.patch``: JSON Patch (RFC 6902) and JSON Pointer (RFC 6901): apply, diff, pointers (SPEC §16).
- ``fluxbus.pieces``: a state larger than one frame, published in pieces; the wait after a refused registration
  (SPEC §16.6).
- ``fluxbus.draft``: the change-recording drafts store handlers get.
- ``fluxbus.log_format``: fluxd's log format (docs/logging.md): :class:`FluxLogFormatter`, and
  :func:`configure_logging` for an application's ``main`` (the library logs to ``logging.getLogger("fluxbus")`` and
  ``"fluxbus.store"`` and never configures logging itself).
"""
from .aio import AsyncClient, AsyncQueryReceipt, AsyncStoreRegistration, AsyncSubscription
from .client import Client, QueryReceipt, StoreRegistration, Subscription, connect
from .errors import (ERROR_CLASSES, ActionRejectedError, BadFrameError, BadJSONError, BadMessageError, CycleError,
                     Disconnected, DiskFullError, JournalFailedError, NotRetainedError, PatchFailedError, FluxConnectionError, FluxError, FluxTimeoutError, ForbiddenError,
                     FrameTooLargeError, HandshakeRequiredError, HandshakeTimeoutError, LimitExceededError,
                     MemoryBudgetError, NameTakenError, NoHandlerError, NotConnectedError, NotSent, NotSentError,
                     OutcomeUnknownError, OverloadedError, ShuttingDownError, SlowConsumerError, StateTooLargeError,
                     StoreUnavailableError,
                     TooManyConnectionsError, UnknownOpError, UnknownStoreError, UnknownWorkerError, ReloadRefusedError, OutcomeQuotaError, DiskQuotaError, StoreIsUpError,
                     UnresponsiveError, UnsupportedVersionError, WrongServerUIDError, error_class)
from .protocol import (DURABILITY_MODES, ERROR_CODES, STORE_BAD_PAYLOAD, STORE_ERROR, STORE_UNHANDLED_ACTION, ErrorCode,
                       Op, RecoverStatus, ResultStatus, Role, StoreStatus)
from .reconnect import ConnectionEvent, Reconnect
from . import draft, log_format, patch
from .log_format import FluxLogFormatter, configure_logging
from .patch import PatchError, PointerError
from .number import JSONNumber  # noqa: F401 (exact JSON numbers, SPEC §16.1: fluxbus.number)
from .store import ActionContext, AsyncStore, Reject, Store, StoreBase, on
from .wire import (LIMIT_EXCEEDED, MEMORY_BUDGET, TOO_MANY_CONNECTIONS, UNRESPONSIVE, WRONG_SERVER_UID, ActiveQuery,
                   Envelope, EnvelopeError, FrameDecoder, QuerySet, Settlement, Snapshot, StoreResult, Subtree,
                   SubscriptionEvent, Welcome, check_envelope, default_socket_path, expected_server_uid)

__all__ = [
    # clients and stores
    "ActionContext", "AsyncClient", "AsyncQueryReceipt", "AsyncStore", "AsyncStoreRegistration",
    "AsyncSubscription", "Client", "QueryReceipt", "Reject", "Store", "StoreBase", "StoreRegistration",
    "Subscription", "connect", "on",
    # errors
    "ERROR_CLASSES", "ActionRejectedError", "BadFrameError", "BadJSONError", "BadMessageError", "CycleError",
    "Disconnected", "DiskFullError", "JournalFailedError", "NotRetainedError", "PatchFailedError", "FluxConnectionError", "FluxError", "FluxTimeoutError", "ForbiddenError", "FrameTooLargeError",
    "HandshakeRequiredError", "HandshakeTimeoutError", "LimitExceededError", "MemoryBudgetError", "NameTakenError",
    "NoHandlerError", "NotConnectedError", "NotSent", "NotSentError", "OutcomeUnknownError", "OverloadedError",
    "ShuttingDownError", "SlowConsumerError", "StateTooLargeError",
    "StoreUnavailableError", "TooManyConnectionsError", "UnknownOpError", "UnknownStoreError",
    "UnknownWorkerError", "ReloadRefusedError", "OutcomeQuotaError", "DiskQuotaError", "StoreIsUpError", "UnresponsiveError", "UnsupportedVersionError", "WrongServerUIDError", "error_class",
    # patches (SPEC §16)
    "PatchError", "PointerError", "draft", "patch",
    # reconnection
    "ConnectionEvent", "Reconnect",
    # logging in fluxd's format
    "FluxLogFormatter", "configure_logging", "log_format",
    # protocol vocabulary
    "DURABILITY_MODES", "ERROR_CODES", "STORE_BAD_PAYLOAD", "STORE_ERROR", "STORE_UNHANDLED_ACTION", "ErrorCode", "Op",
    "RecoverStatus", "ResultStatus", "Role", "StoreStatus", "LIMIT_EXCEEDED", "MEMORY_BUDGET", "TOO_MANY_CONNECTIONS", "UNRESPONSIVE", "WRONG_SERVER_UID",
    # wire types
    "ActiveQuery", "Envelope", "EnvelopeError", "FrameDecoder", "QuerySet", "Settlement", "Snapshot", "Subtree",
    "StoreResult", "SubscriptionEvent", "Welcome", "check_envelope", "default_socket_path", "expected_server_uid",
]
__version__ = "0.4.0"
