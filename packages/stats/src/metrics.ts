import { build, JsHistogram } from "hdr-histogram-js";
import { StatsError, StatsErrorCode } from "./errors.js";

/** A monotonically increasing count. `inc` allocates nothing. */
export interface Counter {
  /** Adds `n` (default 1). Throws `STATS_BAD_ARGUMENT` if `n` is negative, NaN or infinite. */
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
  /**
   * Upper bounds (`le`, in the histogram's unit, strictly increasing, finite; `+Inf` is implied)
   * of the Prometheus histogram buckets. Default by unit: {@link BUCKETS}`.LATENCY_SECONDS`,
   * `.SIZE_BYTES`, `.COUNT`. Pick a preset per histogram (`BUCKETS.STEP_RTT_SECONDS`,
   * `BUCKETS.EC_TRANSFER_SECONDS`) or build one with {@link exponentialBuckets}.
   */
  buckets?: readonly number[];
}

/** Largest number of buckets a histogram may declare (each is one series per scrape). */
export const MAX_BUCKETS = 64;

/**
 * Builds `count` bucket bounds `start, start*factor, start*factor^2, …`, each rounded to 6
 * significant digits so the `le` labels stay readable.
 */
export function exponentialBuckets(start: number, factor: number, count: number): number[] {
  if (!(Number.isFinite(start) && start > 0)) {
    throw new StatsError(StatsErrorCode.BAD_ARGUMENT, `exponentialBuckets: start ${start} must be > 0`);
  }
  if (!(Number.isFinite(factor) && factor > 1)) {
    throw new StatsError(StatsErrorCode.BAD_ARGUMENT, `exponentialBuckets: factor ${factor} must be > 1`);
  }
  if (!Number.isInteger(count) || count < 1 || count > MAX_BUCKETS) {
    throw new StatsError(
      StatsErrorCode.BAD_ARGUMENT,
      `exponentialBuckets: count ${count} must be an integer in [1, ${MAX_BUCKETS}]`,
    );
  }
  return Array.from({ length: count }, (_, i) => Number((start * factor ** i).toPrecision(6)));
}

/**
 * Bucket presets for {@link HistogramOptions.buckets}, in the histogram's unit (a 1-2-5 series
 * for latencies, so a dashboard can read p50/p99 with `histogram_quantile` to within one step).
 */
export const BUCKETS = {
  /** Drafter-link STEP round trip and worker STEP time: 20 µs … 1 s. */
  STEP_RTT_SECONDS: [
    20e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 20e-3, 50e-3, 0.1, 0.2, 0.5, 1,
  ],
  /** Encoder-cache transfer (request to DONE, a read, a wait for an embedding): 100 µs … 30 s. */
  EC_TRANSFER_SECONDS: [
    100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
  ],
  /** Default for seconds histograms: 10 µs … 10 s. */
  LATENCY_SECONDS: [
    10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 0.1, 0.25, 0.5, 1,
    2.5, 5, 10,
  ],
  /** Default for bytes histograms: 64 B … 1 GiB in powers of 4. */
  SIZE_BYTES: [
    64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864, 268435456, 1073741824,
  ],
  /** Default for "none" histograms: whole counts 1 … 65536 in powers of 2 then 4. */
  COUNT: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 65536],
  /** Fractions in [0, 1] (acceptance ratios, fill levels). */
  RATIO: [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1],
} as const satisfies Record<string, readonly number[]>;

const DEFAULT_BUCKETS = {
  seconds: BUCKETS.LATENCY_SECONDS,
  bytes: BUCKETS.SIZE_BYTES,
  none: BUCKETS.COUNT,
} as const satisfies Record<HistogramUnit, readonly number[]>;

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
    // `!(n >= 0)` also catches NaN; an infinite increment would stick the counter at Infinity.
    if (!(n >= 0 && n < Number.POSITIVE_INFINITY)) {
      throw new StatsError(
        StatsErrorCode.BAD_ARGUMENT,
        `counter ${this.name}: increment ${n} is not a finite number >= 0`,
      );
    }
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
  private readonly hdr: JsHistogram;
  // HDR bucket geometry, copied once: observe() computes the counts index with clz32 and shifts
  // instead of hdr-histogram-js's log2/pow/floor path (about 10x faster); a test checks the two
  // agree on every magnitude.
  private readonly subBucketHalfCountMagnitude: number;
  private readonly subBucketHalfCount: number;
  private readonly unitMagnitude: number;
  /** Prometheus bucket upper bounds (`le`), in the unit, ascending; `+Inf` is implied. */
  readonly bounds: Float64Array;
  /** Non-cumulative counts per bound; the last slot counts values above every bound. */
  readonly bucketCounts: Float64Array;
  /**
   * Prometheus bucket of every HDR counts index whose whole value range (with the half-unit of
   * rounding) lies inside one bucket; {@link STRADDLES} where a bound cuts the range, and then
   * observe() compares against the bounds. Saves a binary search on nearly every observation.
   */
  private readonly bucketOfIndex: Uint8Array;

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
    const buckets = opts.buckets ?? DEFAULT_BUCKETS[unit];
    if (
      !Array.isArray(buckets) ||
      buckets.length === 0 ||
      buckets.length > MAX_BUCKETS ||
      buckets.some((b, k) => !Number.isFinite(b) || (k > 0 && !(b > (buckets[k - 1] as number))))
    ) {
      throw new StatsError(
        StatsErrorCode.BAD_OPTION,
        `histogram ${name}: option buckets must be 1..${MAX_BUCKETS} finite, strictly increasing numbers (+Inf is implied)`,
      );
    }
    this.bounds = Float64Array.from(buckets as readonly number[]);
    this.bucketCounts = new Float64Array(buckets.length + 1);
    this.unit = unit;
    this.scale = scale;
    this.highestInt = highestInt;
    this.significantDigits = digits;
    // 64-bit (float) buckets: a 32-bit bucket would wrap after 4e9 observations of one value.
    // autoResize off: resizing allocates; out-of-range values are clamped in observe().
    const hdr = build({
      bitBucketSize: 64,
      autoResize: false,
      lowestDiscernibleValue: lowestInt,
      highestTrackableValue: highestInt,
      numberOfSignificantValueDigits: digits as 1 | 2 | 3 | 4 | 5,
      useWebAssembly: false,
    });
    if (!(hdr instanceof JsHistogram)) throw new Error("hdr-histogram-js did not build a JS histogram");
    this.hdr = hdr;
    this.subBucketHalfCountMagnitude = hdr.subBucketHalfCountMagnitude;
    this.subBucketHalfCount = hdr.subBucketHalfCount;
    this.unitMagnitude = hdr.unitMagnitude;
    this.bucketOfIndex = bucketTable(hdr, this.bounds, scale);
  }

  /** @internal HDR counts-array index of an internal integer value (same result as HDR's own). */
  indexOf(i: number): number {
    if (i >= 0x80000000) return this.hdr.countsArrayIndex(i);
    let bucket = 31 - Math.clz32(i) - this.subBucketHalfCountMagnitude - this.unitMagnitude;
    if (bucket < 0) bucket = 0;
    const subBucket = i >>> (bucket + this.unitMagnitude);
    return ((bucket + 1) << this.subBucketHalfCountMagnitude) + subBucket - this.subBucketHalfCount;
  }

  observe(v: number): void {
    if (!(v >= 0)) {
      if (Number.isNaN(v)) return;
      v = 0;
    }
    let i = Math.round(v * this.scale);
    let clamped = false;
    if (i > this.highestInt) {
      i = this.highestInt;
      clamped = true;
    }
    const hdr = this.hdr;
    const idx = this.indexOf(i);
    hdr.incrementCountAtIndex(idx);
    hdr.updateMinAndMax(i);
    hdr.incrementTotalCount();
    // the Prometheus bucket (first bound >= v, `le`): from the table, or searched near a bound
    let k = clamped ? STRADDLES : (this.bucketOfIndex[idx] as number);
    if (k === STRADDLES) {
      const bounds = this.bounds;
      let lo = 0;
      let hi = bounds.length;
      while (lo < hi) {
        const mid = (lo + hi) >>> 1;
        if ((bounds[mid] as number) < v) lo = mid + 1;
        else hi = mid;
      }
      k = lo;
    }
    const counts = this.bucketCounts;
    counts[k] = (counts[k] as number) + 1;
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
    // HDR reports the top of the bucket; the exact extremes are known, so never report past them.
    return this.clampExact(p, this.hdr.getValueAtPercentile(p));
  }

  /**
   * @internal Fills `out[k]` with the value at percentile `ps[k]` (ascending, each in [0, 100]) in
   * one pass over the buckets; same results as {@link percentile}.
   */
  percentilesInto(ps: readonly number[], out: number[]): void {
    for (let k = 0; k < ps.length; k++) out[k] = 0;
    if (this.count === 0) return;
    const hdr = this.hdr;
    const total = hdr.totalCount;
    const n = hdr.countsArrayLength;
    let k = 0;
    let cumulative = 0;
    let target = countAtPercentile(ps[0] ?? 0, total);
    for (let idx = 0; idx < n && k < ps.length; idx++) {
      cumulative += hdr.getCountAtIndex(idx);
      if (cumulative < target) continue;
      while (k < ps.length && cumulative >= target) {
        out[k] = this.clampExact(
          ps[k]!,
          ps[k] === 0 ? 0 : hdr.highestEquivalentValue(hdr.valueFromIndex(idx)),
        );
        k++;
        if (k < ps.length) target = countAtPercentile(ps[k]!, total);
      }
    }
    for (; k < ps.length; k++) out[k] = this.clampExact(ps[k]!, 0);
  }

  private clampExact(p: number, hdrValue: number): number {
    if (p === 100) return this.max;
    if (p === 0) return this.minSeen;
    const v = hdrValue / this.scale;
    if (v > this.max) return this.max;
    if (v < this.minSeen) return this.minSeen;
    return v;
  }

  reset(): void {
    this.hdr.reset();
    this.bucketCounts.fill(0);
    this.count = 0;
    this.sum = 0;
    this.max = 0;
    this.minSeen = Number.POSITIVE_INFINITY;
  }
}

/** Marks an HDR index whose values fall in more than one Prometheus bucket. */
const STRADDLES = 255;

/**
 * For each HDR counts index: the Prometheus bucket every value rounding into it falls in, or
 * {@link STRADDLES}. A value `v` lands at integer `round(v * scale)`, so the index's integers
 * `[lo, hi]` hold the reals `[lo - 0.5, hi + 0.5) / scale`; the index maps to bucket `k` only when
 * that whole interval is above bound `k - 1` and below bound `k`, with a margin so that float
 * rounding of `v * scale` cannot cross a bound.
 */
function bucketTable(hdr: JsHistogram, bounds: Float64Array, scale: number): Uint8Array {
  const n = hdr.countsArrayLength;
  const table = new Uint8Array(n).fill(STRADDLES);
  const scaled = Array.from(bounds, (b) => b * scale);
  // HDR's index geometry (valueFromIndex and the equivalent range, without its log2 calls)
  const halfMag = hdr.subBucketHalfCountMagnitude;
  const halfCount = hdr.subBucketHalfCount;
  const unitMag = hdr.unitMagnitude;
  let k = 0;
  for (let idx = 0; idx < n; idx++) {
    let bucket = (idx >> halfMag) - 1;
    let sub = (idx & (halfCount - 1)) + halfCount;
    if (bucket < 0) {
      sub -= halfCount;
      bucket = 0;
    }
    const size = 2 ** (bucket + unitMag);
    const lo = sub * size;
    const hi = lo + size - 1;
    const low = lo - 0.5;
    const high = hi + 0.5;
    const margin = 1e-9 * Math.max(1, Math.abs(high));
    while (k < scaled.length && (scaled[k] as number) < low - margin) k++;
    // every bound below k is under the interval; bound k (if any) must be above it
    const inside = k === scaled.length || (scaled[k] as number) > high + margin;
    const aboveFloor = k === 0 || (scaled[k - 1] as number) < low - margin;
    if (inside && aboveFloor) table[idx] = k;
  }
  return table;
}

/** HDR's rank rule: the smallest count reaching `p`% of `total`, guarding against 1-ulp float error. */
function countAtPercentile(p: number, total: number): number {
  const fp = (p / 100) * total;
  const ulp = fp > 0 ? 2 ** (Math.floor(Math.log2(fp)) - 52) : 0;
  return Math.max(Math.ceil(fp - ulp), 1);
}
