// One deadline per call, so that a call's timeout covers all of it (waiting for write room, for the reply, for a
// first snapshot), not only its last step.

const MAX_TIMER = 2 ** 31 - 1; // setTimeout's limit; longer deadlines are treated as none

export class Deadline {
  /** @param {number|null|undefined} ms the time limit; null, undefined or Infinity = none */
  constructor(ms) {
    if (ms !== null && ms !== undefined && !(typeof ms === 'number' && ms >= 0)) {
      throw new TypeError(`a timeout is a number of milliseconds >= 0 (or null for none), not ${JSON.stringify(ms)}`);
    }
    /** @type {number} */ this.ms = ms ?? Infinity;
    /** @type {number} */ this.at = this.ms > MAX_TIMER ? Infinity : performance.now() + this.ms;
  }
  /** Milliseconds left (Infinity without a limit). */
  get remaining() { return this.at === Infinity ? Infinity : Math.max(0, this.at - performance.now()); }
  get expired() { return this.remaining === 0; }
  /**
   * Settles as `promise` does, unless the deadline passes first: then rejects with `onTimeout()` (which may also
   * clean up what the call left behind). `promise` is still observed afterwards, so its rejection is never unhandled.
   * @template T @param {Promise<T>} promise @param {() => Error} onTimeout @returns {Promise<T>}
   */
  race(promise, onTimeout) {
    if (this.at === Infinity) return promise;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(onTimeout()), this.remaining);
      promise.then((value) => { clearTimeout(timer); resolve(value); }, (err) => { clearTimeout(timer); reject(err); });
    });
  }
}
