/**
 * Stable error codes of `@tapwire/ec-connector`.
 *
 * - `EC_BAD_OPTION`: a constructor or function option is invalid (the message names it).
 * - `EC_BAD_ARGUMENT`: a call argument is invalid (unknown handle, bad block list, ...).
 * - `EC_MALFORMED`: a control or data-plane message failed the strict checks of EC-CONTRACT 3.
 * - `EC_CACHE_FULL`: the cache cannot make room without evicting a pinned or in-flight entry.
 * - `EC_CACHE_EXISTS`: an entry for that mm_hash already exists.
 * - `EC_CACHE_MISSING`: no entry for that mm_hash.
 * - `EC_CACHE_STATE`: the entry is in the wrong state for the call (not ready, pinned, unpin below 0).
 * - `EC_CACHE_CORRUPT`: `EmbeddingCache.check()` found broken bookkeeping.
 * - `EC_BAD_ENDPOINT`: an endpoint string cannot be parsed.
 * - `EC_CLOSED`: the object was closed.
 * - `EC_DATA`: a data-plane operation failed (connection, refusal, protocol).
 * - `EC_SHM_UNAVAILABLE`: the shm data plane cannot map here (no `koffi`, mmap refused); the socket is used.
 * - `EC_SHM_SPACE`: the shm directory has less room than a data-plane ring (the message names both sizes).
 */
export const EC_ERROR_CODES = [
  "EC_BAD_OPTION",
  "EC_BAD_ARGUMENT",
  "EC_MALFORMED",
  "EC_CACHE_FULL",
  "EC_CACHE_EXISTS",
  "EC_CACHE_MISSING",
  "EC_CACHE_STATE",
  "EC_CACHE_CORRUPT",
  "EC_BAD_ENDPOINT",
  "EC_CLOSED",
  "EC_DATA",
  "EC_SHM_UNAVAILABLE",
  "EC_SHM_SPACE",
] as const;

/** One of {@link EC_ERROR_CODES}. */
export type EcErrorCode = (typeof EC_ERROR_CODES)[number];

/** The brand every {@link EcError} carries, shared by every installed copy of this package. */
const EC_ERROR_BRAND: unique symbol = Symbol.for("@tapwire/ec-connector.EcError") as never;

/**
 * The one error class of this package; `code` is stable, `message` names the first problem.
 * `instanceof EcError` holds for an error made by another installed copy of the package too
 * (a `Symbol.for` brand, as undici's errors do).
 */
export class EcError extends Error {
  /** Stable machine-readable code. */
  readonly code: EcErrorCode;
  /** The cross-copy brand read by `instanceof` (internal). */
  readonly [EC_ERROR_BRAND] = true;

  constructor(code: EcErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "EcError";
    this.code = code;
  }

  /** True for any object carrying the brand (whichever copy of the package made it). */
  static override [Symbol.hasInstance](v: unknown): boolean {
    return typeof v === "object" && v !== null && (v as Record<symbol, unknown>)[EC_ERROR_BRAND] === true;
  }
}

/** True when `v` is a safe integer in [min, max] (the one integer-in-range check of this package). */
export function isIntInRange(v: unknown, min: number, max = Number.MAX_SAFE_INTEGER): v is number {
  return typeof v === "number" && Number.isSafeInteger(v) && v >= min && v <= max;
}

/** Throws `EC_BAD_OPTION` unless `v` is an integer in [min, max]. */
export function checkIntOption(name: string, v: unknown, min: number, max = Number.MAX_SAFE_INTEGER): number {
  if (!isIntInRange(v, min, max)) {
    throw new EcError(
      "EC_BAD_OPTION",
      `option ${name}: expected an integer in [${min}, ${max}], got ${String(v)}`,
    );
  }
  return v;
}

/** Throws `EC_BAD_OPTION` unless `v` is a finite number in [min, max]. */
export function checkNumberOption(name: string, v: unknown, min: number, max = Number.MAX_VALUE): number {
  if (typeof v !== "number" || !Number.isFinite(v) || v < min || v > max) {
    throw new EcError(
      "EC_BAD_OPTION",
      `option ${name}: expected a number in [${min}, ${max}], got ${String(v)}`,
    );
  }
  return v;
}

/** Throws `EC_BAD_OPTION` unless `v` is undefined or a function. */
export function checkFunctionOption(name: string, v: unknown): void {
  if (v !== undefined && typeof v !== "function") {
    throw new EcError("EC_BAD_OPTION", `option ${name}: expected a function, got ${typeof v}`);
  }
}
