// A multi-instance harness run (issue 21, CONTRACT 12.2) end to end: two engine processes, each
// with its own WorkerPool, over three shared tapwire-worker processes and two shared encoders
// (EC-CONTRACT 10), all found through a real etcd child, with --faults: one worker killed with
// SIGKILL mid-run (and back with a new incarnation), an encoder killed with SIGKILL and restarted,
// a fourth worker started mid-run, one stopped cleanly, etcd stopped for 10 s. Checked from the
// report: every engine process lossless, failover within 2 rounds, the new worker discovered
// within one lease TTL and given work, no failed STEP at the cleanly stopped worker, no member
// lost while etcd was away, the encoders shared by both engines and found through etcd.
// The engines run from dist/ (`pnpm build` first, as for the bin tests).
import { isAlive, waitUntil } from "@tapwire/testing";
import { afterAll, expect, test } from "vitest";
import { parseArgs } from "../src/cli/cli.js";
import { MULTI_TTL_S, runMulti } from "../src/multi/run-multi.js";
import { type BinRun, startBin } from "./bin-helpers.js";

const runs: BinRun[] = [];
const pids: number[] = [];
afterAll(() => {
  for (const r of runs) if (r.child.exitCode === null) r.child.kill("SIGKILL");
  for (const p of pids) if (isAlive(p)) process.kill(p, "SIGKILL");
});

test("--engines 2 --workers 3 --encoders 2 --discovery etcd --faults: lossless through kill -9, join, clean stop and etcd down", async () => {
  const parsed = parseArgs([
    "--engines",
    "2",
    "--workers",
    "3",
    "--encoders",
    "2",
    "--mm-share",
    "0.5",
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
      engines: report.engines.map((e) => [
        e.id,
        e.pids,
        e.rounds,
        e.maxRoundMs,
        e.roundsWithoutDrafts,
        e.media,
      ]),
      encoders: report.encoders.map((x) => [x.id, x.servedEngines, x.events]),
      encoder_trusted_again_ms: report.encoder_trusted_again_ms,
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
  // the engines are processes of their own (not the test's), one each
  const enginePids = report.engines.map((e) => e.pids);
  for (const p of enginePids) expect(p.length).toBe(1);
  expect(new Set(enginePids.flat()).size).toBe(2);
  expect(enginePids.flat()).not.toContain(process.pid);
  // every process of the run is listed with its pids
  const roles = report.processes.map((p) => p.role);
  expect(roles.filter((r) => r === "engine").length).toBe(2);
  expect(roles.filter((r) => r === "worker").length).toBe(4);
  expect(roles.filter((r) => r === "encoder").length).toBe(2);
  expect(roles).toContain("etcd");
  for (const p of report.processes) expect(p.pids.length, p.id).toBeGreaterThan(0);
  // two encoders shared by both engines (not one per engine), registered in etcd and found
  // there by every engine's directory
  expect(report.encoders.length).toBe(2);
  for (const x of report.encoders) expect(x.registered).toBe(true);
  for (const e of report.engines) {
    expect(e.media.discovery).toBe("etcd");
    expect(e.media.encodersSeen).toEqual(report.encoders.map((x) => x.endpoint).sort());
    expect(e.media.transfers).toBeGreaterThan(0);
  }
  expect(report.encoders.some((x) => Object.keys(x.servedEngines).length === 2)).toBe(true);
  // EC-CONTRACT 10.4: engine-1 starts after engine-0, so some of its items are already resident
  // at an encoder and placed there through its directory (not only encoded on a miss)
  expect(report.engines.reduce((n, e) => n + e.media.placed, 0)).toBeGreaterThan(0);
  // encoder-0 killed with SIGKILL mid-run and restarted: still lossless (above), trusted again by
  // every engine (the bounded wait ended before its limit)
  expect(report.encoders[0]!.pids.length).toBe(2);
  expect(report.encoder_trusted_again_ms).not.toBeNull();
  expect(report.encoder_trusted_again_ms!).toBeLessThan(MULTI_TTL_S * 3000);
  expect(report.unexpectedExits).toEqual([]);
  // etcd away for 10 s: no member lost
  const down = report.etcd!.down!;
  expect(down.ms).toBe(10_000);
  expect(down.membersDuring[0]).toBe(Math.min(...down.membersBefore));
  expect(down.membersAfter).toEqual(down.membersBefore);
}, 180_000);

// Issue 19 x issue 21: SIGKILL of a multi-instance harness leaves no process behind: its engine
// processes, workers and encoders see their stdin pipe end (--exit-with-parent) and exit, and so
// does etcd (its keeper kills it).
test("SIGKILL of the harness mid-run: engines, workers, encoders and etcd all exit", async () => {
  const run = startBin(
    [
      "--engines",
      "2",
      "--workers",
      "1",
      "--encoders",
      "1",
      "--discovery",
      "etcd",
      "--requests",
      "400",
      "--rate",
      "20",
      "--hidden",
      "256",
      "--progress",
      "off",
    ],
    {},
  );
  runs.push(run);
  const etcd = await run.waitFor(/^\[harness\] etcd at \S+ \(pid (\d+), keeper pid (\d+)\)/, 90_000);
  const worker = await run.waitFor(/^\[harness\] worker-0 pid (\d+) listening/, 90_000);
  const encoder = await run.waitFor(/^\[harness\] encoder pid (\d+) listening/, 90_000);
  const engines = await run.waitFor(/^\[harness\] 2 engine processes \(pids (\d+), (\d+)\)/, 120_000);
  const children = [etcd[1], etcd[2], worker[1], encoder[1], engines[1], engines[2]].map(Number);
  pids.push(...children);
  for (const p of children) expect(isAlive(p), `pid ${p}`).toBe(true);
  run.child.kill("SIGKILL");
  await run.exited;
  await waitUntil(() => children.every((p) => !isAlive(p)), {
    timeoutMs: 30_000,
    what: `children ${children.join(", ")} to exit after the harness's SIGKILL`,
  });
}, 180_000);

// The static layout (no etcd): the engines are given the workers' endpoints and the encoders'
// records (control, events, replay) by the harness; SIGKILL of an encoder and of a worker mid-run.
test("--engines 2 --workers 3 --encoders 2 --discovery static --faults: lossless, encoders shared from a static list", async () => {
  const parsed = parseArgs([
    "--engines",
    "2",
    "--workers",
    "3",
    "--encoders",
    "2",
    "--mm-share",
    "0.5",
    "--discovery",
    "static",
    "--faults",
    "--requests",
    "16",
    "--hidden",
    "256",
    "--progress",
    "off",
  ]);
  if (parsed.help) throw new Error("unexpected --help");
  const lines: string[] = [];
  const { report, exitCode } = await runMulti(parsed.config, (l) => lines.push(l));
  expect(exitCode, lines.join("\n")).toBe(0);
  expect(report.etcd).toBeNull();
  expect(new Set(report.engines.flatMap((e) => e.pids)).size).toBe(2);
  for (const e of report.engines) {
    expect(e.lossless.ok).toBe(true);
    expect(e.media.discovery).toBe("static");
    expect(e.media.encodersSeen.length).toBe(2);
  }
  expect(report.encoders.length).toBe(2);
  expect(report.encoders.some((x) => Object.keys(x.servedEngines).length === 2)).toBe(true);
  expect(report.encoders[0]!.pids.length).toBe(2);
  expect(report.failover_rounds.n).toBeGreaterThan(0);
  expect(report.failover_rounds.max).toBeLessThanOrEqual(2);
  expect(report.unexpectedExits).toEqual([]);
}, 180_000);
