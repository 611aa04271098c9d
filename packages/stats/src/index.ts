/**
 * Hot-path counters, gauges, string values and HDR latency histograms with plain-JSON snapshots
 * and a Prometheus exposition through prom-client.
 * @packageDocumentation
 */
export { StatsError, StatsErrorCode } from "./errors.js";
export type { Counter, Gauge, Histogram, HistogramOptions, HistogramUnit, InfoValue } from "./metrics.js";
export type { HistogramSnapshot, RegistryOptions, StatsSnapshot } from "./registry.js";
export { PROMETHEUS_QUANTILES, Registry } from "./registry.js";
export type { MetricsServer } from "./serve.js";
export { serveMetrics } from "./serve.js";
