/**
 * `--encoders 2` (EC-CONTRACT 10): the harness bin with two encoder children publishing residency
 * events; the engine's consumer places every transfer through the directory. With `--faults`:
 * a lossy relay drops events, the first encoder is restarted (a new incarnation), a late
 * subscriber builds its views from snapshots. Reads the `--json` report.
 */
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, expect, test } from "vitest";
import type { Report } from "../src/report/report.js";

const BIN = join(import.meta.dirname, "..", "dist", "bin", "harness.js");
const dir = mkdtempSync(join(tmpdir(), "tapwire-harness-encoders-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function run(args: string[]): Promise<{ code: number | null; out: string; report: Report | null }> {
  const json = join(dir, "r.json");
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, ...args, "--json", json], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    child.stdout.on("data", (d: Buffer) => {
      out += d.toString();
    });
    child.stderr.on("data", (d: Buffer) => {
      out += d.toString();
    });
    child.once("error", reject);
    child.once("exit", (code) => {
      let report: Report | null = null;
      try {
        report = JSON.parse(readFileSync(json, "utf8")) as Report;
      } catch {
        report = null;
      }
      resolve({ code, out, report });
    });
  });
}

test("--encoders 2 --faults: lossless, every transfer placed on a trusted holder, the late subscriber agrees", {
  timeout: 180_000,
}, async () => {
  const r = await run([
    ...["--row", "2x512", "--requests", "24", "--seed", "5", "--mm-share", "0.6"],
    ...["--encoders", "2", "--faults", "--progress", "off"],
  ]);
  const rep = r.report;
  if (rep === null || r.code !== 0) throw new Error(`exit ${r.code}\n${r.out}`);
  expect(rep.ok).toBe(true);
  expect(rep.lossless.ok).toBe(true);
  expect(rep.requests.completed).toBe(24);
  expect(rep.leaks.ok).toBe(true);
  const p = rep.placement!;
  expect(p.encoders).toBe(2);
  expect(p.placed).toBeGreaterThan(0);
  expect(p.sentWithoutHolder).toBe(0); // EC-CONTRACT 10.4: none that does not hold it
  expect(p.nackMissingAvoided).toBeGreaterThan(0); // a round robin would have asked the wrong one
  expect(rep.faults.injected.map((f) => f.kind)).toContain("encoder_restart");
  expect(p.late).not.toBeNull();
  expect(p.late!.differences).toBe(0);
  expect(r.out).toContain("placement (2 encoders, residency events)");
});
