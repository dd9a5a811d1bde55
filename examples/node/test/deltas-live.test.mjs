// SPEC §16 against a real fluxd ($FLUXD; it must speak §16, fluxd 0.4.0: this test fails, saying so, if it does
// not announce limits.deltaHistory). One Node store publishing patches; a delta subscriber, a full-snapshot
// subscriber and a path subscriber (/todos/3) on it: after every settled action each holds a state equal to the
// store's state re-read with `get` (the path subscriber: the value at its path), and the path subscriber is sent
// nothing for changes elsewhere.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Client, Store, getPointer, jsonEqual } from '../fluxbus.mjs';
import { startFluxd } from './helpers.mjs';

let fluxd; let store; const clients = [];
before(async () => {
  fluxd = await startFluxd();
  store = new Store({ name: 'todos', handles: ['todo/*'], initialState: { todos: Array.from({ length: 50 }, (_, i) => ({ id: i, title: `todo ${i}`, done: false })) } });
  store.on('todo/toggle', (state, { id }) => { const t = state.todos.find((x) => x.id === id); t.done = !t.done; });
  store.on('todo/remove', (state, { id }) => { state.todos.splice(state.todos.findIndex((x) => x.id === id), 1); });
  store.on('todo/rename', (state, { at, title }) => { state.todos[at].title = title; });
  await store.start({ socketPath: fluxd.socketPath });
});
after(async () => {
  for (const c of clients) await c.close();
  await store?.stop();
  await fluxd?.stop();
});

async function connect(options) { const c = await Client.connect({ socketPath: fluxd.socketPath, ...options }); clients.push(c); return c; }
/** Every snapshot a subscription delivers, collected in the background. */
function collect(sub) { const seen = []; (async () => { for await (const s of sub) seen.push(s); })(); return seen; }

test('a delta, a full and a path subscriber see the state `get` reads at every version; the path one only when touched', async () => {
  const reader = await connect({ name: 'reader' });
  assert.notEqual(reader.welcome.limits.deltaHistory, undefined,
    `fluxd at ${process.env.FLUXD ?? '.build/debug/fluxd'} (${reader.welcome.server}) does not announce limits.deltaHistory: it does not speak SPEC §16 (set FLUXD to a fluxd 0.4.0)`);
  const deltaClient = await connect({ name: 'delta' });
  const fullClient = await connect({ name: 'full', deltas: false });
  const pathClient = await connect({ name: 'path' });
  const deltaSub = await deltaClient.subscribe('todos', { waitForSnapshot: true });
  const fullSub = await fullClient.subscribe('todos', { waitForSnapshot: true });
  const pathSub = await pathClient.subscribe('todos', { path: '/todos/3', waitForSnapshot: true });
  const pathSeen = collect(pathSub);
  const steps = [
    ['todo/toggle', { id: 3 }, true], ['todo/toggle', { id: 10 }, false], ['todo/rename', { at: 3, title: 'three' }, true],
    ['todo/toggle', { id: 40 }, false], ['todo/rename', { at: 30, title: 'thirty' }, false], ['todo/remove', { id: 2 }, true],
    ['todo/toggle', { id: 1 }, false], ['todo/toggle', { id: 4 }, true],
  ];
  for (const [type, payload, touchesPath] of steps) {
    const before = pathSeen.length;
    const settlement = (await deltaClient.dispatchAndSettle(type, payload)).check();
    await fullClient.ping(); await pathClient.ping(); // the frames for this version were sent before these replies
    const got = await reader.get('todos');
    assert.equal(got.version, settlement.results[0].version);
    assert.equal(deltaSub.latest.version, got.version, `${type}: the delta subscriber holds the version`);
    assert.ok(jsonEqual(deltaSub.latest.state, got.state), `${type}: the delta subscriber's state is the store's`);
    assert.equal(fullSub.latest.version, got.version);
    assert.ok(jsonEqual(fullSub.latest.state, got.state), `${type}: the full subscriber's state is the store's`);
    assert.ok(jsonEqual(store.state, got.state), `${type}: the store's own state is what fluxd retains`);
    assert.ok(jsonEqual(pathSub.latest.state, getPointer(got.state, '/todos/3')), `${type}: the path subscriber holds the value at /todos/3`);
    if (touchesPath) assert.equal(pathSub.latest.version, got.version, `${type} touches /todos/3`);
    else assert.equal(pathSeen.length, before, `${type} does not touch /todos/3: the path subscriber is sent nothing`);
  }
  assert.ok(deltaClient.deltaStats.applied >= steps.length, `the delta subscriber applied deltas (${JSON.stringify(deltaClient.deltaStats)})`);
  assert.equal(deltaClient.deltaStats.resyncs, 0);
  assert.equal(store.sent.states, 0, 'every change went as a patch');
});
