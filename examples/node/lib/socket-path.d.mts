// Types of socket-path.mjs.
export type Environment = Record<string, string | undefined>;
/** fluxd's socket by the rule fluxd and every SDK share. */
export declare function defaultSocketPath(options?: { env?: Environment; uid?: number }): string;
/** The socket a client uses and where that came from ("the socketPath option", "$FLUXBUS_SOCKET", ...). */
export declare function resolveSocketPath(socketPath?: string, options?: { env?: Environment; uid?: number }): { path: string; source: string };
/** The uid fluxd must run as, or undefined for no check. */
export declare function expectedServerUid(expected?: number, env?: Environment, euid?: number): number | undefined;
/** Throws WrongServerUidError unless the socket file and its directory are owned by `expected`. */
export declare function checkServerUid(socketPath: string, expected: number | undefined): Promise<void>;
