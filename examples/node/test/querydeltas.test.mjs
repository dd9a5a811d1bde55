// Query deltas: a Store registers with queryDeltas, takes the full `queries` once and then `queries-changed`,
// and shows user code the same full set as before (fake fluxd, then the real one).
import { test, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { Client, QuerySet, Store, canonicalJSON } from '../fluxbus.mjs';
import { FakeFluxd } from './fakefluxd.mjs';
import { startFluxd } from './helpers.mjs';

const cleanups = [];
afterEach(async () => { for (const c of cleanups.splice(0).reverse()) await c(); });
const later = (fn) => cleanups.push(fn);

async function fake(options) { const f = await FakeFluxd.start(options); later(() => f.close()); return f; }
async function live(args = []) { const d = await startFluxd(args); later(() => d.stop()); return d; }
async function connect(options) { const c = await Client.connect(options); later(() => c.close()); return c; }

// -- query deltas -------------------------------------------------------------------------------------------

const pairs = (queries) => queries.map((q) => [canonicalJSON(q.query), q.count]);
function fullSet(counts) {
  return [...counts].filter(([, n]) => n > 0).sort((a, b) => Buffer.compare(Buffer.from(a[0]), Buffer.from(b[0])));
}
/** A store that resolves `until(predicate)` once its query view satisfies it. */
function watchedStore(options) {
  const store = new Store({ handles: [], initialState: {}, ...options });
  store.seen = []; store.ops = {};
  let wake = () => {};
  store.onQueries = (queries) => { store.seen.push(queries); wake(); };
  store.until = (predicate, timeout = 10000) => new Promise((resolve, reject) => {
    const timer = setTimeout(() => { wake = () => {}; reject(new Error(`store ${store.name} saw ${JSON.stringify(store.queries)}`)); }, timeout);
    const check = () => { if (predicate(store.queries)) { clearTimeout(timer); wake = () => {}; resolve(); } };
    wake = check; check();
  });
  return store;
}

test('QuerySet applies deltas and sorts by canonical bytes', () => {
  const qs = new QuerySet();
  qs.replace([{ query: { site: 7 }, count: 2 }, { query: 'a', count: 1 }]);
  assert.deepEqual(qs.active(), [{ query: 'a', count: 1 }, { query: { site: 7 }, count: 2 }]);
  qs.apply([{ query: { site: 7 }, count: 0 }, { query: { b: [1, { y: 1, x: 2 }] }, count: 3 }, { query: 'é', count: 1 }, { query: 'z', count: 1 }]);
  assert.deepEqual(pairs(qs.active()), [['"a"', 1], ['"z"', 1], ['"é"', 1], ['{"b":[1,{"x":2,"y":1}]}', 3]]);
  qs.apply([{ query: { site: 9 }, count: 0 }]);
  assert.equal(qs.size, 4);
});

test('a store keeps the active set from queries-changed (fake fluxd, random deltas)', async () => {
  const f = await fake();
  const store = watchedStore({ name: 'watched' });
  const started = store.start({ socketPath: f.socketPath });
  const peer = await f.accept();
  const register = await peer.expectOp('register');
  assert.equal(register.queryDeltas, true);
  const universe = [...Array(12).keys()].map((n) => ({ site: n })).concat(['plain', { nested: { b: 1, a: [true, null] } }, 0, [], 'ü']);
  const byKey = new Map(universe.map((q) => [canonicalJSON(q), q]));
  const counts = new Map(universe.map((q) => [canonicalJSON(q), 0]));
  counts.set(canonicalJSON(universe[0]), 2);
  peer.send({ op: 'registered', store: 'watched', version: 0, seq: 0, resumed: false });
  peer.send({ op: 'queries', store: 'watched', queries: [{ query: universe[0], count: 2 }] });
  await started;
  later(() => store.stop());
  assert.deepEqual(pairs(store.queries), fullSet(counts));
  let seed = 11;
  const random = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  const keys = [...counts.keys()];
  for (let round = 0; round < 60; round++) {
    const changed = new Set();
    for (let k = 1 + random(4); k > 0; k--) changed.add(keys[random(keys.length)]);
    for (const key of changed) counts.set(key, Math.max(0, counts.get(key) + [-2, -1, 1, 1, 3][random(5)]));
    const before = store.seen.length;
    const changes = [...changed].sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b))).map((k) => ({ query: byKey.get(k), count: counts.get(k) }));
    peer.send({ op: 'queries-changed', store: 'watched', changes });
    await store.until(() => store.seen.length > before);
    assert.deepEqual(pairs(store.queries), fullSet(counts), `round ${round}`);
    assert.deepEqual(pairs(store.seen.at(-1)), fullSet(counts));
  }
  peer.send({ op: 'queries', store: 'watched', queries: [{ query: 'only', count: 1 }] });
  await store.until((qs) => JSON.stringify(pairs(qs)) === JSON.stringify([['"only"', 1]]));
});

test('queryDeltas: false registers without it', async () => {
  const f = await fake();
  const store = new Store({ name: 'whole', handles: [], queryDeltas: false });
  const started = store.start({ socketPath: f.socketPath });
  const peer = await f.accept();
  assert.equal('queryDeltas' in (await peer.expectOp('register')), false);
  peer.send({ op: 'registered', store: 'whole', version: 0, seq: 0, resumed: false });
  peer.send({ op: 'queries', store: 'whole', queries: [] });
  await started;
  later(() => store.stop());
});

test('live: many clients adding and withdrawing queries; the deltas store sees the full set', async () => {
  const fluxd = await live();
  const deltas = watchedStore({ name: 'watched' });
  const whole = watchedStore({ name: 'whole', queryDeltas: false });
  for (const s of [deltas, whole]) {
    await s.start({ socketPath: fluxd.socketPath });
    later(() => s.stop());
    const original = s.client.storeSinks.get(s.name);
    s.client.attachStore(s.name, (msg) => { s.ops[msg.op] = (s.ops[msg.op] ?? 0) + 1; original(msg); });
  }
  const clients = [];
  for (let i = 0; i < 6; i++) clients.push(await connect({ socketPath: fluxd.socketPath, name: `q${i}` }));
  const universe = [...Array(10).keys()].map((n) => ({ site: n % 5, lang: ['en', 'fr'][n % 2] })).concat(['all', { 'é/ü': 'é' }]);
  let seed = 5;
  const random = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  let liveQueries = [];
  const check = async () => {
    for (const s of [deltas, whole]) {
      const counts = new Map();
      for (const { store, receipt } of liveQueries) if (store === s.name) counts.set(canonicalJSON(receipt.query), (counts.get(canonicalJSON(receipt.query)) ?? 0) + 1);
      const want = JSON.stringify(fullSet(counts));
      await s.until((qs) => JSON.stringify(pairs(qs)) === want);
    }
  };
  for (let burst = 0; burst < 8; burst++) {
    for (let k = 0; k < 25; k++) {
      if (liveQueries.length && random(100) < 45) {
        const [gone] = liveQueries.splice(random(liveQueries.length), 1);
        await gone.receipt.close();
      } else {
        const i = random(clients.length); const query = universe[random(universe.length)];
        for (const store of ['watched', 'whole']) liveQueries.push({ i, store, receipt: await clients[i].query(store, query) });
      }
    }
    await check();
  }
  await clients[0].close();
  liveQueries = liveQueries.filter((q) => q.i !== 0);
  await check();
  assert.ok((deltas.ops['queries-changed'] ?? 0) > 0 && !deltas.ops.queries);
  assert.ok((whole.ops.queries ?? 0) > 0 && !whole.ops['queries-changed']);
});
