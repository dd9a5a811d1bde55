// A subscription to one store (an async iterator of snapshots that unsubscribes when the loop is left) and the
// receipt of a query.
import { StoreStatus } from './constants.mjs';
import { DisconnectedError, TimeoutError } from './errors.mjs';
import { Deadline } from './deadline.mjs';
import { kRelease, kDeliver, kEnd, kStatus, kFirst, kRebase } from './internal.mjs';

/**
 * @typedef {{store: string, version: number, seq: number, state: any, path?: string, exists?: boolean}} Snapshot
 * @typedef {{kind: 'store-down', reason: string} | {kind: 'store-up', version: number}} StoreEvent
 */

/**
 * A subscription to one store, made by `client.subscribe(store)`: an async iterator of snapshots (never an older
 * version after a newer one, nor one version twice, across reconnections too). Leaving a `for await` loop over it
 * (break, return, throw) unsubscribes, as `close()` does. `status` is fluxd's word on the store: `up`, `down` or
 * `unknown` (never registered). It lasts across reconnections of its client and ends when the client closes.
 * After a reconnection to a fluxd of another epoch (SPEC §15.1: a new history, e.g. an ephemeral fluxd restarted)
 * it takes the next snapshot whatever its version, since versions then start over.
 */
export class Subscription {
  /** @type {Snapshot[]} */ #queue = [];
  /** Whether the next snapshot is taken whatever its version (the epoch changed). */ #rebase = false;
  /** @type {Array<(r: IteratorResult<Snapshot, undefined>) => void>} */ #waiters = [];
  /** @type {Array<() => void>} */ #firstWaiters = [];
  /** @type {Array<() => void>} */ #statusWaiters = [];

  /** @param {import('./client.mjs').Client} client @param {string} store @param {string} [path] */
  constructor(client, store, path) {
    this.client = client; this.store = store;
    /** @type {string|undefined} the JSON Pointer of a path subscription (SPEC §16.4): snapshots hold the value there */
    this.path = path;
    /** @type {'up'|'down'|'unknown'|undefined} from `subscribed`, then store-down / store-up */ this.status = undefined;
    /** @type {Snapshot|undefined} the newest snapshot received */ this.latest = undefined;
    /** @type {StoreEvent[]} store-down / store-up, in order */ this.events = [];
    /** Whether it ended (closed, unsubscribed, or the connection ended). */ this.ended = false;
  }

  /** The client reconnected to another epoch: versions start over. @internal */
  [kRebase]() { this.#rebase = true; }

  /** @param {string} status @internal */
  [kStatus](status) { this.status = /** @type {any} */ (status); this.#statusChanged(); }

  #statusChanged() { for (const w of this.#statusWaiters.splice(0)) w(); }

  /** @param {Record<string, any>} msg @internal */
  [kDeliver](msg) {
    if (this.ended) return;
    if (msg.op === 'snapshot' || msg.op === 'subtree') {
      if (this.latest && !this.#rebase && msg.version <= this.latest.version) return;
      this.#rebase = false;
      /** @type {Snapshot} */ const snap = { store: msg.store, version: msg.version, seq: msg.seq, state: msg.state };
      if (msg.op === 'subtree') { snap.path = msg.path; snap.exists = msg.exists === true; snap.state = snap.exists ? msg.value : undefined; }
      this.latest = snap;
      const waiter = this.#waiters.shift();
      if (waiter) waiter({ value: snap, done: false }); else this.#queue.push(snap);
      for (const w of this.#firstWaiters.splice(0)) w();
    } else if (msg.op === 'store-down') {
      this.status = StoreStatus.DOWN; this.events.push({ kind: 'store-down', reason: msg.reason }); this.#statusChanged();
    } else if (msg.op === 'store-up') {
      this.status = StoreStatus.UP; this.events.push({ kind: 'store-up', version: msg.version }); this.#statusChanged();
    }
  }

  /** @internal */
  [kEnd]() {
    this.ended = true;
    for (const w of this.#waiters.splice(0)) w({ value: undefined, done: true });
    for (const w of this.#firstWaiters.splice(0)) w();
    this.#statusChanged();
  }

  /**
   * Resolves once the store's status is `status` (at once if it is), e.g. `await sub.waitForStatus('up')` for a
   * store that may start after its clients. Rejects with TimeoutError after `timeout` ms (none by default; the
   * message says when no store of that name has registered yet), DisconnectedError if the subscription ends.
   * @param {'up'|'down'|'unknown'} status @param {{timeout?: number|null}} [options]
   */
  async waitForStatus(status, { timeout } = {}) {
    const deadline = new Deadline(timeout);
    while (this.status !== status) {
      if (this.ended) throw this.client.closedReason ?? new DisconnectedError(`the subscription to '${this.store}' ended`);
      let waiter;
      const changed = new Promise((resolve) => { waiter = resolve; this.#statusWaiters.push(resolve); });
      await deadline.race(changed, () => {
        this.#statusWaiters.splice(this.#statusWaiters.indexOf(waiter), 1);
        return this.#timeout(deadline, `store '${this.store}' to be ${status}`, false);
      });
    }
  }

  /** Resolves once a first snapshot arrived (or the subscription ended), within `deadline`. @internal */
  [kFirst](deadline) {
    if (this.latest || this.ended) return Promise.resolve();
    let waiter;
    const arrived = new Promise((resolve) => { waiter = resolve; this.#firstWaiters.push(resolve); });
    return deadline.race(arrived, () => {
      this.#firstWaiters.splice(this.#firstWaiters.indexOf(waiter), 1);
      return this.#timeout(deadline, `the first snapshot of '${this.store}'`);
    });
  }

  /**
   * The next snapshot; resolves undefined once the subscription ended. Rejects with TimeoutError after `timeout`
   * ms (none by default); while the store is `unknown` its message says no store of that name has registered yet.
   * @param {number|null} [timeout] @returns {Promise<Snapshot|undefined>}
   */
  async next(timeout) {
    const r = await this.#take(new Deadline(timeout));
    return r.done ? undefined : r.value;
  }

  /** Reads snapshots until `predicate(snapshot)`, within one `timeout`; returns that one. @param {(s: Snapshot) => boolean} predicate @param {number|null} [timeout] */
  async until(predicate, timeout) {
    const deadline = new Deadline(timeout);
    for (;;) {
      const r = await this.#take(deadline);
      if (r.done) throw this.client.closedReason ?? new DisconnectedError(`the subscription to '${this.store}' ended`);
      if (predicate(r.value)) return r.value;
    }
  }

  /** @param {Deadline} deadline @returns {Promise<IteratorResult<Snapshot, undefined>>} */
  #take(deadline) {
    if (this.#queue.length) return Promise.resolve({ value: this.#queue.shift(), done: false });
    if (this.ended) return Promise.resolve({ value: undefined, done: true });
    let waiter;
    const next = new Promise((resolve) => { waiter = resolve; this.#waiters.push(resolve); });
    return deadline.race(next, () => {
      this.#waiters.splice(this.#waiters.indexOf(waiter), 1);
      return this.#timeout(deadline, `a snapshot of '${this.store}'`);
    });
  }

  #timeout(deadline, what, aboutState = true) {
    let why = '';
    if (this.status === StoreStatus.UNKNOWN) why = `: no store named '${this.store}' has registered yet`;
    else if (this.status === StoreStatus.DOWN) why = `: store '${this.store}' is down`;
    else if (aboutState && this.status === StoreStatus.UP && !this.latest) why = `: store '${this.store}' is up but has no state yet`;
    return new TimeoutError(`timed out after ${deadline.ms} ms waiting for ${what}${why}`, { timeoutMs: deadline.ms });
  }

  /** Snapshots as they come; leaving the loop unsubscribes. @returns {AsyncIterableIterator<Snapshot>} */
  [Symbol.asyncIterator]() {
    const forever = new Deadline(null);
    return {
      next: () => this.#take(forever),
      return: async () => { await this.close(); return { value: undefined, done: true }; },
      [Symbol.asyncIterator]() { return this; },
    };
  }

  /**
   * Ends the iteration and, if it is this client's last subscription to the store, unsubscribes (resolves on
   * fluxd's `unsubscribed`; at once if the connection already ended). @param {{timeout?: number|null}} [options]
   */
  async close({ timeout } = {}) {
    try { await this.client[kRelease](this, timeout); } catch (err) { if (!(err instanceof DisconnectedError)) throw err; }
  }
}

/** An active query (WordPressFlux's Receipt); `close()` withdraws it. */
export class QueryReceipt {
  /** @param {import('./client.mjs').Client} client @param {string} id @param {string} store @param {any} query */
  constructor(client, id, store, query) { this.client = client; this.id = id; this.store = store; this.query = query; this.active = true; }
  /** Withdraws the query (idempotent). @param {{timeout?: number|null}} [options] */
  async close({ timeout } = {}) { if (this.active) { this.active = false; await this.client.unquery(this.id, { timeout }); } }
}
