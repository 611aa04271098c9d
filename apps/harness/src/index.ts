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
} from "./cli/cli.js";
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
} from "./cli/cli.js";
export type { EcMediaOptions } from "./ec/media.js";
export { EcMedia, EcMediaMetrics, LocalMedia, localEmbedding } from "./ec/media.js";
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
} from "./engine/engine.js";
export { Engine, EngineMetrics } from "./engine/engine.js";
export { RoundCoreLink } from "./engine/link.js";
export { checkGreedy, checkSampled, SAMPLED_ALPHA } from "./engine/lossless.js";
export { deriveSeed, mix32, Rng } from "./engine/prng.js";
export type { Placement, SlotSchedulerOptions } from "./engine/scheduler.js";
export { ArrivalQueue, SlotScheduler, serialAdd, serialNewer } from "./engine/scheduler.js";
export {
  conditioningOf,
  decodeTargetOnly,
  embeddingDigest,
  mediaConditioning,
  TargetSequence,
} from "./engine/sequence.js";
export type { ChiSquareResult } from "./engine/stattest.js";
export {
  chiSquareGoodnessOfFit,
  chiSquareHomogeneity,
  chiSquareSurvival,
  gammaQ,
  lnGamma,
} from "./engine/stattest.js";
export type { SampledDrafts, VerifySeq } from "./engine/verify.js";
export {
  argmax,
  DYADIC_ONE,
  SampleScratch,
  sampleTarget,
  softmaxInto,
  TOP_K_STRIDE,
  verifyGreedy,
  verifySampled,
} from "./engine/verify.js";
export type { RequestSpec } from "./engine/workload.js";
export { makeWorkload, mediaHash, STREAM } from "./engine/workload.js";
export { HarnessError, HarnessErrorCode } from "./errors.js";
export type { FaultTargets } from "./faults/faults.js";
export { CORRUPT_OFFSET, FAULT_PLAN, FaultDriver, HOLD_BACK } from "./faults/faults.js";
export type { ChildOptions, LogLine } from "./procs/procs.js";
export { binPath, ChildService } from "./procs/procs.js";
export type { ProgressState } from "./report/progress.js";
export { Progress } from "./report/progress.js";
export type { FaultRecord, LatencySummary, LosslessResult, Report } from "./report/report.js";
export { formatReport } from "./report/report.js";
export type { RunHooks, RunResult } from "./run.js";
export { CORRUPT_ENV, EC_BLOCK_BYTES, ENCODE_DELAY_MS, runHarness } from "./run.js";
