/**
 * The serving harness (apps/harness: engine + worker + encoder processes over real sockets) with
 * `--drafter onnx`: the worker serves the head's ONNX export; the run is lossless and its mean
 * accepted length equals the reference drafter's for the same seed (the default workload with 24
 * requests and a fixed verification depth, so that the depth cannot follow machine timing); the
 * worker's identities are those the engine HELLOs with (a mismatch would leave every round
 * target-only).
 */
import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { tempDir } from "./helpers.js";

const HARNESS = join(import.meta.dirname, "..", "..", "..", "apps", "harness");
const BIN = join(HARNESS, "dist", "bin", "harness.js");

interface Report {
  ok: boolean;
  lossless: { ok: boolean; mode: string; checked: number };
  rounds: { total: number; withDrafts: number; targetOnly: number };
  speculation: { meanAcceptedLength: number };
  worker: { counters: Record<string, number> } | null;
}

function harness(
  drafter: string,
  json: string,
): Promise<{ code: number | null; stderr: string; report: Report }> {
  // Run from the harness package, as `pnpm start` does: the worker finds @tapwire/drafter-onnx
  // through the harness's dependencies (no NODE_PATH from the test runner).
  const env = { ...process.env };
  delete env["NODE_PATH"];
  return new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      [
        BIN,
        "--drafter",
        drafter,
        "--requests",
        "24",
        "--depth-policy",
        "fixed:4",
        // A STEP that timed out on a loaded machine would make a round target-only and shift
        // the rounds after it: the comparison wants every round drafted in both runs.
        "--step-timeout-ms",
        "20000",
        "--progress",
        "off",
        "--json",
        json,
      ],
      { cwd: HARNESS, env, stdio: ["ignore", "ignore", "pipe"] },
    );
    let stderr = "";
    child.stderr.on("data", (d: Buffer) => {
      stderr += d.toString();
    });
    child.once("error", reject);
    child.once("exit", (code) => {
      try {
        resolve({ code, stderr, report: JSON.parse(readFileSync(json, "utf8")) as Report });
      } catch (e) {
        reject(
          new Error(`harness --drafter ${drafter} exited ${code} without a report: ${stderr}`, { cause: e }),
        );
      }
    });
  });
}

describe("pnpm start -- --drafter onnx", () => {
  const t = tempDir();
  afterAll(() => t.remove());

  it("is lossless with the same mean accepted length as the reference drafter (seed 1)", async () => {
    expect(existsSync(BIN), "apps/harness is built").toBe(true);
    const ref = await harness("reference", join(t.dir, "reference.json"));
    const onnx = await harness("onnx", join(t.dir, "onnx.json"));
    for (const [name, r] of [
      ["reference", ref],
      ["onnx", onnx],
    ] as const) {
      expect(r.code, `${name}: ${r.stderr}`).toBe(0);
      expect(r.report.ok, name).toBe(true);
      expect(r.report.lossless.ok, name).toBe(true);
      expect(r.report.rounds.withDrafts, name).toBeGreaterThan(0);
      expect(r.report.worker?.counters["entries_draft_failed"] ?? 0, name).toBe(0);
      expect(r.report.worker?.counters["replies_identity_mismatch"] ?? 0, name).toBe(0);
    }
    expect(onnx.report.speculation.meanAcceptedLength).toBe(ref.report.speculation.meanAcceptedLength);
    expect(onnx.report.speculation.meanAcceptedLength).toBeGreaterThan(1.5);
  });
});
