// Canonical JSON (SPEC §8.6): sorted keys, no whitespace, so equal values give equal bytes.
import { JSONNumber } from './json-number.mjs';

/** Canonical JSON (sorted keys, no whitespace; a JSONNumber as its text): equal values give equal bytes. @param {any} value @returns {string} */
export function canonicalJSON(value) {
  if (value === undefined) return 'null';
  if (value === null || typeof value !== 'object') {
    if (typeof value === 'number' && !Number.isFinite(value)) throw new TypeError('NaN/Infinity are not JSON');
    return JSON.stringify(value);
  }
  if (value instanceof JSONNumber) return value.text; // exactly as read (SPEC §16.1)
  if (Array.isArray(value)) return '[' + value.map(canonicalJSON).join(',') + ']';
  const keys = Object.keys(value).filter((k) => value[k] !== undefined).sort(byCodePoint);
  return '{' + keys.map((k) => JSON.stringify(k) + ':' + canonicalJSON(value[k])).join(',') + '}';
}

/** An object's keys in the order `canonicalJSON` writes them (members whose value is undefined left out). @param {Record<string, any>} value @returns {string[]} */
export function canonicalKeys(value) {
  return Object.keys(value).filter((k) => value[k] !== undefined).sort(byCodePoint);
}

/** Orders strings by Unicode code point (= UTF-8 byte order), as SPEC §8.6's canonical encoding asks. */
function byCodePoint(a, b) {
  const x = [...a]; const y = [...b];
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const d = x[i].codePointAt(0) - y[i].codePointAt(0);
    if (d !== 0) return d;
  }
  return x.length - y.length;
}

