/**
 * @tapwire/harness: the serving harness (engine + drafter worker + encoder over real sockets).
 * The bin is `tapwire-harness` (`pnpm start`); these exports exist for its tests.
 */

export type { HarnessConfig, LoadPoint } from "./cli.js";
export { budgetFromCurve, DEFAULTS, helpText, parseArgs, rowBytesOf, SAMPLE_DEFAULTS } from "./cli.js";
export { HarnessError, HarnessErrorCode } from "./errors.js";
export { deriveSeed, mix32, Rng } from "./prng.js";
export type { Placement } from "./scheduler.js";
export { ArrivalQueue, SlotScheduler, serialAdd, serialNewer } from "./scheduler.js";
export type { ChiSquareResult } from "./stattest.js";
export { chiSquareGoodnessOfFit, chiSquareHomogeneity, chiSquareSurvival } from "./stattest.js";
export type { SampledDrafts, VerifySeq } from "./verify.js";
export { argmax, SampleScratch, sampleTarget, softmaxInto, verifyGreedy, verifySampled } from "./verify.js";
export type { RequestSpec } from "./workload.js";
export { makeWorkload, mediaHash } from "./workload.js";
