import { finiteAtLeast } from "./check.js";
import { ClientError } from "./errors.js";

/** Defaults of the reconnect backoff (CONTRACT 9.1). */
export const BACKOFF_DEFAULTS = {
  /** First delay after a failure, ms. */
  initialMs: 5_000,
  /** Ceiling of the doubling, ms. */
  maxMs: 60_000,
  /** Growth factor per failure. */
  multiplier: 2,
} as const;

/** Options of {@link Backoff}. */
export interface BackoffOptions {
  /** First delay, ms (default {@link BACKOFF_DEFAULTS}.initialMs). */
  initialMs?: number;
  /** Largest delay, ms (default {@link BACKOFF_DEFAULTS}.maxMs); must be >= initialMs. */
  maxMs?: number;
  /** Growth factor (default 2), >= 1. */
  multiplier?: number;
}

/**
 * Exponential backoff policy (CONTRACT 9.1): the delay starts at `initialMs`, is multiplied by
 * `multiplier` after every failure up to `maxMs`, and is reset by a success. No jitter: one
 * client talks to one worker, there is no herd to spread.
 */
export class Backoff {
  /** First delay in ms. */
  readonly initialMs: number;
  /** Largest delay in ms. */
  readonly maxMs: number;
  /** Growth factor per failure (>= 1). */
  readonly multiplier: number;
  #current: number;

  constructor(options: BackoffOptions = {}) {
    const initialMs = options.initialMs ?? BACKOFF_DEFAULTS.initialMs;
    const maxMs = options.maxMs ?? BACKOFF_DEFAULTS.maxMs;
    const multiplier = options.multiplier ?? BACKOFF_DEFAULTS.multiplier;
    finiteAtLeast("backoffMs", initialMs, 0);
    if (!Number.isFinite(maxMs) || maxMs < initialMs) {
      throw new ClientError(
        "CLIENT_BAD_OPTION",
        `backoffMaxMs must be finite and >= backoffMs, got ${maxMs}`,
      );
    }
    if (!Number.isFinite(multiplier) || multiplier < 1) {
      throw new ClientError("CLIENT_BAD_OPTION", `backoff multiplier must be >= 1, got ${multiplier}`);
    }
    this.initialMs = initialMs;
    this.maxMs = maxMs;
    this.multiplier = multiplier;
    this.#current = initialMs;
  }

  /** The delay the next failure will wait, ms. */
  get current(): number {
    return this.#current;
  }

  /** Returns the delay to wait after a failure and grows the next one. */
  next(): number {
    const d = this.#current;
    this.#current = Math.min(this.#current * this.multiplier, this.maxMs);
    return d;
  }

  /** Back to `initialMs` (after a successful HELLO). */
  reset(): void {
    this.#current = this.initialMs;
  }
}
