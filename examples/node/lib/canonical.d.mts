// Types of canonical.mjs.
/** Canonical JSON (sorted keys, no whitespace): equal values give equal bytes. Throws TypeError for NaN/Infinity. */
export declare function canonicalJSON(value: unknown): string;
