// The strict JSON scanner fluxd applies to every frame body (SPEC §3.2), shared with the vectors in protocol/.

/** The body is not valid protocol JSON (`code` "bad-json") or not an envelope ("bad-message"). */
export class EnvelopeError extends Error {
  /** @param {string} code @param {string} message */
  constructor(code, message) { super(`${code}: ${message}`); this.code = code; }
}

/**
 * Checks a frame body as fluxd does (SPEC §3.2): UTF-8, RFC 8259 grammar, paired surrogate escapes, depth ≤ 64,
 * nothing after the value (else bad-json); then a top-level object without repeated keys (else bad-message).
 * @param {Buffer} body
 * @returns {{keys: string[], raw: Record<string, string>}} top-level keys in order and each value's source text
 */
export function checkEnvelope(body) {
  let text;
  if (body.length >= 3 && body[0] === 0xef && body[1] === 0xbb && body[2] === 0xbf) throw new EnvelopeError('bad-json', 'byte order mark');
  try { text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(body); } catch { throw new EnvelopeError('bad-json', 'invalid UTF-8'); }
  let i = 0;
  const fail = (what) => new EnvelopeError('bad-json', `${what} at ${i}`);
  const ws = () => { while (i < text.length && ' \t\r\n'.includes(text[i])) i++; };
  const hex4 = () => {
    const d = text.slice(i, i + 4);
    if (!/^[0-9a-fA-F]{4}$/.test(d)) throw fail('bad \\u escape');
    i += 4; return parseInt(d, 16);
  };
  const string = () => {
    i++; let out = '';
    for (;;) {
      if (i >= text.length) throw fail('unterminated string');
      const c = text[i++];
      if (c === '"') return out;
      if (c < ' ') throw fail('raw control character');
      if (c !== '\\') { out += c; continue; }
      const e = text[i++];
      const simple = { '"': '"', '\\': '\\', '/': '/', b: '\b', f: '\f', n: '\n', r: '\r', t: '\t' }[e];
      if (simple !== undefined) { out += simple; continue; }
      if (e !== 'u') throw fail('bad escape');
      let code = hex4();
      if (code >= 0xdc00 && code <= 0xdfff) throw fail('unpaired low surrogate');
      if (code >= 0xd800 && code <= 0xdbff) {
        if (text.slice(i, i + 2) !== '\\u') throw fail('unpaired high surrogate');
        i += 2;
        const low = hex4();
        if (low < 0xdc00 || low > 0xdfff) throw fail('high surrogate without low');
        code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
      }
      out += String.fromCodePoint(code);
    }
  };
  const NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;
  /** @param {number} depth @param {Array<[string, number, number]>|null} top */
  const value = (depth, top = null) => {
    if (depth > 64) throw fail('nesting deeper than 64');
    const c = text[i];
    if (c === '{') {
      i++; ws();
      if (text[i] === '}') { i++; return; }
      for (;;) {
        ws();
        if (text[i] !== '"') throw fail('expected a key');
        const key = string(); ws();
        if (text[i++] !== ':') throw fail('expected :');
        ws(); const start = i; value(depth + 1); if (top) top.push([key, start, i]); ws();
        const d = text[i++];
        if (d === '}') return;
        if (d !== ',') throw fail('expected , or }');
      }
    } else if (c === '[') {
      i++; ws();
      if (text[i] === ']') { i++; return; }
      for (;;) {
        ws(); value(depth + 1); ws();
        const d = text[i++];
        if (d === ']') return;
        if (d !== ',') throw fail('expected , or ]');
      }
    } else if (c === '"') string();
    else if (c === '-' || (c >= '0' && c <= '9')) {
      NUMBER.lastIndex = i;
      const m = NUMBER.exec(text);
      if (!m) throw fail('bad number');
      i += m[0].length;
      if (i < text.length && '0123456789.eE+-'.includes(text[i])) throw fail('bad number');
    } else {
      for (const lit of ['true', 'false', 'null']) if (text.startsWith(lit, i)) { i += lit.length; return; }
      throw fail('unexpected character');
    }
  };
  ws();
  /** @type {Array<[string, number, number]>} */ const top = [];
  const isObject = text[i] === '{';
  value(1, isObject ? top : null);
  ws();
  if (i !== text.length) throw fail('bytes after the value');
  if (!isObject) throw new EnvelopeError('bad-message', 'not an object');
  const keys = []; const raw = {};
  for (const [key, start, end] of top) {
    if (Object.prototype.hasOwnProperty.call(raw, key)) throw new EnvelopeError('bad-message', `duplicate key ${key}`);
    keys.push(key); raw[key] = text.slice(start, end);
  }
  return { keys, raw };
}
