/**
 * Target-side verification of drafts: the rule that makes speculative decoding lossless.
 *
 * Both rules walk the drafted prefix with the target: `seq.feed(t)` runs the target over token `t`
 * (recording its tap row) and returns the logits of the next position. The anchor (the last
 * accepted token, whose row is not yet known, CONTRACT 2) is fed first; a draft is fed only once it
 * is accepted, so a round that accepts `m` drafts costs exactly `m + 1` target steps and needs no
 * rollback. Every round emits the accepted drafts plus one more token (the target's own: a bonus
 * when every draft was accepted, a correction otherwise); the last emitted token is the new anchor.
 *
 * The per-position arithmetic (softmax, the CONTRACT 8 acceptance test and the residual draw) is
 * `@tapwire/reference-model`'s, so the engine and the model package share one implementation.
 */
import { argmax as argmaxAt, rejectionSample, sampleIndex, softmax } from "@tapwire/reference-model";
import { DYADIC_ONE, TOP_K_MAX } from "@tapwire/wire";
import type { Rng } from "./prng.js";

export { DYADIC_ONE };

/** The target as verification sees it. */
export interface VerifySeq {
  /** Runs the target over `token` and returns the logits of the next position (a view valid until the next call). */
  feed(token: number): Float32Array;
}

/** Support entries per draft position in a sampled reply (CONTRACT 7.4 / 8). */
export const TOP_K_STRIDE = TOP_K_MAX;

/** Index of the largest logit (lowest index on ties, as every rank must agree). */
export function argmax(logits: ArrayLike<number>, n: number = logits.length): number {
  return argmaxAt(logits, 0, n);
}

/** Writes softmax(logits / temperature) into `out` (float64) and returns it. */
export function softmaxInto(logits: ArrayLike<number>, temperature: number, out: Float64Array): Float64Array {
  return softmax(
    logits.length === out.length ? logits : Array.prototype.slice.call(logits, 0, out.length),
    temperature,
    out,
  );
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
  support: Int32Array | null;
  /** proposal_q in units of 2^-24, same layout as `support`. */
  q: Uint32Array | null;
}

/** Scratch buffers for sampled verification, sized to the vocabulary once. */
export class SampleScratch {
  readonly p: Float64Array;
  readonly r: Float64Array;
  /** A one-entry proposal: the point mass of a position that was not sampled. */
  readonly pointId = new Int32Array(1);
  readonly pointQ = Uint32Array.of(DYADIC_ONE);
  constructor(vocab: number) {
    this.p = new Float64Array(vocab);
    this.r = new Float64Array(vocab);
  }
}

/**
 * Sampled verification by rejection sampling (CONTRACT 8): draft `x` at position j, proposed with
 * probability q(x), is accepted with probability `min(1, p(x) / q(x))` where p is the target's
 * softmax at `temperature`; on the first rejection a token is drawn from `norm(max(0, p - q))` and
 * the round ends; when every verified draft is accepted a bonus token is drawn from p. The emitted
 * tokens are then distributed exactly as target-only sampling (the classic speculative sampling
 * theorem), whatever q is. A position that was not sampled (mask 0) is a proposal with all its mass
 * on `x`. Pushes emitted tokens to `out`; returns the number of drafts accepted.
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
    let support: Int32Array;
    let q: Uint32Array;
    let base = 0;
    let topK = 0;
    if (drafts.mask && drafts.support && drafts.q && (drafts.mask[pos] as number) !== 0) {
      support = drafts.support;
      q = drafts.q;
      base = pos * TOP_K_STRIDE;
      while (topK < TOP_K_STRIDE && (q[base + topK] as number) !== 0) topK++;
    } else {
      scratch.pointId[0] = x;
      support = scratch.pointId;
      q = scratch.pointQ;
      topK = 1;
    }
    const r = rejectionSample(p, x, support, q, topK, rng, base, scratch.r);
    out.push(r.token);
    if (!r.accepted) return accepted;
    accepted++;
    logits = seq.feed(x);
  }
  const p = softmaxInto(logits, temperature, scratch.p);
  out.push(sampleIndex(p, rng));
  return accepted;
}

/** One target-only sampling step: draws the next token from softmax(logits / temperature). */
export function sampleTarget(
  logits: ArrayLike<number>,
  temperature: number,
  rng: Rng,
  scratch: SampleScratch,
): number {
  return sampleIndex(softmaxInto(logits, temperature, scratch.p), rng);
}
