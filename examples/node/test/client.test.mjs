// The Node client and Store against a real fluxd.
import { test, beforeEach, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { Client, FluxError, NameTakenError, NoHandlerError, Reject, Store, StoreRejectedError, UnknownStoreError } from '../fluxbus.mjs';
import { startFluxd } from './helpers.mjs';

let fluxd; const cleanups = [];
beforeEach(async () => { fluxd = await startFluxd(); });
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
  await fluxd.stop();
});

async function connect(options = {}) {
  const client = await Client.connect({ socketPath: fluxd.socketPath, ...options });
  cleanups.push(() => client.close());
  return client;
}

function todoStore() {
  const store = new Store({ name: 'todos', handles: ['todo/*'], initialState: { items: [], next: 1 } });
  store.on('todo/add', (state, payload, ctx) => {
    if (!payload?.title) throw new Reject('todo/empty-title', 'a todo needs a title', { field: 'title' });
    state.items.push({ id: state.next++, title: payload.title, seq: ctx.seq });
    if (payload.announce) ctx.dispatch('log/added', { title: payload.title });
    return state;
  });
  store.on('todo/touch', (state) => state);
  store.on('todo/slow', async (state) => { await new Promise((r) => setImmediate(r)); state.slow = true; return state; });
  store.on('todo/crash', (state) => { state.items = []; throw new Error('boom'); });
  return store;
}

async function start(store) {
  const result = await store.start({ socketPath: fluxd.socketPath });
  cleanups.push(() => store.stop());
  return result;
}

test('welcome, info, ping, get', async () => {
  const client = await connect({ name: 'node-test' });
  assert.ok(client.welcome.peer >= 1);
  assert.equal(client.welcome.limits.maxFrame, 1048576);
  assert.ok(await client.ping() >= 0);
  assert.equal((await client.info()).peers.client, 1);
  await assert.rejects(client.get('nothing'), (e) => e instanceof UnknownStoreError && e instanceof FluxError && e.code === 'unknown-store');
});

test('dispatchAndSettle with read-your-writes, subscription as async iterator', async () => {
  await start(todoStore());
  const client = await connect();
  const sub = await client.subscribe('todos');
  assert.equal(sub.status, 'up');
  assert.equal((await sub.next(10000)).version, 1);
  const settlement = await client.dispatchAndSettle('todo/add', { title: 'milk' });
  assert.ok(settlement.ok);
  assert.deepEqual(settlement.results, [{ store: 'todos', status: 'done', version: 2 }]);
  assert.equal(sub.latest.version, 2);
  client.dispatch('todo/slow');
  const versions = [];
  for await (const snap of sub) { versions.push(snap.version); if (snap.version === 3) break; }
  assert.deepEqual(versions, [2, 3]);
  assert.equal((await client.get('todos')).state.slow, true);
  await sub.close();
});

test('unchanged state, rejection, failing handler', async () => {
  await start(todoStore());
  const client = await connect();
  assert.deepEqual((await client.dispatchAndSettle('todo/touch')).results, [{ store: 'todos', status: 'done', version: 1 }]);
  const rejected = await client.dispatchAndSettle('todo/add', { title: '' });
  assert.deepEqual(rejected.results[0].error, { code: 'todo/empty-title', message: 'a todo needs a title', field: 'title' });
  assert.throws(() => rejected.check(), (e) => e instanceof StoreRejectedError && e.code === 'todo/empty-title'
    && e.detail === 'a todo needs a title' && e.store === 'todos' && e.details.field === 'title');
  assert.deepEqual((await client.dispatchAndSettle('todo/crash')).results[0].error, { code: 'store/error', message: 'todo/crash failed: boom' });
  assert.equal((await client.dispatchAndSettle('todo/add', { title: 'x' })).results[0].version, 2);
  assert.equal((await client.get('todos')).state.items.length, 1);
});

test('follow-up dispatches carry cause', async () => {
  await start(todoStore());
  const log = new Store({ name: 'log', handles: ['log/*'], initialState: [] });
  log.on('log/*', (state, payload, ctx) => [...state, { type: ctx.type, cause: ctx.cause }]);
  await start(log);
  const client = await connect();
  const sub = await client.subscribe('log');
  await sub.next(10000);
  const settlement = await client.dispatchAndSettle('todo/add', { title: 't', announce: true });
  const snap = await sub.until((s) => s.state.length === 1, 10000);
  assert.deepEqual(snap.state, [{ type: 'log/added', cause: settlement.seq }]);
});

test('errors: refused settle rejects, fire-and-forget errors are emitted', async () => {
  const client = await connect();
  await assert.rejects(client.dispatchAndSettle('nobody/handles'), (e) => e instanceof NoHandlerError && e.code === 'no-handler' && !e.fatal);
  const emitted = new Promise((resolve) => client.once('error-frame', resolve));
  const id = client.dispatch('nobody/handles');
  const error = await emitted;
  assert.ok(error instanceof NoHandlerError);
  assert.equal(error.ref, id);
  assert.throws(() => client.dispatch('bad type'), TypeError);
  // dispatchAccepted (SPEC §8.3 ack): the refusal rejects the caller's promise ...
  await assert.rejects(client.dispatchAccepted('nobody/handles'), (e) => e instanceof NoHandlerError && e.code === 'no-handler');
});

test('dispatchAccepted resolves with the seq fluxd gave the action, before its settlement', async () => {
  await start(todoStore());
  const client = await connect();
  const first = await client.dispatchAccepted('todo/add', { title: 'a' });
  const second = await client.dispatchAccepted('todo/add', { title: 'b' });
  assert.equal(typeof first.seq, 'number');
  assert.equal(second.seq, first.seq + 1);
  assert.ok(first.id !== second.id);
  const settled = await client.dispatchAndSettle('todo/add', { title: 'c' });
  assert.equal(settled.seq, first.seq + 2);
});

test('queries drive a store; receipts withdraw them', async () => {
  const comments = new Store({ name: 'comments', handles: [], initialState: {} });
  comments.onQueries = (queries) => {
    comments.publish(Object.fromEntries(queries.map((q) => [String(q.query.site), [`comment on ${q.query.site}`]])));
  };
  await start(comments);
  const client = await connect();
  const sub = await client.subscribe('comments');
  await sub.next(10000);
  const receipt = await client.query('comments', { site: 7 });
  assert.deepEqual((await sub.until((s) => '7' in s.state, 10000)).state, { 7: ['comment on 7'] });
  await receipt.close();
  await sub.until((s) => Object.keys(s.state).length === 0, 10000);
  assert.deepEqual(comments.queries, []);
});

test('name-taken, store down and up', async () => {
  await start(todoStore());
  await assert.rejects(todoStore().start({ socketPath: fluxd.socketPath }), (e) => e instanceof NameTakenError);
  const client = await connect();
  const sub = await client.subscribe('todos');
  await sub.next(10000);
  const first = new Store({ name: 'other', handles: ['other/*'], initialState: 1 });
  await first.start({ socketPath: fluxd.socketPath });
  const watcher = await client.subscribe('other');
  await watcher.next(10000);
  await first.stop();
  await watcher.waitForStatus('down', { timeout: 10000 });
  assert.equal(watcher.events.at(-1).reason, 'disconnected');
  const again = new Store({ name: 'other', handles: ['other/*'], initialState: 99 });
  assert.deepEqual(await start(again), { resumed: true });
  assert.equal(again.state, 1);
});

test('with reconnect: false, the connection ending ends subscriptions and rejects calls', async () => {
  const client = await connect({ reconnect: false });
  const sub = await client.subscribe('todos');
  const ended = (async () => { const seen = []; for await (const s of sub) seen.push(s); return seen; })();
  await fluxd.stop();
  assert.deepEqual(await ended, []);
  await assert.rejects(client.ping(), (e) => e.code === 'disconnected');
});

test('a settlement that times out says what it still waits for: a store that is down, with its queue', async () => {
  const store = todoStore();
  await store.start({ socketPath: fluxd.socketPath });
  await store.stop();
  const client = await connect();
  await assert.rejects(client.dispatchAndSettle('todo/add', { title: 'x' }, { timeout: 300 }),
    (e) => e.name === 'TimeoutError' && e.message.includes('; still waiting for store "todos", which is down (1 action queued for it'));
});
