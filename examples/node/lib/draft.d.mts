// Types of draft.mjs: copy-on-write drafts (Immer-like).

/** Runs `recipe` on a draft of `base`; returns the new state, sharing what was not written. */
export declare function produce<S>(base: S, recipe: (draft: S) => S | undefined | void): S;
export declare function produce<S>(base: S, recipe: (draft: S) => Promise<S | undefined | void>): Promise<S>;
export declare function isDraft(value: unknown): boolean;
