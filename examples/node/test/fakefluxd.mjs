// A fake fluxd for unit tests: a Unix socket server speaking protocol-1 frames, driven by the test. It answers
// hello itself (welcome with the limits given, or the `refuse` error) and the client's own ping requests;
// everything else the test reads with `peer.expect(...)` and answers with `peer.send(...)`.
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { FrameDecoder, encodeFrame } from '../fluxbus.mjs';

export const LIMITS = {
  maxFrame: 1048576, storeWindow: 64, queueLimit: 1024, queueTimeout: 5000, handshakeTimeout: 5000,
  maxPending: 65536, maxBacklog: 67108864, pingInterval: 50, maxPingsOut: 2,
};

class FakePeer {
  constructor(fake, socket) {
    this.fake = fake; this.socket = socket;
    /** @type {any[]} */ this.messages = []; this.waiter = null; this.closed = false; this.hello = undefined; this.welcomed = false;
    const decoder = new FrameDecoder();
    socket.on('data', (d) => { for (const e of decoder.feed(d)) if ('frame' in e) this.#handle(JSON.parse(e.frame.toString('utf8'))); });
    socket.on('close', () => { this.closed = true; this.#wake(); });
    socket.on('error', () => {});
  }
  send(msg) { this.socket.write(encodeFrame(JSON.stringify(msg))); }
  #wake() { const w = this.waiter; this.waiter = null; w?.(); }
  #handle(msg) {
    if (msg.op === 'hello' && this.hello === undefined) {
      this.hello = msg;
      if (this.fake.silent) { /* never welcomes: a handshake that does not finish */ } else if (this.fake.refuse) {
        this.send({ op: 'error', code: this.fake.refuse, message: 'refused by the fake', fatal: true });
        this.socket.end();
      } else {
        const welcome = { op: 'welcome', protocol: 1, server: 'fakefluxd/0', peer: ++this.fake.peerIds, limits: this.fake.limits };
        if (this.fake.epoch !== undefined) welcome.epoch = this.fake.epoch;
        this.send(welcome);
        this.welcomed = true;
      }
    } else if (msg.op === 'ping' && this.fake.autoPong !== false) { // (`fake.autoPong = false`: pings go unanswered)
      this.send(typeof msg.id === 'string' ? { op: 'pong', id: msg.id } : { op: 'pong' });
    } else if (msg.op === 'bye') this.socket.end();
    this.messages.push(msg);
    this.#wake();
  }
  /** The next message (skipping others) satisfying `predicate`; rejects after `timeout` ms or at close. */
  async expect(predicate = () => true, timeout = 5000, what = 'a message') {
    const deadline = Date.now() + timeout;
    for (;;) {
      while (this.messages.length) { const m = this.messages.shift(); if (predicate(m)) return m; }
      if (this.closed) throw new Error(`fake fluxd: the peer closed while waiting for ${what}`);
      const remaining = deadline - Date.now();
      if (remaining <= 0) throw new Error(`fake fluxd: timed out waiting for ${what}`);
      await new Promise((resolve) => { const t = setTimeout(resolve, remaining); this.waiter = () => { clearTimeout(t); resolve(); }; });
    }
  }
  expectOp(op, timeout = 5000) { return this.expect((m) => m.op === op, timeout, `op ${op}`); }
  async waitClosed(timeout = 5000) {
    const deadline = Date.now() + timeout;
    while (!this.closed) {
      const remaining = deadline - Date.now();
      if (remaining <= 0) throw new Error('fake fluxd: the peer did not close');
      await new Promise((resolve) => { const t = setTimeout(resolve, remaining); this.waiter = () => { clearTimeout(t); resolve(); }; });
    }
  }
}

export class FakeFluxd {
  /**
   * `refuse`: answer hello with that fatal error; `refuseAtConnect`: send it and close as soon as a connection is
   * accepted, before any hello (what fluxd does past its connection limits); `silent`: never answer hello;
   * `epoch`: welcome.epoch (none by default, as fluxd before 0.3.0). `refuse`, `silent` and `epoch` may be changed
   * between connections (a restarted fluxd).
   * @param {{limits?: Record<string, number>, refuse?: string, refuseAtConnect?: string, silent?: boolean, epoch?: string}} [options]
   */
  static async start({ limits = LIMITS, refuse, refuseAtConnect, silent = false, epoch } = {}) {
    const fake = new FakeFluxd();
    fake.limits = { ...limits }; fake.refuse = refuse; fake.silent = silent; fake.peerIds = 0; fake.epoch = epoch;
    fake.directory = fs.mkdtempSync(path.join(os.tmpdir(), 'fakefluxd-'));
    fake.socketPath = path.join(fake.directory, 'fluxd.sock');
    /** @type {FakePeer[]} */ fake.all = []; /** @type {FakePeer[]} */ fake.incoming = []; fake.waiter = null;
    fake.server = net.createServer((socket) => {
      if (refuseAtConnect) {
        socket.on('error', () => {});
        socket.end(encodeFrame(JSON.stringify({ op: 'error', code: refuseAtConnect, message: 'refused at connect', fatal: true })));
        socket.destroySoon?.();
        return;
      }
      const peer = new FakePeer(fake, socket);
      fake.all.push(peer); fake.incoming.push(peer);
      const w = fake.waiter; fake.waiter = null; w?.();
    });
    await new Promise((resolve, reject) => { fake.server.once('error', reject); fake.server.listen(fake.socketPath, resolve); });
    return fake;
  }
  /** The next connection, once its hello arrived (`withHello` false: as soon as it connects). */
  async accept(timeout = 5000, withHello = true) {
    const deadline = Date.now() + timeout;
    while (!this.incoming.length) {
      const remaining = deadline - Date.now();
      if (remaining <= 0) throw new Error('fake fluxd: no connection');
      await new Promise((resolve) => { const t = setTimeout(resolve, remaining); this.waiter = () => { clearTimeout(t); resolve(); }; });
    }
    const peer = this.incoming.shift();
    if (withHello) await peer.expectOp('hello', timeout);
    return peer;
  }
  /** The next connection that was welcomed (skipping those refused meanwhile). */
  async acceptWelcomed(timeout = 5000) {
    const deadline = Date.now() + timeout;
    for (;;) {
      const peer = await this.accept(Math.max(1, deadline - Date.now()));
      if (peer.welcomed) return peer;
    }
  }
  async close() {
    for (const peer of this.all) peer.socket.destroy();
    await new Promise((resolve) => this.server.close(resolve));
    fs.rmSync(this.directory, { recursive: true, force: true });
  }
}
