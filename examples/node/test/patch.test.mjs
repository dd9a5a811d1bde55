// lib/patch.mjs and lib/draft.mjs beyond the shared vectors: diff/apply round trips on random values (with and
// without shared structure), structural sharing (apply copies only the way to each change; diff of a state that
// shares structure is a small patch), and drafts (the base is never written; untouched subtrees are shared; a
// draft kept past its recipe throws).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { applyPatch, diff, jsonEqual, produce, isDraft, parsePointer, formatPointer, PatchError } from '../fluxbus.mjs';

/** A small deterministic generator (the same cases every run). */
function random(seed) {
  let x = seed;
  const next = (k) => { x = (x * 1103515245 + 12345) % 2147483648; return x % k; };
  const value = (d) => {
    const r = next(d > 3 ? 3 : 6);
    if (r === 0) return next(5);
    if (r === 1) return `s${next(3)}`;
    if (r === 2) return null;
    if (r === 3) return Array.from({ length: next(5) }, () => value(d + 1));
    const o = {}; for (let i = next(4); i > 0; i--) o[`k${next(5)}`] = value(d + 1); return o;
  };
  const mutate = (v) => {
    if (v === null || typeof v !== 'object' || next(4) === 0) return value(2);
    if (Array.isArray(v)) {
      const c = v.slice(); const r = next(4);
      if (r === 0) c.splice(next(c.length + 1), 0, value(2));
      else if (r === 1 && c.length) c.splice(next(c.length), 1 + next(2));
      else if (c.length) { const i = next(c.length); c[i] = mutate(c[i]); }
      return c;
    }
    const c = { ...v }; const keys = Object.keys(c); const r = next(3);
    if (r === 0 || !keys.length) c[`k${next(6)}`] = value(2);
    else if (r === 1) delete c[keys[next(keys.length)]];
    else { const k = keys[next(keys.length)]; c[k] = mutate(c[k]); }
    return c;
  };
  return { next, value, mutate };
}

test('diff then apply gives the target, for 20000 random pairs sharing structure and as deep copies', () => {
  const { next, value, mutate } = random(7);
  for (let t = 0; t < 20000; t++) {
    const a = value(0); let b = a;
    for (let m = 1 + next(4); m > 0; m--) b = mutate(b);
    const before = JSON.stringify(a);
    assert.ok(jsonEqual(applyPatch(a, diff(a, b)), b), `${before} -> ${JSON.stringify(b)}: ${JSON.stringify(diff(a, b))}`);
    assert.ok(jsonEqual(applyPatch(a, diff(a, structuredClone(b))), b));
    assert.equal(JSON.stringify(a), before, 'apply never writes to its input');
  }
});

const todos = (n) => ({ todos: Array.from({ length: n }, (_, i) => ({ id: i, title: `todo ${i}`, done: false })), filter: 'all' });

test('one toggled item of 10,000 is a one-operation patch, whether the new state shares structure or is a copy', () => {
  const s = todos(10000);
  const shared = { ...s, todos: s.todos.map((t) => (t.id === 4321 ? { ...t, done: true } : t)) };
  const expected = [{ op: 'replace', path: '/todos/4321/done', value: true }];
  assert.deepEqual(diff(s, shared), expected);
  const copy = structuredClone(s); copy.todos[4321].done = true;
  assert.deepEqual(diff(s, copy), expected);
  const inserted = { ...s, todos: [...s.todos.slice(0, 10), { id: -1 }, ...s.todos.slice(10, 20), ...s.todos.slice(22)] };
  assert.deepEqual(diff(s, inserted), [{ op: 'add', path: '/todos/10', value: { id: -1 } }, { op: 'remove', path: '/todos/21' }, { op: 'remove', path: '/todos/21' }]);
});

test('apply copies only the containers on the way to each change', () => {
  const s = todos(100);
  const r = applyPatch(s, [{ op: 'replace', path: '/todos/5/done', value: true }, { op: 'add', path: '/todos/6/tag', value: 'x' }]);
  assert.notEqual(r, s); assert.notEqual(r.todos, s.todos);
  assert.equal(r.todos[4], s.todos[4]); assert.equal(r.todos[7], s.todos[7]);
  assert.deepEqual(r.todos[5], { id: 5, title: 'todo 5', done: true });
  assert.equal(s.todos[5].done, false);
  assert.equal(applyPatch(s, []), s, 'an empty patch changes nothing');
  assert.throws(() => applyPatch(s, [{ op: 'replace', path: '/todos/5/done', value: true }, { op: 'test', path: '/filter', value: 'none' }]),
    (e) => e instanceof PatchError && e.code === 'test-failed' && e.index === 1);
  assert.equal(s.todos[5].done, false, 'a patch that fails leaves nothing changed');
});

test('pointers: parse and format escape ~ and /', () => {
  assert.deepEqual(parsePointer('/a~1b/m~0n/-/0'), ['a/b', 'm~n', '-', '0']);
  assert.equal(formatPointer(['a/b', 'm~n', 3]), '/a~1b/m~0n/3');
  assert.deepEqual(parsePointer(''), []);
  assert.throws(() => parsePointer('a'), (e) => e.code === 'invalid-pointer');
  assert.throws(() => parsePointer('/~2'), (e) => e.code === 'invalid-pointer');
});

test('drafts: writes are copy-on-write, the base is untouched, untouched subtrees are shared', () => {
  const s = todos(1000);
  const text = JSON.stringify(s);
  const next = produce(s, (d) => { const t = d.todos.find((x) => x.id === 500); t.done = !t.done; });
  assert.equal(JSON.stringify(s), text);
  assert.equal(next.todos[499], s.todos[499]);
  assert.equal(next.todos[500].done, true);
  assert.deepEqual(diff(s, next), [{ op: 'replace', path: '/todos/500/done', value: true }]);
  assert.equal(produce(s, () => {}), s, 'no write: the base itself');
  const spliced = produce(s, (d) => { d.todos.splice(1, 2); d.todos[0].title = 'x'; d.todos.push({ id: -1 }); delete d.filter; d.extra = [d.todos[5]]; });
  assert.equal(JSON.stringify(s), text);
  assert.ok(jsonEqual(applyPatch(s, diff(s, spliced)), spliced));
  assert.equal(spliced.todos.length, 999); assert.equal(spliced.extra[0], s.todos[7]);
  assert.ok(!isDraft(spliced.extra[0]) && !isDraft(spliced.todos[0]), 'no draft is left in the result');
  const returned = produce(s, (d) => ({ ...d, todos: [...d.todos.slice(0, 2), d.todos[3]] }));
  assert.deepEqual(returned.todos, [s.todos[0], s.todos[1], s.todos[3]]);
  assert.equal(returned.todos[2], s.todos[3], 'a draft never written finalizes to its base');
  let kept; produce(s, (d) => { kept = d.todos; });
  assert.throws(() => kept[0], TypeError, 'a draft used after its recipe throws');
});

test('drafts: async recipes, arrays methods, JSON.stringify of a draft', async () => {
  const s = { list: [3, 1, 2], nested: { a: [{ v: 1 }] } };
  const next = await produce(s, async (d) => { await null; d.list.sort(); d.nested.a[0].v++; d.nested.a.unshift({ v: 0 }); assert.equal(JSON.stringify(d.list), '[1,2,3]'); });
  assert.deepEqual(next, { list: [1, 2, 3], nested: { a: [{ v: 0 }, { v: 2 }] } });
  assert.deepEqual(s, { list: [3, 1, 2], nested: { a: [{ v: 1 }] } });
});

test('copy: a value copied after a write to its source is a copy, not the same container (later writes change one place)', () => {
  const doc = { a: { x: 1 }, list: [[1]] };
  const out = applyPatch(doc, [
    { op: 'add', path: '/a/y', value: 2 },          // /a is now a container this call made
    { op: 'copy', from: '/a', path: '/b' },
    { op: 'add', path: '/b/z', value: 3 },          // through the copy ...
    { op: 'replace', path: '/a/x', value: 9 },      // ... and through the source
    { op: 'add', path: '/list/0/-', value: 2 },
    { op: 'copy', from: '/list/0', path: '/list/-' },
    { op: 'add', path: '/list/1/-', value: 3 },
  ]);
  assert.deepEqual(out, { a: { x: 9, y: 2 }, b: { x: 1, y: 2, z: 3 }, list: [[1, 2], [1, 2, 3]] });
  assert.deepEqual(doc, { a: { x: 1 }, list: [[1]] });
});

test('copy of the whole document into itself holds the document as it was, not itself', () => {
  const out = applyPatch({ n: 1 }, [{ op: 'add', path: '/m', value: 2 }, { op: 'copy', from: '', path: '/self' }]);
  assert.deepEqual(out, { n: 1, m: 2, self: { n: 1, m: 2 } });
  assert.notEqual(out.self, out);
  assert.doesNotThrow(() => JSON.stringify(out));
});
