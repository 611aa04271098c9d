/**
 * Deterministic pseudo-random numbers for the harness: workloads, per-request sampling streams and
 * fault schedules all derive from `--seed`, so a run is reproducible bit for bit on every machine.
 *
 * The generator is sfc32 (Small Fast Counter, 128-bit state, period >= 2^32) seeded through
 * splitmix32 so that nearby seeds and stream ids give unrelated streams.
 */

/** splitmix32 finaliser: a bijective 32-bit mixer. */
export function mix32(x: number): number {
  x = (x + 0x9e3779b9) | 0;
  x = Math.imul(x ^ (x >>> 16), 0x21f0aaad);
  x = Math.imul(x ^ (x >>> 15), 0x735a2d97);
  return (x ^ (x >>> 15)) >>> 0;
}

/** Derives a 32-bit seed from a base seed and any number of integer stream ids. */
export function deriveSeed(base: number, ...ids: readonly number[]): number {
  let h = mix32(base >>> 0);
  for (const id of ids) h = mix32((h ^ mix32(id >>> 0)) >>> 0);
  return h;
}

/** A seeded sfc32 generator. */
export class Rng {
  private a: number;
  private b: number;
  private c: number;
  private d: number;

  /** @param seed any 32-bit integer; equal seeds give equal streams. */
  constructor(seed: number) {
    this.a = mix32(seed);
    this.b = mix32(this.a ^ 0x6a09e667);
    this.c = mix32(this.b ^ 0xbb67ae85);
    this.d = 1;
    for (let i = 0; i < 12; i++) this.u32();
  }

  /** Uniform unsigned 32-bit integer. */
  u32(): number {
    const t = (((this.a + this.b) | 0) + this.d) | 0;
    this.d = (this.d + 1) | 0;
    this.a = this.b ^ (this.b >>> 9);
    this.b = (this.c + (this.c << 3)) | 0;
    this.c = (this.c << 21) | (this.c >>> 11);
    this.c = (this.c + t) | 0;
    return t >>> 0;
  }

  /** Uniform double in [0, 1) with 53 random bits. */
  float(): number {
    const hi = this.u32() >>> 5; // 27 bits
    const lo = this.u32() >>> 6; // 26 bits
    return (hi * 67108864 + lo) / 9007199254740992;
  }

  /** Uniform integer in [lo, hi] (inclusive). */
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.float() * (hi - lo + 1));
  }

  /** Exponentially distributed value with the given rate (mean 1/rate). */
  exponential(rate: number): number {
    return -Math.log(1 - this.float()) / rate;
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
    let u = this.float() * sum;
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
