import type { Histogram as HdrHistogram } from "hdr-histogram-js";
import { build } from "hdr-histogram-js";
import { StatsError, StatsErrorCode } from "./errors.js";

/** A monotonically increasing count. `inc` allocates nothing. */
export interface Counter {
  /** Adds `n` (default 1). Throws `STATS_BAD_ARGUMENT` if `n` is negative or NaN. */
  inc(n?: number): void;
  /** Current value. */
  readonly value: number;
}

/** A value that goes up and down (queue depth, connected flag, in-flight count). */
export interface Gauge {
  /** Sets the value. */
  set(v: number): void;
  /** Adds `n` (default 1). */
  inc(n?: number): void;
  /** Subtracts `n` (default 1). */
  dec(n?: number): void;
  /** Current value. */
  readonly value: number;
}

/** A string value, e.g. `disabled_reason`. Exposed to Prometheus as `<name>_info{value="..."} 1`. */
export interface InfoValue {
  /** Replaces the value. */
  set(v: string): void;
  /** Current value ("" until set). */
  readonly value: string;
}

/** Unit of a histogram; decides the Prometheus suffix and the internal integer resolution. */
export type HistogramUnit = "seconds" | "bytes" | "none";

/**
 * A latency/size histogram backed by HdrHistogram. Values are observed in the histogram's unit
 * (seconds histograms take seconds: `observe(1.5e-4)`) and stored internally as integers
 * (microseconds for seconds). `observe` allocates nothing.
 */
export interface Histogram {
  /**
   * Records one value in the histogram's unit. NaN is ignored, negative values count as 0, values
   * above `highest` are recorded as `highest` (the exact `max` is still kept).
   */
  observe(v: number): void;
  /** Value at percentile `p` in [0, 100], in the histogram's unit; 0 when empty. Within HDR precision. */
  percentile(p: number): number;
  /** Number of observations. */
  readonly count: number;
  /** Exact largest observation (0 when empty). */
  readonly max: number;
  /** Exact smallest observation (0 when empty). */
  readonly min: number;
  /** Exact sum of observations. */
  readonly sum: number;
  /** Exact mean of observations (0 when empty). */
  readonly mean: number;
  /** The histogram's unit. */
  readonly unit: HistogramUnit;
  /** Forgets every observation. */
  reset(): void;
}

/** Options of {@link Registry.histogram}. `lowest`/`highest` are in the histogram's unit. */
export interface HistogramOptions {
  /** Prometheus HELP text. */
  help?: string;
  /** Default "seconds". */
  unit?: HistogramUnit;
  /** Smallest value told apart from 0. Default: 1e-6 for seconds, 1 for bytes, `1 / scale` for none. */
  lowest?: number;
  /** Largest value tracked exactly; larger values are clamped. Default: 3600 s, 2^40 bytes, 2^40 / scale for none. */
  highest?: number;
  /** HDR significant decimal digits, 1..5. Default 3 (relative error below 0.1%). */
  significantDigits?: number;
  /**
   * Internal integers per unit. Default 1e6 for seconds (microseconds), 1 for bytes and none.
   * Raise it for "none" histograms of fractional values (e.g. 1000 for ratios in [0, 1]).
   */
  scale?: number;
}

const DEFAULT_SCALE = { seconds: 1e6, bytes: 1, none: 1 } as const satisfies Record<HistogramUnit, number>;
const DEFAULT_HIGHEST_INT = { seconds: 3600e6, bytes: 2 ** 40, none: 2 ** 40 } as const satisfies Record<
  HistogramUnit,
  number
>;

/** @internal */
export class CounterImpl implements Counter {
  value = 0;
  constructor(readonly name: string) {}
  inc(n = 1): void {
    // `!(n >= 0)` also catches NaN.
    if (!(n >= 0))
      throw new StatsError(StatsErrorCode.BAD_ARGUMENT, `counter ${this.name}: increment ${n} < 0`);
    this.value += n;
  }
}

/** @internal */
export class GaugeImpl implements Gauge {
  value = 0;
  set(v: number): void {
    this.value = v;
  }
  inc(n = 1): void {
    this.value += n;
  }
  dec(n = 1): void {
    this.value -= n;
  }
}

/** @internal */
export class InfoImpl implements InfoValue {
  value = "";
  set(v: string): void {
    this.value = String(v);
  }
}

/** @internal */
export class HistogramImpl implements Histogram {
  readonly unit: HistogramUnit;
  readonly scale: number;
  readonly highestInt: number;
  readonly significantDigits: number;
  count = 0;
  sum = 0;
  max = 0;
  private minSeen = Number.POSITIVE_INFINITY;
  private readonly hdr: HdrHistogram;

  constructor(
    readonly name: string,
    opts: HistogramOptions,
  ) {
    const unit = opts.unit ?? "seconds";
    if (unit !== "seconds" && unit !== "bytes" && unit !== "none") {
      throw new StatsError(
        StatsErrorCode.BAD_OPTION,
        `histogram ${name}: option unit ${String(unit)} is not seconds|bytes|none`,
      );
    }
    const scale = opts.scale ?? DEFAULT_SCALE[unit];
    if (!(Number.isFinite(scale) && scale > 0)) {
      throw new StatsError(
        StatsErrorCode.BAD_OPTION,
        `histogram ${name}: option scale ${scale} must be a positive number`,
      );
    }
    const digits = opts.significantDigits ?? 3;
    if (!Number.isInteger(digits) || digits < 1 || digits > 5) {
      throw new StatsError(
        StatsErrorCode.BAD_OPTION,
        `histogram ${name}: option significantDigits ${digits} must be an integer in [1, 5]`,
      );
    }
    const lowestInt = opts.lowest === undefined ? 1 : Math.round(opts.lowest * scale);
    if (!(lowestInt >= 1) || !Number.isSafeInteger(lowestInt)) {
      throw new StatsError(
        StatsErrorCode.BAD_OPTION,
        `histogram ${name}: option lowest ${opts.lowest} is below the resolution 1/${scale} of unit ${unit}`,
      );
    }
    const highestInt =
      opts.highest === undefined
        ? Math.max(DEFAULT_HIGHEST_INT[unit], 2 * lowestInt)
        : Math.round(opts.highest * scale);
    if (!(highestInt >= 2 * lowestInt) || !Number.isSafeInteger(highestInt)) {
      throw new StatsError(
        StatsErrorCode.BAD_OPTION,
        `histogram ${name}: option highest ${opts.highest} must be at least twice lowest and a safe integer after scaling`,
      );
    }
    this.unit = unit;
    this.scale = scale;
    this.highestInt = highestInt;
    this.significantDigits = digits;
    // 64-bit (float) buckets: a 32-bit bucket would wrap after 4e9 observations of one value.
    // autoResize off: resizing allocates; out-of-range values are clamped in observe().
    this.hdr = build({
      bitBucketSize: 64,
      autoResize: false,
      lowestDiscernibleValue: lowestInt,
      highestTrackableValue: highestInt,
      numberOfSignificantValueDigits: digits as 1 | 2 | 3 | 4 | 5,
      useWebAssembly: false,
    });
  }

  observe(v: number): void {
    if (!(v >= 0)) {
      if (Number.isNaN(v)) return;
      v = 0;
    }
    let i = Math.round(v * this.scale);
    if (i > this.highestInt) i = this.highestInt;
    this.hdr.recordValue(i);
    this.count++;
    this.sum += v;
    if (v > this.max) this.max = v;
    if (v < this.minSeen) this.minSeen = v;
  }

  get min(): number {
    return this.count === 0 ? 0 : this.minSeen;
  }

  get mean(): number {
    return this.count === 0 ? 0 : this.sum / this.count;
  }

  percentile(p: number): number {
    if (!(p >= 0 && p <= 100)) {
      throw new StatsError(
        StatsErrorCode.BAD_ARGUMENT,
        `histogram ${this.name}: percentile ${p} outside [0, 100]`,
      );
    }
    if (this.count === 0) return 0;
    if (p === 100) return this.max;
    if (p === 0) return this.minSeen;
    const v = this.hdr.getValueAtPercentile(p) / this.scale;
    // HDR reports the top of the bucket; the exact extremes are known, so never report past them.
    if (v > this.max) return this.max;
    if (v < this.minSeen) return this.minSeen;
    return v;
  }

  reset(): void {
    this.hdr.reset();
    this.count = 0;
    this.sum = 0;
    this.max = 0;
    this.minSeen = Number.POSITIVE_INFINITY;
  }
}
