/**
 * Deterministic pseudo-random numbers for the harness: workloads, per-request sampling streams and
 * fault schedules all derive from `--seed`, so a run is reproducible on every machine. The
 * generator is `@tapwire/reference-model`'s xoshiro128** (the one its sampling functions take);
 * this adds the draws the harness needs.
 */
import { mix32, mixSeed, Xoshiro128 } from "@tapwire/reference-model";

export { mix32 };

/** Derives a 32-bit seed from a base seed and any number of integer stream ids. */
export function deriveSeed(base: number, ...ids: readonly number[]): number {
  return mixSeed(base >>> 0, ...ids.map((x) => x >>> 0));
}

/** A seeded xoshiro128** stream with the harness's draws. */
export class Rng extends Xoshiro128 {
  /** Uniform unsigned 32-bit integer. */
  u32(): number {
    return this.nextU32();
  }

  /** Uniform double in [0, 1) with 53 random bits. */
  float(): number {
    return this.nextFloat();
  }

  /** Uniform integer in [lo, hi] (inclusive). */
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.nextFloat() * (hi - lo + 1));
  }

  /** Exponentially distributed value with the given rate (mean 1/rate). */
  exponential(rate: number): number {
    return -Math.log(1 - this.nextFloat()) / rate;
  }

  /**
   * Draws an index from unnormalised non-negative weights `w[0..n)` whose sum is `total`
   * (computed when not given). Returns the last index with a positive weight on rounding.
   */
  categorical(w: ArrayLike<number>, n: number = w.length, total?: number): number {
    let sum = total;
    if (sum === undefined) {
      sum = 0;
      for (let i = 0; i < n; i++) sum += w[i] as number;
    }
    let u = this.nextFloat() * sum;
    let last = -1;
    for (let i = 0; i < n; i++) {
      const wi = w[i] as number;
      if (wi <= 0) continue;
      last = i;
      u -= wi;
      if (u < 0) return i;
    }
    if (last < 0) throw new RangeError("categorical: every weight is zero");
    return last;
  }
}
