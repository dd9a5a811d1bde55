// Types of the package entry (fluxbus.mjs): the public API, module by module. Self-contained: no @types/node.
export {
  PROTOCOL_VERSION, Ops, OpsByDirection, Roles, StoreStatus, ResultStatus, ErrorCodes, LocalErrorCodes, StoreErrorCodes,
  NAME_PATTERN, Limits,
} from './lib/constants.mjs';
export type { C2DOp, S2DOp, D2COp, Op, Role, ErrorCode, LocalErrorCode, StoreErrorCode } from './lib/constants.mjs';
export {
  FluxError, ErrorClasses, errorFromFrame, errorFromResult, StoreRejectedError, TimeoutError, ConnectionError,
  NoFluxdError, DisconnectedError, WrongServerUidError, WriteQueueFullError,
  BadFrameError, TooLargeError, BadJsonError, BadMessageError, UnknownOpError, HandshakeRequiredError,
  UnsupportedVersionError, HandshakeTimeoutError, ForbiddenError, NameTakenError, CycleError, UnknownStoreError,
  NoHandlerError, OverloadedError, StoreUnavailableError, ShuttingDownError, UnknownWorkerError, ReloadRefusedError, OutcomeQuotaError, DiskQuotaError, StoreIsUpError, SlowConsumerError,
  LimitExceededError, TooManyConnectionsError, MemoryBudgetError, UnresponsiveError, DiskFullError, JournalFailedError, NotRetainedError, PatchFailedError, NotSentError, OutcomeUnknownError,
  StateTooLargeError,
} from './lib/errors.mjs';
export type { ErrorFrame } from './lib/errors.mjs';
export { defaultSocketPath, resolveSocketPath, expectedServerUid, checkServerUid } from './lib/socket-path.mjs';
export type { Environment } from './lib/socket-path.mjs';
export { isValidStoreName, isValidActionType, isValidPattern, patternMatches } from './lib/names.mjs';
export { canonicalJSON } from './lib/canonical.mjs';
export { JSONNumber, isJSONNumber, numbersEqual, parseJSON } from './lib/json-number.mjs';
export { LOG_LEVELS, formatLogLine, createLogger, logSettings, describeError } from './lib/log.mjs';
export type { Logger, LogLevel, LogMetadata, LoggerOptions, LogSettings, LineOptions, LogFormat } from './lib/log.mjs';
export { encodeFrame, FrameDecoder } from './lib/framing.mjs';
export type { FrameBytes, FrameEvent } from './lib/framing.mjs';
export { EnvelopeError, checkEnvelope } from './lib/envelope.mjs';
export { Client, Settlement, DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT } from './lib/client.mjs';
export type {
  Welcome, WelcomeLimits, StoreResult, Info, CallOptions, SubscribeOptions, DispatchOptions, SettleOptions, SendOptions,
  ConnectOptions, ClientEvents, ConnectionState, ReconnectingEvent, ReconnectedEvent, StoreRegisteredEvent,
} from './lib/client.mjs';
export { DEFAULT_MAX_WRITE_QUEUE } from './lib/writer.mjs';
export { DEFAULT_RECONNECT, reconnectPolicy, backoffDelay } from './lib/reconnect.mjs';
export type { ReconnectOptions, ReconnectPolicy } from './lib/reconnect.mjs';
export type { FrameWriter } from './lib/writer.mjs';
export type { PendingReplies } from './lib/pending.mjs';
export { Subscription, QueryReceipt } from './lib/subscription.mjs';
export type { Snapshot, StoreEvent } from './lib/subscription.mjs';
export { QuerySet } from './lib/query-set.mjs';
export type { ActiveQuery } from './lib/query-set.mjs';
export { Reject, Store, Unhandled, HandlerState } from './lib/store.mjs';
export {
  PatchError, applyPatch, diff, jsonEqual, getPointer, hasPointer, parsePointer, formatPointer, escapeToken, unescapeToken, isValidPointer,
} from './lib/patch.mjs';
export type { Patch, PatchOperation, PatchErrorCode } from './lib/patch.mjs';
export { produce, isDraft } from './lib/draft.mjs';
export type {
  ActionContext, Handler, HandlerOptions, PayloadCheck, PayloadFieldType, ErrorContext, StoreOptions, StartOptions,
} from './lib/store.mjs';
