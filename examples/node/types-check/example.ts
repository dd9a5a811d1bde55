// A typed use of the package, checked by `tsc -p examples/node/types-check` (scripts/test.sh): the client, a
// subscription, a store and the error classes, imported by the package's own name so that package.json's
// `exports`/`types` are what resolves it. The `@ts-expect-error` lines are wrong calls: tsc fails if any of them
// stops being an error, so the declarations are proven to reject them, not only to accept the right ones.
import {
  Client, Store, Reject, FluxError, NoHandlerError, StoreRejectedError, TimeoutError, NoFluxdError, DisconnectedError,
  LimitExceededError, ErrorCodes, StoreStatus, StoreErrorCodes, Unhandled, errorFromFrame, NotSentError,
  OutcomeUnknownError, DEFAULT_RECONNECT, reconnectPolicy, backoffDelay, StateTooLargeError, LocalErrorCodes,
} from 'fluxbus';
import type { Settlement, Snapshot, Subscription, ActiveQuery } from 'fluxbus';

interface Counter { value: number }
interface AddPayload { by: number }

/** Runs a counter store and a client against fluxd at `socketPath`; returns what it saw. */
export async function counterExample(socketPath?: string): Promise<string[]> {
  const log: string[] = [];
  const counter = new Store<Counter>({
    name: 'counter', handles: ['counter/*'], initialState: { value: 0 }, unhandled: Unhandled.REJECT,
    onError: (error, context) => {
      if (context.retryIn !== undefined) log.push(`registration refused ${context.refusals ?? 0} times: again in ${context.retryIn} ms`);
      else log.push(`${context.store} ${context.type ?? ''}: ${String(error)}`);
    },
  });
  counter.on<AddPayload>('counter/add', (state, { by }, ctx) => {
    if (by <= 0) throw new Reject('counter/bad-step', 'step must be positive', { field: 'by' });
    ctx.dispatch('audit/counted', { by });
    return { value: state.value + by };
  });
  counter.on('counter/reset', async () => ({ value: 0 }));
  counter.on<{ to: number }>('counter/set', (_state, { to }) => ({ value: to }), { payload: { to: 'integer', note: 'string?' } });
  counter.on('counter/double', (state) => ({ value: state.value * 2 }), { payload: (p) => (p === null ? undefined : 'takes no payload') });
  counter.onQueries = (queries: ActiveQuery[]) => { counter.publish({ value: queries.length }); };
  let resumed = false;
  try {
    ({ resumed } = await counter.start({ socketPath, timeout: 5000 }));
  } catch (error) {
    if (error instanceof StateTooLargeError) { const code: 'state-too-large' = error.code; log.push(`${code} at ${error.path ?? 'the root'} of ${error.store}`); }
    throw error;
  }
  log.push(`registered, resumed: ${resumed}, refusals ${counter.refusals}, ${LocalErrorCodes.STATE_TOO_LARGE}`);

  const client = await Client.connect({ socketPath, name: 'typed-example', requestTimeout: 5000, maxWriteQueue: 1 << 20 });
  client.on('error-frame', (error) => { log.push(`${error.code}: ${error.detail}`); });
  client.on('close', (reason) => { log.push(`closed: ${reason.code}`); });
  log.push(`peer ${client.welcome.peer}, maxFrame ${client.welcome.limits.maxFrame}`);

  const settlement: Settlement = await client.dispatchAndSettle('counter/add', { by: 2 }, { timeout: 2000 });
  for (const error of settlement.errors) {
    if (error instanceof StoreRejectedError) log.push(`${error.store} rejected: ${error.code} ${JSON.stringify(error.details)}`);
  }
  if (settlement.ok) log.push(`seq ${settlement.seq}: ${settlement.results.map((r) => `${r.store} ${r.status}`).join(', ')}`);
  try { (await client.dispatchAndSettle('counter/ad', { by: 1 })).check(); } catch (error) {
    if (error instanceof StoreRejectedError && error.code === StoreErrorCodes.UNHANDLED_ACTION) log.push(error.detail);
  }

  const sub: Subscription<Counter> = await client.subscribe<Counter>('counter', { timeout: 5000, waitForSnapshot: true });
  if (sub.status === StoreStatus.UNKNOWN) log.push('no store named counter has registered yet');
  let last: Snapshot<Counter> | undefined;
  for await (const snapshot of sub) { // leaving the loop unsubscribes
    last = snapshot;
    if (snapshot.state.value >= 2) break;
  }
  log.push(`value ${last?.state.value ?? -1} at version ${last?.version ?? 0}`);

  try {
    await client.dispatchAndSettle('nobody/handles', null, { timeout: 1000 });
  } catch (error) {
    if (error instanceof NoHandlerError) { const code: 'no-handler' = error.code; log.push(code); }
    else if (error instanceof TimeoutError) log.push(`gave up after ${error.timeoutMs ?? 0} ms`);
    else if (error instanceof LimitExceededError || (error instanceof FluxError && error.code === ErrorCodes.OVERLOADED)) log.push(error.message);
    else throw error;
  }

  const receipt = await client.query('counter', { page: 1 });
  await receipt.close({ timeout: 1000 });
  const id: string = client.dispatch('counter/add', { by: 1 });
  if (client.backpressured) await client.flush();
  log.push(`dispatched ${id}, ${client.pending.size} pending, round trip ${(await client.ping()).toFixed(1)} ms`);
  log.push(errorFromFrame({ code: 'cycle', message: 'a -> b -> a', fatal: false }).name);
  await client.close();
  await counter.stop({ timeout: 2000 });
  return log;
}

/** Connects, or says why not in the words of the error classes. */
export async function connectOrExplain(socketPath: string): Promise<Client | string> {
  try {
    return await Client.connect({ socketPath, timeout: 1000 });
  } catch (error) {
    if (error instanceof NoFluxdError) return `${error.reason} (${error.errno ?? '?'}) at ${error.socketPath} from ${error.source}`;
    if (error instanceof DisconnectedError) return `disconnected: ${error.cause instanceof FluxError ? error.cause.code : 'socket'}`;
    throw error;
  }
}

/** Wrong calls: each line must stay a type error. */
export function wrongCalls(client: Client, counter: Store<Counter>, sub: Subscription<Counter>): void {
  // @ts-expect-error an action type is a string
  client.dispatch(42);
  // @ts-expect-error a timeout is a number of ms (or null)
  void client.ping({ timeout: '5s' });
  // @ts-expect-error subscribe needs a store name
  void client.subscribe();
  // @ts-expect-error a handler returns the store's state type
  counter.on('counter/add', () => ({ value: 'one' }));
  // @ts-expect-error the payload type is checked against its use
  counter.on<AddPayload>('counter/add', (state, payload) => ({ value: state.value + payload.step }));
  // @ts-expect-error unhandled is 'reject' or 'ignore'
  void new Store<Counter>({ name: 'x', unhandled: 'skip' });
  // @ts-expect-error a status is up, down or unknown
  void sub.waitForStatus('registered');
  // @ts-expect-error snapshots carry the subscription's state type
  const text: string | undefined = sub.latest?.state.value;
  void text;
  // @ts-expect-error Reject needs a code
  void new Reject();
  // @ts-expect-error the client's events are named
  client.on('eror-frame', () => {});
  // @ts-expect-error a 'close' listener gets the reason, a FluxError
  client.on('close', (reason: string) => { void reason; });
  const error = new NoHandlerError('x');
  // @ts-expect-error NoHandlerError's code is 'no-handler'
  const code: 'overloaded' = error.code;
  void code;
  // @ts-expect-error a payload field's type is one of string, number, integer, boolean, object, array, any (with ?)
  counter.on('counter/set', () => undefined, { payload: { to: 'text' } });
  // @ts-expect-error publish takes the store's state type
  counter.publish({ count: 1 });
}

/** Reconnection: the events a UI shows, and the errors of dispatches a lost connection left in doubt. */
export async function reconnectingView(socketPath: string): Promise<string[]> {
  const log: string[] = [];
  const client = await Client.connect({ socketPath, reconnect: { initialDelay: 50, maxDelay: 2000, maxAttempts: 20, giveUpAfter: null } });
  client.on('disconnected', (reason) => { log.push(`offline: ${reason.code}`); });
  client.on('reconnecting', ({ attempt, delay, error }) => { log.push(`attempt ${attempt} in ${delay} ms (${error.code})`); });
  client.on('reconnected', ({ epochChanged, epoch, downtime }) => { log.push(`back after ${downtime} ms${epochChanged ? `, new history ${epoch ?? '?'}` : ''}`); });
  client.on('store-registered', (store, { resumed, seq }) => { log.push(`${store} registered (resumed ${resumed}, seq ${seq})`); });
  const state: 'connecting' | 'connected' | 'reconnecting' | 'closed' = client.state;
  log.push(`${state}, session ${client.session}, epoch ${client.welcome.epoch ?? 'none'}, ${client.welcome.durability ?? 'ephemeral'}`);
  try {
    await client.dispatchAndSettle('counter/add', { by: 1 });
  } catch (error) {
    if (error instanceof NotSentError) { const code: 'not-sent' = error.code; log.push(`${code}: ${error.id}`); }
    else if (error instanceof OutcomeUnknownError) log.push(`check the state before retrying ${error.id}`);
    else throw error;
  }
  const store = new Store<Counter>({ name: 'counter', handles: ['counter/*'], initialState: { value: 0 } });
  await store.start({ socketPath, reconnect: false });
  log.push(`registered ${String(store.registered)}, adopted seq ${store.adoptedSeq}, skipped ${store.skipped}`);
  log.push(`${backoffDelay(reconnectPolicy({ jitter: 0 }), 3)} ms, default max ${DEFAULT_RECONNECT.maxDelay} ms`);
  await store.stop();
  await client.close();
  return log;
}

/** Wrong uses of the reconnection API: each line must stay a type error. */
export function wrongReconnects(client: Client, store: Store<Counter>): void {
  // @ts-expect-error reconnect is a boolean or an options object
  void Client.connect({ reconnect: 'always' });
  // @ts-expect-error the backoff's fields are numbers of ms
  void Client.connect({ reconnect: { initialDelay: '50ms' } });
  // @ts-expect-error a 'reconnected' listener gets {attempt, epochChanged, epoch, downtime}
  client.on('reconnected', (info: { attempt: string }) => { void info; });
  // @ts-expect-error skipped is read-only
  store.skipped = 0;
  // @ts-expect-error refusals is read-only
  store.refusals = 0;
  // @ts-expect-error the state is one of four
  const state: 'open' = client.state;
  void state;
}
