#!/usr/bin/env node
// Large-state benchmark (issue 16, benchmark workload 8): a store holding N todos (10,000 by default, ~860 KB of
// JSON); each action toggles one; subscribers follow. Prints one JSON object per run on stdout.
//
//   node bench-large-state.mjs --socket S --role store  [--todos 10000] [--mode patch|shared|full] [--actions N]
//       registers store "todos" (handles todo/*; todo/toggle {id}). --mode patch (default): draft handler, changes
//       sent as patches (fluxd 0.4+); shared: Redux-style handler on the shared frozen state, patches; full: the
//       0.2 behaviour (deep copy, whole state in every done). After --actions actions (default 1000) it prints
//       {"role":"store","mode","todos","actions","cpuUsPerAction","sent":{patches,states}} and exits.
//       It prints {"role":"store","ready":true} once registered.
//   node bench-large-state.mjs --socket S --role client [--deltas true|false] [--changes N] [--read-id ID]
//       subscribes to "todos" (deltas: asks for delta frames; false: whole snapshots), reads the toggled todo
//       through the state after each change, and once it holds the version --changes after its first (default
//       1000; 0: at once) prints {"role":"client","deltas","changes","versions","firstStateMs","bytesReceived",
//       "cpuUsPerChange","bytesPerChange","deltasApplied","resyncs","versionsSkipped"}.
//       It prints {"role":"client","ready":true,"firstStateMs"} once it holds the first snapshot (ms from subscribe).
//   node bench-large-state.mjs --socket S --role driver [--actions N] [--todos 10000] [--window 16]
//       dispatches N todo/toggle actions (ids in turn), at most --window unsettled at once, and prints
//       {"role":"driver","actions","seconds","actionsPerSecond"}.
//   node bench-large-state.mjs --role self [--todos 10000] [--actions 500] [--subscribers 2] [--modes full,patch,shared]
//       runs everything, A/B in one run: for each mode a fluxd ($FLUXD, else ../../.build/debug/fluxd, --ephemeral)
//       on a temporary socket, the store and --subscribers clients as child processes (deltas for patch/shared,
//       whole snapshots for full), and the driver; prints one JSON line per mode with every role's figures.
// CPU is process.cpuUsage() (user + system) over the measured span, per action or change.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client, Store } from './fluxbus.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const args = Object.fromEntries(process.argv.slice(2).reduce((pairs, a, i, all) => {
  if (a.startsWith('--')) pairs.push([a.slice(2), all[i + 1] !== undefined && !all[i + 1].startsWith('--') ? all[i + 1] : 'true']);
  return pairs;
}, []));
const num = (name, fallback) => (args[name] === undefined ? fallback : Number(args[name]));
const TODOS = num('todos', 10000);
const out = (obj) => process.stdout.write(`${JSON.stringify(obj)}\n`);
const cpuUs = () => { const u = process.cpuUsage(); return u.user + u.system; };

function initialState(n) {
  // ~86 bytes a todo, as the example todo store's: 10,000 todos are ~870 KB of JSON
  return { todos: Array.from({ length: n }, (_, i) => ({ id: i, title: `todo number ${i + 1}: buy milk and eggs`, done: false, createdSeq: i + 1 })), nextId: n };
}

async function runStore() {
  const mode = args.mode ?? 'patch';
  const actions = num('actions', 1000);
  const options = mode === 'full' ? { handlerState: 'copy', patches: false } : mode === 'shared' ? { handlerState: 'shared' } : { handlerState: 'draft' };
  const store = new Store({ name: 'todos', handles: ['todo/*'], initialState: initialState(TODOS), ...options });
  if (mode === 'shared') {
    store.on('todo/toggle', (state, { id }) => ({ ...state, todos: state.todos.map((t) => (t.id === id ? { ...t, done: !t.done } : t)) }));
  } else {
    store.on('todo/toggle', (state, { id }) => { const t = state.todos.find((x) => x.id === id); t.done = !t.done; return state; });
  }
  let handled = 0; let start = 0;
  const finished = new Promise((resolve) => {
    const original = store.handlerFor('todo/toggle');
    store.handlers = [];
    store.on('todo/toggle', function toggle(state, payload, ctx) {
      if (handled === 0) start = cpuUs();
      handled++;
      const r = original.call(this, state, payload, ctx);
      if (handled === actions) setImmediate(resolve);
      return r;
    });
  });
  await store.start({ socketPath: args.socket });
  out({ role: 'store', ready: true });
  await finished;
  await store.chain;
  const cpu = cpuUs() - start;
  out({ role: 'store', mode, todos: TODOS, actions: handled, cpuUsPerAction: Math.round(cpu / handled), sent: store.sent });
  await store.stop();
}

async function runClient() {
  const deltas = args.deltas !== 'false';
  const changes = num('changes', 1000);
  const client = await Client.connect({ socketPath: args.socket, name: 'bench-client', deltas });
  const t0 = performance.now();
  const sub = await client.subscribe('todos', { waitForSnapshot: true });
  const first = await sub.next();
  const firstStateMs = Number((performance.now() - t0).toFixed(1));
  out({ role: 'client', ready: true, firstStateMs });
  // Until the state of the version --changes after the first (versions skipped under newest-wins count too).
  let seen = 0; let skipped = 0; let last = first.version; const start = cpuUs(); const bytes0 = client.socket.bytesRead; let readDone = 0;
  if (changes > 0) {
    for await (const snap of sub) {
      seen++;
      skipped += snap.version - last - 1; last = snap.version;
      // read the toggled todo through the state, as a view would (the driver toggles id (seq - 1) % N, as run.py's)
      readDone += snap.state.todos[(snap.seq - 1) % TODOS].done ? 1 : 0;
      if (last >= first.version + changes) break;
    }
  }
  const cpu = cpuUs() - start; const bytes = client.socket.bytesRead - bytes0;
  out({ role: 'client', deltas, changes: seen, versions: last - first.version, firstStateMs, bytesReceived: bytes,
    cpuUsPerChange: Math.round(cpu / Math.max(seen, 1)), bytesPerChange: Math.round(bytes / Math.max(seen, 1)),
    deltasApplied: client.deltaStats.applied, resyncs: client.deltaStats.resyncs, versionsSkipped: skipped, readDone });
  await client.close();
}

async function runDriver() {
  const actions = num('actions', 1000);
  const window = num('window', 16);
  const client = await Client.connect({ socketPath: args.socket, name: 'bench-driver' });
  const t0 = performance.now();
  let sent = 0; const inflight = new Set();
  while (sent < actions) {
    const p = client.dispatchAndSettle('todo/toggle', { id: sent % TODOS }, { timeout: 120000 }).then((s) => { s.check(); inflight.delete(p); });
    inflight.add(p); sent++;
    if (inflight.size >= window) await Promise.race(inflight);
  }
  await Promise.all(inflight);
  const seconds = (performance.now() - t0) / 1000;
  out({ role: 'driver', actions, seconds: Number(seconds.toFixed(3)), actionsPerSecond: Math.round(actions / seconds) });
  await client.close();
}

/** A child running one role; resolves its JSON lines. */
function child(role, extra) {
  const proc = spawn(process.execPath, [fileURLToPath(import.meta.url), '--role', role, ...extra], { stdio: ['ignore', 'pipe', 'inherit'] });
  const lines = []; let buf = ''; const waiters = [];
  proc.stdout.on('data', (d) => {
    buf += d; let i;
    while ((i = buf.indexOf('\n')) >= 0) { const line = JSON.parse(buf.slice(0, i)); buf = buf.slice(i + 1); lines.push(line); for (const w of waiters.splice(0)) w(); }
  });
  const exited = new Promise((resolve) => proc.once('exit', resolve));
  const until = async (pred, ms = 120000) => {
    const deadline = Date.now() + ms;
    for (;;) {
      const found = lines.find(pred); if (found) return found;
      if (proc.exitCode !== null || Date.now() > deadline) throw new Error(`${role}: no such line (exit ${proc.exitCode})`);
      await Promise.race([new Promise((r) => waiters.push(r)), exited, new Promise((r) => setTimeout(r, Math.max(1, deadline - Date.now())))]);
    }
  };
  return { proc, lines, until, exited };
}

async function runSelf() {
  const fluxdPath = process.env.FLUXD || path.join(HERE, '..', '..', '.build', 'debug', 'fluxd');
  const actions = num('actions', 500);
  const subscribers = num('subscribers', 2);
  const modes = (args.modes ?? 'full,patch,shared').split(',');
  for (const mode of modes) {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bench-large-'));
    const socket = path.join(dir, 'fluxd.sock');
    const fluxd = spawn(fluxdPath, ['--socket', socket, '--ephemeral'], { stdio: ['ignore', 'pipe', 'inherit'] });
    try {
      await new Promise((resolve, reject) => { fluxd.stdout.once('data', resolve); fluxd.once('exit', (c) => reject(new Error(`fluxd exited ${c}`))); });
      const common = ['--socket', socket, '--todos', String(TODOS)];
      const store = child('store', [...common, '--mode', mode, '--actions', String(actions)]);
      await store.until((l) => l.ready);
      const clients = [];
      for (let i = 0; i < subscribers; i++) clients.push(child('client', [...common, '--deltas', mode === 'full' ? 'false' : 'true', '--changes', String(actions)]));
      for (const c of clients) await c.until((l) => l.ready);
      const fluxdCpu0 = fluxdCpu(fluxd.pid);
      const driver = child('driver', [...common, '--actions', String(actions)]);
      const d = await driver.until((l) => l.role === 'driver' && l.actions);
      const s = await store.until((l) => l.cpuUsPerAction !== undefined);
      const cs = [];
      for (const c of clients) cs.push(await c.until((l) => l.cpuUsPerChange !== undefined));
      const fluxdCpuUs = fluxdCpu(fluxd.pid) - fluxdCpu0; // 10 ms resolution
      out({ mode, todos: TODOS, actions, subscribers, store: s, clients: cs, driver: d, fluxdCpuUsPerAction: Math.round(fluxdCpuUs / actions) });
      for (const p of [store, driver, ...clients]) await p.exited;
    } finally {
      fluxd.kill('SIGTERM');
      await new Promise((r) => (fluxd.exitCode !== null ? r() : fluxd.once('exit', r)));
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }
}

/** fluxd's CPU time so far, in µs (Linux /proc). */
function fluxdCpu(pid) {
  try {
    const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
    const ticks = Number(f[11]) + Number(f[12]); // utime + stime (fields 14, 15)
    return ticks * 10000; // USER_HZ 100: one tick is 10 ms
  } catch { return 0; }
}

const roles = { store: runStore, client: runClient, driver: runDriver, self: runSelf };
if (!roles[args.role]) {
  process.stderr.write('usage: bench-large-state.mjs --role store|client|driver|self [--socket S] ... (see the top of this file)\n');
  process.exit(2);
}
if (args.role !== 'self' && !args.socket) { process.stderr.write('--socket S is required\n'); process.exit(2); }
await roles[args.role]();
