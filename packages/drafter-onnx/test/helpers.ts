import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  createDefaultPair,
  type DraftHead,
  encodeBf16,
  type TargetModel,
  type Xoshiro128,
} from "@tapwire/reference-model";
import type { DraftBatchEntry, DraftOutput } from "@tapwire/worker";

let pair: { target: TargetModel; head: DraftHead } | null = null;

/** The default target + head pair (distilled once per test file). */
export function defaultPair(): { target: TargetModel; head: DraftHead } {
  pair ??= createDefaultPair();
  return pair;
}

/** A temporary directory removed by the returned function. */
export function tempDir(): { dir: string; remove: () => void } {
  const dir = mkdtempSync(join(tmpdir(), "tapwire-onnx-"));
  return { dir, remove: () => rmSync(dir, { recursive: true, force: true }) };
}

/** Reply views of a STEP of `n` entries (CONTRACT 7.4), zero-filled. */
export function makeOutput(n: number, numSpec: number, sampled: boolean, margin = true): DraftOutput {
  return {
    draftIds: new Int32Array(n * numSpec),
    confidence: new Float32Array(n * numSpec),
    margin: margin ? new Float32Array(n * numSpec) : null,
    sampledMask: sampled ? new Uint8Array(n * numSpec) : null,
    supportIds: sampled ? new Int32Array(n * numSpec * 32) : null,
    proposalQ: sampled ? new Uint32Array(n * numSpec * 32) : null,
    numSpec,
    failed: new Uint8Array(n),
  };
}

/** Options of {@link randomStep}. */
export interface RandomStepOptions {
  maxBatch: number;
  window: number;
  numSpec: number;
  vocab: number;
  rowBytes: number;
  sampled: boolean;
}

/** `count` rows of random bf16 values: N(0, s) with a random scale per row, 2% exact zeros. */
export function rowPool(rng: Xoshiro128, rowBytes: number, count: number): Uint8Array {
  const elems = rowBytes / 2;
  const f = new Float32Array(elems);
  const pool = new Uint8Array(count * rowBytes);
  for (let r = 0; r < count; r++) {
    const scale = 0.1 + rng.nextFloat() * 3;
    for (let t = 0; t < elems; t++) f[t] = rng.nextFloat() < 0.02 ? 0 : rng.nextGaussian() * scale;
    encodeBf16(f, pool, r * rowBytes);
  }
  return pool;
}

/**
 * A random STEP batch: 1..maxBatch entries, each with 0..W contiguous rows of `pool` (from a
 * random start), a random anchor, k in 1..N and, in sampled sessions, sample meta mixing
 * greedy entries, ordinary temperatures and very low ones (probabilities that underflow to 0).
 */
export function randomStep(rng: Xoshiro128, o: RandomStepOptions, pool: Uint8Array): DraftBatchEntry[] {
  const n = 1 + rng.nextInt(o.maxBatch);
  const poolRows = pool.length / o.rowBytes;
  const batch: DraftBatchEntry[] = [];
  for (let i = 0; i < n; i++) {
    const nRows = rng.nextInt(Math.min(o.window, poolRows) + 1);
    const start = rng.nextInt(poolRows - nRows + 1);
    const rows = pool.subarray(start * o.rowBytes, (start + nRows) * o.rowBytes);
    let sample = null;
    if (o.sampled) {
      const kind = rng.nextInt(4);
      const tempMilli = kind === 0 ? 0 : kind === 1 ? 1 + rng.nextInt(60) : 200 + rng.nextInt(3000);
      sample = { seed: rng.nextU32(), topK: 1 + rng.nextInt(32), tempMilli };
    }
    batch.push({
      index: i,
      slot: i * 3,
      anchorPos: nRows + rng.nextInt(1000),
      anchorToken: rng.nextInt(o.vocab),
      k: 1 + rng.nextInt(o.numSpec),
      rows,
      nRows,
      sample,
    });
  }
  return batch;
}
