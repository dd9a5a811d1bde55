// Opening fluxd's socket, with errors that name the path tried, where it came from and what to do (as fluxctl's
// do), never a raw ENOENT or an unhandled 'error' event.
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { NoFluxdError, TimeoutError } from './errors.mjs';

/**
 * Connects to `target`. `adopt(socket)` runs synchronously on 'connect' (so the caller's listeners are attached
 * before any other event) and its result resolves the promise. Rejects with NoFluxdError, or TimeoutError when
 * `deadline` passes first.
 * @template T @param {string} target @param {string} source where the path came from, for messages
 * @param {import('./deadline.mjs').Deadline} deadline @param {(socket: net.Socket) => T} adopt @returns {Promise<T>}
 */
export function openSocket(target, source, deadline, adopt) {
  return new Promise((resolve, reject) => {
    const socket = net.createConnection(target);
    let timer;
    const onError = (err) => {
      clearTimeout(timer);
      socket.destroy();
      explain(target, source, err).then(reject, reject);
    };
    socket.once('error', onError);
    socket.once('connect', () => {
      clearTimeout(timer);
      socket.off('error', onError);
      try { resolve(adopt(socket)); } catch (err) { socket.destroy(); reject(err); }
    });
    if (deadline.remaining !== Infinity) {
      timer = setTimeout(() => {
        socket.off('error', onError); socket.on('error', () => {}); socket.destroy();
        reject(new TimeoutError(`timed out after ${deadline.ms} ms connecting to fluxd at ${target} (from ${source})`, { timeoutMs: deadline.ms }));
      }, deadline.remaining);
    }
  });
}

/** A failed connect as NoFluxdError: why, in words, from the error code and what is at the path. */
async function explain(target, source, err) {
  const stat = await fs.promises.stat(target).catch(() => null);
  const errno = err?.code;
  let reason; let hint;
  if (stat?.isDirectory()) { reason = 'is a directory, not a socket'; hint = path.join(target, 'fluxd.sock'); }
  else if (stat && !stat.isSocket()) reason = 'is not a socket (a file of another kind is there)';
  else if (errno === 'ENOENT') reason = 'no such socket';
  else if (errno === 'ECONNREFUSED') reason = 'the socket exists but no fluxd is listening on it';
  else if (errno === 'EACCES' || errno === 'EPERM') reason = 'permission denied';
  else if (errno === 'ENOTSOCK') reason = 'not a socket';
  else reason = err?.message ?? String(err);
  return new NoFluxdError(target, source, reason, { errno, hint, cause: err });
}
