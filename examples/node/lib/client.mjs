// The connection to fluxd: handshake, requests and their replies (one deadline per call), routing of fluxd's
// messages to subscriptions and store workers, heartbeats, and the end of the connection.
import { EventEmitter } from 'node:events';
import { Ops, PROTOCOL_VERSION, ResultStatus, Roles } from './constants.mjs';
import { DisconnectedError, TimeoutError, errorFromFrame, errorFromResult } from './errors.mjs';
import { FrameDecoder, encodeFrame } from './framing.mjs';
import { canonicalJSON } from './canonical.mjs';
import { isValidStoreName, isValidActionType } from './names.mjs';
import { resolveSocketPath, expectedServerUid, checkServerUid } from './socket-path.mjs';
import { openSocket } from './connect.mjs';
import { Deadline } from './deadline.mjs';
import { PendingReplies } from './pending.mjs';
import { FrameWriter } from './writer.mjs';
import { Subscription, QueryReceipt } from './subscription.mjs';
import { kAttach, kRelease, kDeliver, kEnd, kStatus, kFirst } from './internal.mjs';

/** The default time limit of a request (dispatchAndSettle, subscribe, query, get, info, ping, ...). */
export const DEFAULT_REQUEST_TIMEOUT = 30000;
/** The default time limit of `Client.connect` (connecting, the uid check, hello and welcome). */
export const DEFAULT_CONNECT_TIMEOUT = 30000;

/**
 * @typedef {{peer: number, server: string, protocol: number, limits: Record<string, number>}} Welcome
 * @typedef {{store: string, status: string, version?: number, error?: Record<string, any>}} StoreResult
 */

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
 * fire-and-forget `dispatch`) are emitted as `'error-frame'` and kept in `errors`. When the connection ends,
 * pending calls reject with DisconnectedError and subscriptions end.
 */
export class Client extends EventEmitter {
  /**
   * Use `Client.connect`. @param {import('node:net').Socket} socket @param {string} name @param {string} role
   * @param {{maxWriteQueue?: number, requestTimeout?: number|null}} [options]
   */
  constructor(socket, name, role, { maxWriteQueue, requestTimeout = DEFAULT_REQUEST_TIMEOUT } = {}) {
    super();
    this.socket = socket; this.name = name; this.role = role;
    new Deadline(requestTimeout); // validates it
    /** @type {number|null} */ this.requestTimeout = requestTimeout;
    this.nextId = 1;
    this.pending = new PendingReplies();
    /** @type {Map<string, Set<Subscription>>} */ this.subscriptions = new Map();
    /** @type {Map<string, (msg: any) => void>} */ this.storeSinks = new Map();
    /** @type {import('./errors.mjs').FluxError[]} */ this.errors = [];
    /** @type {import('./errors.mjs').FluxError|null} */ this.closedReason = null;
    /** @type {Welcome|undefined} */ this.welcome = undefined;
    /** Heartbeat pings from fluxd answered (each also emits 'heartbeat' with the ping's id). */
    this.pingsAnswered = 0;
    this.writer = new FrameWriter(socket, {
      maxQueued: maxWriteQueue, onBlocked: () => this.emit('backpressure'), onDrain: () => this.emit('drain'),
    });
    const decoder = new FrameDecoder();
    socket.on('data', (data) => { for (const e of decoder.feed(data)) if ('frame' in e) this.#route(e.frame); });
    socket.on('close', () => this.#finish(new DisconnectedError('fluxd closed the connection')));
    socket.on('error', (err) => this.#finish(new DisconnectedError(this.welcome || !['EPIPE', 'ECONNRESET'].includes(err.code) ? err.message
      : `fluxd closed the connection during the handshake (${err.code}); it may have refused it (e.g. too-many-connections) before its error could be read`, err)));
  }

  /**
   * Connects and does the handshake; `timeout` (ms, default 30000; null = none) covers all of it. Rejects with
   * NoFluxdError (nothing at the socket: the message names the path, where it came from and what to do), a
   * protocol error class if fluxd refuses (e.g. TooManyConnectionsError), WrongServerUidError, or TimeoutError.
   * Socket: `socketPath`, else $FLUXBUS_SOCKET, else the default path (`defaultSocketPath`).
   * `heartbeat` (default true) asks fluxd to ping the connection when it is silent; the client answers each ping
   * with `pong` as soon as the event loop reads it (so code that blocks the event loop for longer than
   * `welcome.limits.pingInterval` × `maxPingsOut` ms gets the connection closed as `unresponsive`; awaiting does not).
   * `expectedServerUid` (else $FLUXBUS_SERVER_UID, else 0 when running as root; else no check) is the uid fluxd
   * must run as, checked before hello with `checkServerUid` (file ownership: Node has no SO_PEERCRED).
   * `requestTimeout` (ms, default 30000; null = none) is the limit of every later call that gives none.
   * `maxWriteQueue` (bytes, default 16 MiB) bounds what waits while fluxd does not read (see `flush`).
   * @param {{socketPath?: string, name?: string, role?: 'client'|'store'|'monitor', timeout?: number|null,
   *          requestTimeout?: number|null, heartbeat?: boolean, expectedServerUid?: number, maxWriteQueue?: number}} [options]
   * @returns {Promise<Client>}
   */
  static async connect({ socketPath, name = '', role = Roles.CLIENT, timeout = DEFAULT_CONNECT_TIMEOUT, requestTimeout,
    heartbeat = true, expectedServerUid: serverUid, maxWriteQueue } = {}) {
    if (!Object.values(Roles).includes(role)) throw new TypeError(`role must be one of ${Object.values(Roles).join(', ')}, not ${JSON.stringify(role)}`);
    const { path: target, source } = resolveSocketPath(socketPath);
    const expected = expectedServerUid(serverUid);
    const deadline = new Deadline(timeout);
    const expired = (what) => () => new TimeoutError(`timed out after ${deadline.ms} ms ${what} (fluxd at ${target}, from ${source})`, { timeoutMs: deadline.ms });
    let welcome; // waited for from the start: fluxd may refuse a connection (too-many-connections) before hello
    const client = await openSocket(target, source, deadline, (socket) => {
      const adopted = new Client(socket, name, role, { maxWriteQueue, requestTimeout });
      welcome = adopted.pending.add(Ops.WELCOME);
      welcome.promise.catch(() => {}); // observed below; a failed uid check leaves it to reject unobserved
      return adopted;
    });
    try {
      await deadline.race(checkServerUid(target, expected), expired('checking the owner of the socket'));
      const hello = { op: Ops.HELLO, protocol: PROTOCOL_VERSION, role, name };
      if (heartbeat) hello.heartbeat = true; // fluxd pings us when it heard nothing for welcome.limits.pingInterval
      if (!client.closed) client.writer.write(encodeFrame(JSON.stringify(hello)), { force: true }); // else welcome says why
      const msg = await deadline.race(welcome.promise, expired("waiting for fluxd's welcome"));
      client.welcome = { peer: msg.peer, server: msg.server, protocol: msg.protocol, limits: msg.limits };
      return client;
    } catch (err) {
      client.abort();
      throw err;
    }
  }

  /** Whether the connection has ended. */
  get closed() { return this.closedReason !== null; }

  /** Whether writes wait for fluxd to read (the socket said stop, or frames are queued); see `flush`. */
  get backpressured() { return this.writer.busy; }

  /**
   * Resolves once every frame sent so far has been handed to the kernel. A burst of fire-and-forget sends awaits
   * it now and then (or whenever `backpressured` is true): a `dispatch` that finds `maxWriteQueue` bytes waiting
   * throws WriteQueueFullError instead of queueing without bound.
   */
  flush() { return this.writer.flush(); }

  /**
   * Says bye, waits for fluxd to close (at most `timeout` ms, default 2000), then closes. Frames still queued are
   * written first. @param {number|{timeout?: number}} [options]
   */
  async close(options = 2000) {
    const timeout = typeof options === 'number' ? options : options?.timeout ?? 2000;
    if (!this.closed) {
      const ended = new Promise((resolve) => this.socket.once('close', resolve));
      try {
        this.writer.write(encodeFrame('{"op":"bye"}'), { force: true });
        await new Deadline(timeout).race(ended, () => new TimeoutError('bye'));
      } catch { /* closing anyway */ }
    }
    this.#finish(new DisconnectedError('closed locally'));
  }

  /** Closes at once without bye (like a crash). */
  abort() { this.#finish(new DisconnectedError('aborted')); }

  /**
   * Dispatches without waiting; returns the id (a refusal arrives as an 'error-frame' event with it as `ref`).
   * Throws WriteQueueFullError when `maxWriteQueue` bytes already wait (await `flush()` first).
   * @param {string} type @param {any} [payload] @param {{cause?: number}} [options] @returns {string}
   */
  dispatch(type, payload = null, { cause } = {}) {
    const id = this.#checkAction(type);
    this.#write(dispatchBody(id, type, payload, cause, false));
    return id;
  }

  /**
   * Dispatches and resolves with the Settlement (every target store's result; SPEC §8.3), rejected ones included
   * (`settlement.ok`, `settlement.errors`, `settlement.check()` throws StoreRejectedError, ...). Rejects with the
   * error class of fluxd's code if fluxd refused the action (NoHandlerError, OverloadedError, ...), TimeoutError
   * after `timeout` ms (the whole call). When it resolves, this client's subscriptions hold the new snapshots.
   * @param {string} type @param {any} [payload] @param {{cause?: number, timeout?: number|null}} [options]
   * @returns {Promise<Settlement>}
   */
  async dispatchAndSettle(type, payload = null, { cause, timeout } = {}) {
    const id = this.#checkAction(type);
    const msg = await this.#call(id, dispatchBody(id, type, payload, cause, true), this.#deadline(timeout), `waiting for the settlement of ${type}`);
    return new Settlement(type, msg);
  }

  /**
   * Subscribes to a store: `for await (const snapshot of subscription)` yields the retained snapshot, then every
   * newer one; leaving the loop (break, return, throw) or `subscription.close()` unsubscribes. `subscription.status`
   * is fluxd's word on the store: `up`, `down`, or `unknown` (no store of that name has registered yet: a
   * subscription still works and sees the store when it registers). `waitForSnapshot: true` resolves only once the
   * first snapshot is there (`subscription.latest`). `timeout` covers the whole call; when it passes while the
   * store is `unknown` the TimeoutError says "no store named 'x' has registered yet".
   * @param {string} store @param {{timeout?: number|null, waitForSnapshot?: boolean}} [options]
   * @returns {Promise<Subscription>}
   */
  async subscribe(store, { timeout, waitForSnapshot = false } = {}) {
    checkStoreName(store);
    const deadline = this.#deadline(timeout);
    const sub = new Subscription(this, store);
    this[kAttach](sub);
    let subscribed = false; // whether fluxd holds (or will hold) the subscription if this call fails
    try {
      await this.#call(`${Ops.SUBSCRIBED}:${store}`, JSON.stringify({ op: Ops.SUBSCRIBE, store }), deadline,
        `waiting for fluxd to confirm the subscription to '${store}'`, (sent) => { subscribed = sent; });
      subscribed = true;
      if (waitForSnapshot) {
        await sub[kFirst](deadline);
        if (!sub.latest) throw this.closedReason ?? new DisconnectedError(`the subscription to '${store}' ended before its first snapshot`);
      }
      return sub;
    } catch (err) {
      sub[kEnd]();
      this.#detach(sub);
      if (subscribed && !this.closed && !this.subscriptions.has(store)) this.#unsubscribeQuietly(store);
      throw err;
    }
  }

  /**
   * Ends every subscription of this client to `store` and unsubscribes (resolves on fluxd's `unsubscribed`).
   * @param {string} store @param {{timeout?: number|null}} [options]
   */
  async unsubscribe(store, { timeout } = {}) {
    checkStoreName(store);
    for (const sub of this.subscriptions.get(store) ?? []) sub[kEnd]();
    this.subscriptions.delete(store);
    if (this.closed) return;
    await this.#call(`${Ops.UNSUBSCRIBED}:${store}`, JSON.stringify({ op: Ops.UNSUBSCRIBE, store }), this.#deadline(timeout),
      `waiting for fluxd to confirm unsubscribing from '${store}'`);
  }

  /**
   * Declares a query (encoded canonically); active until `receipt.close()` or the connection ends. If the call
   * fails after the query went out (timeout), the query is withdrawn.
   * @param {string} store @param {any} query @param {{timeout?: number|null}} [options] @returns {Promise<QueryReceipt>}
   */
  async query(store, query, { timeout } = {}) {
    checkStoreName(store);
    const id = `q-${this.nextId++}`;
    const body = `{"op":"query","id":${JSON.stringify(id)},"store":${JSON.stringify(store)},"query":${canonicalJSON(query)}}`;
    await this.#call(id, body, this.#deadline(timeout), `waiting for fluxd to accept query ${id} on '${store}'`,
      (sent) => { if (sent && !this.closed) this.#sendQuietly(id, { op: Ops.UNQUERY, id }); });
    return new QueryReceipt(this, id, store, query);
  }

  /** Withdraws a query (QueryReceipt.close). @param {string} id @param {{timeout?: number|null}} [options] */
  async unquery(id, { timeout } = {}) {
    if (this.closed) return;
    await this.#call(id, JSON.stringify({ op: Ops.UNQUERY, id }), this.#deadline(timeout), `waiting for fluxd to withdraw query ${id}`);
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
   * is full, unless `force` (answers fluxd waits for). @param {string|Uint8Array} body @param {{force?: boolean}} [options]
   */
  sendRaw(body, options) { this.#write(body, options); }

  /** Sends a message object (see sendRaw). @param {Record<string, any>} fields @param {{force?: boolean}} [options] */
  send(fields, options) { this.#write(JSON.stringify(fields), options); }

  /** Routes a store's messages (registered, snapshot, queries, action, errors with its name as ref). @param {string} store @param {(msg: any) => void} sink */
  attachStore(store, sink) { this.storeSinks.set(store, sink); }

  /** @param {Subscription} sub @internal */
  [kAttach](sub) {
    const set = this.subscriptions.get(sub.store);
    if (set) set.add(sub); else this.subscriptions.set(sub.store, new Set([sub]));
  }

  /** Ends one subscription; the last of its store unsubscribes. @param {Subscription} sub @param {number|null} [timeout] @internal */
  async [kRelease](sub, timeout) {
    sub[kEnd]();
    if (!this.#detach(sub) || this.closed || this.subscriptions.has(sub.store)) return;
    await this.#call(`${Ops.UNSUBSCRIBED}:${sub.store}`, JSON.stringify({ op: Ops.UNSUBSCRIBE, store: sub.store }),
      this.#deadline(timeout), `waiting for fluxd to confirm unsubscribing from '${sub.store}'`);
  }

  /** @returns {boolean} whether `sub` was attached */
  #detach(sub) {
    const set = this.subscriptions.get(sub.store);
    if (!set?.delete(sub)) return false;
    if (!set.size) this.subscriptions.delete(sub.store);
    return true;
  }

  #unsubscribeQuietly(store) { this.#sendQuietly(`${Ops.UNSUBSCRIBED}:${store}`, { op: Ops.UNSUBSCRIBE, store }); }

  /** Sends a cleanup request whose reply nobody waits for (it is dropped when it comes). */
  #sendQuietly(key, fields) {
    try { this.writer.write(encodeFrame(JSON.stringify(fields)), { force: true }); this.pending.expectLate(key); } catch { /* closed */ }
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
   * that may still come is dropped, and `onGiveUp(sent)` cleans up what the request may have left in fluxd.
   */
  async #call(key, body, deadline, what, onGiveUp = undefined) {
    if (this.closedReason) throw this.closedReason;
    const waiter = this.pending.add(key);
    let entry;
    try { entry = this.writer.enqueue(encodeFrame(body)); } catch (err) { this.pending.abandon(waiter, false); throw err; }
    return deadline.race(waiter.promise, () => {
      const sent = !this.writer.cancel(entry);
      this.pending.abandon(waiter, sent);
      onGiveUp?.(sent);
      const unsent = sent ? '' : ' (the request was never sent: fluxd did not read this connection in time)';
      return new TimeoutError(`timed out after ${deadline.ms} ms ${what}${unsent}`, { timeoutMs: deadline.ms });
    });
  }

  #write(body, { force = false } = {}) {
    if (this.closedReason) throw this.closedReason;
    this.writer.write(encodeFrame(body), { force });
  }

  /** @returns {boolean} whether a call took the reply (or it was owed to one that gave up) */
  #settle(key, msg) { return this.pending.settle(key, msg, errorFromFrame) !== false; }

  /** @param {Buffer} body */
  #route(body) {
    let msg;
    try { msg = JSON.parse(body.toString('utf8')); } catch { return; }
    if (!msg || typeof msg !== 'object' || Array.isArray(msg)) return;
    const id = typeof msg.id === 'string' ? msg.id : undefined;
    switch (msg.op) {
      case Ops.WELCOME: this.#settle(Ops.WELCOME, msg); return;
      case Ops.PONG: case Ops.INFO: case Ops.GOT: case Ops.QUERY_OK: case Ops.UNQUERY_OK: case Ops.SETTLED:
        this.#settle(id, msg); return;
      case Ops.SUBSCRIBED:
        for (const sub of this.subscriptions.get(msg.store) ?? []) sub[kStatus](msg.status);
        this.#settle(`${Ops.SUBSCRIBED}:${msg.store}`, msg); return;
      case Ops.UNSUBSCRIBED: this.#settle(`${Ops.UNSUBSCRIBED}:${msg.store}`, msg); return;
      case Ops.SNAPSHOT:
        for (const sub of this.subscriptions.get(msg.store) ?? []) sub[kDeliver](msg);
        this.storeSinks.get(msg.store)?.(msg); return;
      case Ops.STORE_DOWN: case Ops.STORE_UP:
        for (const sub of this.subscriptions.get(msg.store) ?? []) sub[kDeliver](msg);
        return;
      case Ops.REGISTERED: case Ops.QUERIES: case Ops.QUERIES_CHANGED: case Ops.ACTION:
        this.storeSinks.get(msg.store)?.(msg); return;
      case Ops.PING: // a heartbeat (only to a peer that said hello with heartbeat: true); answered before user code
        if (!this.closed) this.writer.write(encodeFrame(JSON.stringify(id !== undefined ? { op: Ops.PONG, id } : { op: Ops.PONG })), { force: true });
        this.pingsAnswered++;
        this.emit('heartbeat', id);
        return;
      case Ops.ERROR: this.#error(msg); return;
      case Ops.BYE: this.#finish(new DisconnectedError(`fluxd said bye (${msg.reason})`)); return;
      default: // ops this library does not know are ignored (SPEC §13)
    }
  }

  #error(msg) {
    const ref = typeof msg.ref === 'string' ? msg.ref : undefined;
    const error = errorFromFrame(msg);
    const taken = this.#settle(ref, msg) || this.#settle(`${Ops.SUBSCRIBED}:${ref}`, msg)
      || (!this.welcome && this.#settle(Ops.WELCOME, msg));
    if (!taken) {
      if (ref !== undefined && this.storeSinks.has(ref)) this.storeSinks.get(ref)(msg);
      else { this.errors.push(error); if (this.errors.length > 256) this.errors.shift(); this.emit('error-frame', error); }
    }
    if (error.fatal) this.#finish(new DisconnectedError(`fluxd closed the connection: ${error.message}`, error));
  }

  #finish(reason) {
    if (this.closedReason) return;
    this.closedReason = reason;
    this.writer.close(reason);
    this.pending.rejectAll(reason);
    for (const set of this.subscriptions.values()) for (const sub of set) sub[kEnd]();
    for (const sink of this.storeSinks.values()) sink({ op: 'closed' });
    this.socket.destroy();
    this.emit('close', reason);
  }
}

function checkStoreName(store) {
  if (!isValidStoreName(store)) throw new TypeError(`invalid store name ${JSON.stringify(store)}: 1-128 bytes of A-Z a-z 0-9 . _ : / -`);
}

function dispatchBody(id, type, payload, cause, settle) {
  let head = `{"op":"dispatch","id":${JSON.stringify(id)},"type":${JSON.stringify(type)}`;
  if (settle) head += ',"settle":true';
  if (cause !== undefined && cause !== null) head += `,"cause":${Number(cause)}`;
  return `${head},"payload":${canonicalJSON(payload)}}`;
}
