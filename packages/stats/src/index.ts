/**
 * Hot-path counters, gauges, string values and HDR latency histograms with plain-JSON snapshots
 * and a Prometheus exposition (histograms with per-histogram buckets) through prom-client; the
 * metrics/health endpoint and the shared pino setup of every tapwire bin.
 * @packageDocumentation
 */
export type { AdvertiseAddress, Advertised, AdvertiseOptions, AdvertiseSource } from "./advertise.js";
export { advertiseEndpoint, isWildcardHost, parseAdvertise } from "./advertise.js";
export { StatsError, StatsErrorCode } from "./errors.js";
export type { MetricsListen } from "./listen.js";
export { DEFAULT_METRICS_LISTEN, parseMetricsListen } from "./listen.js";
export { registryPage } from "./live-page.js";
export type { Logger, LoggerOptions, LogLevel } from "./log.js";
export { createLogger, flushAndExit, flushLogger, LOG_LEVELS, parseLogLevel } from "./log.js";
export type { Counter, Gauge, Histogram, HistogramOptions, HistogramUnit, InfoValue } from "./metrics.js";
export { BUCKETS, exponentialBuckets, MAX_BUCKETS } from "./metrics.js";
export type { ParentWatch, WatchParentOptions } from "./parent.js";
export { watchParent } from "./parent.js";
export type { HistogramSnapshot, RegistryOptions, StatsSnapshot } from "./registry.js";
export { Registry } from "./registry.js";
export type { MetricsServer, ServeMetricsOptions, SseRoute, SseRouteOptions } from "./serve.js";
export { pageRoute, serveMetrics, sseRoute } from "./serve.js";
export type { BarChartOptions, LineChartOptions, LineSeries } from "./svg.js";
export { barChartSvg, lineChartSvg } from "./svg.js";
