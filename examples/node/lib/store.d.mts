// Types of store.mjs: store workers.
import type { CallOptions, Client } from './client.mjs';
import type { ReconnectOptions } from './reconnect.mjs';
import type { ActiveQuery, QuerySet } from './query-set.mjs';

/** What a store does with an action its patterns match but no handler takes. */
export type Unhandled = 'reject' | 'ignore';
export declare const Unhandled: { readonly REJECT: 'reject'; readonly IGNORE: 'ignore' };

/** What a handler gets as `state`: a draft (default), the store's state itself (frozen), or a deep copy. */
export type HandlerState = 'draft' | 'shared' | 'copy';
export declare const HandlerState: { readonly DRAFT: 'draft'; readonly SHARED: 'shared'; readonly COPY: 'copy' };

/** Thrown by a handler to reject an action with this code, message and details, unchanged. */
export declare class Reject extends Error {
  constructor(code: string, message?: string, details?: Record<string, unknown>);
  code: string;
  detail: string;
  details: Record<string, unknown>;
  errorObject(): { code: string; message?: string; [field: string]: unknown };
}

export interface ActionContext {
  seq: number;
  type: string;
  origin: number;
  cause?: number;
  redelivered: boolean;
  /** A follow-up action, sent after the answer with `cause` = this action's seq. */
  dispatch(type: string, payload?: unknown): void;
}

/** Returns the new state (or undefined / the same state for no change); may be async. */
export type Handler<S, P = any> = (this: Store<S>, state: S, payload: P, ctx: ActionContext) => S | undefined | void | Promise<S | undefined | void>;

export interface ErrorContext {
  store: string;
  type?: string;
  seq?: number;
  /** A refused registration (SPEC §16.6): refusals in a row, and the ms the store waits before registering again. */
  refusals?: number;
  retryIn?: number;
}

/** A payload field's type in a shape: `?` at the end = the field may be absent. */
export type PayloadFieldType = `${'string' | 'number' | 'integer' | 'boolean' | 'object' | 'array' | 'any'}${'' | '?'}`;
/** What a handler expects of the payload: a shape, or a function returning the problem in words. */
export type PayloadCheck = { [field: string]: PayloadFieldType } | ((payload: any) => string | undefined | null | void);
export interface HandlerOptions {
  /** Checked before the handler runs; a payload that fails is rejected with `store/bad-payload`. */
  payload?: PayloadCheck;
}

export interface StoreOptions<S> {
  name?: string;
  handles?: string[];
  waitFor?: string[];
  initialState?: S;
  queryDeltas?: boolean;
  /** 'reject' (default): store/unhandled-action naming the type and the handled types; 'ignore': done, no change. */
  unhandled?: Unhandled;
  onError?: (error: unknown, context: ErrorContext) => void;
  /** 'draft' (default): change the draft in place or return a new state; 'shared': the frozen state, return a new one; 'copy': a deep copy. */
  handlerState?: HandlerState;
  /** Send changes as JSON Patches to a fluxd that speaks SPEC §16 (default true); false = whole states. */
  patches?: boolean;
}

export interface StartOptions {
  socketPath?: string;
  clientName?: string;
  heartbeat?: boolean;
  expectedServerUid?: number;
  /** ms for connecting and registering together (default 30000; null = none). */
  timeout?: number | null;
  maxWriteQueue?: number;
  /** Reconnect and register again after a lost connection (default true); false = off; an object sets the backoff. */
  reconnect?: boolean | ReconnectOptions;
}

export declare class Store<S = any> {
  constructor(options?: StoreOptions<S>);
  name: string;
  handles: string[];
  waitFor: string[];
  initialState: S | undefined;
  queryDeltas: boolean;
  unhandled: Unhandled;
  handlerState: HandlerState;
  patches: boolean;
  /** Changes sent as patches and as whole states. */
  readonly sent: { patches: number; states: number };
  state: S;
  version: number;
  queries: ActiveQuery[];
  readonly querySet: QuerySet;
  client: Client | undefined;
  /** Actions answered `done` without running: the adopted snapshot already included them (SPEC §15.3). */
  readonly skipped: number;
  /** The seq of the snapshot adopted at the last registration: actions up to it are skipped. */
  readonly adoptedSeq: number;
  /** Whether the store is registered on a live connection (false while its client reconnects). */
  readonly registered: boolean;
  /** Refused registrations in a row (SPEC §16.6); 0 again once a registration succeeds. */
  readonly refusals: number;
  on<P = any>(pattern: string, handler: Handler<S, P>, options?: HandlerOptions): this;
  onQueries(queries: ActiveQuery[]): void;
  onError(error: unknown, context: ErrorContext): void;
  handlerFor(type: string): Handler<S> | undefined;
  start(options?: StartOptions): Promise<{ resumed: boolean }>;
  publish(state: S): void;
  /** Publishes the change `recipe` makes to a draft of the state (as a patch). */
  update(recipe: (draft: S) => S | undefined | void): void;
  stop(options?: CallOptions): Promise<void>;
}
