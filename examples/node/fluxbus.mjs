// FluxBus for Node.js (18+, standard library only): a client with a Promise / async-iterator API, a Store base
// class for store workers, and the wire layer (frame decoder, strict envelope check). Protocol: protocol/SPEC.md.
// This file is the package entry: it re-exports the public API of the modules in lib/.
export { PROTOCOL_VERSION } from './lib/constants.mjs';
export { ErrorCodes, FluxError } from './lib/errors.mjs';
export { defaultSocketPath, expectedServerUid, checkServerUid } from './lib/socket-path.mjs';
export { isValidStoreName, isValidActionType, patternMatches } from './lib/names.mjs';
export { canonicalJSON } from './lib/canonical.mjs';
export { encodeFrame, FrameDecoder } from './lib/framing.mjs';
export { EnvelopeError, checkEnvelope } from './lib/envelope.mjs';
export { Client } from './lib/client.mjs';
export { Subscription, QueryReceipt } from './lib/subscription.mjs';
export { QuerySet, Reject, Store } from './lib/store.mjs';
