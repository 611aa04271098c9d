// The metadata of a draft head's safetensors file: its format tag, and the geometry and
// configuration read back from it (RM_BAD_WEIGHTS when missing, invalid or not the target's).
import { type DraftConfig, validateDraftConfig } from "./draft-config.js";
import type { Geometry } from "./draft-tensors.js";
import { checkInt, ReferenceModelError } from "./errors.js";
import type { TargetConfig, TargetModel } from "./target.js";

/** The `format` of a head file's `__metadata__` (with `version` "1"). */
export const FORMAT = "tapwire-reference-draft-head";

/**
 * The geometry and configuration in a head file's metadata `md`; with `target`, the geometry
 * must be the target's (vocab, state, taps, hidden).
 */
export function headGeometry(
  md: ReadonlyMap<string, string>,
  target?: TargetModel,
): { geo: Geometry; config: Required<DraftConfig> } {
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
  return { geo, config };
}
