// Types of envelope.mjs.
/** The body is not valid protocol JSON (`bad-json`) or not an envelope (`bad-message`). */
export declare class EnvelopeError extends Error {
  constructor(code: string, message: string);
  code: string;
}
/** Checks a frame body as fluxd does; the top-level keys in order and each value's source text. */
export declare function checkEnvelope(body: Uint8Array): { keys: string[]; raw: Record<string, string> };
