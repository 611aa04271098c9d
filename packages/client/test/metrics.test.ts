import { BUCKETS } from "@tapwire/stats";
import { describe, expect, test } from "vitest";
import { RemoteDraftClient } from "../src/index.js";
import { clientOptions } from "./helpers.js";

// The client's STEP RTT histogram uses the same preset as the worker's (20 µs … 1 s), so both
// sides of the link bucket one round trip alike; the registry default would be 10 µs … 10 s.
describe("RemoteDraftClient metrics", () => {
  test("step_rtt_seconds exposes the BUCKETS.STEP_RTT_SECONDS bounds (20 µs … 1 s)", async () => {
    const c = new RemoteDraftClient({ ...clientOptions("tcp://127.0.0.1:1"), autoStart: false });
    try {
      const text = await c.registry.prometheus();
      const les = [...text.matchAll(/^tapwire_client_step_rtt_seconds_bucket\{le="([^"]+)"\}/gm)].map(
        (m) => m[1],
      );
      expect(les).toEqual([...BUCKETS.STEP_RTT_SECONDS.map((b) => String(b)), "+Inf"]);
      expect(les[0]).toBe("0.00002");
      expect(les).not.toContain("10");
    } finally {
      await c.close();
    }
  });
});
