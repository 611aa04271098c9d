/**
 * The time source of the client: monotonic milliseconds and one-shot timers. Injectable so that
 * backoff and log cadence can be tested with a fake clock.
 */
export interface Clock {
  /** Monotonic milliseconds. */
  now(): number;
  /** Schedules `fn` after `ms` milliseconds; the real clock unrefs the timer. */
  setTimeout(fn: () => void, ms: number): unknown;
  /** Cancels a timer returned by {@link Clock.setTimeout}. */
  clearTimeout(handle: unknown): void;
}

/** Largest delay a Node timer accepts (2^31 - 1 ms); longer delays fire at once. */
export const MAX_TIMER_DELAY_MS = 2 ** 31 - 1;

/** Clamps a delay to `[0, 2^31 - 1]` milliseconds. */
export function clampDelay(ms: number): number {
  if (!(ms > 0)) return 0;
  return Math.min(ms, MAX_TIMER_DELAY_MS);
}

/** The real clock: `performance.now()` and unref'd Node timers (they never keep a process alive). */
export const systemClock: Clock = {
  now: () => performance.now(),
  setTimeout(fn, ms) {
    const t = setTimeout(fn, clampDelay(ms));
    t.unref();
    return t;
  },
  clearTimeout(handle) {
    clearTimeout(handle as ReturnType<typeof setTimeout>);
  },
};
