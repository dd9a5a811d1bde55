// Frames (SPEC §3.1): a 4-byte big-endian length, then the body.

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

