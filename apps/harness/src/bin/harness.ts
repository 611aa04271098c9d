#!/usr/bin/env node
/**
 * `tapwire-harness` (`pnpm start`): runs speculative decoding across processes and prints the
 * report. Exit status: 0 lossless, 1 output differs from target-only (or leaks), 2 usage error
 * (an unwritable `--json` path included, checked before the run), 3 a child process died or a
 * package failed, 130 on SIGINT and 143 on SIGTERM once every child process has exited.
 */
import { writeFileSync } from "node:fs";
import { checkJsonPath, helpText, parseArgs } from "../cli/cli.js";
import { HarnessError, HarnessErrorCode } from "../errors.js";
import { formatMultiReport } from "../multi/multi-report.js";
import { isMulti, runMulti } from "../multi/run-multi.js";
import { stopAllChildren } from "../procs/procs.js";
import { forwardSignal, isNetnsRun, superviseNetns } from "../procs/topology-netns.js";
import { reportPictures, writePictures } from "../report/pictures.js";
import { formatReport } from "../report/report.js";
import { runHarness } from "../run.js";

async function main(): Promise<number> {
  let parsed: ReturnType<typeof parseArgs>;
  try {
    parsed = parseArgs(process.argv.slice(2));
    if (!parsed.help && parsed.config.json !== null) checkJsonPath(parsed.config.json);
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
  if (isMulti(cfg)) {
    // --engines / --workers / --discovery (issue 21): src/multi/
    const m = await runMulti(cfg, (l) => process.stderr.write(`[harness] ${l}\n`));
    process.stdout.write(formatMultiReport(m.report));
    if (cfg.json !== null) writeFileSync(cfg.json, `${JSON.stringify(m.report, null, 2)}\n`);
    return m.exitCode;
  }
  if (cfg.topology === "netns" && !isNetnsRun()) {
    // builds the namespaces and runs this bin again inside the engine's (procs/topology-netns.ts)
    try {
      return await superviseNetns(cfg, process.argv[1]!, process.argv.slice(2), (m) =>
        process.stderr.write(`[harness] ${m}\n`),
      );
    } catch (e) {
      if (e instanceof HarnessError && e.code === HarnessErrorCode.USAGE) {
        process.stderr.write(`tapwire-harness: ${e.message}\n`);
        return 2;
      }
      throw e;
    }
  }
  const { report, exitCode } = await runHarness(cfg);
  process.stdout.write(formatReport(report));
  if (cfg.json !== null) writeFileSync(cfg.json, `${JSON.stringify(report, null, 2)}\n`);
  if (cfg.svg !== null) {
    for (const p of writePictures(cfg.svg, reportPictures(report, report.stepRttHistogram ?? null))) {
      process.stderr.write(`tapwire-harness: wrote ${p}\n`);
    }
  }
  return exitCode;
}

/** 128 + signal number, the shell's convention for "ended by this signal". */
const SIGNAL_EXIT = { SIGINT: 130, SIGTERM: 143 } as const;
let stopping = false;
for (const sig of ["SIGINT", "SIGTERM"] as const) {
  process.on(sig, () => {
    // a netns supervisor: the run process stops its children; the namespaces go when it exits
    if (forwardSignal(sig)) return;
    if (stopping) {
      // a second signal: no more grace for the children
      void stopAllChildren(0).finally(() => process.exit(SIGNAL_EXIT[sig]));
      return;
    }
    stopping = true;
    process.stderr.write(`\ntapwire-harness: ${sig}, stopping the child processes\n`);
    void stopAllChildren(2000).finally(() => process.exit(SIGNAL_EXIT[sig]));
  });
}

main().then(
  (code) => {
    if (!stopping) process.exitCode = code;
  },
  (e: unknown) => {
    // after a signal the run breaks as its children stop: the signal's exit status tells the story
    if (stopping) return;
    process.stderr.write(`tapwire-harness: ${e instanceof Error ? e.message : String(e)}\n`);
    if (process.env["TAPWIRE_DEBUG"] && e instanceof Error && e.stack) process.stderr.write(`${e.stack}\n`);
    process.exitCode = 3;
  },
);
