#!/usr/bin/env node
// tapwire-wire-vectors <file.json>: runs every case of a wire vectors file against this codec.
import { readFileSync } from "node:fs";
import { runVectors } from "../vectors.js";

const USAGE =
  'usage: tapwire-wire-vectors <file.json>\n  runs every case of a wire vectors file; prints "N passed, N failed", exit 1 on a failure, 2 on a usage or read error';

function main(argv: readonly string[]): number {
  const file = argv[0];
  if (file === "--help" || file === "-h") {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  if (file === undefined || argv.length !== 1) {
    process.stderr.write(`${USAGE}\n`);
    return 2;
  }
  let doc: unknown;
  try {
    doc = JSON.parse(readFileSync(file, "utf8"));
  } catch (e) {
    process.stderr.write(`tapwire-wire-vectors: cannot read ${file}: ${(e as Error).message}\n`);
    return 2;
  }
  let report: ReturnType<typeof runVectors>;
  try {
    report = runVectors(doc);
  } catch (e) {
    process.stderr.write(`tapwire-wire-vectors: ${(e as Error).message}\n`);
    return 2;
  }
  for (const r of report.results) {
    if (!r.ok) process.stdout.write(`FAIL ${r.name}: ${r.problem}\n`);
  }
  process.stdout.write(`${report.passed} passed, ${report.failed} failed\n`);
  return report.failed === 0 ? 0 : 1;
}

process.exitCode = main(process.argv.slice(2));
