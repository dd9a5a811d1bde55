// Drafts (as Immer's): `produce(base, recipe)` hands `recipe` a Proxy that reads like `base` and records writes by
// copying only the objects and arrays written to (and their parents), then returns the new state, which shares
// every untouched subtree with `base` (=== ), so that `diff(base, next)` (patch.mjs) costs what changed. `base` is
// never modified. Drafts are revoked once `produce` returns: a draft kept and used later throws a TypeError.

const DRAFT = Symbol('fluxbus.draft');
const STATE = Symbol('fluxbus.draft.state');

/**
 * @typedef {{base: any, copy: any, parent: DraftState|undefined, children: Map<string, any>, proxy: any,
 *            array: boolean, scope: {done: boolean}}} DraftState
 */

const hasOwn = (o, k) => Object.prototype.hasOwnProperty.call(o, k);
const draftable = (v) => v !== null && typeof v === 'object' && (Array.isArray(v) || Object.getPrototypeOf(v) === Object.prototype || Object.getPrototypeOf(v) === null);

/** The state of a draft, or undefined for any other value. @returns {DraftState|undefined} */
function stateOf(value) { return value !== null && typeof value === 'object' ? value[DRAFT] : undefined; }

/** Whether `value` is a draft. @param {unknown} value */
export function isDraft(value) { return stateOf(value) !== undefined; }

/** The object or array a draft currently reads from. */
const latest = (s) => s.copy ?? s.base;

/** Marks a draft written: copies its base (shallowly) and, up the chain, its parents'. */
function markWritten(s) {
  if (s.copy) return;
  s.copy = s.array ? s.base.slice() : { ...s.base };
  // children already handed out stay as drafts inside the copy (finalized later)
  for (const [k, child] of s.children) setMember(s.copy, k, child);
  if (s.parent) markWritten(s.parent);
}

function setMember(obj, key, value) {
  if (key === '__proto__') Object.defineProperty(obj, key, { value, writable: true, enumerable: true, configurable: true });
  else obj[key] = value;
}

/** The state behind a trap's target; a draft used after its `produce` returned throws. */
function live(t) {
  const s = t[STATE];
  if (s.scope.done) throw new TypeError('a draft was used after its handler returned (drafts are valid only while it runs)');
  return s;
}

/** One handler for every draft (the draft's state is on its target). */
const traps = {
  get(t, prop, receiver) {
    if (prop === DRAFT) return live(t);
    const s = live(t);
    const source = latest(s);
    if (typeof prop === 'symbol' || !hasOwn(source, prop)) return Reflect.get(source, prop, receiver);
    const value = source[prop];
    if (value === null || typeof value !== 'object' || !draftable(value)) return value;
    if (s.copy && value !== s.base[prop]) return value; // a value written into this draft (a draft, or new): as it is
    // an untouched child of the base: draft it (once) so that writes to it are recorded
    let child = s.children.get(prop);
    if (!child) {
      child = createDraft(value, s, s.scope);
      s.children.set(prop, child);
      if (s.copy) setMember(s.copy, prop, child);
    }
    return child;
  },
  set(t, prop, value) {
    const s = live(t);
    if (typeof prop === 'symbol') return false;
    const source = latest(s);
    if (hasOwn(source, prop) && source[prop] === value) return true;
    markWritten(s);
    if (s.array && prop === 'length') { s.copy.length = value; pruneChildren(s); return true; }
    setMember(s.copy, prop, value);
    if (s.children.get(prop) !== value) s.children.delete(prop);
    return true;
  },
  deleteProperty(t, prop) {
    const s = live(t);
    if (typeof prop === 'symbol') return false;
    if (!hasOwn(latest(s), prop)) return true;
    markWritten(s);
    delete s.copy[prop];
    s.children.delete(prop);
    return true;
  },
  has(t, prop) { return prop === DRAFT || prop in latest(live(t)); },
  ownKeys(t) { return Reflect.ownKeys(latest(live(t))); },
  getOwnPropertyDescriptor(t, prop) {
    const s = live(t);
    const source = latest(s);
    const desc = Reflect.getOwnPropertyDescriptor(source, prop);
    if (!desc) return undefined;
    const lengthOfArray = s.array && prop === 'length';
    return { writable: true, configurable: !lengthOfArray, enumerable: desc.enumerable, value: lengthOfArray ? source.length : s.proxy[prop] };
  },
  defineProperty(t, prop, desc) {
    const s = live(t);
    if (typeof prop === 'symbol' || !('value' in desc)) return false;
    markWritten(s);
    setMember(s.copy, prop, desc.value);
    s.children.delete(prop);
    return true;
  },
  getPrototypeOf(t) { return Object.getPrototypeOf(live(t).base); },
  setPrototypeOf() { return false; },
  preventExtensions() { return false; },
  isExtensible() { return true; },
};

/** @param {any} base @param {DraftState|undefined} parent @param {{done: boolean}} scope */
function createDraft(base, parent, scope) {
  const array = Array.isArray(base);
  /** @type {DraftState} */ const s = { base, copy: undefined, parent, children: new Map(), proxy: undefined, array, scope };
  const target = array ? [] : {};
  target[STATE] = s; // configurable: the traps need not report it
  s.proxy = new Proxy(target, traps);
  return s.proxy;
}

/** After an array's length shrank: children past it are gone. */
function pruneChildren(s) {
  for (const k of [...s.children.keys()]) if (!hasOwn(s.copy, k)) s.children.delete(k);
}

/** The plain value of a draft (or of a value that may hold drafts): what it reads as, sharing what was not written. */
function finalize(value, seen) {
  if (value === null || typeof value !== 'object') return value;
  const s = stateOf(value);
  if (s) {
    if (!s.copy) return s.base; // never written: the base itself, children included (written children mark it)
    if (seen.has(s.copy)) return s.copy;
    seen.add(s.copy);
    const copy = s.copy; const base = s.base;
    if (s.array) {
      for (let i = 0; i < copy.length; i++) {
        const v = copy[i];
        if (v === null || typeof v !== 'object' || (v === base[i] && !isDraft(v))) continue; // untouched element of the base
        const f = finalize(v, seen);
        if (f !== v) copy[i] = f;
      }
    } else {
      for (const k of Object.keys(copy)) {
        const v = copy[k];
        if (v === null || typeof v !== 'object' || (v === base[k] && !isDraft(v))) continue; // untouched member of the base
        const f = finalize(v, seen);
        if (f !== v) setMember(copy, k, f);
      }
    }
    return copy;
  }
  // a new object or array made by the recipe (or a subtree of the base it placed somewhere): it may hold drafts
  if (seen.has(value)) return value;
  seen.add(value);
  for (const k of Object.keys(value)) {
    const v = value[k];
    if (v === null || typeof v !== 'object') continue;
    const f = finalize(v, seen);
    if (f !== v) setMember(value, k, f);
  }
  return value;
}

/**
 * Runs `recipe(draft)` on a draft of `base` and returns the new state: what the recipe returned (the draft, a new
 * value that may hold parts of the draft, or undefined for the draft itself). `base` is not modified; untouched
 * subtrees are the same objects in the result. Works with async recipes (returns a Promise then).
 * @template S @param {S} base @param {(draft: S) => any} recipe @returns {any}
 */
export function produce(base, recipe) {
  if (!draftable(base)) {
    const r = recipe(base);
    return r && typeof r.then === 'function' ? r.then((v) => (v === undefined ? base : v)) : (r === undefined ? base : r);
  }
  const scope = { done: false };
  const root = createDraft(base, undefined, scope);
  const done = (result) => {
    try { return finalize(result === undefined ? root : result, new Set()); } finally { scope.done = true; }
  };
  let result;
  try { result = recipe(root); } catch (err) { scope.done = true; throw err; }
  if (result && typeof result.then === 'function') return result.then(done, (err) => { scope.done = true; throw err; });
  return done(result);
}
