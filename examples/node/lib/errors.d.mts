// Types of errors.mjs: error classes keyed by the protocol's codes.
import type { ErrorCode } from './constants.mjs';
import type { StoreResult } from './client.mjs';

/** An `error` frame's fields as they come from fluxd. */
export interface ErrorFrame { op?: string; code?: unknown; message?: unknown; fatal?: unknown; ref?: unknown; supported?: unknown }

/** An error from fluxd or a local failure: `code` is stable, `detail` the text as sent, `fatal` whether the connection ended. */
export declare class FluxError extends Error {
  constructor(code: string, detail?: string, fatal?: boolean, ref?: string, cause?: Error);
  code: string;
  detail: string;
  fatal: boolean;
  ref: string | undefined;
  /** The error class for the frame's code (FluxError for codes this library does not know). */
  static fromFrame(msg: ErrorFrame): FluxError;
}

/** The class of one protocol code: constructed as `(detail, fatal, ref)`. */
declare class ProtocolError<C extends ErrorCode> extends FluxError {
  constructor(detail?: string, fatal?: boolean, ref?: string);
  code: C;
}

/** A call's deadline passed (code `timeout`). */
export declare class TimeoutError extends FluxError {
  constructor(detail: string, options?: { timeoutMs?: number; fatal?: boolean; ref?: string });
  static readonly code: 'timeout';
  code: 'timeout';
  timeoutMs: number | undefined;
}

export declare class BadFrameError extends ProtocolError<'bad-frame'> { static readonly code: 'bad-frame'; }
export declare class TooLargeError extends ProtocolError<'too-large'> { static readonly code: 'too-large'; }
export declare class BadJsonError extends ProtocolError<'bad-json'> { static readonly code: 'bad-json'; }
export declare class BadMessageError extends ProtocolError<'bad-message'> { static readonly code: 'bad-message'; }
export declare class UnknownOpError extends ProtocolError<'unknown-op'> { static readonly code: 'unknown-op'; }
export declare class HandshakeRequiredError extends ProtocolError<'handshake-required'> { static readonly code: 'handshake-required'; }
export declare class UnsupportedVersionError extends ProtocolError<'unsupported-version'> {
  constructor(detail?: string, fatal?: boolean, ref?: string, supported?: number[]);
  static readonly code: 'unsupported-version';
  /** The protocol versions fluxd speaks. */
  supported: number[];
}
/** fluxd's `timeout`: no hello within its handshakeTimeout (fatal). */
export declare class HandshakeTimeoutError extends TimeoutError {
  constructor(detail?: string, fatal?: boolean, ref?: string);
  static readonly code: 'timeout';
}
export declare class ForbiddenError extends ProtocolError<'forbidden'> { static readonly code: 'forbidden'; }
export declare class NameTakenError extends ProtocolError<'name-taken'> { static readonly code: 'name-taken'; }
export declare class CycleError extends ProtocolError<'cycle'> { static readonly code: 'cycle'; }
export declare class UnknownStoreError extends ProtocolError<'unknown-store'> { static readonly code: 'unknown-store'; }
export declare class NoHandlerError extends ProtocolError<'no-handler'> { static readonly code: 'no-handler'; }
export declare class OverloadedError extends ProtocolError<'overloaded'> { static readonly code: 'overloaded'; }
export declare class StoreUnavailableError extends ProtocolError<'store-unavailable'> { static readonly code: 'store-unavailable'; store?: string; }
export declare class ShuttingDownError extends ProtocolError<'shutting-down'> { static readonly code: 'shutting-down'; store?: string; }
export declare class UnknownWorkerError extends ProtocolError<'unknown-worker'> { static readonly code: 'unknown-worker'; }
export declare class ReloadRefusedError extends ProtocolError<'reload-refused'> { static readonly code: 'reload-refused'; }
export declare class OutcomeQuotaError extends ProtocolError<'outcome-quota'> { static readonly code: 'outcome-quota'; }
export declare class DiskQuotaError extends ProtocolError<'disk-quota'> { static readonly code: 'disk-quota'; }
export declare class StoreIsUpError extends ProtocolError<'store-is-up'> { static readonly code: 'store-is-up'; }
export declare class SlowConsumerError extends ProtocolError<'slow-consumer'> { static readonly code: 'slow-consumer'; }
export declare class LimitExceededError extends ProtocolError<'limit-exceeded'> { static readonly code: 'limit-exceeded'; }
export declare class TooManyConnectionsError extends ProtocolError<'too-many-connections'> { static readonly code: 'too-many-connections'; }
export declare class MemoryBudgetError extends ProtocolError<'memory-budget'> { static readonly code: 'memory-budget'; }
export declare class UnresponsiveError extends ProtocolError<'unresponsive'> { static readonly code: 'unresponsive'; }
export declare class DiskFullError extends ProtocolError<'disk-full'> { static readonly code: 'disk-full'; }
export declare class JournalFailedError extends ProtocolError<'journal-failed'> { static readonly code: 'journal-failed'; }
export declare class NotRetainedError extends ProtocolError<'not-retained'> { static readonly code: 'not-retained'; }
/** A store's patch did not apply to fluxd's retained state (SPEC §16.2): fatal; the store reconnects and adopts. */
export declare class PatchFailedError extends ProtocolError<'patch-failed'> { static readonly code: 'patch-failed'; }

/** The class of each code of SPEC §11. */
export declare const ErrorClasses: {
  readonly 'bad-frame': typeof BadFrameError; readonly 'too-large': typeof TooLargeError;
  readonly 'bad-json': typeof BadJsonError; readonly 'bad-message': typeof BadMessageError;
  readonly 'unknown-op': typeof UnknownOpError; readonly 'handshake-required': typeof HandshakeRequiredError;
  readonly 'unsupported-version': typeof UnsupportedVersionError; readonly timeout: typeof HandshakeTimeoutError;
  readonly forbidden: typeof ForbiddenError; readonly 'name-taken': typeof NameTakenError; readonly cycle: typeof CycleError;
  readonly 'unknown-store': typeof UnknownStoreError; readonly 'no-handler': typeof NoHandlerError;
  readonly overloaded: typeof OverloadedError; readonly 'store-unavailable': typeof StoreUnavailableError;
  readonly 'shutting-down': typeof ShuttingDownError; readonly 'unknown-worker': typeof UnknownWorkerError; readonly 'reload-refused': typeof ReloadRefusedError; readonly 'outcome-quota': typeof OutcomeQuotaError; readonly 'disk-quota': typeof DiskQuotaError; readonly 'store-is-up': typeof StoreIsUpError;
  readonly 'slow-consumer': typeof SlowConsumerError; readonly 'limit-exceeded': typeof LimitExceededError;
  readonly 'too-many-connections': typeof TooManyConnectionsError; readonly 'memory-budget': typeof MemoryBudgetError;
  readonly unresponsive: typeof UnresponsiveError; readonly 'disk-full': typeof DiskFullError;
  readonly 'journal-failed': typeof JournalFailedError; readonly 'not-retained': typeof NotRetainedError;
  readonly 'patch-failed': typeof PatchFailedError;
};

/** An `error` frame as an instance of its code's class (FluxError for unknown codes). */
export declare function errorFromFrame(msg: ErrorFrame): FluxError;

/** A settlement result a store rejected: the store's own code, message (`detail`) and other fields (`details`). */
export declare class StoreRejectedError extends FluxError {
  constructor(store: string, type: string | undefined, error?: { code?: string; message?: string; [field: string]: unknown });
  store: string;
  type: string | undefined;
  details: Record<string, unknown>;
}

/** The error a settlement result stands for, or undefined for `done`. */
export declare function errorFromResult(result: StoreResult, type?: string): FluxError | undefined;

/** The connection could not be made or was lost (fatal). */
export declare class ConnectionError extends FluxError {
  constructor(code: string, detail: string, cause?: Error);
  fatal: true;
}
/** Nothing accepted the connection: the message names the path, its source, why, and what to do. */
export declare class NoFluxdError extends ConnectionError {
  constructor(socketPath: string, source: string, reason: string, options?: { errno?: string; hint?: string; cause?: Error });
  code: 'no-fluxd';
  socketPath: string;
  source: string;
  reason: string;
  errno: string | undefined;
}
/** The connection ended; `cause` is fluxd's fatal error (or the socket's), if one ended it. */
export declare class DisconnectedError extends ConnectionError {
  constructor(detail: string, cause?: Error);
  code: 'disconnected';
  cause?: Error;
}
export declare class WrongServerUidError extends ConnectionError {
  constructor(detail: string);
  code: 'wrong-server-uid';
}
/** A fire-and-forget send found the write queue full; await `client.flush()` first. */
export declare class WriteQueueFullError extends FluxError {
  constructor(queuedBytes: number, limit: number);
  code: 'write-queue-full';
  queuedBytes: number;
  limit: number;
}
/** A dispatch that never reached fluxd (`recover` said `unknown`, or the client closed before writing it): nothing happened. */
export declare class NotSentError extends FluxError {
  constructor(id: string, detail: string, cause?: Error);
  code: 'not-sent';
  /** The dispatch's id. */
  id: string;
}
/** A store's state cannot be published in frames of `maxFrame` bytes (SPEC §16.6); the store does not retry. */
export declare class StateTooLargeError extends FluxError {
  constructor(store: string, detail: string, path?: string);
  code: 'state-too-large';
  store: string;
  /** The JSON Pointer of the value too large for a frame (undefined: the root). */
  path: string | undefined;
}
/** A dispatch sent before the connection was lost whose outcome fluxd cannot tell (new epoch, no `recover`, closed). */
export declare class OutcomeUnknownError extends FluxError {
  constructor(id: string, detail: string, cause?: Error);
  code: 'outcome-unknown';
  /** The dispatch's id. */
  id: string;
}
