// Where fluxd's socket is (the rule fluxd and every SDK share) and whose it is (the server uid check).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { WrongServerUidError } from './errors.mjs';

/**
 * fluxd's socket, by the rule fluxd and every SDK share: $FLUXBUS_SOCKET if set and non-empty, else
 * $XDG_RUNTIME_DIR/fluxbus/fluxd.sock if that is set and non-empty, else $TMPDIR/fluxbus-<uid>/fluxd.sock with
 * TMPDIR = /tmp when unset or empty (trailing slashes dropped).
 * @param {{env?: Record<string, string|undefined>, uid?: number}} [options] injectable for tests
 */
export function defaultSocketPath({ env = process.env, uid = process.getuid?.() ?? os.userInfo().uid } = {}) {
  if (env.FLUXBUS_SOCKET) return env.FLUXBUS_SOCKET;
  // Trailing slashes are dropped ('/tmp/' is '/tmp', '/' the root directory), as fluxd and the Swift SDK do.
  if (env.XDG_RUNTIME_DIR) return `${env.XDG_RUNTIME_DIR.replace(/\/+$/, '')}/fluxbus/fluxd.sock`;
  return `${(env.TMPDIR || '/tmp').replace(/\/+$/, '')}/fluxbus-${uid}/fluxd.sock`;
}

/**
 * The socket a client uses and where that came from, for messages: `socketPath` if given ("the socketPath
 * option"), else `defaultSocketPath()` ("$FLUXBUS_SOCKET", "$XDG_RUNTIME_DIR" or "the default path").
 * @param {string|undefined} socketPath @param {{env?: Record<string, string|undefined>, uid?: number}} [options]
 * @returns {{path: string, source: string}}
 */
export function resolveSocketPath(socketPath, { env = process.env, uid } = {}) {
  if (socketPath) return { path: socketPath, source: 'the socketPath option' };
  const source = env.FLUXBUS_SOCKET ? '$FLUXBUS_SOCKET' : env.XDG_RUNTIME_DIR ? '$XDG_RUNTIME_DIR' : 'the default path';
  return { path: defaultSocketPath(uid === undefined ? { env } : { env, uid }), source };
}

/**
 * The uid fluxd must run as, or undefined for no check: `expected` if given, else $FLUXBUS_SERVER_UID if set and
 * non-empty (a number), else 0 when this process runs as root (euid 0).
 * @param {number|undefined} [expected] @param {Record<string, string|undefined>} [env] @param {number} [euid]
 * @returns {number|undefined}
 */
export function expectedServerUid(expected, env = process.env, euid = process.geteuid?.()) {
  if (expected !== undefined && expected !== null) return Number(expected);
  const text = env.FLUXBUS_SERVER_UID;
  if (text) {
    if (!/^\s*[0-9]+\s*$/.test(text)) throw new TypeError(`FLUXBUS_SERVER_UID must be a uid (a number), not ${JSON.stringify(text)}`);
    return Number(text);
  }
  return euid === 0 ? 0 : undefined;
}

/**
 * Node has no SO_PEERCRED: the check is that the socket file and its directory (symlinks resolved) are owned by
 * `expected`, and that the directory is not writable by group or others unless it is sticky (so nobody else can
 * have put a socket there). Throws WrongServerUidError (code `wrong-server-uid`).
 * @param {string} socketPath @param {number|undefined} expected
 */
export async function checkServerUid(socketPath, expected) {
  if (expected === undefined) return;
  const unchecked = (err) => new WrongServerUidError(`fluxd at ${socketPath}: its owner cannot be checked (${err.code ?? err.message}), expected uid ${expected}`);
  const real = await fs.promises.realpath(socketPath).catch((err) => { throw unchecked(err); });
  const file = await fs.promises.stat(real).catch((err) => { throw unchecked(err); });
  const hint = (uid) => `set FLUXBUS_SERVER_UID=${uid} to accept`;
  if (file.uid !== expected) {
    throw new WrongServerUidError(`fluxd at ${socketPath} is run by uid ${file.uid}, expected ${expected}; ${hint(file.uid)}`);
  }
  const directory = path.dirname(real);
  const dir = await fs.promises.stat(directory).catch((err) => { throw unchecked(err); });
  if (dir.uid !== expected) {
    throw new WrongServerUidError(`fluxd at ${socketPath}: its directory ${directory} is owned by uid ${dir.uid}, expected ${expected}; ${hint(dir.uid)}`);
  }
  if ((dir.mode & 0o022) !== 0 && (dir.mode & 0o1000) === 0) {
    throw new WrongServerUidError(`fluxd at ${socketPath}: its directory ${directory} is writable by group or others (mode ${(dir.mode & 0o7777).toString(8)}) and not sticky, so uid ${expected} may not own the listener`);
  }
}
