import { readFile } from "node:fs/promises";
import {
  dyadicQuantize,
  expNonPositive,
  mix32,
  sampleDyadic,
  TOP_K_MAX,
  topK,
  Xoshiro128,
} from "@tapwire/reference-model";
import { Capability } from "@tapwire/wire";
import type { DraftBatchEntry, Drafter, DraftOutput } from "@tapwire/worker";
import { checkDrafter } from "@tapwire/worker";
import * as ort from "onnxruntime-node";
import { OnnxDrafterError } from "./errors.js";
import { exportReferenceHead } from "./export.js";
import { decodeModel, inspectModel, type ModelInfo } from "./model.js";
import { bad, type OnnxDrafterOptions, type Resolved, resolveOptions } from "./options.js";
import { Input, Output, TOP32 } from "./signature.js";
import { type Bucket, bucketSize, newBucket, type TopOut, topOutputs } from "./tensors.js";

export { ExecutionProvider, GraphOptimization, type OnnxDrafterOptions } from "./options.js";

/** Rows up to this many bytes per entry are copied word by word (no view allocated); longer ones by memcpy. */
const COPY_LOOP_MAX = 32 * 1024;

/**
 * A `Drafter` of `@tapwire/worker` on ONNX Runtime for a head that follows the signature of
 * docs/onnx-drafter.md. Every STEP runs the model once per draft position for the whole batch
 * (the position's input token is the previous position's draft, for Markov-style heads);
 * greedy ids are the top-1 logit, TOP32 entries get their dyadic q (CONTRACT 8) computed in
 * JavaScript from the model's top logits exactly as `ReferenceDrafter` does; confidences come
 * from the model, margins are top-1 minus top-2 logit (6.3). An entry whose outputs are not
 * finite, or whose anchor token or drafted id is outside the vocabulary, is DRAFT_FAILED alone;
 * a run that throws fails the STEP's batch. Build with {@link OnnxDrafter.create}.
 */
export class OnnxDrafter implements Drafter {
  /** SHA-256 of the model's drafter initializers (CONTRACT 6.1; docs/onnx-drafter.md). */
  readonly drafterIdentity: Uint8Array;
  /** SHA-256 of the model's Markov initializers. */
  readonly markovIdentity: Uint8Array;
  /** Window `W` (the option, else `tapwire.window`). */
  readonly window: number;
  /** `N` (the option, else `tapwire.num_spec`). */
  readonly numSpec: number;
  /** `tapwire.vocab_size`. */
  readonly vocabSize: number;
  /** `tapwire.num_taps`. */
  readonly numTaps: number;
  /** `tapwire.hidden`. */
  readonly hidden: number;
  /** CONTRACT 6.1 capability bits: TAPS_BF16 and MARGIN, and TOP32 when the model can return 32 candidates. */
  readonly capabilities: number;
  /** What the model declares (signature, geometry, identities). */
  readonly info: Readonly<ModelInfo>;
  /** The options in force. */
  readonly options: Readonly<Required<Omit<OnnxDrafterOptions, "window" | "numSpec">>>;
  /** `session.run` calls so far (tests and benchmarks read it). */
  runs = 0;

  readonly #session: ort.InferenceSession;
  readonly #buckets = new Map<number, Bucket>();
  readonly #rowBytes: number;
  readonly #position = new BigInt64Array(1);
  readonly #position32 = new Int32Array(this.#position.buffer);
  readonly #positionT: ort.Tensor;
  readonly #topKTensors = new Map<number, ort.Tensor>();
  // Scratch of one sampled position (CONTRACT 8), sized once.
  readonly #probs = new Float64Array(TOP32);
  readonly #kept = new Float64Array(TOP32);
  readonly #selIds = new Int32Array(TOP32);
  readonly #taken = new Uint8Array(TOP32);
  readonly #candIds = new Int32Array(TOP32);
  readonly #candLogits = new Float32Array(TOP32);
  readonly #rng = new Xoshiro128(0);
  // u32 views of the worker's row buffers (long-lived slot stores), so that copying a row needs
  // no view per entry; made once per buffer.
  readonly #u32Views = new WeakMap<ArrayBufferLike, Uint32Array>();
  #failedLocal = new Uint8Array(0);
  #tail: Promise<void> = Promise.resolve();

  private constructor(session: ort.InferenceSession, info: ModelInfo, o: Resolved) {
    this.#session = session;
    this.info = info;
    this.options = Object.freeze({
      intraOpThreads: o.intraOpThreads,
      interOpThreads: o.interOpThreads,
      executionProvider: o.executionProvider,
      cudaDeviceId: o.cudaDeviceId,
      graphOptimization: o.graphOptimization,
    });
    this.drafterIdentity = info.drafterIdentity;
    this.markovIdentity = info.markovIdentity;
    this.window = o.window ?? info.window;
    if (this.window < info.windowRows) {
      bad(`window ${this.window} is below the ${info.windowRows} rows the model reads`);
    }
    this.numSpec = o.numSpec ?? info.numSpec;
    if (this.numSpec > info.numSpec) {
      bad(`numSpec ${this.numSpec} is above the model's tapwire.num_spec ${info.numSpec}`);
    }
    this.vocabSize = info.vocabSize;
    this.numTaps = info.numTaps;
    this.hidden = info.hidden;
    this.capabilities = Capability.TAPS_BF16 | Capability.MARGIN | (info.top32 ? Capability.TOP32 : 0);
    this.#rowBytes = info.numTaps * info.hidden * 2;
    this.#positionT = new ort.Tensor("int64", this.#position, [1]);
    checkDrafter(this);
  }

  /**
   * Loads a model: ONNX bytes, a path to an `.onnx` file, or a reference head's
   * `.safetensors` (exported in memory with {@link exportReferenceHead}). The options are
   * validated first, then the model against the signature, then ONNX Runtime creates the session.
   * @throws OnnxDrafterError `ONNX_DRAFTER_BAD_OPTION`, `ONNX_DRAFTER_BAD_MODEL`,
   *   `ONNX_DRAFTER_BAD_SIGNATURE`, `ONNX_DRAFTER_IDENTITY_MISMATCH`, `ONNX_DRAFTER_SESSION`.
   */
  static async create(model: Uint8Array | string, options: OnnxDrafterOptions = {}): Promise<OnnxDrafter> {
    const o = resolveOptions(options);
    let bytes: Uint8Array;
    if (typeof model === "string") {
      try {
        bytes = await readFile(model);
      } catch (cause) {
        throw new OnnxDrafterError(
          "ONNX_DRAFTER_BAD_MODEL",
          `cannot read ${model}: ${(cause as Error).message}`,
          {
            cause,
          },
        );
      }
      if (model.endsWith(".safetensors")) bytes = exportReferenceHead(bytes);
    } else if (model instanceof Uint8Array) {
      bytes = model;
    } else {
      bad("model must be ONNX bytes or a file path");
    }
    const info = inspectModel(decodeModel(bytes));
    const so: ort.InferenceSession.SessionOptions = {
      intraOpNumThreads: o.intraOpThreads,
      interOpNumThreads: o.interOpThreads,
      graphOptimizationLevel: o.graphOptimization,
      executionMode: "sequential",
      executionProviders:
        o.executionProvider === "cuda" ? [{ name: "cuda", deviceId: o.cudaDeviceId }] : [{ name: "cpu" }],
      logSeverityLevel: 3,
    };
    let session: ort.InferenceSession;
    try {
      session = await ort.InferenceSession.create(bytes, so);
    } catch (cause) {
      const msg = (cause as Error).message;
      const hint =
        o.executionProvider === "cuda"
          ? " (the CUDA provider needs a GPU and onnxruntime-node's CUDA binaries, which its install script fetches: see docs/onnx-drafter.md)"
          : "";
      throw new OnnxDrafterError("ONNX_DRAFTER_SESSION", `ONNX Runtime refused the model: ${msg}${hint}`, {
        cause,
      });
    }
    try {
      return new OnnxDrafter(session, info, o);
    } catch (e) {
      await session.release();
      throw e;
    }
  }

  /** Releases the ONNX Runtime session. */
  async release(): Promise<void> {
    await this.#session.release();
  }

  #topK(k: number): ort.Tensor {
    let t = this.#topKTensors.get(k);
    if (t === undefined) {
      t = new ort.Tensor("int64", BigInt64Array.from([BigInt(k)]), [1]);
      this.#topKTensors.set(k, t);
    }
    return t;
  }

  #bucket(n: number): Bucket {
    const size = bucketSize(n);
    let b = this.#buckets.get(size);
    if (b === undefined) {
      b = newBucket(this.info, size, this.#positionT);
      this.#buckets.set(size, b);
    }
    return b;
  }

  /** Drafts every entry of the batch into `out` (see the class description). */
  async draft(batch: readonly DraftBatchEntry[], out: DraftOutput): Promise<void> {
    if (batch.length === 0) return;
    // The tensors are shared by every STEP: one draft at a time.
    const run = this.#tail.then(() => this.#draft(batch, out));
    this.#tail = run.catch(() => {});
    await run;
  }

  /** The per-entry failure marks: the worker's (`out.failed`), else a local scratch. */
  #failedFor(batch: readonly DraftBatchEntry[], out: DraftOutput): Uint8Array {
    if (out.failed !== undefined) return out.failed;
    let top = 0;
    for (const e of batch) if (e.index >= top) top = e.index + 1;
    if (this.#failedLocal.length < top) this.#failedLocal = new Uint8Array(top);
    this.#failedLocal.fill(0);
    return this.#failedLocal;
  }

  /**
   * Fills the bucket's inputs from the batch (anchor and previous token, row count, the window's
   * rows right-aligned) and zeroes the padding entries. Returns the deepest `k` asked for and
   * whether any entry samples.
   */
  #fillInputs(
    batch: readonly DraftBatchEntry[],
    b: Bucket,
    failed: Uint8Array,
    sampledSession: boolean,
  ): { maxK: number; anySampled: boolean } {
    const n = batch.length;
    const V = this.vocabSize;
    let anySampled = false;
    let maxK = 0;
    for (let i = 0; i < n; i++) {
      const e = batch[i]!;
      if (e.k > maxK) maxK = e.k;
      if (sampledSession && e.sample !== null && e.sample.tempMilli > 0) anySampled = true;
      const ok = Number.isInteger(e.anchorToken) && e.anchorToken >= 0 && e.anchorToken < V;
      if (!ok) failed[e.index] = 1;
      const tok = ok ? e.anchorToken : 0;
      b.anchor32[2 * i] = tok;
      b.prev32[2 * i] = tok;
      b.rowCount32[2 * i] = e.nRows;
      this.#copyRows(e, b, i);
    }
    for (let i = n; i < b.size; i++) {
      b.anchor32[2 * i] = 0;
      b.prev32[2 * i] = 0;
      b.rowCount32[2 * i] = 0;
    }
    return { maxK, anySampled };
  }

  /** Entry `e`'s rows into batch row `i`, right-aligned: the last held row is always at index W - 1. */
  #copyRows(e: DraftBatchEntry, b: Bucket, i: number): void {
    const wr = this.info.windowRows;
    const rb = this.#rowBytes;
    // missing rows are zeros
    const have = Math.min(e.nRows, wr);
    const base = i * wr * rb;
    const pad = (wr - have) * rb;
    if (pad > 0) b.rowsU8.fill(0, base, base + pad);
    if (have === 0) return;
    const end = e.nRows * rb;
    const len = have * rb;
    const src = e.rows.byteOffset + end - len;
    const dst = base + pad;
    if (((src | dst | len) & 3) === 0 && len <= COPY_LOOP_MAX) {
      let v = this.#u32Views.get(e.rows.buffer);
      if (v === undefined) {
        v = new Uint32Array(e.rows.buffer, 0, e.rows.buffer.byteLength >>> 2);
        this.#u32Views.set(e.rows.buffer, v);
      }
      const s4 = src >>> 2;
      const d4 = dst >>> 2;
      const to = b.rows32;
      for (let w = 0; w < len >>> 2; w++) to[d4 + w] = v[s4 + w]!;
    } else {
      Buffer.prototype.copy.call(e.rows, b.rowsU8, dst, end - len, end);
    }
  }

  /**
   * The candidates of batch row `i` at this position into the candidate scratch: the model's top
   * logits, or the top of its full logits. False when they are not usable (an id outside the
   * vocabulary, a logit not finite, logits not descending).
   */
  #readCandidates(b: Bucket, i: number, top: TopOut | null, K: number, candidates: number): boolean {
    const V = this.vocabSize;
    const cIds = this.#candIds;
    const cLog = this.#candLogits;
    if (top !== null) {
      const o = i * K;
      for (let t = 0; t < candidates; t++) {
        const lo = top.ids32[2 * (o + t)]!;
        const hi = top.ids32[2 * (o + t) + 1]!;
        cIds[t] = hi === 0 && lo >= 0 && lo < V ? lo : -1;
        cLog[t] = top.logitsData[o + t]!;
      }
    } else {
      const row = b.logitRows[i]!;
      let finite = true;
      for (let t = 0; t < V; t++) {
        if (!Number.isFinite(row[t]!)) {
          finite = false;
          break;
        }
      }
      topK(row, candidates, cIds);
      for (let t = 0; t < candidates; t++) cLog[t] = finite ? row[cIds[t]!]! : Number.NaN;
    }
    for (let t = 0; t < candidates; t++) {
      if (cIds[t]! < 0 || !Number.isFinite(cLog[t]!) || (t > 0 && cLog[t]! > cLog[t - 1]!)) return false;
    }
    return true;
  }

  /**
   * Position `j` of entry `e` (batch row `i`) from the run's outputs into `out`: the greedy id or,
   * for a sampled entry, the drawn one with its support. False when the entry is DRAFT_FAILED.
   */
  #readPosition(
    e: DraftBatchEntry,
    i: number,
    j: number,
    b: Bucket,
    read: { top: TopOut | null; K: number; candidates: number; sampledSession: boolean },
    out: DraftOutput,
  ): boolean {
    const conf = b.confData[i]!;
    if (!this.#readCandidates(b, i, read.top, read.K, read.candidates) || !(conf >= 0 && conf <= 1)) {
      return false;
    }
    const cLog = this.#candLogits;
    const p = e.index * out.numSpec + j;
    const margin = cLog[0]! - cLog[1]!;
    let id = this.#candIds[0]!;
    const meta = e.sample;
    if (read.sampledSession && meta !== null && meta.tempMilli > 0) {
      if (read.candidates < TOP32) return false;
      id = this.#sample(meta.seed, meta.topK, meta.tempMilli, e.anchorPos, j, p * TOP_K_MAX, out);
      if (id < 0) return false;
      out.sampledMask![p] = 1;
    }
    out.draftIds[p] = id;
    out.confidence[p] = conf;
    if (out.margin !== null) out.margin[p] = Math.max(margin, 0);
    b.prev32[2 * i] = id;
    return true;
  }

  /**
   * The candidates per position: TOP32 when an entry samples, else 2 (top-1 and the margin's
   * top-2); a model with a fixed top output gives its own K.
   */
  #candidateK(anySampled: boolean): number {
    const info = this.info;
    if (info.output === "logits" || info.hasTopKInput) return anySampled ? TOP32 : 2;
    return info.fixedK;
  }

  async #draft(batch: readonly DraftBatchEntry[], out: DraftOutput): Promise<void> {
    const n = batch.length;
    const info = this.info;
    const sampledSession = out.supportIds !== null && out.proposalQ !== null && out.sampledMask !== null;
    const failed = this.#failedFor(batch, out);
    const b = this.#bucket(n);
    const filled = this.#fillInputs(batch, b, failed, sampledSession);
    const maxK = Math.min(filled.maxK, out.numSpec);
    const K = this.#candidateK(filled.anySampled);
    const candidates = Math.min(K, filled.anySampled ? TOP32 : 2);
    let top: TopOut | null = null;
    if (info.output === "top") {
      top = topOutputs(b, K);
      b.fetches[Output.TOP_LOGITS] = top.logits;
      b.fetches[Output.TOP_IDS] = top.ids;
      b.fetchesLast[Output.TOP_LOGITS] = top.logits;
      b.fetchesLast[Output.TOP_IDS] = top.ids;
      if (info.hasTopKInput) b.feeds[Input.TOP_K] = this.#topK(K);
    }
    const read = { top, K, candidates, sampledSession };
    for (let j = 0; j < maxK; j++) {
      this.#position32[0] = j;
      this.#position32[1] = 0;
      if (b.states !== null) {
        b.feeds[Input.STATE] = j === 0 ? b.zeroState! : b.states[(j + 1) & 1]!;
        b.fetches[Output.NEXT_STATE] = b.states[j & 1]!;
      }
      this.runs++;
      await this.#session.run(b.feeds, j === maxK - 1 ? b.fetchesLast : b.fetches);
      for (let i = 0; i < n; i++) {
        const e = batch[i]!;
        if (j >= e.k || failed[e.index] === 1) continue;
        if (!this.#readPosition(e, i, j, b, read, out)) failed[e.index] = 1;
      }
    }
    if (out.failed === undefined) {
      for (const e of batch) {
        if (failed[e.index] === 1) {
          throw new OnnxDrafterError(
            "ONNX_DRAFTER_BAD_MODEL",
            `slot ${e.slot}: the model gave no usable draft`,
          );
        }
      }
    }
  }

  /**
   * One sampled position (CONTRACT 8), equal to the reference head's: probabilities
   * `exp((logit - max) / T)` of the candidates, the `topK` most likely (ties: lower id; when
   * fewer than `topK` are non-zero, the lowest ids of probability zero, as a top-k over the
   * whole vocabulary picks them), dyadic q, and the draw seeded by (seed, anchor position, j).
   * Returns the drafted id, or -1 when the support cannot be formed.
   */
  #sample(
    seed: number,
    k: number,
    tempMilli: number,
    anchorPos: number,
    j: number,
    so: number,
    out: DraftOutput,
  ): number {
    const cIds = this.#candIds;
    const cLog = this.#candLogits;
    const probs = this.#probs;
    const taken = this.#taken;
    const sel = this.#selIds;
    const kept = this.#kept;
    const inv = 1 / (tempMilli / 1000);
    const max = cLog[0]!;
    let nonZero = 0;
    for (let t = 0; t < TOP32; t++) {
      probs[t] = expNonPositive((cLog[t]! - max) * inv);
      taken[t] = 0;
      if (probs[t]! > 0) nonZero++;
    }
    const kk = Math.min(k, TOP32);
    let m = 0;
    for (; m < kk && m < nonZero; m++) {
      let best = -1;
      for (let t = 0; t < TOP32; t++) {
        if (taken[t] === 1 || !(probs[t]! > 0)) continue;
        if (best < 0 || probs[t]! > probs[best]! || (probs[t] === probs[best] && cIds[t]! < cIds[best]!))
          best = t;
      }
      taken[best] = 1;
      sel[m] = cIds[best]!;
      kept[m] = probs[best]!;
    }
    if (m < kk) {
      if (nonZero === TOP32) return -1;
      // Zero-probability ids fill the support from the lowest id, skipping the non-zero ones.
      for (let id = 0; m < kk && id < this.vocabSize; id++) {
        let used = false;
        for (let t = 0; t < TOP32; t++) {
          if (probs[t]! > 0 && cIds[t] === id) {
            used = true;
            break;
          }
        }
        if (used) continue;
        sel[m] = id;
        kept[m] = 0;
        m++;
      }
    }
    const q = out.proposalQ!;
    const ids = out.supportIds!;
    dyadicQuantize(kept, kk, q, so);
    for (let i = 0; i < kk; i++) ids[so + i] = sel[i]!;
    this.#rng.reseed(mix32(mix32(mix32(seed >>> 0) ^ (anchorPos >>> 0)) ^ j));
    return sel[sampleDyadic(q, kk, this.#rng, so)]!;
  }
}
