import { FrameStatus } from "./constants.js";

/** Stable codes of {@link WireError}. */
export const WireErrorCode = {
  /** A frame or body breaks a structural rule (CONTRACT 4, 6.1, 7.2): the worker answers BAD_FRAME. */
  BAD_FRAME: "WIRE_BAD_FRAME",
  /** The header's version is not {@link VERSION} (CONTRACT 4): the worker answers BAD_VERSION. */
  BAD_VERSION: "WIRE_BAD_VERSION",
  /** A STEP body is above the session's limit (CONTRACT 7.2, 11): the worker answers TOO_LARGE. */
  TOO_LARGE: "WIRE_TOO_LARGE",
  /** A reply breaks CONTRACT 6.1, 6.3, 7.4 or 8: the client refuses it (outcome `bad_reply`, 9.2). */
  BAD_REPLY: "WIRE_BAD_REPLY",
  /** A caller passed a value that cannot be encoded (out of range, buffer too small, ...). */
  BAD_ARGUMENT: "WIRE_BAD_ARGUMENT",
} as const;
/** One of the {@link WireErrorCode} values. */
export type WireErrorCode = (typeof WireErrorCode)[keyof typeof WireErrorCode];

const STATUS_OF: Readonly<Record<WireErrorCode, number | undefined>> = {
  WIRE_BAD_FRAME: FrameStatus.BAD_FRAME,
  WIRE_BAD_VERSION: FrameStatus.BAD_VERSION,
  WIRE_TOO_LARGE: FrameStatus.TOO_LARGE,
  WIRE_BAD_REPLY: undefined,
  WIRE_BAD_ARGUMENT: undefined,
};

// Branded with a registry symbol so that `instanceof` holds across two installed copies of the
// package (the undici `lib/core/errors.js` pattern): the brand, not the prototype, decides.
const kWireError: unique symbol = Symbol.for("tapwire.wire.WireError");

/**
 * The one error class of `@tapwire/wire`. `code` is stable; `status` is the frame status a worker
 * answers for it (BAD_FRAME, BAD_VERSION or TOO_LARGE), undefined for client-side and argument
 * errors. The message names the first problem found. `instanceof WireError` is true for a
 * WireError of any installed copy of the package.
 */
export class WireError extends Error {
  /** True for any value branded by a WireError constructor of any copy of this package. */
  static override [Symbol.hasInstance](value: unknown): boolean {
    return (
      typeof value === "object" && value !== null && (value as Record<symbol, unknown>)[kWireError] === true
    );
  }

  /** Stable error code. */
  readonly code: WireErrorCode;
  /** Frame status a worker answers for this error (CONTRACT 5), if any. */
  readonly status: number | undefined;

  constructor(code: WireErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "WireError";
    this.code = code;
    this.status = STATUS_OF[code];
    Object.defineProperty(this, kWireError, { value: true });
  }
}

/** @internal */
export function badFrame(message: string): WireError {
  return new WireError(WireErrorCode.BAD_FRAME, message);
}
/** @internal */
export function badReply(message: string): WireError {
  return new WireError(WireErrorCode.BAD_REPLY, message);
}
/** @internal */
export function badArgument(message: string): WireError {
  return new WireError(WireErrorCode.BAD_ARGUMENT, message);
}
