"""FluxBus for Python: clients and store workers for fluxd (wire protocol 1, ``protocol/SPEC.md``).

Standard library only, Python 3.9+.

- :class:`Client` (``fluxbus.client``): synchronous client.
- :class:`AsyncClient` (``fluxbus.aio``): asyncio client.
- :class:`Store`, :func:`on`, :class:`Reject` (``fluxbus.store``): write a store worker.
- ``fluxbus.wire``: frames, the strict envelope check, message types, :class:`FluxError`.
"""
from .aio import AsyncClient, AsyncQueryReceipt, AsyncSubscription
from .client import Client, QueryReceipt, Subscription, connect
from .store import ActionContext, Reject, Store, on
from .wire import (LIMIT_EXCEEDED, MEMORY_BUDGET, TOO_MANY_CONNECTIONS, UNRESPONSIVE, WRONG_SERVER_UID, ActiveQuery,
                   Disconnected, Envelope, EnvelopeError, FluxError, FrameDecoder, QuerySet, Settlement, Snapshot,
                   StoreResult, SubscriptionEvent, Welcome, check_envelope, default_socket_path, expected_server_uid)

__all__ = [
    "LIMIT_EXCEEDED", "MEMORY_BUDGET", "TOO_MANY_CONNECTIONS", "UNRESPONSIVE", "WRONG_SERVER_UID",
    "ActionContext", "ActiveQuery", "AsyncClient", "AsyncQueryReceipt", "AsyncSubscription", "Client",
    "Disconnected", "Envelope", "EnvelopeError", "FluxError", "FrameDecoder", "QueryReceipt", "QuerySet", "Reject",
    "Settlement", "Snapshot", "Store", "StoreResult", "Subscription", "SubscriptionEvent", "Welcome",
    "check_envelope", "connect", "default_socket_path", "expected_server_uid", "on",
]
__version__ = "0.1.0"
