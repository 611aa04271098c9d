/**
 * The DSpark-shaped draft head of the reference target:
 *
 * - **backbone** (parallel): decodes a state estimate from the last tap row of the window with a
 *   least-squares read-out (`backbone.read`, noisy), feeds the anchor token's embedding, then
 *   rolls a rank-`rank` approximation of the target's recurrence `k` steps with the *mean*
 *   embedding in place of the unknown tokens, producing all `k` base logit vectors in one pass
 *   over the LM head;
 * - **Markov head** (low rank `markovRank`): a bigram-style logit bias for position `i >= 1` from
 *   the token drafted at `i - 1` (`markov.out · markov.in[token]`);
 * - **confidence head**: top-1 probability of the draft distribution at a per-position
 *   temperature fitted on the target's greedy continuations (calibrated), in [0, 1]; margin =
 *   top-1 minus top-2 logit (>= 0).
 *
 * Its weights are a deliberately imperfect distillation of a {@link TargetModel}: truncated rank
 * and seeded relative noise (`noise`).
 */
import { readFileSync, writeFileSync } from "node:fs";
import { calibrate } from "./acceptance.js";
import { distilTensors } from "./distill.js";
import {
  DEFAULT_DRAFT_CONFIG,
  type DraftConfig,
  type DraftOut,
  type DraftSample,
  MAX_DRAFT_POSITIONS,
  validateDraftConfig,
} from "./draft-config.js";
import { FORMAT, headGeometry } from "./draft-file.js";
import { f32Tensor, type Geometry, getTensor, KNOWN_TENSORS, readF32 } from "./draft-tensors.js";
import { badArgument, ReferenceModelError } from "./errors.js";
import { tensorsIdentity } from "./identity.js";
import { mix32, Xoshiro128 } from "./prng.js";
import { readSafetensors, type SafetensorsTensor, writeSafetensors } from "./safetensors.js";
import { dyadicQuantize, expNonPositive, sampleDyadic, TOP_K_MAX, topK } from "./sampling.js";
import {
  DEFAULT_TARGET_CONFIG,
  lowRankLogits,
  TARGET_DYNAMICS,
  type TargetConfig,
  TargetModel,
} from "./target.js";

const L = TARGET_DYNAMICS.readoutRank;

const DRAFTER_DOMAIN = "tapwire/reference-drafter/v1";
const MARKOV_DOMAIN = "tapwire/reference-markov/v1";

/** The draft head. Build with {@link DraftHead.distill} or {@link DraftHead.load}. */
export class DraftHead {
  /** The head's configuration. */
  readonly config: Readonly<Required<DraftConfig>>;
  /** SHA-256 of the backbone and confidence tensors (CONTRACT 6.1 drafter_identity). */
  readonly drafterIdentity: Uint8Array;
  /** SHA-256 of the Markov head tensors (CONTRACT 6.1 markov_identity). */
  readonly markovIdentity: Uint8Array;
  /** Vocabulary size of the target it drafts for. */
  readonly vocabSize: number;
  /** State dimensions of the target. */
  readonly stateDim: number;
  /** Tap vectors per row. */
  readonly numTaps: number;
  /** Values per tap vector. */
  readonly hidden: number;
  /** Row size in bytes: `numTaps * hidden * 2`. */
  readonly rowBytes: number;
  /** Seed of the target it was distilled from (informational). */
  readonly targetSeed: number;

  readonly #tensors: Map<string, SafetensorsTensor>;
  readonly #readIndex: Int32Array;
  readonly #read: Float32Array;
  readonly #initState: Float32Array;
  readonly #dynU: Float32Array;
  readonly #dynV: Float32Array;
  readonly #clockC: Float32Array;
  readonly #rot: Float32Array;
  readonly #bias: Float32Array;
  readonly #embed: Float32Array;
  readonly #embedMean: Float32Array;
  readonly #lmU: Float32Array;
  readonly #lmM: Float32Array;
  readonly #lmBias: Float32Array;
  readonly #temps: Float32Array;
  readonly #mIn: Float32Array;
  readonly #mOut: Float32Array;

  // Scratch, sized once.
  readonly #states: Float32Array;
  readonly #low: Float32Array;
  readonly #hvec: Float32Array;
  readonly #pre: Float32Array;
  readonly #corr: Float32Array;
  /** Logits of the last draft call, position j at `j * vocabSize` (read by calibration). */
  readonly lastLogits: Float32Array;
  readonly #probs: Float64Array;
  readonly #ids: Int32Array;
  readonly #kept: Float64Array;
  readonly #rng = new Xoshiro128(0);
  readonly #f1 = new Float32Array(1);
  readonly #u1 = new Uint32Array(this.#f1.buffer);

  private constructor(config: Required<DraftConfig>, geo: Geometry, tensors: Map<string, SafetensorsTensor>) {
    const { vocabSize: v, stateDim: d, numTaps, hidden } = geo;
    const dc = d - 2;
    this.config = Object.freeze({ ...config });
    this.vocabSize = v;
    this.stateDim = d;
    this.numTaps = numTaps;
    this.hidden = hidden;
    this.rowBytes = numTaps * hidden * 2;
    this.targetSeed = geo.targetSeed;
    this.#tensors = tensors;
    const r = config.rank;
    const rm = config.markovRank;
    const rd = config.readDims === 0 ? numTaps * hidden : config.readDims;
    const idxView = getTensor(tensors, "backbone.read_index", "I32", [rd]);
    this.#readIndex = new Int32Array(rd);
    for (let i = 0; i < rd; i++) {
      const x = idxView.getInt32(i * 4, true);
      if (x < 0 || x >= numTaps * hidden) {
        throw new ReferenceModelError(
          "RM_BAD_WEIGHTS",
          `draft head: backbone.read_index[${i}] = ${x} outside the row`,
        );
      }
      this.#readIndex[i] = x;
    }
    this.#read = readF32(tensors, "backbone.read", [rd, d]);
    this.#initState = readF32(tensors, "backbone.init_state", [d]);
    this.#dynU = readF32(tensors, "backbone.dyn_u", [dc, r]);
    this.#dynV = readF32(tensors, "backbone.dyn_v", [r, dc]);
    this.#clockC = readF32(tensors, "backbone.clock_coupling", [dc, 2]);
    this.#rot = readF32(tensors, "backbone.clock_rotation", [2]);
    this.#bias = readF32(tensors, "backbone.bias", [dc]);
    this.#embed = readF32(tensors, "backbone.embed", [v, dc]);
    this.#embedMean = readF32(tensors, "backbone.embed_mean", [dc]);
    this.#lmU = readF32(tensors, "backbone.lm_u", [v, L]);
    this.#lmM = readF32(tensors, "backbone.lm_m", [L, d]);
    this.#lmBias = readF32(tensors, "backbone.lm_bias", [v]);
    this.#temps = readF32(tensors, "confidence.temperature", [MAX_DRAFT_POSITIONS]);
    for (let i = 0; i < this.#temps.length; i++) {
      if (!(this.#temps[i]! > 0)) {
        throw new ReferenceModelError(
          "RM_BAD_WEIGHTS",
          `draft head: confidence.temperature[${i}] is not > 0`,
        );
      }
    }
    this.#mIn = readF32(tensors, "markov.in", [v, rm]);
    this.#mOut = readF32(tensors, "markov.out", [dc, rm]);
    for (const name of tensors.keys()) {
      if (!KNOWN_TENSORS.has(name))
        throw new ReferenceModelError("RM_BAD_WEIGHTS", `draft head: unknown tensor ${name}`);
    }
    this.drafterIdentity = tensorsIdentity(tensors, DRAFTER_DOMAIN, (n) => !n.startsWith("markov."));
    this.markovIdentity = tensorsIdentity(tensors, MARKOV_DOMAIN, (n) => n.startsWith("markov."));
    this.#states = new Float32Array((MAX_DRAFT_POSITIONS + 1) * d);
    this.#low = new Float32Array(Math.max(r, rm));
    this.#hvec = new Float32Array(L);
    this.#pre = new Float32Array(MAX_DRAFT_POSITIONS * dc);
    this.#corr = new Float32Array(d);
    this.lastLogits = new Float32Array(MAX_DRAFT_POSITIONS * v);
    this.#probs = new Float64Array(v);
    this.#ids = new Int32Array(TOP_K_MAX);
    this.#kept = new Float64Array(TOP_K_MAX);
  }

  /**
   * Distils a head from `target`: least-squares read-out of the state from the tap rows, rank-
   * `rank` truncation of the recurrence (SVD), Markov head from the linearised effect of the
   * previous token (rank `markovRank`), seeded relative noise on everything, then confidence
   * temperatures fitted on simulated greedy rounds. Deterministic in (target, cfg).
   */
  static distill(target: TargetModel, cfg: DraftConfig): DraftHead {
    const { vocabSize, stateDim, numTaps, hidden, seed } = target.config;
    const config = validateDraftConfig(cfg, stateDim, numTaps * hidden);
    const tensors = distilTensors(target, config);
    const geo: Geometry = { vocabSize, stateDim, numTaps, hidden, targetSeed: seed };
    const raw = new DraftHead(config, geo, tensors);
    if (config.calibrationRounds === 0) return raw;
    const temps = calibrate(target, raw, config);
    tensors.set("confidence.temperature", f32Tensor([MAX_DRAFT_POSITIONS], temps));
    return new DraftHead(config, geo, tensors);
  }

  /** The head's tensors (read-only by convention), as stored in its safetensors file. */
  get weights(): ReadonlyMap<string, SafetensorsTensor> {
    return this.#tensors;
  }

  /**
   * Drafts `k` positions (1..32) for one entry and writes them at `out.offset + j`:
   * ids, confidence in [0, 1] and margin >= 0 (CONTRACT 6.3). `rows` holds `nRows` window rows
   * (bf16, oldest first) ending just before the anchor position; with `nRows == 0` the head uses
   * the target's initial state. With `sample` and `sample.tempMilli > 0` each position is drawn
   * from the draft distribution at temperature `tempMilli / 1000` restricted to its top-k and
   * quantised to dyadic q (CONTRACT 8): support ids and q at `sample.offset + 32 * j`, the draw
   * seeded by (sample.seed, sample.position, j). No allocation.
   */
  draft(
    rows: Uint8Array,
    nRows: number,
    anchorToken: number,
    k: number,
    out: DraftOut,
    sample?: DraftSample,
  ): void {
    const sampled = this.#checkDraft(rows, nRows, anchorToken, k, out, sample);
    this.#estimateState(rows, nRows);
    this.#rollBackbone(anchorToken, k);
    this.#readOut(anchorToken, k, out, sampled ? sample : undefined);
  }

  /** Checks draft()'s arguments; returns whether the entry is sampled (`sample.tempMilli > 0`). */
  #checkDraft(
    rows: Uint8Array,
    nRows: number,
    anchorToken: number,
    k: number,
    out: DraftOut,
    sample: DraftSample | undefined,
  ): boolean {
    const v = this.vocabSize;
    const rb = this.rowBytes;
    if (!Number.isInteger(k) || k < 1 || k > MAX_DRAFT_POSITIONS)
      throw badArgument(`draft: k ${k} outside [1, 32]`);
    if (!Number.isInteger(anchorToken) || anchorToken < 0 || anchorToken >= v) {
      throw badArgument(`draft: anchor token ${anchorToken} outside [0, ${v})`);
    }
    if (!Number.isInteger(nRows) || nRows < 0 || rows.length < nRows * rb) {
      throw badArgument(`draft: ${nRows} rows need ${nRows * rb} bytes, got ${rows.length}`);
    }
    if (out.offset < 0 || out.ids.length < out.offset + k || out.conf.length < out.offset + k) {
      throw badArgument(`draft: output arrays too small for ${k} positions at offset ${out.offset}`);
    }
    if (out.margin !== null && out.margin.length < out.offset + k) {
      throw badArgument(`draft: margin array too small for ${k} positions at offset ${out.offset}`);
    }
    const sampled = sample !== undefined && sample.tempMilli > 0;
    if (sampled) {
      if (!Number.isInteger(sample.topK) || sample.topK < 1 || sample.topK > TOP_K_MAX || sample.topK > v) {
        throw badArgument(`draft: top_k ${sample.topK} outside [1, ${Math.min(TOP_K_MAX, v)}]`);
      }
      if (sample.offset < 0 || sample.supportIds.length < sample.offset + TOP_K_MAX * (k - 1) + sample.topK) {
        throw badArgument("draft: supportIds too small");
      }
      if (sample.proposalQ.length < sample.offset + TOP_K_MAX * (k - 1) + sample.topK) {
        throw badArgument("draft: proposalQ too small");
      }
    }
    return sampled;
  }

  /** Backbone, step 0: the state estimate from the last row (or the initial state) in `states[0, d)`. */
  #estimateState(rows: Uint8Array, nRows: number): void {
    const d = this.stateDim;
    const rb = this.rowBytes;
    const states = this.#states;
    if (nRows === 0) {
      for (let a = 0; a < d; a++) states[a] = this.#initState[a]!;
    } else {
      for (let a = 0; a < d; a++) states[a] = 0;
      const base = (nRows - 1) * rb;
      const idx = this.#readIndex;
      const rd = idx.length;
      const read = this.#read;
      const f1 = this.#f1;
      const u1 = this.#u1;
      for (let i = 0; i < rd; i++) {
        const o = base + 2 * idx[i]!;
        u1[0] = (rows[o]! | (rows[o + 1]! << 8)) << 16;
        const x = f1[0]!;
        if (x === 0) continue;
        const ro = i * d;
        for (let a = 0; a < d; a++) states[a] = states[a]! + read[ro + a]! * x;
      }
    }
  }

  /** Backbone, steps 1..k: the rank-r recurrence; the anchor's embedding, then the mean embedding. */
  #rollBackbone(anchorToken: number, k: number): void {
    const d = this.stateDim;
    const dc = d - 2;
    const states = this.#states;
    const r = this.config.rank;
    const low = this.#low;
    const dynU = this.#dynU;
    const dynV = this.#dynV;
    const clockC = this.#clockC;
    const rot = this.#rot;
    const bias = this.#bias;
    const embed = this.#embed;
    const embedMean = this.#embedMean;
    const pre = this.#pre;
    for (let j = 0; j < k; j++) {
      const src = j * d;
      const dst = src + d;
      for (let kk = 0; kk < r; kk++) {
        let acc = 0;
        const o = kk * dc;
        for (let a = 0; a < dc; a++) acc += dynV[o + a]! * states[src + a]!;
        low[kk] = acc;
      }
      const c0 = states[src + dc]!;
      const c1 = states[src + dc + 1]!;
      const n0 = rot[0]! * c0 - rot[1]! * c1;
      const n1 = rot[1]! * c0 + rot[0]! * c1;
      const eo = anchorToken * dc;
      for (let a = 0; a < dc; a++) {
        let acc =
          bias[a]! +
          clockC[2 * a]! * n0 +
          clockC[2 * a + 1]! * n1 +
          (j === 0 ? embed[eo + a]! : embedMean[a]!);
        const o = a * r;
        for (let kk = 0; kk < r; kk++) acc += dynU[o + kk]! * low[kk]!;
        pre[j * dc + a] = acc;
        states[dst + a] = Math.tanh(acc);
      }
      states[dst + dc] = n0;
      states[dst + dc + 1] = n1;
    }
  }

  /**
   * LM head per position (rank-L read-out); the Markov head adds its correction from the
   * previous drafted token in the same L-dimensional space (a bigram logit bias). Writes ids,
   * confidence and margin; with `sample`, each id is drawn (see {@link DraftHead.draft}).
   */
  #readOut(anchorToken: number, k: number, out: DraftOut, sample: DraftSample | undefined): void {
    const v = this.vocabSize;
    const d = this.stateDim;
    const states = this.#states;
    const lmU = this.#lmU;
    const lmM = this.#lmM;
    const lmBias = this.#lmBias;
    const hvec = this.#hvec;
    const logits = this.lastLogits;
    let prev = anchorToken;
    for (let j = 0; j < k; j++) {
      const lo = j * v;
      let src = states;
      let so = (j + 1) * d;
      if (j > 0) {
        src = this.#markovCorrected(j, prev, so);
        so = 0;
      }
      for (let i = 0; i < L; i++) {
        let acc = 0;
        const o = i * d;
        for (let a = 0; a < d; a++) acc += lmM[o + a]! * src[so + a]!;
        hvec[i] = acc;
      }
      lowRankLogits(lmU, hvec, lmBias, v, logits, lo);
      let b1 = 0;
      let l1 = Number.NEGATIVE_INFINITY;
      let l2 = Number.NEGATIVE_INFINITY;
      for (let t = 0; t < v; t++) {
        const x = logits[lo + t]!;
        if (x > l1) {
          l2 = l1;
          l1 = x;
          b1 = t;
        } else if (x > l2) {
          l2 = x;
        }
      }
      const inv = 1 / this.#temps[j]!;
      let z = 0;
      for (let t = 0; t < v; t++) z += expNonPositive((logits[lo + t]! - l1) * inv);
      const conf = 1 / z;
      const oi = out.offset + j;
      out.conf[oi] = Math.min(conf, 1);
      if (out.margin !== null) out.margin[oi] = Math.max(l1 - l2, 0);
      let tok = b1;
      if (sample !== undefined) {
        tok = this.#sampleAt(lo, j, sample);
        if (sample.sampledMask !== undefined) sample.sampledMask[oi] = 1;
      }
      out.ids[oi] = tok;
      prev = tok;
    }
  }

  /**
   * Markov head: position j's state with the drafted token `prev`'s (low-rank) embedding offset
   * in place of the mean embedding in its pre-activation (the clock from `states[so...]`).
   */
  #markovCorrected(j: number, prev: number, so: number): Float32Array {
    const dc = this.stateDim - 2;
    const rm = this.config.markovRank;
    const states = this.#states;
    const pre = this.#pre;
    const mIn = this.#mIn;
    const mOut = this.#mOut;
    const corr = this.#corr;
    const io = prev * rm;
    for (let a = 0; a < dc; a++) {
      let acc = pre[j * dc + a]!;
      const mo = a * rm;
      for (let kk = 0; kk < rm; kk++) acc += mOut[mo + kk]! * mIn[io + kk]!;
      corr[a] = Math.tanh(acc);
    }
    corr[dc] = states[so + dc]!;
    corr[dc + 1] = states[so + dc + 1]!;
    return corr;
  }

  #sampleAt(lo: number, j: number, sample: DraftSample): number {
    const v = this.vocabSize;
    const logits = this.lastLogits;
    const probs = this.#probs;
    const temp = sample.tempMilli / 1000;
    let max = Number.NEGATIVE_INFINITY;
    for (let t = 0; t < v; t++) if (logits[lo + t]! > max) max = logits[lo + t]!;
    const inv = 1 / temp;
    for (let t = 0; t < v; t++) probs[t] = expNonPositive((logits[lo + t]! - max) * inv);
    const kk = sample.topK;
    const ids = this.#ids;
    topK(probs, kk, ids);
    const kept = this.#kept;
    for (let i = 0; i < kk; i++) kept[i] = probs[ids[i]!]!;
    const so = sample.offset + j * TOP_K_MAX;
    dyadicQuantize(kept, kk, sample.proposalQ, so);
    for (let i = 0; i < kk; i++) sample.supportIds[so + i] = ids[i]!;
    this.#rng.reseed(mix32(mix32(mix32(sample.seed >>> 0) ^ ((sample.position ?? 0) >>> 0)) ^ j));
    const pick = sampleDyadic(sample.proposalQ, kk, this.#rng, so);
    return ids[pick]!;
  }

  /** Serialises the head as safetensors bytes (tensors plus geometry and config in `__metadata__`). */
  toSafetensors(): Uint8Array {
    const c = this.config;
    return writeSafetensors(this.#tensors, {
      format: FORMAT,
      version: "1",
      vocab_size: String(this.vocabSize),
      state_dim: String(this.stateDim),
      num_taps: String(this.numTaps),
      hidden: String(this.hidden),
      target_seed: String(this.targetSeed),
      window: String(c.window),
      num_spec: String(c.numSpec),
      rank: String(c.rank),
      noise: String(c.noise),
      seed: String(c.seed),
      markov_rank: String(c.markovRank),
      read_dims: String(c.readDims),
      calibration_rounds: String(c.calibrationRounds),
    });
  }

  /**
   * Parses a head from safetensors bytes. With `target`, its geometry must match (vocab, state,
   * taps, hidden), else RM_BAD_WEIGHTS. Malformed files throw RM_SAFETENSORS_*; missing or
   * misshapen tensors and metadata throw RM_BAD_WEIGHTS.
   */
  static fromSafetensors(bytes: Uint8Array, target?: TargetModel): DraftHead {
    const md = new Map<string, string>();
    const tensors = readSafetensors(bytes, { metadata: md });
    if (md.get("format") !== FORMAT || md.get("version") !== "1") {
      throw new ReferenceModelError("RM_BAD_WEIGHTS", `draft head: format is not ${FORMAT} version 1`);
    }
    const { geo, config } = headGeometry(md, target);
    return new DraftHead(config, geo, tensors);
  }

  /** Writes the head to a safetensors file at `path`. */
  save(path: string): void {
    writeFileSync(path, this.toSafetensors());
  }

  /** Reads a head from a safetensors file (see {@link DraftHead.fromSafetensors}). */
  static load(path: string, target?: TargetModel): DraftHead {
    return DraftHead.fromSafetensors(readFileSync(path), target);
  }
}

/** Default target + head pair, for examples and tests: `TargetModel.create(DEFAULT_TARGET_CONFIG)`. */
export function createDefaultPair(
  overrides: { target?: Partial<TargetConfig>; draft?: Partial<DraftConfig> } = {},
): {
  /** The target model, `DEFAULT_TARGET_CONFIG` with `overrides.target` applied. */
  target: TargetModel;
  /** A head distilled from `target` with `DEFAULT_DRAFT_CONFIG` and `overrides.draft` applied. */
  head: DraftHead;
} {
  const target = TargetModel.create({ ...DEFAULT_TARGET_CONFIG, ...overrides.target });
  const head = DraftHead.distill(target, { ...DEFAULT_DRAFT_CONFIG, ...overrides.draft });
  return { target, head };
}
