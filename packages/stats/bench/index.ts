/**
 * Hot-path cost of @tapwire/stats against a plain `x++` baseline measured in the same run.
 * Prints one JSON object on stdout. Run: `pnpm --filter @tapwire/stats bench`.
 */
import { performance } from "node:perf_hooks";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { Registry } from "../src/index.js";

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

const OPS = 5_000_000;
const ROUNDS = 7;

interface Case {
  name: string;
  run(n: number): void;
}

const r = new Registry({ prefix: "bench_" });
const counter = r.counter("c");
const gauge = r.gauge("g");
const hist = r.histogram("h");
const plain = { x: 0 };
let sink = 0;

const cases: Case[] = [
  {
    name: "baseline_plain_x++",
    run(n) {
      for (let i = 0; i < n; i++) plain.x++;
    },
  },
  {
    name: "counter.inc()",
    run(n) {
      for (let i = 0; i < n; i++) counter.inc();
    },
  },
  {
    name: "gauge.set(v)",
    run(n) {
      for (let i = 0; i < n; i++) gauge.set(i);
    },
  },
  {
    name: "histogram.observe(seconds)",
    run(n) {
      for (let i = 0; i < n; i++) hist.observe((i & 4095) * 1e-6 + 5e-5);
    },
  },
];

function measure(c: Case): { ns: number; bytes: number } {
  gc();
  const heap0 = process.memoryUsage().heapUsed;
  const t0 = performance.now();
  c.run(OPS);
  const t1 = performance.now();
  const heap1 = process.memoryUsage().heapUsed;
  return { ns: ((t1 - t0) * 1e6) / OPS, bytes: Math.max(0, heap1 - heap0) / OPS };
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[s.length >> 1]!;
};

for (const c of cases) c.run(500_000); // warm up: let the optimiser compile every loop

const samples = new Map<string, { ns: number[]; bytes: number[] }>(
  cases.map((c) => [c.name, { ns: [], bytes: [] }]),
);
// Alternate the cases within each round so machine noise hits all of them alike.
for (let round = 0; round < ROUNDS; round++) {
  for (const c of cases) {
    const m = measure(c);
    samples.get(c.name)!.ns.push(m.ns);
    samples.get(c.name)!.bytes.push(m.bytes);
  }
}

const baseNs = median(samples.get("baseline_plain_x++")!.ns);
const results: Record<string, { nsPerOp: number; ratioToBaseline: number; bytesPerOp: number }> = {};
for (const [name, s] of samples) {
  const ns = median(s.ns);
  results[name] = {
    nsPerOp: Number(ns.toFixed(3)),
    ratioToBaseline: Number((ns / baseNs).toFixed(2)),
    bytesPerOp: Number(median(s.bytes).toFixed(4)),
  };
}

// Cold-path costs: a snapshot and a Prometheus scrape of a registry of realistic size.
const big = new Registry({ prefix: "tapwire_worker_" });
for (let i = 0; i < 20; i++) big.counter(`c${i}`).inc(i);
for (let i = 0; i < 10; i++) big.gauge(`g${i}`).set(i);
for (let i = 0; i < 8; i++) {
  const h = big.histogram(`h${i}`);
  for (let k = 0; k < 10_000; k++) h.observe(((k * 7919) % 100_000) * 1e-6);
}
const timeIt = async (n: number, fn: () => unknown): Promise<number> => {
  const t0 = performance.now();
  for (let i = 0; i < n; i++) {
    const v = await fn();
    sink += typeof v === "string" ? v.length : 1;
  }
  return ((performance.now() - t0) * 1000) / n;
};
await timeIt(20, () => big.snapshot());
await timeIt(20, () => big.prometheus());
const snapshotUs = await timeIt(200, () => big.snapshot());
const prometheusUs = await timeIt(200, () => big.prometheus());

process.stdout.write(
  `${JSON.stringify(
    {
      package: "@tapwire/stats",
      node: process.version,
      opsPerRound: OPS,
      rounds: ROUNDS,
      statistic: "median over rounds",
      hotPath: results,
      coldPath: {
        registry: "20 counters, 10 gauges, 8 seconds histograms",
        snapshotUsPerCall: Number(snapshotUs.toFixed(1)),
        prometheusUsPerCall: Number(prometheusUs.toFixed(1)),
      },
      sink: sink > 0 && plain.x > 0 ? "ok" : "?",
    },
    null,
    2,
  )}\n`,
);
