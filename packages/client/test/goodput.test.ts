// Goodput mode of the depth policy (docs/depth-policy.md): optimal over every allocation for the
// cost model (brute force), a property that fails for a policy choosing M by a fixed budget,
// graceful degradation (flat cost, concurrency 1); the verify-cost model's online fit; the
// confidence calibration on a miscalibrated synthetic drafter.
import fc from "fast-check";
import { describe, expect, test } from "vitest";
import {
  ClientError,
  ConfidenceCalibrator,
  type DepthCandidate,
  DepthPolicy,
  expectedAccepted,
  H100_8B_COST,
  type VerifyCost,
  VerifyCostModel,
} from "../src/index.js";

type Allocator = (p: DepthPolicy, cands: DepthCandidate[], batch: number, out: Int32Array) => void;

const goodput: Allocator = (p, cands, batch, out) => void p.allocateGoodput(cands, batch, out);
// the mutation the property must catch: M chosen by a fixed budget instead of by the cost
const fixedBudget: Allocator = (p, cands, _batch, out) => void p.allocate(cands, 4, out);

function rate(cands: DepthCandidate[], depth: ArrayLike<number>, batch: number, cost: VerifyCost): number {
  let e = 0;
  let m = 0;
  for (let i = 0; i < cands.length; i++) {
    e += expectedAccepted(cands[i]!.conf, depth[i]!);
    m += depth[i]!;
  }
  return (batch + e) / cost.roundSeconds(batch, m);
}

// the best expected tokens per second over every depth vector (small cases only)
function bruteForce(cands: DepthCandidate[], batch: number, cost: VerifyCost): number {
  let best = 0;
  const d = new Array<number>(cands.length).fill(0);
  const rec = (i: number): void => {
    if (i === cands.length) {
      best = Math.max(best, rate(cands, d, batch, cost));
      return;
    }
    for (let k = 0; k <= cands[i]!.k; k++) {
      d[i] = k;
      rec(i + 1);
    }
    d[i] = 0;
  };
  rec(0);
  return best;
}

const candArb = fc.record({
  k: fc.integer({ min: 0, max: 4 }),
  conf: fc.array(
    fc.oneof(
      fc.double({ min: 0, max: 1, noNaN: true }),
      fc.integer({ min: 0, max: 4 }).map((v) => v / 4),
    ),
    { minLength: 4, maxLength: 4 },
  ),
});

// rooflines from flat to steep, knees inside and outside the sizes seen
const costArb = fc
  .record({
    floorSec: fc.double({ min: 1e-4, max: 1e-2, noNaN: true }),
    kneeTokens: fc.integer({ min: 0, max: 24 }),
    slopeSec: fc.oneof(fc.constant(0), fc.double({ min: 1e-5, max: 5e-3, noNaN: true })),
    subKneeSlopeSec: fc.oneof(fc.constant(0), fc.double({ min: 1e-7, max: 1e-4, noNaN: true })),
    overheadSec: fc.double({ min: 0, max: 2e-3, noNaN: true }),
    rttSec: fc.double({ min: 0, max: 2e-3, noNaN: true }),
  })
  .map((p) => new VerifyCostModel({ ...p, online: false }));

function optimalProperty(alloc: Allocator) {
  return fc.property(
    fc.array(candArb, { minLength: 0, maxLength: 4 }),
    fc.integer({ min: 0, max: 3 }),
    costArb,
    (cands, extra, cost) => {
      const batch = cands.length + extra;
      const p = new DepthPolicy({ cost, capacity: 1 });
      const out = new Int32Array(cands.length);
      alloc(p, cands, batch, out);
      for (let i = 0; i < cands.length; i++) {
        if (out[i]! < 0 || out[i]! > cands[i]!.k) return false;
      }
      const best = bruteForce(cands, batch, cost);
      return rate(cands, out, batch, cost) >= best * (1 - 1e-9);
    },
  );
}

describe("DepthPolicy goodput mode", () => {
  test("equals the brute-force optimum of expected tokens per expected second over all allocations", () => {
    fc.assert(optimalProperty(goodput), { numRuns: 800 });
  });

  test("the property fails for a mutated policy that chooses M by a fixed budget", () => {
    const r = fc.check(optimalProperty(fixedBudget), { numRuns: 800, seed: 1 });
    expect(r.failed).toBe(true);
  });

  test("reports its choice: lastVerified, lastGoodput, lastSeconds match the depths", () => {
    const cost = new VerifyCostModel({ online: false });
    const p = new DepthPolicy({ cost });
    const cands: DepthCandidate[] = [
      { k: 4, conf: [0.9, 0.8, 0.7, 0.6] },
      { k: 4, conf: [0.3, 0.2, 0.1, 0.1] },
    ];
    const out = new Int32Array(2);
    const e = p.allocateFor(cands, 2, out);
    expect(p.mode).toBe("goodput");
    expect(p.lastVerified).toBe(out[0]! + out[1]!);
    expect(p.lastSeconds).toBeCloseTo(cost.roundSeconds(2, p.lastVerified), 12);
    expect(p.lastGoodput).toBeCloseTo((2 + e) / p.lastSeconds, 6);
    expect(e).toBeCloseTo(
      expectedAccepted(cands[0]!.conf, out[0]!) + expectedAccepted(cands[1]!.conf, out[1]!),
      9,
    );
  });

  test("flat cost: verifies every position with a positive gain", () => {
    fc.assert(
      fc.property(fc.array(candArb, { maxLength: 12 }), (cands) => {
        const cost = new VerifyCostModel({ slopeSec: 0, subKneeSlopeSec: 0, online: false });
        const out = new Int32Array(cands.length);
        new DepthPolicy({ cost }).allocateGoodput(cands, cands.length, out);
        for (let i = 0; i < cands.length; i++) {
          const c = cands[i]!;
          // useful: a gain that moves the expected tokens in floating point (not a denormal)
          let useful = 0;
          let positive = 0;
          let g = 1;
          for (let j = 0; j < c.k; j++) {
            g *= c.conf[j]!;
            if (!(g > 0)) break;
            positive++;
            if (g > 1e-9) useful = positive;
          }
          if (out[i]! < useful || out[i]! > positive) return false;
        }
        return true;
      }),
      { numRuns: 300 },
    );
  });

  test("concurrency 1: never worse than any fixed depth (the candidates are exactly the fixed depths)", () => {
    fc.assert(
      fc.property(candArb, costArb, (c, cost) => {
        const out = new Int32Array(1);
        new DepthPolicy({ cost }).allocateGoodput([c], 1, out);
        const mine = rate([c], out, 1, cost);
        for (let k = 0; k <= c.k; k++) if (rate([c], [k], 1, cost) > mine * (1 + 1e-9)) return false;
        return true;
      }),
      { numRuns: 500 },
    );
  });

  test("options: goodput needs a cost; a bad cost, mode or calibrator is named", () => {
    const bad: [object, string][] = [
      [{ mode: "goodput" }, "cost"],
      [{ cost: {} }, "cost"],
      [{ cost: new VerifyCostModel(), mode: "x" }, "mode"],
      [{ budget: 4, calibrator: {} }, "calibrator"],
      [{}, "budget"],
    ];
    for (const [o, name] of bad) {
      expect(() => new DepthPolicy(o as never)).toThrow(ClientError);
      expect(() => new DepthPolicy(o as never)).toThrow(name);
    }
    expect(new DepthPolicy({ budget: 8, cost: new VerifyCostModel(), mode: "budget" }).mode).toBe("budget");
    expect(() => new DepthPolicy({ mode: "fixed" })).toThrow("depth");
    expect(() => new DepthPolicy({ mode: "fixed", depth: 33 })).toThrow("depth");
  });

  test("fixed mode: min(depth, k) per request, whatever the gains", () => {
    const p = new DepthPolicy({ mode: "fixed", depth: 2 });
    const out = new Int32Array(3);
    const e = p.allocateFor(
      [
        { k: 4, conf: [0.5, 0.5, 0.5, 0.5] },
        { k: 1, conf: [0.9] },
        { k: 3, conf: [0, 1, 1] },
      ],
      3,
      out,
    );
    expect(Array.from(out)).toEqual([2, 1, 2]);
    expect(e).toBeCloseTo(0.5 + 0.25 + 0.9, 12);
    expect(p.lastVerified).toBe(5);
  });
});

describe("VerifyCostModel", () => {
  test("the roofline: floor up to the knee, then the slope per token; fixed costs on top", () => {
    const m = new VerifyCostModel({ online: false, subKneeSlopeSec: 0 });
    const p = H100_8B_COST;
    expect(m.forwardSeconds(10, 20)).toBe(p.floorSec);
    expect(m.forwardSeconds(100, 190)).toBeCloseTo(p.floorSec + p.slopeSec * (290 - p.kneeTokens), 12);
    expect(m.roundSeconds(1, 0)).toBeCloseTo(p.floorSec + p.overheadSec + p.rttSec, 12);
    m.observeRtt(0.002);
    expect(m.params().rttSec).toBe(0.002);
    m.observeRtt(0.004);
    expect(m.params().rttSec).toBeCloseTo(0.002 + 0.05 * 0.002, 12);
  });

  test("online fit recovers floor, knee and slope from the rounds an engine reports", () => {
    const truth = new VerifyCostModel({ floorSec: 4e-3, kneeTokens: 64, slopeSec: 50e-6, online: false });
    const m = new VerifyCostModel({ floorSec: 1e-3, kneeTokens: 1000, slopeSec: 1e-6 });
    let x = 12345;
    for (let r = 0; r < 400; r++) {
      x = (x * 1103515245 + 12345) >>> 0;
      const batch = 1 + (x % 64);
      const tokens = (x >>> 8) % (4 * batch + 1);
      m.observeRound(batch, tokens, truth.forwardSeconds(batch, tokens));
    }
    const p = m.params();
    expect(p.floorSec).toBeCloseTo(4e-3, 4);
    expect(p.slopeSec).toBeGreaterThan(40e-6);
    expect(p.slopeSec).toBeLessThan(60e-6);
    expect(Math.abs(p.kneeTokens - 64)).toBeLessThan(12);
    for (const [b, t] of [
      [1, 0],
      [16, 48],
      [64, 256],
    ] as const) {
      expect(m.forwardSeconds(b, t) / truth.forwardSeconds(b, t)).toBeCloseTo(1, 1);
    }
  });

  test("the sub-knee slope: a small per-token cost below the knee, continuous at the knee", () => {
    const m = new VerifyCostModel({ online: false });
    const p = H100_8B_COST;
    expect(p.subKneeSlopeSec).toBeGreaterThan(0);
    expect(p.subKneeSlopeSec).toBeLessThan(p.slopeSec);
    expect(m.forwardSeconds(1, 0)).toBeCloseTo(p.floorSec + p.subKneeSlopeSec, 12);
    expect(m.forwardSeconds(1, 8) - m.forwardSeconds(1, 0)).toBeCloseTo(8 * p.subKneeSlopeSec, 12);
    const atKnee = p.floorSec + p.subKneeSlopeSec * p.kneeTokens;
    expect(m.forwardSeconds(p.kneeTokens, 0)).toBeCloseTo(atKnee, 12);
    expect(m.forwardSeconds(100, 190)).toBeCloseTo(atKnee + p.slopeSec * (290 - p.kneeTokens), 12);
  });

  test("online fit recovers a known sub-knee slope, and the knee and slope past it", () => {
    const truth = new VerifyCostModel({
      floorSec: 5e-3,
      kneeTokens: 128,
      slopeSec: 40e-6,
      subKneeSlopeSec: 6e-6,
      online: false,
    });
    // a flat prior: the fit has to find the sub-knee slope from the data
    const m = new VerifyCostModel({ floorSec: 1e-3, kneeTokens: 1000, slopeSec: 1e-6, subKneeSlopeSec: 0 });
    let x = 777;
    for (let r = 0; r < 600; r++) {
      x = (x * 1103515245 + 12345) >>> 0;
      const batch = 1 + (x % 64);
      const tokens = (x >>> 8) % (4 * batch + 1);
      m.observeRound(batch, tokens, truth.forwardSeconds(batch, tokens));
    }
    const p = m.params();
    expect(p.subKneeSlopeSec).toBeGreaterThan(5e-6);
    expect(p.subKneeSlopeSec).toBeLessThan(7e-6);
    expect(p.floorSec).toBeCloseTo(5e-3, 4);
    expect(p.slopeSec).toBeGreaterThan(32e-6);
    expect(p.slopeSec).toBeLessThan(48e-6);
    expect(Math.abs(p.kneeTokens - 128)).toBeLessThan(20);
  });

  test("online fit below the knee only: the sub-knee slope is learnt, the prior's knee and slope kept", () => {
    const truth = new VerifyCostModel({
      floorSec: 6e-3,
      kneeTokens: 190,
      slopeSec: 32e-6,
      subKneeSlopeSec: 8e-6,
      online: false,
    });
    const m = new VerifyCostModel({ floorSec: 2e-3, kneeTokens: 1000, slopeSec: 5e-6, subKneeSlopeSec: 0 });
    // concurrency 1 with up to 8 drafts: forwards of 1..9 tokens
    for (let r = 0; r < 200; r++) m.observeRound(1, r % 9, truth.forwardSeconds(1, r % 9));
    const p = m.params();
    expect(p.subKneeSlopeSec).toBeCloseTo(8e-6, 9);
    expect(p.floorSec).toBeCloseTo(6e-3, 9);
    expect(p.kneeTokens).toBeGreaterThan(500);
    expect(p.slopeSec).toBe(5e-6);
  });

  test("one forward size only: the prior's shape is kept and the floor fitted", () => {
    const m = new VerifyCostModel({ floorSec: 1e-3, kneeTokens: 10, slopeSec: 1e-4, minObservations: 4 });
    for (let r = 0; r < 20; r++) m.observeRound(8, 8, 0.01);
    const p = m.params();
    expect(p.slopeSec).toBe(1e-4);
    expect(p.kneeTokens).toBe(10);
    expect(m.forwardSeconds(8, 8)).toBeCloseTo(0.01, 9);
  });

  test("options are validated, naming the bad one", () => {
    for (const [o, name] of [
      [{ floorSec: -1 }, "floorSec"],
      [{ slopeSec: Number.NaN }, "slopeSec"],
      [{ subKneeSlopeSec: -1e-6 }, "subKneeSlopeSec"],
      [{ decay: 0 }, "decay"],
      [{ minObservations: 1 }, "minObservations"],
      [{ rttAlpha: 2 }, "rttAlpha"],
    ] as const) {
      expect(() => new VerifyCostModel(o as never)).toThrow(name);
    }
  });
});

describe("ConfidenceCalibrator", () => {
  // a synthetic drafter whose confidence c means acceptance probability c^3 (over-confident)
  test("recovers a miscalibrated drafter: ECE after calibration small, before large; monotone map", () => {
    const N = 4;
    const cal = new ConfidenceCalibrator({ positions: N });
    let x = 7;
    const rnd = () => {
      x = (x * 1664525 + 1013904223) >>> 0;
      return x / 2 ** 32;
    };
    const conf = new Float64Array(N);
    const round = () => {
      for (let r = 0; r < 16; r++) {
        for (let j = 0; j < N; j++) conf[j] = 0.2 + 0.8 * rnd();
        let acc = 0;
        while (acc < N && rnd() < conf[acc]! ** 3) acc++;
        cal.observeDraft(conf, N, acc);
      }
      cal.endRound();
    };
    for (let i = 0; i < 600; i++) round();
    cal.resetMetrics();
    for (let i = 0; i < 600; i++) round();
    const rep = cal.report();
    for (let j = 0; j < 2; j++) {
      expect(rep.raw[j]!).toBeGreaterThan(0.15);
      expect(rep.calibrated[j]!).toBeLessThan(0.03);
    }
    for (const c of [0.3, 0.5, 0.7, 0.9]) expect(cal.calibrate(0, c)).toBeCloseTo(c ** 3, 1);
    let prev = -1;
    for (let c = 0; c <= 1; c += 0.01) {
      const v = cal.calibrate(1, c);
      expect(v).toBeGreaterThanOrEqual(prev - 1e-12);
      prev = v;
    }
  });

  test("before any outcome the map is the identity (bin centres, interpolated)", () => {
    const cal = new ConfidenceCalibrator({ positions: 2, bins: 10 });
    for (const c of [0.05, 0.3, 0.55, 0.95]) expect(cal.calibrate(0, c)).toBeCloseTo(c, 9);
    expect(cal.report().calibrated).toEqual([0, 0]);
  });

  test("a calibrated policy verifies what the outcomes support, not what the raw confidences claim", () => {
    const cal = new ConfidenceCalibrator({ positions: 1, prior: 0.1 });
    // every draft claims 0.95 and is never accepted
    for (let r = 0; r < 50; r++) {
      cal.observeDraft([0.95], 1, 0);
      cal.endRound();
    }
    const out = new Int32Array(1);
    // every verified token costs 1 ms: worth it at 0.95, not at what the outcomes say
    const cost = new VerifyCostModel({ floorSec: 1e-3, kneeTokens: 0, slopeSec: 1e-3, online: false });
    new DepthPolicy({ cost }).allocateGoodput([{ k: 1, conf: [0.95] }], 1, out);
    expect(out[0]).toBe(1);
    new DepthPolicy({ cost, calibrator: cal }).allocateGoodput([{ k: 1, conf: [0.95] }], 1, out);
    expect(out[0]).toBe(0);
  });

  test("options are validated, naming the bad one", () => {
    for (const [o, name] of [
      [{ positions: 0 }, "positions"],
      [{ positions: 4, bins: 1 }, "bins"],
      [{ positions: 4, decay: 1.5 }, "decay"],
      [{ positions: 4, prior: -1 }, "prior"],
    ] as const) {
      expect(() => new ConfidenceCalibrator(o as never)).toThrow(name);
    }
  });
});
