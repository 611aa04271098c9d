import fc from "fast-check";
import { describe, expect, test } from "vitest";
import { deriveSeed, Rng } from "../src/engine/prng.js";
import { chiSquareGoodnessOfFit } from "../src/engine/stattest.js";
import {
  argmax,
  DYADIC_ONE,
  type SampledDrafts,
  SampleScratch,
  sampleTarget,
  softmaxInto,
  TOP_K_STRIDE,
  type VerifySeq,
  verifyGreedy,
  verifySampled,
} from "../src/engine/verify.js";

/** A Markov "target": the logits of the next token depend on the last fed token only. */
class MarkovTarget implements VerifySeq {
  forwards = 0;
  constructor(readonly table: Float32Array[]) {}
  feed(token: number): Float32Array {
    this.forwards++;
    return this.table[token]!;
  }
}

function randomTable(vocab: number, seed: number, scale = 2): Float32Array[] {
  const rng = new Rng(seed);
  return Array.from({ length: vocab }, () =>
    Float32Array.from({ length: vocab }, () => (rng.float() - 0.5) * 2 * scale),
  );
}

function greedyChain(t: MarkovTarget, anchor: number, n: number): number[] {
  const out: number[] = [];
  let cur = anchor;
  for (let i = 0; i < n; i++) {
    cur = argmax(t.table[cur]!);
    out.push(cur);
  }
  return out;
}

describe("greedy verification", () => {
  test("accepts the whole matching prefix plus the bonus token, with accepted + 1 target steps", () => {
    const t = new MarkovTarget(randomTable(16, 1));
    const chain = greedyChain(t, 3, 5);
    const out: number[] = [];
    const acc = verifyGreedy(t, 3, Int32Array.from(chain.slice(0, 4)), 0, 4, out);
    expect(acc).toBe(4);
    expect(out).toEqual(chain); // 4 drafts + bonus
    expect(t.forwards).toBe(5);
  });

  test("stops at the first mismatch and emits the target's token there", () => {
    const t = new MarkovTarget(randomTable(16, 2));
    const chain = greedyChain(t, 7, 4);
    const drafts = Int32Array.from(chain);
    drafts[2] = (chain[2]! + 1) % 16; // wrong at position 2
    const out: number[] = [];
    expect(verifyGreedy(t, 7, drafts, 0, 4, out)).toBe(2);
    expect(out).toEqual(chain.slice(0, 3));
    expect(t.forwards).toBe(3);
  });

  test("k = 0 emits the target's next token only; offset selects the request's drafts", () => {
    const t = new MarkovTarget(randomTable(8, 3));
    const chain = greedyChain(t, 1, 3);
    const out: number[] = [];
    expect(verifyGreedy(t, 1, Int32Array.from([9, 9, 9]), 0, 0, out)).toBe(0);
    expect(out).toEqual(chain.slice(0, 1));
    const out2: number[] = [];
    expect(verifyGreedy(t, 1, Int32Array.from([0, 0, chain[0]!, chain[1]!]), 2, 2, out2)).toBe(2);
    expect(out2).toEqual(chain);
  });

  test("property: any drafts give exactly the target-only greedy continuation (lossless)", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 1000 }),
        fc.array(fc.array(fc.integer({ min: 0, max: 11 }), { maxLength: 6 }), {
          minLength: 1,
          maxLength: 12,
        }),
        fc.integer({ min: 0, max: 11 }),
        (seed, rounds, anchor0) => {
          const t = new MarkovTarget(randomTable(12, seed, 0.5));
          const out: number[] = [];
          let anchor = anchor0;
          for (const d of rounds) {
            // a random mix of correct and random drafts
            const chain = greedyChain(t, anchor, d.length);
            const drafts = Int32Array.from(d.map((x, i) => (x % 2 === 0 ? chain[i]! : x)));
            verifyGreedy(t, anchor, drafts, 0, drafts.length, out);
            anchor = out[out.length - 1]!;
          }
          expect(out).toEqual(greedyChain(t, anchor0, out.length));
        },
      ),
      { numRuns: 200 },
    );
  });
});

/** A dyadic proposal (CONTRACT 8) over `support`, built from weights by largest remainder. */
function dyadic(weights: number[]): Uint32Array {
  const total = weights.reduce((a, b) => a + b, 0);
  const raw = weights.map((w) => (w / total) * (DYADIC_ONE - weights.length));
  const q = Uint32Array.from(raw.map((r) => Math.floor(r) + 1));
  let rest = DYADIC_ONE - q.reduce((a, b) => a + b, 0);
  const order = raw.map((r, i) => [r - Math.floor(r), i] as const).sort((a, b) => b[0] - a[0]);
  for (let i = 0; rest > 0; i = (i + 1) % order.length, rest--) q[order[i]![1]]!++;
  return q;
}

/**
 * Runs speculative sampling rounds until `n` tokens are out: the drafter proposes from a fixed
 * dyadic q over `support` (independent of the target), the target verifies by rejection sampling.
 */
function speculate(
  t: MarkovTarget,
  anchor: number,
  n: number,
  k: number,
  support: number[],
  qInt: Uint32Array,
  rng: Rng,
  draftRng: Rng,
  temp: number,
): number[] {
  const scratch = new SampleScratch(t.table.length);
  const out: number[] = [];
  const ids = new Int32Array(k);
  const mask = new Uint8Array(k).fill(1);
  const sup = new Int32Array(k * TOP_K_STRIDE);
  const q = new Uint32Array(k * TOP_K_STRIDE);
  const qw = Array.from(qInt, (v) => v);
  while (out.length < n) {
    for (let j = 0; j < k; j++) {
      for (let i = 0; i < support.length; i++) {
        sup[j * TOP_K_STRIDE + i] = support[i]!;
        q[j * TOP_K_STRIDE + i] = qInt[i]!;
      }
      ids[j] = support[draftRng.categorical(qw)]!;
    }
    const d: SampledDrafts = { ids, offset: 0, mask, support: sup, q };
    verifySampled(t, anchor, d, Math.min(k, n - out.length - 1), temp, rng, scratch, out);
    anchor = out[out.length - 1]!;
  }
  return out.slice(0, n);
}

describe("sampled verification (rejection sampling, CONTRACT 8)", () => {
  const V = 6;
  const temp = 0.8;
  const table = randomTable(V, 99, 1.5);
  // q puts most mass where p has little: a bad drafter, so rejections are frequent
  const support = [5, 4, 0, 2];
  const qInt = dyadic([8, 4, 2, 1]);

  /** Exact joint distribution of the first two target-only tokens after `anchor`. */
  function targetJoint(anchor: number): Float64Array {
    const p1 = softmaxInto(table[anchor]!, temp, new Float64Array(V));
    const joint = new Float64Array(V * V);
    for (let a = 0; a < V; a++) {
      const p2 = softmaxInto(table[a]!, temp, new Float64Array(V));
      for (let b = 0; b < V; b++) joint[a * V + b] = p1[a]! * p2[b]!;
    }
    return joint;
  }

  test("the emitted tokens are distributed as the target's (chi-square on the first two tokens)", () => {
    const trials = 12000;
    const counts = new Float64Array(V * V);
    const rng = new Rng(deriveSeed(7, 1));
    const draftRng = new Rng(deriveSeed(7, 2));
    for (let i = 0; i < trials; i++) {
      const t = new MarkovTarget(table);
      const [a, b] = speculate(t, 1, 2, 3, support, qInt, rng, draftRng, temp);
      counts[a! * V + b!]!++;
    }
    const r = chiSquareGoodnessOfFit(counts, targetJoint(1));
    expect(r.df).toBeGreaterThan(10);
    // alpha = 1e-3 with a fixed seed: deterministic
    expect(r.pValue).toBeGreaterThan(1e-3);
  });

  test("the same test rejects the drafter's own distribution (the test has power)", () => {
    const trials = 12000;
    const counts = new Float64Array(V * V);
    const draftRng = new Rng(deriveSeed(7, 3));
    const qw = Array.from(qInt, (v) => v);
    for (let i = 0; i < trials; i++) {
      const a = support[draftRng.categorical(qw)]!;
      const b = support[draftRng.categorical(qw)]!;
      counts[a * V + b]!++;
    }
    expect(chiSquareGoodnessOfFit(counts, targetJoint(1)).pValue).toBeLessThan(1e-9);
  });

  test("a draft with q(x) <= p(x) is always accepted; a draft with p(x) = 0 never is", () => {
    // p is (nearly) one-hot at token 2: logits 0 except a huge one
    const logits = new Float32Array(V);
    logits[2] = 80;
    const t = new MarkovTarget(Array.from({ length: V }, () => logits));
    const rng = new Rng(5);
    const scratch = new SampleScratch(V);
    const q = new Uint32Array(TOP_K_STRIDE);
    const sup = new Int32Array(TOP_K_STRIDE);
    q[0] = DYADIC_ONE / 2;
    q[1] = DYADIC_ONE / 2;
    sup[0] = 2;
    sup[1] = 3;
    for (let i = 0; i < 200; i++) {
      const out: number[] = [];
      expect(
        verifySampled(t, 0, { ids: [2], offset: 0, mask: [1], support: sup, q }, 1, 1, rng, scratch, out),
      ).toBe(1);
      const out2: number[] = [];
      expect(
        verifySampled(t, 0, { ids: [3], offset: 0, mask: [1], support: sup, q }, 1, 1, rng, scratch, out2),
      ).toBe(0);
      expect(out2).toEqual([2]); // resampled from max(0, p - q), all of whose mass is on 2
    }
  });

  test("target-only sampling matches softmax(logits / T)", () => {
    const rng = new Rng(11);
    const scratch = new SampleScratch(V);
    const counts = new Float64Array(V);
    for (let i = 0; i < 20000; i++) counts[sampleTarget(table[3]!, temp, rng, scratch)]!++;
    expect(
      chiSquareGoodnessOfFit(counts, softmaxInto(table[3]!, temp, new Float64Array(V))).pValue,
    ).toBeGreaterThan(1e-3);
  });

  test("the verifier is deterministic for a given PRNG seed", () => {
    const run = () => {
      const t = new MarkovTarget(table);
      return speculate(t, 0, 20, 4, support, qInt, new Rng(1), new Rng(2), temp);
    };
    expect(run()).toEqual(run());
  });
});
