export { measureAcceptance } from "./acceptance.js";
export { bf16ToF32, decodeBf16, encodeBf16, f32BitsToBf16, f32ToBf16 } from "./bf16.js";
export { createDefaultPair, DraftHead } from "./draft.js";
export {
  DEFAULT_DRAFT_CONFIG,
  DRAFT_NOISE_SHAPE,
  MAX_DRAFT_POSITIONS,
  validateDraftConfig,
} from "./draft-config.js";
export { ReferenceModelError, ReferenceModelErrorCode } from "./errors.js";
export { tensorsIdentity } from "./identity.js";
export { mix32, mixSeed, Xoshiro128 } from "./prng.js";
export {
  readSafetensors,
  SAFETENSORS_DTYPE_SIZES,
  SAFETENSORS_MAX_HEADER,
  writeSafetensors,
} from "./safetensors.js";
export {
  argmax,
  DYADIC_ONE,
  dyadicQuantize,
  expNonPositive,
  rejectionSample,
  sampleDyadic,
  sampleIndex,
  softmax,
  TOP_K_MAX,
  targetDistribution,
  topK,
} from "./sampling.js";
export { DEFAULT_TARGET_CONFIG, TARGET_DYNAMICS, TargetModel, validateTargetConfig } from "./target.js";

/** The npm name of this package. */
export const PACKAGE_NAME = "@tapwire/reference-model";

export type { AcceptanceReport, MeasureOptions } from "./acceptance.js";
export type { DraftConfig, DraftOut, DraftSample } from "./draft-config.js";
export type { ReferenceModelErrorCode as ReferenceModelErrorCodeValue } from "./errors.js";
export type { ReadSafetensorsOptions, SafetensorsDtype, SafetensorsTensor } from "./safetensors.js";
export type { RejectionResult } from "./sampling.js";
export type { TargetConfig, TargetState, TargetWeights } from "./target.js";
