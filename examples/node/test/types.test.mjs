// The shipped declarations (.d.mts) against the modules: every module with declarations declares exactly the
// values it exports at run time (classes, functions, constants), and package.json points at them. (That the
// declarations type-check and reject wrong calls is `tsc -p examples/node/types-check`, run by scripts/test.sh.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8'));

/** Value names a .d.mts exports: `export declare class|function|const X` and `export { X, Y } from` lists. */
function declaredValues(file) {
  const text = fs.readFileSync(file, 'utf8');
  const names = new Set();
  for (const m of text.matchAll(/^export declare (?:abstract )?(?:class|function|const|let) ([A-Za-z_$][\w$]*)/gm)) names.add(m[1]);
  for (const m of text.matchAll(/^export \{([^}]*)\} from /gm)) {
    for (const part of m[1].split(',')) { const name = part.trim(); if (name && !name.startsWith('type ')) names.add(name.split(/\s+as\s+/).pop()); }
  }
  return [...names].sort();
}

const modules = [path.join(ROOT, 'fluxbus.mjs'), ...fs.readdirSync(path.join(ROOT, 'lib')).filter((f) => f.endsWith('.mjs')).map((f) => path.join(ROOT, 'lib', f))];

test('package.json ships the entry and its declarations', () => {
  assert.deepEqual(pkg.exports['.'], {
    import: { types: './fluxbus.d.mts', default: './fluxbus.mjs' },
    require: { types: './fluxbus.d.cts', default: './fluxbus.cjs' }, // the CommonJS entry: test/cjs.test.mjs
  });
  assert.equal(pkg.types, 'fluxbus.d.mts');
  assert.equal(pkg.main, 'fluxbus.mjs');
  for (const f of ['fluxbus.mjs', 'fluxbus.d.mts', 'fluxbus.cjs', 'fluxbus.d.cts']) assert.ok(fs.existsSync(path.join(ROOT, f)) && pkg.files.includes(f), f);
  assert.ok(pkg.files.includes('lib/'));
});

for (const file of modules) {
  const declarations = file.replace(/\.mjs$/, '.d.mts');
  const name = path.relative(ROOT, file);
  if (!fs.existsSync(declarations)) {
    test(`${name} has no declarations: it is internal, not re-exported by the entry`, () => {
      for (const entry of ['fluxbus.mjs', 'fluxbus.d.mts']) {
        assert.ok(!fs.readFileSync(path.join(ROOT, entry), 'utf8').includes(`'./${name}'`), `${entry} re-exports ${name}, which has no .d.mts`);
      }
    });
    continue;
  }
  test(`${name}: the declared values are the exported ones`, async () => {
    const runtime = Object.keys(await import(pathToFileURL(file).href)).sort();
    assert.deepEqual(declaredValues(declarations), runtime);
  });
}
