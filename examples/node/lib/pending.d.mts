// Types of pending.mjs: calls waiting for replies, as `client.pending` shows them.
export declare class PendingReplies {
  private constructor();
  /** Calls waiting for a reply. */
  readonly size: number;
  /** Replies still owed to calls that gave up. */
  readonly owed: number;
  /** Replies dropped because their call had given up. */
  readonly lateReplies: number;
  has(key: string): boolean;
  /** Calls waiting for a reply with this key. */
  count(key: string): number;
}
