// The package from CommonJS (`require('fluxbus')`, package.json `exports["."].require` -> fluxbus.cjs): a child
// `node` runs a .cjs file that requires the package by name from a node_modules of its own and reports what it got.
// It must get the ES module entry's exports, all of them (compared with fluxbus.mjs's at run time, so an export
// added there is checked too), as the very same objects `import('fluxbus')` gives in that process (one module
// instance: no dual-package hazard), and print nothing on stderr. On a Node without require(esm) it must fail
// saying which Node it needs. (The CommonJS types: `tsc -p examples/node/types-check-cjs`, run by scripts/test.sh.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8'));

// What the child reports: resolved path, export names, whether each is the ES module's own, and instanceof across.
const REPORT = `'use strict';
const cjs = require('fluxbus');
import('fluxbus').then((esm) => {
  const error = cjs.errorFromFrame({ code: 'no-handler', message: 'nobody handles x/y', fatal: false });
  process.stdout.write(JSON.stringify({
    resolved: require.resolve('fluxbus'),
    names: Object.keys(cjs).sort(),
    esmNames: Object.keys(esm).sort(),
    notTheSame: Object.keys(esm).filter((name) => cjs[name] !== esm[name]),
    sameNamespace: cjs === esm,
    instanceAcross: error instanceof esm.NoHandlerError && error instanceof esm.FluxError,
    client: typeof cjs.Client === 'function' && typeof cjs.Client.connect === 'function',
  }));
});
`;

/** A temporary app directory with `main.cjs` and `node_modules/fluxbus` made by `install(target)`. */
function app(t, install) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxcjs-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  fs.mkdirSync(path.join(dir, 'node_modules'));
  install(path.join(dir, 'node_modules', 'fluxbus'));
  fs.writeFileSync(path.join(dir, 'main.cjs'), REPORT);
  return dir;
}

/** Runs `node [...flags] main.cjs` in `dir`, without the test runner's or the user's Node options. */
function run(dir, flags = []) {
  const env = { ...process.env };
  delete env.NODE_OPTIONS;
  delete env.NODE_TEST_CONTEXT;
  return spawnSync(process.execPath, [...flags, 'main.cjs'], { cwd: dir, env, encoding: 'utf8', timeout: 30000 });
}

/** An installed copy: package.json and exactly what its `files` ship (a file missing from `files` fails here). */
function installCopy(target) {
  fs.mkdirSync(target);
  for (const file of ['package.json', ...pkg.files]) fs.cpSync(path.join(ROOT, file), path.join(target, file), { recursive: true });
}

/**
 * Nothing on stderr: no warning, no log line. Node 22.12 (and 23.0-23.4) warn about require(esm) once, 22.12 only
 * when the requiring file is outside node_modules (a checkout, not an installed package): on the `warns` versions
 * that one warning is let through, nothing else.
 */
function assertQuiet(stderr, warns) {
  const allowed = warns.test(process.versions.node) ? /^(\(node:\d+\) ExperimentalWarning: [^\n]*require\(\)[^\n]*\n(Support for loading ES Module[^\n]*\n)?(\(Use `node --trace-warnings [^\n]*\n)?)?$/ : /^$/;
  assert.match(stderr, allowed, 'nothing unexpected on stderr');
}

async function checkReport(result, dir, resolvedTail) {
  assert.equal(result.status, 0, `exit ${result.status}: ${result.stderr}`);
  const report = JSON.parse(result.stdout);
  assert.ok(report.resolved.endsWith(resolvedTail), `require.resolve('fluxbus') = ${report.resolved}`);
  const esmEntry = Object.keys(await import('../fluxbus.mjs')).sort();
  assert.ok(esmEntry.length > 50, `fluxbus.mjs exports ${esmEntry.length} names`);
  assert.deepEqual(report.esmNames, esmEntry, 'the installed ES module entry is the one in this checkout');
  assert.deepEqual(report.names, esmEntry, 'require() gives every export of the ES module entry, and only those');
  assert.deepEqual(report.notTheSame, [], 'each export is the ES module\'s own object, not a copy');
  assert.equal(report.sameNamespace, true, 'require() and import() give one namespace');
  assert.equal(report.instanceAcross, true, 'an error made through require() is an instance of the imported classes');
  assert.equal(report.client, true);
}

test('package.json sends require to fluxbus.cjs and import to fluxbus.mjs, each with its own types', () => {
  const entry = pkg.exports['.'];
  assert.deepEqual(Object.keys(entry), ['import', 'require']);
  assert.deepEqual(entry.import, { types: './fluxbus.d.mts', default: './fluxbus.mjs' });
  assert.deepEqual(entry.require, { types: './fluxbus.d.cts', default: './fluxbus.cjs' });
  for (const file of ['fluxbus.cjs', 'fluxbus.d.cts']) assert.ok(fs.existsSync(path.join(ROOT, file)) && pkg.files.includes(file), file);
  assert.match(pkg.engines.node, /\^20\.19\.0 \|\| >=22\.12\.0/, 'engines names the Node versions require(esm) needs');
  // Re-exports, not copies: a name added to the ES module entry reaches require() and its types by itself.
  assert.match(fs.readFileSync(path.join(ROOT, 'fluxbus.cjs'), 'utf8'), /module\.exports = require\('\.\/fluxbus\.mjs'\);/);
  assert.match(fs.readFileSync(path.join(ROOT, 'fluxbus.d.cts'), 'utf8'), /^export \* from '\.\/fluxbus\.mjs';$/m);
});

test('require(\'fluxbus\') of an installed copy: the ES module entry\'s exports, the same objects, nothing on stderr', async (t) => {
  const dir = app(t, installCopy);
  const result = run(dir);
  await checkReport(result, dir, path.join('node_modules', 'fluxbus', 'fluxbus.cjs'));
  assertQuiet(result.stderr, /^23\.[0-4]\./);
});

test('require(\'fluxbus\') of this checkout (node_modules/fluxbus a symlink to it)', async (t) => {
  const dir = app(t, (target) => fs.symlinkSync(ROOT, target, 'dir'));
  const result = run(dir);
  await checkReport(result, dir, path.join('examples', 'node', 'fluxbus.cjs')); // symlinks resolve to the real path
  assertQuiet(result.stderr, /^(22\.12|23\.[0-4])\./);
});

test('without require(esm) the CommonJS entry fails saying which Node it needs', { skip: !process.allowedNodeEnvironmentFlags.has('--no-experimental-require-module') && 'this Node has no --no-experimental-require-module' }, (t) => {
  const dir = app(t, installCopy);
  const result = run(dir, ['--no-experimental-require-module']);
  assert.notEqual(result.status, 0);
  assert.match(result.stderr, /require\('fluxbus'\) needs Node\.js \^20\.19\.0 or >=22\.12\.0/);
  assert.match(result.stderr, /import \/ await import\('fluxbus'\)/);
  assert.equal(result.stdout, '');
});
