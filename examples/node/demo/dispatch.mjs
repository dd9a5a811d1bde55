#!/usr/bin/env node
// A Node view client for the polyglot demo: dispatches todo/create for each title and prints every settlement.
import { Client } from '../fluxbus.mjs';

const titles = process.argv.slice(2);
const client = await Client.connect({ socketPath: process.env.FLUXBUS_SOCKET, name: 'node-dispatch' });
for (const title of titles) {
  const s = await client.dispatchAndSettle('todo/create', { title }, { timeout: 20000 });
  const results = s.results.map((r) => `${r.store}:${r.status}${r.version !== undefined ? ` v${r.version}` : ''}`).join(', ');
  console.log(`node dispatched todo/create "${title}" seq ${s.seq} -> ${results}`);
}
await client.close();
