/** The ec-producer --events mode against the real tapwire-ec-producer bin (a child process). */
import type { ChildHandle } from "@tapwire/testing";
import { killAllChildren, spawnBin } from "@tapwire/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EC_EVENTS_CASES } from "../src/ec/events.js";
import { runEcEventsSuite } from "../src/index.js";
import { binPath } from "./helpers.js";

let p: ChildHandle;
let l: Record<string, unknown> = {};
beforeAll(async () => {
  p = await spawnBin(
    binPath("@tapwire/ec-connector", "tapwire-ec-producer"),
    [
      "--num-blocks",
      "2048",
      "--block-bytes",
      "1024",
      "--prepopulate",
      "conformance-ready:10000",
      "--events-listen",
      "tcp://127.0.0.1:0",
      "--replay-listen",
      "tcp://127.0.0.1:0",
      "--events-heartbeat-ms",
      "300",
      "--log-level",
      "error",
    ],
    { timeoutMs: 30_000 },
  );
  l = p.readyLine.json ?? {};
});
afterAll(async () => {
  await p?.kill("SIGTERM");
  await killAllChildren();
});

describe("tapwire-conformance ec-producer --events against tapwire-ec-producer", () => {
  it("every EC-CONTRACT 10 case runs and none FAILED", { timeout: 240_000 }, async () => {
    const rep = await runEcEventsSuite({
      events: String(l["events"]),
      replay: String(l["replay"]),
      admin: String(l["admin"]),
      control: String(l["control"]),
      compatibilityHash: String(l["compatibilityHash"]),
      mmHash: "conformance-ready",
      numBlocks: 2048,
      blockBytes: 1024,
      // a loaded CI machine: replies may take seconds (the drop window stays 300 ms)
      timeoutMs: 5000,
    });
    // 10.2.6 reports INFORMATIONAL, not judged, when more than 16 messages were published while
    // it asked (a loaded CI machine: seen with 43). Every other verdict must be OK.
    const notJudged = (r: { id: string; verdict: string; expected?: string }) =>
      r.id === "10.2.6" && r.verdict === "INFORMATIONAL" && /published while asking/.test(r.expected ?? "");
    expect(
      rep.results
        .filter((r) => r.verdict !== "OK" && !notJudged(r))
        .map((r) => `${r.id} ${r.verdict}: ${r.expected}; got ${r.got}`),
    ).toEqual([]);
    expect(rep.results.map((r) => r.id)).toEqual(EC_EVENTS_CASES.map((c) => c.id));
  });
});
