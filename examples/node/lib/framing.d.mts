// Types of framing.mjs. Frames are Node Buffers; the type names only what this package relies on, so that it
// needs no @types/node.

/** A frame body (a Buffer at run time). */
export interface FrameBytes extends Uint8Array { toString(encoding?: string): string }
export type FrameEvent = { frame: FrameBytes } | { empty: true } | { tooLarge: number };

/** A frame: 4-byte big-endian length, then the body. */
export declare function encodeFrame(body: string | Uint8Array): FrameBytes;

/** Reassembles frames from a stream split or coalesced in any way. */
export declare class FrameDecoder {
  constructor(maxFrame?: number);
  maxFrame: number;
  failed: boolean;
  /** Bytes held that are not yet a complete frame. */
  readonly pending: number;
  feed(data: Uint8Array): FrameEvent[];
}
