// SPEC §16 in the library, against a fake fluxd that speaks it (welcome.limits.deltaHistory): a store answers with
// done.patch + base and publishes with the patch op, and registers again after patch-failed; a client asks for
// deltas, applies them to the state it holds, resynchronises on a delta that does not fit, resumes with `from`
// after a reconnection, and makes path subscriptions (subtree frames, unsubscribe with path). Against a fluxd
// without §16 nothing of it is sent.
import { test, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { Client, Store } from '../fluxbus.mjs';
import { FakeFluxd, LIMITS } from './fakefluxd.mjs';

const cleanups = [];
afterEach(async () => { for (const c of cleanups.splice(0).reverse()) await c(); });
const later = (fn) => cleanups.push(fn);
const LIMITS16 = { ...LIMITS, deltaHistory: 1048576 };
async function fake(options = {}) { const f = await FakeFluxd.start({ limits: LIMITS16, epoch: 'e1', ...options }); later(() => f.close()); return f; }
async function connect(options) { const c = await Client.connect({ reconnect: { initialDelay: 5, maxDelay: 20 }, ...options }); later(() => c.close({ timeout: 500 })); return c; }
function next(emitter, event, timeout = 10000) { return once(emitter, event, { signal: AbortSignal.timeout(timeout) }); }

/** Answers a store's register with registered, the snapshot and queries. */
async function registerOn(peer, { version, seq = 0, state }) {
  const register = await peer.expectOp('register');
  peer.send({ op: 'registered', store: register.store, version, seq, resumed: version > 0 });
  if (state !== undefined) peer.send({ op: 'snapshot', store: register.store, version, seq, state });
  peer.send({ op: 'queries', store: register.store, queries: [] });
  return register;
}

const todos = () => ({ todos: [{ id: 1, title: 'a', done: false }, { id: 2, title: 'b', done: false }, { id: 3, title: 'c', done: false }] });

function todoStore(options = {}) {
  const store = new Store({ name: 'todos', handles: ['todo/*'], initialState: { todos: [] }, onError: () => {}, ...options });
  store.on('todo/toggle', (state, { id }) => { const t = state.todos.find((x) => x.id === id); t.done = !t.done; return state; });
  store.on('todo/same', (state) => state);
  store.on('todo/add', (state, { title }) => ({ ...state, todos: [...state.todos, { id: state.todos.length + 1, title, done: false }] }));
  return store;
}

test('a store answers with a patch from the version it adopted, base counting each patch; no change is a bare done', async () => {
  const f = await fake();
  const store = todoStore();
  const starting = store.start({ socketPath: f.socketPath }); later(() => store.stop({ timeout: 500 }));
  const peer = await f.accept();
  await registerOn(peer, { version: 7, seq: 4, state: todos() });
  await starting;
  peer.send({ op: 'action', store: 'todos', seq: 5, type: 'todo/toggle', origin: 1, payload: { id: 2 } });
  assert.deepEqual(await peer.expectOp('done'), { op: 'done', store: 'todos', seq: 5, base: 7, patch: [{ op: 'replace', path: '/todos/1/done', value: true }] });
  peer.send({ op: 'action', store: 'todos', seq: 6, type: 'todo/same', origin: 1, payload: null });
  assert.deepEqual(await peer.expectOp('done'), { op: 'done', store: 'todos', seq: 6 });
  peer.send({ op: 'action', store: 'todos', seq: 7, type: 'todo/add', origin: 1, payload: { title: 'd' } });
  assert.deepEqual(await peer.expectOp('done'), { op: 'done', store: 'todos', seq: 7, base: 8, patch: [{ op: 'add', path: '/todos/3', value: { id: 4, title: 'd', done: false } }] });
  assert.equal(store.version, 9);
  store.update((s) => { s.todos[0].title = 'A'; });
  assert.deepEqual(await peer.expectOp('patch'), { op: 'patch', store: 'todos', base: 9, patch: [{ op: 'replace', path: '/todos/0/title', value: 'A' }] });
  store.publish(store.state); // unchanged: nothing sent
  store.publish({ todos: [] });
  assert.deepEqual((await peer.expectOp('patch')).base, 10);
  assert.deepEqual(store.sent, { patches: 4, states: 0 });
  assert.equal(peer.messages.filter((m) => m.op === 'state' || m.state !== undefined).length, 0, 'no whole state was sent');
});

test('patch-failed: fluxd closes the connection; the store registers again, adopts the retained state and answers the action again', async () => {
  const f = await fake();
  const errors = [];
  const store = todoStore({ onError: (e) => errors.push(e) });
  const starting = store.start({ socketPath: f.socketPath, reconnect: { initialDelay: 5, maxDelay: 20 } }); later(() => store.stop({ timeout: 500 }));
  const first = await f.accept();
  await registerOn(first, { version: 3, state: todos() });
  await starting;
  first.send({ op: 'action', store: 'todos', seq: 1, type: 'todo/toggle', origin: 1, payload: { id: 1 } });
  assert.equal((await first.expectOp('done')).base, 3);
  first.send({ op: 'error', code: 'patch-failed', ref: 'todos', message: 'base 3 is not the retained version 4', fatal: true });
  first.socket.end();
  const second = await f.accept();
  const retained = todos(); retained.todos[2].done = true;
  await registerOn(second, { version: 4, state: retained });
  second.send({ op: 'action', store: 'todos', seq: 1, type: 'todo/toggle', origin: 1, redelivered: true, payload: { id: 1 } });
  assert.deepEqual(await second.expectOp('done'), { op: 'done', store: 'todos', seq: 1, base: 4, patch: [{ op: 'replace', path: '/todos/0/done', value: true }] });
  assert.equal(errors[0]?.code, 'patch-failed', 'the error went to the store log');
  assert.equal(store.state.todos[2].done, true, 'the retained state was adopted');
});

test('without §16 (no limits.deltaHistory) a store sends whole states and a client plain subscribes', async () => {
  const f = await fake({ limits: LIMITS });
  const store = todoStore();
  const starting = store.start({ socketPath: f.socketPath }); later(() => store.stop({ timeout: 500 }));
  const peer = await f.accept();
  await registerOn(peer, { version: 1, state: todos() });
  await starting;
  peer.send({ op: 'action', store: 'todos', seq: 1, type: 'todo/toggle', origin: 1, payload: { id: 1 } });
  const done = await peer.expectOp('done');
  assert.equal(done.patch, undefined); assert.equal(done.state.todos[0].done, true);
  const client = await connect({ socketPath: f.socketPath });
  const c = await f.accept();
  const subscribing = client.subscribe('todos');
  assert.deepEqual(await c.expectOp('subscribe'), { op: 'subscribe', store: 'todos' });
  c.send({ op: 'subscribed', store: 'todos', status: 'up', version: 2 });
  await subscribing;
  await assert.rejects(client.subscribe('todos', { path: '/todos/0' }), /no path subscriptions: they need fluxd 0.4.0/);
});

test('a client applies deltas to the state it holds; a delta that does not fit resubscribes, whole', async () => {
  const f = await fake();
  const client = await connect({ socketPath: f.socketPath });
  const peer = await f.accept();
  const subscribing = client.subscribe('todos');
  assert.deepEqual(await peer.expectOp('subscribe'), { op: 'subscribe', store: 'todos', deltas: true });
  peer.send({ op: 'subscribed', store: 'todos', status: 'up', version: 4, deltas: true });
  peer.send({ op: 'snapshot', store: 'todos', version: 4, seq: 9, state: todos() });
  const sub = await subscribing;
  const v4 = await sub.next(5000);
  peer.send({ op: 'delta', store: 'todos', from: 4, version: 5, seq: 10, patch: [{ op: 'replace', path: '/todos/1/done', value: true }] });
  const v5 = await sub.next(5000);
  assert.deepEqual([v5.version, v5.seq, v5.state.todos[1].done], [5, 10, true]);
  assert.equal(v4.state.todos[1].done, false, 'the earlier snapshot is not changed');
  assert.equal(v5.state.todos[0], v4.state.todos[0], 'untouched parts are shared');
  assert.deepEqual(client.held.get('todos').state, v5.state);
  // a delta from a version not held: the client subscribes again, without from, and takes the snapshot
  peer.send({ op: 'delta', store: 'todos', from: 7, version: 8, seq: 13, patch: [{ op: 'remove', path: '/todos/0' }] });
  assert.deepEqual(await peer.expectOp('subscribe'), { op: 'subscribe', store: 'todos', deltas: true });
  peer.send({ op: 'delta', store: 'todos', from: 8, version: 9, seq: 14, patch: [] }); // ignored: a snapshot is on its way
  peer.send({ op: 'subscribed', store: 'todos', status: 'up', version: 9, deltas: true });
  peer.send({ op: 'snapshot', store: 'todos', version: 9, seq: 14, state: { todos: [] } });
  const v9 = await sub.next(5000);
  assert.deepEqual([v9.version, v9.state], [9, { todos: [] }]);
  // a delta that does not apply resynchronises too
  peer.send({ op: 'delta', store: 'todos', from: 9, version: 10, seq: 15, patch: [{ op: 'remove', path: '/todos/0' }] });
  await peer.expectOp('subscribe');
  assert.deepEqual(client.deltaStats, { applied: 1, resyncs: 2 });
  assert.equal(client.pending.size, 0);
});

test('after a reconnection in the same epoch the client resumes with from = the version it holds; in a new epoch, whole', async () => {
  const f = await fake();
  const client = await connect({ socketPath: f.socketPath });
  const first = await f.accept();
  const subscribing = client.subscribe('todos');
  await first.expectOp('subscribe');
  first.send({ op: 'subscribed', store: 'todos', status: 'up', version: 4, deltas: true });
  first.send({ op: 'snapshot', store: 'todos', version: 4, seq: 9, state: todos() });
  const sub = await subscribing;
  await sub.next(5000);
  first.send({ op: 'delta', store: 'todos', from: 4, version: 5, seq: 10, patch: [{ op: 'replace', path: '/todos/0/done', value: true }] });
  await sub.next(5000);
  const back = next(client, 'reconnected');
  first.socket.destroy();
  const second = await f.accept();
  assert.deepEqual(await second.expectOp('subscribe'), { op: 'subscribe', store: 'todos', deltas: true, from: 5 });
  await back;
  second.send({ op: 'subscribed', store: 'todos', status: 'up', version: 6, deltas: true });
  second.send({ op: 'delta', store: 'todos', from: 5, version: 6, seq: 11, patch: [{ op: 'replace', path: '/todos/1/done', value: true }] });
  const v6 = await sub.next(5000);
  assert.deepEqual(v6.state.todos.map((t) => t.done), [true, true, false]);
  f.epoch = 'e2';
  const again = next(client, 'reconnected');
  second.socket.destroy();
  const third = await f.accept();
  assert.deepEqual(await third.expectOp('subscribe'), { op: 'subscribe', store: 'todos', deltas: true }, 'another epoch: versions start over');
  await again;
  assert.equal(client.held.size, 0);
});

test('path subscriptions: subscribe and unsubscribe with path, subtree frames as snapshots of the value there', async () => {
  const f = await fake();
  const client = await connect({ socketPath: f.socketPath });
  const peer = await f.accept();
  await assert.rejects(client.subscribe('todos', { path: 'todos' }), TypeError);
  const whole = client.subscribe('todos');
  await peer.expectOp('subscribe');
  peer.send({ op: 'subscribed', store: 'todos', status: 'up', version: 4, deltas: true });
  await whole;
  const subscribing = client.subscribe('todos', { path: '/todos/1' });
  assert.deepEqual(await peer.expectOp('subscribe'), { op: 'subscribe', store: 'todos', path: '/todos/1' });
  peer.send({ op: 'subscribed', store: 'todos', status: 'up', version: 4, path: '/todos/1' });
  peer.send({ op: 'subtree', store: 'todos', path: '/todos/1', version: 4, seq: 9, exists: true, value: { id: 2, title: 'b', done: false } });
  const sub = await subscribing;
  assert.equal(sub.path, '/todos/1');
  assert.deepEqual(await sub.next(5000), { store: 'todos', version: 4, seq: 9, path: '/todos/1', exists: true, state: { id: 2, title: 'b', done: false } });
  peer.send({ op: 'subtree', store: 'todos', path: '/todos/1', version: 6, seq: 11, exists: false });
  assert.deepEqual(await sub.next(5000), { store: 'todos', version: 6, seq: 11, path: '/todos/1', exists: false, state: undefined });
  peer.send({ op: 'store-down', store: 'todos', reason: 'disconnected' });
  await sub.waitForStatus('down', { timeout: 5000 });
  const closing = sub.close({ timeout: 5000 });
  assert.deepEqual(await peer.expectOp('unsubscribe'), { op: 'unsubscribe', store: 'todos', path: '/todos/1' });
  peer.send({ op: 'unsubscribed', store: 'todos', path: '/todos/1' });
  await closing;
  assert.equal(client.pathSubscriptions.size, 0);
  assert.equal(client.subscriptions.size, 1, 'the whole-store subscription is still there');
  // refused (e.g. limit-exceeded, ref = the store): the path subscribe waiting rejects
  const refused = client.subscribe('todos', { path: '/x' });
  await peer.expectOp('subscribe');
  peer.send({ op: 'error', code: 'limit-exceeded', ref: 'todos', message: 'too many subscriptions', fatal: false });
  await assert.rejects(refused, (e) => e.code === 'limit-exceeded');
  assert.equal(client.pending.size, 0);
});

test("handlerState 'shared': the handler gets the frozen state and returns a new one; writing to it is rejected", async () => {
  const f = await fake();
  const store = new Store({ name: 'todos', handles: ['todo/*'], initialState: { todos: [] }, handlerState: 'shared', onError: () => {} });
  store.on('todo/toggle', (state, { id }) => ({ ...state, todos: state.todos.map((t) => (t.id === id ? { ...t, done: !t.done } : t)) }));
  store.on('todo/mutate', (state) => { state.todos[0].done = true; return state; });
  const starting = store.start({ socketPath: f.socketPath }); later(() => store.stop({ timeout: 500 }));
  const peer = await f.accept();
  await registerOn(peer, { version: 2, state: todos() });
  await starting;
  assert.ok(Object.isFrozen(store.state.todos[0]));
  peer.send({ op: 'action', store: 'todos', seq: 1, type: 'todo/toggle', origin: 1, payload: { id: 3 } });
  assert.deepEqual((await peer.expectOp('done')).patch, [{ op: 'replace', path: '/todos/2/done', value: true }]);
  assert.ok(Object.isFrozen(store.state.todos[2]), 'the new parts are frozen too');
  peer.send({ op: 'action', store: 'todos', seq: 2, type: 'todo/mutate', origin: 1, payload: {} });
  const reject = await peer.expectOp('reject');
  assert.equal(reject.error.code, 'store/error', 'a write to the frozen state is a TypeError: a bug of the store');
});
