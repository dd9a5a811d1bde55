// Reconnection policy (SPEC §15.5): after an unexpected loss of the connection, or fluxd's `bye`, the client
// connects again after a delay that starts at `initialDelay` and grows by `factor` per failed attempt up to
// `maxDelay`, each delay shortened by a random part of up to `jitter` (so that many clients of a restarted fluxd
// do not all come back at the same instant). It gives up after `maxAttempts` attempts or `giveUpAfter` ms, if set.

/** The defaults: on, 50 ms doubling up to 2 s, up to half of each delay taken off at random, never give up. */
export const DEFAULT_RECONNECT = Object.freeze({
  initialDelay: 50, maxDelay: 2000, factor: 2, jitter: 0.5, maxAttempts: Infinity, giveUpAfter: null,
});

const isMs = (v) => typeof v === 'number' && Number.isFinite(v) && v >= 0;

/**
 * The `reconnect` option of `Client.connect` / `store.start` as a complete policy: `true` or undefined = the
 * defaults, `false` = off, an object = the defaults with its fields. Throws TypeError for a bad field.
 * @param {boolean|Partial<typeof DEFAULT_RECONNECT>|undefined} option
 * @returns {{enabled: boolean, initialDelay: number, maxDelay: number, factor: number, jitter: number,
 *            maxAttempts: number, giveUpAfter: number|null}}
 */
export function reconnectPolicy(option) {
  if (option === false) return { enabled: false, ...DEFAULT_RECONNECT };
  if (option === undefined || option === true) return { enabled: true, ...DEFAULT_RECONNECT };
  if (option === null || typeof option !== 'object' || Array.isArray(option)) {
    throw new TypeError(`reconnect is true, false or an object of options, not ${JSON.stringify(option)}`);
  }
  const policy = { enabled: true, ...DEFAULT_RECONNECT };
  for (const [key, value] of Object.entries(option)) {
    if (!(key in DEFAULT_RECONNECT)) throw new TypeError(`unknown reconnect option '${key}' (options: ${Object.keys(DEFAULT_RECONNECT).join(', ')})`);
    if (value !== undefined) policy[key] = value;
  }
  if (!isMs(policy.initialDelay)) throw new TypeError(`reconnect.initialDelay is a number of ms >= 0, not ${JSON.stringify(policy.initialDelay)}`);
  if (!isMs(policy.maxDelay) || policy.maxDelay < policy.initialDelay) throw new TypeError(`reconnect.maxDelay is a number of ms >= initialDelay, not ${JSON.stringify(policy.maxDelay)}`);
  if (!(typeof policy.factor === 'number' && policy.factor >= 1 && Number.isFinite(policy.factor))) throw new TypeError(`reconnect.factor is a number >= 1, not ${JSON.stringify(policy.factor)}`);
  if (!(typeof policy.jitter === 'number' && policy.jitter >= 0 && policy.jitter <= 1)) throw new TypeError(`reconnect.jitter is a number from 0 to 1, not ${JSON.stringify(policy.jitter)}`);
  if (!(policy.maxAttempts === Infinity || (Number.isInteger(policy.maxAttempts) && policy.maxAttempts >= 1))) throw new TypeError(`reconnect.maxAttempts is an integer >= 1 (or Infinity), not ${JSON.stringify(policy.maxAttempts)}`);
  if (!(policy.giveUpAfter === null || isMs(policy.giveUpAfter))) throw new TypeError(`reconnect.giveUpAfter is a number of ms (or null for never), not ${JSON.stringify(policy.giveUpAfter)}`);
  return policy;
}

/**
 * The delay in ms before reconnection attempt `attempt` (1, 2, ...): `initialDelay × factor^(attempt-1)`, at most
 * `maxDelay`, less a random part of up to `jitter` of it. `random` returns a number in [0, 1) (Math.random).
 * @param {{initialDelay: number, maxDelay: number, factor: number, jitter: number}} policy
 * @param {number} attempt @param {() => number} [random] @returns {number}
 */
export function backoffDelay(policy, attempt, random = Math.random) {
  const base = Math.min(policy.maxDelay, policy.initialDelay * policy.factor ** Math.max(0, attempt - 1));
  return Math.round(base * (1 - policy.jitter * random()));
}
