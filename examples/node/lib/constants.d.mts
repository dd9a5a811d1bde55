// Types of constants.mjs: the protocol's vocabulary (protocol/SPEC.md, protocol/schemas/index.json).

export declare const PROTOCOL_VERSION: 1;

/** Ops any peer sends to fluxd. */
export type C2DOp = 'bye' | 'dispatch' | 'forget' | 'get' | 'hello' | 'history' | 'info' | 'ping' | 'pong' | 'query' | 'recover'
  | 'reload' | 'restart-worker' | 'state-at' | 'stop-worker' | 'subscribe' | 'unquery' | 'unsubscribe' | 'workers';
/** Ops a store-role peer sends to fluxd. */
export type S2DOp = 'done' | 'patch' | 'register' | 'reject' | 'state' | 'unregister';
/** Ops fluxd sends. */
export type D2COp = 'accepted' | 'action' | 'bye' | 'delta' | 'error' | 'event' | 'forgotten' | 'got' | 'history' | 'info' | 'missed' | 'ping'
  | 'pong' | 'queries' | 'queries-changed' | 'query-ok' | 'recovered' | 'registered' | 'reloaded' | 'settled' | 'snapshot'
  | 'state-at' | 'store-down' | 'store-up' | 'subscribed' | 'subtree' | 'unquery-ok' | 'unsubscribed' | 'welcome'
  | 'worker' | 'workers';
export type Op = C2DOp | S2DOp | D2COp;

export declare const OpsByDirection: {
  readonly c2d: readonly C2DOp[];
  readonly s2d: readonly S2DOp[];
  readonly d2c: readonly D2COp[];
};

export declare const Ops: {
  readonly ACTION: 'action'; readonly BYE: 'bye'; readonly DELTA: 'delta'; readonly DISPATCH: 'dispatch'; readonly DONE: 'done';
  readonly PATCH: 'patch'; readonly SUBTREE: 'subtree';
  readonly ERROR: 'error'; readonly EVENT: 'event'; readonly FORGET: 'forget'; readonly FORGOTTEN: 'forgotten'; readonly GET: 'get'; readonly GOT: 'got'; readonly HELLO: 'hello';
  readonly INFO: 'info'; readonly MISSED: 'missed'; readonly PING: 'ping'; readonly PONG: 'pong';
  readonly QUERIES: 'queries'; readonly QUERIES_CHANGED: 'queries-changed'; readonly QUERY: 'query';
  readonly QUERY_OK: 'query-ok'; readonly REGISTER: 'register'; readonly REGISTERED: 'registered';
  readonly REJECT: 'reject'; readonly RELOAD: 'reload'; readonly RELOADED: 'reloaded'; readonly RESTART_WORKER: 'restart-worker'; readonly SETTLED: 'settled';
  readonly SNAPSHOT: 'snapshot'; readonly STATE: 'state'; readonly STOP_WORKER: 'stop-worker';
  readonly STORE_DOWN: 'store-down'; readonly STORE_UP: 'store-up'; readonly SUBSCRIBE: 'subscribe';
  readonly SUBSCRIBED: 'subscribed'; readonly UNQUERY: 'unquery'; readonly UNQUERY_OK: 'unquery-ok';
  readonly UNREGISTER: 'unregister'; readonly UNSUBSCRIBE: 'unsubscribe'; readonly UNSUBSCRIBED: 'unsubscribed';
  readonly WELCOME: 'welcome'; readonly WORKER: 'worker'; readonly WORKERS: 'workers';
  readonly HISTORY: 'history'; readonly RECOVER: 'recover'; readonly RECOVERED: 'recovered'; readonly STATE_AT: 'state-at';
};

/** `hello.role`. */
export type Role = 'client' | 'store' | 'monitor';
export declare const Roles: { readonly CLIENT: 'client'; readonly STORE: 'store'; readonly MONITOR: 'monitor' };

/** `subscribed.status`, then store-down / store-up: `unknown` = no store of that name has registered (yet). */
export type StoreStatus = 'up' | 'down' | 'unknown';
export declare const StoreStatus: { readonly UP: 'up'; readonly DOWN: 'down'; readonly UNKNOWN: 'unknown' };

/** A settlement result's `status`. */
export type ResultStatus = 'done' | 'rejected' | 'unavailable';
export declare const ResultStatus: { readonly DONE: 'done'; readonly REJECTED: 'rejected'; readonly UNAVAILABLE: 'unavailable' };

/** The error codes of SPEC §11. */
export type ErrorCode = 'bad-frame' | 'too-large' | 'bad-json' | 'bad-message' | 'unknown-op' | 'handshake-required'
  | 'unsupported-version' | 'timeout' | 'forbidden' | 'name-taken' | 'cycle' | 'unknown-store' | 'no-handler'
  | 'overloaded' | 'store-unavailable' | 'shutting-down' | 'unknown-worker' | 'store-is-up' | 'reload-refused' | 'outcome-quota' | 'disk-quota' | 'slow-consumer' | 'limit-exceeded'
  | 'too-many-connections' | 'memory-budget' | 'unresponsive' | 'disk-full' | 'journal-failed' | 'not-retained'
  | 'patch-failed';
export declare const ErrorCodes: {
  readonly BAD_FRAME: 'bad-frame'; readonly TOO_LARGE: 'too-large'; readonly BAD_JSON: 'bad-json';
  readonly BAD_MESSAGE: 'bad-message'; readonly UNKNOWN_OP: 'unknown-op'; readonly HANDSHAKE_REQUIRED: 'handshake-required';
  readonly UNSUPPORTED_VERSION: 'unsupported-version'; readonly TIMEOUT: 'timeout'; readonly FORBIDDEN: 'forbidden';
  readonly NAME_TAKEN: 'name-taken'; readonly CYCLE: 'cycle'; readonly UNKNOWN_STORE: 'unknown-store';
  readonly NO_HANDLER: 'no-handler'; readonly OVERLOADED: 'overloaded'; readonly STORE_UNAVAILABLE: 'store-unavailable';
  readonly SHUTTING_DOWN: 'shutting-down'; readonly UNKNOWN_WORKER: 'unknown-worker'; readonly STORE_IS_UP: 'store-is-up'; readonly RELOAD_REFUSED: 'reload-refused'; readonly OUTCOME_QUOTA: 'outcome-quota'; readonly DISK_QUOTA: 'disk-quota'; readonly SLOW_CONSUMER: 'slow-consumer';
  readonly LIMIT_EXCEEDED: 'limit-exceeded'; readonly TOO_MANY_CONNECTIONS: 'too-many-connections';
  readonly MEMORY_BUDGET: 'memory-budget'; readonly UNRESPONSIVE: 'unresponsive';
  readonly DISK_FULL: 'disk-full'; readonly JOURNAL_FAILED: 'journal-failed'; readonly NOT_RETAINED: 'not-retained';
  readonly PATCH_FAILED: 'patch-failed';
};

/** Codes of this library's own failures. */
export type LocalErrorCode = 'disconnected' | 'wrong-server-uid' | 'no-fluxd' | 'timeout' | 'write-queue-full' | 'not-sent'
  | 'outcome-unknown' | 'state-too-large';
export declare const LocalErrorCodes: {
  readonly DISCONNECTED: 'disconnected'; readonly WRONG_SERVER_UID: 'wrong-server-uid'; readonly NO_FLUXD: 'no-fluxd';
  readonly TIMEOUT: 'timeout'; readonly WRITE_QUEUE_FULL: 'write-queue-full'; readonly NOT_SENT: 'not-sent';
  readonly OUTCOME_UNKNOWN: 'outcome-unknown'; readonly STATE_TOO_LARGE: 'state-too-large';
};

/** Codes the Store class puts in its rejections. */
export type StoreErrorCode = 'store/unhandled-action' | 'store/error' | 'store/bad-payload';
export declare const StoreErrorCodes: {
  readonly UNHANDLED_ACTION: 'store/unhandled-action'; readonly HANDLER_FAILED: 'store/error'; readonly BAD_PAYLOAD: 'store/bad-payload';
};

export declare const NAME_PATTERN: RegExp;
export declare const Limits: { readonly STORE_NAME_BYTES: 128; readonly ACTION_TYPE_BYTES: 256; readonly ID_BYTES: 256 };
