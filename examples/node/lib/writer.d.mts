// Types of writer.mjs: the write queue's state, as `client.writer` shows it.
export declare const DEFAULT_MAX_WRITE_QUEUE: number;
export declare class FrameWriter {
  private constructor();
  /** The bound of the queue, in bytes (`maxWriteQueue`). */
  readonly maxQueued: number;
  /** Bytes waiting for the socket to drain. */
  readonly queuedBytes: number;
  /** The most bytes that ever waited at once. */
  readonly highWater: number;
  /** Whether the socket said stop and has not drained since. */
  readonly blocked: boolean;
  /** Frames not yet handed to the socket. */
  readonly backlog: number;
  readonly busy: boolean;
  flush(): Promise<void>;
}
