// The shared framing and envelope vectors (protocol/vectors) against this module's decoder and scanner.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { FrameDecoder, checkEnvelope, EnvelopeError } from '../fluxbus.mjs';
import { REPO } from './helpers.mjs';

const vectors = (name) => JSON.parse(fs.readFileSync(path.join(REPO, 'protocol', 'vectors', name), 'utf8'));

function normalize(events) {
  return events.map((e) => ('frame' in e ? { frame_hex: e.frame.toString('hex') } : e));
}

function expected(c) {
  return c.expect.map((e) => ('frame' in e ? { frame_hex: Buffer.from(e.frame, 'utf8').toString('hex') } : e));
}

function feed(c, chunks) {
  const decoder = new FrameDecoder(c.maxFrame);
  const events = [];
  for (const chunk of chunks) events.push(...decoder.feed(chunk));
  return { events: normalize(events), pending: decoder.pending };
}

for (const c of vectors('framing.json').cases) {
  test(`framing: ${c.name}`, () => {
    const data = Buffer.from(c.input_hex, 'hex');
    const want = { events: expected(c), pending: c.pending };
    assert.deepEqual(feed(c, [data]), want, 'all at once');
    assert.deepEqual(feed(c, [...data].map((b) => Buffer.from([b]))), want, 'byte by byte');
    for (let split = 0; split <= data.length; split++) {
      assert.deepEqual(feed(c, [data.subarray(0, split), data.subarray(split)]), want, `split at ${split}`);
    }
    let seed = 7;
    const random = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed; };
    for (let round = 0; round < 50; round++) {
      const chunks = [];
      for (let i = 0; i < data.length;) { const n = random() % 8; chunks.push(data.subarray(i, i + n)); i += n; }
      assert.deepEqual(feed(c, chunks), want, 'random chunks');
    }
  });
}

const envelope = vectors('envelope.json');
for (const c of envelope.cases) {
  test(`envelope: ${c.name}`, () => {
    const body = 'body' in c ? Buffer.from(c.body, 'utf8') : Buffer.from(c.body_hex, 'hex');
    if (c.expect === 'ok') {
      const result = checkEnvelope(body);
      assert.deepEqual(result.keys, c.keys);
      for (const [key, raw] of Object.entries(c.raw ?? {})) assert.equal(result.raw[key], raw);
    } else {
      assert.throws(() => checkEnvelope(body), (err) => err instanceof EnvelopeError && err.code === c.expect);
    }
  });
}

test('canonicalJSON sorts keys by code point and drops whitespace', async () => {
  const { canonicalJSON } = await import('../fluxbus.mjs');
  assert.equal(canonicalJSON({ b: 1, a: [true, null, 'x/y'], '\u{1F600}': 0, '\uFF21': 0 }),
    '{"a":[true,null,"x/y"],"b":1,"\uFF21":0,"\u{1F600}":0}');
});
