import { describe, expect, test } from "vitest";
import { BUCKETS, Registry, serveMetrics } from "../src/index.js";
import { parseExposition } from "./prom-parse.js";
import { promtoolCheck } from "./promtool.js";

const get = async (port: number, path: string, method = "GET") => {
  const res = await fetch(`http://127.0.0.1:${port}${path}`, { method });
  return { status: res.status, body: await res.text(), type: res.headers.get("content-type") };
};

/** Registries shaped like the real bins' (prefixes, counters, gauges, info, histograms of each unit). */
function realistic(): Registry[] {
  const w = new Registry({ prefix: "tapwire_worker_" });
  w.counter("steps", "STEP requests answered").inc(7);
  w.counter("declined_total", "STEP requests declined").inc(1);
  w.gauge("slots_in_use", "slots holding a sequence").set(3);
  w.info("drafter", "drafter identity").set('noise=0.2 "rank"=8');
  const step = w.histogram("step_seconds", { help: "STEP time", buckets: BUCKETS.STEP_RTT_SECONDS });
  for (let i = 0; i < 500; i++) step.observe(10e-6 * (1 + (i % 300)));
  const ec = new Registry({ prefix: "tapwire_ec_" });
  const read = ec.histogram("consumer_read_seconds", {
    help: "read time from post to DONE",
    buckets: BUCKETS.EC_TRANSFER_SECONDS,
  });
  for (let i = 0; i < 100; i++) read.observe(1e-4 * 1.1 ** i);
  ec.histogram("block_bytes", { help: "bytes per block", unit: "bytes" }).observe(65536);
  ec.histogram("accept_ratio", {
    help: "accepted per proposed",
    unit: "none",
    scale: 1000,
    buckets: BUCKETS.RATIO,
  }).observe(0.7);
  ec.histogram("empty_seconds", { help: "never observed" });
  return [w, ec];
}

describe("serveMetrics health endpoints", () => {
  test("/healthz is 200 ok and /readyz follows the probe: 503 with the reason, then 200", async () => {
    let state: true | string = "drafter loading";
    const srv = await serveMetrics([new Registry()], 0, "127.0.0.1", { ready: () => state });
    try {
      expect(await get(srv.port, "/healthz")).toMatchObject({ status: 200, body: "ok\n" });
      expect(await get(srv.port, "/readyz")).toMatchObject({
        status: 503,
        body: "not ready: drafter loading\n",
      });
      state = true;
      expect(await get(srv.port, "/readyz")).toMatchObject({ status: 200, body: "ready\n" });
      expect(await get(srv.port, "/readyz", "HEAD")).toMatchObject({ status: 200, body: "" });
      expect((await get(srv.port, "/readyz", "POST")).status).toBe(405);
      expect((await get(srv.port, "/health")).status).toBe(404);
    } finally {
      await srv.close();
    }
  });

  test("a throwing probe is not ready (503 with its message), the endpoint stays up", async () => {
    const srv = await serveMetrics([], 0, {
      ready: () => {
        throw new Error("socket gone");
      },
    });
    try {
      expect(srv.host).toBe("127.0.0.1");
      expect(await get(srv.port, "/readyz")).toMatchObject({
        status: 503,
        body: "not ready: readiness probe failed: socket gone\n",
      });
      expect((await get(srv.port, "/healthz")).status).toBe(200);
    } finally {
      await srv.close();
    }
  });

  test("without a probe /readyz is 200; the old (registries, port, host) call still works", async () => {
    const srv = await serveMetrics([], 0, "127.0.0.1");
    try {
      expect(await get(srv.port, "/readyz")).toMatchObject({ status: 200, body: "ready\n" });
    } finally {
      await srv.close();
    }
  });

  test("extra text is appended to /metrics on every scrape; a failing extra is a 500", async () => {
    const r = new Registry({ prefix: "tapwire_harness_" });
    r.counter("rounds", "rounds run").inc(2);
    let n = 0;
    let fail = false;
    const srv = await serveMetrics([r], 0, {
      extra: async () => {
        if (fail) throw new Error("child scrape failed");
        n++;
        return `# HELP tapwire_worker_steps_total s\n# TYPE tapwire_worker_steps_total counter\ntapwire_worker_steps_total ${n}\n`;
      },
    });
    try {
      const fams = parseExposition((await get(srv.port, "/metrics")).body);
      expect(fams.get("tapwire_harness_rounds_total")!.samples[0]!.value).toBe(2);
      expect(fams.get("tapwire_worker_steps_total")!.samples[0]!.value).toBe(1);
      const again = parseExposition((await get(srv.port, "/metrics")).body);
      expect(again.get("tapwire_worker_steps_total")!.samples[0]!.value).toBe(2);
      fail = true;
      expect(await get(srv.port, "/metrics")).toMatchObject({ status: 500 });
    } finally {
      await srv.close();
    }
  });

  test("bad options are refused naming the option", async () => {
    await expect(serveMetrics([], 0, { ready: true as unknown as () => true })).rejects.toThrow(
      /option ready/,
    );
    await expect(serveMetrics([], 0, "127.0.0.1", { extra: 1 as unknown as () => string })).rejects.toThrow(
      /option extra/,
    );
  });
});

describe("promtool check metrics (the real one)", () => {
  test("promtool rejects what it should (so the check below can fail)", () => {
    expect(promtoolCheck("# HELP foo x\n# TYPE foo counter\nfoo 1\n")).toMatchObject({ status: 3 });
    expect(
      promtoolCheck("# HELP foo_milliseconds x\n# TYPE foo_milliseconds gauge\nfoo_milliseconds 1\n").output,
    ).toMatch(/base unit/);
    expect(
      promtoolCheck("# HELP a x\n# TYPE a gauge\na 1\n# HELP a x\n# TYPE a gauge\na 1\n").status,
    ).not.toBe(0);
  });

  test("a scrape of /metrics passes promtool with histograms of every unit", async () => {
    const srv = await serveMetrics(realistic(), 0);
    try {
      const { status, body, type } = await get(srv.port, "/metrics");
      expect(status).toBe(200);
      expect(type).toContain("version=0.0.4");
      expect(body).toContain("# TYPE tapwire_worker_step_seconds histogram\n");
      expect(body).toContain('tapwire_worker_step_seconds_bucket{le="0.00002"} ');
      expect(body).toContain('tapwire_ec_consumer_read_seconds_bucket{le="30"} ');
      expect(body).toContain('tapwire_ec_empty_seconds_bucket{le="+Inf"} 0\n');
      expect(promtoolCheck(body)).toEqual({ status: 0, output: "" });
    } finally {
      await srv.close();
    }
  });
});
