/**
 * drafter-onnx benchmarks (JSON on stdout). The same head (the default reference head, rows of
 * 3 x 1024 bf16, vocab 2048, W 16) drafted by OnnxDrafter (the exported model on ONNX Runtime,
 * CPU) and by ReferenceDrafter (the JavaScript head, the baseline, measured in the same run):
 *
 * - per-STEP drafting time at 1, 8, 64 and 256 entries, N = 4 and 8, 1 and 2 intra-op threads
 *   (greedy), and TOP32 at 64 entries; the two drafters' STEPs interleaved; `speedup` =
 *   reference / onnx (means; `speedup_median` of the medians);
 * - allocation per STEP after warm-up at 8, 64 and 256 entries: JS heap, and ArrayBuffer memory
 *   (onnxruntime-node returns a fresh copy of every output of every run, even into preallocated
 *   output tensors, so that part grows with the batch);
 * - model load time: export, ONNX Runtime session creation, and the reference head's parse.
 *
 * TAPWIRE_BENCH_QUICK=1 runs fewer iterations (a smoke run).
 */
import { cpus } from "node:os";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { createDefaultPair, DraftHead, Xoshiro128 } from "@tapwire/reference-model";
import { type DraftBatchEntry, type Drafter, type DraftOutput, ReferenceDrafter } from "@tapwire/worker";
import { exportReferenceHead, OnnxDrafter } from "../src/index.js";
import { makeOutput, rowPool } from "../test/helpers.js";

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;
const QUICK = process.env["TAPWIRE_BENCH_QUICK"] === "1";

const { head } = createDefaultPair();
const rb = head.numTaps * head.hidden * 2;
const W = head.config.window;
const rng = new Xoshiro128(2024);
const pool = rowPool(rng, rb, 64);

function batchOf(n: number, k: number, sampled: boolean): DraftBatchEntry[] {
  return Array.from({ length: n }, (_, i) => {
    const start = rng.nextInt(pool.length / rb - W + 1);
    return {
      index: i,
      slot: i,
      anchorPos: 100 + i,
      anchorToken: rng.nextInt(head.vocabSize),
      k,
      rows: pool.subarray(start * rb, (start + W) * rb),
      nRows: W,
      sample: sampled ? { seed: rng.nextU32(), topK: 32, tempMilli: 800 } : null,
    };
  });
}

function clear(out: DraftOutput): void {
  out.draftIds.fill(0);
  out.confidence.fill(0);
  out.margin?.fill(0);
  out.sampledMask?.fill(0);
  out.supportIds?.fill(0);
  out.proposalQ?.fill(0);
  out.failed?.fill(0);
}

/**
 * Mean ms per STEP of two drafters on the same batch, their STEPs interleaved (A, B, A, B, ...)
 * so that a change of machine load during the measurement hits both alike; at least `minIter`
 * STEPs each and about `budgetMs` in all, after 3 warm-up STEPs each.
 */
async function timePair(
  a: Drafter,
  b: Drafter,
  batch: DraftBatchEntry[],
  outA: DraftOutput,
  outB: DraftOutput,
  budgetMs: number,
  minIter: number,
) {
  for (let i = 0; i < 3; i++) {
    await a.draft(batch, outA);
    await b.draft(batch, outB);
  }
  const ta: number[] = [];
  const tb: number[] = [];
  const t0 = performance.now();
  while (ta.length < minIter || (performance.now() - t0 < budgetMs && ta.length < 2000)) {
    clear(outA);
    let x = performance.now();
    await a.draft(batch, outA);
    ta.push(performance.now() - x);
    clear(outB);
    x = performance.now();
    await b.draft(batch, outB);
    tb.push(performance.now() - x);
  }
  const stat = (t: number[]) => {
    const sorted = [...t].sort((x, y) => x - y);
    return {
      mean: t.reduce((s2, x2) => s2 + x2, 0) / t.length,
      median: sorted[sorted.length >> 1]!,
      iterations: t.length,
    };
  };
  return { a: stat(ta), b: stat(tb) };
}

/**
 * Allocation per STEP after warm-up: gc, `m` STEPs, then the growth of the JS heap and of
 * ArrayBuffer memory (outside the heap) divided by `m`, 5 samples: the median for the heap (JIT
 * and feedback allocations add noise), the largest for ArrayBuffers (a collection inside a
 * sample can only make it smaller).
 */
async function allocPerStep(d: Drafter, batch: DraftBatchEntry[], out: DraftOutput, m: number) {
  for (let i = 0; i < 5; i++) await d.draft(batch, out);
  const heaps: number[] = [];
  let arrayBuffers = 0;
  for (let rep = 0; rep < 5; rep++) {
    gc();
    const before = process.memoryUsage();
    for (let i = 0; i < m; i++) await d.draft(batch, out);
    const after = process.memoryUsage();
    heaps.push(Math.max(0, after.heapUsed - before.heapUsed) / m);
    arrayBuffers = Math.max(arrayBuffers, (after.arrayBuffers - before.arrayBuffers) / m);
  }
  heaps.sort((a, b) => a - b);
  return { heap: Math.round(heaps[2]!), arrayBuffers: Math.round(arrayBuffers) };
}

const r2 = (x: number) => Math.round(x * 1000) / 1000;

async function main(): Promise<void> {
  const t0 = performance.now();
  const st = head.toSafetensors();
  const tParse0 = performance.now();
  DraftHead.fromSafetensors(st);
  const refLoadMs = performance.now() - tParse0;
  const tExp = performance.now();
  const model = exportReferenceHead(head);
  const exportMs = performance.now() - tExp;
  const load: Record<string, number> = {
    export_ms: r2(exportMs),
    reference_parse_ms: r2(refLoadMs),
    model_bytes: model.length,
  };
  // Keyed by N * 100 + threads; the N = 8 model is the same head exported with tapwire.num_spec 8.
  const drafters = new Map<number, OnnxDrafter>();
  for (const numSpec of [4, 8]) {
    const bytes = numSpec === head.config.numSpec ? model : exportReferenceHead(head, { numSpec });
    for (const threads of [1, 2]) {
      const a = performance.now();
      drafters.set(numSpec * 100 + threads, await OnnxDrafter.create(bytes, { intraOpThreads: threads }));
      if (numSpec === 4) load[`onnx_session_ms_threads_${threads}`] = r2(performance.now() - a);
    }
  }
  const budget = QUICK ? 150 : 1500;
  const minIter = QUICK ? 2 : 5;
  const step: Record<string, unknown>[] = [];
  for (const numSpec of [4, 8]) {
    const ref = new ReferenceDrafter(head, { numSpec });
    for (const n of [1, 8, 64, 256]) {
      const batch = batchOf(n, numSpec, false);
      for (const threads of [1, 2]) {
        const d = drafters.get(numSpec * 100 + threads)!;
        const r = await timePair(
          ref,
          d,
          batch,
          makeOutput(n, numSpec, false),
          makeOutput(n, numSpec, false),
          budget,
          minIter,
        );
        step.push({
          mode: "greedy",
          numSpec,
          entries: n,
          intraOpThreads: threads,
          reference_ms: r2(r.a.mean),
          onnx_ms: r2(r.b.mean),
          reference_median_ms: r2(r.a.median),
          onnx_median_ms: r2(r.b.median),
          speedup: r2(r.a.mean / r.b.mean),
          speedup_median: r2(r.a.median / r.b.median),
          iterations: r.b.iterations,
        });
        process.stderr.write(
          `N ${numSpec} entries ${n} threads ${threads}: ref ${r.a.mean.toFixed(2)} ms onnx ${r.b.mean.toFixed(2)} ms\n`,
        );
      }
    }
  }
  {
    const ref = new ReferenceDrafter(head);
    const batch = batchOf(64, 4, true);
    for (const threads of [1, 2]) {
      const r = await timePair(
        ref,
        drafters.get(400 + threads)!,
        batch,
        makeOutput(64, 4, true),
        makeOutput(64, 4, true),
        budget,
        minIter,
      );
      step.push({
        mode: "top32",
        numSpec: 4,
        entries: 64,
        intraOpThreads: threads,
        reference_ms: r2(r.a.mean),
        onnx_ms: r2(r.b.mean),
        reference_median_ms: r2(r.a.median),
        onnx_median_ms: r2(r.b.median),
        speedup: r2(r.a.mean / r.b.mean),
        speedup_median: r2(r.a.median / r.b.median),
        iterations: r.b.iterations,
      });
    }
  }
  const alloc: Record<string, unknown>[] = [];
  const ref = new ReferenceDrafter(head);
  for (const n of [8, 64, 256]) {
    const batch = batchOf(n, 4, false);
    const m = QUICK ? 3 : 10;
    const o = await allocPerStep(drafters.get(401)!, batch, makeOutput(n, 4, false), m);
    const r = await allocPerStep(ref, batch, makeOutput(n, 4, false), m);
    alloc.push({
      entries: n,
      numSpec: 4,
      onnx_heap_bytes_per_step: o.heap,
      onnx_array_buffer_bytes_per_step: o.arrayBuffers,
      reference_heap_bytes_per_step: r.heap,
      reference_array_buffer_bytes_per_step: r.arrayBuffers,
    });
  }
  for (const d of drafters.values()) await d.release();
  const at64 = step.filter((s) => s["entries"] === 64 && s["mode"] === "greedy");
  process.stdout.write(
    `${JSON.stringify(
      {
        package: "@tapwire/drafter-onnx",
        machine: { cpus: cpus().length, cpu: cpus()[0]?.model ?? "?", node: process.version },
        head: {
          vocab: head.vocabSize,
          rowBytes: rb,
          window: W,
          rank: head.config.rank,
          readDims: head.config.readDims,
        },
        load,
        step,
        alloc,
        goal: {
          description: "ONNX at least 2x faster than the JavaScript head at 64 entries (greedy)",
          min_speedup_at_64: Math.min(...at64.map((s) => s["speedup"] as number)),
        },
        quick: QUICK,
        seconds: Math.round(performance.now() - t0) / 1000,
      },
      null,
      2,
    )}\n`,
  );
}

await main();
