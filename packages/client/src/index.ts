export type { BackoffOptions } from "./backoff.js";
export { BACKOFF_DEFAULTS, Backoff } from "./backoff.js";
export type { Clock } from "./clock.js";
export { clampDelay, MAX_TIMER_DELAY_MS, systemClock } from "./clock.js";
export type { DepthCandidate, DepthPolicyOptions, LoadCurve, LoadCurvePoint } from "./depth-policy.js";
export { DepthPolicy, expectedAccepted, piecewiseLinearBudget } from "./depth-policy.js";
export type { ClientErrorCode } from "./errors.js";
export { CLIENT_ERROR_CODES, ClientError } from "./errors.js";
