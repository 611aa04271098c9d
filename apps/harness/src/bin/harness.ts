#!/usr/bin/env node
/**
 * `tapwire-harness` (`pnpm start`): runs speculative decoding across processes and prints the
 * report. Exit status: 0 lossless, 1 output differs from target-only (or leaks), 2 usage error,
 * 3 a child process or package failed.
 */
import { writeFileSync } from "node:fs";
import { helpText, parseArgs } from "../cli.js";
import { HarnessError, HarnessErrorCode } from "../errors.js";
import { formatReport } from "../report.js";
import { runHarness } from "../run.js";

async function main(): Promise<number> {
  let parsed: ReturnType<typeof parseArgs>;
  try {
    parsed = parseArgs(process.argv.slice(2));
  } catch (e) {
    if (e instanceof HarnessError && e.code === HarnessErrorCode.USAGE) {
      process.stderr.write(`tapwire-harness: ${e.message}\n`);
      return 2;
    }
    throw e;
  }
  if (parsed.help) {
    process.stdout.write(helpText());
    return 0;
  }
  const cfg = parsed.config;
  const { report, exitCode } = await runHarness(cfg);
  process.stdout.write(formatReport(report));
  if (cfg.json !== null) writeFileSync(cfg.json, `${JSON.stringify(report, null, 2)}\n`);
  return exitCode;
}

let stopping = false;
for (const sig of ["SIGINT", "SIGTERM"] as const) {
  process.on(sig, () => {
    if (stopping) process.exit(130);
    stopping = true;
    process.stderr.write(`\ntapwire-harness: ${sig}, stopping\n`);
    process.exit(130);
  });
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (e: unknown) => {
    process.stderr.write(`tapwire-harness: ${e instanceof Error ? e.message : String(e)}\n`);
    if (process.env["TAPWIRE_DEBUG"] && e instanceof Error && e.stack) process.stderr.write(`${e.stack}\n`);
    process.exitCode = 3;
  },
);
