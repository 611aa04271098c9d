/**
 * A/B of exported models in one process (graph work on the exporter, docs/benchmarks/onnx-drafter.md):
 * `pnpm --filter @tapwire/drafter-onnx bench:ab A.onnx B.onnx ...` (`current` for this tree's
 * `exportReferenceHead` of the default head; `TAPWIRE_AB_SAVE=FILE` writes that export, to keep
 * it as the A of a later run). Every model drafts the same STEPs of 8 and 64 entries (full windows,
 * greedy, N = 4, 1 intra-op thread), interleaved model by model so that the machine's load hits
 * each alike; CPU time per STEP (means and medians), cost per entry `(t(64) - t(8)) / 56`, fixed
 * cost `t(8) - 8 x per entry` and the ceiling of merging eight STEPs of 8 `8 x t(8) / t(64)`.
 * Then whether every model's drafts and margins equal the first's, byte for byte, and the largest
 * relative difference of their confidences. JSON on stdout.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { createDefaultPair, Xoshiro128 } from "@tapwire/reference-model";
import type { DraftBatchEntry } from "@tapwire/worker";
import { exportReferenceHead, OnnxDrafter } from "../src/index.js";
import { makeOutput, rowPool } from "../test/helpers.js";

const { head } = createDefaultPair();
const rb = head.numTaps * head.hidden * 2;
const W = head.config.window;
const N = head.config.numSpec;
const rng = new Xoshiro128(2024);
const pool = rowPool(rng, rb, 64);
const ROUNDS = Number(process.env["TAPWIRE_AB_ROUNDS"] ?? 200);
const WARM = 20;
const SIZES = [8, 64];

const files = process.argv.slice(2);
if (files.length === 0) throw new Error("usage: bench:ab A.onnx [B.onnx ...] (current: this tree's export)");
const current = exportReferenceHead(head);
const save = process.env["TAPWIRE_AB_SAVE"];
if (save !== undefined) writeFileSync(save, current);
const drafters = await Promise.all(
  files.map((f) => OnnxDrafter.create(f === "current" ? current : readFileSync(f), { intraOpThreads: 1 })),
);

function batchOf(n: number): DraftBatchEntry[] {
  return Array.from({ length: n }, (_, i) => {
    const s = rng.nextInt(64 - W + 1);
    return {
      index: i,
      slot: i,
      anchorPos: 100 + i,
      anchorToken: rng.nextInt(head.vocabSize),
      k: N,
      rows: pool.subarray(s * rb, (s + W) * rb),
      nRows: W,
      sample: null,
    };
  });
}

const batches = SIZES.map(batchOf);
const outs = drafters.map(() => SIZES.map((n) => makeOutput(n, N, false)));
const times = drafters.map(() => SIZES.map(() => [] as number[]));
for (let r = 0; r < WARM + ROUNDS; r++) {
  for (let k = 0; k < SIZES.length; k++) {
    for (let m = 0; m < drafters.length; m++) {
      const a = process.cpuUsage();
      await drafters[m]!.draft(batches[k]!, outs[m]![k]!);
      const b = process.cpuUsage(a);
      if (r >= WARM) times[m]![k]!.push((b.user + b.system) / 1000);
    }
  }
}
const mean = (x: number[]) => x.reduce((a, b) => a + b, 0) / x.length;
const median = (x: number[]) => [...x].sort((a, b) => a - b)[x.length >> 1]!;
const r3 = (x: number) => Math.round(x * 1000) / 1000;
const same = (a: Int32Array | Float32Array, b: Int32Array | Float32Array) =>
  Buffer.compare(
    Buffer.from(a.buffer, a.byteOffset, a.byteLength),
    Buffer.from(b.buffer, b.byteOffset, b.byteLength),
  ) === 0;
const models = files.map((f, m) => {
  const [t8, t64] = times[m]!.map(mean) as [number, number];
  const e = (t64 - t8) / 56;
  const equal = SIZES.map((_, k) => {
    const x = outs[0]![k]!;
    const y = outs[m]![k]!;
    let conf = 0;
    for (let i = 0; i < x.confidence.length; i++)
      conf = Math.max(conf, Math.abs(x.confidence[i]! - y.confidence[i]!) / x.confidence[i]!);
    return {
      drafts_and_margins_equal_first: same(x.draftIds, y.draftIds) && same(x.margin!, y.margin!),
      conf,
    };
  });
  return {
    model: f,
    cpu_ms_8: r3(t8),
    cpu_ms_64: r3(t64),
    median_ms_8: r3(median(times[m]![0]!)),
    median_ms_64: r3(median(times[m]![1]!)),
    per_entry_us: r3(e * 1000),
    fixed_ms: r3(t8 - 8 * e),
    ceiling_8x8_vs_64: r3((8 * t8) / t64),
    drafts_and_margins_equal_first: equal.every((q) => q.drafts_and_margins_equal_first),
    confidence_max_rel_diff_to_first: Math.max(...equal.map((q) => q.conf)),
  };
});
process.stdout.write(`${JSON.stringify({ bench: "drafter-onnx A/B", rounds: ROUNDS, models }, null, 2)}\n`);
