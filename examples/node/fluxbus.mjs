// FluxBus for Node.js (18+, standard library only): a client with a Promise / async-iterator API, a Store base
// class for store workers, and the wire layer (frame decoder, strict envelope check). Protocol: protocol/SPEC.md.
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { EventEmitter } from 'node:events';

export const PROTOCOL_VERSION = 1;
const NAME = /^[A-Za-z0-9._:/-]+$/;

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

/**
 * fluxd's socket, by the rule fluxd and every SDK share: $FLUXBUS_SOCKET if set and non-empty, else
 * $XDG_RUNTIME_DIR/fluxbus/fluxd.sock if that is set and non-empty, else $TMPDIR/fluxbus-<uid>/fluxd.sock with
 * TMPDIR = /tmp when unset or empty (trailing slashes dropped).
 * @param {{env?: Record<string, string|undefined>, uid?: number}} [options] injectable for tests
 */
export function defaultSocketPath({ env = process.env, uid = process.getuid?.() ?? os.userInfo().uid } = {}) {
  if (env.FLUXBUS_SOCKET) return env.FLUXBUS_SOCKET;
  // Trailing slashes are dropped ('/tmp/' is '/tmp', '/' the root directory), as fluxd and the Swift SDK do.
  if (env.XDG_RUNTIME_DIR) return `${env.XDG_RUNTIME_DIR.replace(/\/+$/, '')}/fluxbus/fluxd.sock`;
  return `${(env.TMPDIR || '/tmp').replace(/\/+$/, '')}/fluxbus-${uid}/fluxd.sock`;
}

/**
 * The uid fluxd must run as, or undefined for no check: `expected` if given, else $FLUXBUS_SERVER_UID if set and
 * non-empty (a number), else 0 when this process runs as root (euid 0).
 * @param {number|undefined} [expected] @param {Record<string, string|undefined>} [env] @param {number} [euid]
 * @returns {number|undefined}
 */
export function expectedServerUid(expected, env = process.env, euid = process.geteuid?.()) {
  if (expected !== undefined && expected !== null) return Number(expected);
  const text = env.FLUXBUS_SERVER_UID;
  if (text) {
    if (!/^\s*[0-9]+\s*$/.test(text)) throw new TypeError(`FLUXBUS_SERVER_UID must be a uid (a number), not ${JSON.stringify(text)}`);
    return Number(text);
  }
  return euid === 0 ? 0 : undefined;
}

/**
 * Node has no SO_PEERCRED: the check is that the socket file and its directory (symlinks resolved) are owned by
 * `expected`, and that the directory is not writable by group or others unless it is sticky (so nobody else can
 * have put a socket there). Throws FluxError `wrong-server-uid`.
 * @param {string} socketPath @param {number|undefined} expected
 */
export async function checkServerUid(socketPath, expected) {
  if (expected === undefined) return;
  const real = await fs.promises.realpath(socketPath);
  const file = await fs.promises.stat(real);
  const hint = (uid) => `set FLUXBUS_SERVER_UID=${uid} to accept`;
  if (file.uid !== expected) {
    throw new FluxError('wrong-server-uid', `fluxd at ${socketPath} is run by uid ${file.uid}, expected ${expected}; ${hint(file.uid)}`, true);
  }
  const directory = path.dirname(real);
  const dir = await fs.promises.stat(directory);
  if (dir.uid !== expected) {
    throw new FluxError('wrong-server-uid', `fluxd at ${socketPath}: its directory ${directory} is owned by uid ${dir.uid}, expected ${expected}; ${hint(dir.uid)}`, true);
  }
  if ((dir.mode & 0o022) !== 0 && (dir.mode & 0o1000) === 0) {
    throw new FluxError('wrong-server-uid', `fluxd at ${socketPath}: its directory ${directory} is writable by group or others (mode ${(dir.mode & 0o7777).toString(8)}) and not sticky, so uid ${expected} may not own the listener`, true);
  }
}

/** @param {string} name SPEC §4.1 store name. */
export const isValidStoreName = (name) => typeof name === 'string' && NAME.test(name) && Buffer.byteLength(name) <= 128;
/** @param {string} type SPEC §4.1 action type. */
export const isValidActionType = (type) => typeof type === 'string' && NAME.test(type) && Buffer.byteLength(type) <= 256;
/** SPEC §5: exact type, or prefix followed by one trailing `*`. @param {string} pattern @param {string} type */
export const patternMatches = (pattern, type) => pattern.endsWith('*') ? type.startsWith(pattern.slice(0, -1)) : pattern === type;

/** Canonical JSON (sorted keys, no whitespace): equal values give equal bytes. @param {any} value @returns {string} */
export function canonicalJSON(value) {
  if (value === undefined) return 'null';
  if (value === null || typeof value !== 'object') {
    if (typeof value === 'number' && !Number.isFinite(value)) throw new TypeError('NaN/Infinity are not JSON');
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) return '[' + value.map(canonicalJSON).join(',') + ']';
  const keys = Object.keys(value).filter((k) => value[k] !== undefined).sort(byCodePoint);
  return '{' + keys.map((k) => JSON.stringify(k) + ':' + canonicalJSON(value[k])).join(',') + '}';
}

/** Orders strings by Unicode code point (= UTF-8 byte order), as SPEC §8.6's canonical encoding asks. */
function byCodePoint(a, b) {
  const x = [...a]; const y = [...b];
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const d = x[i].codePointAt(0) - y[i].codePointAt(0);
    if (d !== 0) return d;
  }
  return x.length - y.length;
}

/** A frame: 4-byte big-endian length, then the body. @param {Buffer|string} body @returns {Buffer} */
export function encodeFrame(body) {
  const bytes = typeof body === 'string' ? Buffer.from(body, 'utf8') : body;
  const header = Buffer.alloc(4);
  header.writeUInt32BE(bytes.length);
  return Buffer.concat([header, bytes]);
}

/**
 * @typedef {{frame: Buffer} | {empty: true} | {tooLarge: number}} FrameEvent
 */

/** Reassembles frames from a stream split or coalesced in any way (SPEC §3.1, vectors/framing.json). */
export class FrameDecoder {
  /** @param {number} [maxFrame] largest body accepted; a larger length ends the stream (`tooLarge`). */
  constructor(maxFrame = 0xffffffff) {
    this.maxFrame = maxFrame;
    /** @type {Buffer[]} */ this.chunks = [];
    this.length = 0;
    this.failed = false;
  }
  /** Bytes held that are not yet a complete frame. */
  get pending() { return this.length; }
  /** @param {Buffer} data @returns {FrameEvent[]} the events completed by `data` */
  feed(data) {
    if (this.failed) return [];
    if (data.length) { this.chunks.push(data); this.length += data.length; }
    /** @type {FrameEvent[]} */ const events = [];
    let buffer = this.chunks.length === 1 ? this.chunks[0] : Buffer.concat(this.chunks, this.length);
    let offset = 0;
    while (buffer.length - offset >= 4) {
      const n = buffer.readUInt32BE(offset);
      if (n > this.maxFrame) {
        this.failed = true; events.push({ tooLarge: n }); buffer = Buffer.alloc(0); offset = 0; break;
      }
      if (buffer.length - offset < 4 + n) break;
      if (n === 0) events.push({ empty: true });
      else events.push({ frame: Buffer.from(buffer.subarray(offset + 4, offset + 4 + n)) });
      offset += 4 + n;
    }
    const rest = buffer.subarray(offset);
    this.chunks = rest.length ? [rest] : [];
    this.length = rest.length;
    return events;
  }
}

/** The body is not valid protocol JSON (`code` "bad-json") or not an envelope ("bad-message"). */
export class EnvelopeError extends Error {
  /** @param {string} code @param {string} message */
  constructor(code, message) { super(`${code}: ${message}`); this.code = code; }
}

/**
 * Checks a frame body as fluxd does (SPEC §3.2): UTF-8, RFC 8259 grammar, paired surrogate escapes, depth ≤ 64,
 * nothing after the value (else bad-json); then a top-level object without repeated keys (else bad-message).
 * @param {Buffer} body
 * @returns {{keys: string[], raw: Record<string, string>}} top-level keys in order and each value's source text
 */
export function checkEnvelope(body) {
  let text;
  if (body.length >= 3 && body[0] === 0xef && body[1] === 0xbb && body[2] === 0xbf) throw new EnvelopeError('bad-json', 'byte order mark');
  try { text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(body); } catch { throw new EnvelopeError('bad-json', 'invalid UTF-8'); }
  let i = 0;
  const fail = (what) => new EnvelopeError('bad-json', `${what} at ${i}`);
  const ws = () => { while (i < text.length && ' \t\r\n'.includes(text[i])) i++; };
  const hex4 = () => {
    const d = text.slice(i, i + 4);
    if (!/^[0-9a-fA-F]{4}$/.test(d)) throw fail('bad \\u escape');
    i += 4; return parseInt(d, 16);
  };
  const string = () => {
    i++; let out = '';
    for (;;) {
      if (i >= text.length) throw fail('unterminated string');
      const c = text[i++];
      if (c === '"') return out;
      if (c < ' ') throw fail('raw control character');
      if (c !== '\\') { out += c; continue; }
      const e = text[i++];
      const simple = { '"': '"', '\\': '\\', '/': '/', b: '\b', f: '\f', n: '\n', r: '\r', t: '\t' }[e];
      if (simple !== undefined) { out += simple; continue; }
      if (e !== 'u') throw fail('bad escape');
      let code = hex4();
      if (code >= 0xdc00 && code <= 0xdfff) throw fail('unpaired low surrogate');
      if (code >= 0xd800 && code <= 0xdbff) {
        if (text.slice(i, i + 2) !== '\\u') throw fail('unpaired high surrogate');
        i += 2;
        const low = hex4();
        if (low < 0xdc00 || low > 0xdfff) throw fail('high surrogate without low');
        code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
      }
      out += String.fromCodePoint(code);
    }
  };
  const NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;
  /** @param {number} depth @param {Array<[string, number, number]>|null} top */
  const value = (depth, top = null) => {
    if (depth > 64) throw fail('nesting deeper than 64');
    const c = text[i];
    if (c === '{') {
      i++; ws();
      if (text[i] === '}') { i++; return; }
      for (;;) {
        ws();
        if (text[i] !== '"') throw fail('expected a key');
        const key = string(); ws();
        if (text[i++] !== ':') throw fail('expected :');
        ws(); const start = i; value(depth + 1); if (top) top.push([key, start, i]); ws();
        const d = text[i++];
        if (d === '}') return;
        if (d !== ',') throw fail('expected , or }');
      }
    } else if (c === '[') {
      i++; ws();
      if (text[i] === ']') { i++; return; }
      for (;;) {
        ws(); value(depth + 1); ws();
        const d = text[i++];
        if (d === ']') return;
        if (d !== ',') throw fail('expected , or ]');
      }
    } else if (c === '"') string();
    else if (c === '-' || (c >= '0' && c <= '9')) {
      NUMBER.lastIndex = i;
      const m = NUMBER.exec(text);
      if (!m) throw fail('bad number');
      i += m[0].length;
      if (i < text.length && '0123456789.eE+-'.includes(text[i])) throw fail('bad number');
    } else {
      for (const lit of ['true', 'false', 'null']) if (text.startsWith(lit, i)) { i += lit.length; return; }
      throw fail('unexpected character');
    }
  };
  ws();
  /** @type {Array<[string, number, number]>} */ const top = [];
  const isObject = text[i] === '{';
  value(1, isObject ? top : null);
  ws();
  if (i !== text.length) throw fail('bytes after the value');
  if (!isObject) throw new EnvelopeError('bad-message', 'not an object');
  const keys = []; const raw = {};
  for (const [key, start, end] of top) {
    if (Object.prototype.hasOwnProperty.call(raw, key)) throw new EnvelopeError('bad-message', `duplicate key ${key}`);
    keys.push(key); raw[key] = text.slice(start, end);
  }
  return { keys, raw };
}

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

function withTimeout(promise, ms, what) {
  if (ms === undefined || ms === null) return promise;
  let timer;
  return Promise.race([promise, new Promise((_, reject) => {
    timer = setTimeout(() => reject(new FluxError('timeout', `timed out waiting for ${what}`)), ms);
  })]).finally(() => clearTimeout(timer));
}

/** A subscription to one store: an async iterator of snapshots (never an older version after a newer one). */
export class Subscription {
  /** @param {Client} client @param {string} store */
  constructor(client, store) {
    this.client = client; this.store = store;
    /** @type {string|undefined} up/down/unknown, follows store-down/store-up */ this.status = undefined;
    /** @type {Snapshot|undefined} */ this.latest = undefined;
    /** @type {Array<{kind: string, reason?: string, version?: number}>} */ this.events = [];
    /** @type {Snapshot[]} */ this.queue = [];
    /** @type {Array<(r: IteratorResult<Snapshot>) => void>} */ this.waiters = [];
    this.ended = false;
  }
  /** @internal */
  deliver(msg) {
    if (msg.op === 'snapshot') {
      if (this.latest && msg.version <= this.latest.version) return;
      const snap = { store: msg.store, version: msg.version, seq: msg.seq, state: msg.state };
      this.latest = snap;
      const waiter = this.waiters.shift();
      if (waiter) waiter({ value: snap, done: false }); else this.queue.push(snap);
    } else if (msg.op === 'store-down') { this.status = 'down'; this.events.push({ kind: 'store-down', reason: msg.reason }); }
    else if (msg.op === 'store-up') { this.status = 'up'; this.events.push({ kind: 'store-up', version: msg.version }); }
  }
  /** @internal */
  end() { this.ended = true; for (const w of this.waiters.splice(0)) w({ value: undefined, done: true }); }
  /** The next snapshot (rejects on timeout ms, resolves undefined once ended). @returns {Promise<Snapshot|undefined>} */
  async next(timeout) {
    const r = await withTimeout(this.#next(), timeout, `a snapshot of ${this.store}`);
    return r.done ? undefined : r.value;
  }
  /** Reads snapshots until `predicate(snapshot)`; returns that one. */
  async until(predicate, timeout) {
    const deadline = timeout === undefined ? undefined : Date.now() + timeout;
    for (;;) {
      const snap = await this.next(deadline === undefined ? undefined : Math.max(0, deadline - Date.now()));
      if (snap === undefined) throw new FluxError('disconnected', 'subscription ended');
      if (predicate(snap)) return snap;
    }
  }
  #next() {
    if (this.queue.length) return Promise.resolve({ value: this.queue.shift(), done: false });
    if (this.ended) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve) => this.waiters.push(resolve));
  }
  [Symbol.asyncIterator]() {
    return { next: () => this.#next(), return: async () => ({ value: undefined, done: true }) };
  }
  /** Unsubscribes and ends the iteration. */
  async close() {
    if (this.client.subscriptions.get(this.store) === this) await this.client.unsubscribe(this.store);
    this.end();
  }
}

/** An active query (WordPressFlux's Receipt); `close()` withdraws it. */
export class QueryReceipt {
  constructor(client, id, store, query) { this.client = client; this.id = id; this.store = store; this.query = query; this.active = true; }
  /** Withdraws the query (idempotent). */
  async close() { if (this.active) { this.active = false; await this.client.unquery(this.id); } }
}

/**
 * A store's active queries, kept from fluxd's full `queries` message and the `queries-changed` deltas that follow
 * it when the store registered with "queryDeltas": true. Keyed by the query's canonical JSON; `active()` lists them
 * sorted by the UTF-8 bytes of that text, as fluxd sorts `queries`.
 */
export class QuerySet {
  constructor() { /** @type {Map<string, ActiveQuery>} */ this.byKey = new Map(); /** @type {ActiveQuery[]|null} */ this.sorted = []; }
  /** Takes a full `queries` list: it replaces whatever was known. @param {ActiveQuery[]} entries */
  replace(entries) { this.byKey.clear(); this.apply(entries); }
  /** Takes a `queries-changed` list: each `count` is the query's new count, 0 = withdrawn. @param {ActiveQuery[]} changes */
  apply(changes) {
    for (const { query, count } of changes) {
      const key = canonicalJSON(query);
      if (Number.isInteger(count) && count > 0) this.byKey.set(key, { query, count }); else this.byKey.delete(key);
    }
    this.sorted = null;
  }
  /** The active queries (a new array each time), sorted by canonical bytes. @returns {ActiveQuery[]} */
  active() {
    if (this.sorted === null) {
      this.sorted = [...this.byKey.keys()].map((k) => [Buffer.from(k, 'utf8'), k])
        .sort((a, b) => Buffer.compare(a[0], b[0])).map(([, k]) => this.byKey.get(k));
    }
    return [...this.sorted];
  }
  get size() { return this.byKey.size; }
}

/** Thrown by a handler to reject an action; the store answers `reject` with `{code, message, ...details}`. */
export class Reject extends Error {
  /** @param {string} code @param {string} [message] @param {Record<string, any>} [details] */
  constructor(code, message = '', details = {}) { super(`${code}: ${message}`); this.code = code; this.detail = message; this.details = details; }
  errorObject() { return { code: this.code, ...(this.detail ? { message: this.detail } : {}), ...this.details }; }
}

/**
 * @typedef {{seq: number, type: string, origin: number, cause?: number, redelivered: boolean,
 *            dispatch: (type: string, payload?: any) => void}} ActionContext
 * @typedef {(state: any, payload: any, ctx: ActionContext) => any} Handler
 */

/**
 * A store worker. Subclass it (or construct it with options) and add handlers with `on(type, handler)`:
 * ```js
 * const counter = new Store({ name: 'counter', handles: ['counter/*'], initialState: { value: 0 } });
 * counter.on('counter/add', (state, { by }) => {
 *   if (by <= 0) throw new Reject('counter/bad-step', 'step must be positive');
 *   return { value: state.value + by };
 * });
 * await counter.start({ socketPath });
 * ```
 * Each action is handled once, in order, and answered: `done` (with `state` only when the handler changed it, so
 * one action makes at most one snapshot), or `reject` when the handler throws (`Reject` → its code; anything else →
 * `store/error`). Handlers get a deep copy of the state and may be async. An action with no handler is answered
 * `done` without change. Follow-ups dispatched with `ctx.dispatch` carry `cause` = the action's seq and are sent
 * after the answer, only if the handler did not throw. `onQueries(queries)` is called when the active queries
 * change; `publish(state)` sends a state outside an action.
 */
export class Store {
  /**
   * `queryDeltas` (default true): register with "queryDeltas": true, so that after the first full `queries` fluxd
   * sends only the queries whose count changed (`queries-changed`); the store keeps the whole set itself, so
   * `queries` and `onQueries` see the full set as before.
   * @param {{name?: string, handles?: string[], waitFor?: string[], initialState?: any, queryDeltas?: boolean}} [options]
   */
  constructor({ name, handles, waitFor, initialState, queryDeltas } = {}) {
    this.name = name ?? this.constructor.storeName ?? '';
    this.handles = handles ?? this.constructor.handles ?? [];
    this.waitFor = waitFor ?? this.constructor.waitFor ?? [];
    this.initialState = initialState ?? this.constructor.initialState;
    this.queryDeltas = queryDeltas ?? this.constructor.queryDeltas ?? true;
    /** @type {any} */ this.state = undefined;
    this.version = 0;
    /** @type {ActiveQuery[]} */ this.queries = [];
    this.querySet = new QuerySet();
    /** @type {Array<[string, Handler]>} */ this.handlers = [];
    /** @type {Client|undefined} */ this.client = undefined;
    this.chain = Promise.resolve();
  }
  /** Adds a handler for an action type or `prefix*` pattern. @param {string} pattern @param {Handler} handler */
  on(pattern, handler) { this.handlers.push([pattern, handler]); return this; }
  /** Called when the active queries change. @param {ActiveQuery[]} _queries */
  onQueries(_queries) {}
  /** The handler for a type: exact beats pattern, longer pattern beats shorter. @param {string} type */
  handlerFor(type) {
    let best; let rank = [-1, -1];
    for (const [pattern, handler] of this.handlers) {
      if (!patternMatches(pattern, type)) continue;
      const r = [pattern.endsWith('*') ? 0 : 1, pattern.length];
      if (r[0] > rank[0] || (r[0] === rank[0] && r[1] > rank[1])) { best = handler; rank = r; }
    }
    return best;
  }
  /**
   * Connects, registers, adopts the retained state and starts serving actions. Resolves once registered.
   * `heartbeat` and `expectedServerUid` are passed to `Client.connect`.
   * @param {{socketPath?: string, clientName?: string, heartbeat?: boolean, expectedServerUid?: number}} [options]
   * @returns {Promise<{resumed: boolean}>}
   */
  async start({ socketPath, clientName, heartbeat = true, expectedServerUid } = {}) {
    const client = await Client.connect({ socketPath, name: clientName ?? `${this.name}-node`, role: 'store', heartbeat, expectedServerUid });
    this.client = client;
    let registered; let resumed = false;
    const ready = new Promise((resolve, reject) => { registered = { resolve, reject }; });
    let phase = 'registering';
    client.attachStore(this.name, (msg) => {
      if (phase === 'registering') {
        if (msg.op === 'error' || msg.op === 'closed') { registered.reject(msg.op === 'error' ? FluxError.fromFrame(msg) : client.closedReason); return; }
        if (msg.op === 'registered') resumed = msg.resumed === true;
        else if (msg.op === 'snapshot') this.#adopt(msg);
        else if (msg.op === 'queries') { phase = 'running'; this.#queries(msg); registered.resolve({ resumed }); }
        return;
      }
      this.chain = this.chain.then(() => this.#handle(msg)).catch((err) => this.#report(err));
    });
    const register = { op: 'register', store: this.name, handles: this.handles, waitFor: this.waitFor };
    if (this.queryDeltas) register.queryDeltas = true;
    if (this.initialState !== undefined) register.state = this.initialState;
    client.send(register);
    return ready;
  }
  /** Publishes a new full state outside an action; nothing is sent if it is unchanged. @param {any} state */
  publish(state) {
    if (canonicalJSON(state) === canonicalJSON(this.state)) return;
    this.state = state;
    this.client.sendRaw(`{"op":"state","store":${JSON.stringify(this.name)},"state":${canonicalJSON(state)}}`);
  }
  /** Stops: says bye and closes the connection. */
  async stop() { await this.chain; await this.client?.close(); }
  #report(err) { this.client?.emit('store-error', err); }
  #adopt(msg) { if (msg.version >= this.version) { this.version = msg.version; this.state = msg.state; } }
  /** A full `queries` set, or a `queries-changed` delta applied to the set kept so far. */
  #queries(msg) {
    if (msg.op === 'queries-changed') this.querySet.apply(msg.changes ?? []);
    else this.querySet.replace(msg.queries ?? []);
    this.queries = this.querySet.active();
    this.onQueries([...this.queries]);
  }
  async #handle(msg) {
    if (msg.op === 'snapshot') return this.#adopt(msg);
    if (msg.op === 'queries' || msg.op === 'queries-changed') return this.#queries(msg);
    if (msg.op !== 'action' || this.client.closed) return;
    const followUps = [];
    const ctx = { seq: msg.seq, type: msg.type, origin: msg.origin, cause: msg.cause, redelivered: msg.redelivered === true,
      dispatch: (type, payload = null) => { followUps.push([type, payload]); } };
    const handler = this.handlerFor(msg.type);
    const store = JSON.stringify(this.name);
    let next;
    try {
      next = handler ? await handler.call(this, structuredClone(this.state), msg.payload, ctx) : undefined;
    } catch (err) {
      const error = err instanceof Reject ? err.errorObject() : { code: 'store/error', message: String(err?.message ?? err) };
      this.client.sendRaw(`{"op":"reject","store":${store},"seq":${msg.seq},"error":${canonicalJSON(error)}}`);
      return;
    }
    if (next !== undefined && canonicalJSON(next) !== canonicalJSON(this.state)) {
      this.state = next;
      this.client.sendRaw(`{"op":"done","store":${store},"seq":${msg.seq},"state":${canonicalJSON(next)}}`);
    } else {
      this.client.sendRaw(`{"op":"done","store":${store},"seq":${msg.seq}}`);
    }
    for (const [type, payload] of followUps) this.client.dispatch(type, payload, { cause: msg.seq });
  }
}
