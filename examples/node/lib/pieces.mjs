// Stores whose state is larger than one frame (SPEC §16.6): whether a frame fits `welcome.limits.maxFrame`; the
// pieces a state is published in when fluxd retains nothing for the store and one `state` frame cannot hold it (an
// empty container of the root's type, then patches of `add`s, in the order canonicalJSON writes members, each
// patch fitting in a frame; a member too large for one `add` is added empty and filled the same way); and the wait
// after a refused registration (100 ms doubling up to 30 s, each a random time between half of that and all of it).
import { StateTooLargeError } from './errors.mjs';
import { canonicalJSON, canonicalKeys } from './canonical.mjs';
import { escapeToken, applyPatch } from './patch.mjs';
import { parseJSON } from './json-number.mjs';

/** The first wait after a refused registration and the longest, in ms (SPEC §16.6). */
export const REFUSAL_FIRST_DELAY = 100;
export const REFUSAL_MAX_DELAY = 30000;
/** Digits of the largest version a `base` can hold (2^53 - 1): the room a piece's envelope keeps for it. */
const VERSION_DIGITS = 16;

const bytes = (text) => Buffer.byteLength(text, 'utf8');

/** Whether a frame body of `length` bytes is taken by a fluxd whose `maxFrame` is `maxFrame` (undefined: no limit). */
export function fits(length, maxFrame) { return !(Number.isInteger(maxFrame) && maxFrame > 0) || length <= maxFrame; }

/**
 * The wait in ms after the `refusals`-th refused registration in a row: d = min(`longest`, `first` × 2^(n−1)),
 * then a random time between d/2 and d.
 * @param {number} refusals @param {() => number} [random] @param {{first?: number, longest?: number}} [options]
 */
export function refusalDelay(refusals, random = Math.random, { first = REFUSAL_FIRST_DELAY, longest = REFUSAL_MAX_DELAY } = {}) {
  const ceiling = Math.min(longest, first * 2 ** Math.min(Math.max(0, refusals - 1), 64));
  return ceiling * (0.5 + 0.5 * random());
}

/** The body length of the `state` frame that publishes `encoded` (canonical JSON) for `store`. */
export function stateFrameLength(store, encoded) { return bytes(`{"op":"state","store":${JSON.stringify(store)},"state":`) + bytes(encoded) + 1; }

/** The `patch` frame body the store sends for `patch` (encoded) from version `base`. */
export function patchFrame(store, patch, base) { return `{"op":"patch","store":${JSON.stringify(store)},"patch":${patch},"base":${base}}`; }

/** A state cut into pieces: `root` (`{}` or `[]`) goes as `state`, then each of `patches` (encoded) as a `patch`. */
export class Pieces {
  /** @param {string} root @param {string[]} patches */
  constructor(root, patches) { this.root = root; this.patches = patches; }
  /** The state the root and the first `count` patches make (what fluxd retains after them). @param {number} count */
  stateAfter(count) {
    let state = parseJSON(this.root);
    for (const patch of this.patches.slice(0, count)) state = applyPatch(state, parseJSON(patch));
    return state;
  }
}

const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);

/**
 * The pieces that publish `state` (an object or array) for `store` in frames of at most `maxFrame` bytes. Throws
 * StateTooLargeError when it cannot be done: a root that is not an object or array, or a string or number too
 * large for a frame even alone. @param {any} state @param {string} store @param {number} maxFrame @returns {Pieces}
 */
export function splitState(state, store, maxFrame) {
  let root;
  if (Array.isArray(state)) root = '[]';
  else if (isObject(state)) root = '{}';
  else throw new StateTooLargeError(store, `store '${store}': its state is a single ${state === null ? 'null' : typeof state} larger than one frame (${maxFrame} bytes, fluxd's maxFrame): it cannot be published in pieces`);
  const overhead = bytes(patchFrame(store, '', 10 ** VERSION_DIGITS - 1));
  const room = maxFrame - overhead - 2; // what one operation may take inside "[" and "]"
  if (room <= 0 || stateFrameLength(store, root) > maxFrame) {
    throw new StateTooLargeError(store, `store '${store}': fluxd's maxFrame (${maxFrame} bytes) leaves no room for a piece of its state`);
  }
  /** @type {{text: string, size: number}[]} */ const ops = [];
  const addOp = (path, value) => { const text = `{"op":"add","path":${JSON.stringify(path)},"value":${value}}`; return { text, size: bytes(text) }; };
  const add = (addPath, refPath, value) => {
    const op = addOp(addPath, canonicalJSON(value));
    if (op.size <= room) { ops.push(op); return; }
    const container = (empty) => {
      const first = addOp(addPath, empty);
      if (first.size > room) throw new StateTooLargeError(store, `store '${store}': even an empty value at ${JSON.stringify(refPath)} does not fit in one frame (fluxd's maxFrame)`, refPath);
      ops.push(first);
    };
    if (Array.isArray(value)) {
      container('[]');
      value.forEach((item, i) => add(`${refPath}/-`, `${refPath}/${i}`, item));
    } else if (isObject(value)) {
      container('{}');
      for (const key of canonicalKeys(value)) { const child = `${refPath}/${escapeToken(key)}`; add(child, child, value[key]); }
    } else {
      throw new StateTooLargeError(store, `store '${store}': the value at ${JSON.stringify(refPath)} (${op.size} bytes with its add) does not fit in one frame (${maxFrame} bytes, fluxd's maxFrame), so the state cannot be published; keep single strings and numbers smaller`, refPath);
    }
  };
  if (Array.isArray(state)) state.forEach((item, i) => add('/-', `/${i}`, item));
  else for (const key of canonicalKeys(state)) { const path = `/${escapeToken(key)}`; add(path, path, state[key]); }
  /** @type {string[]} */ const patches = [];
  let current = []; let size = 2;
  for (const op of ops) {
    const extra = op.size + (current.length ? 1 : 0);
    if (current.length && size + extra > room + 2) { patches.push(`[${current.join(',')}]`); current = []; size = 2 + op.size; } else size += extra;
    current.push(op.text);
  }
  if (current.length) patches.push(`[${current.join(',')}]`);
  return new Pieces(root, patches);
}
