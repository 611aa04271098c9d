/**
 * End to end: the harness bin (engine) with its worker and encoder child processes over real
 * sockets, on short scenarios. Reads the `--json` report.
 */
import { spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isAlive } from "@tapwire/testing";
import { afterAll, describe, expect, test } from "vitest";
import type { Report } from "../src/report/report.js";

const BIN = join(import.meta.dirname, "..", "dist", "bin", "harness.js");
const dir = mkdtempSync(join(tmpdir(), "tapwire-harness-e2e-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
  report: Report | null;
  metricsText: string | null;
}

/** Runs the bin; with `scrapeMetrics`, fetches /metrics once the endpoint is announced. */
function runBin(
  name: string,
  args: string[],
  env: Record<string, string> = {},
  scrapeMetrics = false,
): Promise<Run> {
  const json = join(dir, `${name}.json`);
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, ...args, "--json", json], {
      env: { ...process.env, ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    let metricsText: Promise<string | null> = Promise.resolve(null);
    child.stdout.on("data", (d: Buffer) => {
      stdout += d.toString();
    });
    child.stderr.on("data", (d: Buffer) => {
      const before = stderr;
      stderr += d.toString();
      // scraped once decoding starts (the endpoint itself is up before anything else)
      const m = /metrics on (http:\/\/127\.0\.0\.1:\d+\/metrics)/.exec(stderr);
      const decoding = /decoding \d+ requests/;
      if (scrapeMetrics && m && decoding.test(stderr) && !decoding.test(before)) {
        metricsText = fetch(m[1]!).then(
          (r) => r.text(),
          () => null,
        );
      }
    });
    child.once("error", reject);
    child.once("exit", (code) => {
      let report: Report | null = null;
      try {
        report = JSON.parse(readFileSync(json, "utf8")) as Report;
      } catch {
        report = null;
      }
      void metricsText.then((text) => resolve({ code, stdout, stderr, report, metricsText: text }));
    });
  });
}

/** Small rows keep the suite quick on two busy cores; the protocol is the same at 3 x 4096. */
const SHORT = ["--row", "2x512", "--requests", "16", "--seed", "5", "--mm-share", "0.5"];

function expectClean(r: Run): Report {
  const rep = r.report;
  if (rep === null || r.code !== 0) throw new Error(`exit ${r.code}\n${r.stdout}\n${r.stderr}`);
  expect(rep.ok).toBe(true);
  // lossless: every request identical to target-only decoding, token for token
  expect(rep.lossless.mode).toBe("greedy");
  expect(rep.lossless.ok).toBe(true);
  expect(rep.lossless.mismatched).toBe(0);
  expect(rep.lossless.checked).toBe(16);
  expect(rep.requests.completed).toBe(16);
  expect(rep.tokens.generated).toBe(rep.tokens.targetOnlyGenerated);
  // at least one embedding crossed the data plane
  expect(rep.ec.transfers).toBeGreaterThanOrEqual(1);
  expect(rep.ec.bytes).toBeGreaterThan(0);
  // zero leaked blocks or pins on either side (EC-CONTRACT 8)
  expect(rep.leaks.ok).toBe(true);
  expect(rep.leaks.status).toBe("none");
  expect(rep.processes.unexpectedExits).toEqual([]);
  expect(rep.leaks.consumerPinnedBlocks).toBe(0);
  expect(rep.leaks.consumerInFlightBlocks).toBe(0);
  expect(rep.leaks.consumerRetiredBlocks).toBe(0);
  expect(rep.leaks.producerPinnedBlocks).toBe(0);
  expect(rep.leaks.producerGrants).toBe(0);
  expect(r.stdout).toContain("result: OK (lossless)");
  return rep;
}

describe("tapwire-harness end to end", () => {
  test("greedy: lossless, real speculation, EC transfers, no leaks, Prometheus while running", async () => {
    const r = await runBin("greedy", [...SHORT, "--metrics-port", "0", "--progress", "lines"], {}, true);
    const rep = expectClean(r);
    expect(rep.speculation.meanAcceptedLength).toBeGreaterThan(1.5);
    expect(rep.speculation.tokensPerTargetForward).toBeGreaterThan(1.2);
    expect(rep.client.outcomes["ok"]).toBeGreaterThan(0);
    expect(rep.latency.stepRtt.count).toBeGreaterThan(0);
    expect(rep.ec.statusCounts["OK"]).toBeGreaterThanOrEqual(1);
    // the table carries the numbers the JSON has
    expect(r.stdout).toContain("mean accepted length");
    expect(r.stdout).toContain("tokens per target forward");
    expect(r.metricsText).toContain("tapwire_harness_rounds");
    expect(r.metricsText).toContain("tapwire_client_");
    expect(r.metricsText).toContain("tapwire_ec_");
  });

  test("--draft-transport shm --ec-data shm (issue 23): rows and embeddings through shared memory, lossless, no shm file left", async () => {
    const r = await runBin("shm", [...SHORT, "--draft-transport", "shm", "--ec-data", "shm"]);
    const rep = expectClean(r);
    expect(rep.client.outcomes["ok"]).toBeGreaterThan(0);
    expect(rep.ec.statusCounts["OK"]).toBeGreaterThanOrEqual(1);
    // no fallback warning: the link and the EC data plane really went through the mappings
    expect(r.stderr).not.toMatch(
      /TRANSPORT_SHM|EC_SHM|falling back to the socket|shm data plane unavailable/,
    );
    expect(r.stdout).toContain("link shm");
    expect(r.stdout).toContain("ec data shm");
    // the consumer's reads went through rings (docs/ec-protocol.md 3.4), none fell back
    expect(rep.ec.consumer["data_shm_chunks"]).toBeGreaterThan(0);
    expect(rep.ec.consumer["data_shm_fallbacks"]).toBe(0);
    // every session file was unlinked: none of a process that has exited is left
    const left = readdirSync("/dev/shm").filter((n) => /^tapwire-\d+-/.test(n));
    expect(left.filter((n) => !isAlive(Number(n.split("-")[1])))).toEqual([]);
  });

  test("--faults: worker killed, link stalled, encoder restarted, reply corrupted; still lossless and clean", async () => {
    // --faults holds back part of the traffic until every fault recovered (FaultDriver.arrivalCap)
    const r = await runBin("faults", [...SHORT, "--requests", "24", "--faults", "--progress", "off"]);
    const rep = r.report;
    if (rep === null) throw new Error(`no report: exit ${r.code}\n${r.stdout}\n${r.stderr}`);
    expect(rep.lossless.ok).toBe(true);
    expect(rep.lossless.mismatched).toBe(0);
    expect(rep.requests.completed).toBe(24);
    expect(rep.leaks.ok).toBe(true);
    expect(rep.leaks.producerGrants).toBe(0);
    expect([
      rep.leaks.consumerPinnedBlocks,
      rep.leaks.consumerInFlightBlocks,
      rep.leaks.consumerRetiredBlocks,
    ]).toEqual([0, 0, 0]);
    const kinds = rep.faults.injected.map((f) => f.kind);
    expect(kinds).toContain("link_stall");
    expect(kinds).toContain("worker_kill");
    expect(kinds).toContain("encoder_restart");
    expect(kinds).toContain("corrupt_reply");
    // how each recovered: reconnects, timeouts, refused replies, EC retries or fallbacks
    expect(rep.client.hellos).toBeGreaterThanOrEqual(3);
    expect(rep.client.outcomes["timeout"] ?? 0).toBeGreaterThanOrEqual(1);
    expect(rep.client.outcomes["bad_reply"] ?? 0).toBeGreaterThanOrEqual(1);
    expect(rep.client.connectFailures).toBeGreaterThanOrEqual(1);
    for (const f of rep.faults.injected) {
      expect({ kind: f.kind, recovered: f.recoveredAfterMs !== null }).toEqual({
        kind: f.kind,
        recovered: true,
      });
    }
    const kill = rep.faults.injected.find((f) => f.kind === "worker_kill")!;
    expect(kill.recoveredAfterMs).not.toBeNull();
    expect(kill.recovery["hellos"]).toBeGreaterThanOrEqual(1);
    // the pid it killed, how that process ended, and the pid that replaced it (issue 13 item 5)
    expect(rep.processes.worker.pids).toHaveLength(2);
    expect(kill.killedPid).toBe(rep.processes.worker.pids[0]);
    expect(kill.killedExit).toEqual({ code: null, signal: "SIGKILL" });
    expect(kill.newPid).toBe(rep.processes.worker.pids[1]);
    expect(isAlive(kill.killedPid!)).toBe(false);
    // deaths by --faults are not reported as deaths
    expect(rep.processes.unexpectedExits).toEqual([]);
    const enc = rep.faults.injected.find((f) => f.kind === "encoder_restart")!;
    expect(enc.killedPid).toBe(rep.processes.encoder!.pids[0]);
    expect(enc.killedExit).toEqual({ code: null, signal: "SIGKILL" });
    expect(enc.newPid).toBe(rep.processes.encoder!.pids[1]);
    for (const f of rep.faults.injected.filter(
      (x) => x.kind === "link_stall" || x.kind === "corrupt_reply",
    )) {
      expect([f.killedPid, f.newPid]).toEqual([null, null]);
    }
    expect(
      (enc.recovery["ec_retries"] ?? 0) +
        (enc.recovery["ec_fallbacks"] ?? 0) +
        (enc.recovery["ec_transfers"] ?? 0) +
        (enc.recovery["ec_probes"] ?? 0),
    ).toBeGreaterThan(0);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain("faults injected");
  });

  test("a corrupted embedding makes the run fail the lossless check (exit 1)", async () => {
    const r = await runBin("corrupt", [...SHORT, "--requests", "8", "--mm-share", "1", "--progress", "off"], {
      TAPWIRE_HARNESS_TEST_CORRUPT_EMBEDDING: "1",
    });
    expect(r.code).toBe(1);
    expect(r.report?.lossless.ok).toBe(false);
    expect(r.report?.lossless.mismatched).toBeGreaterThanOrEqual(1);
    expect(r.stdout).toContain("DIFFERS");
  });

  test("usage errors exit 2 naming the flag; --help exits 0", async () => {
    const bad = await runBin("usage", ["--slots", "0"]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("--slots: 0 outside");
    const help = await runBin("help", ["--help"]);
    expect(help.code).toBe(0);
    expect(help.stdout).toContain("--draft-transport");
  });
});
