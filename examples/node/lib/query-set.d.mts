// Types of query-set.mjs.
export interface ActiveQuery<Q = unknown> { query: Q; count: number }
/** A store's active queries, kept from `queries` and `queries-changed`. */
export declare class QuerySet {
  constructor();
  replace(entries: ActiveQuery[]): void;
  apply(changes: ActiveQuery[]): void;
  active(): ActiveQuery[];
  readonly size: number;
}
