// A CommonJS TypeScript module using the package, checked by `tsc -p examples/node/types-check-cjs`
// (scripts/test.sh). A .cts file is CommonJS whatever package.json says, as a .ts file is in a project whose
// package.json has no "type": "module": its imports compile to require(), so TypeScript resolves 'fluxbus' through
// package.json's `exports["."].require` to fluxbus.d.cts (an ES-module-only package fails here with TS1479). The
// package is imported by its own name, so `exports` is what resolves it. The `@ts-expect-error` lines must stay
// errors: if 'fluxbus' resolved to `any` (no types), they would not be, and tsc would fail.
import { Client, Store, Reject, FluxError, NoHandlerError, StoreRejectedError, TimeoutError, ErrorCodes, StoreStatus } from 'fluxbus';
import type { Settlement, Snapshot, Subscription } from 'fluxbus';
import fluxbus = require('fluxbus');

interface Counter { value: number }

/** A store and a client from CommonJS: the same API, types and classes as from an ES module. */
export async function counterFromCommonJS(socketPath?: string): Promise<string[]> {
  const log: string[] = [];
  const counter = new Store<Counter>({ name: 'counter', handles: ['counter/*'], initialState: { value: 0 } });
  counter.on<{ by: number }>('counter/add', (state, { by }) => {
    if (by <= 0) throw new Reject('counter/bad-step', 'step must be positive');
    return { value: state.value + by };
  });
  await counter.start({ socketPath, timeout: 5000 });

  const client: fluxbus.Client = await fluxbus.Client.connect({ socketPath, name: 'cjs-example' });
  const settlement: Settlement = await client.dispatchAndSettle('counter/add', { by: 2 }, { timeout: 2000 });
  for (const error of settlement.errors) {
    if (error instanceof StoreRejectedError) log.push(`${error.store} rejected: ${error.code}`);
  }
  try {
    await client.dispatchAndSettle('nobody/handles', null, { timeout: 1000 });
  } catch (error) {
    if (error instanceof NoHandlerError) { const code: 'no-handler' = error.code; log.push(code); }
    else if (error instanceof TimeoutError) log.push(`timed out after ${error.timeoutMs ?? 0} ms`);
    else if (error instanceof FluxError && error.code === ErrorCodes.OVERLOADED) log.push(error.message);
    else throw error;
  }
  const sub: Subscription<Counter> = await client.subscribe<Counter>('counter', { timeout: 5000 });
  if (sub.status === StoreStatus.UNKNOWN) log.push('no store named counter yet');
  const first: Snapshot<Counter> | undefined = await sub.next(5000);
  log.push(`value ${first?.state.value ?? -1}`);

  // The ES module entry, imported from CommonJS: the same declarations.
  const esm = await import('fluxbus');
  const SameClient: typeof esm.Client = Client;
  log.push(SameClient.name);

  // @ts-expect-error an action type is a string
  client.dispatch(42, {});
  // @ts-expect-error a handler returns the store's state type
  counter.on('counter/bad', () => ({ count: 1 }));
  // @ts-expect-error Reject needs a code
  new fluxbus.Reject();

  await client.close();
  await counter.stop();
  return log;
}
