import fc from "fast-check";
import { describe, expect, test } from "vitest";
import {
  argmax,
  DYADIC_ONE,
  dyadicQuantize,
  mixSeed,
  ReferenceModelError,
  rejectionSample,
  sampleDyadic,
  sampleIndex,
  softmax,
  targetDistribution,
  topK,
  Xoshiro128,
} from "../src/index.js";

describe("Xoshiro128", () => {
  test("is deterministic per seed and differs across seeds", () => {
    const a = new Xoshiro128(1);
    const b = new Xoshiro128(1);
    const c = new Xoshiro128(2);
    const xa = Array.from({ length: 8 }, () => a.nextU32());
    expect(Array.from({ length: 8 }, () => b.nextU32())).toEqual(xa);
    expect(Array.from({ length: 8 }, () => c.nextU32())).not.toEqual(xa);
    a.reseed(1);
    expect(a.nextU32()).toBe(xa[0]);
  });

  test("floats are in [0,1) and roughly uniform; gaussians have unit variance", () => {
    const r = new Xoshiro128(9);
    let s = 0;
    let s2 = 0;
    let outside = 0;
    for (let i = 0; i < 20000; i++) {
      const x = r.nextFloat();
      if (!(x >= 0 && x < 1)) outside++;
      s += x;
      const g = r.nextGaussian();
      s2 += g * g;
    }
    expect(outside).toBe(0);
    expect(s / 20000).toBeCloseTo(0.5, 1);
    expect(s2 / 20000).toBeCloseTo(1, 1);
    expect(mixSeed(1, 2)).not.toBe(mixSeed(2, 1));
  });
});

describe("softmax / topK / argmax", () => {
  test("softmax sums to 1 and sharpens with lower temperature", () => {
    const l = [1, 2, 3, 0.5];
    const p = softmax(l);
    expect(p.reduce((a, b) => a + b, 0)).toBeCloseTo(1, 12);
    expect(softmax(l, 0.5)[2]!).toBeGreaterThan(p[2]!);
    expect(() => softmax(l, 0)).toThrow(ReferenceModelError);
  });

  test("topK returns the k largest in descending order, lowest index first on ties", () => {
    const ids = new Int32Array(4);
    expect(topK([1, 5, 3, 5, 2, 9], 4, ids)).toBe(4);
    expect(Array.from(ids)).toEqual([5, 1, 3, 2]);
    expect(argmax([1, 5, 3, 5])).toBe(1);
  });

  test("property: topK agrees with a sort", () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: -50, max: 50 }), { minLength: 1, maxLength: 100 }),
        fc.integer({ min: 1, max: 32 }),
        (xs, k) => {
          const ids = new Int32Array(k);
          const m = topK(xs, k, ids);
          const order = xs.map((v, i) => [v, i] as const).sort((a, b) => b[0] - a[0] || a[1] - b[1]);
          return m === Math.min(k, xs.length) && order.slice(0, m).every(([, i], j) => ids[j] === i);
        },
      ),
      { seed: 3, numRuns: 300 },
    );
  });

  test("targetDistribution restricts to top-k and renormalises", () => {
    const out = new Float64Array(5);
    targetDistribution([0, 1, 2, 3, 4], { temperature: 1, topK: 2 }, out);
    expect(out[0]).toBe(0);
    expect(out[2]).toBe(0);
    expect(out[3]! + out[4]!).toBeCloseTo(1, 12);
    expect(out[4]!).toBeGreaterThan(out[3]!);
  });
});

describe("dyadicQuantize (CONTRACT 8)", () => {
  const probsArb = fc
    .array(fc.double({ min: 0, max: 1, noNaN: true }), { minLength: 1, maxLength: 32 })
    .filter((a) => a.some((x) => x > 1e-12));

  test("property: integers >= 1 summing exactly to 2^24, within k units of p * 2^24", () => {
    fc.assert(
      fc.property(probsArb, fc.nat({ max: 5 }), (ps, off) => {
        const k = ps.length;
        const out = new Uint32Array(off + k + 3).fill(0xdeadbeef);
        dyadicQuantize(ps, k, out, off);
        const sum = ps.reduce((a, b) => a + b, 0);
        let total = 0;
        for (let i = 0; i < k; i++) {
          const q = out[off + i]!;
          if (!Number.isInteger(q) || q < 1) return false;
          total += q;
          if (Math.abs(q - (ps[i]! / sum) * DYADIC_ONE) > k + 1) return false;
        }
        // Untouched around the written range.
        for (let i = 0; i < off; i++) if (out[i] !== 0xdeadbeef) return false;
        for (let i = off + k; i < out.length; i++) if (out[i] !== 0xdeadbeef) return false;
        return total === DYADIC_ONE;
      }),
      { seed: 1234, numRuns: 1000 },
    );
  });

  test("property: largest remainder is exact when no minimum is needed (error < 1 unit)", () => {
    fc.assert(
      fc.property(
        fc.array(fc.double({ min: 0.01, max: 1, noNaN: true }), { minLength: 1, maxLength: 32 }),
        (ps) => {
          const out = new Uint32Array(ps.length);
          dyadicQuantize(ps, ps.length, out);
          const sum = ps.reduce((a, b) => a + b, 0);
          return ps.every((p, i) => Math.abs(out[i]! - (p / sum) * DYADIC_ONE) < 1);
        },
      ),
      { seed: 99, numRuns: 500 },
    );
  });

  test("examples: uniform thirds, tiny probabilities bumped to 1, deterministic ties", () => {
    const out = new Uint32Array(3);
    dyadicQuantize([1, 1, 1], 3, out);
    expect(Array.from(out)).toEqual([5592406, 5592405, 5592405]);
    dyadicQuantize([1, 0, 0], 3, out);
    expect(Array.from(out)).toEqual([DYADIC_ONE - 2, 1, 1]);
    const one = new Uint32Array(1);
    dyadicQuantize([0.3], 1, one);
    expect(one[0]).toBe(DYADIC_ONE);
  });

  test("rejects bad input with RM_BAD_ARGUMENT naming the problem", () => {
    const out = new Uint32Array(4);
    expect(() => dyadicQuantize([0, 0], 2, out)).toThrow(/sum/);
    expect(() => dyadicQuantize([Number.NaN, 1], 2, out)).toThrow(/probs\[0\]/);
    expect(() => dyadicQuantize([-1, 1], 2, out)).toThrow(/probs\[0\]/);
    expect(() => dyadicQuantize([1, 1], 0, out)).toThrow(/topK/);
    expect(() => dyadicQuantize([1, 1], 3, out)).toThrow(/topK/);
    expect(() => dyadicQuantize([1, 1], 2, out, 3)).toThrow(/fit/);
  });

  test("sampleDyadic draws in proportion to q", () => {
    const q = new Uint32Array([DYADIC_ONE / 4, (3 * DYADIC_ONE) / 4]);
    const r = new Xoshiro128(5);
    let ones = 0;
    for (let i = 0; i < 20000; i++) ones += sampleDyadic(q, 2, r);
    expect(ones / 20000).toBeCloseTo(0.75, 1);
  });
});

describe("rejectionSample (CONTRACT 8)", () => {
  test("emits tokens distributed as p whatever the proposal (lossless)", () => {
    const v = 12;
    const rng = new Xoshiro128(77);
    const logits = Array.from({ length: v }, (_, i) => Math.sin(i * 1.7) * 2);
    const p = softmax(logits);
    // A deliberately different proposal, restricted to 6 tokens.
    const qLogits = Array.from({ length: v }, (_, i) => Math.cos(i * 0.9) * 2);
    const qp = softmax(qLogits);
    const support = new Int32Array(6);
    topK(qp, 6, support);
    const kept = Array.from(support, (id) => qp[id]!);
    const q = new Uint32Array(6);
    dyadicQuantize(kept, 6, q);
    const counts = new Array<number>(v).fill(0);
    const n = 40000;
    let accepted = 0;
    for (let i = 0; i < n; i++) {
      const draft = support[sampleDyadic(q, 6, rng)]!;
      const r = rejectionSample(p, draft, support, q, 6, rng);
      counts[r.token]!++;
      if (r.accepted) accepted++;
    }
    // Chi-square goodness of fit, 11 degrees of freedom: 99.9% quantile is 31.26.
    let chi = 0;
    for (let i = 0; i < v; i++) chi += (counts[i]! - n * p[i]!) ** 2 / (n * p[i]!);
    expect(chi).toBeLessThan(31.26);
    expect(accepted).toBeGreaterThan(0);
    expect(accepted).toBeLessThan(n);
    expect(sampleIndex([0, 0, 1], rng)).toBe(2);
  });

  test("zero-padded support slots past top_k never stand for token 0 (CONTRACT 8 padding)", () => {
    // p puts everything on token 0; the proposal has token 0 with q = 1/2, then 30 padding
    // slots (id 0, q 0) as a TOP32 reply carries them. p(0)/q(0) = 2, so 0 is always accepted.
    const p = new Float64Array(8);
    p[0] = 1;
    const support = new Int32Array(32);
    const q = new Uint32Array(32);
    support[0] = 0;
    q[0] = 2 ** 23;
    support[1] = 5;
    q[1] = 2 ** 23;
    const rng = new Xoshiro128(3);
    for (let i = 0; i < 200; i++) {
      const r = rejectionSample(p, 0, support, q, 32, rng);
      expect(r).toEqual({ accepted: true, token: 0 });
    }
  });
});
