#!/usr/bin/env node
// A Node store worker for the polyglot demo: store "activity" keeps the last 5 todo actions (seq, type, origin).
// stdout has one line, `activity-store ready`, once it is registered (what scripts wait for); everything else is
// its log on stderr, in fluxd's format (lib/log.mjs, docs/logging.md), each event once.
import { Store } from '../fluxbus.mjs';
import { createLogger } from '../lib/log.mjs';

const log = createLogger('activity-store');
const store = new Store({ name: 'activity', handles: ['todo/*'], initialState: { recent: [] } });
store.on('todo/*', (state, payload, ctx) => {
  log.info(`recorded ${ctx.type}`, { origin: ctx.origin, seq: ctx.seq });
  return { recent: [...state.recent, { seq: ctx.seq, type: ctx.type, origin: ctx.origin }].slice(-5) };
});
await store.start({ socketPath: process.env.FLUXBUS_SOCKET, clientName: 'activity-node' });
console.log('activity-store ready');
let stopping = false;
const stop = async (signal) => {
  if (stopping) return;
  stopping = true;
  log.info(`${signal}: unregistering`);
  await store.stop();
  process.exit(0);
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
// The store reconnects by itself when fluxd restarts (and registers again); it exits once its client ends for good.
// The Node client does not log connection events itself: these are the only lines about them.
store.client.on('disconnected', (reason) => log.notice(`connection to fluxd lost (${reason.detail}); reconnecting`));
store.client.on('store-registered', (name, { resumed, version }) => log.notice(`registered again as store ${name}`, { resumed, version }));
store.client.on('close', (reason) => {
  if (stopping) return;
  log.notice(`connection to fluxd ended for good (${reason.detail})`);
  process.exit(0);
});
