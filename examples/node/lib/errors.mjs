// Errors, keyed by the protocol's error codes (SPEC §8.9, §11) as nats.js and the redis clients do: a FluxError
// base (`code`, `message`, `detail`, `fatal`, `ref`), one subclass per code of SPEC §11 (unknown codes stay the
// base class, as §13 asks), the settlement result a store rejected, and this library's own failures (connection,
// timeout, write queue).
import { ErrorCodes, LocalErrorCodes, ResultStatus } from './constants.mjs';

const DESCRIPTIONS = {
  'limit-exceeded': 'a per-connection limit of fluxd was reached (live queries, query bytes, subscriptions or waitFor stores; see welcome.limits); the request was refused, the connection stays',
  'too-many-connections': 'fluxd refused the connection: too many connections (in total, for this user or in the handshake), or no room in its memory budget',
  unresponsive: 'fluxd closed the connection as unresponsive: heartbeat pings went unanswered, or a store left an action unanswered too long',
  'memory-budget': "fluxd's memory budget had no room for this peer's request or backlog (fatal: the connection was closed; otherwise only the request was refused)",
};

/**
 * An `error` from fluxd (SPEC §8.9) or a local failure. `code` is stable; `detail` is fluxd's (or the store's)
 * text as sent; `message` is for people: `code: detail`, plus a short explanation for the codes that need one.
 * `fatal` says whether the connection ended. Unknown codes are valid (`errorFromFrame` gives them this class).
 */
export class FluxError extends Error {
  /** @param {string} code @param {string} [detail] @param {boolean} [fatal] @param {string} [ref] @param {Error} [cause] */
  constructor(code, detail = '', fatal = false, ref = undefined, cause = undefined) {
    const text = detail ? `${code}: ${detail}` : code;
    super(DESCRIPTIONS[code] ? `${text} (${DESCRIPTIONS[code]})` : text, cause ? { cause } : undefined);
    this.name = new.target.name;
    /** @type {string} */ this.code = code;
    /** @type {string} */ this.detail = detail;
    /** @type {boolean} */ this.fatal = fatal;
    /** @type {string|undefined} */ this.ref = ref;
  }
  /** The error class for an `error` frame's code (this class for unknown codes). @param {Record<string, any>} msg */
  static fromFrame(msg) { return errorFromFrame(msg); }
}

/** A class per protocol code: `static code`, constructed as `(detail, fatal, ref)`. */
const coded = (code) => class extends FluxError {
  static code = code;
  /** @param {string} [detail] @param {boolean} [fatal] @param {string} [ref] */
  constructor(detail = '', fatal = false, ref = undefined) { super(code, detail, fatal, ref); }
};

/** A call's deadline passed (code `timeout`, not fatal). `timeoutMs` is the limit the call was given. */
export class TimeoutError extends FluxError {
  /** @param {string} detail @param {{timeoutMs?: number, fatal?: boolean, ref?: string}} [options] */
  constructor(detail, { timeoutMs = undefined, fatal = false, ref = undefined } = {}) {
    super(LocalErrorCodes.TIMEOUT, detail, fatal, ref);
    this.message = detail;
    /** @type {number|undefined} */ this.timeoutMs = timeoutMs;
  }
}

export class BadFrameError extends coded(ErrorCodes.BAD_FRAME) {}
export class TooLargeError extends coded(ErrorCodes.TOO_LARGE) {}
export class BadJsonError extends coded(ErrorCodes.BAD_JSON) {}
export class BadMessageError extends coded(ErrorCodes.BAD_MESSAGE) {}
export class UnknownOpError extends coded(ErrorCodes.UNKNOWN_OP) {}
export class HandshakeRequiredError extends coded(ErrorCodes.HANDSHAKE_REQUIRED) {}
/** `supported` lists the protocol versions fluxd speaks. */
export class UnsupportedVersionError extends coded(ErrorCodes.UNSUPPORTED_VERSION) {
  /** @param {string} [detail] @param {boolean} [fatal] @param {string} [ref] @param {number[]} [supported] */
  constructor(detail = '', fatal = true, ref = undefined, supported = []) { super(detail, fatal, ref); this.supported = supported; }
}
/** fluxd's `timeout`: no `hello` within its `handshakeTimeout` (fatal). A `TimeoutError`, so one catch takes both. */
export class HandshakeTimeoutError extends TimeoutError {
  static code = ErrorCodes.TIMEOUT;
  /** @param {string} [detail] @param {boolean} [fatal] @param {string} [ref] */
  constructor(detail = '', fatal = true, ref = undefined) {
    super(detail, { fatal, ref });
    this.message = detail ? `timeout: ${detail}` : 'timeout';
  }
}
export class ForbiddenError extends coded(ErrorCodes.FORBIDDEN) {}
export class NameTakenError extends coded(ErrorCodes.NAME_TAKEN) {}
export class CycleError extends coded(ErrorCodes.CYCLE) {}
export class UnknownStoreError extends coded(ErrorCodes.UNKNOWN_STORE) {}
export class NoHandlerError extends coded(ErrorCodes.NO_HANDLER) {}
export class OverloadedError extends coded(ErrorCodes.OVERLOADED) {}
export class StoreUnavailableError extends coded(ErrorCodes.STORE_UNAVAILABLE) {}
export class ShuttingDownError extends coded(ErrorCodes.SHUTTING_DOWN) {}
export class UnknownWorkerError extends coded(ErrorCodes.UNKNOWN_WORKER) {}
export class ReloadRefusedError extends coded(ErrorCodes.RELOAD_REFUSED) {}
export class OutcomeQuotaError extends coded(ErrorCodes.OUTCOME_QUOTA) {}
export class DiskQuotaError extends coded(ErrorCodes.DISK_QUOTA) {}
export class StoreIsUpError extends coded(ErrorCodes.STORE_IS_UP) {}
export class SlowConsumerError extends coded(ErrorCodes.SLOW_CONSUMER) {}
export class LimitExceededError extends coded(ErrorCodes.LIMIT_EXCEEDED) {}
export class TooManyConnectionsError extends coded(ErrorCodes.TOO_MANY_CONNECTIONS) {}
export class MemoryBudgetError extends coded(ErrorCodes.MEMORY_BUDGET) {}
export class UnresponsiveError extends coded(ErrorCodes.UNRESPONSIVE) {}
export class DiskFullError extends coded(ErrorCodes.DISK_FULL) {}
export class JournalFailedError extends coded(ErrorCodes.JOURNAL_FAILED) {}
export class NotRetainedError extends coded(ErrorCodes.NOT_RETAINED) {}
export class PatchFailedError extends coded(ErrorCodes.PATCH_FAILED) {}

/** The class of each code of SPEC §11. */
export const ErrorClasses = Object.freeze({
  'bad-frame': BadFrameError, 'too-large': TooLargeError, 'bad-json': BadJsonError, 'bad-message': BadMessageError,
  'unknown-op': UnknownOpError, 'handshake-required': HandshakeRequiredError,
  'unsupported-version': UnsupportedVersionError, timeout: HandshakeTimeoutError, forbidden: ForbiddenError,
  'name-taken': NameTakenError, cycle: CycleError, 'unknown-store': UnknownStoreError, 'no-handler': NoHandlerError,
  overloaded: OverloadedError, 'store-unavailable': StoreUnavailableError, 'shutting-down': ShuttingDownError,
  'unknown-worker': UnknownWorkerError, 'reload-refused': ReloadRefusedError, 'outcome-quota': OutcomeQuotaError, 'disk-quota': DiskQuotaError, 'store-is-up': StoreIsUpError, 'slow-consumer': SlowConsumerError, 'limit-exceeded': LimitExceededError,
  'too-many-connections': TooManyConnectionsError, 'memory-budget': MemoryBudgetError, unresponsive: UnresponsiveError,
  'disk-full': DiskFullError, 'journal-failed': JournalFailedError, 'not-retained': NotRetainedError,
  'patch-failed': PatchFailedError,
});

/** An `error` frame as an instance of its code's class (FluxError for codes this library does not know). */
export function errorFromFrame(msg) {
  const code = String(msg.code ?? '');
  const detail = String(msg.message ?? '');
  const fatal = msg.fatal === true;
  const ref = typeof msg.ref === 'string' ? msg.ref : undefined;
  const Class = Object.prototype.hasOwnProperty.call(ErrorClasses, code) ? ErrorClasses[code] : undefined;
  if (Class === UnsupportedVersionError) return new UnsupportedVersionError(detail, fatal, ref, Array.isArray(msg.supported) ? msg.supported : []);
  return Class ? new Class(detail, fatal, ref) : new FluxError(code, detail, fatal, ref);
}

/**
 * A settlement result a store rejected (`status: "rejected"`): `code` and `detail` are the store's own
 * (`Reject`'s, `store/unhandled-action`, `store/error`, ...), `details` any other fields of its error object.
 */
export class StoreRejectedError extends FluxError {
  /** @param {string} store @param {string|undefined} type @param {Record<string, any>} [error] the result's `error` */
  constructor(store, type, error = {}) {
    const { code = '', message = '', ...details } = error ?? {};
    super(String(code), String(message), false, store);
    /** @type {string} */ this.store = store;
    /** @type {string|undefined} */ this.type = type;
    /** @type {Record<string, any>} */ this.details = details;
    this.message = message ? `${message} (${code}, store '${store}')` : `store '${store}' rejected ${type ?? 'the action'} (${code})`;
  }
}

/**
 * The error a settlement result stands for, or undefined for `done`: `StoreRejectedError` for `rejected`, the
 * code's class (`StoreUnavailableError`, `ShuttingDownError`, ...) with `store` set for `unavailable`.
 * @param {{store: string, status: string, error?: Record<string, any>}} result @param {string} [type]
 */
export function errorFromResult(result, type) {
  if (result.status === ResultStatus.DONE) return undefined;
  if (result.status === ResultStatus.REJECTED) return new StoreRejectedError(result.store, type, result.error);
  const error = errorFromFrame({ code: result.error?.code ?? result.status, message: result.error?.message ?? '', ref: result.store });
  error.store = result.store;
  return error;
}

/** The connection could not be made or was lost (always fatal for the connection). */
export class ConnectionError extends FluxError {
  /** @param {string} code @param {string} detail @param {Error} [cause] */
  constructor(code, detail, cause = undefined) { super(code, detail, true, undefined, cause); }
}

/**
 * Nothing accepted the connection at the socket path. `message` names the path, where it came from (`source`),
 * why (`reason`: "no such socket", "the socket exists but no fluxd is listening on it", "is a directory, not a
 * socket", ...) and what to do; `errno` is the system's code (ENOENT, ECONNREFUSED, ...).
 */
export class NoFluxdError extends ConnectionError {
  /** @param {string} socketPath @param {string} source @param {string} reason @param {{errno?: string, hint?: string, cause?: Error}} [options] */
  constructor(socketPath, source, reason, { errno = undefined, hint = undefined, cause = undefined } = {}) {
    const text = `no fluxd at ${socketPath} (from ${source}): ${reason}\n`
      + `  start one with:  fluxd --socket ${hint ?? socketPath}\n`
      + '  or point the client at a running one with { socketPath: PATH } or FLUXBUS_SOCKET=PATH';
    super(LocalErrorCodes.NO_FLUXD, text, cause);
    this.message = text;
    /** @type {string} */ this.socketPath = socketPath;
    /** @type {string} */ this.source = source;
    /** @type {string} */ this.reason = reason;
    /** @type {string|undefined} */ this.errno = errno;
  }
}

/** The connection ended (closed locally, fluxd said bye, the socket dropped). `cause`: fluxd's fatal error, if any. */
export class DisconnectedError extends ConnectionError {
  /** @param {string} detail @param {Error} [cause] */
  constructor(detail, cause = undefined) { super(LocalErrorCodes.DISCONNECTED, detail, cause); }
}

/** fluxd's socket is not owned by the expected uid (checked before hello; see `expectedServerUid`). */
export class WrongServerUidError extends ConnectionError {
  /** @param {string} detail */
  constructor(detail) { super(LocalErrorCodes.WRONG_SERVER_UID, detail); }
}

/**
 * A fire-and-forget send (`dispatch`, `publish`) found `maxWriteQueue` bytes already waiting for fluxd to read:
 * nothing was queued. Await `client.flush()` before sending more (awaited calls wait for room by themselves).
 */
export class WriteQueueFullError extends FluxError {
  /** @param {number} queuedBytes @param {number} limit */
  constructor(queuedBytes, limit) {
    super(LocalErrorCodes.WRITE_QUEUE_FULL, `${queuedBytes} bytes already wait for fluxd to read them (maxWriteQueue ${limit}); await client.flush() before sending more`);
    this.queuedBytes = queuedBytes; this.limit = limit;
  }
}

/**
 * A dispatch that never reached fluxd: `recover` answered `unknown` for it after a reconnection (SPEC §15.4), or
 * the client closed (or gave up reconnecting) before it was written. Nothing happened; it may be dispatched again.
 * `id` is the dispatch's id; `cause` what ended the connection, if that is why.
 */
export class NotSentError extends FluxError {
  /** @param {string} id @param {string} detail @param {Error} [cause] */
  constructor(id, detail, cause = undefined) {
    super(LocalErrorCodes.NOT_SENT, detail, false, id, cause);
    /** @type {string} */ this.id = id;
  }
}

/**
 * A store's state cannot be published within fluxd's `welcome.limits.maxFrame` (SPEC §16.6): its root is a string
 * or number larger than a frame, one string or number in it (`path`) does not fit in a frame even alone, or the
 * fluxd takes no patches (older than 0.4.0) and the state is larger than a frame. Nothing was sent for it and the
 * store does not retry. `ref` / `store` is the store.
 */
export class StateTooLargeError extends FluxError {
  /** @param {string} store @param {string} detail @param {string} [path] */
  constructor(store, detail, path = undefined) {
    super(LocalErrorCodes.STATE_TOO_LARGE, detail, false, store);
    /** @type {string} */ this.store = store;
    /** @type {string|undefined} */ this.path = path;
  }
}

/**
 * A dispatch was sent, the connection was lost before its settlement, and fluxd cannot say what became of it: the
 * fluxd reached after reconnecting is a new history (another `welcome.epoch`, or none: an ephemeral or older
 * fluxd), it refused `recover` (`unknown-op` from a fluxd older than 0.3.0), or the client closed for good. The
 * action may or may not have been accepted and applied; look at the state before dispatching it again.
 */
export class OutcomeUnknownError extends FluxError {
  /** @param {string} id @param {string} detail @param {Error} [cause] */
  constructor(id, detail, cause = undefined) {
    super(LocalErrorCodes.OUTCOME_UNKNOWN, detail, false, id, cause);
    /** @type {string} */ this.id = id;
  }
}
