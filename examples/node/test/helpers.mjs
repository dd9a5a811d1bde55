// Test helpers: a real fluxd on a private socket ($FLUXD or .build/debug/fluxd). Nothing is written outside the
// test's temporary directory: fluxd runs with --ephemeral (when it has the option, fluxd 0.3.0 on), or, asked for a
// durable one, with --data-dir in that directory.
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

const executable = () => process.env.FLUXD || path.join(REPO, '.build', 'debug', 'fluxd');

let features;
/** What the fluxd under test offers, from its --help: `ephemeral` (--ephemeral), `dataDir` (--data-dir). */
export function fluxdFeatures() {
  if (!features) {
    let help = '';
    try { help = execFileSync(executable(), ['--help'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }); } catch (err) { help = String(err.stdout ?? ''); }
    features = { ephemeral: help.includes('--ephemeral'), dataDir: help.includes('--data-dir') };
  }
  return features;
}

/** Spawns fluxd and resolves with the child once it printed its ready line. */
async function spawnFluxd(argv, log) {
  const child = spawn(executable(), argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  child.stderr.on('data', (d) => { log.stderr += d; });
  const exited = new Promise((resolve) => child.once('exit', resolve));
  await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`fluxd not ready: ${log.stderr}`)), 20000);
    child.stdout.on('data', (d) => { out += d; if (out.includes('\n')) { clearTimeout(timer); resolve(); } });
    child.once('exit', (code) => { clearTimeout(timer); reject(new Error(`fluxd exited ${code}: ${log.stderr}`)); });
  });
  return { child, exited };
}

/**
 * Starts fluxd and resolves once it printed its ready line. `stop()` ends it and removes its directory;
 * `restart()` stops it (SIGTERM, or `{signal: 'KILL'}`) and starts it again on the same socket (and, durable, the
 * same data directory). `durable: true` gives it `--data-dir` in the test's directory (fluxd must have it:
 * `fluxdFeatures().dataDir`); otherwise it runs `--ephemeral` when it has that option.
 * @param {string[]} [args] @param {{durable?: boolean}} [options]
 */
export async function startFluxd(args = [], { durable = false } = {}) {
  fs.accessSync(executable(), fs.constants.X_OK);
  const { ephemeral, dataDir } = fluxdFeatures();
  if (durable && !dataDir) throw new Error(`${executable()} has no --data-dir: it cannot run durable`);
  const directory = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxnode-'));
  const socketPath = path.join(directory, 'fluxd.sock');
  const mode = durable ? ['--data-dir', path.join(directory, 'data')] : ephemeral ? ['--ephemeral'] : [];
  const argv = ['--socket', socketPath, ...mode, ...args];
  const log = { stderr: '' };
  let run = await spawnFluxd(argv, log);
  const end = async (signal = 'TERM') => {
    const { child, exited } = run;
    if (child.exitCode === null && child.signalCode === null) {
      child.kill(`SIG${signal}`);
      const timer = setTimeout(() => child.kill('SIGKILL'), 10000);
      await exited; clearTimeout(timer);
    }
  };
  return {
    socketPath, directory, durable,
    get child() { return run.child; },
    get stderr() { return log.stderr; },
    signal(name) { const { child } = run; if (child.exitCode === null && child.signalCode === null) child.kill(`SIG${name}`); },
    /** Stops fluxd and starts it again on the same socket. @param {{signal?: string}} [options] */
    async restart({ signal = 'TERM' } = {}) { await end(signal); run = await spawnFluxd(argv, log); },
    async stop() { await end(); fs.rmSync(directory, { recursive: true, force: true }); },
  };
}
