/**
 * The tester must fail a broken worker: a proxy in front of a conforming tapwire-worker plants
 * one defect at a time, and exactly the cases that check that rule FAIL.
 */
import type { ChildHandle } from "@tapwire/testing";
import { killAllChildren } from "@tapwire/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runWorkerSuite } from "../src/index.js";
import type { Defects } from "./helpers.js";
import { spawnWorker, startBrokenProxy } from "./helpers.js";

let w: { child: ChildHandle; endpoints: Record<string, string> };
beforeAll(async () => {
  w = await spawnWorker("null");
});
afterAll(async () => {
  await w?.child.kill("SIGTERM");
  await killAllChildren();
});

async function failedWith(d: Defects, cases?: string): Promise<string[]> {
  const port = Number(w.endpoints.tcp!.split(":").pop());
  const proxy = await startBrokenProxy(port, d);
  try {
    const rep = await runWorkerSuite(
      { endpoint: proxy.endpoint, timeoutMs: 1000 },
      cases !== undefined ? { cases } : {},
    );
    return rep.results.filter((r) => r.verdict === "FAILED").map((r) => r.id);
  } finally {
    await proxy.close();
  }
}

describe("a deliberately non-conforming worker", () => {
  it("the proxy alone (no defect) passes what the worker passes", async () => {
    expect(await failedWith({}, "3.*,4.*,5.*,6.*,7.*,8*,10.*")).toEqual([]);
  });
  it("writes big-endian length prefixes: the tester stops at discovery, naming the byte order", async () => {
    const port = Number(w.endpoints.tcp!.split(":").pop());
    const proxy = await startBrokenProxy(port, { bigEndianReplies: true });
    try {
      await expect(runWorkerSuite({ endpoint: proxy.endpoint, timeoutMs: 1000 })).rejects.toThrow(
        /big-endian/,
      );
    } finally {
      await proxy.close();
    }
  });
  it("accepts a big-endian request prefix", async () => {
    expect(await failedWith({ lenientPrefix: true }, "3.*,4.*,6.1.*")).toEqual(["3.1.8", "3.1.9", "3.1.11"]);
  });
  it("consumes the seq of a STEP answered BAD_FRAME", async () => {
    expect(await failedWith({ consumeBadFrameSeq: true }, "3.*,4.*,5.*,6.*,7.*,8*,10.*")).toEqual([
      "4.1.25",
      "5.1.2",
      "5.1.3",
      // every structural case re-sends the refused seq; 7.2.28 is TOO_LARGE, not BAD_FRAME
      ...Array.from({ length: 27 }, (_, i) => `7.2.${i + 1}`),
      "7.2.29",
    ]);
  });
  it("keeps windows across a new session", async () => {
    expect(await failedWith({ keepWindowsAcrossSessions: true }, "3.*,4.*,5.*,6.*,7.*,8*,10.*")).toEqual([
      "6.1.2", // windows_kept 0 for a new session
      "6.2.20", // windows dropped
      "6.2.21", // generations dropped
      "6.2.22", // the new session's seq is its HELLO's
      "6.2.24", // the other connections are unbound
      "6.2.25",
      "6.2.27",
      "6.2.28",
    ]);
  });
});
