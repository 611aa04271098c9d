import { hostname } from "node:os";
import type { DestinationStream, Logger } from "pino";

export type { Logger };

import { pino } from "pino";
import { StatsError, StatsErrorCode } from "./errors.js";

/** The levels {@link createLogger} accepts, most to least severe, then `silent`. */
export const LOG_LEVELS = ["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const;

/** One of {@link LOG_LEVELS}. */
export type LogLevel = (typeof LOG_LEVELS)[number];

/** Options of {@link createLogger}. */
export interface LoggerOptions {
  /** The component, written as `name` on every line (`tapwire-worker`, `tapwire-harness`). */
  name: string;
  /** Default `info`. Anything outside {@link LOG_LEVELS} throws `STATS_BAD_LOG_LEVEL`. */
  level?: string;
  /**
   * Where lines go: a file descriptor (1 = stdout, the default; 2 = stderr for a bin whose stdout
   * is a report) or a stream (tests). Descriptors are written synchronously, so a line logged
   * before `process.exit` is never lost.
   */
  destination?: 1 | 2 | DestinationStream;
}

/**
 * Checks a log level given on a command line. Returns it typed, or throws `StatsError`
 * `STATS_BAD_LOG_LEVEL` whose message is one line naming the valid levels (a CLI prints it and
 * exits 2).
 */
export function parseLogLevel(level: string): LogLevel {
  if (typeof level === "string" && (LOG_LEVELS as readonly string[]).includes(level)) {
    return level as LogLevel;
  }
  throw new StatsError(
    StatsErrorCode.BAD_LOG_LEVEL,
    `log level ${JSON.stringify(level)} is not one of ${LOG_LEVELS.join(", ")}`,
  );
}

/**
 * The one pino setup of every tapwire bin: JSON lines with the same base fields everywhere,
 * `{"level":30,"time":…,"pid":…,"hostname":…,"name":…,"msg":…}` (numeric pino levels, epoch-ms
 * `time`; `pid` and `hostname` once, from the base — do not log them again).
 *
 * @throws StatsError `STATS_BAD_LOG_LEVEL` for an unknown level, `STATS_BAD_OPTION` for a bad name
 *   or destination.
 */
export function createLogger(options: LoggerOptions): Logger {
  if (typeof options !== "object" || options === null) {
    throw new StatsError(StatsErrorCode.BAD_OPTION, "options must be an object");
  }
  const { name, destination = 1 } = options;
  if (typeof name !== "string" || name === "") {
    throw new StatsError(StatsErrorCode.BAD_OPTION, "option name must be a non-empty string");
  }
  const level = parseLogLevel(options.level ?? "info");
  let stream: DestinationStream;
  if (destination === 1 || destination === 2) {
    stream = pino.destination({ dest: destination, sync: true });
  } else if (
    typeof destination === "object" &&
    destination !== null &&
    typeof destination.write === "function"
  ) {
    stream = destination;
  } else {
    throw new StatsError(StatsErrorCode.BAD_OPTION, "option destination must be 1, 2 or a stream");
  }
  return pino({ level, base: { pid: process.pid, hostname: hostname(), name } }, stream);
}

/**
 * Resolves once every line `logger` has buffered is written (at once for the descriptors
 * {@link createLogger} opens; asynchronous destinations are waited for, at most `timeoutMs`).
 */
export function flushLogger(logger: Logger, timeoutMs = 1000): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, timeoutMs);
    const done = () => {
      clearTimeout(timer);
      resolve();
    };
    try {
      logger.flush(() => done());
    } catch {
      done();
    }
  });
}

/** Flushes `logger` ({@link flushLogger}) and then ends the process with `code`. */
export async function flushAndExit(logger: Logger, code: number): Promise<never> {
  process.exitCode = code;
  await flushLogger(logger);
  process.exit(code);
}
