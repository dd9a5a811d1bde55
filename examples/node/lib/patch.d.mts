// Types of patch.mjs: JSON Patch (RFC 6902), JSON Pointer (RFC 6901), JSON equality and diff (SPEC §16.1).

/** One JSON Patch operation. */
export type PatchOperation =
  | { op: 'add'; path: string; value: unknown }
  | { op: 'remove'; path: string }
  | { op: 'replace'; path: string; value: unknown }
  | { op: 'move'; from: string; path: string }
  | { op: 'copy'; from: string; path: string }
  | { op: 'test'; path: string; value: unknown };
export type Patch = PatchOperation[];

/** The categories of protocol/vectors/patch.json. */
export type PatchErrorCode = 'invalid-op' | 'invalid-pointer' | 'not-found' | 'index' | 'move-into-child' | 'test-failed' | 'too-deep';
/** A patch or pointer that does not apply; `index` is the failing operation's position. */
export declare class PatchError extends Error {
  constructor(code: PatchErrorCode, message: string, index?: number);
  code: PatchErrorCode;
  detail: string;
  index: number | undefined;
}

export declare function escapeToken(token: string): string;
export declare function unescapeToken(token: string): string;
/** The reference tokens of a pointer (`""` → []); PatchError if it is not one. */
export declare function parsePointer(pointer: string): string[];
export declare function formatPointer(tokens: ReadonlyArray<string | number>): string;
export declare function isValidPointer(pointer: unknown): pointer is string;
/** The value at `pointer`; PatchError when there is none. */
export declare function getPointer(doc: unknown, pointer: string): unknown;
export declare function hasPointer(doc: unknown, pointer: string): boolean;
/** JSON equality: numbers by exact decimal value (SPEC §16.1; a JSONNumber by its text, a double by its shortest text), objects regardless of member order. */
export declare function jsonEqual(a: unknown, b: unknown): boolean;
/** The patched value (all or nothing: PatchError); `doc` is not modified and shares what the patch did not touch. */
export declare function applyPatch<T = unknown>(doc: T, patch: ReadonlyArray<PatchOperation | Record<string, unknown>>): T;
/** A patch from `from` to `to`; subtrees that are the same object (===) are skipped. */
export declare function diff(from: unknown, to: unknown): Patch;
