/** Stable error codes of the harness (one class, `code` never changes meaning). */
export const HarnessErrorCode = {
  /** A command-line flag is unknown, malformed or out of range. */
  USAGE: "HARNESS_USAGE",
  /** A child process (worker, encoder) failed to start or exited unexpectedly. */
  PROCESS: "HARNESS_PROCESS",
  /** Speculative output differs from target-only output (the run is not lossless). */
  LOSSY: "HARNESS_LOSSY",
  /** A package the harness combines broke one of its promises. */
  INTERNAL: "HARNESS_INTERNAL",
} as const;
export type HarnessErrorCode = (typeof HarnessErrorCode)[keyof typeof HarnessErrorCode];

/** The harness's only error class; `code` is one of {@link HarnessErrorCode}. */
export class HarnessError extends Error {
  override readonly name = "HarnessError";
  readonly code: HarnessErrorCode;

  constructor(code: HarnessErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
  }
}
