/** The ec-producer mode against the real tapwire-ec-producer bin (a child process). */
import type { ChildHandle } from "@tapwire/testing";
import { killAllChildren, spawnBin } from "@tapwire/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ecCompatibilityHash, runEcProducerSuite } from "../src/index.js";
import { binPath } from "./helpers.js";

let p: ChildHandle;
let control = "";
let hash = "";
beforeAll(async () => {
  p = await spawnBin(
    binPath("@tapwire/ec-connector", "tapwire-ec-producer"),
    [
      "--num-blocks",
      "64",
      "--block-bytes",
      "4096",
      "--pin-lease-ms",
      "300",
      "--prepopulate",
      "conformance-ready:10000",
      "--log-level",
      "error",
    ],
    { timeoutMs: 30_000 },
  );
  control = String(p.readyLine.json?.control);
  hash = String(p.readyLine.json?.compatibilityHash);
});
afterAll(async () => {
  await p?.kill("SIGTERM");
  await killAllChildren();
});

describe("tapwire-conformance ec-producer against tapwire-ec-producer", () => {
  it("no case FAILED, the grant, quota and lease cases ran", async () => {
    const rep = await runEcProducerSuite({
      endpoint: control,
      compatibilityHash: hash,
      mmHash: "conformance-ready",
      numBlocks: 64,
      blockBytes: 4096,
      pinLeaseMs: 300,
    });
    expect(
      rep.results.filter((r) => r.verdict === "FAILED").map((r) => `${r.id}: ${r.expected}; got ${r.got}`),
    ).toEqual([]);
    expect(rep.totals.OK).toBe(rep.results.length);
    expect(rep.results.length).toBeGreaterThanOrEqual(40);
  });
  it("the compatibility hash from its inputs is the producer's (EC-CONTRACT 2)", () => {
    expect(ecCompatibilityHash("synthetic-encoder", "bfloat16", 4096, 4096)).toBe(hash);
  });
  it("told the wrong block size, the tester FAILS the ack check (nbytes does not fit the blocks)", async () => {
    const rep = await runEcProducerSuite(
      { endpoint: control, compatibilityHash: hash, mmHash: "conformance-ready", blockBytes: 1000 },
      { cases: "3.1" },
    );
    expect(rep.results.map((r) => [r.id, r.verdict])).toEqual([["3.1", "FAILED"]]);
    expect(rep.results[0]!.got).toMatch(/nbytes 10000 does not fit 3 blocks of 1000/);
  });
  it("docs/ec-protocol.md 3.5 is optional: against --no-data-requests its cases are UNIMPLEMENTED, never FAILED", async () => {
    const q = await spawnBin(
      binPath("@tapwire/ec-connector", "tapwire-ec-producer"),
      [
        "--num-blocks",
        "64",
        "--block-bytes",
        "4096",
        "--prepopulate",
        "conformance-ready:10000",
        "--no-data-requests",
        "--log-level",
        "error",
      ],
      { timeoutMs: 30_000 },
    );
    try {
      const rep = await runEcProducerSuite(
        {
          endpoint: String(q.readyLine.json?.control),
          compatibilityHash: String(q.readyLine.json?.compatibilityHash),
          mmHash: "conformance-ready",
          blockBytes: 4096,
        },
        { cases: "5.3.10,5.3.11,5.3.12,5.3.13" },
      );
      expect(rep.results.map((r) => [r.id, r.verdict])).toEqual([
        ["5.3.10", "OK"],
        ["5.3.11", "UNIMPLEMENTED"],
        ["5.3.12", "UNIMPLEMENTED"],
        ["5.3.13", "UNIMPLEMENTED"],
      ]);
    } finally {
      await q.kill("SIGTERM");
    }
  });
});
