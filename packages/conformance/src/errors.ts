/** Stable codes of {@link ConformanceError}. */
export const ConformanceErrorCode = {
  /** A command-line flag or an option is missing or out of range (named in the message). */
  BAD_OPTION: "CONFORMANCE_BAD_OPTION",
  /** An endpoint URL is not one of CONTRACT 3's schemes. */
  BAD_ENDPOINT: "CONFORMANCE_BAD_ENDPOINT",
  /** The tester could not connect to the peer under test. */
  CONNECT: "CONFORMANCE_CONNECT",
  /** The peer's parameters could not be discovered (and were not given as flags). */
  DISCOVERY: "CONFORMANCE_DISCOVERY",
  /** A `shm+unix://` session file could not be created (room in `/dev/shm`, permissions; issue 23). */
  SHM: "CONFORMANCE_SHM",
} as const;
/** One of the {@link ConformanceErrorCode} values. */
export type ConformanceErrorCode = (typeof ConformanceErrorCode)[keyof typeof ConformanceErrorCode];

/** The one error class of `@tapwire/conformance`, with a stable `code`. */
export class ConformanceError extends Error {
  /** Stable error code. */
  readonly code: ConformanceErrorCode;

  constructor(code: ConformanceErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "ConformanceError";
    this.code = code;
  }
}
