/**
 * Bench of @tapwire/reference-model: prints one JSON object on stdout.
 *
 * Each operation is timed next to a baseline doing the same number of multiply-adds in a plain
 * Float32Array dot-product loop, in the same run, so the ratio is meaningful on a busy machine.
 */
import {
  DEFAULT_DRAFT_CONFIG,
  DEFAULT_TARGET_CONFIG,
  DraftHead,
  measureAcceptance,
  TARGET_DYNAMICS,
  TargetModel,
  TOP_K_MAX,
} from "../src/index.js";

const quick = process.argv.includes("--quick");

function cpuUs(): number {
  const u = process.cpuUsage();
  return u.user + u.system;
}

/** µs of CPU time per call of `fn`, over a batch of about `ms` milliseconds. */
function batch(fn: () => void, ms: number): number {
  let n = 0;
  const c0 = cpuUs();
  let c = c0;
  while (c - c0 < ms * 1000) {
    for (let i = 0; i < 10; i++) fn();
    n += 10;
    c = cpuUs();
  }
  return (c - c0) / n;
}

/**
 * Times `fn` against `base` in alternating batches (CPU time, so that time spent descheduled on
 * a busy machine does not count) and returns the medians and the median of per-pair ratios.
 */
function compare(fn: () => void, base: () => void): { us: number; baseline_us: number; ratio: number } {
  for (let i = 0; i < 50; i++) {
    fn();
    base();
  }
  const ms = quick ? 8 : 60;
  const a: number[] = [];
  const b: number[] = [];
  const r: number[] = [];
  for (let i = 0; i < 9; i++) {
    const x = batch(fn, ms);
    const y = batch(base, ms);
    a.push(x);
    b.push(y);
    r.push(x / y);
  }
  const med = (v: number[]): number => [...v].sort((p, q) => p - q)[v.length >> 1]!;
  return { us: round(med(a)), baseline_us: round(med(b)), ratio: round(med(r)) };
}

const BASE_LEN = 4096;
const xa = new Float32Array(BASE_LEN).map((_, i) => Math.sin(i));
const xb = new Float32Array(BASE_LEN).map((_, i) => Math.cos(i));
let sink = 0;
/** A plain loop of `macs` multiply-adds over two Float32Arrays (the baseline of the same FLOPs). */
function dotLoop(macs: number): number {
  let acc = 0;
  let left = macs;
  while (left > 0) {
    const n = Math.min(left, BASE_LEN);
    for (let i = 0; i < n; i++) acc += xa[i]! * xb[i]!;
    left -= n;
  }
  return acc;
}

function baseline(macs: number): () => void {
  return () => {
    sink += dotLoop(macs);
  };
}

function round(x: number, d = 2): number {
  const f = 10 ** d;
  return Math.round(x * f) / f;
}

const results: Record<string, unknown>[] = [];

for (const hidden of [1024, 4096]) {
  const target = TargetModel.create({ ...DEFAULT_TARGET_CONFIG, hidden });
  const d = target.config.stateDim;
  const dc = d - 2;
  const v = target.config.vocabSize;
  const l = TARGET_DYNAMICS.readoutRank;
  const n = target.config.numTaps * hidden;
  const logits = new Float32Array(v);
  const row = new Uint8Array(target.rowBytes);
  const st = target.initialState([1, 2, 3]);
  let tok = 0;
  const fwdMacs = dc * dc + l * d + v * l + n * TARGET_DYNAMICS.tapFanIn;
  const fwd = compare(() => {
    target.forward(st, tok, logits, row, st);
    tok = (tok + 7) % v;
  }, baseline(fwdMacs));
  results.push({ op: "target.forward (logits + row)", rows: `3x${hidden} bf16`, ...fwd, macs: fwdMacs });
  if (hidden === 1024) {
    const macs = dc * dc + l * d + v * l;
    const noRow = compare(() => {
      target.forward(st, tok, logits, null, st);
      tok = (tok + 7) % v;
    }, baseline(macs));
    results.push({ op: "target.forward (logits only)", rows: "-", ...noRow, macs });
  }

  const head = DraftHead.distill(target, { ...DEFAULT_DRAFT_CONFIG, calibrationRounds: quick ? 32 : 192 });
  const w = 16;
  const k = 4;
  const rows = new Uint8Array(w * target.rowBytes);
  for (let i = 0; i < w; i++)
    target.forward(st, (i * 13) % v, logits, rows.subarray(i * target.rowBytes), st);
  const out = { ids: new Int32Array(k), conf: new Float32Array(k), margin: new Float32Array(k), offset: 0 };
  const c = head.config;
  const draftMacs =
    c.readDims * d + k * (2 * c.rank * dc + 2 * dc + l * d + v * l) + (k - 1) * dc * c.markovRank + k * v;
  let anchor = 0;
  const greedy = compare(() => {
    head.draft(rows, w, anchor, k, out);
    anchor = (anchor + 11) % v;
  }, baseline(draftMacs));
  const sample = {
    seed: 1,
    topK: TOP_K_MAX,
    tempMilli: 1000,
    supportIds: new Int32Array(k * TOP_K_MAX),
    proposalQ: new Uint32Array(k * TOP_K_MAX),
    offset: 0,
  };
  const sampled = compare(() => {
    head.draft(rows, w, anchor, k, out, sample);
    anchor = (anchor + 11) % v;
    sample.seed++;
  }, baseline(draftMacs));
  results.push({ op: "head.draft greedy, N=4, W=16", rows: `3x${hidden} bf16`, ...greedy, macs: draftMacs });
  results.push({
    op: "head.draft TOP32 (temp 1.0, top_k 32), N=4, W=16",
    rows: `3x${hidden} bf16`,
    ...sampled,
    macs: draftMacs,
  });
}

const target = TargetModel.create(DEFAULT_TARGET_CONFIG);
const t0 = performance.now();
const head = DraftHead.distill(target, DEFAULT_DRAFT_CONFIG);
const distillMs = performance.now() - t0;
const acceptance = measureAcceptance(target, head, { numSpec: 4, rounds: quick ? 200 : 2000, seed: 1 });

process.stdout.write(
  `${JSON.stringify(
    {
      package: "@tapwire/reference-model",
      node: process.version,
      quick,
      timings: results,
      distill_default_ms: round(distillMs, 0),
      acceptance_default: {
        numSpec: 4,
        rounds: acceptance.rounds,
        meanAcceptedLength: round(acceptance.meanAcceptedLength, 3),
        meanMatchedDrafts: round(acceptance.meanMatchedDrafts, 3),
        acceptanceByPosition: acceptance.acceptanceByPosition.map((x) => round(x, 3)),
        meanConfidenceByPosition: acceptance.meanConfidenceByPosition.map((x) => round(x, 3)),
        distinctTokens: acceptance.distinctTokens,
      },
      sink: sink > 0 ? 1 : 0,
    },
    null,
    2,
  )}\n`,
);
