// Types of names.mjs (SPEC §4.1, §5).
export declare function isValidStoreName(name: unknown): name is string;
export declare function isValidActionType(type: unknown): type is string;
export declare function isValidPattern(pattern: unknown): pattern is string;
export declare function patternMatches(pattern: string, type: string): boolean;
