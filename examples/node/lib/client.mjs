// The connection to fluxd: handshake, request/reply matching, routing of fluxd's messages.
import net from 'node:net';
import { EventEmitter } from 'node:events';
import { PROTOCOL_VERSION } from './constants.mjs';
import { FluxError } from './errors.mjs';
import { FrameDecoder, encodeFrame } from './framing.mjs';
import { canonicalJSON } from './canonical.mjs';
import { isValidStoreName, isValidActionType } from './names.mjs';
import { defaultSocketPath, expectedServerUid, checkServerUid } from './socket-path.mjs';
import { Subscription, QueryReceipt } from './subscription.mjs';


/**
 * @typedef {{peer: number, server: string, protocol: number, limits: Record<string, number>}} Welcome
 * @typedef {{store: string, version: number, seq: number, state: any}} Snapshot
 * @typedef {{store: string, status: 'done'|'rejected'|'unavailable'|string, version?: number, error?: Record<string, any>}} StoreResult
 * @typedef {{id: string, seq: number, results: StoreResult[], ok: boolean}} Settlement
 * @typedef {{query: any, count: number}} ActiveQuery
 */

/** Where a message from fluxd goes. @param {Record<string, any>} msg @returns {[string, string|undefined]} */
function routeKey(msg) {
  switch (msg.op) {
    case 'pong': case 'info': case 'got': case 'query-ok': case 'unquery-ok': case 'settled':
      return ['reply', typeof msg.id === 'string' ? msg.id : undefined];
    case 'subscribed': case 'unsubscribed': return ['reply', `${msg.op}:${msg.store}`];
    case 'snapshot': case 'store-down': case 'store-up': return ['subscription', msg.store];
    case 'registered': case 'queries': case 'queries-changed': case 'action': return ['store', msg.store];
    case 'ping': return ['ping', undefined]; // a heartbeat (only to a peer that said hello with heartbeat: true)
    case 'error': return ['error', typeof msg.ref === 'string' ? msg.ref : undefined];
    case 'bye': return ['bye', undefined];
    default: return ['ignore', undefined]; // ops this library does not know are ignored (SPEC §13)
  }
}

/**
 * A connection to fluxd (protocol 1). `await Client.connect({socketPath, name, role})`.
 * Replies resolve the Promise of the call they answer (matched by generated ids); errors that answer no call
 * (e.g. `no-handler` for a fire-and-forget `dispatch`) are emitted as `'error-frame'` events and kept in `errors`.
 * When the connection ends, pending calls reject with FluxError `disconnected` and subscriptions end.
 */
export class Client extends EventEmitter {
  /** @param {net.Socket} socket @param {string} name @param {string} role */
  constructor(socket, name, role) {
    super();
    this.socket = socket; this.name = name; this.role = role;
    this.nextId = 1;
    /** @type {Map<string, {resolve: Function, reject: Function}>} */ this.pending = new Map();
    /** @type {Map<string, Subscription>} */ this.subscriptions = new Map();
    /** @type {Map<string, (msg: any) => void>} */ this.storeSinks = new Map();
    /** @type {FluxError[]} */ this.errors = [];
    /** @type {FluxError|null} */ this.closedReason = null;
    /** @type {Welcome|undefined} */ this.welcome = undefined;
    /** Heartbeat pings from fluxd answered (each also emits 'heartbeat' with the ping's id). */
    this.pingsAnswered = 0;
    const decoder = new FrameDecoder();
    socket.on('data', (data) => { for (const e of decoder.feed(data)) if ('frame' in e) this.#route(e.frame); });
    socket.on('close', () => this.#finish(new FluxError('disconnected', 'fluxd closed the connection', true)));
    socket.on('error', (err) => this.#finish(new FluxError('disconnected', this.welcome || !['EPIPE', 'ECONNRESET'].includes(err.code) ? err.message
      : `fluxd closed the connection during the handshake (${err.code}); it may have refused it (e.g. too-many-connections) before its error could be read`, true)));
  }

  /**
   * Connects and does the handshake; rejects with FluxError if fluxd refuses (e.g. `too-many-connections`).
   * `heartbeat` (default true) asks fluxd to ping the connection when it is silent; the client answers each ping
   * with `pong` as soon as the event loop reads it (so code that blocks the event loop for longer than
   * `welcome.limits.pingInterval` × `maxPingsOut` ms gets the connection closed as `unresponsive`; awaiting does not).
   * `expectedServerUid` (else $FLUXBUS_SERVER_UID, else 0 when running as root; else no check) is the uid fluxd
   * must run as, checked before hello with `checkServerUid` (file ownership: Node has no SO_PEERCRED).
   * @param {{socketPath?: string, name?: string, role?: 'client'|'store'|'monitor', timeout?: number,
   *          heartbeat?: boolean, expectedServerUid?: number}} [options]
   * @returns {Promise<Client>}
   */
  static async connect({ socketPath, name = '', role = 'client', timeout = 30000, heartbeat = true, expectedServerUid: serverUid } = {}) {
    const target = socketPath || defaultSocketPath();
    const expected = expectedServerUid(serverUid);
    const socket = net.createConnection(target);
    await new Promise((resolve, reject) => { socket.once('connect', resolve); socket.once('error', reject); });
    try { await checkServerUid(target, expected); } catch (err) { socket.destroy(); throw err; }
    const client = new Client(socket, name, role);
    const welcome = client.#expect('welcome');
    const hello = { op: 'hello', protocol: PROTOCOL_VERSION, role, name };
    if (heartbeat) hello.heartbeat = true; // fluxd pings us when it heard nothing for welcome.limits.pingInterval
    client.#send(hello);
    let msg;
    try { msg = await withTimeout(welcome, timeout, 'welcome'); } catch (err) { client.abort(); throw err; }
    client.welcome = { peer: msg.peer, server: msg.server, protocol: msg.protocol, limits: msg.limits };
    return client;
  }

  /** Whether the connection has ended. */
  get closed() { return this.closedReason !== null; }

  /** Says bye, waits (≤ timeout ms) for fluxd to close, then closes. @param {number} [timeout] */
  async close(timeout = 2000) {
    if (!this.closed) {
      const ended = new Promise((resolve) => this.socket.once('close', resolve));
      try { this.#send({ op: 'bye' }); await withTimeout(ended, timeout, 'close'); } catch { /* closing anyway */ }
    }
    this.#finish(new FluxError('disconnected', 'closed locally', true));
  }

  /** Closes at once without bye (like a crash). */
  abort() { this.#finish(new FluxError('disconnected', 'aborted', true)); }

  /**
   * Dispatches without waiting; returns the id (a refusal arrives as an 'error-frame' event with it as ref).
   * @param {string} type @param {any} [payload] @param {{cause?: number}} [options] @returns {string}
   */
  dispatch(type, payload = null, { cause } = {}) {
    const id = this.#checkAction(type);
    this.#sendRaw(dispatchBody(id, type, payload, cause, false));
    return id;
  }

  /**
   * Dispatches and resolves with the settlement (every target store's result; SPEC §8.3). Rejects with
   * FluxError if fluxd refused the action. When it resolves, this client's subscriptions hold the new snapshots.
   * @param {string} type @param {any} [payload] @param {{cause?: number, timeout?: number}} [options]
   * @returns {Promise<Settlement>}
   */
  async dispatchAndSettle(type, payload = null, { cause, timeout } = {}) {
    const id = this.#checkAction(type);
    const reply = this.#expect(id);
    this.#sendRaw(dispatchBody(id, type, payload, cause, true));
    const msg = await withTimeout(reply, timeout, `settlement of ${type}`);
    return { id: msg.id, seq: msg.seq, results: msg.results, ok: msg.results.every((r) => r.status === 'done') };
  }

  /**
   * Subscribes to a store: `for await (const snapshot of subscription)` yields the retained snapshot, then every
   * newer one. `subscription.close()` unsubscribes.
   * @param {string} store @param {{timeout?: number}} [options] @returns {Promise<Subscription>}
   */
  async subscribe(store, { timeout } = {}) {
    if (!isValidStoreName(store)) throw new TypeError(`invalid store name ${store}`);
    let sub = this.subscriptions.get(store);
    if (!sub) { sub = new Subscription(this, store); this.subscriptions.set(store, sub); }
    const reply = this.#expect(`subscribed:${store}`);
    this.#send({ op: 'subscribe', store });
    sub.status = (await withTimeout(reply, timeout, `subscribe ${store}`)).status;
    return sub;
  }

  /** @param {string} store @internal */
  async unsubscribe(store) {
    this.subscriptions.delete(store);
    if (this.closed) return;
    const reply = this.#expect(`unsubscribed:${store}`);
    this.#send({ op: 'unsubscribe', store });
    await reply;
  }

  /**
   * Declares a query (encoded canonically); active until `receipt.close()` or the connection ends.
   * @param {string} store @param {any} query @returns {Promise<QueryReceipt>}
   */
  async query(store, query, { timeout } = {}) {
    if (!isValidStoreName(store)) throw new TypeError(`invalid store name ${store}`);
    const id = `q-${this.nextId++}`;
    const reply = this.#expect(id);
    this.#sendRaw(`{"op":"query","id":${JSON.stringify(id)},"store":${JSON.stringify(store)},"query":${canonicalJSON(query)}}`);
    await withTimeout(reply, timeout, `query ${id}`);
    return new QueryReceipt(this, id, store, query);
  }

  /** @param {string} id @internal */
  async unquery(id) {
    if (this.closed) return;
    const reply = this.#expect(id);
    this.#send({ op: 'unquery', id });
    await reply;
  }

  /** fluxd's introspection data (SPEC §8.7). @returns {Promise<Record<string, any>>} */
  info({ timeout } = {}) { return this.#request({ op: 'info' }, timeout); }

  /** A store's retained snapshot (FluxError unknown-store if none). @param {string} store @returns {Promise<Snapshot>} */
  async get(store, { timeout } = {}) {
    const m = await this.#request({ op: 'get', store }, timeout);
    return { store: m.store, version: m.version, seq: m.seq, state: m.state };
  }

  /** Round trip in ms; a barrier for earlier replies. @returns {Promise<number>} */
  async ping({ timeout } = {}) {
    const start = performance.now();
    await this.#request({ op: 'ping' }, timeout);
    return performance.now() - start;
  }

  /** Sends a frame body as it is (tests, tools). @param {string|Buffer} body */
  sendRaw(body) { this.#sendRaw(body); }

  /** Routes a store's messages (registered, snapshot, queries, action, errors with its name as ref). @internal */
  attachStore(store, sink) { this.storeSinks.set(store, sink); }

  /** Sends a message object. @internal */
  send(fields) { this.#send(fields); }

  #checkAction(type) {
    if (!isValidActionType(type)) throw new TypeError(`invalid action type ${type}`);
    return `d-${this.nextId++}`;
  }

  async #request(fields, timeout) {
    const id = `r-${this.nextId++}`;
    const reply = this.#expect(id);
    this.#send({ ...fields, id });
    return withTimeout(reply, timeout, fields.op);
  }

  #expect(key) {
    if (this.closedReason) throw this.closedReason;
    return new Promise((resolve, reject) => this.pending.set(key, { resolve, reject }));
  }

  #send(fields) { this.#sendRaw(JSON.stringify(fields)); }

  #sendRaw(body) {
    if (this.closedReason) throw this.closedReason;
    this.socket.write(encodeFrame(body));
  }

  #settle(key, msg) {
    const waiter = key === undefined ? undefined : this.pending.get(key);
    if (!waiter) return false;
    this.pending.delete(key);
    if (msg.op === 'error') waiter.reject(FluxError.fromFrame(msg)); else waiter.resolve(msg);
    return true;
  }

  /** @param {Buffer} body */
  #route(body) {
    let msg;
    try { msg = JSON.parse(body.toString('utf8')); } catch { return; }
    if (!msg || typeof msg !== 'object' || Array.isArray(msg)) return;
    if (msg.op === 'welcome') { this.#settle('welcome', msg); return; }
    const [kind, key] = routeKey(msg);
    if (kind === 'reply') this.#settle(key, msg);
    else if (kind === 'subscription') {
      this.subscriptions.get(key)?.deliver(msg);
      if (msg.op === 'snapshot') this.storeSinks.get(key)?.(msg);
    } else if (kind === 'store') this.storeSinks.get(key)?.(msg);
    else if (kind === 'error') {
      const error = FluxError.fromFrame(msg);
      if (!this.#settle(key, msg) && !this.#settle(`subscribed:${key}`, msg) && !this.#settle('welcome', msg)) {
        if (key !== undefined && this.storeSinks.has(key)) this.storeSinks.get(key)(msg);
        else { this.errors.push(error); if (this.errors.length > 256) this.errors.shift(); this.emit('error-frame', error); }
      }
      if (error.fatal) this.#finish(new FluxError('disconnected', `fluxd closed the connection: ${error.message}`, true, undefined, error));
    } else if (kind === 'ping') {
      if (!this.closed) this.#send(typeof msg.id === 'string' ? { op: 'pong', id: msg.id } : { op: 'pong' });
      this.pingsAnswered++;
      this.emit('heartbeat', msg.id);
    } else if (kind === 'bye') this.#finish(new FluxError('disconnected', `fluxd said bye (${msg.reason})`, true));
  }

  #finish(reason) {
    if (this.closedReason) return;
    this.closedReason = reason;
    for (const waiter of this.pending.values()) waiter.reject(reason);
    this.pending.clear();
    for (const sub of this.subscriptions.values()) sub.end();
    for (const sink of this.storeSinks.values()) sink({ op: 'closed' });
    this.socket.destroy();
    this.emit('close', reason);
  }
}

function dispatchBody(id, type, payload, cause, settle) {
  let head = `{"op":"dispatch","id":${JSON.stringify(id)},"type":${JSON.stringify(type)}`;
  if (settle) head += ',"settle":true';
  if (cause !== undefined && cause !== null) head += `,"cause":${Number(cause)}`;
  return `${head},"payload":${canonicalJSON(payload)}}`;
}


export function withTimeout(promise, ms, what) {
  if (ms === undefined || ms === null) return promise;
  let timer;
  return Promise.race([promise, new Promise((_, reject) => {
    timer = setTimeout(() => reject(new FluxError('timeout', `timed out waiting for ${what}`)), ms);
  })]).finally(() => clearTimeout(timer));
}

