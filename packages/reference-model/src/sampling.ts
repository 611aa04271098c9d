/**
 * Sampling helpers shared by the target (rejection sampling in the harness) and the draft head
 * (CONTRACT 8: TOP32 proposals with dyadic q).
 */
import { badArgument } from "./errors.js";
import type { Xoshiro128 } from "./prng.js";

/** `2^24`: the proposal q of CONTRACT 8 is expressed in units of `2^-24`. */
export const DYADIC_ONE = 16777216;
/** Largest `top_k` of a TOP32 session (CONTRACT 8), also the per-position stride of support/q. */
export const TOP_K_MAX = 32;

/** Index of the largest value; the lowest index wins ties. NaN values are never chosen unless all are NaN (then 0). */
export function argmax(values: ArrayLike<number>, offset = 0, length = values.length - offset): number {
  let best = 0;
  let bestV = Number.NEGATIVE_INFINITY;
  for (let i = 0; i < length; i++) {
    const v = values[offset + i]!;
    if (v > bestV) {
      bestV = v;
      best = i;
    }
  }
  return best;
}

/**
 * Softmax of `logits / temperature` into `out` (allocated when absent), computed in float64 with
 * the maximum subtracted. `temperature` must be finite and > 0. Returns `out`.
 */
export function softmax(logits: ArrayLike<number>, temperature = 1, out?: Float64Array): Float64Array {
  if (!(temperature > 0) || !Number.isFinite(temperature)) {
    throw badArgument(`softmax: temperature must be finite and > 0, got ${temperature}`);
  }
  const n = logits.length;
  const dst = out ?? new Float64Array(n);
  if (dst.length < n) throw badArgument(`softmax: out has ${dst.length} slots for ${n} logits`);
  let max = Number.NEGATIVE_INFINITY;
  for (let i = 0; i < n; i++) if (logits[i]! > max) max = logits[i]!;
  const inv = 1 / temperature;
  let sum = 0;
  for (let i = 0; i < n; i++) {
    const e = Math.exp((logits[i]! - max) * inv);
    dst[i] = e;
    sum += e;
  }
  const s = 1 / sum;
  for (let i = 0; i < n; i++) dst[i] = dst[i]! * s;
  return dst;
}

/**
 * Selects the `k` largest values: writes their indices into `outIds[0..k)` in descending value
 * order (lowest index first among equal values) and returns how many were written
 * (`min(k, values.length)`). O(n·k) worst case, O(n) typically; no allocation.
 */
export function topK(values: ArrayLike<number>, k: number, outIds: Int32Array, outIdsOffset = 0): number {
  const n = values.length;
  const m = Math.min(k, n);
  if (m <= 0) return 0;
  if (outIds.length < outIdsOffset + m) throw badArgument(`topK: outIds too small for ${m} ids`);
  let count = 0;
  for (let i = 0; i < n; i++) {
    const v = values[i]!;
    if (count === m && !(v > values[outIds[outIdsOffset + m - 1]!]!)) continue;
    let j = count < m ? count++ : m - 1;
    while (j > 0 && v > values[outIds[outIdsOffset + j - 1]!]!) {
      outIds[outIdsOffset + j] = outIds[outIdsOffset + j - 1]!;
      j--;
    }
    outIds[outIdsOffset + j] = i;
  }
  return m;
}

/**
 * The sampling distribution of a target: softmax at `temperature`, restricted to the `topK`
 * most likely tokens (0 = no restriction) and renormalised, written into `out` (length >= vocab).
 * `scratchIds` (length >= topK) avoids allocation when given. Returns `out`.
 */
export function targetDistribution(
  logits: ArrayLike<number>,
  opts: { temperature: number; topK?: number },
  out: Float64Array,
  scratchIds?: Int32Array,
): Float64Array {
  softmax(logits, opts.temperature, out);
  const k = opts.topK ?? 0;
  const n = logits.length;
  if (k > 0 && k < n) {
    const ids = scratchIds && scratchIds.length >= k ? scratchIds : new Int32Array(k);
    topK(out.subarray(0, n), k, ids);
    let sum = 0;
    for (let j = 0; j < k; j++) sum += out[ids[j]!]!;
    // Mark kept entries by negating them, zero the rest, then restore and renormalise.
    for (let j = 0; j < k; j++) out[ids[j]!] = -out[ids[j]!]!;
    const inv = 1 / sum;
    for (let i = 0; i < n; i++) out[i] = out[i]! < 0 ? -out[i]! * inv : 0;
  }
  return out;
}

/** Draws an index from the probabilities `probs[0..n)` (need not sum to 1 exactly). */
export function sampleIndex(probs: ArrayLike<number>, rng: Xoshiro128, n = probs.length): number {
  let total = 0;
  for (let i = 0; i < n; i++) total += probs[i]!;
  const u = rng.nextFloat() * total;
  let acc = 0;
  let last = 0;
  for (let i = 0; i < n; i++) {
    const p = probs[i]!;
    if (p <= 0) continue;
    acc += p;
    last = i;
    if (u < acc) return i;
  }
  return last;
}

/**
 * Quantises the first `topK` entries of `probs` (non-negative, not all zero; renormalised here)
 * to a dyadic distribution: `topK` integers, each >= 1, summing to exactly `2^24`, written to
 * `out[offset..offset+topK)` (CONTRACT 8). Rounding is largest-remainder: every value starts at
 * `max(1, floor(p * 2^24))`, then units go to the largest remainders (ties: lower index) until
 * the sum is `2^24`, or are taken from the smallest remainders among values above 1 when the
 * minimum of 1 overshot. Deterministic and exact.
 */
export function dyadicQuantize(
  probs: Float64Array | Float32Array | readonly number[],
  topK: number,
  out: Uint32Array,
  offset = 0,
): void {
  if (!Number.isInteger(topK) || topK < 1 || topK > probs.length || topK > 4096) {
    throw badArgument(`dyadicQuantize: topK ${topK} outside [1, ${Math.min(probs.length, 4096)}]`);
  }
  if (!Number.isInteger(offset) || offset < 0 || offset + topK > out.length) {
    throw badArgument(`dyadicQuantize: ${topK} values at offset ${offset} do not fit in ${out.length}`);
  }
  let sum = 0;
  for (let i = 0; i < topK; i++) {
    const p = probs[i]!;
    if (!(p >= 0) || !Number.isFinite(p))
      throw badArgument(`dyadicQuantize: probs[${i}] = ${p} is not finite >= 0`);
    sum += p;
  }
  if (!(sum > 0) || !Number.isFinite(sum)) throw badArgument(`dyadicQuantize: probabilities sum to ${sum}`);
  let total = 0;
  for (let i = 0; i < topK; i++) {
    const x = (probs[i]! / sum) * DYADIC_ONE;
    const q = Math.max(1, Math.floor(x));
    out[offset + i] = q;
    total += q;
  }
  // Remainder of entry i is x_i - q_i (may be negative for bumped entries); compared on the fly
  // so that no scratch array is needed (topK is at most a few dozen in practice).
  while (total !== DYADIC_ONE) {
    const up = total < DYADIC_ONE;
    let best = -1;
    let bestR = up ? Number.NEGATIVE_INFINITY : Number.POSITIVE_INFINITY;
    for (let i = 0; i < topK; i++) {
      const q = out[offset + i]!;
      const r = (probs[i]! / sum) * DYADIC_ONE - q;
      if (up ? r > bestR : q > 1 && r < bestR) {
        bestR = r;
        best = i;
      }
    }
    if (best < 0) throw badArgument(`dyadicQuantize: cannot reach 2^24 with ${topK} values`);
    out[offset + best] = out[offset + best]! + (up ? 1 : -1);
    total += up ? 1 : -1;
  }
}

/** Draws an index in `[0, k)` from dyadic `q[offset..offset+k)` (sum 2^24) using 24 bits of `rng`. */
export function sampleDyadic(q: Uint32Array, k: number, rng: Xoshiro128, offset = 0): number {
  const u = rng.nextU32() >>> 8;
  let acc = 0;
  for (let i = 0; i < k; i++) {
    acc += q[offset + i]!;
    if (u < acc) return i;
  }
  return k - 1;
}

/** Result of {@link rejectionSample}. */
export interface RejectionResult {
  /** True when the drafted token was accepted. */
  accepted: boolean;
  /** The emitted token: the draft when accepted, else a draw from `norm(max(0, p - q))`. */
  token: number;
}

/**
 * One step of speculative rejection sampling (CONTRACT 8): accept `draftId` with probability
 * `min(1, p(x) / q(x))` where `q(x) = q_int(x) / 2^24` on the support (0 elsewhere), else draw
 * from the residual `norm(max(0, p - q))` (falling back to `p` when the residual is empty).
 * `p` is the target's distribution over the whole vocabulary ({@link targetDistribution});
 * `scratch` (length >= vocab) avoids allocation.
 */
export function rejectionSample(
  p: Float64Array,
  draftId: number,
  supportIds: Int32Array,
  proposalQ: Uint32Array,
  k: number,
  rng: Xoshiro128,
  offset = 0,
  scratch?: Float64Array,
): RejectionResult {
  let qx = 0;
  // Slots past top_k are zero padding (support id 0, q 0, CONTRACT 8): only a slot with q > 0
  // is part of the support, or a padded k would erase q(x) for token 0.
  for (let i = 0; i < k; i++) {
    const q = proposalQ[offset + i]!;
    if (q > 0 && supportIds[offset + i] === draftId) {
      qx = q / DYADIC_ONE;
      break;
    }
  }
  const px = p[draftId] ?? 0;
  const u = rng.nextFloat();
  if (qx > 0 && u * qx < px) return { accepted: true, token: draftId };
  const n = p.length;
  const r = scratch && scratch.length >= n ? scratch : new Float64Array(n);
  r.set(p);
  for (let i = 0; i < k; i++) {
    const id = supportIds[offset + i]!;
    const v = r[id]! - proposalQ[offset + i]! / DYADIC_ONE;
    r[id] = Math.max(v, 0);
  }
  let total = 0;
  for (let i = 0; i < n; i++) total += r[i]!;
  const token = total > 0 ? sampleIndex(r, rng, n) : sampleIndex(p, rng, n);
  return { accepted: false, token };
}

const POW2 = new Float64Array(1100);
for (let i = 0; i < POW2.length; i++) POW2[i] = 2 ** -i;
const LOG2E = Math.LOG2E;
const LN2 = Math.LN2;
const C2 = LN2 ** 2 / 2;
const C3 = LN2 ** 3 / 6;
const C4 = LN2 ** 4 / 24;
const C5 = LN2 ** 5 / 120;
const C6 = LN2 ** 6 / 720;

/**
 * `exp(x)` for `x <= 0` with relative error below 2e-7, from + and * only (deterministic on
 * every machine and several times faster than `Math.exp` in V8). Returns 0 below -745. The draft
 * head's probabilities use it, so a drafter that must give the same q (CONTRACT 8) uses it too.
 */
export function expNonPositive(x: number): number {
  const y = x * LOG2E;
  if (!(y > -1074)) return 0;
  const n = Math.round(y);
  const f = y - n;
  const p = 1 + f * (LN2 + f * (C2 + f * (C3 + f * (C4 + f * (C5 + f * C6)))));
  return p * POW2[-n]!;
}
