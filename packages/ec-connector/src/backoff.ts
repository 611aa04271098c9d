/** The policy of a {@link Backoff}: the shape of `@tapwire/client`'s `BackoffOptions`, all required. */
export interface BackoffPolicy {
  /** First delay, ms. */
  readonly initialMs: number;
  /** Largest delay, ms. */
  readonly maxMs: number;
  /** Growth factor per failure (>= 1). */
  readonly multiplier: number;
}

/**
 * Exponential backoff with the shape of `@tapwire/client`'s `Backoff` (`initialMs`, `maxMs`,
 * `multiplier`, `current`, `next()`, `reset()`), kept local because this package does not depend
 * on the client. The delay starts at `initialMs`, grows by `multiplier` per failure and never
 * exceeds `maxMs`. The caller validates the policy (it names its own options).
 */
export class Backoff implements BackoffPolicy {
  readonly initialMs: number;
  readonly maxMs: number;
  readonly multiplier: number;
  #current: number;

  constructor(policy: BackoffPolicy) {
    this.initialMs = policy.initialMs;
    this.maxMs = policy.maxMs;
    this.multiplier = policy.multiplier;
    this.#current = policy.initialMs;
  }

  /** The delay the next failure will wait, ms. */
  get current(): number {
    return Math.min(this.#current, this.maxMs);
  }

  /** Returns the delay to wait after a failure and grows the next one. */
  next(): number {
    const d = this.current;
    this.#current = Math.min(this.#current * this.multiplier, this.maxMs);
    return d;
  }

  /** Back to `initialMs`. */
  reset(): void {
    this.#current = this.initialMs;
  }
}
