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
import { badArgument, badConfig, checkInt, ReferenceModelError } from "./errors.js";
import { tensorsIdentity } from "./identity.js";
import { choleskySolve, stddev, symmetricEigen } from "./linalg.js";
import { mix32, Xoshiro128 } from "./prng.js";
import { readSafetensors, type SafetensorsTensor, writeSafetensors } from "./safetensors.js";
import { dyadicQuantize, expNonPositive, sampleDyadic, TOP_K_MAX, topK } from "./sampling.js";
import {
  DEFAULT_TARGET_CONFIG,
  lowRankLogits,
  TARGET_DYNAMICS,
  type TargetConfig,
  TargetModel,
  type TargetState,
} from "./target.js";

const L = TARGET_DYNAMICS.readoutRank;

/** Largest number of positions one draft call can produce (CONTRACT 6.1: num_spec <= 32). */
export const MAX_DRAFT_POSITIONS = 32;

/** Configuration of {@link DraftHead.distill}. */
export interface DraftConfig {
  /** Window W in rows (1..4096). The head reads the last row; W is carried for HELLO (CONTRACT 6.1). */
  window: number;
  /** num_spec N (1..32): positions per draft by default, and positions calibrated. */
  numSpec: number;
  /** Rank of the backbone's approximation of the target recurrence (1..stateDim-2). */
  rank: number;
  /** Relative noise added to every distilled tensor (>= 0; 0 = exact up to rank). */
  noise: number;
  /** Seed of the noise (u32). */
  seed: number;
  /** Rank of the Markov head (1..16; default 8). */
  markovRank?: number;
  /**
   * Values of the last row read by the backbone, evenly spread over the row (default 256;
   * 0 or at least the row's size = the whole row).
   */
  readDims?: number;
  /** Greedy rounds simulated to fit the confidence temperatures (0..100000; default 192). */
  calibrationRounds?: number;
}

/**
 * Default head: W 16, N 4, rank 40 (of 46), noise 0.2, seed 7 (greedy mean accepted length
 * about 2.5 tokens per round at N = 4 on the default target; see docs/reference-model.md).
 */
export const DEFAULT_DRAFT_CONFIG: Readonly<Required<DraftConfig>> = Object.freeze({
  window: 16,
  numSpec: 4,
  rank: 40,
  noise: 0.2,
  seed: 7,
  markovRank: 8,
  readDims: 256,
  calibrationRounds: 192,
});

/** Relative weight of `noise` per tensor group (constant: part of the model definition). */
export const DRAFT_NOISE_SHAPE = {
  read: 0.05,
  dynamics: 0.5,
  clock: 0.2,
  bias: 0.5,
  embed: 0.4,
  lmHead: 0.25,
  markov: 0.5,
} as const;

/** Sampling request of one entry (CONTRACT 8), with where to write the support and q. */
export interface DraftSample {
  /** Entry seed (u32). */
  seed: number;
  /** top_k (1..32). */
  topK: number;
  /** Temperature x 1000; 0 = greedy for this entry (support and q untouched). */
  tempMilli: number;
  /** Support ids; position j at `offset + j * 32`. */
  supportIds: Int32Array;
  /** Dyadic q; position j at `offset + j * 32`. */
  proposalQ: Uint32Array;
  /** Offset of position 0 in `supportIds` / `proposalQ`. */
  offset: number;
  /** Mixed into the draw's seed with the entry seed and j (use the anchor position; default 0). */
  position?: number;
  /** When given, `sampledMask[out.offset + j]` is set to 1 for each sampled position. */
  sampledMask?: Uint8Array;
}

/** Where {@link DraftHead.draft} writes position j: `ids[offset + j]`, `conf[...]`, `margin[...]`. */
export interface DraftOut {
  /** Draft token ids; position j goes to `ids[offset + j]`. */
  ids: Int32Array;
  /** Calibrated top-1 probability per position, in [0, 1]. */
  conf: Float32Array;
  /** Margins (top-1 minus top-2 logit); null to skip. */
  margin: Float32Array | null;
  /** Index of position 0 in each array (e.g. `entryIndex * numSpec` in a STEP reply). */
  offset: number;
}

const DRAFTER_DOMAIN = "tapwire/reference-drafter/v1";
const MARKOV_DOMAIN = "tapwire/reference-markov/v1";
const FORMAT = "tapwire-reference-draft-head";

interface Geometry {
  vocabSize: number;
  stateDim: number;
  numTaps: number;
  hidden: number;
  targetSeed: number;
}

function f32Tensor(shape: number[], values: Float32Array): SafetensorsTensor {
  const data = new Uint8Array(values.length * 4);
  const view = new DataView(data.buffer);
  for (let i = 0; i < values.length; i++) view.setFloat32(i * 4, values[i]!, true);
  return { dtype: "F32", shape, data };
}

function i32Tensor(shape: number[], values: Int32Array): SafetensorsTensor {
  const data = new Uint8Array(values.length * 4);
  const view = new DataView(data.buffer);
  for (let i = 0; i < values.length; i++) view.setInt32(i * 4, values[i]!, true);
  return { dtype: "I32", shape, data };
}

function getTensor(
  tensors: Map<string, SafetensorsTensor>,
  name: string,
  dtype: string,
  shape: number[],
): DataView {
  const t = tensors.get(name);
  if (t === undefined) throw new ReferenceModelError("RM_BAD_WEIGHTS", `draft head: missing tensor ${name}`);
  if (t.dtype !== dtype || t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
    throw new ReferenceModelError(
      "RM_BAD_WEIGHTS",
      `draft head: tensor ${name} is ${t.dtype}[${t.shape.join(", ")}], expected ${dtype}[${shape.join(", ")}]`,
    );
  }
  return new DataView(t.data.buffer, t.data.byteOffset, t.data.byteLength);
}

function readF32(tensors: Map<string, SafetensorsTensor>, name: string, shape: number[]): Float32Array {
  const view = getTensor(tensors, name, "F32", shape);
  const out = new Float32Array(view.byteLength / 4);
  for (let i = 0; i < out.length; i++) {
    const v = view.getFloat32(i * 4, true);
    if (!Number.isFinite(v))
      throw new ReferenceModelError("RM_BAD_WEIGHTS", `draft head: ${name}[${i}] is not finite`);
    out[i] = v;
  }
  return out;
}

function noisy(rng: Xoshiro128, x: Float32Array | Float64Array, rel: number): Float32Array {
  const out = Float32Array.from(x);
  if (rel <= 0) return out;
  const s = stddev(x) * rel;
  for (let i = 0; i < out.length; i++) out[i] = out[i]! + rng.nextGaussian() * s;
  return out;
}

/** Validated draft configuration with defaults filled in. */
export function validateDraftConfig(
  cfg: DraftConfig,
  stateDim: number,
  rowElems: number,
): Required<DraftConfig> {
  if (cfg === null || typeof cfg !== "object") throw badArgument("draft config must be an object");
  const dc = stateDim - 2;
  const noise = cfg.noise;
  if (typeof noise !== "number" || !Number.isFinite(noise) || noise < 0 || noise > 100) {
    throw badConfig(`noise must be a finite number in [0, 100], got ${String(noise)}`);
  }
  return {
    window: checkInt("window", cfg.window, 1, 4096),
    numSpec: checkInt("numSpec", cfg.numSpec, 1, MAX_DRAFT_POSITIONS),
    rank: checkInt("rank", cfg.rank, 1, dc),
    noise,
    seed: checkInt("seed", cfg.seed, 0, 0xffffffff),
    markovRank: checkInt("markovRank", cfg.markovRank ?? Math.min(8, dc), 1, dc),
    // More values than the row holds means the whole row.
    readDims: Math.min(checkInt("readDims", cfg.readDims ?? 256, 0, 1 << 30), rowElems),
    calibrationRounds: checkInt("calibrationRounds", cfg.calibrationRounds ?? 192, 0, 100_000),
  };
}

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

  private readonly tensors: Map<string, SafetensorsTensor>;
  private readonly readIndex: Int32Array;
  private readonly read: Float32Array;
  private readonly initState: Float32Array;
  private readonly dynU: Float32Array;
  private readonly dynV: Float32Array;
  private readonly clockC: Float32Array;
  private readonly rot: Float32Array;
  private readonly bias: Float32Array;
  private readonly embed: Float32Array;
  private readonly embedMean: Float32Array;
  private readonly lmU: Float32Array;
  private readonly lmM: Float32Array;
  private readonly lmBias: Float32Array;
  private readonly temps: Float32Array;
  private readonly mIn: Float32Array;
  private readonly mOut: Float32Array;

  // Scratch, sized once.
  private readonly states: Float32Array;
  private readonly low: Float32Array;
  private readonly hvec: Float32Array;
  private readonly pre: Float32Array;
  private readonly corr: Float32Array;
  /** Logits of the last draft call, position j at `j * vocabSize` (read by calibration). */
  readonly lastLogits: Float32Array;
  private readonly probs: Float64Array;
  private readonly ids: Int32Array;
  private readonly kept: Float64Array;
  private readonly rng = new Xoshiro128(0);
  private readonly f1 = new Float32Array(1);
  private readonly u1 = new Uint32Array(this.f1.buffer);

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
    this.tensors = tensors;
    const r = config.rank;
    const rm = config.markovRank;
    const rd = config.readDims === 0 ? numTaps * hidden : config.readDims;
    const idxView = getTensor(tensors, "backbone.read_index", "I32", [rd]);
    this.readIndex = new Int32Array(rd);
    for (let i = 0; i < rd; i++) {
      const x = idxView.getInt32(i * 4, true);
      if (x < 0 || x >= numTaps * hidden) {
        throw new ReferenceModelError(
          "RM_BAD_WEIGHTS",
          `draft head: backbone.read_index[${i}] = ${x} outside the row`,
        );
      }
      this.readIndex[i] = x;
    }
    this.read = readF32(tensors, "backbone.read", [rd, d]);
    this.initState = readF32(tensors, "backbone.init_state", [d]);
    this.dynU = readF32(tensors, "backbone.dyn_u", [dc, r]);
    this.dynV = readF32(tensors, "backbone.dyn_v", [r, dc]);
    this.clockC = readF32(tensors, "backbone.clock_coupling", [dc, 2]);
    this.rot = readF32(tensors, "backbone.clock_rotation", [2]);
    this.bias = readF32(tensors, "backbone.bias", [dc]);
    this.embed = readF32(tensors, "backbone.embed", [v, dc]);
    this.embedMean = readF32(tensors, "backbone.embed_mean", [dc]);
    this.lmU = readF32(tensors, "backbone.lm_u", [v, L]);
    this.lmM = readF32(tensors, "backbone.lm_m", [L, d]);
    this.lmBias = readF32(tensors, "backbone.lm_bias", [v]);
    this.temps = readF32(tensors, "confidence.temperature", [MAX_DRAFT_POSITIONS]);
    for (let i = 0; i < this.temps.length; i++) {
      if (!(this.temps[i]! > 0)) {
        throw new ReferenceModelError(
          "RM_BAD_WEIGHTS",
          `draft head: confidence.temperature[${i}] is not > 0`,
        );
      }
    }
    this.mIn = readF32(tensors, "markov.in", [v, rm]);
    this.mOut = readF32(tensors, "markov.out", [dc, rm]);
    for (const name of tensors.keys()) {
      if (!KNOWN_TENSORS.has(name))
        throw new ReferenceModelError("RM_BAD_WEIGHTS", `draft head: unknown tensor ${name}`);
    }
    this.drafterIdentity = tensorsIdentity(tensors, DRAFTER_DOMAIN, (n) => !n.startsWith("markov."));
    this.markovIdentity = tensorsIdentity(tensors, MARKOV_DOMAIN, (n) => n.startsWith("markov."));
    this.states = new Float32Array((MAX_DRAFT_POSITIONS + 1) * d);
    this.low = new Float32Array(Math.max(r, rm));
    this.hvec = new Float32Array(L);
    this.pre = new Float32Array(MAX_DRAFT_POSITIONS * dc);
    this.corr = new Float32Array(d);
    this.lastLogits = new Float32Array(MAX_DRAFT_POSITIONS * v);
    this.probs = new Float64Array(v);
    this.ids = new Int32Array(TOP_K_MAX);
    this.kept = new Float64Array(TOP_K_MAX);
  }

  /**
   * Distils a head from `target`: least-squares read-out of the state from the tap rows, rank-
   * `rank` truncation of the recurrence (SVD), Markov head from the linearised effect of the
   * previous token (rank `markovRank`), seeded relative noise on everything, then confidence
   * temperatures fitted on simulated greedy rounds. Deterministic in (target, cfg).
   */
  static distill(target: TargetModel, cfg: DraftConfig): DraftHead {
    const tc = target.config;
    const { vocabSize: v, stateDim: d, numTaps, hidden } = tc;
    const dc = d - 2;
    const rowElems = numTaps * hidden;
    const config = validateDraftConfig(cfg, d, rowElems);
    const w = target.weights;
    const rng = new Xoshiro128(mix32(config.seed ^ 0x5eed0d15));
    const noise = config.noise;
    const ns = DRAFT_NOISE_SHAPE;
    const tensors = new Map<string, SafetensorsTensor>();

    // Read-out: least squares on the chosen row coordinates, pinv = (PᵀP + λI)⁻¹ Pᵀ.
    const rd = config.readDims === 0 ? rowElems : config.readDims;
    const readIndex = new Int32Array(rd);
    for (let i = 0; i < rd; i++) readIndex[i] = rd === rowElems ? i : Math.floor(((i + 0.5) * rowElems) / rd);
    const fan = w.p.length / rowElems;
    const pt = new Float64Array(d * rd);
    for (let i = 0; i < rd; i++) {
      const o = readIndex[i]! * fan;
      for (let f = 0; f < fan; f++) pt[w.pIdx[o + f]! * rd + i] = w.p[o + f]!;
    }
    const ptp = new Float64Array(d * d);
    for (let a = 0; a < d; a++)
      for (let b = 0; b < d; b++) {
        let acc = a === b ? 1e-6 : 0;
        for (let i = 0; i < rd; i++) acc += pt[a * rd + i]! * pt[b * rd + i]!;
        ptp[a * d + b] = acc;
      }
    const pinv = choleskySolve(ptp, d, pt, rd); // d x rd
    const readT = new Float64Array(rd * d);
    for (let i = 0; i < rd; i++) for (let a = 0; a < d; a++) readT[i * d + a] = pinv[a * rd + i]!;
    tensors.set("backbone.read_index", i32Tensor([rd], readIndex));
    tensors.set("backbone.read", f32Tensor([rd, d], noisy(rng, readT, noise * ns.read)));
    tensors.set("backbone.init_state", f32Tensor([d], Float32Array.from(w.s0)));

    // Rank-r recurrence: A ≈ (A V_r) V_rᵀ with V_r the top right singular vectors.
    const ata = new Float64Array(dc * dc);
    for (let i = 0; i < dc; i++)
      for (let a = 0; a < dc; a++) {
        const x = w.a[i * dc + a]!;
        for (let b = 0; b < dc; b++) ata[a * dc + b] = ata[a * dc + b]! + x * w.a[i * dc + b]!;
      }
    const { vectors } = symmetricEigen(ata, dc);
    const r = config.rank;
    const dynU = new Float64Array(dc * r);
    const dynV = new Float64Array(r * dc);
    for (let k = 0; k < r; k++) for (let b = 0; b < dc; b++) dynV[k * dc + b] = vectors[b * dc + k]!;
    for (let i = 0; i < dc; i++)
      for (let k = 0; k < r; k++) {
        let acc = 0;
        for (let b = 0; b < dc; b++) acc += w.a[i * dc + b]! * dynV[k * dc + b]!;
        dynU[i * r + k] = acc;
      }
    tensors.set("backbone.dyn_u", f32Tensor([dc, r], noisy(rng, dynU, noise * ns.dynamics)));
    tensors.set("backbone.dyn_v", f32Tensor([r, dc], Float32Array.from(dynV)));
    tensors.set("backbone.clock_coupling", f32Tensor([dc, 2], noisy(rng, w.c, noise * ns.clock)));
    tensors.set("backbone.clock_rotation", f32Tensor([2], Float32Array.from(w.rot)));
    tensors.set("backbone.bias", f32Tensor([dc], noisy(rng, w.b, noise * ns.bias)));
    const embed = noisy(rng, w.e, noise * ns.embed);
    tensors.set("backbone.embed", f32Tensor([v, dc], embed));
    tensors.set("backbone.lm_u", f32Tensor([v, L], noisy(rng, w.u, noise * ns.lmHead)));
    const lmM = noisy(rng, w.m, noise * ns.lmHead);
    tensors.set("backbone.lm_m", f32Tensor([L, d], lmM));
    tensors.set("backbone.lm_bias", f32Tensor([v], noisy(rng, w.z, noise * ns.lmHead)));

    // Token statistics from greedy rollouts of the target: the mean consumed embedding and the
    // mean tanh derivative, which linearise the effect of the previous token for the Markov head.
    const mean = new Float64Array(dc);
    const gain = new Float64Array(dc);
    const logits = new Float32Array(v);
    const simRng = new Xoshiro128(mix32(config.seed ^ 0x0a11ce));
    let count = 0;
    for (let seq = 0; seq < 16; seq++) {
      const st = target.initialState([simRng.nextInt(v), simRng.nextInt(v), simRng.nextInt(v)]);
      let tok = simRng.nextInt(v);
      for (let i = 0; i < 96; i++) {
        target.forward(st, tok, logits, null, st);
        for (let a = 0; a < dc; a++) {
          mean[a] = mean[a]! + w.e[tok * dc + a]!;
          gain[a] = gain[a]! + 1 - st.vector[a]! * st.vector[a]!;
        }
        count++;
        tok = target.argmax(logits);
      }
    }
    for (let a = 0; a < dc; a++) {
      mean[a] = mean[a]! / count;
      gain[a] = gain[a]! / count;
    }
    tensors.set("backbone.embed_mean", f32Tensor([dc], noisy(rng, mean, noise * ns.bias)));

    // Markov head: the offset of each token's embedding from the mean, truncated to its top
    // principal directions: markov.out · markov.in[t] ≈ E[t] - mean.
    const rm = config.markovRank;
    const delta = new Float64Array(v * dc);
    const cov = new Float64Array(dc * dc);
    for (let t = 0; t < v; t++) {
      for (let a = 0; a < dc; a++) delta[t * dc + a] = embed[t * dc + a]! - mean[a]!;
      for (let a = 0; a < dc; a++) {
        const x = delta[t * dc + a]!;
        for (let b = 0; b < dc; b++) cov[a * dc + b] = cov[a * dc + b]! + x * delta[t * dc + b]!;
      }
    }
    const q = symmetricEigen(cov, dc).vectors;
    const mIn = new Float64Array(v * rm);
    const mOut = new Float64Array(dc * rm);
    for (let a = 0; a < dc; a++) for (let k = 0; k < rm; k++) mOut[a * rm + k] = q[a * dc + k]!;
    for (let t = 0; t < v; t++) {
      for (let k = 0; k < rm; k++) {
        let acc = 0;
        for (let a = 0; a < dc; a++) acc += q[a * dc + k]! * delta[t * dc + a]!;
        mIn[t * rm + k] = acc;
      }
    }
    tensors.set("markov.in", f32Tensor([v, rm], noisy(rng, mIn, noise * ns.markov)));
    tensors.set("markov.out", f32Tensor([dc, rm], noisy(rng, mOut, noise * ns.markov)));

    tensors.set(
      "confidence.temperature",
      f32Tensor([MAX_DRAFT_POSITIONS], new Float32Array(MAX_DRAFT_POSITIONS).fill(1)),
    );
    const geo: Geometry = { vocabSize: v, stateDim: d, numTaps, hidden, targetSeed: tc.seed };
    const raw = new DraftHead(config, geo, tensors);
    if (config.calibrationRounds === 0) return raw;
    const temps = calibrate(target, raw, config);
    tensors.set("confidence.temperature", f32Tensor([MAX_DRAFT_POSITIONS], temps));
    return new DraftHead(config, geo, tensors);
  }

  /** The head's tensors (read-only by convention), as stored in its safetensors file. */
  get weights(): ReadonlyMap<string, SafetensorsTensor> {
    return this.tensors;
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
    const v = this.vocabSize;
    const d = this.stateDim;
    const dc = d - 2;
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

    // Backbone, step 0: state estimate from the last row (or the initial state).
    const states = this.states;
    if (nRows === 0) {
      for (let a = 0; a < d; a++) states[a] = this.initState[a]!;
    } else {
      for (let a = 0; a < d; a++) states[a] = 0;
      const base = (nRows - 1) * rb;
      const idx = this.readIndex;
      const rd = idx.length;
      const read = this.read;
      const f1 = this.f1;
      const u1 = this.u1;
      for (let i = 0; i < rd; i++) {
        const o = base + 2 * idx[i]!;
        u1[0] = (rows[o]! | (rows[o + 1]! << 8)) << 16;
        const x = f1[0]!;
        if (x === 0) continue;
        const ro = i * d;
        for (let a = 0; a < d; a++) states[a] = states[a]! + read[ro + a]! * x;
      }
    }
    // Backbone, steps 1..k: rank-r recurrence; the anchor's embedding, then the mean embedding.
    const r = this.config.rank;
    const low = this.low;
    const { dynU, dynV, clockC, rot, bias, embed, embedMean, pre } = this;
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
    // LM head per position (rank-L read-out); the Markov head adds its correction from the
    // previous drafted token in the same L-dimensional space (a bigram logit bias).
    const rm = this.config.markovRank;
    const { lmU, lmM, lmBias, mIn, mOut } = this;
    const hvec = this.hvec;
    const corr = this.corr;
    const logits = this.lastLogits;
    let prev = anchorToken;
    for (let j = 0; j < k; j++) {
      const lo = j * v;
      let src = states;
      let so = (j + 1) * d;
      if (j > 0) {
        // Markov head: the drafted token's (low-rank) embedding offset replaces the mean
        // embedding in this position's pre-activation.
        const io = prev * rm;
        for (let a = 0; a < dc; a++) {
          let acc = pre[j * dc + a]!;
          const mo = a * rm;
          for (let kk = 0; kk < rm; kk++) acc += mOut[mo + kk]! * mIn[io + kk]!;
          corr[a] = Math.tanh(acc);
        }
        corr[dc] = states[so + dc]!;
        corr[dc + 1] = states[so + dc + 1]!;
        src = corr;
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
      const inv = 1 / this.temps[j]!;
      let z = 0;
      for (let t = 0; t < v; t++) z += expNonPositive((logits[lo + t]! - l1) * inv);
      const conf = 1 / z;
      const oi = out.offset + j;
      out.conf[oi] = Math.min(conf, 1);
      if (out.margin !== null) out.margin[oi] = Math.max(l1 - l2, 0);
      let tok = b1;
      if (sampled) {
        tok = this.sampleAt(lo, j, sample);
        if (sample.sampledMask !== undefined) sample.sampledMask[oi] = 1;
      }
      out.ids[oi] = tok;
      prev = tok;
    }
  }

  private sampleAt(lo: number, j: number, sample: DraftSample): number {
    const v = this.vocabSize;
    const logits = this.lastLogits;
    const probs = this.probs;
    const temp = sample.tempMilli / 1000;
    let max = Number.NEGATIVE_INFINITY;
    for (let t = 0; t < v; t++) if (logits[lo + t]! > max) max = logits[lo + t]!;
    const inv = 1 / temp;
    for (let t = 0; t < v; t++) probs[t] = expNonPositive((logits[lo + t]! - max) * inv);
    const kk = sample.topK;
    const ids = this.ids;
    topK(probs, kk, ids);
    const kept = this.kept;
    for (let i = 0; i < kk; i++) kept[i] = probs[ids[i]!]!;
    const so = sample.offset + j * TOP_K_MAX;
    dyadicQuantize(kept, kk, sample.proposalQ, so);
    for (let i = 0; i < kk; i++) sample.supportIds[so + i] = ids[i]!;
    this.rng.reseed(mix32(mix32(mix32(sample.seed >>> 0) ^ ((sample.position ?? 0) >>> 0)) ^ j));
    const pick = sampleDyadic(sample.proposalQ, kk, this.rng, so);
    return ids[pick]!;
  }

  /** Serialises the head as safetensors bytes (tensors plus geometry and config in `__metadata__`). */
  toSafetensors(): Uint8Array {
    const c = this.config;
    return writeSafetensors(this.tensors, {
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
    const num = (key: string): number => {
      const s = md.get(key);
      const n = s === undefined ? Number.NaN : Number(s);
      if (!Number.isFinite(n))
        throw new ReferenceModelError("RM_BAD_WEIGHTS", `draft head: metadata ${key} missing or invalid`);
      return n;
    };
    let geo: Geometry;
    let config: Required<DraftConfig>;
    try {
      const tc = {
        vocabSize: num("vocab_size"),
        stateDim: num("state_dim"),
        numTaps: num("num_taps"),
        hidden: num("hidden"),
        seed: num("target_seed"),
      } satisfies TargetConfig;
      checkInt("vocab_size", tc.vocabSize, 2, 1 << 20);
      checkInt("state_dim", tc.stateDim, 4, 512);
      checkInt("num_taps", tc.numTaps, 1, 64);
      checkInt("hidden", tc.hidden, 1, 65536);
      geo = {
        vocabSize: tc.vocabSize,
        stateDim: tc.stateDim,
        numTaps: tc.numTaps,
        hidden: tc.hidden,
        targetSeed: tc.seed,
      };
      config = validateDraftConfig(
        {
          window: num("window"),
          numSpec: num("num_spec"),
          rank: num("rank"),
          noise: num("noise"),
          seed: num("seed"),
          markovRank: num("markov_rank"),
          readDims: num("read_dims"),
          calibrationRounds: num("calibration_rounds"),
        },
        tc.stateDim,
        tc.numTaps * tc.hidden,
      );
    } catch (cause) {
      if (cause instanceof ReferenceModelError && cause.code === "RM_BAD_CONFIG") {
        throw new ReferenceModelError("RM_BAD_WEIGHTS", `draft head: ${cause.message}`, { cause });
      }
      throw cause;
    }
    if (target !== undefined) {
      const t = target.config;
      for (const [name, a, b] of [
        ["vocabSize", t.vocabSize, geo.vocabSize],
        ["stateDim", t.stateDim, geo.stateDim],
        ["numTaps", t.numTaps, geo.numTaps],
        ["hidden", t.hidden, geo.hidden],
      ] as const) {
        if (a !== b)
          throw new ReferenceModelError(
            "RM_BAD_WEIGHTS",
            `draft head: ${name} ${b} does not match the target's ${a}`,
          );
      }
    }
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

const KNOWN_TENSORS: ReadonlySet<string> = new Set([
  "backbone.read_index",
  "backbone.read",
  "backbone.init_state",
  "backbone.dyn_u",
  "backbone.dyn_v",
  "backbone.clock_coupling",
  "backbone.clock_rotation",
  "backbone.bias",
  "backbone.embed",
  "backbone.embed_mean",
  "backbone.lm_u",
  "backbone.lm_m",
  "backbone.lm_bias",
  "confidence.temperature",
  "markov.in",
  "markov.out",
]);

/**
 * Fits the per-position confidence temperature: for each position j, over greedy rounds where
 * the drafts before j matched, minimise the Brier score of the top-1 probability against
 * "draft j matched" (golden-section search over log temperature).
 */
function calibrate(target: TargetModel, head: DraftHead, config: Required<DraftConfig>): Float32Array {
  const v = head.vocabSize;
  const n = config.numSpec;
  const samples: { j: number; logits: Float32Array; hit: number }[] = [];
  rollout(
    target,
    head,
    { numSpec: n, rounds: config.calibrationRounds, seed: mix32(config.seed ^ 0xca11b) },
    (j, hit) => {
      const lo = j * v;
      const src = head.lastLogits.subarray(lo, lo + v);
      let max = Number.NEGATIVE_INFINITY;
      for (let t = 0; t < v; t++) if (src[t]! > max) max = src[t]!;
      // Keep only logits that can matter (within 30 of the max) to make the search cheap.
      let m = 0;
      for (let t = 0; t < v; t++) if (src[t]! - max > -30) m++;
      const kept = new Float32Array(m);
      m = 0;
      for (let t = 0; t < v; t++) if (src[t]! - max > -30) kept[m++] = src[t]! - max;
      samples.push({ j, logits: kept, hit: hit ? 1 : 0 });
    },
  );
  const temps = new Float32Array(MAX_DRAFT_POSITIONS).fill(1);
  let last = 1;
  for (let j = 0; j < MAX_DRAFT_POSITIONS; j++) {
    const s = samples.filter((x) => x.j === j);
    if (s.length < 8) {
      temps[j] = last;
      continue;
    }
    const loss = (logT: number): number => {
      const inv = Math.exp(-logT);
      let total = 0;
      for (const x of s) {
        let z = 0;
        for (let t = 0; t < x.logits.length; t++) z += expNonPositive(x.logits[t]! * inv);
        total += (1 / z - x.hit) ** 2;
      }
      return total;
    };
    let a = Math.log(0.05);
    let b = Math.log(50);
    const g = (Math.sqrt(5) - 1) / 2;
    let c = b - g * (b - a);
    let dd = a + g * (b - a);
    let fc = loss(c);
    let fd = loss(dd);
    for (let it = 0; it < 24; it++) {
      if (fc < fd) {
        b = dd;
        dd = c;
        fd = fc;
        c = b - g * (b - a);
        fc = loss(c);
      } else {
        a = c;
        c = dd;
        fc = fd;
        dd = a + g * (b - a);
        fd = loss(dd);
      }
    }
    last = Math.exp((a + b) / 2);
    temps[j] = last;
  }
  return temps;
}

/** Per-round greedy acceptance statistics of {@link measureAcceptance}. */
export interface AcceptanceReport {
  /**
   * Mean accepted length as this package defines it: matched drafts + 1 bonus token per round,
   * i.e. tokens per target forward when every round verifies all `numSpec` drafts.
   */
  meanAcceptedLength: number;
  /** Mean number of drafted tokens per round that matched the target's greedy continuation. */
  meanMatchedDrafts: number;
  /** Rounds measured. */
  rounds: number;
  /** Tokens produced (sum of matched + 1 over rounds). */
  tokens: number;
  /** Per position j: P(draft j matches | drafts before j matched). */
  acceptanceByPosition: number[];
  /** Per position j: mean confidence over the same rounds (compare with acceptanceByPosition). */
  meanConfidenceByPosition: number[];
  /** Distinct tokens among those produced (a sanity check that greedy output is not trivial). */
  distinctTokens: number;
}

/** Options of {@link measureAcceptance}. */
export interface MeasureOptions {
  /** Drafts per round N (1..32; default the head's numSpec). */
  numSpec?: number;
  /** Rounds to measure (default 512). */
  rounds?: number;
  /** Seed of the random prompts, a u32 (default 1). */
  seed?: number;
  /** Window rows handed to the head, 1..4096 (default the head's window). */
  window?: number;
  /** Tokens per sequence before a new random prompt starts, at least 32 (default 256). */
  sequenceLength?: number;
}

/**
 * Measures greedy acceptance the way the harness does: run the target greedily from random
 * prompts; each round, draft N tokens from the window of rows ending at the anchor, compare
 * with the target's greedy continuation, accept the matching prefix plus the bonus token.
 * @throws ReferenceModelError `RM_BAD_CONFIG` naming the first bad option, `RM_BAD_ARGUMENT` when
 *   the head was made for another vocabulary or row size.
 */
export function measureAcceptance(
  target: TargetModel,
  head: DraftHead,
  opts: MeasureOptions = {},
): AcceptanceReport {
  const n = checkInt("numSpec", opts.numSpec ?? head.config.numSpec, 1, MAX_DRAFT_POSITIONS);
  const rounds = checkInt("rounds", opts.rounds ?? 512, 1, 10_000_000);
  const seed = checkInt("seed", opts.seed ?? 1, 0, 0xffffffff);
  const window = checkInt("window", opts.window ?? head.config.window, 1, 4096);
  const sequenceLength = checkInt("sequenceLength", opts.sequenceLength ?? 256, 32, 1_000_000);
  if (head.vocabSize !== target.config.vocabSize || head.rowBytes !== target.rowBytes) {
    throw badArgument(
      `head (vocab ${head.vocabSize}, row_bytes ${head.rowBytes}) does not fit target (vocab ${target.config.vocabSize}, row_bytes ${target.rowBytes})`,
    );
  }
  const hits = new Array<number>(n).fill(0);
  const tries = new Array<number>(n).fill(0);
  const confSum = new Array<number>(n).fill(0);
  const seen = new Set<number>();
  const res = rollout(
    target,
    head,
    {
      numSpec: n,
      rounds,
      seed,
      window,
      sequenceLength,
    },
    (j, hit, conf, token) => {
      tries[j]!++;
      if (hit) hits[j]!++;
      confSum[j]! += conf;
      seen.add(token);
    },
  );
  return {
    meanAcceptedLength: res.tokens / rounds,
    meanMatchedDrafts: res.matched / rounds,
    rounds,
    tokens: res.tokens,
    acceptanceByPosition: hits.map((h, j) => (tries[j]! > 0 ? h / tries[j]! : 0)),
    meanConfidenceByPosition: confSum.map((c, j) => (tries[j]! > 0 ? c / tries[j]! : 0)),
    distinctTokens: seen.size,
  };
}

function rollout(
  target: TargetModel,
  head: DraftHead,
  opts: { numSpec: number; rounds: number; seed: number; window?: number; sequenceLength?: number },
  onPosition: (j: number, hit: boolean, conf: number, targetToken: number) => void,
): { tokens: number; matched: number } {
  const n = opts.numSpec;
  const window = opts.window ?? head.config.window;
  const seqLen = Math.max(opts.sequenceLength ?? 256, 32);
  const rb = target.rowBytes;
  const v = target.config.vocabSize;
  const maxLen = seqLen + 16 + n + 2;
  const rowsBuf = new Uint8Array(maxLen * rb);
  const logits = new Float32Array(v);
  const ids = new Int32Array(n);
  const conf = new Float32Array(n);
  const margin = new Float32Array(n);
  const out: DraftOut = { ids, conf, margin, offset: 0 };
  const rng = new Xoshiro128(opts.seed);
  let tokens = 0;
  let matched = 0;
  let done = 0;
  while (done < opts.rounds) {
    const st: TargetState = target.initialState();
    const promptLen = 4 + rng.nextInt(13);
    let p = 0;
    for (; p < promptLen; p++)
      target.forward(st, rng.nextInt(v), logits, rowsBuf.subarray(p * rb, (p + 1) * rb), st);
    let anchor = target.argmax(logits);
    while (done < opts.rounds && p + n + 1 <= seqLen + 16) {
      const nRows = Math.min(window, p);
      head.draft(rowsBuf.subarray((p - nRows) * rb, p * rb), nRows, anchor, n, out);
      let m = 0;
      let tok = anchor;
      for (;;) {
        target.forward(st, tok, logits, rowsBuf.subarray(p * rb, (p + 1) * rb), st);
        p++;
        const g = target.argmax(logits);
        if (m < n) {
          const hit = ids[m] === g;
          onPosition(m, hit, conf[m]!, g);
          if (hit) {
            m++;
            tok = g;
            continue;
          }
        }
        anchor = g;
        break;
      }
      matched += m;
      tokens += m + 1;
      done++;
    }
  }
  return { tokens, matched };
}

/** Default target + head pair, for examples and tests: `TargetModel.create(DEFAULT_TARGET_CONFIG)`. */
export function createDefaultPair(
  overrides: { target?: Partial<TargetConfig>; draft?: Partial<DraftConfig> } = {},
): {
  target: TargetModel;
  head: DraftHead;
} {
  const target = TargetModel.create({ ...DEFAULT_TARGET_CONFIG, ...overrides.target });
  const head = DraftHead.distill(target, { ...DEFAULT_DRAFT_CONFIG, ...overrides.draft });
  return { target, head };
}
