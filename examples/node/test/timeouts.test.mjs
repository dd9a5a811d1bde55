// Every call's timeout covers the whole call, and a call that gives up leaves nothing behind: it is removed from
// the pending map at once, a reply that comes later is dropped (not handed to a later call, not reported as an
// error), and what the request may have left in fluxd (a subscription, a query) is withdrawn. Fake fluxd, then
// the real one for the `unknown` store.
import { test, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { Client, Store, TimeoutError } from '../fluxbus.mjs';
import { FakeFluxd } from './fakefluxd.mjs';
import { startFluxd } from './helpers.mjs';

const cleanups = [];
afterEach(async () => { for (const c of cleanups.splice(0).reverse()) await c(); });
const later = (fn) => cleanups.push(fn);
async function fake(options) { const f = await FakeFluxd.start(options); later(() => f.close()); return f; }
async function live(args = []) { const d = await startFluxd(args); later(() => d.stop()); return d; }
async function connect(options) { const c = await Client.connect(options); later(() => c.close({ timeout: 500 })); return c; }

/** Fails the test if the client reports an error frame. */
function noErrorFrames(client) {
  const seen = [];
  client.on('error-frame', (e) => seen.push(e));
  return () => assert.deepEqual(seen.map((e) => e.message), [], 'no error-frame event');
}

test('a timed-out request leaves the pending map; its late reply and a late error are dropped', async () => {
  const f = await fake();
  const client = await connect({ socketPath: f.socketPath });
  const peer = await f.accept();
  const checkNoErrors = noErrorFrames(client);
  const before = client.pending.size;
  const call = client.info({ timeout: 50 });
  const request = await peer.expectOp('info');
  await assert.rejects(call, (e) => e instanceof TimeoutError && e.code === 'timeout' && !e.fatal
    && e.timeoutMs === 50 && e.message === 'timed out after 50 ms waiting for the reply to info');
  assert.equal(client.pending.size, before, 'pending map back to its size');
  assert.equal(client.pending.owed, 1, 'one reply is owed to the call that gave up');
  const settle = client.dispatchAndSettle('late/one', null, { timeout: 50 });
  const dispatch = await peer.expectOp('dispatch');
  // The timed-out settlement asks fluxd what it still waits for (info): nothing here.
  const note = await peer.expectOp('info');
  peer.send({ op: 'info', id: note.id, seq: 0, stores: [], peers: {}, counters: {} });
  await assert.rejects(settle, (e) => e instanceof TimeoutError && !e.message.includes('still waiting'));
  assert.equal(client.pending.size, before);
  peer.send({ op: 'info', id: request.id, seq: 0, stores: [], peers: {}, counters: {} });
  peer.send({ op: 'error', code: 'no-handler', message: 'no store handles "late/one"', ref: dispatch.id, fatal: false });
  assert.ok(await client.ping({ timeout: 5000 }) >= 0); // a barrier: the late frames were read before the pong
  assert.equal(client.pending.lateReplies, 2);
  assert.equal(client.pending.owed, 0);
  assert.equal(client.pending.size, before);
  assert.deepEqual(client.errors, []);
  checkNoErrors();
});

test('subscribed carries no id: a late one is dropped, not given to the next subscribe of that store', async () => {
  const f = await fake();
  const client = await connect({ socketPath: f.socketPath });
  const peer = await f.accept();
  await assert.rejects(client.subscribe('todos', { timeout: 50 }), (e) =>
    e instanceof TimeoutError && /confirm the subscription to 'todos'/.test(e.message));
  await peer.expectOp('subscribe');
  assert.deepEqual(await peer.expectOp('unsubscribe'), { op: 'unsubscribe', store: 'todos' }, 'the abandoned subscription is withdrawn');
  assert.equal(client.subscriptions.has('todos'), false);
  let resolved = false;
  const second = client.subscribe('todos', { timeout: 5000 }).then((sub) => { resolved = true; return sub; });
  await peer.expectOp('subscribe');
  peer.send({ op: 'subscribed', store: 'todos', status: 'unknown', version: 0 }); // owed to the first subscribe
  peer.send({ op: 'unsubscribed', store: 'todos' }); // owed to the cleanup
  await client.ping({ timeout: 5000 });
  assert.equal(resolved, false, 'the late subscribed did not answer the second subscribe');
  peer.send({ op: 'subscribed', store: 'todos', status: 'up', version: 3 });
  const sub = await second;
  assert.equal(sub.status, 'up');
  assert.equal(client.pending.size, 0);
  assert.equal(client.pending.lateReplies, 2);
});

test('a query that timed out after it went out is withdrawn', async () => {
  const f = await fake();
  const client = await connect({ socketPath: f.socketPath });
  const peer = await f.accept();
  await assert.rejects(client.query('comments', { site: 1 }, { timeout: 50 }), TimeoutError);
  const query = await peer.expectOp('query');
  assert.deepEqual(await peer.expectOp('unquery'), { op: 'unquery', id: query.id });
  peer.send({ op: 'query-ok', id: query.id });
  peer.send({ op: 'unquery-ok', id: query.id });
  await client.ping({ timeout: 5000 });
  assert.equal(client.pending.size, 0);
  assert.equal(client.pending.owed, 0);
});

test('connect: the timeout covers the handshake (fluxd that never welcomes)', async () => {
  const f = await fake({ silent: true });
  const started = performance.now();
  await assert.rejects(Client.connect({ socketPath: f.socketPath, timeout: 100 }), (e) =>
    e instanceof TimeoutError && e.message === `timed out after 100 ms waiting for fluxd's welcome (fluxd at ${f.socketPath}, from the socketPath option)`);
  assert.ok(performance.now() - started < 5000);
  const peer = await f.accept();
  await peer.waitClosed(); // the half-open connection was closed
});

test('Store.start: the timeout covers registration', async () => {
  const f = await fake();
  const store = new Store({ name: 'slow', handles: ['slow/*'] });
  await assert.rejects(store.start({ socketPath: f.socketPath, timeout: 1000 }), (e) =>
    e instanceof TimeoutError && e.message === "timed out after 1000 ms registering store 'slow'");
  const peer = await f.accept();
  await peer.expectOp('register');
  await peer.waitClosed();
  assert.ok(store.client.closed);
});

test('live: a subscription to a store that never registered says so when its timeout passes', async () => {
  const fluxd = await live();
  const client = await connect({ socketPath: fluxd.socketPath });
  const unknown = "no store named 'pycountr' has registered yet";
  await assert.rejects(client.subscribe('pycountr', { timeout: 1000, waitForSnapshot: true }), (e) =>
    e instanceof TimeoutError && e.message === `timed out after 1000 ms waiting for the first snapshot of 'pycountr': ${unknown}`);
  assert.equal(client.subscriptions.size, 0, 'the failed call left no subscription');
  assert.equal(client.pending.size, 0);
  await client.ping();
  assert.equal(client.pending.owed, 0, 'the cleanup unsubscribe was answered');

  const sub = await client.subscribe('pycountr', { timeout: 5000 });
  assert.equal(sub.status, 'unknown');
  await assert.rejects(sub.next(100), (e) => e instanceof TimeoutError && e.message.endsWith(unknown));
  await assert.rejects(sub.waitForStatus('up', { timeout: 100 }), (e) => e instanceof TimeoutError && e.message.endsWith(unknown));
  const store = new Store({ name: 'pycountr', handles: ['pycountr/*'], initialState: { n: 1 } });
  await store.start({ socketPath: fluxd.socketPath });
  later(() => store.stop());
  const first = await sub.next(10000); // the subscription made before the store registered works
  assert.deepEqual(first.state, { n: 1 });
  assert.equal(sub.status, 'up');
  assert.deepEqual(sub.events, [{ kind: 'store-up', version: 1 }]);
  const waited = await client.subscribe('pycountr', { timeout: 5000, waitForSnapshot: true });
  assert.equal(waited.latest.version, 1);
  await store.stop();
  await sub.waitForStatus('down', { timeout: 10000 });
  assert.equal(sub.events.at(-1).kind, 'store-down');
});
