// The package's CommonJS entry (`require('fluxbus')`, package.json `exports["."].require`): the ES module entry
// itself, loaded with require() of an ES module (Node 20.19+ / 22.12+). There is one implementation and one
// module instance: `require('fluxbus')` and `import('fluxbus')` in one process give the same namespace, the same
// classes (`instanceof` works across them) and the same module state; no second copy to keep in step.
'use strict';

try {
  module.exports = require('./fluxbus.mjs');
} catch (error) {
  // Node < 20.19 (or 22.0-22.11, or run with --no-experimental-require-module) cannot require() an ES module.
  if (error && error.code === 'ERR_REQUIRE_ESM') {
    throw new Error(
      `require('fluxbus') needs Node.js ^20.19.0 or >=22.12.0, where require() loads ES modules; this is Node.js ` +
      `${process.versions.node}${process.features.require_module === false ? ', with require(esm) turned off (--no-experimental-require-module)' : ''}. ` +
      `Upgrade Node.js, or load the package with import / await import('fluxbus').`,
      { cause: error },
    );
  }
  throw error;
}
