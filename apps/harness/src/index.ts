/**
 * @tapwire/harness (private): the serving harness (engine + drafter worker + encoder over real
 * sockets). The bin is `tapwire-harness` (`pnpm start`); these exports serve its tests and anyone
 * embedding a run programmatically (`runHarness(parseArgs([...]).config)`).
 * @packageDocumentation
 */

export type {
  DraftTransport,
  EcDataPlane,
  HarnessConfig,
  LoadPoint,
  ParseResult,
  ProgressMode,
} from "./cli.js";
export {
  budgetFromCurve,
  DEFAULTS,
  DRAFT_TRANSPORTS,
  EC_DATA_PLANES,
  FAULT_DEFAULTS,
  helpText,
  parseArgs,
  parseLoadCurve,
  rowBytesOf,
  SAMPLE_DEFAULTS,
} from "./cli.js";
export type {
  DraftLink,
  EngineOptions,
  EngineResult,
  EntrySample,
  LinkDrafts,
  LinkRequest,
  LinkRound,
  MediaReady,
  MediaSource,
  RoundHook,
} from "./engine.js";
export { Engine, EngineMetrics } from "./engine.js";
export { HarnessError, HarnessErrorCode } from "./errors.js";
export type { FaultTargets } from "./faults.js";
export { CORRUPT_OFFSET, FAULT_PLAN, FaultDriver, HOLD_BACK } from "./faults.js";
export { RoundCoreLink } from "./link.js";
export { checkGreedy, checkSampled, SAMPLED_ALPHA } from "./lossless.js";
export type { EcMediaOptions } from "./media.js";
export { EcMedia, EcMediaMetrics, LocalMedia, localEmbedding } from "./media.js";
export { deriveSeed, mix32, Rng } from "./prng.js";
export type { ChildOptions, LogLine } from "./procs.js";
export { binPath, ChildService } from "./procs.js";
export type { ProgressState } from "./progress.js";
export { Progress } from "./progress.js";
export type { FaultRecord, LatencySummary, LosslessResult, Report } from "./report.js";
export { formatReport } from "./report.js";
export type { RunHooks, RunResult } from "./run.js";
export { CORRUPT_ENV, EC_BLOCK_BYTES, ENCODE_DELAY_MS, runHarness } from "./run.js";
export type { Placement, SlotSchedulerOptions } from "./scheduler.js";
export { ArrivalQueue, SlotScheduler, serialAdd, serialNewer } from "./scheduler.js";
export {
  conditioningOf,
  decodeTargetOnly,
  embeddingDigest,
  mediaConditioning,
  TargetSequence,
} from "./sequence.js";
export type { ChiSquareResult } from "./stattest.js";
export {
  chiSquareGoodnessOfFit,
  chiSquareHomogeneity,
  chiSquareSurvival,
  gammaQ,
  lnGamma,
} from "./stattest.js";
export type { SampledDrafts, VerifySeq } from "./verify.js";
export {
  argmax,
  DYADIC_ONE,
  SampleScratch,
  sampleTarget,
  softmaxInto,
  TOP_K_STRIDE,
  verifyGreedy,
  verifySampled,
} from "./verify.js";
export type { RequestSpec } from "./workload.js";
export { makeWorkload, mediaHash, STREAM } from "./workload.js";
