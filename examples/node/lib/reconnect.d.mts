// Types of reconnect.mjs: the reconnection policy.

/** `Client.connect({reconnect})` / `store.start({reconnect})`: every field optional (the defaults below). */
export interface ReconnectOptions {
  /** ms before the first attempt (default 50). */
  initialDelay?: number;
  /** The longest delay between attempts, in ms (default 2000). */
  maxDelay?: number;
  /** Each failed attempt multiplies the delay by this (default 2). */
  factor?: number;
  /** Up to this part of each delay (0 to 1) is taken off at random (default 0.5). */
  jitter?: number;
  /** Give up after this many attempts (default Infinity: never). */
  maxAttempts?: number;
  /** Give up this many ms after the connection was lost (default null: never). */
  giveUpAfter?: number | null;
}

/** A complete policy, as `reconnectPolicy` makes it. */
export interface ReconnectPolicy extends Required<ReconnectOptions> { enabled: boolean }

export declare const DEFAULT_RECONNECT: Readonly<Required<ReconnectOptions>>;
/** `true`/undefined = the defaults, `false` = off, an object = the defaults with its fields. Throws TypeError for a bad field. */
export declare function reconnectPolicy(option: boolean | ReconnectOptions | undefined): ReconnectPolicy;
/** The delay in ms before attempt `attempt` (1, 2, ...): doubling (`factor`) up to `maxDelay`, less up to `jitter` of it at random. */
export declare function backoffDelay(policy: Pick<ReconnectPolicy, 'initialDelay' | 'maxDelay' | 'factor' | 'jitter'>, attempt: number, random?: () => number): number;
