// Stores whose state is larger than one frame, and refused registrations (SPEC §16.6). The pieces: each fits in
// maxFrame, and applied in order to the empty root they make the state exactly (member order included). Against a
// real fluxd with --max-frame 65536 and a state of about 200 KB: the store registers without state and publishes it
// in pieces; after an ephemeral restart it does so again; after a durable restart it adopts the retained snapshot;
// subscribers see the whole state and the store answers actions afterwards. A refused registration (name-taken) is
// tried again with a growing wait: a few times in two seconds, counted by a monitor of a real fluxd and as
// connections to the fake fluxd. Every wait has a deadline; nothing waits for time to pass, except the two-second
// windows in which refusals are counted.
import { test, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import fs from 'node:fs';
import net from 'node:net';
import { isDeepStrictEqual } from 'node:util';
import { Client, Store, StateTooLargeError, NameTakenError, FrameDecoder, encodeFrame, canonicalJSON, applyPatch } from '../fluxbus.mjs';
import { splitState, refusalDelay, stateFrameLength, patchFrame, fits } from '../lib/pieces.mjs';
import { FakeFluxd } from './fakefluxd.mjs';
import { fluxdFeatures, startFluxd } from './helpers.mjs';

const MAX_FRAME = 65536;
const cleanups = [];
afterEach(async () => { for (const c of cleanups.splice(0).reverse()) await c(); });
const later = (fn) => cleanups.push(fn);

async function fake(options) { const f = await FakeFluxd.start(options); later(() => f.close()); return f; }
async function live(args = [], options = {}) { const d = await startFluxd(args, options); later(() => d.stop()); return d; }
async function connect(options) { const c = await Client.connect(options); later(() => c.close({ timeout: 500 })); return c; }
async function started(store, options) { const r = await store.start(options); later(() => store.stop({ timeout: 2000 })); return r; }

/** The next `event` of `emitter` (its arguments); rejects after `timeout` ms. Call before causing the event. */
function next(emitter, event, timeout = 20000) {
  return once(emitter, event, { signal: AbortSignal.timeout(timeout) }).catch((err) => {
    throw err.name === 'AbortError' ? new Error(`no '${event}' within ${timeout} ms`) : err;
  });
}

/** About 200 KB: many members, a member and an array element too large for one frame, keys to escape in a pointer. */
function bigState() {
  const items = {};
  for (let i = 0; i < 1000; i++) items[`item-${String(i).padStart(5, '0')}`] = { title: `todo ${i} ${'x'.repeat(150)}`, done: i % 3 === 0, n: i };
  return {
    items,
    log: Array.from({ length: 400 }, (_, i) => ({ at: i, what: 'y'.repeat(200) })),
    nested: [[{ deep: 'z'.repeat(40000) }, { deeper: ['w'.repeat(30000), 'v'.repeat(30000)] }], 7, null],
    'a/b~c': { 'é ünïcode': 'ß'.repeat(10), '': 1.5 },
    count: 0,
  };
}

function rebuild(pieces) {
  let state = JSON.parse(pieces.root);
  for (const patch of pieces.patches) state = applyPatch(state, JSON.parse(patch));
  return state;
}

// -- the pieces ---------------------------------------------------------------------------------------------

test('pieces: each fits in maxFrame and, applied to the empty root, they make the state exactly', () => {
  const state = bigState();
  for (const maxFrame of [MAX_FRAME, 45000, 1048576]) {
    const pieces = splitState(state, 'todos', maxFrame);
    assert.equal(pieces.root, '{}');
    assert.ok(pieces.patches.length >= (maxFrame > 300000 ? 1 : 4), `${pieces.patches.length} patches at ${maxFrame}`);
    assert.ok(stateFrameLength('todos', pieces.root) <= maxFrame);
    for (const patch of pieces.patches) {
      assert.ok(Buffer.byteLength(patchFrame('todos', patch, 2 ** 53 - 1)) <= maxFrame);
      assert.ok(JSON.parse(patch).every((op) => op.op === 'add'));
    }
    const rebuilt = rebuild(pieces);
    assert.deepEqual(rebuilt, state);
    assert.equal(JSON.stringify(rebuilt), canonicalJSON(state), 'members in the order a whole state is written');
    assert.deepEqual(pieces.stateAfter(pieces.patches.length), state);
    assert.deepEqual(pieces.stateAfter(0), {});
  }
});

test('pieces: a member and an element too large for one frame are added empty, then filled in order', () => {
  const state = { big: Array.from({ length: 10 }, () => 's'.repeat(3000)), list: [{ k: 't'.repeat(3000), j: 'u'.repeat(3000) }, 1] };
  const pieces = splitState(state, 's', 4096);
  const ops = pieces.patches.flatMap((p) => JSON.parse(p));
  const paths = ops.map((op) => `${op.path}${typeof op.value === 'object' && op.value !== null && !Object.keys(op.value).length ? ` ${JSON.stringify(op.value)}` : ''}`);
  assert.deepEqual(paths.slice(0, 2), ['/big []', '/big/-']);
  assert.ok(paths.includes('/list/- {}'));
  assert.ok(paths.indexOf('/list/0/j') < paths.indexOf('/list/0/k'), 'member order kept');
  assert.deepEqual(rebuild(pieces), state);
});

test('pieces: an array root is appended to; what cannot be cut is a StateTooLargeError', () => {
  const list = Array.from({ length: 50 }, (_, n) => ({ n, pad: 'p'.repeat(500) }));
  const pieces = splitState(list, 'list', 4096);
  assert.equal(pieces.root, '[]');
  assert.deepEqual([...new Set(pieces.patches.flatMap((p) => JSON.parse(p).map((op) => op.path)))], ['/-']);
  assert.deepEqual(rebuild(pieces), list);
  assert.throws(() => splitState('x'.repeat(10000), 's', 4096), (e) => e instanceof StateTooLargeError && e.code === 'state-too-large' && /single string/.test(e.message));
  assert.throws(() => splitState({ a: ['x'.repeat(10000)] }, 's', 4096), (e) => e instanceof StateTooLargeError && e.path === '/a/0' && e.ref === 's');
  assert.ok(fits(10, 10) && !fits(11, 10) && fits(1e9, undefined));
});

test('the wait after a refusal: 100 ms doubling up to 30 s, between half of that and all of it', () => {
  for (let n = 1; n <= 15; n++) {
    const ceiling = Math.min(30000, 100 * 2 ** (n - 1));
    assert.equal(refusalDelay(n, () => 0), ceiling / 2);
    assert.ok(Math.abs(refusalDelay(n, () => 0.999999) - ceiling) < 0.1);
  }
  assert.equal(refusalDelay(1e6, () => 0.5), 22500);
});

// -- against a real fluxd -----------------------------------------------------------------------------------

function bigStore(initialState = bigState()) {
  const store = new Store({ name: 'big', handles: ['big/*'], initialState, onError: () => {} });
  store.on('big/count', (state, { by }) => { state.count += by; });
  return store;
}

test('live (ephemeral, --max-frame 65536): a 200 KB state is published in pieces, again after a restart', async () => {
  const fluxd = await live(['--max-frame', String(MAX_FRAME)]);
  const store = bigStore();
  assert.ok(canonicalJSON(store.initialState).length > 3 * MAX_FRAME);
  await started(store, { socketPath: fluxd.socketPath, reconnect: { initialDelay: 20, maxDelay: 200 } });
  assert.ok(store.sent.patches > 3 && store.sent.states === 1 && store.version === 1 + store.sent.patches);
  const viewer = await connect({ socketPath: fluxd.socketPath, name: 'viewer' });
  const whole = await connect({ socketPath: fluxd.socketPath, name: 'whole', deltas: false });
  const deltas = await viewer.subscribe('big', { timeout: 10000, waitForSnapshot: true });
  const full = await whole.subscribe('big', { timeout: 10000, waitForSnapshot: true });
  for (const sub of [deltas, full]) {
    const snap = await sub.until((s) => s.version === store.version, 10000);
    assert.deepEqual(snap.state, store.initialState);
    assert.equal(JSON.stringify(snap.state), canonicalJSON(store.initialState));
  }

  const again = next(store.client, 'store-registered');
  const before = { ...store.sent };
  await fluxd.restart(); // ephemeral: the new fluxd retains nothing, and register cannot carry the state
  const [, info] = await again;
  assert.equal(info.resumed, false);
  assert.equal(store.sent.states, before.states + 1);
  assert.ok(store.sent.patches >= 2 * before.patches && store.version === 1 + store.sent.patches - before.patches);
  for (const sub of [deltas, full]) {
    const snap = await sub.until((s) => s.version === store.version, 20000);
    assert.deepEqual(snap.state, store.initialState);
  }
  const settlement = await viewer.dispatchAndSettle('big/count', { by: 3 }, { timeout: 10000 });
  assert.equal(settlement.results[0].status, 'done');
  assert.equal((await deltas.until((s) => s.state.count === 3, 10000)).version, store.version);
  assert.equal(store.refusals, 0);
});

test('live (durable, --max-frame 65536): after a restart the store registers without its state and adopts it', { skip: !fluxdFeatures().dataDir }, async () => {
  const fluxd = await live(['--max-frame', String(MAX_FRAME)], { durable: true });
  const store = bigStore();
  await started(store, { socketPath: fluxd.socketPath, reconnect: { initialDelay: 20, maxDelay: 200 } });
  const version = store.version;
  assert.ok(store.sent.patches > 3 && version === 1 + store.sent.patches, 'published in pieces the first time');
  const viewer = await connect({ socketPath: fluxd.socketPath, name: 'viewer', deltas: false });
  const sub = await viewer.subscribe('big', { timeout: 10000, waitForSnapshot: true });
  const first = await sub.until((s) => s.version === version, 10000);
  assert.deepEqual(first.state, store.initialState);

  const again = next(store.client, 'store-registered');
  const before = { ...store.sent };
  await fluxd.restart();
  const [, info] = await again;
  assert.deepEqual(info, { resumed: true, version, seq: 0 });
  assert.deepEqual(store.sent, before, 'nothing published: the retained snapshot was adopted');
  assert.deepEqual(store.state, store.initialState);
  assert.deepEqual((await viewer.get('big', { timeout: 10000 })).state, store.initialState);
  const settlement = await viewer.dispatchAndSettle('big/count', { by: 5 }, { timeout: 10000 });
  assert.deepEqual(settlement.results[0], { store: 'big', status: 'done', version: version + 1 });
  assert.equal((await sub.until((s) => s.version === version + 1, 10000)).state.count, 5);
  assert.equal(store.refusals, 0);
});

test('live: a state that cannot be published fails start() with StateTooLargeError', async () => {
  const fluxd = await live(['--max-frame', String(MAX_FRAME)]);
  const store = new Store({ name: 'text', initialState: 't'.repeat(MAX_FRAME + 1), onError: () => {} });
  await assert.rejects(store.start({ socketPath: fluxd.socketPath }), (e) => e instanceof StateTooLargeError && /single string/.test(e.message));
});

/** A raw `monitor` connection: fluxd's events, with the time each arrived. */
async function monitor(socketPath) {
  const socket = net.connect(socketPath);
  await once(socket, 'connect');
  const events = []; const waiters = [];
  const decoder = new FrameDecoder();
  socket.on('data', (d) => {
    for (const e of decoder.feed(d)) {
      if (!('frame' in e)) continue;
      const msg = JSON.parse(e.frame.toString('utf8'));
      if (msg.op === 'event') { events.push({ at: performance.now(), msg }); for (const w of waiters.splice(0)) w(); }
    }
  });
  socket.on('error', () => {});
  socket.write(encodeFrame(JSON.stringify({ op: 'hello', protocol: 1, role: 'monitor', name: 'watch' })));
  later(() => socket.destroy());
  let read = 0;
  /** The next event satisfying `predicate` before `deadline` (performance.now() ms), or undefined. */
  async function nextEvent(predicate, deadline) {
    for (;;) {
      while (read < events.length) { const e = events[read++]; if (predicate(e.msg)) return e; }
      const remaining = deadline - performance.now();
      if (remaining <= 0) return undefined;
      await new Promise((resolve) => { const t = setTimeout(resolve, remaining); waiters.push(() => { clearTimeout(t); resolve(); }); });
    }
  }
  return { nextEvent };
}

test('live: a refused registration (name-taken) is tried again with a growing wait, then succeeds once the name is free', async () => {
  const fluxd = await live();
  const alias = `${fluxd.socketPath}.alias`; // the same socket under a second name
  fs.linkSync(fluxd.socketPath, alias);
  later(() => fs.rmSync(alias, { force: true }));
  const refusals = [];
  const store = new Store({ name: 'big', handles: ['big/*'], initialState: { count: 0 }, onError: (e, c) => { if (c.retryIn !== undefined) refusals.push([e.code, c.refusals, c.retryIn]); } });
  await started(store, { socketPath: fluxd.socketPath, reconnect: { initialDelay: 20, maxDelay: 200 } });
  const watch = await monitor(alias);
  fs.unlinkSync(fluxd.socketPath); // the store cannot reconnect until the name is back
  const lost = next(store.client, 'disconnected');
  store.client.socket.destroy();
  await lost;
  const rival = await connect({ socketPath: alias, name: 'rival', role: 'store', reconnect: false });
  const deadline = performance.now() + 10000;
  for (;;) { // fluxd takes the lost connection's store down, then the name is free
    const seen = rival.errors.length;
    rival.send({ op: 'register', store: 'big', handles: [] });
    await rival.ping({ timeout: 5000 }); // the answer to register comes before the pong (SPEC §2)
    if (!rival.errors.slice(seen).some((e) => e instanceof NameTakenError)) break;
    assert.ok(performance.now() < deadline, 'fluxd never freed the name');
  }
  fs.linkSync(alias, fluxd.socketPath);

  const refused = (m) => m.kind === 'error' && m.code === 'name-taken';
  const first = await watch.nextEvent(refused, performance.now() + 20000);
  assert.ok(first, 'the store did not register again');
  let count = 1;
  while (await watch.nextEvent(refused, first.at + 2000)) count++;
  assert.ok(count >= 2 && count <= 7, `${count} registrations refused in 2 s`);
  assert.ok(store.refusals >= count && refusals.length >= count);
  assert.deepEqual(refusals.slice(0, 3).map(([code, n]) => [code, n]), [['name-taken', 1], ['name-taken', 2], ['name-taken', 3]]);
  assert.ok(refusals[1][2] >= 100 && refusals[1][2] <= 200, `the second wait: ${refusals[1][2]} ms`);

  const back = next(store.client, 'store-registered', 40000);
  await rival.close(); // the name is free: the next try succeeds and the count starts over
  await back;
  assert.equal(store.refusals, 0);
});

// -- scripted with the fake fluxd ---------------------------------------------------------------------------

const SMALL_LIMITS = { maxFrame: 2048, storeWindow: 64, queueLimit: 1024, queueTimeout: 5000, handshakeTimeout: 5000, maxPending: 65536, deltaHistory: 1048576 };
const smallState = () => Object.fromEntries(Array.from({ length: 60 }, (_, i) => [`k${String(i).padStart(3, '0')}`, 'v'.repeat(100)]));

function smallStore(initialState = smallState()) {
  const store = new Store({ name: 's', handles: ['s/*'], initialState, onError: () => {} });
  store.on('s/touch', (state, _payload, ctx) => ({ ...state, touched: ctx.seq }));
  return store;
}

function registered(peer, version, state, { seq = 0, resumed = false } = {}) {
  peer.send({ op: 'registered', store: 's', version, seq, resumed });
  if (version) peer.send({ op: 'snapshot', store: 's', version, seq, state });
  peer.send({ op: 'queries', store: 's', queries: [] });
}

test('fake: no action is answered before every piece is sent', async () => {
  const f = await fake({ epoch: 'e1', limits: SMALL_LIMITS });
  const store = smallStore();
  const starting = started(store, { socketPath: f.socketPath });
  const peer = await f.accept();
  const register = await peer.expectOp('register');
  assert.equal(register.state, undefined, '6 KB does not fit in 2048');
  registered(peer, 0);
  peer.send({ op: 'action', store: 's', seq: 1, type: 's/touch', origin: 2, payload: null });
  await starting;
  const sent = [];
  while (!sent.length || sent.at(-1).op !== 'done') sent.push(await peer.expect((m) => ['state', 'patch', 'ping', 'done'].includes(m.op)));
  assert.deepEqual(sent[0], { op: 'state', store: 's', state: {} });
  const patches = sent.filter((m) => m.op === 'patch');
  assert.ok(patches.length >= 3);
  assert.deepEqual(patches.map((m) => m.base), patches.map((_, i) => i + 1));
  assert.equal(sent.findIndex((m) => m.op === 'done'), sent.length - 1, 'the answer comes after every piece');
  let state = {};
  for (const m of patches) state = applyPatch(state, m.patch);
  assert.deepEqual(state, store.initialState);
  assert.deepEqual(sent.at(-1), { op: 'done', store: 's', seq: 1, patch: [{ op: 'add', path: '/touched', value: 1 }], base: patches.length + 1 });
});

test('fake: a publication cut short goes on from the last piece fluxd took', async () => {
  const f = await fake({ epoch: 'e1', limits: SMALL_LIMITS });
  const store = smallStore();
  const starting = started(store, { socketPath: f.socketPath, reconnect: { initialDelay: 5, maxDelay: 20 } });
  const peer = await f.accept();
  await peer.expectOp('register');
  f.autoPong = false; // the barrier after the pieces gets no answer on this connection
  registered(peer, 0);
  await starting;
  assert.deepEqual((await peer.expectOp('state')).state, {});
  const first = await peer.expectOp('patch');
  await peer.expectOp('ping');
  assert.ok(isDeepStrictEqual(store.state, store.initialState));
  f.autoPong = true;
  peer.socket.destroy(); // fluxd took the root and the first patch only: version 2
  const again = await f.accept();
  await again.expectOp('register');
  const partial = applyPatch({}, first.patch);
  registered(again, 2, partial, { resumed: true });
  const rest = [];
  for (;;) { const m = await again.expect((x) => ['state', 'patch', 'ping'].includes(x.op)); if (m.op === 'ping') break; rest.push(m); }
  assert.ok(rest.length && rest.every((m) => m.op === 'patch'));
  assert.equal(rest[0].base, 2);
  let state = partial;
  for (const m of rest) state = applyPatch(state, m.patch);
  assert.deepEqual(state, store.initialState);
  assert.equal(store.version, 2 + rest.length);
  assert.deepEqual(store.state, store.initialState);
});

test('fake: refused registrations (name-taken, too-large) back off: a few connections in 2 s', async () => {
  const f = await fake({ epoch: 'e1' });
  const store = smallStore({ small: true });
  const starting = started(store, { socketPath: f.socketPath, reconnect: { initialDelay: 10, maxDelay: 50 } });
  const peer = await f.accept();
  await peer.expectOp('register');
  registered(peer, 1, { small: true });
  await starting;
  peer.socket.destroy();
  const end = performance.now() + 2000;
  let attempts = 0;
  for (;;) {
    let again;
    try { again = await f.accept(Math.max(1, end - performance.now())); } catch { break; }
    if (performance.now() > end) break;
    attempts++;
    await again.expectOp('register');
    if (attempts % 2) again.send({ op: 'error', code: 'name-taken', message: 's is registered', ref: 's', fatal: false });
    else { again.send({ op: 'error', code: 'too-large', message: 'frame too large', fatal: true }); again.socket.end(); }
  }
  assert.ok(attempts >= 2 && attempts <= 7, `${attempts} registrations in 2 s`);
  assert.ok(store.refusals >= attempts - 1);
});
