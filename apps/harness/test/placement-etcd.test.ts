/**
 * `--encoders 2 --placement-discovery etcd` (issue 22 x issue 21, EC-CONTRACT 10.3, 10.4): the
 * harness bin starts an etcd child, its two encoder children register (`--register`, records with
 * their residency endpoints), and the engine's directory learns them from etcd, not from a static
 * list. With `--faults` (lossy events, the first encoder restarted with a new incarnation and a
 * new record, a late subscriber): lossless, every transfer placed on a trusted holder. Reads the
 * `--json` report.
 */
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, expect, test } from "vitest";
import type { Report } from "../src/report/report.js";

const BIN = join(import.meta.dirname, "..", "dist", "bin", "harness.js");
const dir = mkdtempSync(join(tmpdir(), "tapwire-harness-placement-etcd-"));
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

test("--encoders 2 --placement-discovery etcd --faults: encoders found through etcd, lossless, placed on holders", {
  timeout: 180_000,
}, async () => {
  const r = await run([
    ...["--row", "2x512", "--requests", "24", "--seed", "7", "--mm-share", "0.6"],
    ...["--encoders", "2", "--placement-discovery", "etcd", "--faults", "--progress", "off"],
  ]);
  const rep = r.report;
  if (rep === null || r.code !== 0) throw new Error(`exit ${r.code}\n${r.out}`);
  expect(rep.ok).toBe(true);
  expect(rep.lossless.ok).toBe(true);
  expect(rep.requests.completed).toBe(24);
  const p = rep.placement!;
  expect(p.discovery).toBe("etcd");
  expect(p.etcdRecords).toBe(2); // the restarted encoder's new record replaced its old one
  expect(p.placed).toBeGreaterThan(0);
  expect(p.sentWithoutHolder).toBe(0); // EC-CONTRACT 10.4
  expect(rep.faults.injected.map((f) => f.kind)).toContain("encoder_restart");
  expect(p.late).not.toBeNull();
  expect(p.late!.differences).toBe(0);
  expect(r.out).toContain("encoders found through");
});

test("--placement-discovery etcd needs two encoders in a classic run", async () => {
  const r = await run(["--encoders", "1", "--placement-discovery", "etcd", "--progress", "off"]);
  expect(r.code).not.toBe(0);
  expect(r.out).toContain("--placement-discovery");
});
