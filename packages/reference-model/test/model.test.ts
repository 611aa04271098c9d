import { describe, expect, test } from "vitest";
import {
  bf16ToF32,
  DEFAULT_DRAFT_CONFIG,
  DEFAULT_TARGET_CONFIG,
  DraftHead,
  f32ToBf16,
  measureAcceptance,
  ReferenceModelError,
  TargetModel,
} from "../src/index.js";

const target = TargetModel.create(DEFAULT_TARGET_CONFIG);
const head = DraftHead.distill(target, DEFAULT_DRAFT_CONFIG);

/** Tap values of the row that are not the bf16 of the target's projection of `state`. */
function rowMismatches(t: TargetModel, state: { vector: Float32Array }, row: Uint8Array): number {
  const { p, pIdx } = t.weights;
  const n = t.config.numTaps * t.config.hidden;
  const fan = p.length / n;
  let mismatches = 0;
  for (let i = 0; i < n; i++) {
    let acc = 0;
    for (let f = 0; f < fan; f++) acc += p[i * fan + f]! * state.vector[pIdx[i * fan + f]!]!;
    if ((row[2 * i]! | (row[2 * i + 1]! << 8)) !== f32ToBf16(acc)) mismatches++;
  }
  return mismatches;
}

function greedy(t: TargetModel, prompt: number[], n: number, extra?: ArrayBufferView): number[] {
  const logits = new Float32Array(t.config.vocabSize);
  const st = t.initialState([], extra);
  for (const tok of prompt) t.forward(st, tok, logits, null, st);
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const tok = t.argmax(logits);
    out.push(tok);
    t.forward(st, tok, logits, null, st);
  }
  return out;
}

describe("TargetModel", () => {
  test("is deterministic in its seed and differs across seeds", () => {
    const again = TargetModel.create(DEFAULT_TARGET_CONFIG);
    expect(greedy(again, [1, 2, 3], 64)).toEqual(greedy(target, [1, 2, 3], 64));
    const other = TargetModel.create({ ...DEFAULT_TARGET_CONFIG, seed: 2 });
    expect(greedy(other, [1, 2, 3], 64)).not.toEqual(greedy(target, [1, 2, 3], 64));
  });

  test("greedy decoding is not trivially periodic", () => {
    const seq = greedy(target, [5, 6, 7, 8], 512);
    expect(new Set(seq).size).toBeGreaterThan(40);
    // No period p <= 64 holds over the last 256 tokens.
    const tail = seq.slice(256);
    for (let p = 1; p <= 64; p++) {
      expect(tail.every((t, i) => i < p || t === tail[i - p])).toBe(false);
    }
  });

  test("forward writes logits, a bf16 row of the consumed token, and the new state", () => {
    const logits = new Float32Array(target.config.vocabSize);
    const row = new Uint8Array(target.rowBytes);
    const st = target.initialState([3]);
    const next = target.forward(st, 9, logits, row);
    expect(next).not.toBe(st);
    expect(next.position).toBe(st.position + 1);
    expect(row.length).toBe(3 * 1024 * 2);
    let nonzero = 0;
    for (let i = 0; i < row.length; i += 2) {
      const v = bf16ToF32(row[i]! | (row[i + 1]! << 8));
      expect(Number.isFinite(v)).toBe(true);
      if (v !== 0) nonzero++;
    }
    expect(nonzero).toBeGreaterThan(3000);
    // In place stepping gives the same result.
    const logits2 = new Float32Array(target.config.vocabSize);
    const row2 = new Uint8Array(target.rowBytes);
    const st2 = target.initialState([3]);
    expect(target.forward(st2, 9, logits2, row2, st2)).toBe(st2);
    expect(Array.from(st2.vector)).toEqual(Array.from(next.vector));
    expect(logits2).toEqual(logits);
    expect(row2).toEqual(row);
  });

  test("the row is the bf16 (round to nearest even) of each tap value of the new state", () => {
    const logits = new Float32Array(target.config.vocabSize);
    const row = new Uint8Array(target.rowBytes);
    const next = target.forward(target.initialState([8, 9]), 10, logits, row);
    expect(rowMismatches(target, next, row)).toBe(0);
    // Logits are U (M s) + z.
    const { u, m, z } = target.weights;
    const l = m.length / target.config.stateDim;
    let maxErr = 0;
    for (let t = 0; t < 50; t++) {
      let acc = z[t]!;
      for (let i = 0; i < l; i++) {
        let h = 0;
        for (let a = 0; a < target.config.stateDim; a++)
          h += m[i * target.config.stateDim + a]! * next.vector[a]!;
        acc += u[t * l + i]! * h;
      }
      maxErr = Math.max(maxErr, Math.abs(acc - logits[t]!));
    }
    expect(maxErr).toBeLessThan(1e-3);
  });

  test("hidden is configurable: 3 x 4096 bf16 rows are the taps, and a head drafts from them", () => {
    const big = TargetModel.create({ ...DEFAULT_TARGET_CONFIG, hidden: 4096 });
    expect(big.rowBytes).toBe(3 * 4096 * 2);
    const logits = new Float32Array(big.config.vocabSize);
    const rows = new Uint8Array(8 * big.rowBytes);
    const st = big.initialState([1, 2]);
    for (let i = 0; i < 8; i++) big.forward(st, 30 + i, logits, rows.subarray(i * big.rowBytes), st);
    expect(rowMismatches(big, st, rows.subarray(7 * big.rowBytes))).toBe(0);
    const bigHead = DraftHead.distill(big, { ...DEFAULT_DRAFT_CONFIG, calibrationRounds: 0 });
    const r = measureAcceptance(big, bigHead, { numSpec: 4, rounds: 100, seed: 3 });
    expect(r.meanAcceptedLength).toBeGreaterThanOrEqual(1.8);
    expect(r.meanAcceptedLength).toBeLessThanOrEqual(3.0);
    // A row of the other geometry is refused.
    const out = { ids: new Int32Array(4), conf: new Float32Array(4), margin: null, offset: 0 };
    expect(() => bigHead.draft(new Uint8Array(target.rowBytes), 1, 0, 4, out)).toThrow(ReferenceModelError);
  });

  test("extra bytes condition the initial state: one flipped byte changes the output", () => {
    const emb = new Float32Array(256).map((_, i) => Math.sin(i));
    const base = greedy(target, [1, 2], 32, emb);
    expect(greedy(target, [1, 2], 32, Float32Array.from(emb))).toEqual(base);
    const bytes = new Uint8Array(emb.buffer.slice(0));
    bytes[100] = bytes[100]! ^ 1;
    expect(greedy(target, [1, 2], 32, bytes)).not.toEqual(base);
    expect(greedy(target, [1, 2], 32)).not.toEqual(base);
  });

  test("rejects bad tokens, buffers and configs with stable codes", () => {
    const logits = new Float32Array(target.config.vocabSize);
    const st = target.initialState();
    expect(() => target.forward(st, 2048, logits, null)).toThrow(ReferenceModelError);
    expect(() => target.forward(st, -1, logits, null)).toThrow(/token -1/);
    expect(() => target.forward(st, 1, new Float32Array(10), null)).toThrow(/outLogits/);
    expect(() => target.forward(st, 1, logits, new Uint8Array(10))).toThrow(/outRow/);
    expect(() => TargetModel.create({ ...DEFAULT_TARGET_CONFIG, vocabSize: 1 })).toThrow(/vocabSize/);
    try {
      TargetModel.create({ ...DEFAULT_TARGET_CONFIG, hidden: 0 });
      expect.unreachable();
    } catch (e) {
      expect((e as ReferenceModelError).code).toBe("RM_BAD_CONFIG");
    }
  });
});

describe("DraftHead greedy", () => {
  test("writes k positions with ids in range, confidence in [0,1], margins >= 0 (CONTRACT 6.3)", () => {
    const logits = new Float32Array(target.config.vocabSize);
    const rows = new Uint8Array(16 * target.rowBytes);
    const st = target.initialState();
    for (let i = 0; i < 16; i++) target.forward(st, i * 7, logits, rows.subarray(i * target.rowBytes), st);
    const ids = new Int32Array(12).fill(-5);
    const conf = new Float32Array(12).fill(-5);
    const margin = new Float32Array(12).fill(-5);
    head.draft(rows, 16, target.argmax(logits), 4, { ids, conf, margin, offset: 4 });
    for (let j = 0; j < 12; j++) {
      if (j < 4 || j >= 8) {
        expect(ids[j]).toBe(-5);
        continue;
      }
      expect(ids[j]).toBeGreaterThanOrEqual(0);
      expect(ids[j]).toBeLessThan(2048);
      expect(conf[j]).toBeGreaterThanOrEqual(0);
      expect(conf[j]).toBeLessThanOrEqual(1);
      expect(margin[j]).toBeGreaterThanOrEqual(0);
    }
    // The first draft is the target's greedy continuation here (the head is good at position 0).
    const next = target.forward(st, target.argmax(logits), logits, null);
    expect(next.position).toBe(17);
    expect(ids[4]).toBe(target.argmax(logits));
  });

  test("nRows = 0 drafts from the initial state; rows are read, not ignored", () => {
    const out = { ids: new Int32Array(4), conf: new Float32Array(4), margin: new Float32Array(4), offset: 0 };
    head.draft(new Uint8Array(0), 0, 17, 4, out);
    const a = Array.from(out.ids);
    const logits = new Float32Array(2048);
    const row = new Uint8Array(target.rowBytes);
    target.forward(target.initialState([4, 5]), 6, logits, row);
    head.draft(row, 1, 17, 4, out);
    expect(Array.from(out.ids)).not.toEqual(a);
  });

  test("rejects bad arguments", () => {
    const out = { ids: new Int32Array(4), conf: new Float32Array(4), margin: null, offset: 0 };
    expect(() => head.draft(new Uint8Array(10), 1, 0, 4, out)).toThrow(/rows need/);
    expect(() => head.draft(new Uint8Array(0), 0, 2048, 4, out)).toThrow(/anchor token/);
    expect(() => head.draft(new Uint8Array(0), 0, 0, 5, out)).toThrow(/too small/);
    expect(() => head.draft(new Uint8Array(0), 0, 0, 0, out)).toThrow(/k 0/);
    expect(() => DraftHead.distill(target, { ...DEFAULT_DRAFT_CONFIG, rank: 0 })).toThrow(/rank/);
    expect(() => DraftHead.distill(target, { ...DEFAULT_DRAFT_CONFIG, noise: -1 })).toThrow(/noise/);
  });
});

describe("acceptance (the harness's measurement)", () => {
  test("default head: greedy mean accepted length at N=4 lies in [1.8, 3.0]", () => {
    const r = measureAcceptance(target, head, { numSpec: 4, rounds: 600, seed: 11 });
    expect(r.meanAcceptedLength).toBeGreaterThanOrEqual(1.8);
    expect(r.meanAcceptedLength).toBeLessThanOrEqual(3.0);
    expect(r.meanAcceptedLength).toBeCloseTo(r.meanMatchedDrafts + 1, 10);
    expect(r.acceptanceByPosition[0]).toBeGreaterThan(0.6);
    // Calibrated: mean confidence of position 0 within 0.1 of its acceptance rate.
    expect(Math.abs(r.meanConfidenceByPosition[0]! - r.acceptanceByPosition[0]!)).toBeLessThan(0.1);
    expect(r.distinctTokens).toBeGreaterThan(50);
  });

  test("measureAcceptance validates its options and the head/target pairing", () => {
    const bad: [object, string][] = [
      [{ numSpec: 0 }, "numSpec"],
      [{ rounds: 0 }, "rounds"],
      [{ seed: -1 }, "seed"],
      [{ seed: 1.5 }, "seed"],
      [{ window: 0 }, "window"],
      [{ sequenceLength: 31 }, "sequenceLength"],
    ];
    for (const [opts, name] of bad) {
      expect(() => measureAcceptance(target, head, opts)).toThrow(name);
      try {
        measureAcceptance(target, head, opts);
      } catch (e) {
        expect((e as ReferenceModelError).code).toBe("RM_BAD_CONFIG");
      }
    }
    const other = TargetModel.create({ ...DEFAULT_TARGET_CONFIG, vocabSize: 1024 });
    expect(() => measureAcceptance(other, head, { rounds: 1 })).toThrow(/does not fit target/);
  });

  test("noise is a working knob: a noiseless full-rank head accepts more than a very noisy one", () => {
    const exact = DraftHead.distill(target, {
      ...DEFAULT_DRAFT_CONFIG,
      noise: 0,
      rank: 46,
      calibrationRounds: 0,
    });
    const bad = DraftHead.distill(target, { ...DEFAULT_DRAFT_CONFIG, noise: 1.5, calibrationRounds: 0 });
    const a = measureAcceptance(target, exact, { rounds: 200, seed: 5 });
    const b = measureAcceptance(target, bad, { rounds: 200, seed: 5 });
    expect(a.meanAcceptedLength).toBeGreaterThan(b.meanAcceptedLength + 0.5);
  });
});
