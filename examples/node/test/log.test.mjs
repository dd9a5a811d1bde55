// fluxd's log format in Node (lib/log.mjs, docs/logging.md): the exact lines (the cases of fluxd's own
// Tests/FluxDaemonTests/LogFormatTests.swift, quoting, escaping, journald, no time, JSON) with a fixed clock; the
// Store's default onError in that format; and a store process (demo/activity-store.mjs) run end to end across a
// fluxd restart to SIGTERM: stdout has only its ready line, every stderr line is in the format, each event once.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client, Store } from '../fluxbus.mjs';
import { LOG_LEVELS, createLogger, formatLogLine, logSettings } from '../lib/log.mjs';
import { fluxdFeatures, startFluxd } from './helpers.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const T = 1795479667123; // 2026-11-24T00:21:07.123Z
const LINE = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (trace|debug|info|notice|warning|error|critical) [^\s:]+: \S.*$/;

test('text lines are fluxd\'s: time with ms, level, label, message, metadata sorted and quoted', () => {
  assert.equal(formatLogLine('notice', 'fluxd', 'worker exited', { worker: 'todo', status: 'exit 1 (failure)' }, { time: T }),
    '2026-11-24T00:21:07.123Z notice fluxd: worker exited status="exit 1 (failure)" worker=todo');
  assert.equal(formatLogLine('info', 'fluxd', 'a\nb', {}, { time: T }), '2026-11-24T00:21:07.123Z info fluxd: a\\nb');
  assert.equal(formatLogLine('info', 'fluxd', 'listening', undefined, { time: 0 }), '1970-01-01T00:00:00.000Z info fluxd: listening');
});

test('quoting and escaping: one event, one line', () => {
  const line = formatLogLine('info', 'fluxbus.store', 'say "hi"\r\n\tnow\x1b', {
    empty: '', space: 'a b', quote: 'a"b', equals: 'a=b', newline: 'a\nb', control: '\x01', plain: '/tmp/fluxd.sock',
    unicode: 'héllo', backslash: 'a\\b', number: 42, flag: true, none: null, list: ['a', 'b'], skipped: undefined,
  }, { time: T });
  assert.equal(line, '2026-11-24T00:21:07.123Z info fluxbus.store: say "hi"\\r\\n\\tnow\\u{1b}'
    + ' backslash=a\\b control="\\u0001" empty="" equals="a=b" flag=true list="[\\"a\\",\\"b\\"]" newline="a\\nb"'
    + ' none=null number=42 plain=/tmp/fluxd.sock quote="a\\"b" space="a b" unicode=héllo');
  assert.ok(!line.includes('\n'));
  assert.throws(() => formatLogLine('verbose', 'x', 'y'), TypeError);
});

test('no time (a worker under fluxd), journald, JSON', () => {
  assert.equal(formatLogLine('info', 'todos', 'seq 1 todo/create', { peer: '7' }, { time: T, timestamps: false }), 'info todos: seq 1 todo/create peer=7');
  assert.equal(formatLogLine('warning', 'fluxd', 'slow consumer closed', { peer: '7' }, { time: T, journald: true }), '<4>fluxd: slow consumer closed peer=7');
  assert.equal(formatLogLine('info', 'fluxd', 'listening', {}, { time: T, journald: true }), '<6>fluxd: listening');
  const json = formatLogLine('error', 'fluxd', 'journal: "disk" full\n', { dir: '/var/lib/fluxbus', list: ['a', 'b'] }, { time: T, format: 'json' });
  assert.equal(json, '{"time":"2026-11-24T00:21:07.123Z","level":"error","label":"fluxd","message":"journal: \\"disk\\" full\\n","metadata":{"dir":"/var/lib/fluxbus","list":["a","b"]}}');
  assert.equal(JSON.parse(json).message, 'journal: "disk" full\n');
  assert.equal(formatLogLine('info', 'fluxd', 'ready', {}, { time: T, format: 'json' }), '{"time":"2026-11-24T00:21:07.123Z","level":"info","label":"fluxd","message":"ready"}');
});

test('createLogger: levels dropped below its own, the environment\'s settings', () => {
  const lines = [];
  const log = createLogger('app', { level: 'notice', write: (l) => lines.push(l), clock: () => T, timestamps: true, journald: false, format: 'text' });
  log.info('hidden'); log.notice('shown', { n: 1 }); log.critical('worst');
  assert.deepEqual(lines, ['2026-11-24T00:21:07.123Z notice app: shown n=1\n', '2026-11-24T00:21:07.123Z critical app: worst\n']);
  assert.deepEqual(LOG_LEVELS, ['trace', 'debug', 'info', 'notice', 'warning', 'error', 'critical']);
  assert.deepEqual(logSettings({}), { level: 'info', format: 'text', timestamps: true, journald: false });
  assert.deepEqual(logSettings({ FLUXBUS_LOG_LEVEL: 'Debug', FLUXBUS_LOG_FORMAT: 'json', FLUXBUS_LOG_TIME: '0', JOURNAL_STREAM: '1:2' }),
    { level: 'debug', format: 'json', timestamps: false, journald: false });
});

test('a Store\'s default onError writes fluxd\'s lines, label fluxbus.store', () => {
  const written = [];
  const write = process.stderr.write;
  process.stderr.write = (chunk) => { written.push(String(chunk)); return true; };
  try {
    const store = new Store({ name: 'todos' });
    store.onError(Object.assign(new Error('name taken'), { code: 'name-taken', detail: 'store "todos" is registered' }), { store: 'todos', refusals: 2, retryIn: 370 });
    store.onError(new Error('the list is locked'), { store: 'todos', type: 'todo/crash', seq: 7 });
  } finally { process.stderr.write = write; }
  assert.equal(written.length, 2);
  for (const line of written) assert.ok(line.endsWith('\n') && !line.slice(0, -1).includes('\n') && (LINE.test(line.slice(0, -1)) || /^(info|warning|error) /.test(line)), line);
  assert.match(written[0], / warning fluxbus\.store: store 'todos': registration refused \(name-taken: store "todos" is registered\); registering again in 370 ms \(refusal 2 in a row\)\n$/);
  assert.match(written[1], / error fluxbus\.store: store 'todos' failed while handling todo\/crash \(seq 7\): Error: the list is locked\\n {4}at /);
});

/** Lines of a stream, and a promise per awaited text. */
function lines(stream) {
  const seen = []; let rest = ''; const waiters = [];
  stream.setEncoding('utf8');
  stream.on('data', (chunk) => {
    const parts = (rest + chunk).split('\n'); rest = parts.pop();
    for (const line of parts) {
      seen.push(line);
      for (const w of waiters.slice()) if (line.includes(w.text)) { waiters.splice(waiters.indexOf(w), 1); w.resolve(line); }
    }
  });
  const waitFor = (text, ms = 20000) => {
    const found = seen.find((l) => l.includes(text));
    if (found) return Promise.resolve(found);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no line with ${JSON.stringify(text)}: ${JSON.stringify(seen)}`)), ms);
      waiters.push({ text, resolve: (l) => { clearTimeout(timer); resolve(l); } });
    });
  };
  return { seen, waitFor };
}

// Durable, so that seqs go on across the restart (and no two events read alike).
test('a store process logs each event once, in fluxd\'s format, from start across a fluxd restart to SIGTERM', { skip: !fluxdFeatures().dataDir && 'fluxd has no --data-dir' }, async (t) => {
  const fluxd = await startFluxd([], { durable: true });
  t.after(() => fluxd.stop());
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('FLUXBUS_LOG') && k !== 'JOURNAL_STREAM' && k !== 'NODE_TEST_CONTEXT' && k !== 'NODE_OPTIONS'));
  const child = spawn(process.execPath, [path.join(ROOT, 'demo', 'activity-store.mjs')], { env: { ...env, FLUXBUS_SOCKET: fluxd.socketPath }, stdio: ['ignore', 'pipe', 'pipe'] });
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  t.after(() => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL'); });
  const out = lines(child.stdout); const err = lines(child.stderr);
  await out.waitFor('activity-store ready');
  const client = await Client.connect({ socketPath: fluxd.socketPath, name: 'log-test' });
  try {
    (await client.dispatchAndSettle('todo/create', { title: 'milk' }, { timeout: 10000 })).check();
    await fluxd.restart();
    await err.waitFor('registered again');
    (await client.dispatchAndSettle('todo/create', { title: 'eggs' }, { timeout: 10000 })).check();
    await err.waitFor('seq=2');
  } finally { await client.close(); }
  child.kill('SIGTERM');
  assert.deepEqual(await exited, { code: 0, signal: null });
  assert.deepEqual(out.seen, ['activity-store ready']);
  const logged = err.seen;
  for (const line of logged) assert.match(line, LINE);
  const messages = logged.map((l) => l.slice(l.indexOf(' ') + 1)); // without the time
  assert.equal(new Set(messages).size, messages.length, `a line repeated: ${logged.join('\n')}`);
  const expected = [
    /^info activity-store: recorded todo\/create origin=\d+ seq=1$/,
    /^notice activity-store: connection to fluxd lost \(fluxd said bye \(.+\)\); reconnecting$/,
    /^notice activity-store: registered again as store activity resumed=(true|false) version=\d+$/,
    /^info activity-store: recorded todo\/create origin=\d+ seq=2$/,
    /^info activity-store: SIGTERM: unregistering$/,
  ];
  assert.equal(messages.length, expected.length, logged.join('\n'));
  messages.forEach((m, i) => assert.match(m, expected[i]));
});
