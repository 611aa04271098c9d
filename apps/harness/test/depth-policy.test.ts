/**
 * `--depth-policy fixed:K|budget|goodput` (docs/depth-policy.md): the flag, the simulated-time
 * loop of `bench:depth`, calibration recovering a deliberately miscalibrated reference head, and
 * the harness bin lossless in every mode with the policy's report (goodput, depths, ECE).
 */
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { VerifyCostModel } from "@tapwire/client";
import { createDefaultPair } from "@tapwire/reference-model";
import { afterAll, describe, expect, test } from "vitest";
import { parseArgs } from "../src/cli/cli.js";
import {
  depthPolicyName,
  makeDepthPolicy,
  parseDepthPolicy,
  scaleConfidenceTemperatures,
  simulateDepth,
  traceRequests,
} from "../src/depth/depth-sim.js";
import type { Report } from "../src/report/report.js";

const BIN = join(import.meta.dirname, "..", "dist", "bin", "harness.js");
const dir = mkdtempSync(join(tmpdir(), "tapwire-harness-depth-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("--depth-policy", () => {
  test("parses fixed:K (K <= N), budget, goodput; goodput is the default; anything else is a usage error", () => {
    expect(parseDepthPolicy("fixed:0", 4)).toEqual({ kind: "fixed", depth: 0 });
    expect(parseDepthPolicy("fixed:4", 4)).toEqual({ kind: "fixed", depth: 4 });
    expect(parseDepthPolicy("fixed:5", 4)).toBeNull();
    expect(parseDepthPolicy("budget", 4)).toEqual({ kind: "budget" });
    expect(parseDepthPolicy("goodput", 4)).toEqual({ kind: "goodput", calibrate: true });
    expect(parseDepthPolicy("fast", 4)).toBeNull();
    expect(depthPolicyName({ kind: "fixed", depth: 3 })).toBe("fixed:3");
    const parsed = parseArgs([]);
    expect(parsed.help === false && parsed.config.depthPolicy).toBe("goodput");
    const fixed = parseArgs(["--depth-policy", "fixed:2"]);
    expect(fixed.help === false && fixed.config.depthPolicy).toBe("fixed:2");
    for (const bad of ["fixed:9", "fixed", "everything"]) {
      expect(() => parseArgs(["--depth-policy", bad])).toThrow(/--depth-policy/);
    }
  });
});

describe("calibration of a miscalibrated reference head (simulated time)", () => {
  test("temperatures x0.5 and x2: after warm-up ECE within 0.02 of the calibrated head's, goodput within 2 %", () => {
    const N = 4;
    const { target, head } = createDefaultPair({ draft: { numSpec: N, calibrationRounds: 96 } });
    const cost = new VerifyCostModel({ online: false });
    const run = (factor: number) => {
      const h = factor === 1 ? head : scaleConfidenceTemperatures(head, target, factor);
      const traces = traceRequests(target, h, {
        count: 24,
        length: 48,
        numSpec: N,
        promptTokens: 16,
        seed: 3,
      });
      const setup = makeDepthPolicy({ kind: "goodput", calibrate: true }, { numSpec: N, budget: 16 });
      return simulateDepth({ traces, concurrency: 48, rounds: 600, warmupRounds: 300, setup, cost });
    };
    const base = run(1);
    for (const factor of [0.5, 2]) {
      const r = run(factor);
      // the raw confidences are visibly off; the calibrated ones are as good as the real head's
      expect(r.ece.rawOverall).toBeGreaterThan(base.ece.rawOverall + 0.05);
      expect(Math.abs(r.ece.calibratedOverall - base.ece.calibratedOverall)).toBeLessThan(0.02);
      expect(Math.abs(r.goodput / base.goodput - 1)).toBeLessThan(0.02);
    }
  });

  test("the scaled head drafts the same ids with other confidences", () => {
    const { target, head } = createDefaultPair({ draft: { numSpec: 2, calibrationRounds: 8 } });
    const sharp = scaleConfidenceTemperatures(head, target, 0.5);
    const a = traceRequests(target, head, { count: 2, length: 8, numSpec: 2, promptTokens: 4, seed: 1 });
    const b = traceRequests(target, sharp, { count: 2, length: 8, numSpec: 2, promptTokens: 4, seed: 1 });
    expect(Array.from(b.match)).toEqual(Array.from(a.match));
    let higher = 0;
    for (let i = 0; i < a.conf.length; i++) if (b.conf[i]! > a.conf[i]!) higher++;
    expect(higher).toBeGreaterThan(a.conf.length / 2);
  });
});

describe("the harness bin in every depth-policy mode", () => {
  test.each(["fixed:2", "budget", "goodput"])(
    "--depth-policy %s: lossless, and the report shows the policy",
    (p) => {
      const json = join(dir, `${p.replace(":", "-")}.json`);
      const r = spawnSync(
        process.execPath,
        [
          BIN,
          "--row",
          "1x256",
          "--requests",
          "6",
          "--seed",
          "7",
          "--mm-share",
          "0",
          "--depth-policy",
          p,
          "--json",
          json,
        ],
        { encoding: "utf8", timeout: 120_000 },
      );
      expect(r.status, `${r.stdout}\n${r.stderr}`).toBe(0);
      const rep = JSON.parse(readFileSync(json, "utf8")) as Report;
      expect(rep.lossless.ok).toBe(true);
      expect(rep.lossless.mismatched).toBe(0);
      const dp = rep.depthPolicy!;
      expect(dp.policy).toBe(p);
      expect(dp.goodputSimulated).toBeGreaterThan(0);
      expect(dp.depthHistogram).toHaveLength(5);
      expect(dp.ece.raw).toHaveLength(4);
      if (p === "fixed:2") expect(dp.depthHistogram.slice(3)).toEqual([0, 0]);
      expect(r.stdout).toContain("depth policy");
      expect(r.stdout).toContain("ECE raw -> calibrated");
    },
  );
});
