// Exact JSON numbers (SPEC §16.1): a patch's `test` compares numbers by their exact decimal value, whatever their
// spelling (1 = 1.0 = 1e0 = 10e-1, -0 = 0), never through a double (9007199254740993 is not 9007199254740992,
// 0.10000000000000001 is not 0.1). JSON.parse rounds every number to a double and (before Node 21's source text
// access) cannot say what the text was, so frames are read with `parseJSON`: a number is a plain `number` when
// that is faithful (the double's shortest text, String(n), has the value the JSON text has: always so for up to 15
// significant digits in the double's normal range, and for every number a program writes), else a `JSONNumber`
// that keeps its text. Ordinary frames take JSON.parse itself: a quick scan finds no number token that could be
// unfaithful (16 or more digits and dots in a row, or an exponent of 3 or more digits; a false alarm only costs
// the exact parser, about 2.5 times JSON.parse's time).

const NUMBER_TEXT = /^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?$/;
const rawJSON = /** @type {any} */ (JSON).rawJSON;

/**
 * A JSON number no double represents faithfully (`0.10000000000000001`, `9007199254740993`, `1e400`), kept with
 * its text. `valueOf()` is the nearest double (so `n + 1`, `n > 2` and `Number(n)` work), `toString()` the text;
 * `canonicalJSON` writes the text back exactly, and so does `JSON.stringify` on Node 21+ (JSON.rawJSON); on older
 * Node JSON.stringify writes the nearest double (null beyond its range, as for Infinity). Compare with
 * `jsonEqual` (exact), not `===`.
 */
export class JSONNumber {
  /** @param {string} text a JSON number (RFC 8259 grammar) */
  constructor(text) {
    if (typeof text !== 'string' || !NUMBER_TEXT.test(text)) throw new TypeError(`not a JSON number: ${JSON.stringify(text)}`);
    /** @readonly */ this.text = text;
    Object.freeze(this);
  }
  /** The nearest double (±Infinity beyond the double's range). */
  valueOf() { return Number(this.text); }
  /** Whether its exact value is an integer (`1e400` and `18446744073709551617` are; `1.5` and `1e-400` are not). */
  isInteger() {
    const key = decimalKey(this.text);
    return key === '0' || !key.slice(key.indexOf('e') + 1).startsWith('-');
  }
  toString() { return this.text; }
  toJSON() { return rawJSON ? rawJSON(this.text) : Number(this.text); }
  [Symbol.for('nodejs.util.inspect.custom')]() { return `JSONNumber(${this.text})`; }
}

/** Whether `value` is a JSON number here: a finite `number` or a JSONNumber. @param {unknown} value */
export function isJSONNumber(value) {
  return (typeof value === 'number' && Number.isFinite(value)) || value instanceof JSONNumber;
}

/**
 * A deep copy of a JSON value that keeps JSONNumbers (frozen, shared) as they are: structuredClone would make each
 * a plain object `{text}`. `__proto__` members stay own members. @template T @param {T} value @returns {T}
 */
export function cloneJSON(value) {
  if (value === null || typeof value !== 'object' || value instanceof JSONNumber) return value;
  if (Array.isArray(value)) return /** @type {any} */ (value.map(cloneJSON));
  const out = {};
  for (const key of Object.keys(value)) {
    const child = cloneJSON(/** @type {any} */ (value)[key]);
    if (key === '__proto__') Object.defineProperty(out, key, { value: child, writable: true, enumerable: true, configurable: true });
    else /** @type {any} */ (out)[key] = child;
  }
  return /** @type {any} */ (out);
}

// -- exact decimal values ----------------------------------------------------------------------------------------

const LOOSE = /^(-?)([0-9]+)(?:\.([0-9]*))?(?:[eE]([+-]?)([0-9]+))?$/; // also String(n): 1e+21, 5e-324

/** `±digits + n` in decimal text, for a canonical magnitude `digits` of more than 15 digits and a small `n`. */
function addToLong(negative, digits, n) {
  const head = digits.slice(0, -15);
  let tail = Number(digits.slice(-15));
  let next = head;
  if (n === 0 || (n < 0) === negative) {
    tail += Math.abs(n);
    if (tail >= 1e15) {
      tail -= 1e15;
      const rest = head.replace(/9*$/, '');
      next = (rest ? rest.slice(0, -1) + String(Number(rest.at(-1)) + 1) : '1') + '0'.repeat(head.length - rest.length);
    }
  } else {
    tail -= Math.abs(n);
    if (tail < 0) {
      tail += 1e15;
      const rest = head.replace(/0*$/, '');
      next = rest.slice(0, -1) + String(Number(rest.at(-1)) - 1) + '9'.repeat(head.length - rest.length);
    }
  }
  const magnitude = (next + String(tail).padStart(15, '0')).replace(/^0+/, '');
  return magnitude === '' ? '0' : (negative ? '-' : '') + magnitude;
}

/**
 * The exact decimal value of a number text as one string: sign, significant digits, `e`, the exponent of the
 * last digit (`"0"` for zero). Two texts have equal values exactly when their keys are equal; an exponent is
 * never expanded (`1e999999999999999999999` costs what its text costs). @param {string} text @returns {string}
 */
export function decimalKey(text) {
  const m = LOOSE.exec(text);
  if (!m) throw new TypeError(`not a number: ${JSON.stringify(text)}`);
  const [, sign, whole, fraction = '', expSign, expText = '0'] = m;
  const mantissa = (whole + fraction).replace(/^0+/, '');
  const digits = mantissa.replace(/0+$/, '');
  if (digits === '') return '0';
  const shift = mantissa.length - digits.length - fraction.length; // value = digits × 10^(exponent + shift)
  const expDigits = expText.replace(/^0+/, '');
  const expNegative = expSign === '-' && expDigits !== '';
  let exponent;
  if (expDigits.length <= 15) exponent = String((expNegative ? -Number(expDigits) : Number(expDigits)) + shift);
  else exponent = addToLong(expNegative, expDigits, shift);
  return `${sign}${digits}e${exponent}`;
}

/** The text a number stands for: a JSONNumber's own, a double's shortest (String(n)). */
function textOf(v) { return typeof v === 'number' ? String(v) : v.text; }

/**
 * Whether two numbers (`number` or JSONNumber) have the same exact decimal value (SPEC §16.1). A double stands for
 * the decimal its shortest text names (`0.1`), so two doubles are equal exactly when they are `===`.
 * @param {number|JSONNumber} a @param {number|JSONNumber} b
 */
export function numbersEqual(a, b) {
  if (typeof a === 'number' && typeof b === 'number') return a === b;
  const x = textOf(a); const y = textOf(b);
  if (x === y) return true;
  if (!NUMBERISH.test(x) || !NUMBERISH.test(y)) return false; // NaN, Infinity: not JSON
  return decimalKey(x) === decimalKey(y);
}
const NUMBERISH = /^-?[0-9]/;

// -- parsing -----------------------------------------------------------------------------------------------------

/** A number text as a `number` when faithful, else a JSONNumber. @param {string} text */
export function numberFromText(text) {
  const value = Number(text);
  if (text.length <= 15 && !text.includes('e') && !text.includes('E')) return value; // ≤ 15 digits, normal range
  const shortest = String(value);
  if (shortest === text) return value; // written by a shortest round-trip writer: the common case
  if (Number.isFinite(value) && decimalKey(shortest) === decimalKey(text)) return value;
  return new JSONNumber(text);
}

// Where a number token might not be faithful: 16 or more digits and dots in a row, or a digit, e/E and an exponent of
// 3 or more digits. Spelled out so that V8 scans with a Boyer-Moore skip (a fraction of JSON.parse's time); a match
// inside a string (an id of 20 digits, a hex hash) is passed over after a look at what precedes it.
const LONG_DIGITS = new RegExp('[0-9.]'.repeat(16), 'g');
const LONG_EXPONENT = /[0-9][eE][+-]?[0-9][0-9][0-9]/g;

/** Whether the match at `at` lies in a number token: back over number characters and whitespace, then `:`, `,`, `[` or the start. */
function inNumberToken(text, at) {
  let j = at - 1;
  for (; j >= 0; j--) {
    const c = text.charCodeAt(j);
    if (!((c >= 48 && c <= 57) || c === 46 || c === 101 || c === 69 || c === 43 || c === 45)) break; // 0-9 . e E + -
  }
  for (; j >= 0; j--) {
    const c = text.charCodeAt(j);
    if (c !== 32 && c !== 10 && c !== 13 && c !== 9) break;
  }
  if (j < 0) return true;
  const c = text.charCodeAt(j);
  return c === 58 || c === 44 || c === 91; // : , [
}

/** Whether `text` may hold a number token that is not faithful (a false alarm only costs the exact parser). */
function mayBeUnfaithful(text) {
  LONG_DIGITS.lastIndex = 0;
  for (let m = LONG_DIGITS.exec(text); m !== null; m = LONG_DIGITS.exec(text)) if (inNumberToken(text, m.index)) return true;
  LONG_EXPONENT.lastIndex = 0;
  for (let m = LONG_EXPONENT.exec(text); m !== null; m = LONG_EXPONENT.exec(text)) if (inNumberToken(text, m.index)) return true;
  return false;
}

const TOP_LEVEL_NUMBER = /^[ \t\n\r]*-?[0-9]/;

/**
 * JSON.parse with exact numbers (SPEC §16.1): the same values, except that a number no double represents
 * faithfully is a JSONNumber. Throws SyntaxError for text that is not JSON. @param {string} text @returns {any}
 */
export function parseJSON(text) {
  const first = text.charCodeAt(0); // a frame starts with {
  const topLevelNumber = first !== 123 && first !== 91 && first !== 34 && TOP_LEVEL_NUMBER.test(text);
  if (!topLevelNumber && !mayBeUnfaithful(text)) return JSON.parse(text);
  return new ExactParser(text).parse();
}

const NUMBER_TOKEN = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;
const CONTROL = /[\u0000-\u001f]/;

class ExactParser {
  /** @param {string} text */
  constructor(text) { this.s = text; this.i = 0; }

  fail(what) {
    return new SyntaxError(`${what} in JSON at position ${this.i}`);
  }

  ws() {
    const s = this.s;
    let i = this.i;
    for (;;) {
      const c = s.charCodeAt(i);
      if (c === 32 || c === 10 || c === 13 || c === 9) i++;
      else break;
    }
    this.i = i;
  }

  parse() {
    this.ws();
    const value = this.value();
    this.ws();
    if (this.i !== this.s.length) throw this.fail('Unexpected non-whitespace character after JSON');
    return value;
  }

  value() {
    const s = this.s;
    const c = s.charCodeAt(this.i);
    if (c === 123) return this.object(); // {
    if (c === 91) return this.array(); // [
    if (c === 34) return this.string(); // "
    if (c === 45 || (c >= 48 && c <= 57)) {
      NUMBER_TOKEN.lastIndex = this.i;
      const m = NUMBER_TOKEN.exec(s);
      if (!m) throw this.fail('No number after minus sign');
      this.i += m[0].length;
      return numberFromText(m[0]);
    }
    for (const [word, v] of LITERALS) {
      if (s.startsWith(word, this.i)) { this.i += word.length; return v; }
    }
    throw this.fail(this.i >= s.length ? 'Unexpected end of JSON input' : `Unexpected token '${s[this.i]}'`);
  }

  object() {
    this.i++; // {
    const out = {};
    this.ws();
    if (this.s.charCodeAt(this.i) === 125) { this.i++; return out; }
    for (;;) {
      this.ws();
      if (this.s.charCodeAt(this.i) !== 34) throw this.fail('Expected property name');
      const key = this.string();
      this.ws();
      if (this.s.charCodeAt(this.i) !== 58) throw this.fail("Expected ':' after property name");
      this.i++;
      this.ws();
      const v = this.value();
      if (key === '__proto__') Object.defineProperty(out, key, { value: v, writable: true, enumerable: true, configurable: true });
      else out[key] = v;
      this.ws();
      const c = this.s.charCodeAt(this.i++);
      if (c === 125) return out;
      if (c !== 44) { this.i--; throw this.fail("Expected ',' or '}' after property value"); }
    }
  }

  array() {
    this.i++; // [
    const out = [];
    this.ws();
    if (this.s.charCodeAt(this.i) === 93) { this.i++; return out; }
    for (;;) {
      this.ws();
      out.push(this.value());
      this.ws();
      const c = this.s.charCodeAt(this.i++);
      if (c === 93) return out;
      if (c !== 44) { this.i--; throw this.fail("Expected ',' or ']' after array element"); }
    }
  }

  string() {
    const s = this.s;
    const start = this.i; // the opening quote
    let from = start + 1;
    let escaped = false;
    let end;
    for (;;) {
      end = s.indexOf('"', from);
      if (end < 0) { this.i = s.length; throw this.fail('Unterminated string'); }
      let k = end - 1;
      while (s.charCodeAt(k) === 92) k--; // backslashes before the quote
      if ((end - 1 - k) % 2 === 0) break;
      escaped = true;
      from = end + 1;
    }
    this.i = end + 1;
    const inner = s.slice(start + 1, end);
    if (!escaped && !inner.includes('\\') && !CONTROL.test(inner)) return inner;
    return JSON.parse(s.slice(start, end + 1)); // escapes decoded (and checked) by JSON.parse itself
  }
}

const LITERALS = [['true', true], ['false', false], ['null', null]];
