#!/usr/bin/env node
// Applies JSON Patches with the Node library (examples/node: parseJSON, applyPatch, canonicalJSON) for the
// three-language differential test (scripts/patch-differential.py; SPEC §16.1), as a Node client applies a delta.
//
// Reads JSON lines `{"doc": <JSON>, "patch": <JSON array>}` on stdin and writes one line per input:
// `{"ok":true,"doc":<result>}`, `{"ok":false,"error":"<code>: <text>"}`, or `{"ok":false,"crash":"<text>"}` when
// something other than a PatchError was thrown (a bug).
import readline from 'node:readline';
import { applyPatch, canonicalJSON, parseJSON, PatchError } from '../examples/node/fluxbus.mjs';

const out = [];
const flush = () => { if (out.length) { process.stdout.write(out.join('')); out.length = 0; } };
const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of lines) {
  if (line === '') continue;
  let input;
  try { input = parseJSON(line); } catch (e) { out.push(`{"ok":false,"crash":${JSON.stringify(`unreadable input line: ${e.message}`)}}\n`); continue; }
  try {
    const result = applyPatch(input.doc, input.patch);
    out.push(`{"ok":true,"doc":${canonicalJSON(result)}}\n`);
  } catch (e) {
    if (e instanceof PatchError) out.push(`{"ok":false,"error":${JSON.stringify(`${e.code}: ${e.message}`)}}\n`);
    else out.push(`{"ok":false,"crash":${JSON.stringify(String(e && e.stack || e))}}\n`);
  }
  if (out.length >= 256) flush();
}
flush();
