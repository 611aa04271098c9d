/** Stable error codes raised by `@tapwire/stats`. */
export const StatsErrorCode = {
  /** A metric name or prefix is not a valid Prometheus name. */
  BAD_NAME: "STATS_BAD_NAME",
  /** A name is already registered as another kind (or with another unit), or two metrics expose the same name. */
  NAME_CONFLICT: "STATS_NAME_CONFLICT",
  /** An option passed to a constructor or factory is invalid; the message names it. */
  BAD_OPTION: "STATS_BAD_OPTION",
  /** A value or argument passed to a metric method is invalid (negative counter increment, percentile > 100). */
  BAD_ARGUMENT: "STATS_BAD_ARGUMENT",
  /** A metrics listen address is not `tcp://HOST:PORT` (`parseMetricsListen`); a usage error. */
  BAD_LISTEN: "STATS_BAD_LISTEN",
  /** A log level is not one of `LOG_LEVELS` (`createLogger`, `parseLogLevel`); a usage error. */
  BAD_LOG_LEVEL: "STATS_BAD_LOG_LEVEL",
  /** An `--advertise` value is not `HOST[:PORT]` (`parseAdvertise`); a usage error. */
  BAD_ADVERTISE: "STATS_BAD_ADVERTISE",
  /** A wildcard bind without `--advertise` and no non-loopback interface up (`advertiseEndpoint`); a usage error. */
  NO_ADVERTISE: "STATS_NO_ADVERTISE",
} as const;

/** One of the {@link StatsErrorCode} values. */
export type StatsErrorCode = (typeof StatsErrorCode)[keyof typeof StatsErrorCode];

/** The only error class thrown by `@tapwire/stats`; `code` is stable, `message` names the first problem. */
export class StatsError extends Error {
  /** Stable machine-readable code. */
  readonly code: StatsErrorCode;

  constructor(code: StatsErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "StatsError";
    this.code = code;
  }
}
