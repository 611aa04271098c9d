// `--trace FILE` (issue 24, docs/trace.md): a trace recorded by a real harness run (bin, child
// processes, real sockets) replays with tapwire-replay against a freshly started tapwire-worker
// serving the same head with 0 differences; a 48-request run with `--trace-rows none` writes a
// trace under 5 MiB.
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { killAllChildren, spawnBin } from "@tapwire/testing";
import { readTrace } from "@tapwire/trace";
import { afterAll, expect, test } from "vitest";
import { readReport, startBin } from "./bin-helpers.js";

const dir = mkdtempSync(join(tmpdir(), "tapwire-harness-trace-"));
afterAll(async () => {
  await killAllChildren();
  rmSync(dir, { recursive: true, force: true });
});

const require = createRequire(import.meta.url);
const pkgDir = (name: string) => dirname(require.resolve(`${name}/package.json`));
const REPLAY = join(pkgDir("@tapwire/trace"), "dist", "bin", "replay.js");
const WORKER = join(pkgDir("@tapwire/worker"), "dist", "bin", "worker.js");

async function harness(args: string[]): Promise<{ code: number | null; stderr: string[] }> {
  const progress = args.includes("--progress") ? [] : ["--progress", "off"];
  const run = startBin([...progress, "--step-timeout-ms", "20000", ...args]);
  const { code } = await run.exited;
  return { code, stderr: run.stderr };
}

test("a harness run's trace replays against a fresh worker with 0 differences", async () => {
  const trace = join(dir, "run.trace");
  const json = join(dir, "run.json");
  const r = await harness(["--requests", "12", "--trace", trace, "--json", json, "--progress", "lines"]);
  expect(r.code, r.stderr.join("\n")).toBe(0);
  expect(
    r.stderr.some((l) =>
      /trace .*run\.trace: \d+ records, \d+ bytes, 0 STEPs without rows, 0 dropped/.test(l),
    ),
  ).toBe(true);
  const t = readTrace(trace);
  expect(t.complete).toBe(true);
  expect(t.header.writerName).toBe("tapwire-harness");
  const report = readReport(json);
  // the harness's default head: the worker bin distils the same one from the same flags
  const w = await spawnBin(
    WORKER,
    ["--hidden", "4096", "--listen", "tcp://127.0.0.1:0", "--log-level", "warn"],
    {
      timeoutMs: 60_000,
    },
  );
  const endpoint = ((w.readyLine.json?.endpoints ?? []) as string[])[0]!;
  const rep = spawnSync(
    process.execPath,
    [REPLAY, "--trace", trace, "--endpoint", endpoint, "--fast", "--json"],
    {
      encoding: "utf8",
      timeout: 120_000,
    },
  );
  expect(rep.status, rep.stderr).toBe(0);
  const parity = JSON.parse(rep.stdout) as {
    identical: boolean;
    steps: number;
    entriesCompared: number;
    differenceCount: number;
  };
  expect(parity.identical).toBe(true);
  expect(parity.differenceCount).toBe(0);
  expect(parity.steps).toBeGreaterThanOrEqual(report.rounds.withDrafts);
  expect(parity.entriesCompared).toBeGreaterThan(0);
  // with the recorded pacing the replay takes at least as long as the trace did (a lower bound)
  const span = (t.records.at(-1)!.tUs - t.records[0]!.tUs) / 1000;
  const t0 = performance.now();
  const paced = spawnSync(process.execPath, [REPLAY, "--trace", trace, "--endpoint", endpoint, "--json"], {
    encoding: "utf8",
    timeout: 120_000,
  });
  expect(paced.status, paced.stderr).toBe(0);
  expect(performance.now() - t0).toBeGreaterThanOrEqual(span * 0.95);
  expect((JSON.parse(paced.stdout) as { identical: boolean }).identical).toBe(true);
  await w.kill("SIGTERM");
}, 180_000);

test("a sampled (TOP32) harness run's trace replays with the same masks, supports and proposals", async () => {
  const trace = join(dir, "sampled.trace");
  const r = await harness(["--sample", "--requests", "40", "--trace", trace]);
  expect(r.code, r.stderr.join("\n")).toBe(0);
  expect(readTrace(trace).header.hello.sampleMode).toBe(1);
  const w = await spawnBin(
    WORKER,
    ["--hidden", "4096", "--listen", "tcp://127.0.0.1:0", "--log-level", "warn"],
    {
      timeoutMs: 60_000,
    },
  );
  const endpoint = ((w.readyLine.json?.endpoints ?? []) as string[])[0]!;
  const rep = spawnSync(
    process.execPath,
    [REPLAY, "--trace", trace, "--endpoint", endpoint, "--fast", "--json"],
    {
      encoding: "utf8",
      timeout: 120_000,
    },
  );
  expect(rep.status, rep.stderr).toBe(0);
  const parity = JSON.parse(rep.stdout) as {
    identical: boolean;
    entriesCompared: number;
    differenceCount: number;
  };
  expect(parity.differenceCount).toBe(0);
  expect(parity.entriesCompared).toBeGreaterThan(0);
  await w.kill("SIGTERM");
}, 180_000);

test("a 48-request run's trace with --trace-rows none is < 5 MiB; --svg writes its pictures", async () => {
  const trace = join(dir, "norows.trace");
  const svg = join(dir, "svg");
  const json = join(dir, "48.json");
  const r = await harness([
    "--requests",
    "48",
    "--trace",
    trace,
    "--trace-rows",
    "none",
    "--json",
    json,
    "--svg",
    svg,
  ]);
  expect(r.code, r.stderr.join("\n")).toBe(0);
  // --svg: the report's pictures, with the report's numbers in them
  const report = readReport(json);
  const acc = readFileSync(join(svg, "acceptance-per-position.svg"), "utf8");
  for (const v of report.specDecode!.acceptanceByPosition)
    expect(acc).toContain(`>${(100 * v).toFixed(1)}%</text>`);
  expect(readFileSync(join(svg, "step-rtt.svg"), "utf8")).toContain("STEP RTT histogram");
  expect(readFileSync(join(svg, "goodput-vs-depth.svg"), "utf8")).toContain("<polyline");
  const size = statSync(trace).size;
  console.log(`48-request harness trace without rows: ${size} bytes`);
  expect(size).toBeLessThan(5 * 1024 * 1024);
  const t = readTrace(trace);
  expect(t.header.rowsPolicy).toBe("none");
  expect(t.complete).toBe(true);
}, 180_000);

test("--trace-rows and --ui-listen are checked before the run", async () => {
  for (const [args, msg] of [
    [["--trace-rows", "some"], /--trace-rows: "some"/],
    [["--ui-listen", "nohost"], /--ui-listen/],
  ] as const) {
    const r = await harness([...args]);
    expect(r.code).toBe(2);
    expect(r.stderr.join("\n")).toMatch(msg);
  }
});
