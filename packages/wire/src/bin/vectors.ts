#!/usr/bin/env node
// tapwire-wire-vectors [file.json]: runs every case of a wire vectors file against this codec;
// without a file, the CONTRACT 4-8 golden vectors shipped in the package (vectors/wire-v1.json).
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { runVectors } from "../vectors.js";

/** The vectors file shipped in the tarball (dist/bin/ -> ../../vectors/), also `@tapwire/wire/wire-v1.json`. */
const SHIPPED = fileURLToPath(new URL("../../vectors/wire-v1.json", import.meta.url));

const USAGE =
  'usage: tapwire-wire-vectors [file.json]\n  runs every case of a wire vectors file (default: the wire-v1.json shipped with @tapwire/wire); prints "N passed, N failed", exit 1 on a failure, 2 on a usage or read error';

function main(argv: readonly string[]): number {
  const arg = argv[0];
  if (arg === "--help" || arg === "-h") {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  if (argv.length > 1 || arg?.startsWith("-")) {
    process.stderr.write(`${USAGE}\n`);
    return 2;
  }
  const file = arg ?? SHIPPED;
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
