// Leaving a `for await` over a subscription (break, return, throw) unsubscribes: fluxd's info shows the store's
// subscriber count drop to 0, and the client holds no subscription. Several subscriptions of one client to one
// store are independent; the last one closed unsubscribes. Real fluxd.
import { test, beforeEach, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { Client, Store } from '../fluxbus.mjs';
import { startFluxd } from './helpers.mjs';

let fluxd; let store; let client; let watcher;
beforeEach(async () => {
  fluxd = await startFluxd();
  store = new Store({ name: 'counter', handles: ['counter/*'], initialState: { value: 0 } });
  store.on('counter/add', (state, { by }) => ({ value: state.value + by }));
  await store.start({ socketPath: fluxd.socketPath });
  client = await Client.connect({ socketPath: fluxd.socketPath, name: 'iterating' });
  watcher = await Client.connect({ socketPath: fluxd.socketPath, name: 'watcher' });
});
afterEach(async () => {
  await client.close(); await watcher.close(); await store.stop();
  await fluxd.stop();
});

/** fluxd's count of subscribers of `counter` (asked on another connection, after a barrier on the iterating one). */
async function subscribers() {
  await client.ping();
  return (await watcher.info()).stores.find((s) => s.name === 'counter').subscribers;
}

/** Subscribes, checks fluxd counts the subscriber, and reads until value 2 inside `body`'s loop. */
async function iterate(body) {
  const sub = await client.subscribe('counter');
  assert.equal(await subscribers(), 1);
  await client.dispatchAndSettle('counter/add', { by: 2 });
  await body(sub);
  assert.equal(sub.ended, true);
  assert.equal(client.subscriptions.size, 0);
  assert.equal(client.pending.size, 0, 'the unsubscribe was answered before the loop was left');
  assert.equal(await subscribers(), 0);
  return sub;
}

test('break out of for await unsubscribes', async () => {
  await iterate(async (sub) => {
    for await (const snap of sub) if (snap.state.value === 2) break;
  });
});

test('return from inside for await unsubscribes', async () => {
  await iterate(async (sub) => {
    const found = await (async () => { for await (const snap of sub) if (snap.state.value === 2) return snap; return undefined; })();
    assert.equal(found.state.value, 2);
  });
});

test('an exception thrown inside for await unsubscribes', async () => {
  await iterate(async (sub) => {
    await assert.rejects((async () => { for await (const snap of sub) if (snap.state.value === 2) throw new Error('stop here'); })(), /stop here/);
  });
});

test('a finished loop yields nothing more; iterating again ends at once', async () => {
  const sub = await iterate(async (s) => { for await (const snap of s) if (snap.version >= 2) break; });
  const seen = [];
  for await (const snap of sub) seen.push(snap);
  assert.deepEqual(seen, []);
  assert.equal(await sub.next(), undefined);
});

test('two subscriptions to one store: leaving one loop keeps the other; the last one unsubscribes', async () => {
  const a = await client.subscribe('counter');
  const b = await client.subscribe('counter');
  assert.notEqual(a, b);
  assert.equal(await subscribers(), 1, 'fluxd holds one subscription per connection');
  for await (const snap of a) if (snap.version >= 1) break;
  assert.equal(a.ended, true);
  assert.equal(await subscribers(), 1);
  await client.dispatchAndSettle('counter/add', { by: 5 });
  assert.equal((await b.until((s) => s.state.value === 5, 10000)).version, 2);
  await b.close();
  assert.equal(await subscribers(), 0);
  await b.close(); // idempotent
  const c = await client.subscribe('counter');
  assert.equal((await c.next(10000)).version, 2);
  assert.equal(await subscribers(), 1);
  await client.unsubscribe('counter'); // the public call ends all of them
  assert.equal(c.ended, true);
  assert.equal(await subscribers(), 0);
});
