import fc from "fast-check";
import { describe, expect, test } from "vitest";
import {
  ClientError,
  type DepthCandidate,
  DepthPolicy,
  expectedAccepted,
  piecewiseLinearBudget,
} from "../src/index.js";

// Exhaustive optimum over every depth vector with sum <= budget (small cases only).
function bruteForce(cands: DepthCandidate[], budget: number, limits: number[]): number {
  let best = 0;
  const depth = new Array<number>(cands.length).fill(0);
  const rec = (i: number, left: number, acc: number): void => {
    if (i === cands.length) {
      if (acc > best) best = acc;
      return;
    }
    for (let d = 0; d <= Math.min(limits[i]!, left); d++) {
      depth[i] = d;
      rec(i + 1, left - d, acc + expectedAccepted(cands[i]!.conf, d));
    }
  };
  rec(0, budget, 0);
  return best;
}

const candArb = fc.record({
  k: fc.integer({ min: 0, max: 5 }),
  // coarse values make exact ties (and zeros, ones) frequent
  conf: fc.array(
    fc.oneof(
      fc.double({ min: 0, max: 1, noNaN: true }),
      fc.integer({ min: 0, max: 4 }).map((v) => v / 4),
    ),
    { minLength: 5, maxLength: 5 },
  ),
  margin: fc.array(
    fc.integer({ min: 0, max: 6 }).map((v) => v / 2),
    { minLength: 5, maxLength: 5 },
  ),
});

describe("DepthPolicy (confidence-scheduled verification)", () => {
  test("greedy over prefix gains equals the brute-force optimum", () => {
    fc.assert(
      fc.property(
        fc.array(candArb, { minLength: 0, maxLength: 5 }),
        fc.integer({ min: 0, max: 26 }),
        fc.constantFrom<"margin" | "index">("margin", "index"),
        (cands, budget, tieBreak) => {
          const policy = new DepthPolicy({ budget: 0, tieBreak, capacity: 1 });
          const out = new Int32Array(cands.length);
          const total = policy.allocate(cands, budget, out);
          let used = 0;
          let recomputed = 0;
          for (let i = 0; i < cands.length; i++) {
            expect(out[i]).toBeGreaterThanOrEqual(0);
            expect(out[i]).toBeLessThanOrEqual(cands[i]!.k);
            used += out[i]!;
            recomputed += expectedAccepted(cands[i]!.conf, out[i]!);
          }
          expect(used).toBeLessThanOrEqual(budget);
          expect(total).toBeCloseTo(recomputed, 9);
          const best = bruteForce(
            cands,
            budget,
            cands.map((c) => c.k),
          );
          expect(total).toBeCloseTo(best, 9);
        },
      ),
      { numRuns: 600 },
    );
  });

  test("depths equal a naive greedy scan with the same tie-break, at every budget (heap and all-fit paths)", () => {
    // O(budget * n) reference: take the largest next gain; ties by margin (if chosen), then index
    const naive = (cands: DepthCandidate[], budget: number, tieBreak: "margin" | "index"): number[] => {
      const d = cands.map(() => 0);
      const g = cands.map(() => 1);
      for (let left = budget; left > 0; left--) {
        let best = -1;
        let bg = 0;
        let bt = 0;
        for (let i = 0; i < cands.length; i++) {
          const c = cands[i]!;
          if (d[i]! >= c.k) continue;
          const gi = g[i]! * c.conf[d[i]!]!;
          if (!(gi > 0)) continue;
          const ti = tieBreak === "margin" && c.margin != null ? c.margin[d[i]!]! : 0;
          if (best < 0 || gi > bg || (gi === bg && ti > bt)) {
            best = i;
            bg = gi;
            bt = ti;
          }
        }
        if (best < 0) break;
        g[best] = bg;
        d[best]!++;
      }
      return d;
    };
    fc.assert(
      fc.property(
        fc.array(candArb, { minLength: 0, maxLength: 12 }),
        fc.integer({ min: 0, max: 70 }),
        fc.constantFrom<"margin" | "index">("margin", "index"),
        (cands, budget, tieBreak) => {
          const out = new Int32Array(cands.length);
          new DepthPolicy({ budget: 0, tieBreak, capacity: 1 }).allocate(cands, budget, out);
          expect(Array.from(out)).toEqual(naive(cands, budget, tieBreak));
        },
      ),
      { numRuns: 500 },
    );
  });

  test("with a margin gate, optimal among prefixes that stop before the first low-margin position", () => {
    fc.assert(
      fc.property(fc.array(candArb, { maxLength: 4 }), fc.integer({ min: 0, max: 20 }), (cands, budget) => {
        const gate = 1;
        const policy = new DepthPolicy({ budget: 0, marginGate: gate });
        const out = new Int32Array(cands.length);
        const total = policy.allocate(cands, budget, out);
        const limits = cands.map((c) => {
          const j = c.margin.slice(0, c.k).findIndex((m) => m < gate);
          return j < 0 ? c.k : j;
        });
        for (let i = 0; i < cands.length; i++) expect(out[i]).toBeLessThanOrEqual(limits[i]!);
        expect(total).toBeCloseTo(bruteForce(cands, budget, limits), 9);
      }),
      { numRuns: 300 },
    );
  });

  test("spends the budget on the most likely prefixes, nothing on zero-gain positions", () => {
    const policy = new DepthPolicy({ budget: 0 });
    const cands: DepthCandidate[] = [
      { k: 4, conf: [0.9, 0.9, 0.9, 0.9] },
      { k: 4, conf: [0.5, 0.99, 0.99, 0.99] },
      { k: 2, conf: [0, 1] },
    ];
    const out = new Int32Array(3);
    const total = policy.allocate(cands, 5, out);
    // gains: A .9 .81 .729 .656; B .5 .495 .49 .485; C 0
    expect(Array.from(out)).toEqual([4, 1, 0]);
    expect(total).toBeCloseTo(0.9 + 0.81 + 0.729 + 0.6561 + 0.5, 9);
    expect(policy.allocate(cands, 100, out)).toBeCloseTo(
      expectedAccepted(cands[0]!.conf, 4) + expectedAccepted(cands[1]!.conf, 4),
      9,
    );
    expect(Array.from(out)).toEqual([4, 4, 0]);
  });

  test("margin breaks ties between equal gains", () => {
    const cands: DepthCandidate[] = [
      { k: 1, conf: [0.5], margin: [1] },
      { k: 1, conf: [0.5], margin: [3] },
    ];
    const out = new Int32Array(2);
    new DepthPolicy({ budget: 0 }).allocate(cands, 1, out);
    expect(Array.from(out)).toEqual([0, 1]);
    new DepthPolicy({ budget: 0, tieBreak: "index" }).allocate(cands, 1, out);
    expect(Array.from(out)).toEqual([1, 0]);
  });

  test("load curve: piecewise linear, flat outside, floored", () => {
    const curve = piecewiseLinearBudget([
      { batchSize: 1, tokens: 32 },
      { batchSize: 16, tokens: 64 },
      { batchSize: 64, tokens: 16 },
    ]);
    expect(curve(0)).toBe(32);
    expect(curve(1)).toBe(32);
    expect(curve(8.5)).toBe(48);
    expect(curve(16)).toBe(64);
    expect(curve(40)).toBe(40);
    expect(curve(1000)).toBe(16);
    const p = new DepthPolicy({ budget: curve });
    expect(p.budgetFor(40)).toBe(40);
    expect(new DepthPolicy({ budget: 7.9 }).budgetFor(3)).toBe(7);
    expect(new DepthPolicy({ budget: () => Number.NaN }).budgetFor(3)).toBe(0);
  });

  test("options are validated, naming the bad one", () => {
    const bad: [object, string][] = [
      [{ budget: -1 }, "budget"],
      [{ budget: "x" }, "budget"],
      [{ budget: 1, marginGate: -1 }, "marginGate"],
      [{ budget: 1, minGain: 1 }, "minGain"],
      [{ budget: 1, tieBreak: "x" }, "tieBreak"],
      [{ budget: 1, capacity: 0 }, "capacity"],
    ];
    for (const [o, name] of bad) {
      expect(() => new DepthPolicy(o as never)).toThrow(ClientError);
      expect(() => new DepthPolicy(o as never)).toThrow(name);
    }
    expect(() => piecewiseLinearBudget([])).toThrow("loadCurve");
    expect(() =>
      piecewiseLinearBudget([
        { batchSize: 2, tokens: 1 },
        { batchSize: 1, tokens: 1 },
      ]),
    ).toThrow("increase");
  });
});
