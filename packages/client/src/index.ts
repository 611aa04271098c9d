/**
 * `@tapwire/client`: the rank-0 side of the tapwire remote drafter link (CONTRACT 6, 7.5, 9):
 * {@link RemoteDraftClient}, {@link WorkerPool} (CONTRACT 12.2), the per-round {@link RoundCore}
 * over either (one {@link DraftLink}), and confidence-scheduled
 * verification ({@link DepthPolicy}: for a budget, or for goodput with a
 * {@link VerifyCostModel} and an online {@link ConfidenceCalibrator}).
 * @packageDocumentation
 */

export type { BackoffOptions } from "./backoff.js";
export { BACKOFF_DEFAULTS, Backoff } from "./backoff.js";
export type { CalibrationReport, ConfidenceCalibratorOptions } from "./calibration.js";
export { ConfidenceCalibrator } from "./calibration.js";
export type { ConnState, StepCall, WorkerInfo } from "./client.js";
export { CONN_STATES, RemoteDraftClient } from "./client.js";
export type { Clock } from "./clock.js";
export { clampDelay, MAX_TIMER_DELAY_MS, systemClock } from "./clock.js";
export type { VerifyCostModelOptions, VerifyCostParams } from "./cost-model.js";
export { H100_8B_COST, VerifyCostModel } from "./cost-model.js";
export type { DepthCandidate, DepthPolicyOptions, VerifyCost } from "./depth-policy.js";
export { DepthPolicy, expectedAccepted } from "./depth-policy.js";
export type { ClientErrorCode } from "./errors.js";
export { CLIENT_ERROR_CODES, ClientError } from "./errors.js";
export type { LoadCurve, LoadCurvePoint } from "./load-curve.js";
export { piecewiseLinearBudget } from "./load-curve.js";
export type { MemberSource, PoolMemberCompat, PoolMemberInfo } from "./members.js";
export { staticMembers } from "./members.js";
export type { RemoteDraftClientOptions, ResolvedClientOptions, TransportFactory } from "./options.js";
export { CLIENT_DEFAULTS, SAMPLE_MODES } from "./options.js";
export type { OutcomeReaction, StepOutcome, StepOutcomeReason } from "./outcomes.js";
export { STEP_OUTCOMES } from "./outcomes.js";
export type { PoolMemberStats, WorkerPoolOptions } from "./pool.js";
export { WorkerPool } from "./pool.js";
export { RoundCore } from "./round-core.js";
export type {
  DraftLink,
  DraftReason,
  RoundClient,
  RoundCoreOptions,
  RoundDraft,
  RoundInput,
  RoundRequest,
  RoundResult,
  SlotView,
} from "./round-types.js";
export type { SpecDecodeMetricsOptions, SpecDecodeSnapshot } from "./spec-decode-metrics.js";
export { SPEC_DECODE_DEFAULTS, SpecDecodeMetrics } from "./spec-decode-metrics.js";
