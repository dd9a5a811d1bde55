// The protocol's vocabulary.
export const PROTOCOL_VERSION = 1;
