// Child process of the allocation test (stats.test.ts, issue 19): run with --expose-gc and
// --no-concurrent-recompilation, so that the optimising compiler runs on this thread when a
// function's (bytecode-counted) budget runs out. "Warm" is then a number of iterations, not an
// amount of wall time a busy machine may not give the background compiler thread. Prints one
// JSON line: the fewest heap bytes per op over the trials, the trials, and the op counts.
import { Registry } from "../dist/index.js";

if (typeof globalThis.gc !== "function") throw new Error("run with --expose-gc");
const r = new Registry();
const c = r.counter("c");
const g = r.gauge("g");
const h = r.histogram("h");
const loop = (n) => {
  for (let i = 0; i < n; i++) {
    c.inc();
    g.set(i);
    g.inc(0.5);
    h.observe((i % 5000) * 1e-6 + 1e-6);
  }
};
const WARM = 200_000;
const OPS = 1_000_000;
const TRIALS = 5;
loop(WARM);
const perOp = [];
for (let t = 0; t < TRIALS; t++) {
  globalThis.gc();
  const before = process.memoryUsage().heapUsed;
  loop(OPS);
  const after = process.memoryUsage().heapUsed;
  perOp.push((after - before) / OPS);
}
process.stdout.write(
  `${JSON.stringify({ best: Math.min(...perOp), perOp, count: c.value, observed: h.count, expected: WARM + TRIALS * OPS })}\n`,
);
