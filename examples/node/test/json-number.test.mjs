// Exact JSON numbers (SPEC §16.1, lib/json-number.mjs): parseJSON gives what JSON.parse gives, except that a number
// no double represents faithfully is a JSONNumber keeping its text; jsonEqual and a patch's test compare numbers by
// exact decimal value; canonicalJSON writes a JSONNumber's text back; applyPatch takes a JSONNumber for the number
// it is; and a client applying deltas compares and keeps numbers exactly.
import { test, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import {
  Client, JSONNumber, PatchError, applyPatch, canonicalJSON, diff, encodeFrame, isJSONNumber, jsonEqual, numbersEqual,
  parseJSON,
} from '../fluxbus.mjs';
import { cloneJSON, decimalKey, numberFromText } from '../lib/json-number.mjs';
import { FakeFluxd, LIMITS } from './fakefluxd.mjs';

test('faithful numbers are plain numbers; the others are JSONNumbers that keep their text', () => {
  const plain = ['0', '-0', '1', '1.0', '1e0', '10e-1', '0.1', '1.5e-7', '12.50', '9007199254740992', '1e23', '100000000000000000000000',
    '1.7976931348623157e308', '5e-324', '0.30000000000000004', '-123456789012345', '1E+2'];
  for (const text of plain) {
    const v = numberFromText(text);
    assert.equal(typeof v, 'number', text);
    assert.equal(v, Number(text), text);
  }
  const kept = ['9007199254740993', '0.10000000000000001', '18446744073709551617', '1e400', '-1e400', '1e-400', '99999999999999991611392',
    '1.00000000000000001', '2.4703282292062328e-324', '1e999999999', '123456789.123456789'];
  for (const text of kept) {
    const v = numberFromText(text);
    assert.ok(v instanceof JSONNumber, text);
    assert.equal(v.text, text);
    assert.equal(String(v), text);
    assert.equal(Number(v), Number(text), 'valueOf is the nearest double');
  }
  assert.equal(numberFromText('0.10000000000000001') * 10, 1, 'arithmetic takes the nearest double');
  assert.ok(Object.isFrozen(new JSONNumber('1')));
  assert.throws(() => new JSONNumber('01'), TypeError);
  assert.throws(() => new JSONNumber('1.'), TypeError);
  assert.throws(() => new JSONNumber(1), TypeError);
  assert.ok(isJSONNumber(1) && isJSONNumber(new JSONNumber('1e400')) && !isJSONNumber(NaN) && !isJSONNumber('1'));
});

test('exact decimal equality: the SPEC §16.1 examples', () => {
  const n = (text) => numberFromText(text);
  const equal = [['1', '1.0'], ['1', '1e0'], ['1', '10e-1'], ['-0', '0'], ['0e99', '-0.0'], ['1e400', '10e399'], ['1e400', '1E+400'],
    ['1e23', '100000000000000000000000'], ['9007199254740993', '9.007199254740993e15'], ['18446744073709551617', '18446744073709551617.0'],
    ['1e9999999999999999999999', '10e9999999999999999999998'], ['1e-9999999999999999999999', '0.1e-9999999999999999999998']];
  const unequal = [['9007199254740993', '9007199254740992'], ['0.1', '0.10000000000000001'], ['18446744073709551617', '18446744073709551616'],
    ['1e23', '99999999999999991611392'], ['1e400', '1e401'], ['1e-400', '0'], ['1e9999999999999999999999', '1e9999999999999999999998'], ['1', '-1']];
  for (const [a, b] of equal) {
    assert.ok(numbersEqual(n(a), n(b)), `${a} = ${b}`);
    assert.ok(jsonEqual([n(b)], [n(a)]), `${b} = ${a}`);
    assert.equal(decimalKey(a), decimalKey(b));
  }
  for (const [a, b] of unequal) {
    assert.ok(!numbersEqual(n(a), n(b)), `${a} != ${b}`);
    assert.ok(!jsonEqual({ x: n(b) }, { x: n(a) }), `${b} != ${a}`);
  }
  assert.ok(jsonEqual(new JSONNumber('1.5'), 1.5), 'a JSONNumber made by hand may be faithful');
  assert.ok(!jsonEqual(new JSONNumber('1'), '1') && !jsonEqual(new JSONNumber('1'), true) && !jsonEqual(new JSONNumber('1'), { text: '1' }));
});

test('parseJSON gives what JSON.parse gives for ordinary texts, its exact parser too, and fails where JSON.parse fails', () => {
  const texts = [
    '{"op":"delta","store":"s","patch":[{"op":"add","path":"/a","value":[1,-2.5,true,null,"x"]}]}',
    ' {"__proto__": {"a": 1}, "constructor": 2, "s": "\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00", "e": {}, "l": [] } ',
    '[]', '"s"', '12', '-0', 'true', 'null', '{"a":{"a":{"a":[[[1e5]]]}}}', '{"k":"ä日😀","0":1,"1":2}', '{"a":1,"a":2}',
  ];
  for (const text of texts) {
    assert.deepEqual(parseJSON(text), JSON.parse(text), text);
    // the same text with a long number beside it takes the exact parser: the rest reads the same
    const withLong = `[${text}, 12345678901234567890]`;
    const exact = parseJSON(withLong);
    assert.ok(exact[1] instanceof JSONNumber);
    assert.deepEqual(exact[0], JSON.parse(text), `exact parser: ${text}`);
  }
  const proto = parseJSON('[{"__proto__": {"polluted": 1}}, 1e400]')[0];
  assert.ok(Object.hasOwn(proto, '__proto__') && Object.getPrototypeOf(proto) === Object.prototype && proto.polluted === undefined);
  for (const bad of ['', '{', '[1,]', '{"a":1,}', '01', '"\u0001"', '[1 2]', '-', 'tru', '{"a" 1}', '"abc', '1.', '.5', '1e', '[1e400,]',
    '{"a":1}x', '[1e400] 2', '"\\x"', "{'a':1}", '[NaN]', '[Infinity, 1e400]', '[12345678901234567890', '{"a":"\\ud800\\u00"}']) {
    assert.throws(() => JSON.parse(bad), SyntaxError, bad);
    assert.throws(() => parseJSON(bad), SyntaxError, bad);
  }
});

test('the quick scan passes over long digits inside strings and finds every unfaithful number token', () => {
  const ids = parseJSON('{"id":"12345678901234567890","hash":"3e1234ab","n":1}');
  assert.deepEqual(ids, { id: '12345678901234567890', hash: '3e1234ab', n: 1 });
  for (const text of ['{"a":12345678901234567890}', '{"a": -1e-400}', '[1,\n 9007199254740993]', '{"s":"x","n":1.5e+400}', '[1E999]',
    '{"a":[0.10000000000000001]}', '{"a":"12345678901234567890","b":9007199254740993}', '9007199254740993', ' 1e400 ']) {
    const found = [];
    const walk = (v) => { if (v instanceof JSONNumber) found.push(v.text); else if (v && typeof v === 'object') for (const k of Object.keys(v)) walk(v[k]); };
    walk(parseJSON(text));
    assert.equal(found.length, 1, text);
  }
});

test('canonicalJSON writes a JSONNumber as its text; JSON.stringify as Node allows', () => {
  const doc = parseJSON('{"b":0.10000000000000001,"a":[1e400,9007199254740993,1.5]}');
  assert.equal(canonicalJSON(doc), '{"a":[1e400,9007199254740993,1.5],"b":0.10000000000000001}');
  const rawJSON = /** @type {any} */ (JSON).rawJSON;
  assert.equal(JSON.stringify(doc.b), rawJSON ? '0.10000000000000001' : '0.1');
});

test('applyPatch takes a JSONNumber as the number it is: a scalar, compared exactly, kept as it is', () => {
  const doc = parseJSON('{"n":9007199254740993,"f":0.10000000000000001,"big":1e400}');
  assert.deepEqual(applyPatch(doc, [{ op: 'test', path: '/n', value: parseJSON('9007199254740993.0') }]), doc);
  assert.throws(() => applyPatch(doc, [{ op: 'test', path: '/n', value: 9007199254740992 }]), (e) => e instanceof PatchError && e.code === 'test-failed');
  assert.throws(() => applyPatch(doc, [{ op: 'test', path: '/f', value: 0.1 }]), (e) => e.code === 'test-failed');
  assert.throws(() => applyPatch(doc, [{ op: 'test', path: '/n/text', value: '9007199254740993' }]), (e) => e.code === 'not-found');
  assert.throws(() => applyPatch(doc, [{ op: 'add', path: '/n/text', value: 1 }]), (e) => e.code === 'not-found');
  assert.throws(() => applyPatch(doc, [{ op: 'remove', path: '/big/text' }]), (e) => e.code === 'not-found');
  assert.throws(() => applyPatch(doc.big, [{ op: 'add', path: '/x', value: 1 }]), (e) => e instanceof PatchError);
  const moved = applyPatch(doc, [{ op: 'copy', from: '/n', path: '/c' }, { op: 'move', from: '/big', path: '/m' }]);
  assert.equal(moved.c, doc.n);
  assert.equal(moved.m, doc.big);
  assert.equal(canonicalJSON(moved), '{"c":9007199254740993,"f":0.10000000000000001,"m":1e400,"n":9007199254740993}');
  assert.deepEqual(diff(doc, parseJSON('{"n":9007199254740993.0,"f":1.0000000000000001e-1,"big":10e399}')), [], 'equal numbers: no change');
  assert.deepEqual(diff({ n: 9007199254740992 }, doc).find((op) => op.path === '/n'), { op: 'replace', path: '/n', value: doc.n });
});

test('cloneJSON copies containers and keeps JSONNumbers (structuredClone would not)', () => {
  const doc = parseJSON('{"a":[1,{"n":9007199254740993}],"__proto__":{"x":1e400}}');
  const copy = cloneJSON(doc);
  assert.notEqual(copy.a, doc.a);
  assert.equal(copy.a[1].n, doc.a[1].n);
  assert.ok(Object.hasOwn(copy, '__proto__') && Object.getPrototypeOf(copy) === Object.prototype);
  assert.equal(canonicalJSON(copy), canonicalJSON(doc));
  assert.ok(!(structuredClone(doc).a[1].n instanceof JSONNumber), 'why cloneJSON exists');
});

const cleanups = [];
afterEach(async () => { for (const c of cleanups.splice(0).reverse()) await c(); });

test('a client applying deltas compares and keeps numbers exactly (a test on 2^53 fails against 2^53+1: resubscribe)', async () => {
  const f = await FakeFluxd.start({ limits: { ...LIMITS, deltaHistory: 1048576 }, epoch: 'e1' });
  cleanups.push(() => f.close());
  const client = await Client.connect({ socketPath: f.socketPath, reconnect: false });
  cleanups.push(() => client.close({ timeout: 500 }));
  const peer = await f.accept();
  const raw = (text) => peer.socket.write(encodeFrame(text));
  const subscribing = client.subscribe('nums');
  await peer.expectOp('subscribe');
  peer.send({ op: 'subscribed', store: 'nums', status: 'up', version: 1, deltas: true });
  raw('{"op":"snapshot","store":"nums","version":1,"seq":1,"state":{"n":9007199254740993,"f":0.10000000000000001}}');
  const sub = await subscribing;
  const v1 = await sub.next(5000);
  assert.equal(canonicalJSON(v1.state), '{"f":0.10000000000000001,"n":9007199254740993}');
  raw('{"op":"delta","store":"nums","from":1,"version":2,"seq":2,"patch":[{"op":"test","path":"/n","value":9007199254740993.0},{"op":"test","path":"/f","value":10000000000000001e-17},{"op":"add","path":"/m","value":18446744073709551617}]}');
  const v2 = await sub.next(5000);
  assert.equal(canonicalJSON(v2.state), '{"f":0.10000000000000001,"m":18446744073709551617,"n":9007199254740993}');
  raw('{"op":"delta","store":"nums","from":2,"version":3,"seq":3,"patch":[{"op":"test","path":"/n","value":9007199254740992},{"op":"remove","path":"/m"}]}');
  assert.deepEqual(await peer.expectOp('subscribe'), { op: 'subscribe', store: 'nums', deltas: true }, 'the test failed: whole again');
  assert.deepEqual(client.deltaStats, { applied: 1, resyncs: 1 });
});

test('JSONNumber.isInteger is exact, and a Store handler with handlerState copy keeps JSONNumbers (not {text} objects)', async () => {
  for (const [text, integer] of [['18446744073709551617', true], ['1e400', true], ['1.50000000000000000001', false], ['1e-400', false], ['10000000000000000000000e-5', true]]) {
    assert.equal(new JSONNumber(text).isInteger(), integer, text);
  }
  const { cloneJSON } = await import('../lib/json-number.mjs');
  const state = { big: new JSONNumber('9007199254740993'), list: [new JSONNumber('1e400'), 1] };
  const copy = cloneJSON(state);
  assert.notEqual(copy, state);
  assert.ok(copy.big instanceof JSONNumber && copy.list[0] instanceof JSONNumber);
  assert.equal(canonicalJSON(copy), '{"big":9007199254740993,"list":[1e400,1]}');
});
