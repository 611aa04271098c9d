/**
 * Stable error codes of `@tapwire/discovery`.
 *
 * - `DISCOVERY_BAD_OPTION`: an option is missing or invalid (the message names it).
 * - `DISCOVERY_BAD_RECORD`: a member record breaks the schema (docs/operations.md).
 * - `DISCOVERY_CLOSED`: the registration or source was closed.
 */
export const DISCOVERY_ERROR_CODES = [
  "DISCOVERY_BAD_OPTION",
  "DISCOVERY_BAD_RECORD",
  "DISCOVERY_CLOSED",
] as const;

/** One of {@link DISCOVERY_ERROR_CODES}. */
export type DiscoveryErrorCode = (typeof DISCOVERY_ERROR_CODES)[number];

const kDiscoveryError: unique symbol = Symbol.for("tapwire.discovery.DiscoveryError");

/**
 * The one error class of `@tapwire/discovery`; `code` is stable. `instanceof` holds across two
 * installed copies of the package (branded with a registry symbol).
 */
export class DiscoveryError extends Error {
  /** True for any value branded by a DiscoveryError constructor of any copy of this package. */
  static override [Symbol.hasInstance](value: unknown): boolean {
    return (
      typeof value === "object" &&
      value !== null &&
      (value as Record<symbol, unknown>)[kDiscoveryError] === true
    );
  }
  /** Stable machine-readable code. */
  readonly code: DiscoveryErrorCode;
  /** The brand checked by `instanceof`. */
  readonly [kDiscoveryError] = true;
  constructor(code: DiscoveryErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "DiscoveryError";
    this.code = code;
  }
}

/** A `DISCOVERY_BAD_OPTION` naming the option, what it must be and what it was. */
export function badOption(name: string, must: string, got: unknown): DiscoveryError {
  let shown: string;
  try {
    shown = typeof got === "string" ? JSON.stringify(got) : String(got);
  } catch {
    shown = typeof got;
  }
  return new DiscoveryError("DISCOVERY_BAD_OPTION", `option ${name} must be ${must}, got ${shown}`);
}
