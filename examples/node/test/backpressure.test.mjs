// Writes respect backpressure: against a fake fluxd that stops reading, what the client holds stays bounded
// (its own queue by maxWriteQueue, Node's socket buffer by its high-water mark plus one frame), fire-and-forget
// sends past the bound throw WriteQueueFullError, an awaited call's deadline covers waiting for room (an unsent
// request is taken back), and everything sent arrives in order once the peer reads again.
import { test, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { Client, TimeoutError, WriteQueueFullError } from '../fluxbus.mjs';
import { FakeFluxd } from './fakefluxd.mjs';

const cleanups = [];
afterEach(async () => { for (const c of cleanups.splice(0).reverse()) await c(); });
const later = (fn) => cleanups.push(fn);
async function fake(options) { const f = await FakeFluxd.start(options); later(() => f.close()); return f; }
async function connect(options) { const c = await Client.connect(options); later(() => c.close({ timeout: 500 })); return c; }

const LIMIT = 256 * 1024;
const PAD = 'x'.repeat(8 * 1024);
const FRAME = 8 * 1024 + 100; // a dispatch with PAD, roughly

/** Node's buffer for the socket never holds more than its high-water mark plus the write that crossed it. */
function assertSocketBounded(client) {
  assert.ok(client.socket.writableLength <= client.socket.writableHighWaterMark + FRAME,
    `socket buffer ${client.socket.writableLength} > ${client.socket.writableHighWaterMark} + one frame`);
  assert.ok(client.writer.queuedBytes <= LIMIT, `write queue ${client.writer.queuedBytes} > ${LIMIT}`);
}

/** Reads `n` dispatches at the peer and checks they are `expected`, in order. */
async function expectInOrder(peer, expected) {
  for (const i of expected) {
    const msg = await peer.expectOp('dispatch', 20000);
    assert.equal(msg.payload.i, i, `dispatch ${i} arrives in order`);
  }
}

test('fire-and-forget burst: the queue is bounded, the send past it throws, the rest arrives in order', async () => {
  const f = await fake();
  const client = await connect({ socketPath: f.socketPath, maxWriteQueue: LIMIT, heartbeat: false });
  const peer = await f.accept();
  peer.socket.pause(); // the peer stops reading: the kernel's buffer fills, then Node's, then the library's queue
  const blocked = once(client, 'backpressure');
  const sent = [];
  let full;
  for (let i = 0; i < 100000 && !full; i++) {
    try { client.dispatch('burst/item', { i, pad: PAD }); sent.push(i); } catch (err) { full = err; }
    assertSocketBounded(client);
  }
  await blocked;
  assert.ok(full instanceof WriteQueueFullError, `a send past the bound throws (got ${full})`);
  assert.equal(full.code, 'write-queue-full');
  assert.match(full.message, /await client\.flush\(\)/);
  assert.ok(client.backpressured);
  assert.ok(client.writer.highWater <= LIMIT && client.writer.highWater > LIMIT - 2 * FRAME, `high water ${client.writer.highWater}`);
  assert.ok(sent.length < 1000, `${sent.length} frames accepted before the queue was full`);
  const flushed = client.flush();
  peer.socket.resume();
  await expectInOrder(peer, sent);
  await flushed;
  assert.equal(client.backpressured, false);
  assert.equal(client.writer.queuedBytes, 0);
  client.dispatch('burst/item', { i: -1 }); // room again
  await expectInOrder(peer, [-1]);
});

test('a burst that awaits flush() when backpressured stays within one frame of queue and completes in order', async () => {
  const f = await fake();
  const client = await connect({ socketPath: f.socketPath, maxWriteQueue: LIMIT, heartbeat: false });
  const peer = await f.accept();
  peer.socket.pause();
  const N = 3000; // ~25 MB: far more than the kernel, Node and the queue hold together
  let done = 0;
  const blocked = once(client, 'backpressure'); // emitted from inside the burst's first, synchronous stretch
  const burst = (async () => {
    for (let i = 0; i < N; i++) {
      client.dispatch('burst/item', { i, pad: PAD });
      assertSocketBounded(client);
      if (client.backpressured) await client.flush();
      done = i + 1;
    }
  })();
  await blocked;
  assert.ok(done < N, 'the burst waits for the peer');
  assert.ok(client.writer.queuedBytes <= FRAME, `queued ${client.writer.queuedBytes}`);
  const drained = once(client, 'drain');
  peer.socket.resume();
  await expectInOrder(peer, [...Array(N).keys()]);
  await burst;
  await drained;
  assert.equal(done, N);
  assert.ok(client.writer.highWater <= FRAME, `high water ${client.writer.highWater}`);
});

test('awaited calls wait for room in order; a deadline that passes while queued takes the request back', async () => {
  const f = await fake();
  const client = await connect({ socketPath: f.socketPath, maxWriteQueue: LIMIT, heartbeat: false });
  const peer = await f.accept();
  peer.socket.pause();
  const sent = [];
  for (let i = 0; ; i++) { // fill everything up to the bound
    try { client.dispatch('burst/item', { i, pad: PAD }); sent.push(i); } catch (err) { assert.ok(err instanceof WriteQueueFullError); break; }
  }
  const before = client.pending.size;
  const settles = [0, 1, 2].map((k) => client.dispatchAndSettle('burst/settle', { k, pad: PAD }, { timeout: 20000 }));
  const doomed = client.dispatchAndSettle('burst/doomed', { pad: PAD }, { timeout: 50 });
  await assert.rejects(doomed, (e) => e instanceof TimeoutError && /never sent/.test(e.message) && e.timeoutMs === 50);
  assert.equal(client.pending.size, before + 3, 'the timed-out call left the pending map');
  assert.equal(client.pending.owed, 0, 'no reply is owed to a request that was never sent');
  peer.socket.resume();
  await expectInOrder(peer, sent);
  for (let k = 0; k < 3; k++) {
    const msg = await peer.expectOp('dispatch', 20000);
    assert.equal(msg.type, 'burst/settle');
    assert.equal(msg.payload.k, k, 'awaited calls keep their order');
    peer.send({ op: 'settled', id: msg.id, seq: 100 + k, results: [{ store: 'burst', status: 'done', version: k + 1 }] });
  }
  const settlements = await Promise.all(settles);
  assert.deepEqual(settlements.map((s) => s.seq), [100, 101, 102]);
  assert.equal(client.pending.size, before);
  // the doomed request never reached the socket: the next frame after the settles is this ping's
  const ping = client.ping({ timeout: 5000 });
  const next = await peer.expect(() => true, 5000, 'the next frame');
  assert.equal(next.op, 'ping');
  await ping;
});
