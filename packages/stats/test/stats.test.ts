import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import fc from "fast-check";
import { build } from "hdr-histogram-js";
import { describe, expect, test } from "vitest";
import { BUCKETS, Registry, StatsError, serveMetrics } from "../src/index.js";
import { HistogramImpl } from "../src/metrics.js";
import { parseExposition } from "./prom-parse.js";

function code(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (e) {
    if (e instanceof StatsError) return e.code;
    throw e;
  }
  return undefined;
}

/** Exact nearest-rank percentile (the definition HdrHistogram approximates). */
function exactPercentile(sorted: readonly number[], p: number): number {
  const rank = Math.max(1, Math.ceil((p / 100) * sorted.length));
  return sorted[rank - 1]!;
}

function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

describe("metrics", () => {
  test("counters, gauges and info values hold their values and are idempotent by name", () => {
    const r = new Registry({ prefix: "t_" });
    const c = r.counter("steps");
    c.inc();
    c.inc(41);
    expect(r.counter("steps")).toBe(c);
    expect(c.value).toBe(42);
    const g = r.gauge("depth");
    g.set(10);
    g.inc();
    g.dec(3);
    g.inc(0.5);
    expect(r.gauge("depth").value).toBe(8.5);
    const i = r.info("disabled_reason");
    expect(i.value).toBe("");
    i.set("identity mismatch");
    expect(r.info("disabled_reason").value).toBe("identity mismatch");
    expect(r.snapshot()).toEqual({
      counters: { steps: 42 },
      gauges: { depth: 8.5 },
      info: { disabled_reason: "identity mismatch" },
      histograms: {},
    });
  });

  test("a counter refuses negative, NaN and infinite increments", () => {
    const c = new Registry().counter("x");
    expect(code(() => c.inc(-1))).toBe("STATS_BAD_ARGUMENT");
    expect(code(() => c.inc(Number.NaN))).toBe("STATS_BAD_ARGUMENT");
    expect(code(() => c.inc(Number.POSITIVE_INFINITY))).toBe("STATS_BAD_ARGUMENT");
    expect(c.value).toBe(0);
  });

  test("names are validated and a name cannot change kind or clash once exposed", () => {
    const r = new Registry({ prefix: "p_" });
    expect(code(() => r.counter("bad name"))).toBe("STATS_BAD_NAME");
    expect(code(() => r.gauge("9lives"))).toBe("STATS_BAD_NAME");
    expect(code(() => r.histogram(""))).toBe("STATS_BAD_NAME");
    r.counter("a");
    expect(code(() => r.gauge("a"))).toBe("STATS_NAME_CONFLICT");
    // counter "b" is exposed as p_b_total, a gauge "b_total" would be exposed under the same name
    r.counter("b");
    expect(code(() => r.gauge("b_total"))).toBe("STATS_NAME_CONFLICT");
    r.histogram("rtt", { unit: "seconds" });
    expect(code(() => r.histogram("rtt", { unit: "bytes" }))).toBe("STATS_NAME_CONFLICT");
    expect(r.histogram("rtt")).toBe(r.histogram("rtt", { unit: "seconds" }));
  });

  test("bad options are refused naming the option", () => {
    const bad: [() => unknown, RegExp][] = [
      [() => new Registry({ prefix: "no spaces" }), /option prefix/],
      [() => new Registry().histogram("h", { unit: "furlongs" as "none" }), /option unit/],
      [() => new Registry().histogram("h", { significantDigits: 6 }), /option significantDigits/],
      [() => new Registry().histogram("h", { significantDigits: 0 }), /option significantDigits/],
      [() => new Registry().histogram("h", { lowest: 1e-9 }), /option lowest/],
      [() => new Registry().histogram("h", { lowest: 1, highest: 1.5 }), /option highest/],
      [() => new Registry().histogram("h", { unit: "none", scale: 0 }), /option scale/],
      [() => new Registry().histogram("h", null as unknown as { unit?: "none" }), /options/],
      [() => new Registry().counter("c", 7 as unknown as string), /option help/],
      [() => new Registry().gauge("g", ""), /option help/],
      [() => new Registry().info("i", {} as unknown as string), /option help/],
      [() => new Registry().histogram("h", { help: 1 as unknown as string }), /option help/],
    ];
    for (const [fn, re] of bad) {
      expect(code(fn)).toBe("STATS_BAD_OPTION");
      expect(() => fn()).toThrow(re);
    }
  });

  test("histogram basics: empty, clamping, NaN, exact extremes and mean, reset", () => {
    const r = new Registry();
    const h = r.histogram("rtt", { highest: 10 });
    expect([h.count, h.max, h.min, h.mean, h.percentile(99)]).toEqual([0, 0, 0, 0, 0]);
    h.observe(1.5e-4);
    h.observe(2.5e-4);
    h.observe(Number.NaN);
    h.observe(-1);
    h.observe(100);
    expect(h.count).toBe(4);
    expect(h.min).toBe(0);
    expect(h.max).toBe(100);
    expect(h.mean).toBeCloseTo((1.5e-4 + 2.5e-4 + 100) / 4, 12);
    expect(h.percentile(50)).toBeCloseTo(1.5e-4, 9);
    // values above `highest` are recorded at `highest` in the buckets
    expect(h.percentile(99)).toBeGreaterThanOrEqual(10);
    expect(h.percentile(99)).toBeLessThanOrEqual(10.01);
    expect(h.percentile(100)).toBe(100);
    expect(code(() => h.percentile(101))).toBe("STATS_BAD_ARGUMENT");
    expect(code(() => h.percentile(-1))).toBe("STATS_BAD_ARGUMENT");
    r.reset();
    expect([h.count, h.max, h.min, h.sum, h.percentile(50)]).toEqual([0, 0, 0, 0, 0]);
    h.observe(3);
    expect(h.min).toBe(3);
    expect(h.percentile(50)).toBeCloseTo(3, 2);
  });

  test("registry reset zeroes values and keeps registrations", () => {
    const r = new Registry();
    r.counter("c").inc(3);
    r.gauge("g").set(7);
    r.info("i").set("x");
    r.histogram("h").observe(1);
    r.reset();
    expect(r.snapshot()).toEqual({
      counters: { c: 0 },
      gauges: { g: 0 },
      info: { i: "" },
      histograms: {
        h: { count: 0, min: 0, max: 0, mean: 0, sum: 0, p50: 0, p90: 0, p99: 0, unit: "seconds" },
      },
    });
  });

  test("updates from many interleaved async tasks in one event loop are all counted", async () => {
    const r = new Registry();
    const done = r.counter("done");
    const inflight = r.gauge("inflight");
    const rtt = r.histogram("rtt");
    let maxInflight = 0;
    const rand = mulberry32(7);
    const tasks = 200;
    const perTask = 50;
    const task = async (id: number) => {
      for (let k = 0; k < perTask; k++) {
        inflight.inc();
        maxInflight = Math.max(maxInflight, inflight.value);
        // yield in different ways so that tasks interleave between inc and dec
        if (rand() < 0.5) await new Promise<void>((res) => setImmediate(res));
        else await Promise.resolve();
        rtt.observe((id + 1) * 1e-6);
        inflight.dec();
        done.inc();
      }
    };
    const snapshots: number[] = [];
    const watcher = (async () => {
      while (done.value < tasks * perTask) {
        const s = r.snapshot();
        // a snapshot taken mid-flight is internally consistent: every finished update is observed
        expect(s.histograms.rtt!.count).toBeGreaterThanOrEqual(s.counters.done!);
        snapshots.push(s.counters.done!);
        await new Promise<void>((res) => setImmediate(res));
      }
    })();
    await Promise.all([...Array.from({ length: tasks }, (_, i) => task(i)), watcher]);
    expect(maxInflight).toBeGreaterThan(1);
    expect(snapshots.length).toBeGreaterThan(1);
    expect(done.value).toBe(tasks * perTask);
    expect(inflight.value).toBe(0);
    expect(rtt.count).toBe(tasks * perTask);
    expect(rtt.min).toBeCloseTo(1e-6, 12);
    expect(rtt.max).toBeCloseTo(tasks * 1e-6, 12);
    expect(rtt.sum).toBeCloseTo(perTask * ((tasks * (tasks + 1)) / 2) * 1e-6, 9);
  });
});

describe("histogram accuracy", () => {
  const checkAgainstExact = (values: number[], rel: number, abs: number) => {
    const r = new Registry();
    const h = r.histogram("v");
    for (const v of values) h.observe(v);
    const sorted = [...values].sort((a, b) => a - b);
    for (const p of [0, 1, 10, 25, 50, 75, 90, 95, 99, 99.9, 100]) {
      const exact = exactPercentile(sorted, p);
      const got = h.percentile(p);
      expect(Math.abs(got - exact), `p${p}: got ${got}, exact ${exact}`).toBeLessThanOrEqual(
        exact * rel + abs,
      );
    }
    expect(h.max).toBe(sorted[sorted.length - 1]);
    expect(h.min).toBe(sorted[0]);
    const snap = r.snapshot().histograms.v!;
    expect(snap.p50).toBe(h.percentile(50));
    expect(snap.p90).toBe(h.percentile(90));
    expect(snap.p99).toBe(h.percentile(99));
    expect(snap.count).toBe(values.length);
  };

  test("log-uniform latencies 1 µs .. 10 s match exact percentiles within HDR precision", () => {
    const rand = mulberry32(1);
    const values = Array.from({ length: 100_000 }, () => 10 ** (-6 + 7 * rand()));
    // 3 significant digits: relative bucket error < 1/1024; integer microseconds: 0.5 µs
    checkAgainstExact(values, 1 / 1024, 0.5e-6);
  });

  test("bimodal latencies (fast path plus slow tail) match exact percentiles", () => {
    const rand = mulberry32(2);
    const values = Array.from({ length: 50_000 }, () =>
      rand() < 0.97 ? 100e-6 + rand() * 50e-6 : 0.02 + rand() * 0.2,
    );
    checkAgainstExact(values, 1 / 1024, 0.5e-6);
  });

  test("property: any sample of latencies stays within HDR precision of the exact percentiles", () => {
    fc.assert(
      fc.property(
        fc.array(fc.double({ min: 0, max: 3600, noNaN: true }), { minLength: 1, maxLength: 300 }),
        (values) => checkAgainstExact(values, 1 / 1024, 0.5e-6),
      ),
      { numRuns: 100 },
    );
  });

  test("fewer significant digits widen the error as documented", () => {
    const r = new Registry();
    const h = r.histogram("coarse", { unit: "bytes", significantDigits: 1 });
    const exact = 100_000;
    h.observe(exact);
    h.observe(1);
    // 1 digit: 16 sub-buckets per power of two, relative error < 1/8
    expect(Math.abs(h.percentile(60) - exact)).toBeLessThan(exact / 8);
  });

  test("a 'none' histogram with a scale keeps fractions", () => {
    const h = new Registry().histogram("accept_ratio", { unit: "none", scale: 1000 });
    for (let i = 0; i <= 1000; i++) h.observe(i / 1000);
    expect(h.percentile(50)).toBeCloseTo(0.5, 3);
    expect(h.percentile(90)).toBeCloseTo(0.9, 3);
  });
});

describe("fast bucket index", () => {
  const configs = [
    { unit: "seconds" as const },
    { unit: "bytes" as const },
    { unit: "seconds" as const, significantDigits: 1, lowest: 1e-3, highest: 10 },
    { unit: "none" as const, significantDigits: 5, lowest: 8, highest: 2 ** 34 },
  ];
  test("observe's clz32 index equals hdr-histogram-js's own index at every magnitude", () => {
    for (const cfg of configs) {
      const h = new HistogramImpl("x", cfg);
      const ref = build({
        bitBucketSize: 64,
        autoResize: false,
        lowestDiscernibleValue: h.scale === 1e6 ? Math.round((cfg.lowest ?? 1e-6) * 1e6) : (cfg.lowest ?? 1),
        highestTrackableValue: h.highestInt,
        numberOfSignificantValueDigits: h.significantDigits as 1 | 2 | 3 | 4 | 5,
      }) as unknown as { countsArrayIndex(v: number): number };
      const values = [0, 1, 2, 3, h.highestInt];
      for (let b = 1; b < 53 && 2 ** b <= h.highestInt; b++) values.push(2 ** b - 1, 2 ** b, 2 ** b + 1);
      fc.assert(
        fc.property(fc.integer({ min: 0, max: h.highestInt }), (v) => {
          expect(h.indexOf(v)).toBe(ref.countsArrayIndex(v));
        }),
        { numRuns: 2000 },
      );
      for (const v of values) expect(h.indexOf(v), `value ${v}`).toBe(ref.countsArrayIndex(v));
    }
  });

  test("the bucket table's index geometry equals hdr-histogram-js's valueFromIndex / highestEquivalentValue", () => {
    for (const cfg of configs) {
      const h = new HistogramImpl("x", cfg);
      const hdr = (
        h as unknown as {
          hdr: {
            countsArrayLength: number;
            valueFromIndex(i: number): number;
            highestEquivalentValue(v: number): number;
            subBucketHalfCountMagnitude: number;
            subBucketHalfCount: number;
            unitMagnitude: number;
          };
        }
      ).hdr;
      for (let idx = 0; idx < hdr.countsArrayLength; idx += 7) {
        let bucket = (idx >> hdr.subBucketHalfCountMagnitude) - 1;
        let sub = (idx & (hdr.subBucketHalfCount - 1)) + hdr.subBucketHalfCount;
        if (bucket < 0) {
          sub -= hdr.subBucketHalfCount;
          bucket = 0;
        }
        const size = 2 ** (bucket + hdr.unitMagnitude);
        expect(sub * size, `index ${idx}`).toBe(hdr.valueFromIndex(idx));
        expect(sub * size + size - 1, `index ${idx}`).toBe(
          hdr.highestEquivalentValue(hdr.valueFromIndex(idx)),
        );
      }
    }
  });

  test("the one-pass percentiles equal percentile() for every p", () => {
    const rand = mulberry32(9);
    const h = new HistogramImpl("x", {});
    for (let i = 0; i < 20_000; i++) h.observe(10 ** (-5 + 4 * rand()));
    const ps = [0, 0.1, 1, 5, 10, 33.3, 50, 66.6, 90, 99, 99.9, 99.99, 100];
    const out: number[] = [];
    h.percentilesInto(ps, out);
    expect(out).toEqual(ps.map((p) => h.percentile(p)));
  });
});

describe("allocation", () => {
  // Issue 19: measured in a child whose optimising compiler runs synchronously
  // (--no-concurrent-recompilation, test/alloc-probe.mjs), so load beside the suite cannot leave
  // the loop unoptimised (boxing doubles) for every trial; the best of several trials counts.
  test("inc/set/observe allocate nothing once warm", () => {
    const probe = fileURLToPath(new URL("./alloc-probe.mjs", import.meta.url));
    const r = spawnSync(process.execPath, ["--expose-gc", "--no-concurrent-recompilation", probe], {
      encoding: "utf8",
      timeout: 120_000,
    });
    expect(r.status, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout.trim()) as {
      best: number;
      count: number;
      observed: number;
      expected: number;
    };
    // an allocation of even one 16-byte heap number per op would show as >= 16 bytes/op
    // (1M ops = 16 MB, more than a scavenge could hide within one trial)
    expect(out.best).toBeLessThan(0.5);
    expect(out.count).toBe(out.expected);
    expect(out.observed).toBe(out.expected);
  });
});

describe("prometheus exposition", () => {
  const observed = { rtt: [] as number[], size: [] as number[], ratio: [] as number[] };
  const build = () => {
    observed.rtt.length = observed.size.length = observed.ratio.length = 0;
    const r = new Registry({ prefix: "tapwire_client_" });
    r.counter("steps", "STEP requests sent").inc(12345);
    r.counter("bytes_sent_total", "bytes sent").inc(1e12);
    r.gauge("inflight", "requests in flight").set(-2.5);
    r.info("disabled_reason", 'why "disabled"\nif so').set('worker said "no"\\ twice\n');
    const rtt = r.histogram("step_rtt", {
      help: "STEP round trip",
      unit: "seconds",
      buckets: BUCKETS.STEP_RTT_SECONDS,
    });
    const size = r.histogram("reply_size", { unit: "bytes" });
    const ratio = r.histogram("accept_ratio", { unit: "none", scale: 1000, buckets: BUCKETS.RATIO });
    const rand = mulberry32(3);
    for (let i = 0; i < 10_000; i++) {
      const v = [10e-6 + rand() * 2e-3, Math.floor(rand() * 100_000), rand()] as const;
      // every 100th value lands exactly on a bound: `le` is inclusive
      if (i % 100 === 0) {
        rtt.observe(1e-3);
        observed.rtt.push(1e-3);
      } else {
        rtt.observe(v[0]);
        observed.rtt.push(v[0]);
      }
      size.observe(v[1]);
      observed.size.push(v[1]);
      ratio.observe(v[2]);
      observed.ratio.push(v[2]);
    }
    const bucketsOf = (name: string): number[] =>
      name === "step_rtt"
        ? [...BUCKETS.STEP_RTT_SECONDS]
        : name === "reply_size"
          ? [...BUCKETS.SIZE_BYTES]
          : [...BUCKETS.RATIO];
    return Object.assign(r, { bucketsOf });
  };

  test("the text parses back and every value matches the snapshot", async () => {
    const r = build();
    const snap = r.snapshot();
    const fams = parseExposition(await r.prometheus());
    expect([...fams.keys()].sort()).toEqual(
      [
        "tapwire_client_accept_ratio",
        "tapwire_client_bytes_sent_total",
        "tapwire_client_disabled_reason_info",
        "tapwire_client_inflight",
        "tapwire_client_reply_size_bytes",
        "tapwire_client_step_rtt_seconds",
        "tapwire_client_steps_total",
      ].sort(),
    );
    const steps = fams.get("tapwire_client_steps_total")!;
    expect(steps.type).toBe("counter");
    expect(steps.help).toBe("STEP requests sent");
    expect(steps.samples).toEqual([
      { name: "tapwire_client_steps_total", labels: {}, value: snap.counters.steps },
    ]);
    expect(fams.get("tapwire_client_bytes_sent_total")!.samples[0]!.value).toBe(1e12);
    const inflight = fams.get("tapwire_client_inflight")!;
    expect(inflight.type).toBe("gauge");
    expect(inflight.samples[0]!.value).toBe(snap.gauges.inflight);
    const info = fams.get("tapwire_client_disabled_reason_info")!;
    expect(info.help).toBe('why "disabled"\nif so');
    expect(info.samples).toEqual([
      { name: "tapwire_client_disabled_reason_info", labels: { value: snap.info.disabled_reason }, value: 1 },
    ]);
    for (const [name, family, values] of [
      ["step_rtt", "tapwire_client_step_rtt_seconds", observed.rtt],
      ["reply_size", "tapwire_client_reply_size_bytes", observed.size],
      ["accept_ratio", "tapwire_client_accept_ratio", observed.ratio],
    ] as const) {
      const f = fams.get(family)!;
      const h = snap.histograms[name]!;
      expect(f.type).toBe("histogram");
      const buckets = f.samples.filter((s) => s.name === `${family}_bucket`);
      const bounds = r.bucketsOf(name);
      expect(buckets.map((s) => s.labels.le)).toEqual([...bounds.map(String), "+Inf"]);
      // each cumulative bucket counts exactly the observations <= le (not HDR-approximated)
      bounds.forEach((le, k) => {
        expect(buckets[k]!.value, `${family} le=${le}`).toBe(values.filter((v) => v <= le).length);
      });
      expect(buckets.at(-1)!.value).toBe(h.count);
      expect(f.samples.find((s) => s.name === `${family}_sum`)!.value).toBeCloseTo(h.sum, 9);
      expect(f.samples.find((s) => s.name === `${family}_count`)!.value).toBe(h.count);
      expect(f.samples.some((s) => "quantile" in s.labels)).toBe(false);
    }
  });

  test("collect reads live values: updates after the first scrape show in the next", async () => {
    const r = new Registry({ prefix: "w_" });
    const c = r.counter("n");
    const g = r.gauge("g");
    const i = r.info("state");
    const h = r.histogram("lat");
    const scrape = async () => {
      const f = parseExposition(await r.prometheus());
      return {
        n: f.get("w_n_total")!.samples[0]!.value,
        g: f.get("w_g")!.samples[0]!.value,
        state: f.get("w_state_info")!.samples[0]!.labels.value,
        count: f.get("w_lat_seconds")!.samples.find((s) => s.name === "w_lat_seconds_count")!.value,
      };
    };
    expect(await scrape()).toEqual({ n: 0, g: 0, state: "", count: 0 });
    c.inc(5);
    g.set(9);
    i.set("up");
    h.observe(0.25);
    expect(await scrape()).toEqual({ n: 5, g: 9, state: "up", count: 1 });
    r.reset();
    expect(await scrape()).toEqual({ n: 0, g: 0, state: "", count: 0 });
  });

  test("registries do not share prom-client's global registry", async () => {
    const a = new Registry({ prefix: "a_" });
    const b = new Registry({ prefix: "a_" });
    a.counter("x").inc();
    b.counter("x").inc(2);
    expect(parseExposition(await a.prometheus()).get("a_x_total")!.samples[0]!.value).toBe(1);
    expect(parseExposition(await b.prometheus()).get("a_x_total")!.samples[0]!.value).toBe(2);
    const prom = await import("prom-client");
    expect(await prom.register.metrics()).not.toContain("a_x_total");
  });

  test("the test parser rejects malformed text (so the checks above can fail)", () => {
    expect(() => parseExposition("x{a=b} 1")).toThrow();
    expect(() => parseExposition('x{a="b} 1')).toThrow();
    expect(() => parseExposition("x one")).toThrow();
    expect(() => parseExposition("# TYPE x countr")).toThrow();
  });
});

describe("serveMetrics", () => {
  test("serves GET /metrics from every registry over a real HTTP connection", async () => {
    const a = new Registry({ prefix: "tapwire_worker_" });
    const b = new Registry({ prefix: "tapwire_transport_" });
    a.counter("steps").inc(3);
    b.gauge("connections").set(2);
    const srv = await serveMetrics([a, b], 0);
    try {
      expect(srv.port).toBeGreaterThan(0);
      const res = await fetch(`http://127.0.0.1:${srv.port}/metrics`);
      expect(res.status).toBe(200);
      expect(res.headers.get("content-type")).toContain("text/plain; version=0.0.4");
      const fams = parseExposition(await res.text());
      expect(fams.get("tapwire_worker_steps_total")!.samples[0]!.value).toBe(3);
      expect(fams.get("tapwire_transport_connections")!.samples[0]!.value).toBe(2);
      a.counter("steps").inc();
      const again = parseExposition(await (await fetch(`http://127.0.0.1:${srv.port}/metrics?x=1`)).text());
      expect(again.get("tapwire_worker_steps_total")!.samples[0]!.value).toBe(4);
      expect((await fetch(`http://127.0.0.1:${srv.port}/other`)).status).toBe(404);
      expect(
        (await fetch(`http://127.0.0.1:${srv.port}/metrics`, { method: "POST", body: "x" })).status,
      ).toBe(405);
    } finally {
      await srv.close();
    }
    await expect(fetch(`http://127.0.0.1:${srv.port}/metrics`)).rejects.toThrow();
  });

  test("refuses bad arguments and reports a busy port", async () => {
    await expect(serveMetrics([new Registry()], 70000)).rejects.toMatchObject({ code: "STATS_BAD_OPTION" });
    await expect(serveMetrics([{} as Registry], 0)).rejects.toMatchObject({ code: "STATS_BAD_OPTION" });
    const srv = await serveMetrics([], 0);
    try {
      await expect(serveMetrics([], srv.port)).rejects.toMatchObject({ code: "EADDRINUSE" });
    } finally {
      await srv.close();
    }
  });
});

describe("Registry.beforeRead: tallies folded in before every read", () => {
  test("snapshot, prometheus and reset each call the fold first; a bad fold is refused", async () => {
    const r = new Registry({ prefix: "t_" });
    const h = r.histogram("n", { unit: "none" });
    let pending = 0;
    let folds = 0;
    r.beforeRead(() => {
      folds++;
      for (; pending > 0; pending--) h.observe(1);
    });
    pending = 3;
    expect(r.snapshot().histograms.n!.count).toBe(3);
    pending = 2;
    expect(await r.prometheus()).toContain("t_n_count 5");
    pending = 4;
    r.reset();
    expect(pending).toBe(0);
    expect(r.snapshot().histograms.n!.count).toBe(0);
    expect(folds).toBe(4);
    expect(() => r.beforeRead(42 as unknown as () => void)).toThrow(/fold must be a function/);
  });
});
