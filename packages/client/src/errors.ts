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
] as const;

/** One of {@link CLIENT_ERROR_CODES}. */
export type ClientErrorCode = (typeof CLIENT_ERROR_CODES)[number];

/** The one error class of `@tapwire/client`; `code` is stable, the message names the first problem. */
export class ClientError extends Error {
  /** Stable machine-readable code. */
  readonly code: ClientErrorCode;
  /** The frame status of a refused PING / STATS / RESET (`CLIENT_REFUSED`), else undefined. */
  readonly status: number | undefined;

  constructor(code: ClientErrorCode, message: string, options?: { cause?: unknown; status?: number }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = "ClientError";
    this.code = code;
    this.status = options?.status;
  }
}
