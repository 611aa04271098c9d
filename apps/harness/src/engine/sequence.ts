/**
 * One request's target-side sequence: the reference target's state, the logits buffer, and the
 * tap rows of the tokens fed since the rows were last handed to the drafter link.
 */
import { createHash } from "node:crypto";
import type { TargetModel, TargetState } from "@tapwire/reference-model";
import { deriveSeed, Rng } from "./prng.js";
import { argmax, type SampleScratch, sampleTarget, type VerifySeq } from "./verify.js";
import { type RequestSpec, STREAM } from "./workload.js";

/**
 * The conditioning of a multimodal request: the SHA-256 of each embedding's bytes, in media order.
 * The target derives its initial state from these bytes (TargetModel.initialState `extra`), so a
 * single wrong byte in any transferred embedding changes the request's whole output.
 */
export function mediaConditioning(embeddings: readonly Uint8Array[]): Uint8Array | undefined {
  return conditioningOf(embeddings.map(embeddingDigest));
}

/** SHA-256 of an embedding's bytes. */
export function embeddingDigest(embedding: Uint8Array): Uint8Array {
  return new Uint8Array(createHash("sha256").update(embedding).digest());
}

/** The conditioning from per-item digests (their concatenation); undefined for text-only requests. */
export function conditioningOf(digests: readonly Uint8Array[]): Uint8Array | undefined {
  if (digests.length === 0) return undefined;
  const out = new Uint8Array(32 * digests.length);
  digests.forEach((d, i) => {
    out.set(d, 32 * i);
  });
  return out;
}

/** A request's target state plus a staging buffer for the rows it produces. */
export class TargetSequence implements VerifySeq {
  private state: TargetState;
  private readonly logits: Float32Array;
  /** Rows fed since the last {@link takeRows}, `rowBytes` each, oldest first. */
  readonly rowBuf: Uint8Array;
  private nRows = 0;
  private readonly rowBytes: number;
  /** Target forward steps taken (prefill included). */
  steps = 0;

  /**
   * @param capacityRows rows the staging buffer holds: at least the prompt length and N + 1
   *   (0: rows are not computed at all, for target-only decoding)
   */
  constructor(
    private readonly target: TargetModel,
    extra: Uint8Array | undefined,
    capacityRows: number,
  ) {
    this.state = target.initialState([], extra);
    this.logits = new Float32Array(target.config.vocabSize);
    this.rowBytes = target.rowBytes;
    this.rowBuf = new Uint8Array(capacityRows * this.rowBytes);
  }

  /** Tokens consumed (the position of the next token fed). */
  get position(): number {
    return this.state.position;
  }

  /** Rows staged since the last {@link takeRows}. */
  get stagedRows(): number {
    return this.nRows;
  }

  feed(token: number): Float32Array {
    if (this.rowBuf.length === 0) {
      // target-only decoding: no drafter, no rows
      this.state = this.target.forward(this.state, token, this.logits, null, this.state);
      this.steps++;
      return this.logits;
    }
    const off = this.nRows * this.rowBytes;
    if (off + this.rowBytes > this.rowBuf.length) {
      throw new RangeError(`row staging full (${this.nRows} rows): rows were not taken`);
    }
    this.state = this.target.forward(
      this.state,
      token,
      this.logits,
      this.rowBuf.subarray(off, off + this.rowBytes),
      this.state,
    );
    this.nRows++;
    this.steps++;
    return this.logits;
  }

  /** The staged rows (a view valid until the next feed) and their count; staging restarts empty. */
  takeRows(): { rows: Uint8Array; nRows: number } {
    const n = this.nRows;
    this.nRows = 0;
    return { rows: this.rowBuf.subarray(0, n * this.rowBytes), nRows: n };
  }
}

/** What `decodeTargetOnly` needs to know about sampling. */
export interface DecodeMode {
  sample: boolean;
  temperature: number;
}

/**
 * Decodes a request with the target alone (no drafter): the reference the speculative output is
 * compared with. Greedy: argmax each step; sampled: softmax(logits / T) with the request's own
 * target-only PRNG stream (independent of the speculative run's stream).
 */
export function decodeTargetOnly(
  target: TargetModel,
  spec: RequestSpec,
  extra: Uint8Array | undefined,
  mode: DecodeMode,
  scratch: SampleScratch,
): number[] {
  const seq = new TargetSequence(target, extra, 0);
  const out: number[] = [];
  const rng = mode.sample ? new Rng(deriveSeed(spec.seed, STREAM.TARGET_ONLY)) : null;
  for (let i = 0; i < spec.prompt.length - 1; i++) seq.feed(spec.prompt[i] as number);
  let anchor = spec.prompt[spec.prompt.length - 1] as number;
  while (out.length < spec.maxNewTokens) {
    const logits = seq.feed(anchor);
    anchor = rng ? sampleTarget(logits, mode.temperature, rng, scratch) : argmax(logits);
    out.push(anchor);
  }
  return out;
}
