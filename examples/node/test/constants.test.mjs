// The constants module against protocol/: ops by direction against schemas/index.json, roles, store statuses and
// result statuses against the schemas' enums, the name rule against the schemas' patterns, and the error codes
// against the first column of SPEC.md §11's table (and the error schema's list); every code has its class.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import {
  PROTOCOL_VERSION, Ops, OpsByDirection, Roles, StoreStatus, ResultStatus, ErrorCodes, LocalErrorCodes, NAME_PATTERN, Limits,
  ErrorClasses, FluxError, TimeoutError, HandshakeTimeoutError, UnsupportedVersionError, NoHandlerError, errorFromFrame,
  errorFromResult, StoreRejectedError, StoreUnavailableError, ShuttingDownError,
} from '../fluxbus.mjs';
import * as api from '../fluxbus.mjs';
import { REPO } from './helpers.mjs';

const schemas = path.join(REPO, 'protocol', 'schemas');
const schema = (file) => JSON.parse(fs.readFileSync(path.join(schemas, file), 'utf8'));
const index = schema('index.json');
const sorted = (xs) => [...xs].sort();

/** The codes in the first column of the table in SPEC.md §11 (rows `| \`code\` | ... |`). */
function specErrorCodes() {
  const spec = fs.readFileSync(path.join(REPO, 'protocol', 'SPEC.md'), 'utf8');
  const start = spec.search(/^## 11\. /m);
  assert.ok(start >= 0, 'SPEC.md has a section 11');
  const end = spec.indexOf('\n## ', start + 1);
  const section = spec.slice(start, end < 0 ? undefined : end);
  const codes = [];
  for (const line of section.split('\n')) {
    const m = /^\|\s*`([^`]+)`\s*\|/.exec(line);
    if (m) codes.push(m[1]);
  }
  return codes;
}

test('the protocol version is index.json\'s', () => assert.equal(PROTOCOL_VERSION, index.protocol));

test('ops by direction are those of schemas/index.json', () => {
  for (const direction of ['c2d', 's2d', 'd2c']) {
    const want = sorted(new Set(index.schemas.filter((s) => s.direction === direction).map((s) => s.op)));
    assert.deepEqual(sorted(OpsByDirection[direction]), want, direction);
  }
  assert.deepEqual(Object.keys(OpsByDirection).sort(), sorted(new Set(index.schemas.map((s) => s.direction))));
  assert.deepEqual(sorted(Object.values(Ops)), sorted(new Set(index.schemas.map((s) => s.op))));
  for (const [name, op] of Object.entries(Ops)) assert.equal(name, op.toUpperCase().replace(/-/g, '_'));
});

test('roles, store statuses and result statuses are the schemas\' enums', () => {
  assert.deepEqual(sorted(Object.values(Roles)), sorted(schema('hello.c2d.schema.json').properties.role.enum));
  assert.deepEqual(sorted(Object.values(StoreStatus)), sorted(schema('subscribed.d2c.schema.json').properties.status.enum));
  assert.deepEqual(sorted(Object.values(ResultStatus)), sorted(schema('settled.d2c.schema.json').properties.results.items.properties.status.enum));
});

test('the name rule is the schemas\' (characters and byte lengths)', () => {
  const chars = NAME_PATTERN.source.replace(/^\^|\+\$$/g, '');
  assert.equal(schema('subscribe.c2d.schema.json').properties.store.pattern, `^${chars}{1,${Limits.STORE_NAME_BYTES}}$`);
  assert.equal(schema('dispatch.c2d.schema.json').properties.type.pattern, `^${chars}{1,${Limits.ACTION_TYPE_BYTES}}$`);
  assert.equal(schema('dispatch.c2d.schema.json').properties.id.maxLength, Limits.ID_BYTES);
});

test('error codes are the first column of SPEC §11 and the error schema\'s examples', () => {
  const spec = specErrorCodes();
  assert.ok(spec.length >= 20, `parsed ${spec.length} codes from SPEC §11`);
  assert.deepEqual(sorted(Object.values(ErrorCodes)), sorted(spec));
  assert.deepEqual(sorted(Object.values(ErrorCodes)), sorted(schema('error.d2c.schema.json').properties.code.examples));
  for (const [name, code] of Object.entries(ErrorCodes)) assert.equal(name, code.toUpperCase().replace(/-/g, '_'));
  for (const code of Object.values(LocalErrorCodes)) {
    if (code !== ErrorCodes.TIMEOUT) assert.ok(!spec.includes(code), `local code ${code} is not a protocol code`);
  }
});

test('one error class per SPEC §11 code; unknown codes map to FluxError', () => {
  assert.deepEqual(sorted(Object.keys(ErrorClasses)), sorted(specErrorCodes()));
  const classes = new Set();
  for (const [code, Class] of Object.entries(ErrorClasses)) {
    assert.equal(Class.code, code);
    assert.ok(!classes.has(Class), `${Class.name} is used for one code only`);
    classes.add(Class);
    assert.equal(api[Class.name], Class, `${Class.name} is exported by fluxbus.mjs`);
    assert.match(Class.name, /^[A-Z][A-Za-z]+Error$/);
    const error = errorFromFrame({ op: 'error', code, message: 'from fluxd', ref: 'r-1', fatal: code === 'too-large' });
    assert.ok(error instanceof Class && error instanceof FluxError && error instanceof Error, code);
    assert.equal(error.name, Class.name);
    assert.equal(error.code, code);
    assert.equal(error.detail, 'from fluxd');
    assert.equal(error.ref, 'r-1');
    assert.equal(error.fatal, code === 'too-large');
    assert.ok(error.message.includes('from fluxd'), error.message);
  }
  const unknown = errorFromFrame({ op: 'error', code: 'from-the-future', message: 'new', fatal: true });
  assert.equal(unknown.constructor, FluxError);
  assert.equal(unknown.code, 'from-the-future');
  assert.equal(unknown.fatal, true);
  assert.equal(unknown.message, 'from-the-future: new');
  assert.equal(FluxError.fromFrame({ code: 'no-handler', message: 'x' }).constructor, NoHandlerError);
});

test('fluxd\'s timeout is a TimeoutError too; unsupported-version keeps supported', () => {
  const error = errorFromFrame({ op: 'error', code: 'timeout', message: 'no hello within 5000 ms', fatal: true });
  assert.ok(error instanceof HandshakeTimeoutError && error instanceof TimeoutError);
  assert.equal(error.fatal, true);
  const version = errorFromFrame({ op: 'error', code: 'unsupported-version', message: 'protocol 2', supported: [1], fatal: true });
  assert.ok(version instanceof UnsupportedVersionError);
  assert.deepEqual(version.supported, [1]);
});

test('settlement results map to StoreRejectedError and the unavailable codes\' classes', () => {
  assert.equal(errorFromResult({ store: 'todos', status: 'done', version: 3 }), undefined);
  const rejected = errorFromResult({ store: 'todos', status: 'rejected', error: { code: 'todo/empty-title', message: 'a todo needs a title', field: 'title' } }, 'todo/add');
  assert.ok(rejected instanceof StoreRejectedError && rejected instanceof FluxError);
  assert.equal(rejected.code, 'todo/empty-title');
  assert.equal(rejected.detail, 'a todo needs a title');
  assert.equal(rejected.store, 'todos');
  assert.equal(rejected.type, 'todo/add');
  assert.deepEqual(rejected.details, { field: 'title' });
  assert.equal(rejected.message, "a todo needs a title (todo/empty-title, store 'todos')");
  assert.equal(rejected.fatal, false);
  const bare = errorFromResult({ store: 'todos', status: 'rejected', error: { code: 'todo/nope' } }, 'todo/add');
  assert.equal(bare.message, "store 'todos' rejected todo/add (todo/nope)");
  const unavailable = errorFromResult({ store: 'slow', status: 'unavailable', error: { code: 'store-unavailable', message: 'down past queueTimeout' } });
  assert.ok(unavailable instanceof StoreUnavailableError);
  assert.equal(unavailable.store, 'slow');
  assert.ok(errorFromResult({ store: 's', status: 'unavailable', error: { code: 'shutting-down' } }) instanceof ShuttingDownError);
});
