// Types of the package's CommonJS entry (fluxbus.cjs, `require('fluxbus')`): exactly the ES module entry's, since
// fluxbus.cjs is that module loaded with require() (Node 20.19+ / 22.12+). Re-exported, not copied: whatever
// fluxbus.d.mts declares, this declares.
//
// TypeScript up to 5.7 (and 5.8+ with "module": "node16") does not know that require() can load an ES module and
// reports TS1479 on this line; the @ts-ignore keeps that out of the projects that use the package. (Newer
// TypeScript with "module": "node18"/"nodenext" accepts it as it is, and then the comment has nothing to ignore.)
// @ts-ignore TS1479: a CommonJS declaration re-exporting an ES module (require(esm))
export * from './fluxbus.mjs';
