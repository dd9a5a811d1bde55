// Store workers: handlers for actions, the active query set, publishing state.
import { FluxError } from './errors.mjs';
import { canonicalJSON } from './canonical.mjs';
import { patternMatches } from './names.mjs';
import { Client } from './client.mjs';


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
