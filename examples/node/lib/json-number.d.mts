// Types of json-number.mjs: exact JSON numbers (SPEC §16.1).

/**
 * A JSON number no double represents faithfully (`0.10000000000000001`, `9007199254740993`, `1e400`), kept with its
 * text: frames are read with `parseJSON`, which gives a plain `number` for every other number. `valueOf()` is the
 * nearest double, `toString()` the text; `canonicalJSON` writes the text back exactly (JSON.stringify too on Node
 * 21+, else the nearest double). Compare with `jsonEqual` (exact decimal value), not `===`.
 */
export declare class JSONNumber {
  /** @param text a JSON number (RFC 8259 grammar); TypeError otherwise */
  constructor(text: string);
  /** The number as written. */
  readonly text: string;
  /** The nearest double (±Infinity beyond the double's range). */
  valueOf(): number;
  /** Whether its exact value is an integer. */
  isInteger(): boolean;
  toString(): string;
  toJSON(): unknown;
}
/** A finite `number` or a JSONNumber. */
export declare function isJSONNumber(value: unknown): value is number | JSONNumber;
/** Whether two numbers have the same exact decimal value (a double stands for its shortest text: `0.1`). */
export declare function numbersEqual(a: number | JSONNumber, b: number | JSONNumber): boolean;
/** The exact decimal value of a number text as a string key: equal keys exactly for equal values. */
export declare function decimalKey(text: string): string;
/** A number text as a `number` when the double's shortest text has its value, else a JSONNumber. */
export declare function numberFromText(text: string): number | JSONNumber;
/** JSON.parse with exact numbers: the same values, except that a number no double represents is a JSONNumber. */
export declare function parseJSON(text: string): any;
/** A deep copy of a JSON value that keeps JSONNumbers as they are (structuredClone makes them plain objects). */
export declare function cloneJSON<T>(value: T): T;
