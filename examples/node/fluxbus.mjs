// FluxBus for Node.js (18+, standard library only): a client with a Promise / async-iterator API, a Store base
// class for store workers, and the wire layer (frame decoder, strict envelope check). Protocol: protocol/SPEC.md.
// This file is the package entry: it re-exports the public API of the modules in lib/ (README.md has the layout).
export {
  PROTOCOL_VERSION, Ops, OpsByDirection, Roles, StoreStatus, ResultStatus, ErrorCodes, LocalErrorCodes, StoreErrorCodes,
  NAME_PATTERN, Limits,
} from './lib/constants.mjs';
export {
  FluxError, ErrorClasses, errorFromFrame, errorFromResult, StoreRejectedError, TimeoutError, ConnectionError,
  NoFluxdError, DisconnectedError, WrongServerUidError, WriteQueueFullError,
  BadFrameError, TooLargeError, BadJsonError, BadMessageError, UnknownOpError, HandshakeRequiredError,
  UnsupportedVersionError, HandshakeTimeoutError, ForbiddenError, NameTakenError, CycleError, UnknownStoreError,
  NoHandlerError, OverloadedError, StoreUnavailableError, ShuttingDownError, UnknownWorkerError, ReloadRefusedError, OutcomeQuotaError, DiskQuotaError, StoreIsUpError, SlowConsumerError,
  LimitExceededError, TooManyConnectionsError, MemoryBudgetError, UnresponsiveError, DiskFullError, JournalFailedError, NotRetainedError, PatchFailedError, NotSentError, OutcomeUnknownError,
  StateTooLargeError,
} from './lib/errors.mjs';
export { defaultSocketPath, resolveSocketPath, expectedServerUid, checkServerUid } from './lib/socket-path.mjs';
export { isValidStoreName, isValidActionType, isValidPattern, patternMatches } from './lib/names.mjs';
export { canonicalJSON } from './lib/canonical.mjs';
export { JSONNumber, isJSONNumber, numbersEqual, parseJSON } from './lib/json-number.mjs';
export { LOG_LEVELS, formatLogLine, createLogger, logSettings, describeError } from './lib/log.mjs';
export { encodeFrame, FrameDecoder } from './lib/framing.mjs';
export { EnvelopeError, checkEnvelope } from './lib/envelope.mjs';
export { Client, Settlement, DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT } from './lib/client.mjs';
export { DEFAULT_MAX_WRITE_QUEUE } from './lib/writer.mjs';
export { DEFAULT_RECONNECT, reconnectPolicy, backoffDelay } from './lib/reconnect.mjs';
export { Subscription, QueryReceipt } from './lib/subscription.mjs';
export { QuerySet } from './lib/query-set.mjs';
export { Reject, Store, Unhandled, HandlerState } from './lib/store.mjs';
export {
  PatchError, applyPatch, diff, jsonEqual, getPointer, hasPointer, parsePointer, formatPointer, escapeToken, unescapeToken, isValidPointer,
} from './lib/patch.mjs';
export { produce, isDraft } from './lib/draft.mjs';
