import type { Metric as PromMetric } from "prom-client";
import { Counter as PromCounter, Gauge as PromGauge, Registry as PromRegistry } from "prom-client";
import { StatsError, StatsErrorCode } from "./errors.js";
import type { Counter, Gauge, Histogram, HistogramOptions, HistogramUnit, InfoValue } from "./metrics.js";
import { CounterImpl, GaugeImpl, HistogramImpl, InfoImpl } from "./metrics.js";

/** Options of {@link Registry}. */
export interface RegistryOptions {
  /** Prepended to every Prometheus name, e.g. "tapwire_worker_". Default "". Not used in snapshots. */
  prefix?: string;
}

/** One histogram in a {@link StatsSnapshot}; values are in `unit`. All 0 when empty. */
export interface HistogramSnapshot {
  /** Number of observations. */
  count: number;
  /** Exact smallest observation. */
  min: number;
  /** Exact largest observation. */
  max: number;
  /** Exact mean (`sum / count`). */
  mean: number;
  /** Exact sum of observations. */
  sum: number;
  /** Median, within HDR precision (`significantDigits`). */
  p50: number;
  /** 90th percentile, within HDR precision. */
  p90: number;
  /** 99th percentile, within HDR precision. */
  p99: number;
  /** Unit of every value above (seconds, bytes or none). */
  unit: HistogramUnit;
}

/** Plain-JSON view of a registry, keyed by the names given at registration (no prefix). */
export interface StatsSnapshot {
  /** Counter values by registration name. */
  counters: Record<string, number>;
  /** Gauge values by registration name. */
  gauges: Record<string, number>;
  /** String values by registration name ("" until set). */
  info: Record<string, string>;
  /** Histogram summaries by registration name. */
  histograms: Record<string, HistogramSnapshot>;
}

const SNAPSHOT_PERCENTILES = [50, 90, 99] as const;

const NAME_RE = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const PREFIX_RE = /^(?:[a-zA-Z_:][a-zA-Z0-9_:]*)?$/;

type Kind = "counter" | "gauge" | "info" | "histogram";

/** Suffix appended to histogram names in Prometheus, by unit (Prometheus naming conventions). */
const UNIT_SUFFIX = { seconds: "_seconds", bytes: "_bytes", none: "" } as const satisfies Record<
  HistogramUnit,
  string
>;

function withSuffix(name: string, suffix: string): string {
  return suffix === "" || name.endsWith(suffix) ? name : name + suffix;
}

/**
 * A set of named metrics for one component. Metric factories are idempotent by name: asking
 * twice for `counter("steps")` returns the same object, so modules can share metrics by name.
 * Updates (`inc`, `set`, `observe`) are plain field writes: no allocation, no I/O.
 *
 * @throws StatsError `STATS_BAD_NAME` for a name or prefix that is not a Prometheus name,
 *   `STATS_NAME_CONFLICT` when a name is reused for another kind or exposes a clashing name.
 */
export class Registry {
  /** Prefix of every exposed Prometheus name. */
  readonly prefix: string;
  private readonly counters = new Map<string, CounterImpl>();
  private readonly gauges = new Map<string, GaugeImpl>();
  private readonly infos = new Map<string, InfoImpl>();
  private readonly histograms = new Map<string, HistogramImpl>();
  private readonly kinds = new Map<string, Kind>();
  /** Exposed Prometheus family name -> registration name, to catch `x_total` vs `x` clashes early. */
  private readonly exposed = new Map<string, string>();
  private readonly prom = new PromRegistry();
  /** Called before every read ({@link Registry.beforeRead}). */
  private readonly readers: (() => void)[] = [];

  constructor(options: RegistryOptions = {}) {
    if (typeof options !== "object" || options === null) {
      throw new StatsError(StatsErrorCode.BAD_OPTION, "options must be an object");
    }
    const prefix = options.prefix ?? "";
    if (typeof prefix !== "string" || !PREFIX_RE.test(prefix)) {
      throw new StatsError(
        StatsErrorCode.BAD_OPTION,
        `option prefix ${JSON.stringify(prefix)} is not a Prometheus name`,
      );
    }
    this.prefix = prefix;
  }

  /** Returns the counter `name`, creating it on first use. Exposed as `<prefix><name>_total`. */
  counter(name: string, help?: string): Counter {
    const existing = this.counters.get(name);
    if (existing) return existing;
    const exposedName = withSuffix(this.prefix + name, "_total");
    this.claim(name, "counter", exposedName, help);
    const c = new CounterImpl(name);
    this.counters.set(name, c);
    new PromCounter({
      name: exposedName,
      help: help ?? name,
      registers: [this.prom],
      collect() {
        this.reset();
        this.inc(c.value);
      },
    });
    return c;
  }

  /** Returns the gauge `name`, creating it on first use. Exposed as `<prefix><name>`. */
  gauge(name: string, help?: string): Gauge {
    const existing = this.gauges.get(name);
    if (existing) return existing;
    const exposedName = this.prefix + name;
    this.claim(name, "gauge", exposedName, help);
    const g = new GaugeImpl();
    this.gauges.set(name, g);
    new PromGauge({
      name: exposedName,
      help: help ?? name,
      registers: [this.prom],
      collect() {
        this.set(g.value);
      },
    });
    return g;
  }

  /** Returns the string value `name`, creating it on first use. Exposed as `<prefix><name>_info{value="…"} 1`. */
  info(name: string, help?: string): InfoValue {
    const existing = this.infos.get(name);
    if (existing) return existing;
    const exposedName = withSuffix(this.prefix + name, "_info");
    this.claim(name, "info", exposedName, help);
    const v = new InfoImpl();
    this.infos.set(name, v);
    new PromGauge({
      name: exposedName,
      help: help ?? name,
      labelNames: ["value"],
      registers: [this.prom],
      collect() {
        this.reset();
        this.set({ value: v.value }, 1);
      },
    });
    return v;
  }

  /**
   * Returns the histogram `name`, creating it on first use (options apply only then; asking again
   * with another unit is `STATS_NAME_CONFLICT`). Exposed as a Prometheus histogram named
   * `<prefix><name>_<unit>` (e.g. `tapwire_client_step_rtt_seconds`): `_bucket{le=…}` for each
   * of `opts.buckets` plus `+Inf`, `_sum` and `_count`. The snapshot keeps the HDR quantiles.
   */
  histogram(name: string, opts: HistogramOptions = {}): Histogram {
    if (typeof opts !== "object" || opts === null) {
      throw new StatsError(StatsErrorCode.BAD_OPTION, `histogram ${String(name)}: options must be an object`);
    }
    const existing = this.histograms.get(name);
    if (existing) {
      if (opts.unit !== undefined && opts.unit !== existing.unit) {
        throw new StatsError(
          StatsErrorCode.NAME_CONFLICT,
          `histogram ${name} already registered with unit ${existing.unit}, not ${opts.unit}`,
        );
      }
      return existing;
    }
    const h = new HistogramImpl(name, opts);
    const exposedName = withSuffix(this.prefix + name, UNIT_SUFFIX[h.unit]);
    this.claim(name, "histogram", exposedName, opts.help);
    this.histograms.set(name, h);
    const help = opts.help ?? name;
    const bucketName = `${exposedName}_bucket`;
    const les = Array.from(h.bounds, (b) => String(b));
    const metric = {
      name: exposedName,
      help,
      type: "histogram",
      aggregator: "sum",
      get() {
        const values: { labels?: Record<string, string>; metricName?: string; value: number }[] = [];
        let cumulative = 0;
        for (let k = 0; k < les.length; k++) {
          cumulative += h.bucketCounts[k] as number;
          values.push({ metricName: bucketName, labels: { le: les[k] as string }, value: cumulative });
        }
        values.push({ metricName: bucketName, labels: { le: "+Inf" }, value: h.count });
        values.push({ metricName: `${exposedName}_sum`, value: h.sum });
        values.push({ metricName: `${exposedName}_count`, value: h.count });
        return { name: exposedName, help, type: "histogram", aggregator: "sum", values };
      },
    };
    // prom-client formats any registered object exposing name/help/type/get(); its Histogram class
    // would keep a second copy of every observation (and labels machinery) on the hot path.
    this.prom.registerMetric(metric as unknown as PromMetric);
    return h;
  }

  /**
   * Registers `fold`, called before every read of this registry ({@link Registry.snapshot},
   * {@link Registry.prometheus}, {@link Registry.reset}): a hot path that tallies observations
   * in its own fields (a constant it saw `n` times, values kept in a buffer) folds them into its
   * metrics there, instead of observing each one as it happens. `fold` must not throw.
   */
  beforeRead(fold: () => void): void {
    if (typeof fold !== "function") {
      throw new StatsError(StatsErrorCode.BAD_OPTION, "beforeRead: fold must be a function");
    }
    this.readers.push(fold);
  }

  private fold(): void {
    for (const f of this.readers) f();
  }

  /** Plain-JSON copy of every metric's current value (for the worker's STATS op and logs). */
  snapshot(): StatsSnapshot {
    this.fold();
    const s: StatsSnapshot = { counters: {}, gauges: {}, info: {}, histograms: {} };
    for (const [name, c] of this.counters) s.counters[name] = c.value;
    for (const [name, g] of this.gauges) s.gauges[name] = g.value;
    for (const [name, v] of this.infos) s.info[name] = v.value;
    const q = [0, 0, 0];
    for (const [name, h] of this.histograms) {
      h.percentilesInto(SNAPSHOT_PERCENTILES, q);
      s.histograms[name] = {
        count: h.count,
        min: h.min,
        max: h.max,
        mean: h.mean,
        sum: h.sum,
        p50: q[0]!,
        p90: q[1]!,
        p99: q[2]!,
        unit: h.unit,
      };
    }
    return s;
  }

  /** Prometheus text exposition (format 0.0.4) of this registry, rendered by prom-client from live values. */
  prometheus(): Promise<string> {
    this.fold();
    return this.prom.metrics();
  }

  /** Content type of {@link Registry.prometheus}'s output. */
  static readonly contentType: string = PromRegistry.PROMETHEUS_CONTENT_TYPE;

  /** Zeroes every counter, gauge and histogram and empties every string value; registrations stay. */
  reset(): void {
    this.fold();
    for (const c of this.counters.values()) c.value = 0;
    for (const g of this.gauges.values()) g.value = 0;
    for (const v of this.infos.values()) v.value = "";
    for (const h of this.histograms.values()) h.reset();
  }

  private claim(name: string, kind: Kind, exposedName: string, help: unknown): void {
    if (help !== undefined && (typeof help !== "string" || help === "")) {
      throw new StatsError(
        StatsErrorCode.BAD_OPTION,
        `${kind} ${String(name)}: option help must be a non-empty string, got ${JSON.stringify(help)}`,
      );
    }
    if (typeof name !== "string" || !NAME_RE.test(name)) {
      throw new StatsError(
        StatsErrorCode.BAD_NAME,
        `${kind} name ${JSON.stringify(name)} is not a Prometheus name`,
      );
    }
    const had = this.kinds.get(name);
    if (had !== undefined) {
      throw new StatsError(
        StatsErrorCode.NAME_CONFLICT,
        `${kind} ${name}: name already registered as a ${had}`,
      );
    }
    const owner = this.exposed.get(exposedName);
    if (owner !== undefined) {
      throw new StatsError(
        StatsErrorCode.NAME_CONFLICT,
        `${kind} ${name}: exposed name ${exposedName} already used by ${owner}`,
      );
    }
    this.kinds.set(name, kind);
    this.exposed.set(exposedName, name);
  }
}
