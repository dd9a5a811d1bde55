// FluxError: fluxd's `error` frames (SPEC §8.9, codes in §11) and this library's own failures.
/** Error codes callers commonly test for (SPEC §11); any other code is valid too (§13). */
export const ErrorCodes = Object.freeze({
  /** a per-connection limit (live queries, query bytes, subscriptions, waitFor) refused a request; not fatal */
  LIMIT_EXCEEDED: 'limit-exceeded',
  /** fluxd refused the connection at connect, in place of welcome (fatal) */
  TOO_MANY_CONNECTIONS: 'too-many-connections',
  /** heartbeat pings went unanswered, or a stalled store was closed (fatal) */
  UNRESPONSIVE: 'unresponsive',
  /** no room in fluxd's memory budget: a request refused, or (fatal) the connection closed */
  MEMORY_BUDGET: 'memory-budget',
  /** local: fluxd's socket is not owned by the expected uid (see `expectedServerUid`) */
  WRONG_SERVER_UID: 'wrong-server-uid',
  /** local: the connection ended (`cause` holds fluxd's fatal error, if one ended it) */
  DISCONNECTED: 'disconnected',
});

const DESCRIPTIONS = {
  'limit-exceeded': 'a per-connection limit of fluxd was reached (live queries, query bytes, subscriptions or waitFor stores; see welcome.limits); the request was refused, the connection stays',
  'too-many-connections': 'fluxd refused the connection: too many connections (in total, for this user or in the handshake), or no room in its memory budget',
  unresponsive: 'fluxd closed the connection as unresponsive: heartbeat pings went unanswered, or a store left an action unanswered too long',
  'memory-budget': "fluxd's memory budget had no room for this peer's request or backlog (fatal: the connection was closed; otherwise only the request was refused)",
};

/**
 * An `error` from fluxd (SPEC §8.9; codes in §11) or a local failure. Unknown codes are valid: `fatal` says
 * whether the connection survived. The codes of `ErrorCodes` get a short explanation in `message`. A
 * `disconnected` error ended by a fatal error from fluxd (`unresponsive`, `memory-budget`, ...) has it as `cause`.
 */
export class FluxError extends Error {
  /** @param {string} code @param {string} [message] @param {boolean} [fatal] @param {string} [ref] @param {FluxError} [cause] */
  constructor(code, message = '', fatal = false, ref = undefined, cause = undefined) {
    const text = message ? `${code}: ${message}` : code;
    super(DESCRIPTIONS[code] ? `${text} (${DESCRIPTIONS[code]})` : text, cause ? { cause } : undefined);
    this.name = 'FluxError';
    /** @type {string} */ this.code = code;
    /** @type {string} */ this.detail = message;
    /** @type {boolean} */ this.fatal = fatal;
    /** @type {string|undefined} */ this.ref = ref;
  }
  /** @param {Record<string, any>} msg */
  static fromFrame(msg) {
    return new FluxError(String(msg.code ?? ''), String(msg.message ?? ''), msg.fatal === true,
      typeof msg.ref === 'string' ? msg.ref : undefined);
  }
}

