// JSON Patch (RFC 6902) and JSON Pointer (RFC 6901), SPEC §16.1: `applyPatch` (atomic, never mutates its input:
// the result shares every subtree the patch did not touch), `getPointer`, pointer parsing and formatting, JSON
// equality, and `diff(from, to)`, which skips subtrees that are the same object (===) and compares arrays by their
// common prefix and suffix, so that a change to one item of a large, structurally shared state costs little.
// Numbers compare by exact decimal value (a JSONNumber, from lib/json-number.mjs, is a number, never a container).
import { JSONNumber, numbersEqual } from './json-number.mjs';

/**
 * A patch or pointer that does not apply (SPEC §16.1). `code` is the category of protocol/vectors/patch.json:
 * invalid-op, invalid-pointer, not-found, index, move-into-child, test-failed, too-deep; `index` is the failing
 * operation's position in the patch.
 */
export class PatchError extends Error {
  /** @param {string} code @param {string} message @param {number} [index] */
  constructor(code, message, index) {
    super(index === undefined ? message : `operation ${index}: ${message}`);
    this.name = 'PatchError';
    this.code = code;
    this.detail = message;
    /** @type {number|undefined} */ this.index = index;
  }
}

const MAX_DEPTH = 64; // SPEC §3.2
const ARRAY_INDEX = /^(0|[1-9][0-9]*)$/;
const hasOwn = (o, k) => Object.prototype.hasOwnProperty.call(o, k);
const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v) && !(v instanceof JSONNumber);
/** An object or array (a JSONNumber is a number). */
const isContainer = (v) => v !== null && typeof v === 'object' && !(v instanceof JSONNumber);
const isNumber = (v) => typeof v === 'number' || v instanceof JSONNumber;
/** Sets a member as an own data property (`__proto__` included, as JSON.parse makes it). */
function setMember(obj, key, value) {
  if (key === '__proto__') Object.defineProperty(obj, key, { value, writable: true, enumerable: true, configurable: true });
  else obj[key] = value;
}

/** Escapes one reference token: `~` → `~0`, `/` → `~1`. @param {string} token @returns {string} */
export function escapeToken(token) {
  return token.includes('~') || token.includes('/') ? token.replace(/~/g, '~0').replace(/\//g, '~1') : token;
}

/** Unescapes one reference token (`~1` → `/`, then `~0` → `~`); a `~` followed by anything else is an error. @param {string} token */
export function unescapeToken(token) {
  if (!token.includes('~')) return token;
  if (/~(?![01])/.test(token)) throw new PatchError('invalid-pointer', `invalid escape in pointer token ${JSON.stringify(token)} (only ~0 and ~1)`);
  return token.replace(/~1/g, '/').replace(/~0/g, '~');
}

/** The reference tokens of a JSON Pointer (`""` → []); throws PatchError if it is not one. @param {string} pointer @returns {string[]} */
export function parsePointer(pointer) {
  if (typeof pointer !== 'string') throw new PatchError('invalid-op', `a pointer is a string, not ${pointer === null ? 'null' : typeof pointer}`);
  if (pointer === '') return [];
  if (pointer[0] !== '/') throw new PatchError('invalid-pointer', `pointer ${JSON.stringify(pointer)} does not start with /`);
  return pointer.slice(1).split('/').map(unescapeToken);
}

/** The JSON Pointer of `tokens`. @param {ReadonlyArray<string|number>} tokens @returns {string} */
export function formatPointer(tokens) {
  let out = '';
  for (const t of tokens) out += '/' + escapeToken(String(t));
  return out;
}

/** Whether `pointer` is a valid JSON Pointer (RFC 6901 syntax). @param {unknown} pointer */
export function isValidPointer(pointer) {
  try { parsePointer(/** @type {string} */ (pointer)); return true; } catch { return false; }
}

/**
 * JSON equality: numbers by exact decimal value (SPEC §16.1: 1 = 1.0 = 1e0, -0 = 0, but 2^53+1 is not 2^53 and
 * a JSONNumber 0.10000000000000001 is not 0.1; a double counts as the decimal its shortest text names), objects
 * regardless of member order, arrays in order. @param {any} a @param {any} b @returns {boolean}
 */
export function jsonEqual(a, b) {
  if (a === b) return true;
  if (isNumber(a) || isNumber(b)) return isNumber(a) && isNumber(b) && numbersEqual(a, b);
  if (a === null || b === null || typeof a !== 'object' || typeof b !== 'object') return false;
  const arr = Array.isArray(a);
  if (arr !== Array.isArray(b)) return false;
  if (arr) {
    if (a.length !== b.length) return false;
    for (let i = 0; i < a.length; i++) if (!jsonEqual(a[i], b[i])) return false;
    return true;
  }
  let n = 0;
  for (const k in a) {
    if (!hasOwn(a, k) || a[k] === undefined) continue;
    n++;
    if (!hasOwn(b, k) || !jsonEqual(a[k], b[k])) return false;
  }
  for (const k in b) if (hasOwn(b, k) && b[k] !== undefined) n--;
  return n === 0;
}

/** An array index token for reading or replacing (0 ≤ index < length). */
function readIndex(token, array, what) {
  if (!ARRAY_INDEX.test(token)) throw new PatchError('index', `${what}: ${JSON.stringify(token)} is not an array index`);
  const i = Number(token);
  if (i >= array.length) throw new PatchError('index', `${what}: index ${i} is out of range (array of ${array.length})`);
  return i;
}

/** The value at `pointer` in `doc`; throws PatchError when there is none. @param {any} doc @param {string} pointer */
export function getPointer(doc, pointer) {
  return valueAt(doc, parsePointer(pointer), pointer);
}

function valueAt(doc, tokens, pointer) {
  let v = doc;
  for (const t of tokens) {
    if (Array.isArray(v)) v = v[readIndex(t, v, `path ${JSON.stringify(pointer)}`)];
    else if (isObject(v) && hasOwn(v, t) && v[t] !== undefined) v = v[t];
    else throw new PatchError('not-found', `path ${JSON.stringify(pointer)}: no value at ${JSON.stringify(t)}`);
  }
  return v;
}

/** Whether `doc` has a value at `pointer` (false for an invalid pointer). @param {any} doc @param {string} pointer */
export function hasPointer(doc, pointer) {
  try { getPointer(doc, pointer); return true; } catch { return false; }
}

function depthOf(v, limit) {
  if (!isContainer(v)) return 0;
  if (limit <= 0) return Infinity;
  let d = 0;
  for (const k in v) if (hasOwn(v, k)) { const c = depthOf(v[k], limit - 1); if (c > d) d = c; if (d >= limit) break; }
  return d + 1;
}

/**
 * Applies a patch (RFC 6902) to `doc` and returns the result; `doc` is never modified, and every subtree the patch
 * does not touch is shared with it (the containers on the way to each change are copied once). All or nothing:
 * throws PatchError (with the failing operation's `index`) and the caller keeps `doc`.
 * @param {any} doc @param {ReadonlyArray<any>} patch @returns {any}
 */
export function applyPatch(doc, patch) {
  if (!Array.isArray(patch)) throw new PatchError('invalid-op', 'a patch is an array of operations');
  if (patch.length === 0) return doc;
  const owned = new Set(); // containers copied by this call: written in place from then on
  let root = doc;
  const own = (v) => {
    if (!isContainer(v) || owned.has(v)) return v;
    const c = Array.isArray(v) ? v.slice() : { ...v };
    owned.add(c);
    return c;
  };
  /**
   * A value about to appear at a second place (`copy`): the containers this call copied inside it are shared from
   * now on, so a later write through either place copies its way down again instead of changing both (and a copy
   * of the root, written into the root, cannot make the document contain itself). Visits only containers this
   * call made.
   */
  const share = (v) => {
    if (!isContainer(v) || !owned.has(v)) return v;
    owned.delete(v);
    if (Array.isArray(v)) for (const c of v) share(c);
    else for (const k in v) if (hasOwn(v, k)) share(v[k]);
    return v;
  };
  /** The parent container of `tokens`, copied (and linked in) all the way down from the root. */
  const parentFor = (tokens, what) => {
    root = own(root);
    let node = root;
    for (let i = 0; i < tokens.length - 1; i++) {
      const t = tokens[i];
      let key;
      if (Array.isArray(node)) key = readIndex(t, node, what);
      else if (isObject(node) && hasOwn(node, t) && node[t] !== undefined) key = t;
      else throw new PatchError('not-found', `${what}: no value at ${JSON.stringify(formatPointer(tokens.slice(0, i + 1)))}`);
      const child = node[key];
      if (!isContainer(child)) throw new PatchError('not-found', `${what}: ${JSON.stringify(formatPointer(tokens.slice(0, i + 1)))} is not a container`);
      const copy = own(child);
      if (copy !== child) setMember(node, key, copy);
      node = copy;
    }
    return node;
  };
  const add = (tokens, value, what) => {
    if (tokens.length === 0) { root = value; return; }
    const parent = parentFor(tokens, what);
    const last = tokens[tokens.length - 1];
    if (Array.isArray(parent)) {
      let i;
      if (last === '-') i = parent.length;
      else {
        if (!ARRAY_INDEX.test(last)) throw new PatchError('index', `${what}: ${JSON.stringify(last)} is not an array index`);
        i = Number(last);
        if (i > parent.length) throw new PatchError('index', `${what}: index ${i} is out of range (array of ${parent.length})`);
      }
      parent.splice(i, 0, value);
    } else if (isObject(parent)) setMember(parent, last, value);
    else throw new PatchError('not-found', `${what}: the parent is not a container`);
  };
  const remove = (tokens, what) => {
    if (tokens.length === 0) throw new PatchError('invalid-op', `${what}: cannot remove the whole document`);
    const parent = parentFor(tokens, what);
    const last = tokens[tokens.length - 1];
    if (Array.isArray(parent)) return parent.splice(readIndex(last, parent, what), 1)[0];
    if (isObject(parent) && hasOwn(parent, last) && parent[last] !== undefined) { const v = parent[last]; delete parent[last]; return v; }
    throw new PatchError('not-found', `${what}: no value to remove at ${JSON.stringify(last)}`);
  };
  const replace = (tokens, value, what) => {
    if (tokens.length === 0) { root = value; return; }
    const parent = parentFor(tokens, what);
    const last = tokens[tokens.length - 1];
    if (Array.isArray(parent)) parent[readIndex(last, parent, what)] = value;
    else if (isObject(parent) && hasOwn(parent, last) && parent[last] !== undefined) setMember(parent, last, value);
    else throw new PatchError('not-found', `${what}: no value to replace at ${JSON.stringify(last)}`);
  };
  /** A value written at `tokens` must keep the document within §3.2's depth (the top-level value has depth 1). */
  const fits = (tokens, value, what) => {
    if (isContainer(value) && tokens.length + depthOf(value, MAX_DEPTH + 1 - tokens.length) > MAX_DEPTH) {
      throw new PatchError('too-deep', `${what}: the result would be nested deeper than ${MAX_DEPTH} levels (SPEC §3.2)`);
    }
    return value;
  };
  for (let index = 0; index < patch.length; index++) {
    const op = patch[index];
    try {
      if (!isObject(op)) throw new PatchError('invalid-op', 'an operation is an object');
      if (typeof op.path !== 'string') throw new PatchError('invalid-op', 'the operation has no "path" string');
      const tokens = parsePointer(op.path);
      const what = `${op.op} ${JSON.stringify(op.path)}`;
      const needValue = () => { if (!hasOwn(op, 'value') || op.value === undefined) throw new PatchError('invalid-op', `${what}: no "value"`); return op.value; };
      const fromTokens = () => { if (typeof op.from !== 'string') throw new PatchError('invalid-op', `${what}: no "from" string`); return parsePointer(op.from); };
      switch (op.op) {
        case 'add': add(tokens, fits(tokens, needValue(), what), what); break;
        case 'remove': remove(tokens, what); break;
        case 'replace': replace(tokens, fits(tokens, needValue(), what), what); break;
        case 'move': {
          const from = fromTokens();
          if (from.length < tokens.length && from.every((t, i) => t === tokens[i])) throw new PatchError('move-into-child', `${what}: cannot move ${JSON.stringify(op.from)} into its own child`);
          if (from.length === tokens.length && from.every((t, i) => t === tokens[i])) { valueAt(root, from, op.from); break; }
          const value = remove(from, `${what} (from)`);
          add(tokens, fits(tokens, value, what), what);
          break;
        }
        case 'copy': add(tokens, fits(tokens, share(valueAt(root, fromTokens(), op.from)), what), what); break;
        case 'test': {
          const value = needValue();
          if (!jsonEqual(valueAt(root, tokens, op.path), value)) throw new PatchError('test-failed', `${what}: the value is not equal`);
          break;
        }
        default: throw new PatchError('invalid-op', `unknown op ${JSON.stringify(op.op)}`);
      }
    } catch (err) {
      if (err instanceof PatchError && err.index === undefined) throw new PatchError(err.code, err.detail, index);
      throw err;
    }
  }
  return root;
}

/**
 * A patch that turns `from` into `to` (JSON values; a member whose value is undefined counts as absent). Subtrees
 * that are the same object in both are skipped without looking inside; arrays are compared by their common prefix
 * and suffix, the elements in between pairwise, then removed or added; objects member by member. So for states
 * that share structure (a reducer that copies only what it changes) the cost follows the change, not the state.
 * @param {any} from @param {any} to @returns {Array<{op: string, path: string, value?: any}>}
 */
export function diff(from, to) {
  const ops = [];
  diffInto(from, to, '', ops);
  return ops;
}

function diffInto(a, b, path, ops) {
  if (a === b) return;
  if (isContainer(a) && isContainer(b)) {
    const arr = Array.isArray(a);
    if (arr === Array.isArray(b)) {
      if (arr) diffArrays(a, b, path, ops); else diffObjects(a, b, path, ops);
      return;
    }
  }
  if (!jsonEqual(a, b)) ops.push({ op: 'replace', path, value: jsonValue(b) });
}

function diffObjects(a, b, path, ops) {
  for (const k in a) {
    if (!hasOwn(a, k) || a[k] === undefined) continue;
    const p = path + '/' + escapeToken(k);
    if (!hasOwn(b, k) || b[k] === undefined) ops.push({ op: 'remove', path: p });
    else diffInto(a[k], b[k], p, ops);
  }
  for (const k in b) {
    if (!hasOwn(b, k) || b[k] === undefined) continue;
    if (!hasOwn(a, k) || a[k] === undefined) ops.push({ op: 'add', path: path + '/' + escapeToken(k), value: jsonValue(b[k]) });
  }
}

const same = (x, y) => x === y || jsonEqual(x, y);

const LOOKAHEAD = 16; // elements looked ahead for an insertion or removal before pairing elements up

function diffArrays(a, b, path, ops) {
  let i = 0; let j = 0; let endA = a.length; let endB = b.length;
  while (i < endA && i < endB && (a[i] === b[i] || same(a[i], b[i]))) i++;
  j = i;
  while (endA > i && endB > j && (a[endA - 1] === b[endB - 1] || same(a[endA - 1], b[endB - 1]))) { endA--; endB--; }
  // between the common prefix and suffix: j is both the index in `b` and in the array as patched so far
  while (i < endA && j < endB) {
    if (a[i] === b[j] || same(a[i], b[j])) { i++; j++; continue; }
    let k = 1;
    while (k <= LOOKAHEAD && i + k < endA && !(a[i + k] === b[j] || same(a[i + k], b[j]))) k++;
    if (k <= LOOKAHEAD && i + k < endA) { // a[i .. i+k) were removed
      for (let n = 0; n < k; n++) ops.push({ op: 'remove', path: `${path}/${j}` });
      i += k;
      continue;
    }
    k = 1;
    while (k <= LOOKAHEAD && j + k < endB && !(a[i] === b[j + k] || same(a[i], b[j + k]))) k++;
    if (k <= LOOKAHEAD && j + k < endB) { // b[j .. j+k) were inserted
      for (let n = 0; n < k; n++, j++) ops.push({ op: 'add', path: `${path}/${j}`, value: jsonValue(b[j]) });
      continue;
    }
    diffInto(a[i], b[j], `${path}/${j}`, ops);
    i++; j++;
  }
  for (; i < endA; i++) ops.push({ op: 'remove', path: `${path}/${j}` });
  for (; j < endB; j++) ops.push({ op: 'add', path: `${path}/${j}`, value: jsonValue(b[j]) });
}

/** undefined (not JSON) as null, as JSON.stringify writes it in an array. */
function jsonValue(v) { return v === undefined ? null : v; }
