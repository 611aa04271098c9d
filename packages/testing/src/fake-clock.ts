import { TestingError, TestingErrorCode } from "./errors.js";

/** A timer handle of {@link FakeClock}, shaped like Node's `Timeout` where tests touch it. */
export interface FakeTimer {
  /** Unique id; `+timer` gives it too. */
  readonly id: number;
  /** No-op besides the flag (a fake timer never keeps a process alive); returns the timer. */
  ref(): FakeTimer;
  /** No-op besides the flag; returns the timer. */
  unref(): FakeTimer;
  /** Whether `ref()` was called last (true at creation, like Node). */
  hasRef(): boolean;
  /** Restarts the timer from the clock's current time with its original delay. */
  refresh(): FakeTimer;
  [Symbol.toPrimitive](): number;
}

interface Entry {
  timer: FakeTimer;
  due: number;
  seq: number;
  delay: number;
  repeat: boolean;
  fn: (...args: unknown[]) => void;
  args: unknown[];
}

const TIMEOUT_MAX = 2 ** 31 - 1;

/** Node's delay rule: anything not in [1, 2^31 - 1] becomes 1 ms. */
function normaliseDelay(ms: unknown): number {
  const n = Number(ms);
  return n >= 1 && n <= TIMEOUT_MAX ? n : 1;
}

/**
 * A manual clock for unit tests of one state machine (backoff, timeouts, log cadence). `now()`
 * only moves through {@link FakeClock.advance} / {@link FakeClock.runAll}; timers fire in order
 * of due time, then creation order, each with `now()` equal to its due time, including timers
 * that callbacks schedule while the clock advances. Methods are bound, so
 * `const { setTimeout } = clock` works, and the object satisfies a
 * `{ now(); setTimeout(fn, ms); clearTimeout(h) }` clock interface.
 */
export class FakeClock {
  private current: number;
  private seq = 0;
  private nextId = 1;
  private readonly entries = new Map<number, Entry>();

  /** @param startMs initial value of `now()` (default 0). */
  constructor(startMs = 0) {
    if (!Number.isFinite(startMs)) {
      throw new TestingError(TestingErrorCode.BAD_OPTION, `startMs ${startMs} is not a finite number`);
    }
    this.current = startMs;
  }

  /** Current fake time in milliseconds. */
  readonly now = (): number => this.current;

  /** Number of scheduled timers (intervals count once). */
  get pending(): number {
    return this.entries.size;
  }

  /** Schedules `fn(...args)` after `ms` (Node's rule: outside [1, 2^31-1] means 1). */
  readonly setTimeout = <A extends unknown[]>(fn: (...args: A) => void, ms?: number, ...args: A): FakeTimer =>
    this.schedule(fn as (...a: unknown[]) => void, ms, args, false);

  /** Schedules `fn(...args)` every `ms`. */
  readonly setInterval = <A extends unknown[]>(
    fn: (...args: A) => void,
    ms?: number,
    ...args: A
  ): FakeTimer => this.schedule(fn as (...a: unknown[]) => void, ms, args, true);

  /** Cancels a timeout or interval (a handle, its numeric id, or null/undefined: no-op). */
  readonly clearTimeout = (handle: unknown): void => {
    if (handle === null || handle === undefined) return;
    const id = typeof handle === "number" ? handle : (handle as Partial<FakeTimer>).id;
    if (typeof id === "number") this.entries.delete(id);
  };

  /** Same as {@link FakeClock.clearTimeout} (as in Node, either clears either kind). */
  readonly clearInterval = (handle: unknown): void => this.clearTimeout(handle);

  /**
   * Moves the clock forward by `ms`, firing every timer due up to the new time in order.
   * @returns the number of callbacks run.
   */
  advance(ms: number): number {
    if (!(Number.isFinite(ms) && ms >= 0)) {
      throw new TestingError(TestingErrorCode.BAD_OPTION, `advance(${ms}): ms must be a finite number >= 0`);
    }
    const target = this.current + ms;
    let fired = 0;
    for (let e = this.nextDue(target); e !== undefined; e = this.nextDue(target)) {
      this.fire(e);
      fired++;
    }
    this.current = target;
    return fired;
  }

  /**
   * Like {@link FakeClock.advance} but lets promise callbacks and I/O callbacks run
   * (`setImmediate`) before and after each timer, for code that awaits between timers.
   */
  async advanceAsync(ms: number): Promise<number> {
    if (!(Number.isFinite(ms) && ms >= 0)) {
      throw new TestingError(
        TestingErrorCode.BAD_OPTION,
        `advanceAsync(${ms}): ms must be a finite number >= 0`,
      );
    }
    const target = this.current + ms;
    let fired = 0;
    await flush();
    for (let e = this.nextDue(target); e !== undefined; e = this.nextDue(target)) {
      this.fire(e);
      fired++;
      await flush();
    }
    this.current = target;
    return fired;
  }

  /** Fires the earliest timer (moving `now()` to its due time); false when none is scheduled. */
  next(): boolean {
    const e = this.nextDue(Number.POSITIVE_INFINITY);
    if (e === undefined) return false;
    this.fire(e);
    return true;
  }

  /**
   * Fires timers until none is left, moving `now()` along.
   * @throws TestingError `TESTING_CLOCK_RUNAWAY` after `limit` callbacks (an interval never ends).
   * @returns the number of callbacks run.
   */
  runAll(limit = 10_000): number {
    let fired = 0;
    while (this.next()) {
      if (++fired >= limit && this.entries.size > 0) {
        throw new TestingError(
          TestingErrorCode.CLOCK_RUNAWAY,
          `runAll: ${fired} callbacks run and ${this.entries.size} timer(s) still scheduled`,
        );
      }
    }
    return fired;
  }

  private schedule(fn: (...a: unknown[]) => void, ms: unknown, args: unknown[], repeat: boolean): FakeTimer {
    if (typeof fn !== "function") {
      throw new TestingError(TestingErrorCode.BAD_OPTION, "timer callback must be a function");
    }
    const id = this.nextId++;
    let refed = true;
    const timer: FakeTimer = {
      id,
      ref: () => {
        refed = true;
        return timer;
      },
      unref: () => {
        refed = false;
        return timer;
      },
      hasRef: () => refed,
      refresh: () => {
        const e = this.entries.get(id);
        if (e !== undefined) {
          e.due = this.current + e.delay;
          e.seq = this.seq++;
        }
        return timer;
      },
      [Symbol.toPrimitive]: () => id,
    };
    const delay = normaliseDelay(ms);
    this.entries.set(id, { timer, due: this.current + delay, seq: this.seq++, delay, repeat, fn, args });
    return timer;
  }

  private nextDue(limit: number): Entry | undefined {
    let best: Entry | undefined;
    for (const e of this.entries.values()) {
      if (e.due > limit) continue;
      if (best === undefined || e.due < best.due || (e.due === best.due && e.seq < best.seq)) best = e;
    }
    return best;
  }

  private fire(e: Entry): void {
    if (e.due > this.current) this.current = e.due;
    if (e.repeat) {
      // rescheduled before the call so that the callback may clear it
      e.due = this.current + e.delay;
      e.seq = this.seq++;
    } else {
      this.entries.delete(e.timer.id);
    }
    e.fn(...e.args);
  }
}

function flush(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}
