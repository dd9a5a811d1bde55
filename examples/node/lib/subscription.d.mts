// Types of subscription.mjs.
import type { StoreStatus } from './constants.mjs';
import type { CallOptions, Client } from './client.mjs';

export interface Snapshot<S = unknown> {
  store: string;
  version: number;
  seq: number;
  /** The store's state at `version`; for a path subscription, the value at `path` (undefined if none). */
  state: S;
  /** A path subscription's pointer (SPEC §16.4). */
  path?: string;
  /** A path subscription's: whether the state has a value at `path` at this version. */
  exists?: boolean;
}
export type StoreEvent = { kind: 'store-down'; reason: string } | { kind: 'store-up'; version: number };

/** A subscription to one store: an async iterator of snapshots; leaving the loop unsubscribes. */
export declare class Subscription<S = unknown> implements AsyncIterable<Snapshot<S>> {
  private constructor();
  readonly client: Client;
  readonly store: string;
  /** The JSON Pointer of a path subscription; undefined for the whole store. */
  readonly path: string | undefined;
  /** fluxd's word on the store: `unknown` = no store of that name has registered yet. */
  readonly status: StoreStatus | undefined;
  readonly latest: Snapshot<S> | undefined;
  readonly events: StoreEvent[];
  readonly ended: boolean;
  /** The next snapshot, or undefined once ended; TimeoutError after `timeout` ms (none by default). */
  next(timeout?: number | null): Promise<Snapshot<S> | undefined>;
  until(predicate: (snapshot: Snapshot<S>) => boolean, timeout?: number | null): Promise<Snapshot<S>>;
  waitForStatus(status: StoreStatus, options?: CallOptions): Promise<void>;
  close(options?: CallOptions): Promise<void>;
  [Symbol.asyncIterator](): AsyncIterableIterator<Snapshot<S>>;
}

/** An active query; `close()` withdraws it. */
export declare class QueryReceipt<Q = unknown> {
  private constructor();
  readonly client: Client;
  readonly id: string;
  readonly store: string;
  readonly query: Q;
  readonly active: boolean;
  close(options?: CallOptions): Promise<void>;
}
