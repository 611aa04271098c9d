/** Stable codes of {@link TraceError}. */
export const TraceErrorCode = {
  /** An option is missing or out of range; the message names it. */
  BAD_OPTION: "TRACE_BAD_OPTION",
  /** The bytes are not a trace file of a version this package reads (docs/trace.md). */
  BAD_FILE: "TRACE_BAD_FILE",
  /** The writer was closed. */
  CLOSED: "TRACE_CLOSED",
  /** An I/O failure of the background writer or the reader. */
  IO: "TRACE_IO",
  /** The replay could not run (connect, HELLO refused, transport failure). */
  REPLAY: "TRACE_REPLAY",
} as const;

/** One of the {@link TraceErrorCode} values. */
export type TraceErrorCode = (typeof TraceErrorCode)[keyof typeof TraceErrorCode];

const BRAND = Symbol.for("@tapwire/trace.TraceError");

/** The one error type of `@tapwire/trace`, with a stable `code`. */
export class TraceError extends Error {
  /** The stable code. */
  readonly code: TraceErrorCode;
  /** `"TraceError"`. */
  override name = "TraceError";

  constructor(code: TraceErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    (this as unknown as Record<symbol, boolean>)[BRAND] = true;
  }

  /** True for a TraceError of any installed copy of this package. */
  static override [Symbol.hasInstance](v: unknown): boolean {
    return typeof v === "object" && v !== null && (v as Record<symbol, unknown>)[BRAND] === true;
  }
}
