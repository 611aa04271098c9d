/**
 * Stable error codes of `@tapwire/client`.
 *
 * - `CLIENT_BAD_OPTION`: a constructor option is missing or out of range (the message names it).
 * - `CLIENT_BAD_ARGUMENT`: a call argument breaks a rule the worker would refuse (CONTRACT 7.2).
 * - `CLIENT_NOT_READY`: PING / STATS / RESET without a ready connection.
 * - `CLIENT_CLOSED`: the client was closed.
 * - `CLIENT_DISABLED`: the client is disabled (CONTRACT 9.3).
 * - `CLIENT_BAD_REPLY`: a PING / STATS / RESET reply that does not echo its request or cannot be parsed.
 * - `CLIENT_REFUSED`: a PING / STATS / RESET answered with a non-OK frame status.
 * - `CLIENT_TRANSPORT`: a PING / STATS / RESET failed in the transport (timeout, closed); `cause` holds the transport error.
 * - `CLIENT_INTERNAL`: a bug in the client (an impossible connection-state transition); never expected.
 */
export const CLIENT_ERROR_CODES = [
  "CLIENT_BAD_OPTION",
  "CLIENT_BAD_ARGUMENT",
  "CLIENT_NOT_READY",
  "CLIENT_CLOSED",
  "CLIENT_DISABLED",
  "CLIENT_BAD_REPLY",
  "CLIENT_REFUSED",
  "CLIENT_TRANSPORT",
  "CLIENT_INTERNAL",
] as const;

/** One of {@link CLIENT_ERROR_CODES}. */
export type ClientErrorCode = (typeof CLIENT_ERROR_CODES)[number];

// Branded with a registry symbol so that `instanceof` holds across two installed copies of the
// package (the undici `lib/core/errors.js` pattern): the brand, not the prototype, decides.
const kClientError: unique symbol = Symbol.for("tapwire.client.ClientError");

/**
 * The one error class of `@tapwire/client`; `code` is stable, the message names the first problem.
 * `instanceof ClientError` is true for a ClientError of any installed copy of the package.
 */
export class ClientError extends Error {
  /** True for any value branded by a ClientError constructor of any copy of this package. */
  static override [Symbol.hasInstance](value: unknown): boolean {
    return (
      typeof value === "object" && value !== null && (value as Record<symbol, unknown>)[kClientError] === true
    );
  }

  /** Stable machine-readable code. */
  readonly code: ClientErrorCode;
  /** The frame status of a refused PING / STATS / RESET (`CLIENT_REFUSED`), else undefined. */
  readonly status: number | undefined;

  constructor(code: ClientErrorCode, message: string, options?: { cause?: unknown; status?: number }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = "ClientError";
    this.code = code;
    this.status = options?.status;
    Object.defineProperty(this, kClientError, { value: true });
  }
}
