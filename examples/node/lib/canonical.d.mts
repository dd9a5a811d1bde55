// Types of canonical.mjs.
/** Canonical JSON (sorted keys, no whitespace; a JSONNumber as its text): equal values give equal bytes. Throws TypeError for NaN/Infinity. */
export declare function canonicalJSON(value: unknown): string;
/** An object's keys in the order `canonicalJSON` writes them. */
export declare function canonicalKeys(value: Record<string, unknown>): string[];
