// Types of client.mjs: the connection to fluxd.
import type { ResultStatus, Role } from './constants.mjs';
import type { FluxError } from './errors.mjs';
import type { FrameWriter } from './writer.mjs';
import type { PendingReplies } from './pending.mjs';
import type { Snapshot, Subscription, QueryReceipt } from './subscription.mjs';
import type { ReconnectOptions } from './reconnect.mjs';

export declare const DEFAULT_REQUEST_TIMEOUT: number;
export declare const DEFAULT_CONNECT_TIMEOUT: number;

/** `welcome.limits`: fluxd's limits for this connection (SPEC §8.1); fluxd may add more. */
export interface WelcomeLimits {
  maxFrame: number; storeWindow: number; queueLimit: number; queueTimeout: number; handshakeTimeout: number;
  maxPending: number; maxBacklog?: number; pingInterval?: number; maxPingsOut?: number; outcomeWindow?: number;
  [limit: string]: number | undefined;
}
export interface Welcome {
  peer: number; server: string; protocol: number; limits: WelcomeLimits;
  /** Since fluxd 0.3.0: the history seqs and versions belong to (the same across restarts of a durable fluxd). */
  epoch?: string;
  durability?: 'always' | 'batch' | 'none' | 'ephemeral' | (string & {});
}

/** One target store's result in a settlement. */
export interface StoreResult {
  store: string;
  status: ResultStatus | (string & {});
  version?: number;
  error?: { code: string; message?: string; [field: string]: unknown };
}

/** What fluxd answered a dispatch with `settle: true`. */
export declare class Settlement {
  private constructor();
  readonly id: string;
  readonly seq: number;
  readonly type: string;
  readonly results: StoreResult[];
  /** Whether every target store answered `done`. */
  readonly ok: boolean;
  /** One error per result that is not `done` (StoreRejectedError, StoreUnavailableError, ...). */
  readonly errors: FluxError[];
  /** Throws the first result's error if a store did not answer `done`; else returns the settlement. */
  check(): this;
}

/** fluxd's `info` reply (SPEC §8.7); its shape may grow. */
export interface Info {
  seq: number;
  stores: Array<{ name: string; status: 'up' | 'down'; handles: string[]; waitFor: string[]; version: number; seq: number;
    subscribers: number; queued: number; inflight: number; queries: number; [field: string]: unknown }>;
  peers: { client?: number; store?: number; monitor?: number; [role: string]: number | undefined };
  counters: { [counter: string]: unknown };
  [field: string]: unknown;
}

/** Every call takes a `timeout` in ms that covers all of it: null = none; omitted = the client's `requestTimeout`. */
export interface CallOptions { timeout?: number | null }
export interface SubscribeOptions extends CallOptions {
  /** Resolve only once the first snapshot is there (`subscription.latest`). */
  waitForSnapshot?: boolean;
  /**
   * A JSON Pointer inside the store's state (SPEC §16.4, fluxd 0.4.0): the subscription's snapshots hold the value
   * there (`state`; `exists` false and `state` undefined when there is none), sent only when a change touches it.
   */
  path?: string;
}
export interface DispatchOptions { cause?: number }
export interface SettleOptions extends DispatchOptions, CallOptions {}
export interface SendOptions {
  /** Pass the write queue's bound (answers fluxd waits for). */
  force?: boolean;
}

export interface ConnectOptions {
  /** fluxd's socket; else $FLUXBUS_SOCKET, else the default path. */
  socketPath?: string;
  name?: string;
  role?: Role;
  /** ms for connecting, the uid check, hello and welcome together (default 30000; null = none). */
  timeout?: number | null;
  /** ms for each later call that gives no timeout (default 30000; null = none). */
  requestTimeout?: number | null;
  /** Ask fluxd for heartbeat pings (default true). */
  heartbeat?: boolean;
  expectedServerUid?: number;
  /** Bytes that may wait while fluxd does not read (default 16 MiB). */
  maxWriteQueue?: number;
  /** Reconnect after a lost connection or fluxd's bye (default true); false = off; an object sets the backoff. */
  reconnect?: boolean | ReconnectOptions;
  /** Ask fluxd 0.4+ for deltas (patches) and apply them to the state held (default true); false = whole snapshots. */
  deltas?: boolean;
}

/** `connecting` (Client.connect), `connected`, `reconnecting` (lost; trying again), `closed` (for good). */
export type ConnectionState = 'connecting' | 'connected' | 'reconnecting' | 'closed';
/** Before each reconnection attempt. */
export interface ReconnectingEvent {
  /** 1 for the first attempt after a loss. */
  attempt: number;
  /** ms until this attempt. */
  delay: number;
  /** Why the connection was lost (attempt 1), or why the previous attempt failed. */
  error: FluxError;
}
/** The client is connected again (subscriptions, queries and stores are being restored). */
export interface ReconnectedEvent {
  attempt: number;
  /** fluxd is another history (another `welcome.epoch`, or none): versions and seqs started over. */
  epochChanged: boolean;
  epoch: string | undefined;
  /** ms from the loss to the new welcome. */
  downtime: number;
}
/** A Store on this client registered again after a reconnection (and the first time). */
export interface StoreRegisteredEvent {
  resumed: boolean;
  /** The version of the snapshot the store adopted (0: none). */
  version: number;
  /** Actions up to this seq are answered without running (SPEC §15.3). */
  seq: number;
}

export interface ClientEvents {
  /** The client ended for good (closed, reconnection off, given up, or refused). */
  close: [reason: FluxError];
  /** The connection was lost (the client reconnects unless reconnection is off). */
  disconnected: [reason: FluxError];
  /** A reconnection attempt is due in `delay` ms. */
  reconnecting: [event: ReconnectingEvent];
  /** Connected again. */
  reconnected: [event: ReconnectedEvent];
  /** A store of this client is registered (after `store.start`, and again after each reconnection). */
  'store-registered': [store: string, event: StoreRegisteredEvent];
  /** An error from fluxd that answered no call (e.g. no-handler for a fire-and-forget dispatch). */
  'error-frame': [error: FluxError];
  /** A heartbeat ping was answered. */
  heartbeat: [id: string | undefined];
  /** A store worker on this connection failed (also given to `store.onError`). */
  'store-error': [error: unknown];
  /** The socket stopped taking writes: frames now wait in the write queue. */
  backpressure: [];
  /** Everything queued has been handed to the socket again. */
  drain: [];
}

/** A connection to fluxd (protocol 1). */
export declare class Client {
  private constructor();
  static connect(options?: ConnectOptions): Promise<Client>;
  readonly name: string;
  readonly role: Role;
  /** The current connection's welcome. */
  readonly welcome: Welcome;
  /** This client's session, sent as `hello.session` on every connection (SPEC §15.4). */
  readonly session: string;
  readonly state: ConnectionState;
  /** Whether a connection is up (false while reconnecting). */
  readonly connected: boolean;
  /** Reconnections made so far. */
  readonly reconnects: number;
  requestTimeout: number | null;
  /** Errors from fluxd that answered no call (the last 256). */
  readonly errors: FluxError[];
  readonly closedReason: FluxError | null;
  /** Whether the client ended for good. */
  readonly closed: boolean;
  readonly pingsAnswered: number;
  /** Whether writes wait for fluxd to read; see `flush`. */
  readonly backpressured: boolean;
  /** The current connection's write queue. */
  readonly writer: FrameWriter;
  readonly pending: PendingReplies;
  readonly subscriptions: ReadonlyMap<string, ReadonlySet<Subscription<unknown>>>;
  /** Path subscriptions, by `store + ' ' + path`. */
  readonly pathSubscriptions: ReadonlyMap<string, ReadonlySet<Subscription<unknown>>>;
  /** Whether subscriptions ask for deltas (SPEC §16.3). */
  readonly deltas: boolean;
  /** The state held per subscribed store: the newest snapshot, or the result of the deltas applied to it. */
  readonly held: ReadonlyMap<string, { version: number; seq: number; state: unknown }>;
  /** Deltas applied; resynchronisations (a delta that did not fit the state held: subscribed again, whole). */
  readonly deltaStats: { applied: number; resyncs: number };

  /** Resolves once every frame sent so far has been handed to the kernel. */
  flush(): Promise<void>;
  /** Says bye, waits for fluxd to close (default 2000 ms), then closes. */
  close(options?: number | CallOptions): Promise<void>;
  /** Closes at once without bye. */
  abort(): void;
  /** Dispatches without waiting; returns the id. Throws WriteQueueFullError when the write queue is full. */
  dispatch(type: string, payload?: unknown, options?: DispatchOptions): string;
  /**
   * Dispatches and resolves with every target store's result. Across a lost connection it is recovered; it rejects
   * with NotSentError if it never reached fluxd, OutcomeUnknownError if fluxd cannot say what became of it.
   */
  dispatchAndSettle(type: string, payload?: unknown, options?: SettleOptions): Promise<Settlement>;
  /**
   * Dispatches and resolves once fluxd accepted the action (SPEC §8.3 `ack`, fluxd 0.4.0) with its id and seq; rejects
   * with the error class of fluxd's refusal (NoHandlerError, ...), TimeoutError, or DisconnectedError when the
   * connection was lost before fluxd answered (the action may or may not have been taken).
   */
  dispatchAccepted(type: string, payload?: unknown, options?: SettleOptions): Promise<{ id: string; seq: number }>;
  /** Subscribes; leaving a `for await` over the subscription unsubscribes. */
  subscribe<S = unknown>(store: string, options?: SubscribeOptions): Promise<Subscription<S>>;
  /** Ends every subscription of this client to `store` and unsubscribes. */
  unsubscribe(store: string, options?: CallOptions): Promise<void>;
  query<Q = unknown>(store: string, query: Q, options?: CallOptions): Promise<QueryReceipt<Q>>;
  unquery(id: string, options?: CallOptions): Promise<void>;
  info(options?: CallOptions): Promise<Info>;
  get<S = unknown>(store: string, options?: CallOptions): Promise<Snapshot<S>>;
  /** Round trip in ms. */
  ping(options?: CallOptions): Promise<number>;
  sendRaw(body: string | Uint8Array, options?: SendOptions): void;
  send(fields: { op: string; [field: string]: unknown }, options?: SendOptions): void;
  /** Routes a store's messages to `sink`, and `{op: 'disconnected' | 'reconnected' | 'closed'}` about the connection. */
  attachStore(store: string, sink: (msg: { op: string; [field: string]: any }) => void): void;

  on<E extends keyof ClientEvents>(event: E, listener: (...args: ClientEvents[E]) => void): this;
  once<E extends keyof ClientEvents>(event: E, listener: (...args: ClientEvents[E]) => void): this;
  off<E extends keyof ClientEvents>(event: E, listener: (...args: ClientEvents[E]) => void): this;
  emit<E extends keyof ClientEvents>(event: E, ...args: ClientEvents[E]): boolean;
}
