/** Stable error codes raised by `@tapwire/testing`. */
export const TestingErrorCode = {
  /** An option or argument is invalid; the message names it. */
  BAD_OPTION: "TESTING_BAD_OPTION",
  /** A spawned process exited before it became ready, or could not be spawned. */
  SPAWN: "TESTING_SPAWN",
  /** Waiting for a condition (a log line, a process exit) took longer than allowed. */
  TIMEOUT: "TESTING_TIMEOUT",
  /** The `openssl` CLI failed while generating test credentials. */
  OPENSSL: "TESTING_OPENSSL",
  /** A FakeClock run did not settle (an interval keeps rescheduling itself). */
  CLOCK_RUNAWAY: "TESTING_CLOCK_RUNAWAY",
  /** The process asked about does not exist (or is a zombie) in /proc. */
  NO_PROCESS: "TESTING_NO_PROCESS",
  /** The `promtool` CLI (Debian package `prometheus`) is missing or could not run. */
  PROMTOOL: "TESTING_PROMTOOL",
  /** Network namespaces, veths and tc need root (uid 0); the message says what asked for them. */
  NOT_ROOT: "TESTING_NOT_ROOT",
  /** An `ip` or `tc` command failed; the message gives the command and its stderr. */
  NETNS: "TESTING_NETNS",
  /** A relay child did not answer a command, or answered with an error. */
  RELAY: "TESTING_RELAY",
} as const;

/** One of the {@link TestingErrorCode} values. */
export type TestingErrorCode = (typeof TestingErrorCode)[keyof typeof TestingErrorCode];

/** The only error class thrown by `@tapwire/testing`. */
export class TestingError extends Error {
  /** Stable machine-readable code. */
  readonly code: TestingErrorCode;

  constructor(code: TestingErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "TestingError";
    this.code = code;
  }
}
