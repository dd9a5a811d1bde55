#!/usr/bin/env node
// A Node store worker for the polyglot demo: store "activity" keeps the last 5 todo actions (seq, type, origin).
import { Store } from '../fluxbus.mjs';

const store = new Store({ name: 'activity', handles: ['todo/*'], initialState: { recent: [] } });
store.on('todo/*', (state, payload, ctx) => ({
  recent: [...state.recent, { seq: ctx.seq, type: ctx.type, origin: ctx.origin }].slice(-5),
}));
await store.start({ socketPath: process.env.FLUXBUS_SOCKET, clientName: 'activity-node' });
console.log('activity-store ready');
const stop = async () => { await store.stop(); process.exit(0); };
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
// The store reconnects by itself when fluxd restarts (and registers again); it exits once its client ends for good.
store.client.on('disconnected', (reason) => console.log(`activity-store: lost fluxd (${reason.detail}); reconnecting`));
store.client.on('store-registered', (name, { resumed, version }) => console.log(`activity-store: ${name} registered again (resumed ${resumed}, version ${version})`));
store.client.on('close', () => process.exit(0));
