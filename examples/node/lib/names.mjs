// Names, action types and patterns (SPEC §4.1, §5).
import { NAME_PATTERN, Limits } from './constants.mjs';

/** @param {string} name SPEC §4.1 store name. */
export const isValidStoreName = (name) => typeof name === 'string' && NAME_PATTERN.test(name) && Buffer.byteLength(name) <= Limits.STORE_NAME_BYTES;
/** @param {string} type SPEC §4.1 action type. */
export const isValidActionType = (type) => typeof type === 'string' && NAME_PATTERN.test(type) && Buffer.byteLength(type) <= Limits.ACTION_TYPE_BYTES;
/** SPEC §5: exact type, or prefix followed by one trailing `*`. @param {string} pattern @param {string} type */
export const patternMatches = (pattern, type) => pattern.endsWith('*') ? type.startsWith(pattern.slice(0, -1)) : pattern === type;
/** SPEC §5: a valid `handles` entry (a type, or a prefix of at most 255 bytes followed by `*`). @param {string} pattern */
export const isValidPattern = (pattern) => typeof pattern === 'string' && (pattern.endsWith('*')
  ? (pattern.length === 1 || isValidActionType(pattern.slice(0, -1))) && Buffer.byteLength(pattern) <= Limits.ACTION_TYPE_BYTES
  : isValidActionType(pattern));
