// The shared JSON Patch / JSON Pointer cases (protocol/vectors/patch.json, SPEC §16.1) against lib/patch.mjs:
// every `apply` case (the result, or the error category, with the document left exactly as it was), every
// `pointers` case, and every `diffs` pair (apply(from, diff(from, to)) equals to; [] when they are JSON-equal).
// The file is read with exact numbers (parseJSON, as frames are): its numbers compare by exact decimal value.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { REPO } from './helpers.mjs';
import { applyPatch, canonicalJSON, diff, getPointer, jsonEqual, JSONNumber, parseJSON, PatchError } from '../fluxbus.mjs';

const FILE = path.join(REPO, 'protocol', 'vectors', 'patch.json');

test('protocol/vectors/patch.json is there', () => {
  assert.ok(fs.existsSync(FILE), `${FILE} is missing: the shared patch vectors (SPEC §16.1) must be in the repository`);
});

const vectors = fs.existsSync(FILE) ? parseJSON(fs.readFileSync(FILE, 'utf8')) : { apply: [], pointers: [], diffs: [] };
/** A deep copy that keeps JSONNumbers (structuredClone would make them plain objects). */
const clone = (v) => {
  if (v === null || typeof v !== 'object' || v instanceof JSONNumber) return v;
  if (Array.isArray(v)) return v.map(clone);
  const out = {};
  for (const k of Object.keys(v)) Object.defineProperty(out, k, { value: clone(v[k]), writable: true, enumerable: true, configurable: true });
  return out;
};
const deepFreeze = (v) => { if (v !== null && typeof v === 'object' && !Object.isFrozen(v)) { Object.freeze(v); for (const k of Object.keys(v)) deepFreeze(v[k]); } return v; };

for (const c of vectors.apply) {
  test(`apply: ${c.comment}`, () => {
    const before = canonicalJSON(c.doc);
    const doc = deepFreeze(clone(c.doc)); // a frozen document: applying must never write to it
    if ('error' in c) {
      assert.throws(() => applyPatch(doc, c.patch), (e) => e instanceof PatchError && e.code === c.error, `expected error ${c.error}`);
    } else {
      const result = applyPatch(doc, c.patch);
      assert.ok(jsonEqual(result, c.expected), `got ${canonicalJSON(result)}, expected ${canonicalJSON(c.expected)}`);
    }
    assert.equal(canonicalJSON(doc), before, 'the document is left as it was');
  });
}

for (const c of vectors.pointers) {
  test(`pointer: ${c.comment}`, () => {
    if ('error' in c) assert.throws(() => getPointer(c.doc, c.pointer), (e) => e instanceof PatchError && e.code === c.error, `expected error ${c.error}`);
    else assert.ok(jsonEqual(getPointer(c.doc, c.pointer), c.value));
  });
}

for (const c of vectors.diffs) {
  test(`diff: ${c.comment}`, () => {
    const patch = diff(c.from, c.to);
    assert.ok(jsonEqual(applyPatch(c.from, patch), c.to), `the diff ${canonicalJSON(patch)} does not make the target`);
    if (jsonEqual(c.from, c.to)) assert.deepEqual(patch, []);
  });
}
