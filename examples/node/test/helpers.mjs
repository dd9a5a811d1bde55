// Test helpers: a real fluxd on a private socket ($FLUXD or .build/debug/fluxd).
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

/** Starts fluxd and resolves once it printed its ready line. `stop()` ends it and removes its directory. */
export async function startFluxd(args = []) {
  const executable = process.env.FLUXD || path.join(REPO, '.build', 'debug', 'fluxd');
  fs.accessSync(executable, fs.constants.X_OK);
  const directory = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxnode-'));
  const socketPath = path.join(directory, 'fluxd.sock');
  const child = spawn(executable, ['--socket', socketPath, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => { stderr += d; });
  const exited = new Promise((resolve) => child.once('exit', resolve));
  await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`fluxd not ready: ${stderr}`)), 20000);
    child.stdout.on('data', (d) => { out += d; if (out.includes('\n')) { clearTimeout(timer); resolve(); } });
    child.once('exit', (code) => { clearTimeout(timer); reject(new Error(`fluxd exited ${code}: ${stderr}`)); });
  });
  return {
    socketPath, child,
    get stderr() { return stderr; },
    signal(name) { if (child.exitCode === null && child.signalCode === null) child.kill(`SIG${name}`); },
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), 10000);
        await exited; clearTimeout(timer);
      }
      fs.rmSync(directory, { recursive: true, force: true });
    },
  };
}
