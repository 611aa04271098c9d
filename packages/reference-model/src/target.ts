/**
 * The reference target language model: a small recurrent model with a quasi-periodic clock, whose
 * next-token logits are a linear read-out of the state and whose tap rows are fixed projections
 * of the state (CONTRACT 2: a row is `num_taps` tap vectors of `hidden` bf16 values).
 *
 * State `s = [x; c]` with `x` the content (`stateDim - 2` dims) and `c` a 2-d clock:
 *   c' = R(θ) c                                   (rotation by an irrational-ish angle)
 *   x' = tanh(A x + C c' + E[token] + b)
 *   logits = U (M s') + z                         (a rank-L read-out: U is vocab x L, M is L x stateDim)
 *   tap value i = Σ_f P[i,f] s'[idx[i,f]]         (each tap value mixes `tapFanIn` state dims)
 * The clock makes greedy decoding quasi-periodic rather than periodic, while every token stays a
 * deterministic function of the state.
 */
import { createHash } from "node:crypto";
import { badArgument, checkInt } from "./errors.js";
import { Xoshiro128 } from "./prng.js";
import { argmax } from "./sampling.js";

/** Geometry and seed of a {@link TargetModel}. */
export interface TargetConfig {
  /** Vocabulary size (2..1,048,576; default 2048). */
  vocabSize: number;
  /** Recurrent state dimensions, clock included (4..512; default 48). */
  stateDim: number;
  /** Number of tap vectors per row (1..64; default 3). */
  numTaps: number;
  /** Values per tap vector (1..65,536; default 1024). A row is `numTaps * hidden * 2` bytes. */
  hidden: number;
  /** Seed of every weight (u32). */
  seed: number;
}

/** Default target geometry: vocab 2048, state 48, rows of 3 x 1024 bf16, seed 1. */
export const DEFAULT_TARGET_CONFIG: Readonly<TargetConfig> = Object.freeze({
  vocabSize: 2048,
  stateDim: 48,
  numTaps: 3,
  hidden: 1024,
  seed: 1,
});

/** Fixed dynamics constants of the target (documented in docs/reference-model.md). */
export const TARGET_DYNAMICS = {
  /** Spectral scale of A (contraction of the content state). */
  recurrence: 1.6,
  /** Standard deviation of token embeddings E. */
  embedding: 0.9,
  /** Decay constant of the embeddings' singular values (in directions). */
  embeddingDecay: 6,
  /** Standard deviation of the clock coupling C. */
  clockCoupling: 0.7,
  /** Standard deviation of the bias b. */
  bias: 0.2,
  /** Clock amplitude. */
  clockAmplitude: 1.5,
  /** Rank L of the read-out U M (the logits live in an L-dimensional subspace). */
  readoutRank: 16,
  /** Standard deviation of the logits' scale (entries of U are N(0, 1), M is scaled so U M s has this std per unit state). */
  readout: 0.8,
  /** State dims mixed into each tap value. */
  tapFanIn: 8,
  /** Zipf-like prior: logit bias `-zipf * ln(1 + rank)`. */
  zipf: 0.35,
  /** Standard deviation of the state perturbation derived from `extra` bytes. */
  extraPerturbation: 1.0,
} as const;

/** A target state: the state vector and the number of tokens consumed. */
export interface TargetState {
  /** `[x; c]`, `stateDim` floats. */
  readonly vector: Float32Array;
  /** Tokens consumed so far (the position of the next token). */
  position: number;
}

/** Read-only weights of a target (used by the draft head's distillation). */
export interface TargetWeights {
  /** Content recurrence, (stateDim-2) x (stateDim-2), row-major. */
  readonly a: Float32Array;
  /** Clock coupling, (stateDim-2) x 2. */
  readonly c: Float32Array;
  /** Bias, stateDim-2. */
  readonly b: Float32Array;
  /** Token embeddings, vocab x (stateDim-2). */
  readonly e: Float32Array;
  /** Clock rotation `[cos θ, sin θ]`. */
  readonly rot: Float32Array;
  /** Read-out token factor U, vocab x L. */
  readonly u: Float32Array;
  /** Read-out state factor M, L x stateDim. */
  readonly m: Float32Array;
  /** Logit bias, vocab. */
  readonly z: Float32Array;
  /** Tap weights, (numTaps*hidden) x tapFanIn. */
  readonly p: Float32Array;
  /** Tap state indices, (numTaps*hidden) x tapFanIn. */
  readonly pIdx: Int32Array;
  /** Initial state, stateDim. */
  readonly s0: Float32Array;
}

function gaussians(rng: Xoshiro128, n: number, std: number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = rng.nextGaussian() * std;
  return a;
}

/** Validates a target configuration, naming the first bad option. */
export function validateTargetConfig(cfg: TargetConfig): TargetConfig {
  if (cfg === null || typeof cfg !== "object") throw badArgument("target config must be an object");
  return {
    vocabSize: checkInt("vocabSize", cfg.vocabSize, 2, 1 << 20),
    stateDim: checkInt("stateDim", cfg.stateDim, 4, 512),
    numTaps: checkInt("numTaps", cfg.numTaps, 1, 64),
    hidden: checkInt("hidden", cfg.hidden, 1, 65536),
    seed: checkInt("seed", cfg.seed, 0, 0xffffffff),
  };
}

/** The reference target model. Create with {@link TargetModel.create}. */
export class TargetModel {
  /** The validated configuration. */
  readonly config: Readonly<TargetConfig>;
  /** Weights (read-only by convention). */
  readonly weights: TargetWeights;
  /** Bytes of one tap row: `numTaps * hidden * 2`. */
  readonly rowBytes: number;
  readonly #dc: number;
  readonly #scratch: Float32Array;
  readonly #hid = new Float32Array(TARGET_DYNAMICS.readoutRank);
  readonly #fan: number;
  readonly #rowF: Float32Array;
  readonly #rowBits: Uint32Array;

  private constructor(config: TargetConfig, weights: TargetWeights) {
    this.config = Object.freeze({ ...config });
    this.weights = weights;
    this.rowBytes = config.numTaps * config.hidden * 2;
    this.#dc = config.stateDim - 2;
    this.#scratch = new Float32Array(config.stateDim);
    this.#fan = Math.min(TARGET_DYNAMICS.tapFanIn, config.stateDim);
    this.#rowF = new Float32Array(config.numTaps * config.hidden);
    this.#rowBits = new Uint32Array(this.#rowF.buffer);
  }

  /** Builds a target whose weights are a deterministic function of `cfg` (throws RM_BAD_CONFIG). */
  static create(cfg: TargetConfig): TargetModel {
    const config = validateTargetConfig(cfg);
    const { vocabSize: v, stateDim: d, numTaps, hidden } = config;
    const dc = d - 2;
    const k = TARGET_DYNAMICS;
    const rng = new Xoshiro128(config.seed ^ 0x7a79e7);
    const a = gaussians(rng, dc * dc, k.recurrence / Math.sqrt(dc));
    const c = gaussians(rng, dc * 2, k.clockCoupling);
    const b = gaussians(rng, dc, k.bias);
    // Embeddings with a decaying spectrum (singular values ∝ exp(-i / embeddingDecay)), as in
    // trained models: a few directions carry most of a token's effect.
    const z0 = gaussians(rng, v * dc, 1);
    const basis = gaussians(rng, dc * dc, 1 / Math.sqrt(dc));
    const e = new Float32Array(v * dc);
    const decay = new Float64Array(dc);
    for (let i = 0; i < dc; i++) decay[i] = Math.exp(-i / k.embeddingDecay);
    let sq = 0;
    for (let t = 0; t < v; t++)
      for (let a = 0; a < dc; a++) {
        let acc = 0;
        for (let i = 0; i < dc; i++) acc += z0[t * dc + i]! * decay[i]! * basis[i * dc + a]!;
        e[t * dc + a] = acc;
        sq += acc * acc;
      }
    const scale = k.embedding / Math.sqrt(sq / (v * dc));
    for (let i = 0; i < e.length; i++) e[i] = e[i]! * scale;
    const theta = 2 * Math.PI * (0.05 + 0.2 * rng.nextFloat()) + Math.SQRT2 * 1e-3;
    const rot = Float32Array.of(Math.cos(theta), Math.sin(theta));
    const l = k.readoutRank;
    const u = gaussians(rng, v * l, 1);
    const m = gaussians(rng, l * d, k.readout / Math.sqrt(l));
    const z = new Float32Array(v);
    // Zipf-like prior over a random permutation of the vocabulary.
    const perm = Array.from({ length: v }, (_, i) => i);
    for (let i = v - 1; i > 0; i--) {
      const j = rng.nextInt(i + 1);
      const t = perm[i]!;
      perm[i] = perm[j]!;
      perm[j] = t;
    }
    for (let r = 0; r < v; r++) z[perm[r]!] = -k.zipf * Math.log(1 + r);
    const fan = Math.min(k.tapFanIn, d);
    const p = gaussians(rng, numTaps * hidden * fan, 1 / Math.sqrt(fan));
    const pIdx = new Int32Array(numTaps * hidden * fan);
    for (let i = 0; i < numTaps * hidden; i++) {
      // fan distinct state dims per tap value (partial Fisher-Yates over a small pool).
      const pool = Array.from({ length: d }, (_, j) => j);
      for (let f = 0; f < fan; f++) {
        const j = f + rng.nextInt(d - f);
        const t = pool[f]!;
        pool[f] = pool[j]!;
        pool[j] = t;
        pIdx[i * fan + f] = pool[f]!;
      }
    }
    const s0 = new Float32Array(d);
    for (let i = 0; i < dc; i++) s0[i] = Math.tanh(rng.nextGaussian() * 0.5);
    s0[dc] = k.clockAmplitude;
    s0[dc + 1] = 0;
    return new TargetModel(config, { a, c, b, e, rot, u, m, z, p, pIdx, s0 });
  }

  /** A new state vector holding a copy of `state`. */
  cloneState(state: TargetState): TargetState {
    return { vector: Float32Array.from(state.vector), position: state.position };
  }

  /** Copies `src` into `dst` (no allocation); returns `dst`. */
  copyState(src: TargetState, dst: TargetState): TargetState {
    dst.vector.set(src.vector);
    dst.position = src.position;
    return dst;
  }

  /**
   * The state after consuming `promptTokens`, starting from the model's initial state,
   * optionally conditioned on `extra` (e.g. the bytes of a multimodal embedding): the SHA-256 of
   * its bytes seeds a perturbation of the content state and the clock phase, so any change of
   * any byte changes the continuation. Prompt tokens produce no rows here; to obtain the prompt's
   * rows, start from `initialState([], extra)` and {@link forward} each prompt token.
   */
  initialState(promptTokens: readonly number[] = [], extra?: ArrayBufferView): TargetState {
    const dc = this.#dc;
    const vector = Float32Array.from(this.weights.s0);
    if (extra !== undefined) {
      const bytes = new Uint8Array(extra.buffer, extra.byteOffset, extra.byteLength);
      const digest = createHash("sha256").update(bytes).digest();
      const rng = new Xoshiro128(digest.readUInt32LE(0) ^ digest.readUInt32LE(4));
      for (let i = 0; i < dc; i++) {
        vector[i] = Math.tanh(vector[i]! + rng.nextGaussian() * TARGET_DYNAMICS.extraPerturbation);
      }
      const phase = 2 * Math.PI * (digest.readUInt32LE(8) / 4294967296);
      vector[dc] = TARGET_DYNAMICS.clockAmplitude * Math.cos(phase);
      vector[dc + 1] = TARGET_DYNAMICS.clockAmplitude * Math.sin(phase);
    }
    const state: TargetState = { vector, position: 0 };
    for (const t of promptTokens) this.advance(state, t);
    return state;
  }

  /** Consumes `token` into `state` in place (no logits, no row). Returns `state`. */
  advance(state: TargetState, token: number): TargetState {
    this.#step(state.vector, token, state.vector);
    state.position++;
    return state;
  }

  /**
   * Consumes `token` from `state`: writes the logits of the next token into `outLogits`
   * (vocabSize floats) and the tap row of `token` into `outRow` (`rowBytes` bf16 bytes, little-
   * endian; skipped when null). The new state goes to `outState` when given (it may be `state`
   * itself, for in-place stepping without allocation), else to a new state object. Returns the
   * new state. Throws RM_BAD_ARGUMENT for a token outside the vocabulary or short buffers.
   */
  forward(
    state: TargetState,
    token: number,
    outLogits: Float32Array,
    outRow: Uint8Array | null,
    outState?: TargetState,
  ): TargetState {
    const { vocabSize: v, stateDim: d, numTaps, hidden } = this.config;
    if (outLogits.length < v) throw badArgument(`forward: outLogits has ${outLogits.length} < ${v} slots`);
    if (outRow !== null && outRow.length < this.rowBytes) {
      throw badArgument(`forward: outRow has ${outRow.length} < ${this.rowBytes} bytes`);
    }
    const next = outState ?? { vector: new Float32Array(d), position: 0 };
    const s = next.vector;
    this.#step(state.vector, token, s);
    next.position = state.position + 1;
    const { u, m, z, p, pIdx } = this.weights;
    const l = TARGET_DYNAMICS.readoutRank;
    const h = this.#hid;
    for (let i = 0; i < l; i++) {
      let acc = 0;
      const o = i * d;
      for (let j = 0; j < d; j++) acc += m[o + j]! * s[j]!;
      h[i] = acc;
    }
    lowRankLogits(u, h, z, v, outLogits, 0);
    if (outRow !== null) {
      const n = numTaps * hidden;
      const fan = this.#fan;
      const rowF = this.#rowF;
      if (fan === 8) {
        for (let i = 0; i < n; i++) {
          const o = i * 8;
          rowF[i] =
            p[o]! * s[pIdx[o]!]! +
            p[o + 1]! * s[pIdx[o + 1]!]! +
            p[o + 2]! * s[pIdx[o + 2]!]! +
            p[o + 3]! * s[pIdx[o + 3]!]! +
            (p[o + 4]! * s[pIdx[o + 4]!]! +
              p[o + 5]! * s[pIdx[o + 5]!]! +
              p[o + 6]! * s[pIdx[o + 6]!]! +
              p[o + 7]! * s[pIdx[o + 7]!]!);
        }
      } else {
        for (let i = 0; i < n; i++) {
          let acc = 0;
          const o = i * fan;
          for (let j = 0; j < fan; j++) acc += p[o + j]! * s[pIdx[o + j]!]!;
          rowF[i] = acc;
        }
      }
      // bf16 round to nearest even, from the f32 bits of the row values (NaN cannot occur:
      // the state is bounded and the weights finite).
      const bits = this.#rowBits;
      for (let i = 0; i < n; i++) {
        const b = bits[i]!;
        const h = (b + 0x7fff + ((b >>> 16) & 1)) >>> 16;
        outRow[2 * i] = h & 0xff;
        outRow[2 * i + 1] = h >>> 8;
      }
    }
    return next;
  }

  /** Greedy choice: index of the largest logit (lowest index on ties). */
  argmax(logits: Float32Array): number {
    return argmax(logits, 0, this.config.vocabSize);
  }

  /** One recurrence step from `src` to `dst` (may alias; uses scratch). */
  #step(src: Float32Array, token: number, dst: Float32Array): void {
    const v = this.config.vocabSize;
    if (!Number.isInteger(token) || token < 0 || token >= v) {
      throw badArgument(`forward: token ${token} outside [0, ${v})`);
    }
    const dc = this.#dc;
    const { a, c, b, e, rot } = this.weights;
    const t = this.#scratch;
    const c0 = src[dc]!;
    const c1 = src[dc + 1]!;
    const n0 = rot[0]! * c0 - rot[1]! * c1;
    const n1 = rot[1]! * c0 + rot[0]! * c1;
    const eo = token * dc;
    for (let i = 0; i < dc; i++) {
      let acc = b[i]! + e[eo + i]! + c[2 * i]! * n0 + c[2 * i + 1]! * n1;
      const o = i * dc;
      for (let j = 0; j < dc; j++) acc += a[o + j]! * src[j]!;
      t[i] = Math.tanh(acc);
    }
    for (let i = 0; i < dc; i++) dst[i] = t[i]!;
    dst[dc] = n0;
    dst[dc + 1] = n1;
  }
}

/**
 * `out[off + t] = z[t] + Σ_i u[t * 16 + i] * h[i]` for t < v, with L = 16 fixed (unrolled by 4).
 * @internal
 */
export function lowRankLogits(
  u: Float32Array,
  h: Float32Array,
  z: Float32Array,
  v: number,
  out: Float32Array,
  off: number,
): void {
  const h0 = h[0]!;
  const h1 = h[1]!;
  const h2 = h[2]!;
  const h3 = h[3]!;
  const h4 = h[4]!;
  const h5 = h[5]!;
  const h6 = h[6]!;
  const h7 = h[7]!;
  const h8 = h[8]!;
  const h9 = h[9]!;
  const h10 = h[10]!;
  const h11 = h[11]!;
  const h12 = h[12]!;
  const h13 = h[13]!;
  const h14 = h[14]!;
  const h15 = h[15]!;
  for (let t = 0; t < v; t++) {
    const o = t * 16;
    const a0 = u[o]! * h0 + u[o + 1]! * h1 + u[o + 2]! * h2 + u[o + 3]! * h3;
    const a1 = u[o + 4]! * h4 + u[o + 5]! * h5 + u[o + 6]! * h6 + u[o + 7]! * h7;
    const a2 = u[o + 8]! * h8 + u[o + 9]! * h9 + u[o + 10]! * h10 + u[o + 11]! * h11;
    const a3 = u[o + 12]! * h12 + u[o + 13]! * h13 + u[o + 14]! * h14 + u[o + 15]! * h15;
    out[off + t] = z[t]! + a0 + a1 + a2 + a3;
  }
}
