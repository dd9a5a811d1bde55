// Writes that respect backpressure. While the socket accepts (socket.write returns true), frames go straight to
// it. Once it returns false, later frames wait here, in order, until 'drain'; the bytes waiting are bounded by
// `maxQueued`. A fire-and-forget send past the bound throws WriteQueueFullError (nothing is queued); an awaited
// call waits for room instead (`enqueue`), inside its own deadline; answers fluxd waits for (pong, done, reject,
// bye) may pass the bound (`force`), so a store never stops answering. Node's own buffer holds at most one write
// past the socket's high-water mark, so what this connection holds in memory stays bounded too.
import { WriteQueueFullError } from './errors.mjs';

export const DEFAULT_MAX_WRITE_QUEUE = 16 * 1024 * 1024;

/**
 * A frame on its way. `state` 'offline' is the client's: the frame waits for the next connection (reconnecting).
 * @typedef {{bytes: Uint8Array, state: 'waiting'|'queued'|'sent'|'cancelled'|'offline', [field: string]: any}} WriteEntry
 */

export class FrameWriter {
  /** @type {WriteEntry[]} accepted, waiting for 'drain' */ #queue = [];
  /** @type {WriteEntry[]} awaited sends waiting for room in #queue */ #waiting = [];
  /** @type {Array<{resolve: () => void, reject: (err: Error) => void}>} */ #flushers = [];
  /** @type {Error|null} */ #closed = null;

  /**
   * @param {{write(bytes: Uint8Array): boolean, on(event: 'drain', f: () => void): any}} socket
   * @param {{maxQueued?: number, onBlocked?: () => void, onDrain?: () => void}} [options]
   */
  constructor(socket, { maxQueued = DEFAULT_MAX_WRITE_QUEUE, onBlocked = () => {}, onDrain = () => {} } = {}) {
    if (!(Number.isInteger(maxQueued) && maxQueued > 0)) throw new TypeError(`maxWriteQueue must be a positive number of bytes, not ${maxQueued}`);
    this.socket = socket; this.maxQueued = maxQueued; this.onBlocked = onBlocked; this.onDrain = onDrain;
    /** Bytes waiting here for the socket (accepted, not yet handed to it). */ this.queuedBytes = 0;
    /** The most bytes that ever waited here at once. */ this.highWater = 0;
    /** Whether the socket said stop (write returned false) and has not drained since. */ this.blocked = false;
    socket.on('drain', () => this.#drained());
  }

  /** Frames not yet handed to the socket (accepted or waiting for room). */
  get backlog() { return this.#queue.length + this.#waiting.length; }
  /** Whether anything waits: the socket is blocked or frames are queued. */
  get busy() { return this.blocked || this.backlog > 0; }

  /**
   * Writes or queues one frame now. Throws WriteQueueFullError when it does not fit (unless `force`), and the
   * connection's end reason once it ended. @param {Uint8Array} bytes @param {{force?: boolean}} [options]
   * @returns {WriteEntry}
   */
  write(bytes, { force = false } = {}) {
    if (this.#closed) throw this.#closed;
    if (!force && (this.#waiting.length || !this.#fits(bytes.length))) throw new WriteQueueFullError(this.queuedBytes, this.maxQueued);
    return this.#accept({ bytes, state: 'queued' });
  }

  /**
   * Queues one frame as soon as there is room, after the sends already waiting for room (order is kept).
   * `cancel(entry)` takes it back while it has not reached the socket. An entry (e.g. one `takeUnsent` gave back
   * from an earlier connection's writer) is queued as it is. @param {Uint8Array|WriteEntry} frame @returns {WriteEntry}
   */
  enqueue(frame) {
    if (this.#closed) throw this.#closed;
    /** @type {WriteEntry} */ const entry = frame instanceof Uint8Array ? { bytes: frame, state: 'waiting' } : frame;
    entry.state = 'waiting';
    if (!this.#waiting.length && this.#fits(entry.bytes.length)) this.#accept(entry); else this.#waiting.push(entry);
    return entry;
  }

  /**
   * The frames accepted or waiting for room that never reached the socket, in order, taken out of this writer
   * (state 'offline'): the connection was lost, and the client sends some of them again on the next one.
   * @returns {WriteEntry[]}
   */
  takeUnsent() {
    const unsent = [...this.#queue, ...this.#waiting];
    this.#queue = []; this.#waiting = []; this.queuedBytes = 0;
    for (const e of unsent) e.state = 'offline';
    return unsent;
  }

  /** Takes back a frame not yet handed to the socket. @param {WriteEntry} entry @returns {boolean} false if it was sent */
  cancel(entry) {
    if (entry.state === 'waiting') { this.#waiting.splice(this.#waiting.indexOf(entry), 1); }
    else if (entry.state === 'queued') { this.#queue.splice(this.#queue.indexOf(entry), 1); this.queuedBytes -= entry.bytes.length; }
    else return entry.state === 'cancelled';
    entry.state = 'cancelled';
    this.#settleFlushers();
    return true;
  }

  /** Resolves once everything written so far has been handed to the socket and the socket drained. */
  flush() {
    if (this.#closed) return Promise.reject(this.#closed);
    if (!this.busy) return Promise.resolve();
    return new Promise((resolve, reject) => this.#flushers.push({ resolve, reject }));
  }

  /** The connection ended: nothing more is written; flushes reject with `reason`. @param {Error} reason */
  close(reason) {
    if (this.#closed) return;
    this.#closed = reason;
    for (const e of [...this.#queue, ...this.#waiting]) e.state = 'cancelled';
    this.#queue = []; this.#waiting = []; this.queuedBytes = 0;
    for (const f of this.#flushers.splice(0)) f.reject(reason);
  }

  #fits(n) { return this.queuedBytes === 0 || this.queuedBytes + n <= this.maxQueued; }

  /** @param {WriteEntry} entry */
  #accept(entry) {
    if (!this.blocked && !this.#queue.length) { entry.state = 'sent'; this.#toSocket(entry.bytes); return entry; }
    entry.state = 'queued';
    this.#queue.push(entry);
    this.queuedBytes += entry.bytes.length;
    if (this.queuedBytes > this.highWater) this.highWater = this.queuedBytes;
    return entry;
  }

  #toSocket(bytes) {
    if (this.socket.write(bytes) === false && !this.blocked) { this.blocked = true; this.onBlocked(); }
  }

  #drained() {
    if (this.#closed) return;
    this.blocked = false;
    while (!this.blocked && this.#queue.length) {
      const entry = this.#queue.shift();
      this.queuedBytes -= entry.bytes.length;
      entry.state = 'sent';
      this.#toSocket(entry.bytes);
    }
    while (this.#waiting.length && this.#fits(this.#waiting[0].bytes.length)) this.#accept(this.#waiting.shift());
    if (!this.busy) this.onDrain();
    this.#settleFlushers();
  }

  #settleFlushers() { if (!this.busy) for (const f of this.#flushers.splice(0)) f.resolve(); }
}
