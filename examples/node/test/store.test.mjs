// Strict store defaults against a real fluxd: an action the store's patterns match but no handler takes is
// rejected with store/unhandled-action naming the type and the handled types (unless the store opted into
// 'ignore'); rejections are worded for the person who dispatched; an explicit Reject passes through unchanged;
// the developer's details go to onError.
import { test, beforeEach, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { Client, Reject, Store, StoreRejectedError, StoreErrorCodes } from '../fluxbus.mjs';
import { startFluxd } from './helpers.mjs';

let fluxd; let client; const cleanups = [];
beforeEach(async () => { fluxd = await startFluxd(); client = await Client.connect({ socketPath: fluxd.socketPath }); });
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
  await client.close();
  await fluxd.stop();
});

async function start(store) { await store.start({ socketPath: fluxd.socketPath }); cleanups.push(() => store.stop()); return store; }

function todoStore(options = {}) {
  const logged = [];
  const store = new Store({ name: 'todos', handles: ['todo/*'], initialState: { items: [] }, onError: (error, context) => logged.push({ error, context }), ...options });
  store.on('todo/add', (state, payload) => {
    if (payload === 'reject') throw new Reject('todo/empty-title', 'a todo needs a title', { field: 'title' });
    state.items.push(payload.title); // a null payload is a TypeError: the store's bug, worded as such
    return state;
  });
  store.on('todo/toggle', (state) => state);
  store.on('todo/crash', () => { throw new Error('the list is locked'); });
  store.on('todo/throw-string', () => { throw 'plain text'; }); // eslint-disable-line no-throw-literal
  store.on('todo/not-json', () => ({ value: NaN }));
  store.on('todo/upper', (state, payload) => { state.items.push(payload.title.toUpperCase()); return state; });
  store.on('todo/typed', (state, { title }) => ({ items: [...state.items, title] }), { payload: { title: 'string', done: 'boolean?', at: 'integer?' } });
  store.on('todo/step', (state) => state, { payload: (p) => (p?.by > 0 ? undefined : 'by must be a positive number') });
  store.logged = logged;
  return store;
}

const rejection = async (type, payload = null) => {
  const settlement = await client.dispatchAndSettle(type, payload);
  assert.equal(settlement.ok, false);
  assert.equal(settlement.results[0].status, 'rejected');
  return settlement.results[0].error;
};

test('an action without a handler is rejected, naming the type and the handled types', async () => {
  await start(todoStore());
  const settlement = await client.dispatchAndSettle('todo/frobnicate', { x: 1 });
  assert.deepEqual(settlement.results, [{ store: 'todos', status: 'rejected', error: {
    code: 'store/unhandled-action',
    message: "no handler for 'todo/frobnicate'; this store handles: todo/add, todo/toggle, todo/crash, todo/throw-string, todo/not-json, todo/upper, todo/typed, todo/step",
  } }]);
  assert.equal(StoreErrorCodes.UNHANDLED_ACTION, 'store/unhandled-action');
  assert.throws(() => settlement.check(), (e) => e instanceof StoreRejectedError && e.code === 'store/unhandled-action'
    && e.store === 'todos' && e.type === 'todo/frobnicate' && e.detail.startsWith("no handler for 'todo/frobnicate'"));
  assert.deepEqual((await client.get('todos')).version, 1, 'the state did not change');
});

test('counter/ad under counter/* is a rejection, not a silent success', async () => {
  const counter = new Store({ name: 'counter', handles: ['counter/*'], initialState: { value: 0 } });
  counter.on('counter/add', (state, { by }) => ({ value: state.value + by }));
  await start(counter);
  assert.deepEqual(await rejection('counter/ad', { by: 1 }),
    { code: 'store/unhandled-action', message: "no handler for 'counter/ad'; this store handles: counter/add" });
  const empty = new Store({ name: 'empty', handles: ['empty/*'], initialState: 0 });
  await start(empty);
  assert.equal((await rejection('empty/x')).message, "no handler for 'empty/x'; this store has no action handlers");
});

test("unhandled: 'ignore' answers done without change", async () => {
  await start(todoStore({ unhandled: 'ignore' }));
  const settlement = await client.dispatchAndSettle('todo/frobnicate');
  assert.deepEqual(settlement.results, [{ store: 'todos', status: 'done', version: 1 }]);
  assert.equal(settlement.check(), settlement);
  assert.throws(() => new Store({ name: 'x', unhandled: 'skip' }), (e) => e instanceof TypeError && /'reject'.*'ignore'/.test(e.message));
});

test('rejections are worded for the dispatcher; Reject passes through unchanged; details go to onError', async () => {
  const store = await start(todoStore());
  assert.deepEqual(await rejection('todo/add', 'reject'), { code: 'todo/empty-title', message: 'a todo needs a title', field: 'title' });
  assert.deepEqual(await rejection('todo/crash'), { code: 'store/error', message: 'todo/crash failed: the list is locked' });
  assert.deepEqual(await rejection('todo/throw-string'), { code: 'store/error', message: 'todo/throw-string failed: plain text' });
  assert.deepEqual(await rejection('todo/upper', { name: 'milk' }),
    { code: 'store/error', message: "todo/upper failed: store 'todos' hit an internal error (TypeError); its log has the details" });
  assert.deepEqual(await rejection('todo/add', null), { code: 'store/bad-payload', message: 'todo/add failed: the action has no payload' });
  assert.deepEqual(await rejection('todo/not-json'), { code: 'store/error', message: "todo/not-json failed: the handler returned a state that is not JSON; the store's log has the details" });
  assert.deepEqual(store.logged.map((l) => [l.context, typeof l.error === 'string' ? 'string' : l.error.constructor.name]), [
    [{ store: 'todos', type: 'todo/crash', seq: 2 }, 'Error'],
    [{ store: 'todos', type: 'todo/throw-string', seq: 3 }, 'string'],
    [{ store: 'todos', type: 'todo/upper', seq: 4 }, 'TypeError'],
    [{ store: 'todos', type: 'todo/add', seq: 5 }, 'TypeError'],
    [{ store: 'todos', type: 'todo/not-json', seq: 6 }, 'TypeError'],
  ]);
  assert.match(store.logged[2].error.message, /toUpperCase/); // the developer sees the runtime's text
  const ok = await client.dispatchAndSettle('todo/add', { title: 'milk' });
  assert.deepEqual(ok.results, [{ store: 'todos', status: 'done', version: 2 }], 'the store goes on after failures');
  assert.throws(() => store.on('bad pattern', () => {}), TypeError);
});

test('a payload check rejects with store/bad-payload naming the field and what was expected', async () => {
  const store = await start(todoStore());
  const bad = (message, field) => ({ code: 'store/bad-payload', message, ...(field ? { field } : {}) });
  assert.deepEqual(await rejection('todo/typed', { name: 'milk' }), bad("todo/typed failed: payload is missing field 'title'", 'title'));
  assert.deepEqual(await rejection('todo/typed', { title: 7 }), bad("todo/typed failed: payload field 'title' must be a string, not an integer", 'title'));
  assert.deepEqual(await rejection('todo/typed', { title: 'x', done: 'yes' }), bad("todo/typed failed: payload field 'done' must be a boolean, not a string", 'done'));
  assert.deepEqual(await rejection('todo/typed', { title: 'x', at: 1.5 }), bad("todo/typed failed: payload field 'at' must be an integer, not a number", 'at'));
  assert.deepEqual(await rejection('todo/typed', null), bad('todo/typed failed: the action has no payload'));
  assert.deepEqual(await rejection('todo/typed', ['milk']), bad('todo/typed failed: the payload must be an object, not an array'));
  assert.deepEqual(await rejection('todo/step', { by: 0 }), bad('todo/step failed: by must be a positive number'));
  assert.deepEqual((await client.dispatchAndSettle('todo/typed', { title: 'milk', done: false })).results, [{ store: 'todos', status: 'done', version: 2 }]);
  assert.deepEqual((await client.dispatchAndSettle('todo/step', { by: 2 })).results[0].status, 'done');
  assert.deepEqual(store.logged, [], 'a bad payload is the dispatcher\'s mistake, not the store\'s: nothing logged');
  assert.equal(StoreErrorCodes.BAD_PAYLOAD, 'store/bad-payload');
  assert.throws(() => store.on('todo/x', () => {}, { payload: { title: 'text' } }), (e) => e instanceof TypeError && /string, number, integer/.test(e.message));
});
