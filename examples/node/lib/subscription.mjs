// A subscription (an async iterator of snapshots) and a query receipt.
import { FluxError } from './errors.mjs';
import { withTimeout } from './client.mjs';

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
