// A store's active queries, kept from fluxd's `queries` and `queries-changed` (SPEC §8.6).
import { canonicalJSON } from './canonical.mjs';

/** @typedef {{query: any, count: number}} ActiveQuery */

/**
 * A store's active queries, kept from fluxd's full `queries` message and the `queries-changed` deltas that follow
 * it when the store registered with "queryDeltas": true. Keyed by the query's canonical JSON; `active()` lists them
 * sorted by the UTF-8 bytes of that text, as fluxd sorts `queries`.
 */
export class QuerySet {
  constructor() { /** @type {Map<string, ActiveQuery>} */ this.byKey = new Map(); /** @type {ActiveQuery[]|null} */ this.sorted = []; }
  /** Takes a full `queries` list: it replaces whatever was known. @param {ActiveQuery[]} entries */
  replace(entries) { this.byKey.clear(); this.apply(entries); }
  /** Takes a `queries-changed` list: each `count` is the query's new count, 0 = withdrawn. @param {ActiveQuery[]} changes */
  apply(changes) {
    for (const { query, count } of changes) {
      const key = canonicalJSON(query);
      if (Number.isInteger(count) && count > 0) this.byKey.set(key, { query, count }); else this.byKey.delete(key);
    }
    this.sorted = null;
  }
  /** The active queries (a new array each time), sorted by canonical bytes. @returns {ActiveQuery[]} */
  active() {
    if (this.sorted === null) {
      this.sorted = [...this.byKey.keys()].map((k) => [Buffer.from(k, 'utf8'), k])
        .sort((a, b) => Buffer.compare(a[0], b[0])).map(([, k]) => this.byKey.get(k));
    }
    return [...this.sorted];
  }
  get size() { return this.byKey.size; }
}
