/**
 * Deterministic pseudo-random numbers: splitmix32 for seeding and hashing, xoshiro128** for
 * streams. Everything is 32-bit integer arithmetic (`Math.imul`), so streams are identical on
 * every machine. No `Math.random` anywhere in this package.
 */

/** Mixes a 32-bit value (the splitmix32 / murmur3 finaliser). Returns an unsigned 32-bit integer. */
export function mix32(x: number): number {
  x = (x + 0x9e3779b9) | 0;
  x = Math.imul(x ^ (x >>> 16), 0x21f0aaad);
  x = Math.imul(x ^ (x >>> 15), 0x735a2d97);
  return (x ^ (x >>> 15)) >>> 0;
}

/**
 * Derives a seed from a list of 32-bit values (e.g. entry seed, anchor position, draft
 * position). Order matters; the result is an unsigned 32-bit integer.
 */
export function mixSeed(...parts: readonly number[]): number {
  let h = 0x6a09e667;
  for (const p of parts) h = mix32(h ^ mix32(p >>> 0));
  return h;
}

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k));
}

/**
 * xoshiro128** generator seeded through splitmix32. `nextU32()` is its raw output; the other
 * draws are built from it.
 */
export class Xoshiro128 {
  #a = 0;
  #b = 0;
  #c = 0;
  #d = 0;
  #spare = Number.NaN;

  /** @param seed any number; only its low 32 bits are used. */
  constructor(seed: number) {
    this.reseed(seed);
  }

  /** Restarts the stream from `seed` (no allocation, for hot paths). */
  reseed(seed: number): void {
    let s = seed >>> 0;
    s = (s + 0x9e3779b9) | 0;
    this.#a = mix32(s);
    s = (s + 0x9e3779b9) | 0;
    this.#b = mix32(s);
    s = (s + 0x9e3779b9) | 0;
    this.#c = mix32(s);
    s = (s + 0x9e3779b9) | 0;
    this.#d = mix32(s);
    if ((this.#a | this.#b | this.#c | this.#d) === 0) this.#a = 1;
    this.#spare = Number.NaN;
  }

  /** Next unsigned 32-bit integer. */
  nextU32(): number {
    const result = Math.imul(rotl(Math.imul(this.#b, 5), 7), 9) >>> 0;
    const t = this.#b << 9;
    this.#c ^= this.#a;
    this.#d ^= this.#b;
    this.#b ^= this.#c;
    this.#a ^= this.#d;
    this.#c ^= t;
    this.#d = rotl(this.#d, 11);
    return result;
  }

  /** Uniform double in [0, 1) with 53 random bits. */
  nextFloat(): number {
    const hi = this.nextU32() >>> 5;
    const lo = this.nextU32() >>> 6;
    return (hi * 67108864 + lo) / 9007199254740992;
  }

  /** Uniform integer in [0, n) for 1 <= n <= 2^32 (rejection sampling, unbiased). */
  nextInt(n: number): number {
    if (n <= 1) return 0;
    const limit = 4294967296 - (4294967296 % n);
    for (;;) {
      const x = this.nextU32();
      if (x < limit) return x % n;
    }
  }

  /** Standard normal draw (Box-Muller, the second value cached). */
  nextGaussian(): number {
    if (!Number.isNaN(this.#spare)) {
      const v = this.#spare;
      this.#spare = Number.NaN;
      return v;
    }
    let u = 0;
    while (u === 0) u = this.nextFloat();
    const v = this.nextFloat();
    const r = Math.sqrt(-2 * Math.log(u));
    this.#spare = r * Math.sin(2 * Math.PI * v);
    return r * Math.cos(2 * Math.PI * v);
  }
}
