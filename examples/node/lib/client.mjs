// The connection to fluxd: handshake, requests and their replies (one deadline per call), routing of fluxd's
// messages to subscriptions and store workers, heartbeats, the end of the connection, and reconnection (SPEC
// §15.4, §15.5): a new connection with the same session, subscriptions and queries declared again, settlements
// recovered, frames that never reached fluxd sent on the new connection.
import { EventEmitter } from 'node:events';
import { randomUUID } from 'node:crypto';
import { Ops, PROTOCOL_VERSION, ResultStatus, Roles } from './constants.mjs';
import {
  DisconnectedError, TimeoutError, WriteQueueFullError, NotSentError, OutcomeUnknownError, WrongServerUidError,
  UnsupportedVersionError, HandshakeRequiredError, BadMessageError, ForbiddenError, errorFromFrame, errorFromResult,
} from './errors.mjs';
import { FrameDecoder, encodeFrame } from './framing.mjs';
import { canonicalJSON } from './canonical.mjs';
import { parseJSON } from './json-number.mjs';
import { isValidStoreName, isValidActionType, patternMatches } from './names.mjs';
import { resolveSocketPath, expectedServerUid, checkServerUid } from './socket-path.mjs';
import { openSocket } from './connect.mjs';
import { Deadline } from './deadline.mjs';
import { PendingReplies } from './pending.mjs';
import { FrameWriter, DEFAULT_MAX_WRITE_QUEUE } from './writer.mjs';
import { Subscription, QueryReceipt } from './subscription.mjs';
import { reconnectPolicy, backoffDelay } from './reconnect.mjs';
import { kAttach, kRelease, kDeliver, kEnd, kStatus, kFirst, kRebase, kLose, kHold, kBarrier } from './internal.mjs';
import { applyPatch, isValidPointer } from './patch.mjs';

/** The key of a path subscription (store names have no space): its maps' key and its replies' key suffix. */
const pathKey = (store, path) => `${store} ${path}`;
/** What keys a subscription's `subscribed` / `unsubscribed` reply. */
const replyKey = (op, store, path) => (path === undefined ? `${op}:${store}` : `${op}:${pathKey(store, path)}`);

/** The default time limit of a request (dispatchAndSettle, subscribe, query, get, info, ping, ...). */
export const DEFAULT_REQUEST_TIMEOUT = 30000;
/** The default time limit of `Client.connect` (connecting, the uid check, hello and welcome). */
export const DEFAULT_CONNECT_TIMEOUT = 30000;

/** Dispatch ids a `recover` asks about at most (SPEC §8.12). */
const RECOVER_BATCH = 4096;

/**
 * @typedef {{peer: number, server: string, protocol: number, limits: Record<string, number>, epoch?: string,
 *            durability?: string}} Welcome
 * @typedef {{store: string, status: string, version?: number, error?: Record<string, any>}} StoreResult
 * @typedef {{gen: number, socket: import('node:net').Socket, writer: FrameWriter, ready: boolean, ended: boolean,
 *            endReason: Error|null, welcome: Promise<any>, welcomed: (msg: any) => void, refused: (err: Error) => void}} Connection
 * @typedef {{key: string, kind: 'request'|'settle'|'ack'|'restore'|'release', waiter: import('./pending.mjs').Waiter,
 *            entry: import('./writer.mjs').WriteEntry|undefined}} Call
 */

/** Errors of a reconnection attempt after which trying again cannot help: this fluxd refuses this peer. */
function isPermanent(err) {
  return err instanceof WrongServerUidError || err instanceof UnsupportedVersionError || err instanceof HandshakeRequiredError
    || err instanceof BadMessageError || err instanceof ForbiddenError || err instanceof TypeError;
}

/** What fluxd answered a `dispatch` with `settle: true` (SPEC §8.3): every target store's result. */
export class Settlement {
  /** @param {string} type @param {{id: string, seq: number, results: StoreResult[]}} msg */
  constructor(type, msg) {
    /** @type {string} */ this.id = msg.id;
    /** @type {number} */ this.seq = msg.seq;
    /** @type {StoreResult[]} */ this.results = msg.results;
    /** Whether every target store answered `done`. */
    this.ok = msg.results.every((r) => r.status === ResultStatus.DONE);
    Object.defineProperty(this, 'type', { value: type, enumerable: false });
  }
  /** One error per result that is not `done`: StoreRejectedError, StoreUnavailableError, ShuttingDownError, ... */
  get errors() { return this.results.map((r) => errorFromResult(r, this.type)).filter((e) => e !== undefined); }
  /** Throws the first result's error if a store did not answer `done`; else returns the settlement. */
  check() { const [first] = this.errors; if (first) throw first; return this; }
}

/**
 * A connection to fluxd (protocol 1): `await Client.connect({socketPath, name, role})`.
 * Replies resolve the Promise of the call they answer; every call has a deadline that covers all of it
 * (`timeout` per call, else the client's `requestTimeout`). Errors that answer no call (e.g. `no-handler` for a
 * fire-and-forget `dispatch`) are emitted as `'error-frame'` and kept in `errors`.
 *
 * When the connection is lost (or fluxd says `bye`) the client reconnects by itself, unless it was made with
 * `reconnect: false` (SPEC §15.5): it emits `'disconnected'` (the reason), `'reconnecting'` ({attempt, delay,
 * error}) before each attempt and `'reconnected'` ({attempt, epochChanged, epoch, downtime}) once it is back. Its
 * subscriptions, queries and pending calls survive: calls made meanwhile wait for the connection within their
 * timeout. `'close'` (and `closed`) means the end for good: closed by the user, reconnection off or given up.
 */
export class Client extends EventEmitter {
  /** @type {Connection|undefined} the current (or handshaking) connection */ #conn = undefined;
  #gens = 0;
  #order = 0;
  /** @type {ReturnType<typeof reconnectPolicy>} */ #policy;
  /** @type {{target: string, source: string, expected: number|undefined, heartbeat: boolean, connectTimeout: number|null|undefined, maxWriteQueue: number|undefined}} */ #config;
  /** @type {import('./writer.mjs').WriteEntry[]} frames waiting for the next connection */ #offline = [];
  #offlineBytes = 0;
  /** @type {Set<Call>} calls waiting for a reply, in the order they were made */ #calls = new Set();
  /** @type {Map<string, Call>} dispatchAndSettle calls by dispatch id */ #settling = new Map();
  /** @type {Map<string, {store: string, body: string}>} live queries (declared again after reconnecting) */ #queries = new Map();
  /** @type {Map<string, string[]>} recover requests in flight: request id → dispatch ids */ #recovering = new Map();
  /** @type {Array<{resolve: () => void, reject: (err: Error) => void}>} */ #connectWaiters = [];
  /** @type {ReturnType<typeof setTimeout>|undefined} */ #timer = undefined;
  #closing = false;
  #lostAt = 0;
  #connectedAt = 0;
  #lastAttempt = 0;
  #holdUntil = 0; // performance.now() before which no reconnection is attempted (a refused registration, SPEC §16.6)

  /**
   * Use `Client.connect`.
   * @param {{target: string, source: string, expected: number|undefined, name: string, role: string, heartbeat: boolean,
   *          connectTimeout: number|null|undefined, requestTimeout: number|null, maxWriteQueue: number|undefined,
   *          policy: ReturnType<typeof reconnectPolicy>}} config
   */
  constructor({ target, source, expected, name, role, heartbeat, connectTimeout, requestTimeout = DEFAULT_REQUEST_TIMEOUT, maxWriteQueue, policy, deltas = true }) {
    super();
    /** Whether subscriptions ask for `delta` frames (SPEC §16.3) from a fluxd that speaks §16. */
    this.deltas = deltas;
    /** @type {Map<string, {version: number, seq: number, state: any}>} the state held per subscribed store (deltas apply to it) */
    this.held = new Map();
    /** @type {Map<string, Set<Subscription>>} path subscriptions by `store + ' ' + path` (SPEC §16.4) */
    this.pathSubscriptions = new Map();
    /** Deltas applied, and resynchronisations (a delta that did not fit the state held: subscribed again, whole). */
    this.deltaStats = { applied: 0, resyncs: 0 };
    this.name = name; this.role = role;
    new Deadline(requestTimeout); // validates it
    /** @type {number|null} */ this.requestTimeout = requestTimeout;
    this.#config = { target, source, expected, heartbeat, connectTimeout, maxWriteQueue };
    this.#policy = policy;
    /** This client's session (SPEC §15.4): sent as `hello.session` on every connection it makes. */
    this.session = randomUUID();
    /** Ids (dispatch `d-N`, query `q-N`, request `r-N`) come from this counter, which continues across reconnections. */
    this.nextId = 1;
    this.pending = new PendingReplies();
    /** @type {Map<string, Set<Subscription>>} whole-store subscriptions by store */ this.subscriptions = new Map();
    /** @type {Set<string>} stores resubscribed to resynchronise, until their snapshot comes */ this.resyncing = new Set();
    /** @type {Map<string, (msg: any) => void>} */ this.storeSinks = new Map();
    /** @type {import('./errors.mjs').FluxError[]} */ this.errors = [];
    /** @type {import('./errors.mjs').FluxError|null} */ this.closedReason = null;
    /** @type {Welcome|undefined} the current connection's welcome */ this.welcome = undefined;
    /** @type {'connecting'|'connected'|'reconnecting'|'closed'} */ this.state = 'connecting';
    /** Reconnections made so far. */
    this.reconnects = 0;
    /** Heartbeat pings from fluxd answered (each also emits 'heartbeat' with the ping's id). */
    this.pingsAnswered = 0;
    /** @type {import('node:net').Socket|undefined} the current connection's socket */ this.socket = undefined;
    /** @type {FrameWriter|undefined} the current connection's write queue */ this.writer = undefined;
  }

  /**
   * Connects and does the handshake; `timeout` (ms, default 30000; null = none) covers all of it. Rejects with
   * NoFluxdError (nothing at the socket: the message names the path, where it came from and what to do), a
   * protocol error class if fluxd refuses (e.g. TooManyConnectionsError), WrongServerUidError, or TimeoutError.
   * (Only later losses are reconnected: a first connection that fails rejects.)
   * Socket: `socketPath`, else $FLUXBUS_SOCKET, else the default path (`defaultSocketPath`).
   * `heartbeat` (default true) asks fluxd to ping the connection when it is silent; the client answers each ping
   * with `pong` as soon as the event loop reads it (so code that blocks the event loop for longer than
   * `welcome.limits.pingInterval` × `maxPingsOut` ms gets the connection closed as `unresponsive`; awaiting does not).
   * `expectedServerUid` (else $FLUXBUS_SERVER_UID, else 0 when running as root; else no check) is the uid fluxd
   * must run as, checked before hello with `checkServerUid` (file ownership: Node has no SO_PEERCRED).
   * `requestTimeout` (ms, default 30000; null = none) is the limit of every later call that gives none.
   * `maxWriteQueue` (bytes, default 16 MiB) bounds what waits while fluxd does not read (see `flush`).
   * `reconnect` (default true): `false` turns reconnection off; an object sets its backoff (`initialDelay` 50 ms,
   * doubling (`factor`) up to `maxDelay` 2000 ms, up to `jitter` 0.5 of each delay taken off at random,
   * `maxAttempts` and `giveUpAfter` ms to give up; never by default). Each attempt has `timeout` too.
   * `deltas` (default true): subscriptions ask fluxd (one that speaks SPEC §16) for `delta` frames, patches from
   * the version held, and the client applies them to the state it holds; false: whole snapshots only.
   * @param {{socketPath?: string, name?: string, role?: 'client'|'store'|'monitor', timeout?: number|null,
   *          requestTimeout?: number|null, heartbeat?: boolean, expectedServerUid?: number, maxWriteQueue?: number,
   *          reconnect?: boolean|Record<string, number|null>, deltas?: boolean}} [options]
   * @returns {Promise<Client>}
   */
  static async connect({ socketPath, name = '', role = Roles.CLIENT, timeout = DEFAULT_CONNECT_TIMEOUT, requestTimeout,
    heartbeat = true, expectedServerUid: serverUid, maxWriteQueue, reconnect, deltas = true } = {}) {
    if (!Object.values(Roles).includes(role)) throw new TypeError(`role must be one of ${Object.values(Roles).join(', ')}, not ${JSON.stringify(role)}`);
    const { path: target, source } = resolveSocketPath(socketPath);
    const expected = expectedServerUid(serverUid);
    const policy = reconnectPolicy(reconnect);
    const deadline = new Deadline(timeout);
    const client = new Client({ target, source, expected, name, role, heartbeat, connectTimeout: timeout, requestTimeout, maxWriteQueue, policy, deltas });
    try {
      const { conn, msg } = await client.#open(deadline);
      client.#welcomed(conn, msg);
    } catch (err) {
      client.abort();
      throw err;
    }
    return client;
  }

  /** Whether the client has ended for good (closed, reconnection off or given up). */
  get closed() { return this.closedReason !== null; }

  /** Whether a connection is up (false while reconnecting). */
  get connected() { return this.state === 'connected'; }

  /** Whether writes wait: for fluxd to read (the socket said stop, or frames are queued), or for a connection. */
  get backpressured() { return this.connected ? this.#conn.writer.busy : this.#offline.length > 0; }

  /**
   * Resolves once every frame sent so far has been handed to the kernel (while reconnecting: once reconnected
   * and they have). A burst of fire-and-forget sends awaits it now and then (or whenever `backpressured` is true):
   * a `dispatch` that finds `maxWriteQueue` bytes waiting throws WriteQueueFullError instead of queueing without bound.
   */
  async flush() {
    for (;;) {
      if (this.closedReason) throw this.closedReason;
      if (!this.connected) { await new Promise((resolve, reject) => this.#connectWaiters.push({ resolve, reject })); continue; }
      const conn = this.#conn;
      try { await conn.writer.flush(); return; } catch (err) {
        if (this.closedReason) throw this.closedReason;
        if (conn === this.#conn && !conn.ended) throw err;
      }
    }
  }

  /**
   * Says bye, waits for fluxd to close (at most `timeout` ms, default 2000), then closes for good (no
   * reconnection). Frames still queued are written first. @param {number|{timeout?: number}} [options]
   */
  async close(options = 2000) {
    const timeout = typeof options === 'number' ? options : options?.timeout ?? 2000;
    if (!this.closed) {
      this.#closing = true;
      const conn = this.#conn;
      if (this.connected && conn) {
        const ended = new Promise((resolve) => conn.socket.once('close', resolve));
        try {
          conn.writer.write(encodeFrame('{"op":"bye"}'), { force: true });
          await new Deadline(timeout).race(ended, () => new TimeoutError('bye'));
        } catch { /* closing anyway */ }
      }
    }
    this.#finish(new DisconnectedError('closed locally'));
  }

  /** Closes at once without bye (like a crash), for good. */
  abort() { this.#closing = true; this.#finish(new DisconnectedError('aborted')); }

  /**
   * Dispatches without waiting; returns the id (a refusal arrives as an 'error-frame' event with it as `ref`).
   * While reconnecting it waits for the connection (dropped if the client closes first).
   * Throws WriteQueueFullError when `maxWriteQueue` bytes already wait (await `flush()` first).
   * @param {string} type @param {any} [payload] @param {{cause?: number}} [options] @returns {string}
   */
  dispatch(type, payload = null, { cause } = {}) {
    const id = this.#checkAction(type);
    this.#write(dispatchBody(id, type, payload, cause, false), { replay: true });
    return id;
  }

  /**
   * Dispatches and resolves once fluxd accepted the action (SPEC §8.3 `ack`, fluxd 0.4.0) with `{id, seq}`, its
   * settlement not awaited; rejects with the error class of fluxd's refusal (NoHandlerError, OverloadedError, ...),
   * TimeoutError after `timeout` ms, and DisconnectedError when the connection was lost after the dispatch went
   * out and before fluxd answered (it may or may not have been accepted). A dispatch not yet written when the
   * connection is lost goes out on the next one. Needs fluxd 0.4.0 (an older one never answers: TimeoutError).
   * @param {string} type @param {any} [payload] @param {{cause?: number, timeout?: number|null}} [options]
   * @returns {Promise<{id: string, seq: number}>}
   */
  async dispatchAccepted(type, payload = null, { cause, timeout } = {}) {
    const id = this.#checkAction(type);
    const msg = await this.#call(id, dispatchBody(id, type, payload, cause, false, true), this.#deadline(timeout),
      `waiting for fluxd to accept ${type}`, { kind: 'ack' });
    return { id, seq: msg.seq };
  }

  /**
   * Dispatches and resolves with the Settlement (every target store's result; SPEC §8.3), rejected ones included
   * (`settlement.ok`, `settlement.errors`, `settlement.check()` throws StoreRejectedError, ...). Rejects with the
   * error class of fluxd's code if fluxd refused the action (NoHandlerError, OverloadedError, ...), TimeoutError
   * after `timeout` ms (the whole call). When it resolves, this client's subscriptions hold the new snapshots.
   * Across a lost connection: a dispatch not yet written is sent after reconnecting; one that was written is
   * asked about with `recover` (SPEC §15.4) and resolves with its settlement when fluxd knows it; it rejects with
   * NotSentError when fluxd says it never arrived, and OutcomeUnknownError when fluxd cannot say (a new epoch, no
   * `recover`, or the client closed for good).
   * @param {string} type @param {any} [payload] @param {{cause?: number, timeout?: number|null}} [options]
   * @returns {Promise<Settlement>}
   */
  async dispatchAndSettle(type, payload = null, { cause, timeout } = {}) {
    const id = this.#checkAction(type);
    let msg;
    try {
      msg = await this.#call(id, dispatchBody(id, type, payload, cause, true), this.#deadline(timeout),
        `waiting for the settlement of ${type}`, { kind: 'settle' });
    } catch (err) {
      if (!(err instanceof TimeoutError)) throw err;
      // What the action still waits for, as fluxd's info tells (like fluxctl).
      let note = '';
      try { note = waitingNote(await this.info({ timeout: 2000 }), type); } catch { /* no answer: the timeout as it is */ }
      if (!note) throw err;
      throw new TimeoutError(err.message + note, { timeoutMs: err.timeoutMs });
    }
    return new Settlement(type, msg);
  }

  /**
   * Subscribes to a store: `for await (const snapshot of subscription)` yields the retained snapshot, then every
   * newer one; leaving the loop (break, return, throw) or `subscription.close()` unsubscribes. `subscription.status`
   * is fluxd's word on the store: `up`, `down`, or `unknown` (no store of that name has registered yet: a
   * subscription still works and sees the store when it registers). `waitForSnapshot: true` resolves only once the
   * first snapshot is there (`subscription.latest`). `timeout` covers the whole call; when it passes while the
   * store is `unknown` the TimeoutError says "no store named 'x' has registered yet". After a reconnection the
   * client subscribes again; a snapshot whose version is not above the last one delivered is dropped (same epoch).
   * With fluxd 0.4 (SPEC §16) the client asks for deltas (`deltas` option of Client.connect), holds each store's
   * state and applies each patch to it; snapshots are the same either way.
   * `path` (a JSON Pointer, SPEC §16.4) subscribes to that part of the store's state only: each snapshot's `state`
   * is the value at `path` (undefined, with `exists` false, when there is none), and one comes only when a change
   * touches it. Needs a fluxd that speaks §16 (it announces `limits.deltaHistory`), else rejects with an Error.
   * @param {string} store @param {{timeout?: number|null, waitForSnapshot?: boolean, path?: string}} [options]
   * @returns {Promise<Subscription>}
   */
  async subscribe(store, { timeout, waitForSnapshot = false, path } = {}) {
    checkStoreName(store);
    if (path !== undefined) {
      if (!isValidPointer(path) || Buffer.byteLength(path) > 1024) throw new TypeError(`invalid path ${JSON.stringify(path)}: a JSON Pointer (RFC 6901: "" or /token/..., ~0 for ~ and ~1 for /) of at most 1024 bytes`);
      if (this.welcome && !this.#speaks16()) throw new Error(`fluxd at ${this.#config.target} (${this.welcome.server}) has no path subscriptions: they need fluxd 0.4.0 (SPEC §16.4)`);
    }
    const deadline = this.#deadline(timeout);
    if (this.closedReason) throw this.closedReason;
    const sub = new Subscription(this, store, path);
    this[kAttach](sub);
    const gen = this.#conn?.gen;
    let held = false; // whether fluxd holds (or will hold) the subscription on the current connection if this call fails
    const what = path === undefined ? `'${store}'` : `'${store}' at ${JSON.stringify(path)}`;
    try {
      await this.#call(replyKey(Ops.SUBSCRIBED, store, path), JSON.stringify(this.#subscribeFrame(store, path)), deadline,
        `waiting for fluxd to confirm the subscription to ${what}`,
        { kind: 'restore', onGiveUp: (where) => { held = where === 'here' || (this.connected && this.#conn.gen !== gen); } });
      held = true;
      if (waitForSnapshot) {
        await sub[kFirst](deadline);
        if (!sub.latest) throw this.closedReason ?? new DisconnectedError(`the subscription to ${what} ended before its first snapshot`);
      }
      return sub;
    } catch (err) {
      sub[kEnd]();
      this.#detach(sub);
      if (held && this.connected && !this.#subscribed(store, path)) this.#unsubscribeQuietly(store, path);
      throw err;
    }
  }

  /** Whether fluxd speaks SPEC §16 (patches, deltas, path subscriptions): it announces `limits.deltaHistory`. */
  #speaks16() { return this.welcome?.limits?.deltaHistory !== undefined; }

  /** The `subscribe` frame: with `deltas` (and `from`, the version held, to resume) when fluxd speaks §16. */
  #subscribeFrame(store, path, from) {
    /** @type {Record<string, any>} */ const frame = { op: Ops.SUBSCRIBE, store };
    if (path !== undefined) frame.path = path;
    else if (this.#speaks16()) {
      if (this.deltas) frame.deltas = true;
      if (from !== undefined) frame.from = from;
    }
    return frame;
  }

  /** Whether this client still holds a subscription to `store` (at `path`). */
  #subscribed(store, path) { return path === undefined ? this.subscriptions.has(store) : this.pathSubscriptions.has(pathKey(store, path)); }

  /**
   * Ends every subscription of this client to `store` and unsubscribes (resolves on fluxd's `unsubscribed`; at
   * once while not connected). @param {string} store @param {{timeout?: number|null}} [options]
   */
  async unsubscribe(store, { timeout } = {}) {
    checkStoreName(store);
    for (const sub of this.subscriptions.get(store) ?? []) sub[kEnd]();
    this.subscriptions.delete(store);
    this.held.delete(store);
    if (!this.connected) return;
    await this.#call(`${Ops.UNSUBSCRIBED}:${store}`, JSON.stringify({ op: Ops.UNSUBSCRIBE, store }), this.#deadline(timeout),
      `waiting for fluxd to confirm unsubscribing from '${store}'`, { kind: 'release' });
  }

  /**
   * Declares a query (encoded canonically); active until `receipt.close()` or the client closes (it is declared
   * again after a reconnection). If the call fails after the query went out (timeout), the query is withdrawn.
   * @param {string} store @param {any} query @param {{timeout?: number|null}} [options] @returns {Promise<QueryReceipt>}
   */
  async query(store, query, { timeout } = {}) {
    checkStoreName(store);
    const deadline = this.#deadline(timeout);
    if (this.closedReason) throw this.closedReason;
    const id = `q-${this.nextId++}`;
    const body = `{"op":"query","id":${JSON.stringify(id)},"store":${JSON.stringify(store)},"query":${canonicalJSON(query)}}`;
    const gen = this.#conn?.gen;
    this.#queries.set(id, { store, body });
    try {
      await this.#call(id, body, deadline, `waiting for fluxd to accept query ${id} on '${store}'`, {
        kind: 'restore',
        onGiveUp: (where) => {
          this.#queries.delete(id);
          if (where === 'here' || (this.connected && this.#conn.gen !== gen)) this.#sendQuietly(id, { op: Ops.UNQUERY, id });
        },
      });
    } catch (err) {
      this.#queries.delete(id);
      throw err;
    }
    return new QueryReceipt(this, id, store, query);
  }

  /** Withdraws a query (QueryReceipt.close). @param {string} id @param {{timeout?: number|null}} [options] */
  async unquery(id, { timeout } = {}) {
    this.#queries.delete(id);
    if (!this.connected) return;
    await this.#call(id, JSON.stringify({ op: Ops.UNQUERY, id }), this.#deadline(timeout), `waiting for fluxd to withdraw query ${id}`, { kind: 'release' });
  }

  /** fluxd's introspection data (SPEC §8.7). @param {{timeout?: number|null}} [options] @returns {Promise<Record<string, any>>} */
  info({ timeout } = {}) { return this.#request({ op: Ops.INFO }, timeout); }

  /**
   * A store's retained snapshot (UnknownStoreError if none).
   * @param {string} store @param {{timeout?: number|null}} [options] @returns {Promise<import('./subscription.mjs').Snapshot>}
   */
  async get(store, { timeout } = {}) {
    checkStoreName(store);
    const m = await this.#request({ op: Ops.GET, store }, timeout);
    return { store: m.store, version: m.version, seq: m.seq, state: m.state };
  }

  /** Round trip in ms; a barrier for earlier replies. @param {{timeout?: number|null}} [options] @returns {Promise<number>} */
  async ping({ timeout } = {}) {
    const start = performance.now();
    await this.#request({ op: Ops.PING }, timeout);
    return performance.now() - start;
  }

  /**
   * Sends a frame body as it is (tests, tools, the Store class). Throws WriteQueueFullError when the write queue
   * is full, unless `force` (answers fluxd waits for), and DisconnectedError while not connected.
   * @param {string|Uint8Array} body @param {{force?: boolean}} [options]
   */
  sendRaw(body, options) { this.#write(body, options); }

  /** Sends a message object (see sendRaw). @param {Record<string, any>} fields @param {{force?: boolean}} [options] */
  send(fields, options) { this.#write(JSON.stringify(fields), options); }

  /**
   * Routes a store's messages (registered, snapshot, queries, action, errors with its name as ref) to `sink`, and
   * tells it about the connection: `{op: 'disconnected', reason}`, `{op: 'reconnected', epochChanged}` (the sink
   * registers again then, before anything else is sent), `{op: 'closed'}`.
   * @param {string} store @param {(msg: any) => void} sink
   */
  attachStore(store, sink) { this.storeSinks.set(store, sink); }

  /** @param {Subscription} sub @internal */
  [kAttach](sub) {
    const [map, key] = sub.path === undefined ? [this.subscriptions, sub.store] : [this.pathSubscriptions, pathKey(sub.store, sub.path)];
    const set = map.get(key);
    if (set) set.add(sub); else map.set(key, new Set([sub]));
  }

  /** Ends one subscription; the last of its store (and path) unsubscribes. @param {Subscription} sub @param {number|null} [timeout] @internal */
  async [kRelease](sub, timeout) {
    sub[kEnd]();
    const { store, path } = sub;
    if (!this.#detach(sub) || !this.connected || this.#subscribed(store, path)) return;
    /** @type {Record<string, any>} */ const frame = { op: Ops.UNSUBSCRIBE, store };
    if (path !== undefined) frame.path = path;
    await this.#call(replyKey(Ops.UNSUBSCRIBED, store, path), JSON.stringify(frame),
      this.#deadline(timeout), `waiting for fluxd to confirm unsubscribing from '${store}'${path === undefined ? '' : ` at ${JSON.stringify(path)}`}`, { kind: 'release' });
  }

  /** Ends the current connection as lost (the client reconnects if it may). @param {Error} reason @internal */
  [kLose](reason) { const conn = this.#conn; if (conn && this.connected) this.#ended(conn, reason); }

  /**
   * No reconnection before `until` (performance.now() ms): a store's registration was refused and it waits before
   * registering again (SPEC §16.6). @param {number} until @internal
   */
  [kHold](until) { this.#holdUntil = Math.max(this.#holdUntil, until); }

  /**
   * Sends `ping` on the current connection and resolves true once its `pong` came (fluxd has handled every frame
   * sent before it, SPEC §2), false when that connection is lost first (or there is none), or after `timeout` ms.
   * @param {number|null} [timeout] @returns {Promise<boolean>} @internal
   */
  async [kBarrier](timeout) {
    if (!this.connected || this.closedReason) return false;
    const gen = this.#conn.gen;
    const id = `r-${this.nextId++}`;
    try {
      const msg = await this.#call(id, JSON.stringify({ op: Ops.PING, id }), this.#deadline(timeout), "waiting for fluxd's pong", { kind: 'release' });
      return msg?.op === Ops.PONG && this.connected && this.#conn.gen === gen;
    } catch {
      return false;
    }
  }

  /** @returns {boolean} whether `sub` was attached */
  #detach(sub) {
    const [map, key] = sub.path === undefined ? [this.subscriptions, sub.store] : [this.pathSubscriptions, pathKey(sub.store, sub.path)];
    const set = map.get(key);
    if (!set?.delete(sub)) return false;
    if (!set.size) {
      map.delete(key);
      if (sub.path === undefined) this.held.delete(sub.store);
    }
    return true;
  }

  #unsubscribeQuietly(store, path) {
    this.#sendQuietly(replyKey(Ops.UNSUBSCRIBED, store, path), path === undefined ? { op: Ops.UNSUBSCRIBE, store } : { op: Ops.UNSUBSCRIBE, store, path });
  }

  /** Sends a cleanup request whose reply nobody waits for (it is dropped when it comes). */
  #sendQuietly(key, fields) {
    if (!this.connected) return; // the connection that held it is gone, and with it what the request would end
    try { this.#conn.writer.write(encodeFrame(JSON.stringify(fields)), { force: true }); this.pending.expectLate(key); } catch { /* closed */ }
  }

  #checkAction(type) {
    if (!isValidActionType(type)) throw new TypeError(`invalid action type ${JSON.stringify(type)}: 1-256 bytes of A-Z a-z 0-9 . _ : / -`);
    return `d-${this.nextId++}`;
  }

  #deadline(timeout) { return new Deadline(timeout === undefined ? this.requestTimeout : timeout); }

  #request(fields, timeout) {
    const id = `r-${this.nextId++}`;
    return this.#call(id, JSON.stringify({ ...fields, id }), this.#deadline(timeout), `waiting for the reply to ${fields.op}`);
  }

  /**
   * Sends `body` (waiting for room in the write queue) and resolves with the reply keyed `key`. The deadline
   * covers both; when it passes, the request is taken back if it was still queued, the waiter is removed, a reply
   * that may still come is dropped, and `onGiveUp(where)` cleans up what the request may have left in fluxd
   * (`where`: 'unsent', 'here' = sent on the current connection, 'before' = sent on a connection since lost).
   * `kind` says what happens to the call when the connection is lost: 'request' (info, get, ping) and 'settle'
   * (dispatchAndSettle) wait for the next connection, where a request is sent again and a settlement recovered;
   * 'restore' (subscribe, query) is made again by the reconnection itself; 'release' (unsubscribe, unquery)
   * resolves, since the lost connection took what it would end with it.
   * @param {string} key @param {string} body @param {Deadline} deadline @param {string} what
   * @param {{kind?: Call['kind'], onGiveUp?: (where: 'unsent'|'here'|'before') => void}} [options]
   */
  async #call(key, body, deadline, what, { kind = 'request', onGiveUp = undefined } = {}) {
    if (this.closedReason) throw this.closedReason;
    const waiter = this.pending.add(key);
    /** @type {Call} */ const call = { key, kind, waiter, entry: undefined };
    try {
      const replay = kind === 'request' || kind === 'settle' || kind === 'ack';
      if (this.connected || replay) call.entry = this.#enqueue(encodeFrame(body), replay);
    } catch (err) { this.pending.abandon(waiter, false); throw err; }
    this.#calls.add(call);
    if (kind === 'settle') this.#settling.set(key, call);
    try {
      return await deadline.race(waiter.promise, () => {
        const where = this.#cancel(call.entry);
        this.pending.abandon(waiter, where === 'here');
        onGiveUp?.(where);
        let why = '';
        if (where === 'unsent') why = this.connected ? ' (the request was never sent: fluxd did not read this connection in time)' : ' (the request was never sent: not connected to fluxd, reconnecting)';
        else if (where === 'before') why = ' (the connection to fluxd was lost after the request was sent)';
        return new TimeoutError(`timed out after ${deadline.ms} ms ${what}${why}`, { timeoutMs: deadline.ms });
      });
    } finally {
      this.#calls.delete(call);
      if (this.#settling.get(key) === call) this.#settling.delete(key);
    }
  }

  /** Queues a frame on the connection, or (reconnecting) for the next one. */
  #enqueue(bytes, replay) {
    const order = ++this.#order;
    if (this.connected) {
      const entry = this.#conn.writer.enqueue(bytes);
      Object.assign(entry, { replay, order, gen: this.#conn.gen });
      return entry;
    }
    const entry = { bytes, state: /** @type {'offline'} */ ('offline'), replay, order };
    this.#offline.push(entry); this.#offlineBytes += bytes.length;
    return entry;
  }

  /** Takes a frame back if it was not sent. @returns {'unsent'|'here'|'before'} */
  #cancel(entry) {
    if (!entry || entry.state === 'cancelled') return 'unsent';
    if (entry.state === 'offline') {
      const at = this.#offline.indexOf(entry);
      if (at >= 0) { this.#offline.splice(at, 1); this.#offlineBytes -= entry.bytes.length; }
      entry.state = 'cancelled';
      return 'unsent';
    }
    if (this.connected && entry.gen === this.#conn.gen) return this.#conn.writer.cancel(entry) ? 'unsent' : 'here';
    return entry.state === 'sent' ? 'before' : 'unsent';
  }

  /** A fire-and-forget frame; `replay`: if the connection is lost before it is written, it goes on the next one. */
  #write(body, { force = false, replay = false } = {}) {
    if (this.closedReason) throw this.closedReason;
    const bytes = encodeFrame(body);
    if (this.connected) {
      const entry = this.#conn.writer.write(bytes, { force });
      Object.assign(entry, { replay, order: ++this.#order, gen: this.#conn.gen });
      return;
    }
    if (!replay) throw new DisconnectedError(`not connected to fluxd at ${this.#config.target} (reconnecting)`);
    const limit = this.#conn?.writer.maxQueued ?? DEFAULT_MAX_WRITE_QUEUE;
    if (!force && this.#offlineBytes > 0 && this.#offlineBytes + bytes.length > limit) throw new WriteQueueFullError(this.#offlineBytes, limit);
    this.#offline.push({ bytes, state: 'offline', replay, order: ++this.#order });
    this.#offlineBytes += bytes.length;
  }

  /** @returns {boolean} whether a call took the reply (or it was owed to one that gave up) */
  #settle(key, msg) { return this.pending.settle(key, msg, errorFromFrame) !== false; }

  // -- connections ------------------------------------------------------------------------------------------

  /** Opens a connection and does the handshake within `deadline`: resolves with it and fluxd's welcome. */
  async #open(deadline) {
    const { target, source, expected, heartbeat } = this.#config;
    const expired = (what) => () => new TimeoutError(`timed out after ${deadline.ms} ms ${what} (fluxd at ${target}, from ${source})`, { timeoutMs: deadline.ms });
    // waited for from the start: fluxd may refuse a connection (too-many-connections) before hello
    const conn = await openSocket(target, source, deadline, (socket) => this.#adopt(socket));
    try {
      await deadline.race(checkServerUid(target, expected), expired('checking the owner of the socket'));
      const hello = { op: Ops.HELLO, protocol: PROTOCOL_VERSION, role: this.role, name: this.name, session: this.session };
      if (heartbeat) hello.heartbeat = true; // fluxd pings us when it heard nothing for welcome.limits.pingInterval
      if (!conn.ended) conn.writer.write(encodeFrame(JSON.stringify(hello)), { force: true }); // else welcome says why
      const msg = await deadline.race(conn.welcome, expired("waiting for fluxd's welcome"));
      if (conn.ended) throw conn.endReason;
      return { conn, msg };
    } catch (err) {
      this.#drop(conn, err);
      throw err;
    }
  }

  /** A new socket: its writer, decoder and listeners (run synchronously on 'connect'). @returns {Connection} */
  #adopt(socket) {
    if (this.closedReason) throw this.closedReason; // closed while this attempt was connecting
    /** @type {any} */ const conn = { gen: ++this.#gens, socket, ready: false, ended: false, endReason: null };
    conn.welcome = new Promise((resolve, reject) => { conn.welcomed = resolve; conn.refused = reject; });
    conn.welcome.catch(() => {}); // observed by #open; a failed uid check leaves it to reject unobserved
    conn.writer = new FrameWriter(socket, {
      maxQueued: this.#config.maxWriteQueue,
      onBlocked: () => { if (conn.ready) this.emit('backpressure'); },
      onDrain: () => { if (conn.ready) this.emit('drain'); },
    });
    const decoder = new FrameDecoder();
    socket.on('data', (data) => { for (const e of decoder.feed(data)) if ('frame' in e) this.#route(conn, e.frame); });
    socket.on('close', () => this.#ended(conn, new DisconnectedError('fluxd closed the connection')));
    socket.on('error', (err) => this.#ended(conn, new DisconnectedError(conn.ready || !['EPIPE', 'ECONNRESET'].includes(err.code) ? err.message
      : `fluxd closed the connection during the handshake (${err.code}); it may have refused it (e.g. too-many-connections) before its error could be read`, err)));
    this.#conn = conn; this.socket = socket; this.writer = conn.writer;
    return conn;
  }

  /** The connection is ready: fluxd's welcome. */
  #welcomed(conn, msg) {
    conn.ready = true;
    this.welcome = { peer: msg.peer, server: msg.server, protocol: msg.protocol, limits: msg.limits };
    if (typeof msg.epoch === 'string') this.welcome.epoch = msg.epoch;
    if (typeof msg.durability === 'string') this.welcome.durability = msg.durability;
    this.state = 'connected';
    this.#connectedAt = performance.now();
  }

  /** Closes a connection that never became ready. */
  #drop(conn, reason) {
    conn.ended = true; conn.endReason ??= reason;
    conn.refused(reason);
    conn.writer.close(reason);
    conn.socket.destroy();
  }

  /** A connection ended (closed by fluxd or the network, bye, a fatal error). */
  #ended(conn, reason) {
    if (conn.ended) return;
    conn.ended = true; conn.endReason = reason;
    if (!conn.ready) { this.#drop(conn, reason); return; }
    this.#lost(conn, reason);
  }

  /** The ready connection is gone: reconnect (keeping what must go on the next one), or end for good. */
  #lost(conn, reason) {
    if (this.closedReason) return;
    if (this.#closing) { this.#finish(new DisconnectedError('closed locally')); return; }
    if (!this.#policy.enabled) { this.emit('disconnected', reason); this.#finish(reason); return; }
    const unsent = conn.writer.takeUnsent();
    conn.writer.close(reason);
    conn.socket.destroy();
    this.state = 'reconnecting';
    this.#lostAt = performance.now();
    // Frames that never reached the socket go on the next connection if they are dispatches or requests; the rest
    // (answers, subscribes, queries, pongs) belonged to this connection. Requests it sent are sent again.
    const again = unsent.filter((e) => { if (e.replay) return true; e.state = 'cancelled'; return false; });
    for (const call of this.#calls) {
      if (call.waiter.done) continue;
      if (call.kind === 'request' && call.entry?.state === 'sent') { call.entry.state = 'offline'; again.push(call.entry); }
      else if (call.kind === 'release') this.pending.resolveWaiter(call.waiter, { op: 'lost' });
      else if (call.kind === 'ack' && call.entry?.state === 'sent') {
        // Sent, and no answer: fluxd may or may not have accepted it (sending it again could make it twice).
        this.pending.rejectWaiter(call.waiter, new DisconnectedError(`the connection was lost before fluxd said whether it accepted the dispatch ${call.key}: it may or may not have been taken`));
      }
    }
    this.#offline.push(...again);
    this.#offline.sort((a, b) => a.order - b.order);
    this.#offlineBytes = this.#offline.reduce((n, e) => n + e.bytes.length, 0);
    this.pending.forgetOwed();
    this.#recovering.clear();
    for (const sink of [...this.storeSinks.values()]) sink({ op: 'disconnected', reason });
    this.emit('disconnected', reason);
    if (this.closedReason) return; // a listener closed the client
    const stable = performance.now() - this.#connectedAt >= this.#policy.maxDelay; // else keep backing off
    this.#scheduleReconnect(stable ? 1 : this.#lastAttempt + 1, reason);
  }

  #scheduleReconnect(attempt, lastError) {
    const policy = this.#policy;
    const elapsed = performance.now() - this.#lostAt;
    if (attempt > policy.maxAttempts || (policy.giveUpAfter !== null && elapsed >= policy.giveUpAfter && attempt > 1)) {
      const tries = `${attempt - 1} attempt${attempt === 2 ? '' : 's'}`;
      this.#finish(new DisconnectedError(`gave up reconnecting to fluxd at ${this.#config.target} after ${tries} in ${Math.round(elapsed)} ms (last: ${lastError.message})`, lastError));
      return;
    }
    let delay = backoffDelay(policy, attempt);
    delay = Math.max(delay, Math.ceil(this.#holdUntil - performance.now())); // a refused registration waits longer
    if (policy.giveUpAfter !== null) delay = Math.max(0, Math.min(delay, policy.giveUpAfter - elapsed));
    this.emit('reconnecting', { attempt, delay, error: lastError });
    if (this.closedReason) return;
    this.#timer = setTimeout(() => { this.#timer = undefined; this.#attempt(attempt); }, delay);
  }

  async #attempt(attempt) {
    if (this.state !== 'reconnecting') return;
    this.#lastAttempt = attempt;
    let opened;
    try {
      opened = await this.#open(new Deadline(this.#config.connectTimeout));
    } catch (err) {
      if (this.state !== 'reconnecting') return;
      if (isPermanent(err)) {
        this.#finish(new DisconnectedError(`fluxd at ${this.#config.target} refused to reconnect this client: ${err.message}`, err));
      } else {
        this.#scheduleReconnect(attempt + 1, err);
      }
      return;
    }
    if (this.state !== 'reconnecting') { this.#drop(opened.conn, this.closedReason ?? new DisconnectedError('closed locally')); return; }
    this.#resume(opened.conn, opened.msg, attempt);
  }

  /**
   * Reconnected: stores register again first, then subscriptions and queries are made again, settlements sent
   * before the loss are recovered (SPEC §15.4) and the frames that waited for the connection are sent, in order.
   */
  #resume(conn, msg, attempt) {
    const before = this.welcome?.epoch;
    this.#welcomed(conn, msg);
    // Seqs and versions compare only within one epoch; none (an older fluxd) is taken as a new one (SPEC §15.1).
    const epochChanged = before === undefined || this.welcome.epoch === undefined || this.welcome.epoch !== before;
    this.reconnects++;
    for (const sink of [...this.storeSinks.values()]) sink({ op: 'reconnected', epochChanged });
    if (epochChanged) this.held.clear();
    this.resyncing.clear();
    for (const [store, subs] of this.subscriptions) {
      if (epochChanged) for (const sub of subs) sub[kRebase]();
      // SPEC §16.3 resume: from the version held (same epoch); fluxd sends the deltas since, or the snapshot
      const frame = encodeFrame(JSON.stringify(this.#subscribeFrame(store, undefined, this.held.get(store)?.version)));
      // one subscribe per call still waiting for its `subscribed` (they are matched in order), at least one
      for (let n = Math.max(1, this.pending.count(`${Ops.SUBSCRIBED}:${store}`)); n > 0; n--) conn.writer.write(frame, { force: true });
    }
    for (const [key, subs] of this.pathSubscriptions) {
      const { store, path } = [...subs][0];
      if (epochChanged) for (const sub of subs) sub[kRebase]();
      const frame = encodeFrame(JSON.stringify(this.#subscribeFrame(store, path)));
      for (let n = Math.max(1, this.pending.count(`${Ops.SUBSCRIBED}:${key}`)); n > 0; n--) conn.writer.write(frame, { force: true });
    }
    for (const q of this.#queries.values()) conn.writer.write(encodeFrame(q.body), { force: true });
    const lost = [...this.#settling.values()].filter((c) => !c.waiter.done && c.entry?.state === 'sent');
    if (epochChanged) {
      for (const call of lost) {
        this.pending.rejectWaiter(call.waiter, new OutcomeUnknownError(call.key, `the connection to fluxd was lost before dispatch ${call.key} settled, and the fluxd reached again ${this.welcome.epoch === undefined ? 'keeps no history across restarts (no welcome.epoch)' : 'is a new history (another welcome.epoch)'}: whether the action was accepted is unknown`));
      }
    } else {
      for (let i = 0; i < lost.length; i += RECOVER_BATCH) {
        const ids = lost.slice(i, i + RECOVER_BATCH).map((c) => c.key);
        const id = `r-${this.nextId++}`;
        this.#recovering.set(id, ids);
        conn.writer.write(encodeFrame(JSON.stringify({ op: 'recover', id, ids })), { force: true });
      }
    }
    const offline = this.#offline.splice(0);
    this.#offlineBytes = 0;
    for (const entry of offline) { conn.writer.enqueue(entry); entry.gen = conn.gen; }
    this.emit('reconnected', { attempt, epochChanged, epoch: this.welcome.epoch, downtime: Math.round(performance.now() - this.#lostAt) });
    for (const w of this.#connectWaiters.splice(0)) w.resolve();
  }

  /** `recovered`: the outcome of each dispatch sent before the connection was lost (SPEC §15.4). */
  #recovered(msg) {
    if (typeof msg.id === 'string') this.#recovering.delete(msg.id);
    for (const outcome of Array.isArray(msg.outcomes) ? msg.outcomes : []) {
      const id = outcome?.id;
      const call = typeof id === 'string' ? this.#settling.get(id) : undefined;
      if (!call || call.waiter.done) continue;
      if (outcome.status === 'settled') {
        this.pending.resolveWaiter(call.waiter, { op: Ops.SETTLED, id, seq: outcome.seq, results: Array.isArray(outcome.results) ? outcome.results : [] });
      } else if (outcome.status === 'unknown') {
        this.pending.rejectWaiter(call.waiter, new NotSentError(id, `dispatch ${id} was not sent: the connection to fluxd was lost before fluxd accepted it (it may be dispatched again)`));
      } else if (outcome.status !== 'pending') { // pending: its settled comes on this connection
        this.pending.rejectWaiter(call.waiter, new OutcomeUnknownError(id, `fluxd answered recover for dispatch ${id} with status ${JSON.stringify(outcome.status)}, which this library does not know`));
      }
    }
  }

  /** @param {Connection} conn @param {Buffer} body */
  #route(conn, body) {
    if (conn.ended) return;
    let msg;
    try { msg = parseJSON(body.toString('utf8')); } catch { return; } // numbers exact (SPEC §16.1)
    if (!msg || typeof msg !== 'object' || Array.isArray(msg)) return;
    const id = typeof msg.id === 'string' ? msg.id : undefined;
    switch (msg.op) {
      case Ops.WELCOME: if (!conn.ready) conn.welcomed(msg); return;
      case Ops.PONG: case Ops.INFO: case Ops.GOT: case Ops.QUERY_OK: case Ops.UNQUERY_OK: case Ops.SETTLED: case Ops.ACCEPTED:
        this.#settle(id, msg); return;
      case 'recovered': this.#recovered(msg); return;
      case Ops.SUBSCRIBED: {
        const path = typeof msg.path === 'string' ? msg.path : undefined;
        const subs = path === undefined ? this.subscriptions.get(msg.store) : this.pathSubscriptions.get(pathKey(msg.store, path));
        for (const sub of subs ?? []) sub[kStatus](msg.status);
        this.#settle(replyKey(Ops.SUBSCRIBED, msg.store, path), msg); return;
      }
      case Ops.UNSUBSCRIBED: this.#settle(replyKey(Ops.UNSUBSCRIBED, msg.store, typeof msg.path === 'string' ? msg.path : undefined), msg); return;
      case Ops.SNAPSHOT:
        if (this.subscriptions.has(msg.store)) {
          const held = this.held.get(msg.store);
          if (!held || msg.version >= held.version || this.resyncing.has(msg.store)) this.held.set(msg.store, { version: msg.version, seq: msg.seq, state: msg.state });
          this.resyncing.delete(msg.store);
          for (const sub of this.subscriptions.get(msg.store)) sub[kDeliver](msg);
        }
        this.storeSinks.get(msg.store)?.(msg); return;
      case 'delta': this.#delta(msg); return;
      case 'subtree':
        for (const sub of this.pathSubscriptions.get(pathKey(msg.store, msg.path)) ?? []) sub[kDeliver](msg);
        return;
      case Ops.STORE_DOWN: case Ops.STORE_UP:
        for (const sub of this.subscriptions.get(msg.store) ?? []) sub[kDeliver](msg);
        for (const subs of this.pathSubscriptions.values()) for (const sub of subs) if (sub.store === msg.store) sub[kDeliver](msg);
        return;
      case Ops.REGISTERED: case Ops.QUERIES: case Ops.QUERIES_CHANGED: case Ops.ACTION:
        this.storeSinks.get(msg.store)?.(msg); return;
      case Ops.PING: // a heartbeat (only to a peer that said hello with heartbeat: true); answered before user code
        conn.writer.write(encodeFrame(JSON.stringify(id !== undefined ? { op: Ops.PONG, id } : { op: Ops.PONG })), { force: true });
        this.pingsAnswered++;
        this.emit('heartbeat', id);
        return;
      case Ops.ERROR: this.#error(conn, msg); return;
      case Ops.BYE: this.#ended(conn, new DisconnectedError(`fluxd said bye (${msg.reason})`)); return;
      default: // ops this library does not know are ignored (SPEC §13)
    }
  }

  /**
   * A `delta` (SPEC §16.3): applied to the state held when it is from that version; otherwise (or if it does not
   * apply) the client resynchronises: it subscribes again, without `from`, and takes the whole snapshot fluxd sends.
   */
  #delta(msg) {
    const subs = this.subscriptions.get(msg.store);
    if (!subs || this.resyncing.has(msg.store)) return; // not subscribed (any more), or a snapshot is on its way
    const held = this.held.get(msg.store);
    if (held && held.version >= msg.version) return; // already held (e.g. resumed from a version past it)
    let state;
    if (held && held.version === msg.from && Array.isArray(msg.patch)) {
      try { state = applyPatch(held.state, msg.patch); } catch { state = undefined; }
    }
    if (state === undefined) {
      this.deltaStats.resyncs++;
      this.resyncing.add(msg.store);
      this.#sendQuietly(`${Ops.SUBSCRIBED}:${msg.store}`, this.#subscribeFrame(msg.store));
      return;
    }
    this.deltaStats.applied++;
    this.held.set(msg.store, { version: msg.version, seq: msg.seq, state });
    const snapshot = { op: Ops.SNAPSHOT, store: msg.store, version: msg.version, seq: msg.seq, state };
    for (const sub of subs) sub[kDeliver](snapshot);
  }

  #error(conn, msg) {
    const ref = typeof msg.ref === 'string' ? msg.ref : undefined;
    const error = errorFromFrame(msg);
    const end = () => { if (error.fatal) this.#ended(conn, new DisconnectedError(`fluxd closed the connection: ${error.message}`, error)); };
    if (!conn.ready) { conn.refused(error); end(); return; } // the answer to hello
    let taken = false;
    const asked = ref !== undefined ? this.#recovering.get(ref) : undefined;
    if (asked) { // recover refused (unknown-op from a fluxd before 0.3.0, bad-message without a session, ...)
      taken = true;
      this.#recovering.delete(ref);
      for (const id of asked) {
        const call = this.#settling.get(id);
        if (call && !call.waiter.done) {
          this.pending.rejectWaiter(call.waiter, new OutcomeUnknownError(id, `fluxd refused to recover dispatch ${id} (${error.code}: ${error.detail}), sent before the connection was lost: whether it was accepted is unknown`, error));
        }
      }
    }
    taken ||= this.#settle(ref, msg) || this.#settle(`${Ops.SUBSCRIBED}:${ref}`, msg);
    if (!taken && ref !== undefined) { // a refused path subscription names the store: the oldest one waiting
      const key = this.pending.firstKey(`${Ops.SUBSCRIBED}:${ref} `);
      if (key !== undefined) taken = this.#settle(key, msg);
    }
    if (!taken) {
      if (ref !== undefined && this.storeSinks.has(ref)) this.storeSinks.get(ref)(msg);
      else { this.errors.push(error); if (this.errors.length > 256) this.errors.shift(); this.emit('error-frame', error); }
    }
    end();
  }

  /** The end for good: pending calls reject, subscriptions end, stores are told, 'close' is emitted. */
  #finish(reason) {
    if (this.closedReason) return;
    this.closedReason = reason;
    this.state = 'closed';
    clearTimeout(this.#timer); this.#timer = undefined;
    const conn = this.#conn;
    if (conn) { conn.ended = true; conn.endReason ??= reason; conn.refused(reason); conn.writer.close(reason); conn.socket.destroy(); }
    for (const e of this.#offline.splice(0)) e.state = 'cancelled';
    this.#offlineBytes = 0;
    for (const call of [...this.#settling.values()]) {
      if (call.waiter.done) continue;
      const id = call.key;
      this.pending.rejectWaiter(call.waiter, call.entry?.state === 'sent'
        ? new OutcomeUnknownError(id, `the connection to fluxd ended before dispatch ${id} settled (${reason.message}): whether it was accepted is unknown`, reason)
        : new NotSentError(id, `dispatch ${id} was not sent: ${reason.message}`, reason));
    }
    this.pending.rejectAll(reason);
    for (const w of this.#connectWaiters.splice(0)) w.reject(reason);
    for (const set of this.subscriptions.values()) for (const sub of set) sub[kEnd]();
    for (const set of this.pathSubscriptions.values()) for (const sub of set) sub[kEnd]();
    for (const sink of [...this.storeSinks.values()]) sink({ op: 'closed' });
    this.emit('close', reason);
  }
}

function checkStoreName(store) {
  if (!isValidStoreName(store)) throw new TypeError(`invalid store name ${JSON.stringify(store)}: 1-128 bytes of A-Z a-z 0-9 . _ : / -`);
}

/**
 * What a settlement of `type` still waits for, from fluxd's `info`: the stores handling it that are down (fluxd keeps
 * the action queued until they are back or their queue timeout ends), stalled, or busy; '' when nothing is.
 * @param {any} info @param {string} type @returns {string}
 */
function waitingNote(info, type) {
  const actions = (n) => (n === 1 ? '1 action' : `${n} actions`);
  const notes = [];
  for (const s of info?.stores ?? []) {
    if (!(s.handles ?? []).some((p) => typeof p === 'string' && patternMatches(p, type))) continue;
    const ahead = (s.queued ?? 0) + (s.inflight ?? 0);
    if (s.status === 'down') notes.push(`store "${s.name}", which is down (${actions(s.queued ?? 0)} queued for it; fluxd keeps them queued until the store is back or its queue timeout ends)`);
    else if (s.stalled) notes.push(`store "${s.name}", which is stalled (an action unanswered for ${Math.floor((s.stalledFor ?? 0) / 1000)} s)`);
    else if (ahead > 0) notes.push(`store "${s.name}", which has ${actions(ahead)} to answer before this one`);
  }
  return notes.length ? `; still waiting for ${notes.join('; ')}` : '';
}

function dispatchBody(id, type, payload, cause, settle, ack = false) {
  let head = `{"op":"dispatch","id":${JSON.stringify(id)},"type":${JSON.stringify(type)}`;
  if (settle) head += ',"settle":true';
  if (ack) head += ',"ack":true';
  if (cause !== undefined && cause !== null) head += `,"cause":${Number(cause)}`;
  return `${head},"payload":${canonicalJSON(payload)}}`;
}
