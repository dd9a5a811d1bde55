// Names, action types and patterns (SPEC §4.1, §5).
const NAME = /^[A-Za-z0-9._:/-]+$/;

/** @param {string} name SPEC §4.1 store name. */
export const isValidStoreName = (name) => typeof name === 'string' && NAME.test(name) && Buffer.byteLength(name) <= 128;
/** @param {string} type SPEC §4.1 action type. */
export const isValidActionType = (type) => typeof type === 'string' && NAME.test(type) && Buffer.byteLength(type) <= 256;
/** SPEC §5: exact type, or prefix followed by one trailing `*`. @param {string} pattern @param {string} type */
export const patternMatches = (pattern, type) => pattern.endsWith('*') ? type.startsWith(pattern.slice(0, -1)) : pattern === type;
