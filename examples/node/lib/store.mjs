// Store workers: handlers for actions (answered in order, one at a time), rejections written for the person who
// dispatched, the active query set, publishing state.
import { Roles, StoreErrorCodes } from './constants.mjs';
import { DisconnectedError, StateTooLargeError, TimeoutError, errorFromFrame } from './errors.mjs';
import { canonicalJSON } from './canonical.mjs';
import { isValidPattern, isValidStoreName, patternMatches } from './names.mjs';
import { Client, DEFAULT_CONNECT_TIMEOUT } from './client.mjs';
import { Deadline } from './deadline.mjs';
import { QuerySet } from './query-set.mjs';
import { kLose, kHold, kBarrier } from './internal.mjs';
import { diff, jsonEqual } from './patch.mjs';
import { produce } from './draft.mjs';
import { JSONNumber, cloneJSON } from './json-number.mjs';
import { fits as fitsFrame, patchFrame, refusalDelay, splitState, stateFrameLength } from './pieces.mjs';
import { createLogger, describeError } from './log.mjs';

/** The default `onError`'s logger (made on first use, so that FLUXBUS_LOG_* set before then count). @type {import('./log.d.mts').Logger|undefined} */
let storeLog;

/** Codes of a failed registration after a reconnection that trying again later cannot cure: the store stops. */
const REGISTRATION_FINAL = new Set(['cycle', 'bad-message', 'forbidden']);

/**
 * A state a store publishes after registering because fluxd retains none for it (SPEC §16.6): whole in one `state`
 * if that fits in a frame, else in pieces (`splitState`): the empty root, then patches.
 */
class Publication {
  /** @param {any} target */
  constructor(target) {
    this.target = target;
    /** @type {import('./pieces.mjs').Pieces|undefined} */ this.pieces = undefined;
    this.firstVersion = 0; // the version the pieces' root made (0: not sent yet)
    this.sent = 0; // patches sent after the root
    /** @type {string|undefined} */ this.epoch = undefined; // the epoch the root was sent in
    this.done = false; // sent whole
  }

  /** Whether the snapshot after `registered` is what these pieces made, up to one of them, in this epoch. */
  resumes(msg, epoch) {
    if (!this.pieces || !this.firstVersion || epoch === undefined || epoch !== this.epoch) return false;
    const made = Number.isInteger(msg.version) ? msg.version - this.firstVersion : -1;
    return made >= 0 && made <= this.pieces.patches.length && jsonEqual(msg.state, this.pieces.stateAfter(made));
  }
}

/** What a store does with an action its patterns match but no handler takes (`new Store({unhandled})`). */
export const Unhandled = Object.freeze({ REJECT: 'reject', IGNORE: 'ignore' });

/**
 * What a handler gets as its `state` (`new Store({handlerState})`): 'draft' (default) a copy-on-write draft it may
 * change in place (or it returns a new state); 'shared' the store's state itself, deep-frozen, Redux style: it
 * returns a new state that shares what did not change; 'copy' a deep copy (the 0.2 behaviour; exact numbers kept).
 */
export const HandlerState = Object.freeze({ DRAFT: 'draft', SHARED: 'shared', COPY: 'copy' });

/** Freezes `value` and every object inside it that is not frozen yet (a frozen object's inside is taken as frozen). */
function freezeNew(value) {
  if (value === null || typeof value !== 'object' || Object.isFrozen(value)) return value;
  Object.freeze(value);
  if (Array.isArray(value)) for (let i = 0; i < value.length; i++) freezeNew(value[i]);
  else for (const k of Object.keys(value)) freezeNew(value[k]);
  return value;
}

/**
 * Thrown by a handler to reject an action; the store answers `reject` with `{code, message, ...details}` exactly
 * as given. Write `message` for the person who dispatched: which field, what was expected.
 */
export class Reject extends Error {
  /** @param {string} code @param {string} [message] @param {Record<string, any>} [details] */
  constructor(code, message = '', details = {}) {
    super(message ? `${code}: ${message}` : code);
    this.name = 'Reject'; this.code = code; this.detail = message; this.details = details;
  }
  /** The `error` object of the `reject` frame. */
  errorObject() { return { code: this.code, ...(this.detail ? { message: this.detail } : {}), ...this.details }; }
}

/** Errors a language runtime raises on a programming mistake; their text is for the store's developer. */
const RUNTIME_ERRORS = [TypeError, RangeError, ReferenceError, SyntaxError, EvalError, URIError];

const FIELD_TYPES = ['string', 'number', 'integer', 'boolean', 'object', 'array', 'any'];

/** A value's kind in words, for messages: "a string", "null", "an array", ... */
function kindOf(value) {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (value instanceof JSONNumber) return value.isInteger() ? 'an integer' : 'a number';
  if (typeof value === 'object') return 'an object';
  if (typeof value === 'number' && Number.isInteger(value)) return 'an integer';
  return `a ${typeof value}`;
}

function fits(type, value) {
  switch (type) {
    case 'string': case 'boolean': return typeof value === type;
    // (a number beyond a double's precision or range comes as a JSONNumber, SPEC §16.1: still a number)
    case 'number': return typeof value === 'number' || value instanceof JSONNumber;
    case 'integer': return Number.isInteger(value) || (value instanceof JSONNumber && value.isInteger());
    case 'object': return value !== null && typeof value === 'object' && !Array.isArray(value) && !(value instanceof JSONNumber);
    case 'array': return Array.isArray(value);
    default: return true; // any
  }
}

/**
 * A payload check from `on(pattern, handler, { payload })`: a shape (`{ title: 'string', done: 'boolean?' }`:
 * field → string, number, integer, boolean, object, array or any; a trailing `?` = may be absent), or a
 * function returning the problem in words (or nothing when the payload is fine). Returns the check, which
 * gives undefined or `{message, field?}`.
 * @param {Record<string, string>|((payload: any) => string|undefined|null|void)} spec
 * @returns {(payload: any) => ({message: string, field?: string}|undefined)}
 */
function payloadCheck(spec) {
  if (typeof spec === 'function') return (payload) => { const problem = spec(payload); return problem ? { message: String(problem) } : undefined; };
  if (!spec || typeof spec !== 'object' || Array.isArray(spec)) throw new TypeError('payload must be a shape ({ field: \'string\', ... }) or a function');
  const fields = Object.entries(spec).map(([field, declared]) => {
    const optional = typeof declared === 'string' && declared.endsWith('?');
    const type = optional ? declared.slice(0, -1) : declared;
    if (!FIELD_TYPES.includes(type)) throw new TypeError(`payload field '${field}': the type is one of ${FIELD_TYPES.join(', ')} (with ? if it may be absent), not ${JSON.stringify(declared)}`);
    return { field, type, optional };
  });
  return (payload) => {
    if (payload === null || payload === undefined) return { message: 'the action has no payload' };
    if (!fits('object', payload)) return { message: `the payload must be an object, not ${kindOf(payload)}` };
    for (const { field, type, optional } of fields) {
      const value = payload[field];
      if (value === undefined || !Object.prototype.hasOwnProperty.call(payload, field)) {
        if (!optional) return { message: `payload is missing field '${field}'`, field };
      } else if (!fits(type, value)) {
        return { message: `payload field '${field}' must be ${type === 'integer' || type === 'object' || type === 'array' || type === 'any' ? `an ${type}` : `a ${type}`}, not ${kindOf(value)}`, field };
      }
    }
    return undefined;
  };
}

/**
 * @typedef {{seq: number, type: string, origin: number, cause?: number, redelivered: boolean,
 *            dispatch: (type: string, payload?: any) => void}} ActionContext
 * @typedef {(state: any, payload: any, ctx: ActionContext) => any} Handler
 * @typedef {{store: string, type?: string, seq?: number, refusals?: number, retryIn?: number}} ErrorContext
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
 * one action makes at most one snapshot), or `reject`:
 * - `Reject` thrown by the handler: its code, message and details, unchanged;
 * - a payload that fails the handler's `payload` check, or a TypeError while the action has no payload:
 *   `store/bad-payload` ("todo/add failed: payload is missing field 'title'", with `field`);
 * - anything else thrown: `store/error` with "TYPE failed: MESSAGE" (for a runtime error such as a TypeError the
 *   message says the store hit an internal error, and the error itself goes to `onError`, the store's log);
 * - no handler for a type the store's `handles` patterns match (a typo such as `counter/ad`): `store/unhandled-action`
 *   with "no handler for 'counter/ad'; this store handles: counter/add, counter/reset", unless the store was made
 *   with `unhandled: 'ignore'`, which answers such actions `done` without change.
 * Handlers get a draft of the state (`handlerState`, below: change it in place or return a new state) and may be
 * async; the change is sent as a JSON Patch from the version fluxd retains (SPEC §16.2; `patches`), so a handler
 * that changes one item of a large state does not pay for encoding the whole state. Follow-ups dispatched with `ctx.dispatch` carry
 * `cause` = the action's seq and are sent after the answer, only if the handler did not throw. `onQueries(queries)`
 * is called when the active queries change; `publish(state)` sends a state outside an action.
 *
 * Exactly once on the state (SPEC §15.3): on every registration (the first, and again after each reconnection of
 * its client) the store adopts the snapshot fluxd sends, even when it holds a newer state itself (answers fluxd
 * never recorded are undone; their actions come again), and answers `done` without running the handler for any
 * action whose seq is at most the seq of that snapshot (it already includes it; `skipped` counts them). An action
 * in hand when the connection is lost is not answered: fluxd delivers it again after the store registers again.
 */
export class Store {
  #gen = 0; // the connection generation; messages and answers of an earlier one are dropped
  /** @type {'idle'|'registering'|'running'|'down'|'closed'} */ #phase = 'idle';
  #adoptedSeq = 0;
  #resumed = false;
  /** @type {{resolve: (r: {resumed: boolean}) => void, reject: (err: unknown) => void}|null} start() waiting */ #starting = null;
  /** @type {{state: any}|undefined} a state published while not registered, sent once registered again */ #unpublished = undefined;
  #refusals = 0; // refused registrations in a row (SPEC §16.6)
  #awaiting = false; // a register went out and the registration is not complete (confirmed) yet
  /** @type {Publication|undefined} the state to publish once this registration is complete (fluxd retains none) */ #toPublish = undefined;
  /** @type {Publication|undefined} the one whose pieces were sent, kept until fluxd confirmed them all */ #publication = undefined;
  /**
   * `queryDeltas` (default true): register with "queryDeltas": true, so that after the first full `queries` fluxd
   * sends only the queries whose count changed (`queries-changed`); the store keeps the whole set itself, so
   * `queries` and `onQueries` see the full set as before. `unhandled`: 'reject' (default) or 'ignore' (see above).
   * `onError(error, context)`: replaces the `onError` method (the store's log; default: a line in fluxd's format on
   * stderr, label `fluxbus.store`: lib/log.mjs).
   * `handlerState`: 'draft' (default), 'shared' or 'copy' (see HandlerState). `patches` (default true): send each
   * change as a JSON Patch from the version fluxd retains (SPEC §16.2) when fluxd speaks §16 (it announces
   * `limits.deltaHistory`), so a change costs what changed, not the state's size; false: send whole states.
   * @param {{name?: string, handles?: string[], waitFor?: string[], initialState?: any, queryDeltas?: boolean,
   *          unhandled?: 'reject'|'ignore', onError?: (error: unknown, context: ErrorContext) => void,
   *          handlerState?: 'draft'|'shared'|'copy', patches?: boolean}} [options]
   */
  constructor({ name, handles, waitFor, initialState, queryDeltas, unhandled, onError, handlerState, patches } = {}) {
    const defaults = /** @type {any} */ (this.constructor);
    this.name = name ?? defaults.storeName ?? '';
    this.handles = handles ?? defaults.handles ?? [];
    this.waitFor = waitFor ?? defaults.waitFor ?? [];
    this.initialState = initialState ?? defaults.initialState;
    this.queryDeltas = queryDeltas ?? defaults.queryDeltas ?? true;
    this.unhandled = unhandled ?? defaults.unhandled ?? Unhandled.REJECT;
    if (!Object.values(Unhandled).includes(this.unhandled)) {
      throw new TypeError(`unhandled must be 'reject' (the default: an action without a handler is rejected with ${StoreErrorCodes.UNHANDLED_ACTION}) or 'ignore' (answered done, state unchanged), not ${JSON.stringify(this.unhandled)}`);
    }
    if (onError) this.onError = onError;
    this.handlerState = handlerState ?? defaults.handlerState ?? HandlerState.DRAFT;
    if (!Object.values(HandlerState).includes(this.handlerState)) {
      throw new TypeError(`handlerState must be 'draft' (the default), 'shared' or 'copy', not ${JSON.stringify(this.handlerState)}`);
    }
    this.patches = patches ?? defaults.patches ?? true;
    /** Changes sent as patches, and as whole states (SPEC §16.2). */
    this.sent = { patches: 0, states: 0 };
    /** @type {any} */ this.state = undefined;
    this.version = 0;
    /** @type {import('./query-set.mjs').ActiveQuery[]} */ this.queries = [];
    this.querySet = new QuerySet();
    /** @type {Array<[string, Handler, ((payload: any) => ({message: string, field?: string}|undefined))|undefined]>} */ this.handlers = [];
    /** @type {Client|undefined} */ this.client = undefined;
    this.chain = Promise.resolve();
    /** Actions answered `done` without running their handler: the adopted snapshot already included them (SPEC §15.3). */
    this.skipped = 0;
  }

  /** The seq of the snapshot adopted at the last registration (or `registered.seq`): actions up to it are skipped. */
  get adoptedSeq() { return this.#adoptedSeq; }

  /** Whether the store is registered on a live connection (false while its client reconnects). */
  get registered() { return this.#phase === 'running'; }

  /** Refused registrations in a row (SPEC §16.6): 0 again once a registration succeeds. */
  get refusals() { return this.#refusals; }

  /**
   * Adds a handler for an action type or `prefix*` pattern. `payload` checks the payload before the handler runs
   * and rejects it with `store/bad-payload` naming the field and what was expected: a shape
   * (`{ title: 'string', done: 'boolean?' }`; string, number, integer, boolean, object, array or any; `?` = may
   * be absent) or a function that returns the problem in words.
   * @param {string} pattern @param {Handler} handler
   * @param {{payload?: Record<string, string>|((payload: any) => string|undefined|null|void)}} [options]
   */
  on(pattern, handler, { payload } = {}) {
    if (!isValidPattern(pattern)) throw new TypeError(`invalid handler pattern ${JSON.stringify(pattern)}: an action type, or a prefix followed by one trailing *`);
    if (typeof handler !== 'function') throw new TypeError(`the handler of ${pattern} is not a function`);
    this.handlers.push([pattern, handler, payload === undefined ? undefined : payloadCheck(payload)]);
    return this;
  }

  /** Called when the active queries change. @param {import('./query-set.mjs').ActiveQuery[]} _queries */
  onQueries(_queries) {}

  /**
   * The store's log: a handler that failed with something other than `Reject`, a failure while answering, or a
   * refused registration (SPEC §16.6: `context.refusals` in a row, and `context.retryIn`, the ms before the store
   * registers again). The default writes one line in fluxd's format to stderr (docs/logging.md), label
   * `fluxbus.store`: a refusal at warning, anything else at error with the error's stack (escaped into the line).
   * @param {unknown} error @param {ErrorContext} context
   */
  onError(error, context) {
    storeLog ??= createLogger('fluxbus.store');
    if (context.retryIn !== undefined) { // a refused registration (SPEC §16.6)
      const { code = 'error', detail = String(error) } = /** @type {any} */ (error);
      storeLog.warning(`store '${context.store}': registration refused (${code}: ${detail}); registering again in ${context.retryIn} ms (refusal ${context.refusals} in a row)`);
      return;
    }
    const where = context.type ? ` while handling ${context.type} (seq ${context.seq})` : '';
    storeLog.error(`store '${context.store}' failed${where}: ${describeError(error)}`);
  }

  /** The handler for a type: exact beats pattern, longer pattern beats shorter. @param {string} type */
  handlerFor(type) { return this.#entryFor(type)?.[1]; }

  #entryFor(type) {
    let best; let rank = [-1, -1];
    for (const entry of this.handlers) {
      const pattern = entry[0];
      if (!patternMatches(pattern, type)) continue;
      const r = [pattern.endsWith('*') ? 0 : 1, pattern.length];
      if (r[0] > rank[0] || (r[0] === rank[0] && r[1] > rank[1])) { best = entry; rank = r; }
    }
    return best;
  }

  /**
   * Connects, registers, adopts the retained state and starts serving actions. Resolves once registered;
   * `timeout` (ms, default 30000; null = none) covers all of it. `heartbeat`, `expectedServerUid`,
   * `maxWriteQueue` and `reconnect` (default on: the store registers again after each reconnection, SPEC §15.5)
   * are passed to `Client.connect`; `store.client` emits the connection's events ('disconnected', 'reconnecting',
   * 'reconnected', and 'store-registered' once registered again). Rejects with Client.connect's errors,
   * NameTakenError, CycleError, ... or TimeoutError (and closes the connection).
   * @param {{socketPath?: string, clientName?: string, heartbeat?: boolean, expectedServerUid?: number,
   *          timeout?: number|null, maxWriteQueue?: number, reconnect?: boolean|Record<string, number|null>}} [options]
   * @returns {Promise<{resumed: boolean}>}
   */
  async start({ socketPath, clientName, heartbeat = true, expectedServerUid, timeout = DEFAULT_CONNECT_TIMEOUT, maxWriteQueue, reconnect } = {}) {
    if (!isValidStoreName(this.name)) throw new TypeError(`invalid store name ${JSON.stringify(this.name)}: 1-128 bytes of A-Z a-z 0-9 . _ : / -`);
    const deadline = new Deadline(timeout);
    const client = await Client.connect({
      socketPath, name: clientName ?? `${this.name}-node`, role: Roles.STORE, heartbeat, expectedServerUid, maxWriteQueue, reconnect,
      timeout: deadline.remaining === Infinity ? null : Math.ceil(deadline.remaining),
    });
    this.client = client;
    const ready = new Promise((resolve, reject) => { this.#starting = { resolve, reject }; });
    client.attachStore(this.name, (msg) => this.#receive(msg));
    try {
      this.#register(false);
      return await deadline.race(ready, () => new TimeoutError(`timed out after ${deadline.ms} ms registering store '${this.name}'`, { timeoutMs: deadline.ms }));
    } catch (err) {
      this.#starting = null;
      client.abort();
      throw err;
    }
  }

  /**
   * Sends `register`: first, and after each reconnection (before anything else goes on the new connection). The
   * state goes in it only if the frame fits in `maxFrame` (SPEC §16.6); else the store publishes it once registered.
   */
  #register(epochChanged) {
    this.#gen++;
    this.#phase = 'registering';
    this.#resumed = false;
    const register = { op: 'register', store: this.name, handles: this.handles, waitFor: this.waitFor };
    if (this.queryDeltas) register.queryDeltas = true;
    // fluxd uses `state` only when it retains no snapshot for the name. A fluxd of another epoch (restarted without
    // its history) retains none: the state this process holds then carries on, rather than the initial one; so
    // does a state it was publishing when the connection was lost.
    const pending = this.#publication ?? this.#toPublish;
    const state = pending ? pending.target : epochChanged && this.state !== undefined ? this.state : this.initialState;
    if (state !== undefined) register.state = state;
    let body = JSON.stringify(register);
    if (state !== undefined && !fitsFrame(Buffer.byteLength(body), this.client.welcome?.limits?.maxFrame)) {
      delete register.state; // too large for one frame: published in pieces if fluxd retains nothing
      body = JSON.stringify(register);
    }
    this.#awaiting = true;
    this.client.sendRaw(body, { force: true });
  }

  /** Everything the client routes to this store, and the connection's ups and downs. */
  #receive(msg) {
    switch (msg.op) {
      case 'disconnected': // the answer to an action in hand is dropped
        if (this.#awaiting) this.#refused(msg.reason); // before the registration was complete
        this.#gen++; this.#phase = 'down'; return;
      case 'reconnected': this.#register(msg.epochChanged === true); return;
      case 'closed': {
        this.#gen++; this.#phase = 'closed';
        const starting = this.#starting; this.#starting = null;
        starting?.reject(this.client.closedReason);
        return;
      }
      default:
    }
    if (this.#phase === 'registering') { this.#registration(msg); return; }
    if (this.#phase !== 'running') return;
    if (msg.op === 'error') { // e.g. patch-failed (fluxd then closes the connection; the store registers again)
      this.#report(errorFromFrame(msg), {});
      return;
    }
    const gen = this.#gen;
    this.chain = this.chain.then(() => this.#handle(msg, gen)).catch((err) => this.#report(err, {}));
  }

  /**
   * A refused registration (SPEC §16.6): counted, reported (`onError`, with `refusals` and `retryIn`), and no
   * reconnection before the wait (100 ms doubling up to 30 s, at random between half and all of it) is over.
   * @param {Error} error fluxd's error, or why the connection ended (its `cause`: fluxd's fatal error, if any)
   */
  #refused(error) {
    this.#awaiting = false;
    this.#refusals++;
    const delay = Math.round(refusalDelay(this.#refusals));
    this.client[kHold](performance.now() + delay);
    const reported = error instanceof DisconnectedError && error.cause instanceof Error ? error.cause : error;
    this.#report(reported, { refusals: this.#refusals, retryIn: delay });
  }

  /** The registration succeeded (and fluxd took what the store published on registering): the backoff starts over. */
  #confirm() { this.#awaiting = false; this.#refusals = 0; }

  /** registered, the retained snapshot, then queries (SPEC §8.2); or an error refusing the registration. */
  #registration(msg) {
    if (msg.op === 'error') {
      const error = errorFromFrame(msg);
      const starting = this.#starting; this.#starting = null;
      if (starting) { this.#awaiting = false; starting.reject(error); return; } // start() rejects (and closes)
      if (REGISTRATION_FINAL.has(error.code)) { this.#awaiting = false; this.#report(error, {}); this.client.close().catch(() => {}); return; }
      // e.g. name-taken while fluxd has not yet seen the old connection go: connect again after the wait
      this.#refused(error);
      this.client[kLose](new DisconnectedError(`store '${this.name}' could not register again: ${error.message}`, error));
      return;
    }
    if (msg.op === 'registered') {
      this.#resumed = msg.resumed === true;
      this.#adoptedSeq = Number.isInteger(msg.seq) ? msg.seq : 0;
      this.#toPublish = undefined;
      if (!msg.version) { // fluxd retains no state: the store publishes the one it holds (or starts with), if any
        const publishing = this.#publication;
        const target = publishing ? publishing.target : this.state !== undefined ? this.state : this.initialState;
        this.#publication = undefined;
        this.version = 0;
        this.state = target === undefined ? undefined : this.#own(target);
        if (target !== undefined) this.#toPublish = new Publication(this.state);
      }
    } else if (msg.op === 'snapshot') {
      const publication = this.#publication;
      if (publication?.resumes(msg, this.client.welcome?.epoch)) { // SPEC §16.6: go on with the next piece
        publication.sent = msg.version - publication.firstVersion;
        this.#toPublish = publication;
        this.version = msg.version;
        if (Number.isInteger(msg.seq) && msg.seq > this.#adoptedSeq) this.#adoptedSeq = msg.seq;
        return;
      }
      this.#publication = undefined;
      // SPEC §15.3 rule 1: this is the store's state now, even if it held a newer one (never recorded by fluxd)
      this.state = this.#own(msg.state); this.version = msg.version;
      if (Number.isInteger(msg.seq) && msg.seq > this.#adoptedSeq) this.#adoptedSeq = msg.seq;
    } else if (msg.op === 'queries' || msg.op === 'queries-changed') {
      const publication = this.#toPublish; this.#toPublish = undefined;
      if (publication) {
        try {
          this.#publish(publication);
        } catch (err) {
          if (!(err instanceof StateTooLargeError)) throw err;
          this.#publication = undefined;
          const starting = this.#starting; this.#starting = null;
          if (starting) { starting.reject(err); return; } // start() rejects (and closes)
          this.#report(err, {}); // fluxd keeps no state for the store; it is not tried again
          this.#confirm();
        }
        if (this.#awaiting) { // confirmed once fluxd answers a ping sent after the last piece
          const gen = this.#gen;
          this.client[kBarrier]().then((taken) => {
            if (!taken || gen !== this.#gen) return; // lost first: the next registration goes on from what fluxd took
            this.#confirm();
            if (this.#publication === publication) this.#publication = undefined;
          }, () => {});
        }
      } else {
        this.#confirm();
      }
      this.#phase = 'running';
      const unpublished = this.#unpublished; this.#unpublished = undefined;
      if (unpublished) { try { this.publish(unpublished.state); } catch (err) { this.#report(err, {}); } }
      this.#queries(msg);
      const resumed = this.#resumed;
      this.client.emit('store-registered', this.name, { resumed, version: this.version, seq: this.#adoptedSeq });
      const starting = this.#starting; this.#starting = null;
      starting?.resolve({ resumed });
    }
  }

  /**
   * Publishes the state fluxd does not retain (SPEC §16.6), before any action is answered: whole when one `state`
   * frame holds it, else the empty root and then the patches (from where a publication cut short stopped).
   * Throws StateTooLargeError when it cannot be published. @param {Publication} publication
   */
  #publish(publication) {
    const store = JSON.stringify(this.name);
    const maxFrame = this.client.welcome?.limits?.maxFrame;
    this.state = this.#own(publication.target); // (a state published meanwhile follows, as a change from it)
    if (!publication.pieces) {
      const encoded = canonicalJSON(publication.target);
      if (fitsFrame(stateFrameLength(this.name, encoded), maxFrame)) {
        this.client.sendRaw(`{"op":"state","store":${store},"state":${encoded}}`, { force: true });
        publication.done = true;
        this.version = 1; this.sent.states++;
        return;
      }
      if (this.client.welcome?.limits?.deltaHistory === undefined) {
        throw new StateTooLargeError(this.name, `store '${this.name}': its state (${Buffer.byteLength(encoded)} bytes) is larger than fluxd's maxFrame (${maxFrame} bytes) and this fluxd takes no patches (0.4.0 or newer does), so it cannot be published`);
      }
      publication.pieces = splitState(publication.target, this.name, maxFrame);
    }
    const { pieces } = publication;
    if (!publication.firstVersion) {
      this.client.sendRaw(`{"op":"state","store":${store},"state":${pieces.root}}`, { force: true });
      publication.firstVersion = 1; publication.epoch = this.client.welcome?.epoch;
      this.#publication = publication;
      this.version = 1; this.sent.states++;
    }
    for (; publication.sent < pieces.patches.length; publication.sent++) {
      const base = publication.firstVersion + publication.sent;
      this.client.sendRaw(patchFrame(this.name, pieces.patches[publication.sent], base), { force: true });
      this.version = base + 1; this.sent.patches++;
    }
  }

  /**
   * Publishes a new full state outside an action; nothing is sent if it is unchanged. While the store is not
   * registered (its client reconnects) the state is kept and published once it is registered again. Throws
   * WriteQueueFullError when fluxd has not read `maxWriteQueue` bytes of this store's frames. @param {any} state
   */
  publish(state) {
    if (!this.client) throw new Error(`store '${this.name}' publishes before start()`);
    if (this.#phase !== 'running') { // registering, or the client reconnects: sent once the store is registered again
      canonicalJSON(state); // throws now for a state that is not JSON
      if (this.client.closed) throw this.client.closedReason;
      this.#unpublished = { state };
      this.state = state;
      return;
    }
    const change = this.#change(state);
    if (!change) return;
    const op = change.kind === 'patches' ? 'patch' : 'state';
    this.client.sendRaw(`{"op":"${op}","store":${JSON.stringify(this.name)},${change.field}}`);
    this.#commit(state, change);
  }

  /**
   * Publishes a change made by `recipe` on a draft of the state (outside an action), e.g.
   * `store.update((s) => { s.comments[site] = fetched; })`: sent as a patch (see publish).
   * @param {(draft: any) => any} recipe
   */
  update(recipe) { this.publish(produce(this.state, recipe)); }

  /**
   * Stops: lets the action in hand finish, says bye and closes; `timeout` (ms, default 10000) covers all of it
   * (past it the connection is closed anyway: fluxd redelivers an unanswered action to the next owner).
   * @param {{timeout?: number|null}} [options]
   */
  async stop({ timeout = 10000 } = {}) {
    const deadline = new Deadline(timeout);
    try { await deadline.race(this.chain, () => new TimeoutError('stop')); } catch { /* closing anyway */ }
    await this.client?.close({ timeout: Math.min(2000, deadline.remaining) });
  }

  #report(error, context) {
    try { this.onError(error, { store: this.name, ...context }); } catch { /* a failing log must not stop the store */ }
    this.client?.emit('store-error', error);
  }

  #adopt(msg) { if (msg.version >= this.version) { this.version = msg.version; this.state = this.#own(msg.state); } }

  /** A state the store now holds: deep-frozen when handlers share it ('shared'). */
  #own(state) { return this.handlerState === HandlerState.SHARED ? freezeNew(state) : state; }

  /** Whether changes go as patches: asked for, fluxd speaks SPEC §16, and it retains a state to patch. */
  #patching() { return this.patches && this.version > 0 && this.client?.welcome?.limits?.deltaHistory !== undefined; }

  /**
   * The frame body that publishes `next` (or undefined: no change), and the version it makes. As a patch from the
   * retained version when #patching (an empty diff: no change), else as the whole state (unchanged text: none).
   * Throws TypeError for a state that is not JSON. @returns {{field: string, version: number}|undefined}
   */
  #change(next) {
    if (next === undefined) return undefined;
    if (this.#patching()) {
      const patch = diff(this.state, next);
      if (patch.length === 0) return undefined;
      return { field: `"patch":${canonicalJSON(patch)},"base":${this.version}`, version: this.version + 1, kind: 'patches' };
    }
    const text = canonicalJSON(next);
    if (text === canonicalJSON(this.state)) return undefined;
    return { field: `"state":${text}`, version: this.version + 1, kind: 'states' };
  }

  #commit(next, change) {
    this.state = this.#own(next);
    this.version = change.version;
    this.sent[change.kind]++;
  }

  /** A full `queries` set, or a `queries-changed` delta applied to the set kept so far. */
  #queries(msg) {
    if (msg.op === 'queries-changed') this.querySet.apply(msg.changes ?? []);
    else this.querySet.replace(msg.queries ?? []);
    this.queries = this.querySet.active();
    this.onQueries([...this.queries]);
  }

  /** The `error` of a `reject` for what a handler threw, worded for the person who dispatched `type`. */
  #rejection(err, msg) {
    if (err instanceof Reject) return err.errorObject();
    this.#report(err, { type: msg.type, seq: msg.seq });
    if (err instanceof TypeError && (msg.payload === null || msg.payload === undefined)) { // e.g. reading a field of null
      return { code: StoreErrorCodes.BAD_PAYLOAD, message: `${msg.type} failed: the action has no payload` };
    }
    let why;
    if (!(err instanceof Error)) why = String(err);
    else if (RUNTIME_ERRORS.some((C) => err instanceof C)) why = `store '${this.name}' hit an internal error (${err.name}); its log has the details`;
    else why = err.message || err.name;
    return { code: StoreErrorCodes.HANDLER_FAILED, message: `${msg.type} failed: ${why}` };
  }

  #unhandled(type) {
    const patterns = [...new Set(this.handlers.map(([pattern]) => pattern))];
    const list = patterns.length ? `this store handles: ${patterns.join(', ')}` : 'this store has no action handlers';
    return { code: StoreErrorCodes.UNHANDLED_ACTION, message: `no handler for '${type}'; ${list}` };
  }

  async #handle(msg, gen) {
    if (gen !== this.#gen) return; // from a connection since lost: fluxd sends what is still due again
    if (msg.op === 'snapshot') return this.#adopt(msg);
    if (msg.op === 'queries' || msg.op === 'queries-changed') return this.#queries(msg);
    if (msg.op !== 'action' || this.client.closed) return;
    const client = this.client;
    const store = JSON.stringify(this.name);
    if (msg.seq <= this.#adoptedSeq) { // SPEC §15.3 rule 2: the adopted snapshot already includes this action
      this.skipped++;
      client.sendRaw(`{"op":"done","store":${store},"seq":${msg.seq}}`, { force: true });
      return;
    }
    const reject = (error) => client.sendRaw(`{"op":"reject","store":${store},"seq":${msg.seq},"error":${canonicalJSON(error)}}`, { force: true });
    const followUps = [];
    const ctx = { seq: msg.seq, type: msg.type, origin: msg.origin, cause: msg.cause, redelivered: msg.redelivered === true,
      dispatch: (type, payload = null) => { followUps.push([type, payload]); } };
    const [, handler, check] = this.#entryFor(msg.type) ?? [];
    if (!handler) {
      if (this.unhandled === Unhandled.IGNORE) client.sendRaw(`{"op":"done","store":${store},"seq":${msg.seq}}`, { force: true });
      else reject(this.#unhandled(msg.type));
      return;
    }
    const bad = check?.(msg.payload);
    if (bad) {
      reject({ code: StoreErrorCodes.BAD_PAYLOAD, message: `${msg.type} failed: ${bad.message}`, ...(bad.field !== undefined ? { field: bad.field } : {}) });
      return;
    }
    let next; let change;
    try {
      if (this.handlerState === HandlerState.DRAFT) next = await produce(this.state, (draft) => handler.call(this, draft, msg.payload, ctx));
      else if (this.handlerState === HandlerState.SHARED) next = await handler.call(this, this.state, msg.payload, ctx);
      else next = await handler.call(this, cloneJSON(this.state), msg.payload, ctx);
    } catch (err) {
      const error = this.#rejection(err, msg);
      if (gen === this.#gen) reject(error);
      return;
    }
    // The connection was lost while the handler ran: no answer, no state change. fluxd delivers the action again
    // once the store registered again, and it is handled then from the state adopted (SPEC §15.3).
    if (gen !== this.#gen) return;
    try {
      change = this.#change(next);
    } catch (err) {
      this.#report(err, { type: msg.type, seq: msg.seq });
      reject({ code: StoreErrorCodes.HANDLER_FAILED, message: `${msg.type} failed: the handler returned a state that is not JSON; the store's log has the details` });
      return;
    }
    if (change) {
      client.sendRaw(`{"op":"done","store":${store},"seq":${msg.seq},${change.field}}`, { force: true });
      this.#commit(next, change);
    } else {
      client.sendRaw(`{"op":"done","store":${store},"seq":${msg.seq}}`, { force: true });
    }
    for (const [type, payload] of followUps) {
      try { client.dispatch(type, payload, { cause: msg.seq }); } catch (err) { this.#report(err, { type: msg.type, seq: msg.seq }); }
    }
    if (client.backpressured) { // fluxd is not reading: take no more actions until it does
      try { await client.flush(); } catch { /* the client closed */ }
    }
  }
}
