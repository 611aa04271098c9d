/**
 * Stable error codes of `@tapwire/reference-model`.
 *
 * - `RM_BAD_CONFIG`: a model or head configuration option is out of range (the message names it).
 * - `RM_BAD_ARGUMENT`: a call argument is invalid (token outside the vocabulary, buffer too small, ...).
 * - `RM_SAFETENSORS_TRUNCATED`: the file is shorter than its header says.
 * - `RM_SAFETENSORS_HEADER`: the header length or JSON is invalid.
 * - `RM_SAFETENSORS_DTYPE`: a tensor has an unknown dtype.
 * - `RM_SAFETENSORS_SHAPE`: a tensor shape is invalid or does not match its byte length.
 * - `RM_SAFETENSORS_OFFSETS`: data offsets are out of range, overlapping or leave holes.
 * - `RM_BAD_WEIGHTS`: a weights file is well-formed but does not describe a usable head.
 */
export const ReferenceModelErrorCode = {
  BAD_CONFIG: "RM_BAD_CONFIG",
  BAD_ARGUMENT: "RM_BAD_ARGUMENT",
  SAFETENSORS_TRUNCATED: "RM_SAFETENSORS_TRUNCATED",
  SAFETENSORS_HEADER: "RM_SAFETENSORS_HEADER",
  SAFETENSORS_DTYPE: "RM_SAFETENSORS_DTYPE",
  SAFETENSORS_SHAPE: "RM_SAFETENSORS_SHAPE",
  SAFETENSORS_OFFSETS: "RM_SAFETENSORS_OFFSETS",
  BAD_WEIGHTS: "RM_BAD_WEIGHTS",
} as const;

/** One of the {@link ReferenceModelErrorCode} values. */
export type ReferenceModelErrorCode = (typeof ReferenceModelErrorCode)[keyof typeof ReferenceModelErrorCode];

/** The one error class of this package; `code` is stable, the message names the first problem. */
export class ReferenceModelError extends Error {
  /** Stable machine-readable code. */
  readonly code: ReferenceModelErrorCode;

  constructor(code: ReferenceModelErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "ReferenceModelError";
    this.code = code;
  }
}

/** @internal */
export function badConfig(message: string): ReferenceModelError {
  return new ReferenceModelError("RM_BAD_CONFIG", message);
}

/** @internal */
export function badArgument(message: string): ReferenceModelError {
  return new ReferenceModelError("RM_BAD_ARGUMENT", message);
}

/** @internal Checks that `value` is an integer in `[min, max]`, naming `name` otherwise. */
export function checkInt(name: string, value: unknown, min: number, max: number): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < min || value > max) {
    throw badConfig(`${name} must be an integer in [${min}, ${max}], got ${String(value)}`);
  }
  return value;
}
