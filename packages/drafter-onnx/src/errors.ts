/** Stable codes of {@link OnnxDrafterError}. */
export const OnnxDrafterErrorCode = {
  /** An option is invalid; the message names it. */
  BAD_OPTION: "ONNX_DRAFTER_BAD_OPTION",
  /** The model file is not a readable ONNX model (protobuf, external data, missing graph). */
  BAD_MODEL: "ONNX_DRAFTER_BAD_MODEL",
  /** The model does not follow the head signature (docs/onnx-drafter.md): names, types, shapes, metadata. */
  BAD_SIGNATURE: "ONNX_DRAFTER_BAD_SIGNATURE",
  /** The identities recorded in the model's metadata differ from the SHA-256 of its initializers. */
  IDENTITY_MISMATCH: "ONNX_DRAFTER_IDENTITY_MISMATCH",
  /** ONNX Runtime refused to create a session (unsupported operator, provider missing, ...). */
  SESSION: "ONNX_DRAFTER_SESSION",
  /** The reference head given to the exporter is unusable. */
  BAD_HEAD: "ONNX_DRAFTER_BAD_HEAD",
} as const;
export type OnnxDrafterErrorCode = (typeof OnnxDrafterErrorCode)[keyof typeof OnnxDrafterErrorCode];

const BRAND = Symbol.for("@tapwire/drafter-onnx/OnnxDrafterError");

/** The one error class of `@tapwire/drafter-onnx`; `code` is stable, the message names the first problem. */
export class OnnxDrafterError extends Error {
  /** Stable code of the failure ({@link OnnxDrafterErrorCode}). */
  readonly code: OnnxDrafterErrorCode;
  constructor(code: OnnxDrafterErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "OnnxDrafterError";
    this.code = code;
    Object.defineProperty(this, BRAND, { value: true });
  }

  /** True for an OnnxDrafterError of any installed copy of this package (branded with `Symbol.for`). */
  static override [Symbol.hasInstance](x: unknown): boolean {
    return typeof x === "object" && x !== null && (x as Record<symbol, unknown>)[BRAND] === true;
  }
}
