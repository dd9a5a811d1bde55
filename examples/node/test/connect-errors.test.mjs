// Connect errors name the path tried, where it came from and what to do (as fluxctl's do), as NoFluxdError, a
// ConnectionError: no such socket, a socket nobody listens on, a directory, a plain file; from the socketPath
// option, $FLUXBUS_SOCKET or $XDG_RUNTIME_DIR. Never a raw ENOENT or an unhandled 'error' event.
import { test, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Client, ConnectionError, FluxError, NoFluxdError, Store } from '../fluxbus.mjs';
import { startFluxd } from './helpers.mjs';

const cleanups = [];
afterEach(async () => { for (const c of cleanups.splice(0).reverse()) await c(); });
function tempDir() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxnode-connect-'));
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}
function withEnv(vars, fn) {
  const saved = Object.fromEntries(Object.keys(vars).map((k) => [k, process.env[k]]));
  for (const [k, v] of Object.entries(vars)) if (v === undefined) delete process.env[k]; else process.env[k] = v;
  return Promise.resolve().then(fn).finally(() => {
    for (const [k, v] of Object.entries(saved)) if (v === undefined) delete process.env[k]; else process.env[k] = v;
  });
}
const advice = (start) => `  start one with:  fluxd --socket ${start}\n`
  + '  or point the client at a running one with { socketPath: PATH } or FLUXBUS_SOCKET=PATH';

/** Rejects with NoFluxdError carrying exactly this message. */
async function refused(promise, { socketPath, source, reason, errno, start = socketPath }) {
  await assert.rejects(promise, (e) => {
    assert.ok(e instanceof NoFluxdError && e instanceof ConnectionError && e instanceof FluxError, `${e?.constructor?.name}: ${e?.message}`);
    assert.equal(e.message, `no fluxd at ${socketPath} (from ${source}): ${reason}\n${advice(start)}`);
    assert.equal(e.code, 'no-fluxd');
    assert.equal(e.fatal, true);
    assert.equal(e.socketPath, socketPath);
    assert.equal(e.source, source);
    assert.equal(e.reason, reason);
    if (errno) assert.equal(e.errno, errno);
    return true;
  });
}

test('no such socket (socketPath option)', async () => {
  const socketPath = path.join(tempDir(), 'x.sock');
  await refused(Client.connect({ socketPath }), { socketPath, source: 'the socketPath option', reason: 'no such socket', errno: 'ENOENT' });
});

test('no such socket (from $FLUXBUS_SOCKET), the message fluxctl gives', async () => {
  const socketPath = path.join(tempDir(), 'x.sock');
  await withEnv({ FLUXBUS_SOCKET: socketPath }, async () => {
    await assert.rejects(Client.connect(), (e) => e.message === `no fluxd at ${socketPath} (from $FLUXBUS_SOCKET): no such socket\n`
      + `  start one with:  fluxd --socket ${socketPath}\n`
      + '  or point the client at a running one with { socketPath: PATH } or FLUXBUS_SOCKET=PATH');
  });
});

test('the default path under $XDG_RUNTIME_DIR', async () => {
  const runtime = tempDir();
  await withEnv({ FLUXBUS_SOCKET: undefined, XDG_RUNTIME_DIR: runtime }, async () => {
    const socketPath = path.join(runtime, 'fluxbus', 'fluxd.sock');
    await refused(Client.connect(), { socketPath, source: '$XDG_RUNTIME_DIR', reason: 'no such socket' });
  });
});

test('a socket nobody listens on (fluxd killed)', async () => {
  const fluxd = await startFluxd();
  cleanups.push(() => fluxd.stop());
  fluxd.child.kill('SIGKILL');
  await new Promise((resolve) => fluxd.child.once('exit', resolve));
  assert.ok(fs.statSync(fluxd.socketPath).isSocket(), 'a killed fluxd leaves its socket');
  await refused(Client.connect({ socketPath: fluxd.socketPath }), {
    socketPath: fluxd.socketPath, source: 'the socketPath option', reason: 'the socket exists but no fluxd is listening on it', errno: 'ECONNREFUSED',
  });
});

test('a directory is not a socket (and the advice names a socket in it)', async () => {
  const dir = tempDir();
  await refused(Client.connect({ socketPath: dir }), {
    socketPath: dir, source: 'the socketPath option', reason: 'is a directory, not a socket', start: path.join(dir, 'fluxd.sock'),
  });
});

test('a plain file is not a socket', async () => {
  const file = path.join(tempDir(), 'notes.txt');
  fs.writeFileSync(file, 'hello');
  await refused(Client.connect({ socketPath: file }), { socketPath: file, source: 'the socketPath option', reason: 'is not a socket (a file of another kind is there)' });
});

test('Store.start says the same', async () => {
  const socketPath = path.join(tempDir(), 'x.sock');
  const store = new Store({ name: 'todos', handles: ['todo/*'] });
  await refused(store.start({ socketPath }), { socketPath, source: 'the socketPath option', reason: 'no such socket' });
});
