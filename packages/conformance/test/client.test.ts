/** The client mode against tapwire's RemoteDraftClient + RoundCore (the CI driver of the package). */
import { freePort, uniqueSocketPath } from "@tapwire/testing";
import { afterAll, describe, expect, it } from "vitest";
import { runClientSuite } from "../src/index.js";
import type { Driver } from "./client-driver.js";
import { DRIVER_GEOMETRY, startDriver } from "./client-driver.js";

let driver: Driver | null = null;
afterAll(async () => {
  await driver?.stop();
});

describe("tapwire-conformance client against RemoteDraftClient", () => {
  it("tcp: no case FAILED; each fatal case disabled a client with a reason", async () => {
    const rep = await runClientSuite({
      listen: "tcp://127.0.0.1:0",
      window: DRIVER_GEOMETRY.window,
      numSpec: DRIVER_GEOMETRY.numSpec,
      vocab: DRIVER_GEOMETRY.vocabSize,
      numTaps: DRIVER_GEOMETRY.numTaps,
      hidden: DRIVER_GEOMETRY.hidden,
      backoffMs: 300,
      timeoutMs: 3000,
      disableWaitMs: 550,
      onListening: (ep) => {
        driver = startDriver(ep);
      },
    });
    const failed = rep.results
      .filter((r) => r.verdict === "FAILED")
      .map((r) => `${r.id}: expected ${r.expected}; got ${r.got}`);
    expect(failed).toEqual([]);
    expect(rep.results.length).toBeGreaterThanOrEqual(50);
    expect(driver!.disabledReasons.length).toBeGreaterThanOrEqual(20);
  });
});

describe("tapwire-conformance client: TOP32 sessions and a judgement that bites", () => {
  it("TOP32: the sampled-value cases run and pass", async () => {
    let d: Driver | null = null;
    try {
      const rep = await runClientSuite(
        {
          listen: "tcp://127.0.0.1:0",
          ...{ window: 8, numSpec: 4, vocab: 1000, numTaps: 1, hidden: 8 },
          backoffMs: 300,
          timeoutMs: 3000,
          disableWaitMs: 550,
          onListening: (ep) => {
            d = startDriver(ep, { sampleMode: "top32" });
          },
        },
        { cases: "9.1.1,9.2.12,9.2.21,9.2.22,9.3.19" },
      );
      const v = Object.fromEntries(rep.results.map((r) => [r.id, r.verdict]));
      expect(rep.results.filter((r) => r.verdict === "FAILED").map((r) => `${r.id}: ${r.got}`)).toEqual([]);
      expect([v["9.2.21"], v["9.2.22"], v["9.3.19"]]).toEqual(["OK", "OK", "OK"]);
    } finally {
      await (d as Driver | null)?.stop();
    }
  });
  for (const scheme of ["unix", "zmq+tcp"] as const) {
    it(`${scheme}: one case of each reaction passes`, async () => {
      let d: Driver | null = null;
      const listen =
        scheme === "unix"
          ? `unix://${uniqueSocketPath("conf-client")}`
          : `zmq+tcp://127.0.0.1:${await freePort()}`;
      try {
        const rep = await runClientSuite(
          {
            listen,
            ...{ window: 8, numSpec: 4, vocab: 1000, numTaps: 1, hidden: 8 },
            backoffMs: 300,
            timeoutMs: 3000,
            disableWaitMs: 550,
            onListening: (ep) => {
              d = startDriver(ep);
            },
          },
          { cases: "9.1.1,9.1.2,9.2.1,9.2.12,9.2.23,9.2.27,9.2.29,9.2.31,9.3.8" },
        );
        expect(rep.results.filter((r) => r.verdict === "FAILED").map((r) => `${r.id}: ${r.got}`)).toEqual([]);
        expect(rep.totals.OK).toBe(9);
      } finally {
        await (d as Driver | null)?.stop();
      }
    });
  }
  it("a client that reconnects sooner than the backoff it was said to have FAILS the backoff cases", async () => {
    let d: Driver | null = null;
    try {
      const rep = await runClientSuite(
        {
          listen: "tcp://127.0.0.1:0",
          ...{ window: 8, numSpec: 4, vocab: 1000, numTaps: 1, hidden: 8 },
          backoffMs: 2000, // the driver's client really waits 300 ms
          timeoutMs: 3000,
          onListening: (ep) => {
            d = startDriver(ep);
          },
        },
        { cases: "9.1.1,9.2.29,9.2.27" },
      );
      const v = Object.fromEntries(rep.results.map((r) => [r.id, r.verdict]));
      expect(v["9.2.29"]).toBe("FAILED"); // BUSY: reconnect with backoff
      expect(v["9.2.27"]).toBe("OK"); // NO_SESSION: at once
      expect(rep.results.find((r) => r.id === "9.2.29")?.expected).toMatch(/after the backoff/);
    } finally {
      await (d as Driver | null)?.stop();
    }
  });
});
