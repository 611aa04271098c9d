// The draft head's configuration and the shapes of one draft call's arguments (CONTRACT 6.1, 8).
import { badArgument, badConfig, checkInt } from "./errors.js";

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
