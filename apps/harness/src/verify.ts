/**
 * Target-side verification of drafts: the rule that makes speculative decoding lossless.
 *
 * Both rules walk the drafted prefix with the target: `seq.feed(t)` runs the target over token `t`
 * (recording its tap row) and returns the logits of the next position. The anchor (the last
 * accepted token, whose row is not yet known, CONTRACT 2) is fed first; a draft is fed only once it
 * is accepted, so a round that accepts `m` drafts costs exactly `m + 1` target steps and needs no
 * rollback. Every round emits the accepted drafts plus one more token (the target's own: a bonus
 * when every draft was accepted, a correction otherwise); the last emitted token is the new anchor.
 */
import type { Rng } from "./prng.js";

/** The target as verification sees it. */
export interface VerifySeq {
  /** Runs the target over `token` and returns the logits of the next position (a view valid until the next call). */
  feed(token: number): Float32Array;
}

/** Unit of the dyadic proposal q (CONTRACT 8: integers summing to 2^24). */
export const DYADIC_ONE = 2 ** 24;
/** Support entries per draft position in a sampled reply (CONTRACT 7.4 / 8). */
export const TOP_K_STRIDE = 32;

/** Index of the largest logit (lowest index on ties, as every rank must agree). */
export function argmax(logits: ArrayLike<number>, n: number = logits.length): number {
  let best = 0;
  let bv = logits[0] as number;
  for (let i = 1; i < n; i++) {
    const v = logits[i] as number;
    if (v > bv) {
      bv = v;
      best = i;
    }
  }
  return best;
}

/** Writes softmax(logits / temperature) into `out` (float64) and returns it. */
export function softmaxInto(logits: ArrayLike<number>, temperature: number, out: Float64Array): Float64Array {
  const n = out.length;
  let max = Number.NEGATIVE_INFINITY;
  for (let i = 0; i < n; i++) {
    const v = logits[i] as number;
    if (v > max) max = v;
  }
  let z = 0;
  const inv = 1 / temperature;
  for (let i = 0; i < n; i++) {
    const e = Math.exp(((logits[i] as number) - max) * inv);
    out[i] = e;
    z += e;
  }
  const iz = 1 / z;
  for (let i = 0; i < n; i++) out[i] = (out[i] as number) * iz;
  return out;
}

/**
 * Greedy verification: accepts the longest drafted prefix that equals the target's argmax at each
 * position, then emits the target's argmax after it. Pushes the emitted tokens (accepted drafts +
 * one) to `out` and returns the number of drafts accepted.
 *
 * @param drafts draft ids; position j of this request at `drafts[offset + j]`
 * @param k drafts to verify (the depth policy's choice; callers cap it at remaining tokens - 1)
 */
export function verifyGreedy(
  seq: VerifySeq,
  anchor: number,
  drafts: ArrayLike<number>,
  offset: number,
  k: number,
  out: number[],
): number {
  let logits = seq.feed(anchor);
  let accepted = 0;
  for (let j = 0; j < k; j++) {
    const want = argmax(logits);
    const d = drafts[offset + j] as number;
    if (d !== want) break;
    out.push(d);
    accepted++;
    logits = seq.feed(d);
  }
  out.push(argmax(logits));
  return accepted;
}

/** The drafts of one request in a sampled reply (views into the reply, CONTRACT 7.4). */
export interface SampledDrafts {
  /** Draft ids; position j at `ids[offset + j]`. */
  ids: ArrayLike<number>;
  offset: number;
  /** sampled_mask; position j at `mask[offset + j]` (null: no position is sampled). */
  mask: ArrayLike<number> | null;
  /** support_ids; position j's support at `support[(offset + j) * 32 + i]`. */
  support: ArrayLike<number> | null;
  /** proposal_q in units of 2^-24, same layout as `support`. */
  q: ArrayLike<number> | null;
}

/** Scratch buffers for sampled verification, sized to the vocabulary once. */
export class SampleScratch {
  readonly p: Float64Array;
  readonly r: Float64Array;
  constructor(vocab: number) {
    this.p = new Float64Array(vocab);
    this.r = new Float64Array(vocab);
  }
}

/** q(x) of draft position `pos` as a probability, or -1 when `x` is not in the support. */
function proposalProb(d: SampledDrafts, pos: number, x: number): number {
  if (!d.mask || !d.support || !d.q || (d.mask[pos] as number) === 0) return -1;
  const base = pos * TOP_K_STRIDE;
  for (let i = 0; i < TOP_K_STRIDE; i++) {
    const qi = d.q[base + i] as number;
    if (qi === 0) break;
    if ((d.support[base + i] as number) === x) return qi / DYADIC_ONE;
  }
  return -1;
}

/**
 * Samples from `norm(max(0, p - q))`, q being the dyadic proposal of position `pos` (or a point mass
 * at `x` when the position was not sampled). Falls back to p when the residual is empty.
 */
function sampleResidual(d: SampledDrafts, pos: number, x: number, s: SampleScratch, rng: Rng): number {
  const { p, r } = s;
  r.set(p);
  if (d.mask && d.support && d.q && (d.mask[pos] as number) !== 0) {
    const base = pos * TOP_K_STRIDE;
    for (let i = 0; i < TOP_K_STRIDE; i++) {
      const qi = d.q[base + i] as number;
      if (qi === 0) break;
      const id = d.support[base + i] as number;
      r[id] = Math.max(0, (r[id] as number) - qi / DYADIC_ONE);
    }
  } else {
    r[x] = Math.max(0, (r[x] as number) - 1);
  }
  let total = 0;
  for (let i = 0; i < r.length; i++) total += r[i] as number;
  if (!(total > 0)) return rng.categorical(p, p.length, 1);
  return rng.categorical(r, r.length, total);
}

/**
 * Sampled verification by rejection sampling (CONTRACT 8): draft `x` at position j, proposed with
 * probability q(x), is accepted with probability `min(1, p(x) / q(x))` where p is the target's
 * softmax at `temperature`; on the first rejection a token is drawn from `norm(max(0, p - q))` and
 * the round ends; when every verified draft is accepted a bonus token is drawn from p. The emitted
 * tokens are then distributed exactly as target-only sampling (the classic speculative sampling
 * theorem), whatever q is. Pushes emitted tokens to `out`; returns the number of drafts accepted.
 *
 * Uses exactly one `rng.float()` per verified draft plus one draw for the last token.
 */
export function verifySampled(
  seq: VerifySeq,
  anchor: number,
  drafts: SampledDrafts,
  k: number,
  temperature: number,
  rng: Rng,
  scratch: SampleScratch,
  out: number[],
): number {
  let logits = seq.feed(anchor);
  let accepted = 0;
  for (let j = 0; j < k; j++) {
    const pos = drafts.offset + j;
    const x = drafts.ids[pos] as number;
    const p = softmaxInto(logits, temperature, scratch.p);
    let q = proposalProb(drafts, pos, x);
    if (q < 0) q = 1; // not sampled (or not in the support): the proposal was a point mass at x
    const px = p[x] as number;
    const u = rng.float();
    if (u * q < px) {
      out.push(x);
      accepted++;
      logits = seq.feed(x);
      continue;
    }
    out.push(sampleResidual(drafts, pos, x, scratch, rng));
    return accepted;
  }
  const p = softmaxInto(logits, temperature, scratch.p);
  out.push(rng.categorical(p, p.length, 1));
  return accepted;
}

/** One target-only sampling step: draws the next token from softmax(logits / temperature). */
export function sampleTarget(
  logits: ArrayLike<number>,
  temperature: number,
  rng: Rng,
  scratch: SampleScratch,
): number {
  const p = softmaxInto(logits, temperature, scratch.p);
  return rng.categorical(p, p.length, 1);
}
