// Calls waiting for fluxd's reply, keyed by request id (or, for `subscribed`/`unsubscribed`, which carry no id, by
// op and store: those are matched in order, SPEC §2). A call that gives up (its deadline passed) is removed at
// once; if its request had been sent, the reply it is owed is remembered so that it is dropped when it comes
// (counted in `lateReplies`) instead of answering a later call or being reported as an unexplained error.

const MAX_OWED_KEYS = 4096; // replies owed to calls that gave up, remembered at most (oldest forgotten first)

/** @typedef {{key: string, promise: Promise<any>, resolve: (msg: any) => void, reject: (err: Error) => void, done?: boolean}} Waiter */

export class PendingReplies {
  /** @type {Map<string, Waiter[]>} */ #waiters = new Map();
  /** @type {Map<string, number>} */ #owed = new Map();
  #size = 0;
  /** Replies dropped because the call they answered had given up. */
  lateReplies = 0;

  /** Calls waiting for a reply. */
  get size() { return this.#size; }
  /** Replies still owed to calls that gave up (kept to recognise them). */
  get owed() { let n = 0; for (const c of this.#owed.values()) n += c; return n; }
  /** @param {string} key */
  has(key) { return this.#waiters.has(key); }
  /** The first key with calls waiting that starts with `prefix`. @param {string} prefix @returns {string|undefined} */
  firstKey(prefix) { for (const key of this.#waiters.keys()) if (key.startsWith(prefix)) return key; return undefined; }
  /** Calls waiting for a reply keyed `key`. @param {string} key */
  count(key) { return this.#waiters.get(key)?.length ?? 0; }

  /** A new waiter for the reply keyed `key` (after any earlier waiter of the same key). @returns {Waiter} */
  add(key) {
    /** @type {any} */ const waiter = { key };
    waiter.promise = new Promise((resolve, reject) => { waiter.resolve = resolve; waiter.reject = reject; });
    const list = this.#waiters.get(key);
    if (list) list.push(waiter); else this.#waiters.set(key, [waiter]);
    this.#size++;
    return waiter;
  }

  /**
   * Removes a waiter whose call gave up. `replyOwed`: its request reached the socket, so a reply keyed like it
   * will still come; it is dropped when it does. @param {Waiter} waiter @param {boolean} replyOwed
   */
  abandon(waiter, replyOwed) {
    if (this.#remove(waiter) && replyOwed) this.expectLate(waiter.key);
  }

  /** Remembers that one reply keyed `key` is owed to nobody (e.g. to an `unsubscribe` sent on cleanup). @param {string} key */
  expectLate(key) {
    this.#owed.set(key, (this.#owed.get(key) ?? 0) + 1);
    if (this.#owed.size > MAX_OWED_KEYS) this.#owed.delete(this.#owed.keys().next().value);
  }

  /**
   * Hands a reply to the oldest waiter of `key`: resolves it, or rejects it with `toError(msg)` for an `error`.
   * A reply owed to a call that gave up comes before any later call's (replies keep request order) and is dropped.
   * @param {string|undefined} key @param {Record<string, any>} msg @param {(msg: any) => Error} toError
   * @returns {'settled'|'late'|false} false: nobody waited for it
   */
  settle(key, msg, toError) {
    if (key === undefined) return false;
    const owed = this.#owed.get(key);
    if (owed) {
      if (owed === 1) this.#owed.delete(key); else this.#owed.set(key, owed - 1);
      this.lateReplies++;
      return 'late';
    }
    const list = this.#waiters.get(key);
    if (!list) return false;
    const waiter = list.shift();
    if (!list.length) this.#waiters.delete(key);
    this.#size--;
    waiter.done = true;
    if (msg.op === 'error') waiter.reject(toError(msg)); else waiter.resolve(msg);
    return 'settled';
  }

  /** Resolves one waiter with `value` (a reply that came another way, e.g. through `recovered`). @param {Waiter} waiter @param {any} value */
  resolveWaiter(waiter, value) { if (this.#remove(waiter)) waiter.resolve(value); }

  /** Rejects one waiter with `error`. @param {Waiter} waiter @param {Error} error */
  rejectWaiter(waiter, error) { if (this.#remove(waiter)) waiter.reject(error); }

  /** Forgets the replies owed to calls that gave up: the connection they were owed on is gone. */
  forgetOwed() { this.#owed.clear(); }

  #remove(waiter) {
    const list = this.#waiters.get(waiter.key);
    const at = list ? list.indexOf(waiter) : -1;
    if (at < 0) return false;
    list.splice(at, 1);
    if (!list.length) this.#waiters.delete(waiter.key);
    this.#size--;
    waiter.done = true;
    return true;
  }

  /** Rejects every waiter (the connection ended). @param {Error} reason */
  rejectAll(reason) {
    const lists = [...this.#waiters.values()];
    this.#waiters.clear(); this.#owed.clear(); this.#size = 0;
    for (const list of lists) for (const waiter of list) { waiter.done = true; waiter.reject(reason); }
  }
}
