// A multi-instance harness run (issue 21, CONTRACT 12.2) end to end: two engines, each with its
// own WorkerPool, over three shared tapwire-worker processes found through a real etcd child,
// with --faults: one worker killed with SIGKILL mid-run (and back with a new incarnation), a
// fourth worker started mid-run, one stopped cleanly, etcd stopped for 10 s. Checked from the
// report: every engine lossless, failover within 2 rounds, the new worker discovered within one
// lease TTL and given work, no failed STEP at the cleanly stopped worker, no member lost while
// etcd was away.
import { expect, test } from "vitest";
import { parseArgs } from "../src/cli/cli.js";
import { runMulti } from "../src/multi/run-multi.js";

test("--engines 2 --workers 3 --discovery etcd --faults: lossless through kill -9, join, clean stop and etcd down", async () => {
  const parsed = parseArgs([
    "--engines",
    "2",
    "--workers",
    "3",
    "--discovery",
    "etcd",
    "--faults",
    "--etcd-down-ms",
    "10000",
    "--requests",
    "24",
    "--hidden",
    "256",
    "--progress",
    "off",
  ]);
  if (parsed.help) throw new Error("unexpected --help");
  const config = parsed.config;
  const lines: string[] = [];
  const { report, exitCode } = await runMulti(config, (l) => lines.push(l));
  expect(exitCode, lines.join("\n")).toBe(0);
  console.log(
    JSON.stringify({
      failover_rounds: report.failover_rounds,
      discovered_ms: report.discovered_ms,
      etcd: report.etcd?.down,
      workers: report.workers.map((w) => [w.id, w.steps, w.stepsFailed, w.failoversOut, w.peakSlots]),
      engines: report.engines.map((e) => [e.id, e.rounds, e.maxRoundMs, e.roundsWithoutDrafts]),
    }),
  );
  for (const e of report.engines) {
    expect(e.lossless.ok).toBe(true);
    expect(e.lossless.checked).toBe(24);
  }
  // the killed worker's slots drafted elsewhere within 2 rounds of the first failed STEP
  expect(report.failover_rounds.n).toBeGreaterThan(0);
  expect(report.failover_rounds.max).toBeLessThanOrEqual(2);
  const killed = report.workers.find((w) => w.events.some((x) => x.includes("SIGKILL")))!;
  // its slots moved (after a failed STEP, or at once when its connection was seen to close)
  expect(killed.failoversOut).toBeGreaterThan(0);
  expect(killed.pids.length).toBe(2);
  // the worker started mid-run: found through etcd (a watch event) within one TTL, and given STEPs
  expect(report.discovered_ms).not.toBeNull();
  expect(report.discovered_ms!).toBeLessThan(report.ttl_s! * 1000);
  expect(report.workers.length).toBe(4);
  expect(report.workers[3]!.steps).toBeGreaterThan(0);
  // the clean stop left every pool without a failed STEP
  const stopped = report.workers.find((w) => w.failedStepsAfterCleanStop !== null)!;
  // (a STEP timeout of a loaded machine before the stop may count in stepsFailed: not judged here)
  expect(stopped.failedStepsAfterCleanStop, JSON.stringify(stopped)).toBe(0);
  // one encoder per engine; encoder-0 killed with SIGKILL and restarted: still lossless
  expect(report.encoders.length).toBe(2);
  expect(report.encoders[0]!.pids.length).toBe(2);
  expect(report.unexpectedExits).toEqual([]);
  // etcd away for 10 s: no member lost
  const down = report.etcd!.down!;
  expect(down.ms).toBe(10_000);
  expect(down.membersDuring[0]).toBe(Math.min(...down.membersBefore));
  expect(down.membersAfter).toEqual(down.membersBefore);
}, 180_000);
