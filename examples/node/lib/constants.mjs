// The protocol's vocabulary in one place (protocol/SPEC.md, protocol/schemas/index.json): the protocol version,
// ops by direction, roles, store statuses, settlement result statuses, the error codes of SPEC §11 and the name
// rules of §4.1. test/constants.test.mjs fails when these disagree with protocol/.

export const PROTOCOL_VERSION = 1;

/** Ops a peer sends to fluxd (`c2d`: any role; `s2d`: a store-role peer) and ops fluxd sends (`d2c`). */
export const OpsByDirection = Object.freeze({
  c2d: Object.freeze(['bye', 'dispatch', 'forget', 'get', 'hello', 'history', 'info', 'ping', 'pong', 'query', 'recover',
    'reload', 'restart-worker', 'state-at', 'stop-worker', 'subscribe', 'unquery', 'unsubscribe', 'workers']),
  s2d: Object.freeze(['done', 'patch', 'register', 'reject', 'state', 'unregister']),
  d2c: Object.freeze(['accepted', 'action', 'bye', 'delta', 'error', 'event', 'forgotten', 'got', 'history', 'info', 'missed', 'ping', 'pong',
    'queries', 'queries-changed', 'query-ok', 'recovered', 'registered', 'reloaded', 'settled', 'snapshot', 'state-at',
    'store-down', 'store-up', 'subscribed', 'subtree', 'unquery-ok', 'unsubscribed', 'welcome', 'worker', 'workers']),
});

/** Every op name of protocol 1, as a constant (`Ops.QUERIES_CHANGED` is `'queries-changed'`). */
export const Ops = Object.freeze(Object.fromEntries(
  [...new Set(Object.values(OpsByDirection).flat())].sort().map((op) => [op.toUpperCase().replace(/-/g, '_'), op])));

/** `hello.role` (SPEC §7). */
export const Roles = Object.freeze({ CLIENT: 'client', STORE: 'store', MONITOR: 'monitor' });

/** `subscribed.status` (SPEC §8.5): `unknown` = no store of that name has registered (yet). */
export const StoreStatus = Object.freeze({ UP: 'up', DOWN: 'down', UNKNOWN: 'unknown' });

/** A settlement result's `status` (SPEC §8.3). */
export const ResultStatus = Object.freeze({ DONE: 'done', REJECTED: 'rejected', UNAVAILABLE: 'unavailable' });

/** Every error code of SPEC §11 (fluxd's `error` frames and settlement results). Other codes are valid (§13). */
export const ErrorCodes = Object.freeze({
  BAD_FRAME: 'bad-frame',
  TOO_LARGE: 'too-large',
  BAD_JSON: 'bad-json',
  BAD_MESSAGE: 'bad-message',
  UNKNOWN_OP: 'unknown-op',
  HANDSHAKE_REQUIRED: 'handshake-required',
  UNSUPPORTED_VERSION: 'unsupported-version',
  /** fluxd's: no `hello` within `handshakeTimeout` (fatal). A call's own deadline is a local `timeout` too. */
  TIMEOUT: 'timeout',
  FORBIDDEN: 'forbidden',
  NAME_TAKEN: 'name-taken',
  CYCLE: 'cycle',
  UNKNOWN_STORE: 'unknown-store',
  NO_HANDLER: 'no-handler',
  OVERLOADED: 'overloaded',
  STORE_UNAVAILABLE: 'store-unavailable',
  SHUTTING_DOWN: 'shutting-down',
  UNKNOWN_WORKER: 'unknown-worker',
  /** `forget` of a store a live connection owns (not fatal) */
  STORE_IS_UP: 'store-is-up',
  /** `reload` changed nothing: no config file, a bad file, or a change that takes a restart (not fatal) */
  RELOAD_REFUSED: 'reload-refused',
  OUTCOME_QUOTA: 'outcome-quota',
  DISK_QUOTA: 'disk-quota',
  SLOW_CONSUMER: 'slow-consumer',
  /** a per-connection limit (live queries, query bytes, subscriptions, waitFor) refused a request; not fatal */
  LIMIT_EXCEEDED: 'limit-exceeded',
  /** fluxd refused the connection at connect, in place of welcome (fatal) */
  TOO_MANY_CONNECTIONS: 'too-many-connections',
  /** no room in fluxd's memory budget: a request refused, or (fatal) the connection closed */
  MEMORY_BUDGET: 'memory-budget',
  /** heartbeat pings went unanswered, or a stalled store was closed (fatal) */
  UNRESPONSIVE: 'unresponsive',
  /** fluxd's journal disk is full: new work refused until space returns; nothing accepted is lost */
  DISK_FULL: 'disk-full',
  /** fluxd's journal failed a sync: it accepts nothing more until restarted */
  JOURNAL_FAILED: 'journal-failed',
  /** history or a past state outside the journal's retention window, or an ephemeral fluxd */
  NOT_RETAINED: 'not-retained',
  /** a store's patch did not apply to the retained state (or named another base): its connection is closed (fatal) */
  PATCH_FAILED: 'patch-failed',
});

/** Codes this library gives its own failures (never sent by fluxd). */
export const LocalErrorCodes = Object.freeze({
  /** the connection ended (`cause` holds fluxd's fatal error, if one ended it) */
  DISCONNECTED: 'disconnected',
  /** fluxd's socket is not owned by the expected uid (see `expectedServerUid`) */
  WRONG_SERVER_UID: 'wrong-server-uid',
  /** nothing accepted the connection at the socket path (no such socket, nobody listening, not a socket) */
  NO_FLUXD: 'no-fluxd',
  /** a call's deadline passed (`TimeoutError`) */
  TIMEOUT: 'timeout',
  /** a fire-and-forget send found the write queue full (fluxd is not reading); await `client.flush()` */
  WRITE_QUEUE_FULL: 'write-queue-full',
  /** a dispatch never reached fluxd (`recover` said `unknown`, or the client closed before sending it); it may be sent again */
  NOT_SENT: 'not-sent',
  /** a dispatch was sent, its connection was lost and fluxd cannot say what became of it (no `recover`, new epoch) */
  OUTCOME_UNKNOWN: 'outcome-unknown',
  /** a store's state cannot be published in frames of `maxFrame` bytes (a string or number larger than a frame; SPEC §16.6) */
  STATE_TOO_LARGE: 'state-too-large',
});

/** Codes the Store class puts in its rejections (the same in the Swift and Python store libraries). */
export const StoreErrorCodes = Object.freeze({
  /** the action's type matches the store's patterns but no handler (a typo such as `counter/ad`) */
  UNHANDLED_ACTION: 'store/unhandled-action',
  /** a handler threw something other than `Reject` */
  HANDLER_FAILED: 'store/error',
  /** the payload is not what the handler expects (its `payload` check, or no payload at all) */
  BAD_PAYLOAD: 'store/bad-payload',
});

/** SPEC §4.1: names and action types are 1..N bytes of these characters. */
export const NAME_PATTERN = /^[A-Za-z0-9._:/-]+$/;
export const Limits = Object.freeze({ STORE_NAME_BYTES: 128, ACTION_TYPE_BYTES: 256, ID_BYTES: 256 });
