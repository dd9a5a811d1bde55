// Plays every protocol/conformance/*.json scenario against a real fluxd, through this module's frame decoder.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { FrameDecoder, encodeFrame } from '../fluxbus.mjs';
import { REPO, startFluxd } from './helpers.mjs';

const DIR = path.join(REPO, 'protocol', 'conformance');
const PLACEHOLDER = /^\$[A-Za-z_][A-Za-z0-9_.:-]*$/;
// Protocol-1 ops fluxd sends (SPEC §7); a peer ignores others (SPEC §13).
const KNOWN = new Set(['welcome', 'registered', 'action', 'settled', 'snapshot', 'subscribed', 'unsubscribed',
  'store-down', 'store-up', 'query-ok', 'unquery-ok', 'queries', 'info', 'got', 'pong', 'bye', 'error',
  'recovered', 'history', 'state-at', 'delta', 'subtree', 'forgotten']);

class RawPeer {
  constructor(socketPath) {
    this.frames = []; this.waiter = null; this.eof = false;
    this.decoder = new FrameDecoder();
    this.socket = net.createConnection(socketPath);
    this.connected = new Promise((resolve, reject) => { this.socket.once('connect', resolve); this.socket.once('error', reject); });
    this.socket.on('data', (d) => { for (const e of this.decoder.feed(d)) if ('frame' in e) this.frames.push(e.frame); this.#wake(); });
    this.socket.on('close', () => { this.eof = true; this.#wake(); });
    this.socket.on('error', () => {});
  }
  #wake() { const w = this.waiter; this.waiter = null; w?.(); }
  /** Next protocol-1 frame, or null at EOF. */
  async next(timeout = 10000) {
    const deadline = Date.now() + timeout;
    for (;;) {
      while (this.frames.length) {
        const body = this.frames.shift();
        let op; try { op = JSON.parse(body.toString('utf8')).op; } catch { return body; }
        if (KNOWN.has(op)) return body;
      }
      if (this.eof) return null;
      const remaining = deadline - Date.now();
      if (remaining <= 0) throw new Error('timed out waiting for a frame');
      await new Promise((resolve) => { const t = setTimeout(resolve, remaining); this.waiter = () => { clearTimeout(t); resolve(); }; });
    }
  }
  send(bytes) { this.socket.write(bytes); }
  close() { this.socket.destroy(); }
}

function substitute(value, bindings) {
  if (Array.isArray(value)) return value.map((v) => substitute(v, bindings));
  if (value && typeof value === 'object') return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, substitute(v, bindings)]));
  if (typeof value === 'string') {
    if (value.startsWith('$$')) return value.slice(1);
    if (PLACEHOLDER.test(value)) {
      if (!(value in bindings)) throw new Error(`placeholder ${value} used before it was bound`);
      return bindings[value];
    }
  }
  return value;
}

function match(pattern, actual, bindings, where = 'value') {
  if (typeof pattern === 'string' && !pattern.startsWith('$$') && PLACEHOLDER.test(pattern)) {
    if (pattern === '$any') return null;
    if (pattern in bindings) return same(bindings[pattern], actual) ? null : `${where}: ${JSON.stringify(actual)} != ${pattern}=${JSON.stringify(bindings[pattern])}`;
    bindings[pattern] = actual; return null;
  }
  if (typeof pattern === 'string' && pattern.startsWith('$$')) pattern = pattern.slice(1);
  if (Array.isArray(pattern)) {
    if (!Array.isArray(actual) || actual.length !== pattern.length) return `${where}: expected ${pattern.length} elements, got ${JSON.stringify(actual)}`;
    for (let i = 0; i < pattern.length; i++) { const p = match(pattern[i], actual[i], bindings, `${where}[${i}]`); if (p) return p; }
    return null;
  }
  if (pattern && typeof pattern === 'object') {
    if (!actual || typeof actual !== 'object' || Array.isArray(actual)) return `${where}: expected an object, got ${JSON.stringify(actual)}`;
    for (const [key, sub] of Object.entries(pattern)) {
      if (sub === '$absent') { if (key in actual) return `${where}.${key}: expected absent`; continue; }
      if (!(key in actual)) return `${where}.${key}: missing`;
      const p = match(sub, actual[key], bindings, `${where}.${key}`); if (p) return p;
    }
    return null;
  }
  return same(pattern, actual) ? null : `${where}: expected ${JSON.stringify(pattern)}, got ${JSON.stringify(actual)}`;
}

const same = (a, b) => (typeof a === 'boolean' || typeof b === 'boolean') ? a === b : JSON.stringify(a) === JSON.stringify(b);

async function expectFrame(peer, pattern, bindings, timeout) {
  const body = await peer.next(timeout);
  if (body === null) throw new Error('connection closed instead of a frame');
  const trial = { ...bindings };
  const problem = match(pattern, JSON.parse(body.toString('utf8')), trial);
  if (problem) throw new Error(`${problem}\n  frame: ${body}`);
  Object.assign(bindings, trial);
}

async function play(scenario) {
  const fluxd = await startFluxd(scenario.fluxd ?? []);
  const peers = new Map(); const bindings = {}; let barrier = 0;
  const connect = async (name) => { const p = new RawPeer(fluxd.socketPath); await p.connected; peers.set(name, p); return p; };
  try {
    for (const [index, step] of scenario.steps.entries()) {
      const timeout = (step.timeout ?? 10) * 1000;
      try {
        switch (step.do) {
          case 'connect': await connect(step.peer); break;
          case 'hello': {
            const p = peers.get(step.peer) ?? await connect(step.peer);
            p.send(encodeFrame(JSON.stringify({ op: 'hello', protocol: 1, role: step.role ?? 'client', name: step.name ?? step.peer })));
            await expectFrame(p, { op: 'welcome', protocol: 1, peer: `$peer.${step.peer}` }, bindings, timeout);
            break;
          }
          case 'send': {
            const p = peers.get(step.peer);
            if ('frame' in step) p.send(encodeFrame(JSON.stringify(substitute(step.frame, bindings))));
            else if ('body' in step) p.send(encodeFrame(step.body));
            else p.send(Buffer.from(step.hex, 'hex'));
            break;
          }
          case 'expect': await expectFrame(peers.get(step.peer), step.frame, bindings, timeout); break;
          case 'expect-closed': {
            const body = await peers.get(step.peer).next(timeout);
            if (body !== null) throw new Error(`expected the connection to close, got ${body}`);
            break;
          }
          case 'quiet': {
            const id = `quiet-${++barrier}`;
            peers.get(step.peer).send(encodeFrame(JSON.stringify({ op: 'ping', id })));
            await expectFrame(peers.get(step.peer), { op: 'pong', id }, bindings, timeout);
            break;
          }
          case 'close': peers.get(step.peer).close(); peers.delete(step.peer); break;
          case 'signal': fluxd.signal(step.signal); break;
          default: throw new Error(`unknown step ${step.do}`);
        }
      } catch (err) {
        throw new Error(`step ${index + 1} ${JSON.stringify(step).slice(0, 160)}: ${err.message}\nfluxd stderr:\n${fluxd.stderr.slice(-2000)}`);
      }
    }
  } finally {
    for (const p of peers.values()) p.close();
    await fluxd.stop();
  }
}

for (const file of fs.readdirSync(DIR).filter((f) => f.endsWith('.json')).sort()) {
  test(`conformance: ${file}`, async () => {
    await play(JSON.parse(fs.readFileSync(path.join(DIR, file), 'utf8')));
  });
}

test('the matcher binds placeholders and treats booleans apart from numbers', () => {
  const b = {};
  assert.equal(match({ seq: '$s', x: '$absent' }, { seq: 4 }, b), null);
  assert.deepEqual(b, { $s: 4 });
  assert.notEqual(match({ seq: '$s' }, { seq: 5 }, b), null);
  assert.notEqual(match({ v: true }, { v: 1 }, {}), null);
});
