import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { Writable } from "node:stream";
import { fileURLToPath, pathToFileURL } from "node:url";
import fc from "fast-check";
import { describe, expect, test } from "vitest";
import {
  BUCKETS,
  createLogger,
  DEFAULT_METRICS_LISTEN,
  exponentialBuckets,
  flushLogger,
  LOG_LEVELS,
  parseLogLevel,
  parseMetricsListen,
  Registry,
  StatsError,
} from "../src/index.js";

const errOf = (fn: () => unknown): StatsError => {
  try {
    fn();
  } catch (e) {
    if (e instanceof StatsError) return e;
    throw e;
  }
  throw new Error("did not throw");
};

describe("parseMetricsListen", () => {
  test("accepts tcp://HOST:PORT for IPv4, IPv6 and host names", () => {
    expect(parseMetricsListen(DEFAULT_METRICS_LISTEN)).toEqual({ host: "127.0.0.1", port: 9464 });
    expect(parseMetricsListen("tcp://[::1]:0")).toEqual({ host: "::1", port: 0 });
    expect(parseMetricsListen("tcp://0.0.0.0:65535")).toEqual({ host: "0.0.0.0", port: 65535 });
    expect(parseMetricsListen("tcp://metrics.local:80")).toEqual({ host: "metrics.local", port: 80 });
  });

  test("refuses everything else with STATS_BAD_LISTEN and one line", () => {
    for (const bad of [
      "http://127.0.0.1:9464",
      "127.0.0.1:9464",
      "tcp://127.0.0.1",
      "tcp://127.0.0.1:",
      "tcp://127.0.0.1:65536",
      "tcp://127.0.0.1:-1",
      "tcp://127.0.0.1:9464/metrics",
      "tcp://:9464",
      "tcp://[::1:9464",
      "tcp://[zz]:9464",
      "tcp://999.1.1.1:80",
      "tcp://a b:80",
      "",
      7 as unknown as string,
    ]) {
      const e = errOf(() => parseMetricsListen(bad));
      expect(e.code, String(bad)).toBe("STATS_BAD_LISTEN");
      expect(e.message).not.toContain("\n");
      expect(e.message).toContain("tcp://HOST:PORT");
    }
  });
});

describe("createLogger", () => {
  const capture = () => {
    const lines: Record<string, unknown>[] = [];
    const raw: string[] = [];
    const stream = new Writable({
      write(chunk, _enc, cb) {
        for (const l of String(chunk).split("\n")) {
          if (l !== "") {
            raw.push(l);
            lines.push(JSON.parse(l) as Record<string, unknown>);
          }
        }
        cb();
      },
    });
    return { stream, lines, raw };
  };

  test("one set of base fields, each once; the level filters", () => {
    const { stream, lines, raw } = capture();
    const log = createLogger({ name: "tapwire-test", level: "warn", destination: stream });
    log.info("dropped");
    log.warn({ port: 1 }, "listening");
    expect(lines).toHaveLength(1);
    expect(Object.keys(lines[0]!)).toEqual(["level", "time", "pid", "hostname", "name", "port", "msg"]);
    expect(lines[0]).toMatchObject({ level: 40, pid: process.pid, name: "tapwire-test", msg: "listening" });
    expect(raw[0]!.match(/"pid"/g)).toHaveLength(1);
  });

  test("a bad level is a STATS_BAD_LOG_LEVEL with one line naming the valid levels", () => {
    const e = errOf(() => createLogger({ name: "x", level: "loud" }));
    expect(e.code).toBe("STATS_BAD_LOG_LEVEL");
    expect(e.message).toBe(`log level "loud" is not one of ${LOG_LEVELS.join(", ")}`);
    expect(errOf(() => parseLogLevel("INFO")).code).toBe("STATS_BAD_LOG_LEVEL");
    expect(parseLogLevel("silent")).toBe("silent");
    expect(errOf(() => createLogger({ name: "" })).code).toBe("STATS_BAD_OPTION");
    expect(errOf(() => createLogger({ name: "x", destination: 3 as 1 })).code).toBe("STATS_BAD_OPTION");
  });

  test("flushLogger resolves with a destination that has no flush", async () => {
    const { stream, lines } = capture();
    const log = createLogger({ name: "x", destination: stream });
    log.info("a");
    await flushLogger(log);
    expect(lines).toHaveLength(1);
  });

  test("flushAndExit: every line logged before it reaches a pipe, and the exit code is kept", () => {
    const dist = pathToFileURL(join(fileURLToPath(new URL("..", import.meta.url)), "src/index.ts")).href;
    // 2000 lines of 2 KiB (4 MB) overflow a pipe's buffer many times over before the exit
    const script = `
      import { createLogger, flushAndExit } from ${JSON.stringify(dist)};
      const log = createLogger({ name: "tapwire-flush", destination: 2 });
      const pad = "x".repeat(2048);
      for (let i = 0; i < 2000; i++) log.info({ i, pad }, "line");
      await flushAndExit(log, 3);
    `;
    const r = spawnSync(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], {
      encoding: "utf8",
      maxBuffer: 64 << 20,
      timeout: 60_000,
    });
    expect(r.status).toBe(3);
    const lines = r.stderr.split("\n").filter((l) => l.startsWith("{"));
    expect(lines).toHaveLength(2000);
    expect(JSON.parse(lines.at(-1)!)).toMatchObject({ i: 1999, name: "tapwire-flush" });
  });
});

describe("histogram buckets", () => {
  test("bad buckets are refused naming the option", () => {
    for (const buckets of [
      [],
      [1, 1],
      [2, 1],
      [1, Number.POSITIVE_INFINITY],
      [Number.NaN],
      new Array(65).fill(0).map((_, i) => i),
    ]) {
      const e = errOf(() => new Registry().histogram("h", { buckets }));
      expect(e.code).toBe("STATS_BAD_OPTION");
      expect(e.message).toMatch(/option buckets/);
    }
  });

  test("presets are strictly increasing and span the documented ranges", () => {
    for (const b of Object.values(BUCKETS)) {
      for (let k = 1; k < b.length; k++) expect(b[k]!).toBeGreaterThan(b[k - 1]!);
    }
    expect([BUCKETS.STEP_RTT_SECONDS[0], BUCKETS.STEP_RTT_SECONDS.at(-1)]).toEqual([20e-6, 1]);
    expect([BUCKETS.EC_TRANSFER_SECONDS[0], BUCKETS.EC_TRANSFER_SECONDS.at(-1)]).toEqual([100e-6, 30]);
  });

  test("property: bucket counts equal an exact count of values <= le, bounds and clamping included", async () => {
    const configs = [
      { unit: "seconds" as const, buckets: BUCKETS.STEP_RTT_SECONDS },
      { unit: "seconds" as const, buckets: BUCKETS.EC_TRANSFER_SECONDS, highest: 20 },
      { unit: "bytes" as const, buckets: BUCKETS.SIZE_BYTES },
      { unit: "none" as const, scale: 1000, buckets: BUCKETS.RATIO },
      { unit: "seconds" as const, significantDigits: 1, buckets: [1e-6, 1.5e-6, 3e-5, 0.0333, 7] },
    ];
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 0, max: configs.length - 1 }),
        fc.array(fc.oneof(fc.double({ min: 0, max: 40, noNaN: true }), fc.integer({ min: 0, max: 30 })), {
          maxLength: 200,
        }),
        async (ci, raw) => {
          const cfg = configs[ci]!;
          const bounds = [...cfg.buckets];
          // mix in values exactly on, and just around, every bound
          const values = raw.map((x, j) => {
            const b = bounds[Math.floor(x) % bounds.length]!;
            return j % 3 === 0 ? b : j % 3 === 1 ? b * (1 + 1e-12) : x * (bounds.at(-1)! / 10);
          });
          const r = new Registry();
          const h = r.histogram("h", cfg);
          for (const v of values) h.observe(v);
          const text = await r.prometheus();
          for (const le of bounds) {
            const m = new RegExp(
              `h(?:_seconds|_bytes)?_bucket\\{le="${String(le).replace(".", "\\.")}"\\} (\\d+)`,
            ).exec(text);
            expect(Number(m![1]), `le=${le}`).toBe(values.filter((v) => v <= le).length);
          }
        },
      ),
      { numRuns: 200 },
    );
  });

  test("exponentialBuckets", () => {
    expect(exponentialBuckets(1e-5, 10, 4)).toEqual([1e-5, 1e-4, 1e-3, 1e-2]);
    expect(exponentialBuckets(1, 2, 3)).toEqual([1, 2, 4]);
    expect(errOf(() => exponentialBuckets(0, 2, 3)).code).toBe("STATS_BAD_ARGUMENT");
    expect(errOf(() => exponentialBuckets(1, 1, 3)).code).toBe("STATS_BAD_ARGUMENT");
    expect(errOf(() => exponentialBuckets(1, 2, 0)).code).toBe("STATS_BAD_ARGUMENT");
  });

  test("negatives count in the first bucket, NaN nowhere, values past highest in +Inf; reset empties", async () => {
    const r = new Registry({ prefix: "t_" });
    const h = r.histogram("lat", { help: "latency", highest: 10, buckets: [0.001, 1] });
    for (const v of [-5, Number.NaN, 0.001, 0.5, 1, 50]) h.observe(v);
    const text = await r.prometheus();
    expect(text).toContain('t_lat_seconds_bucket{le="0.001"} 2\n');
    expect(text).toContain('t_lat_seconds_bucket{le="1"} 4\n');
    expect(text).toContain('t_lat_seconds_bucket{le="+Inf"} 5\n');
    expect(text).toContain("t_lat_seconds_count 5\n");
    r.reset();
    expect(await r.prometheus()).toContain('t_lat_seconds_bucket{le="1"} 0\n');
  });
});
