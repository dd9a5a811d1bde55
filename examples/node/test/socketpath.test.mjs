// The default socket path rule, checked against every case of protocol/vectors/socket-path.json.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { defaultSocketPath } from '../fluxbus.mjs';
import { REPO } from './helpers.mjs';

// -- socket path rule ---------------------------------------------------------------------------------------

const socketCases = (() => {
  const data = JSON.parse(fs.readFileSync(path.join(REPO, 'protocol', 'vectors', 'socket-path.json'), 'utf8'));
  return Array.isArray(data) ? data : data.cases; // a top-level array, or {"cases": [...]}
})();

test('socket-path.json has cases', () => assert.ok(Array.isArray(socketCases) && socketCases.length > 0));
socketCases.forEach((c, i) => {
  test(`socket path case ${i}: ${JSON.stringify(c.env)} uid ${c.uid}`, () => {
    assert.equal(defaultSocketPath({ env: c.env, uid: c.uid }), c.path);
  });
});

test('defaultSocketPath reads the process environment by default', () => {
  const saved = { ...process.env };
  try {
    delete process.env.FLUXBUS_SOCKET; delete process.env.XDG_RUNTIME_DIR; process.env.TMPDIR = '/var/tmp';
    assert.equal(defaultSocketPath(), `/var/tmp/fluxbus-${process.getuid()}/fluxd.sock`);
  } finally {
    for (const k of ['FLUXBUS_SOCKET', 'XDG_RUNTIME_DIR', 'TMPDIR']) { if (k in saved) process.env[k] = saved[k]; else delete process.env[k]; }
  }
});
