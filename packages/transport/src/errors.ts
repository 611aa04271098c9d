/**
 * Stable error codes of `@tapwire/transport`. The `code` of a {@link TransportError} is always
 * one of these strings.
 */
export const TransportErrorCode = {
  /** A request got no complete reply within its timeout; the connection was closed (CONTRACT 3). */
  TIMEOUT: "TRANSPORT_TIMEOUT",
  /** Not connected, or the connection was closed (by `close()`, by the peer, or after an error). */
  CLOSED: "TRANSPORT_CLOSED",
  /** A length prefix (or ZeroMQ message) above `maxMessageBytes`; the connection was closed. */
  TOO_LARGE: "TRANSPORT_TOO_LARGE",
  /** The reply did not fit the caller's reply buffer; the connection was closed. */
  REPLY_TOO_LARGE: "TRANSPORT_REPLY_TOO_LARGE",
  /** `connect()` failed: refused, unreachable, TLS handshake refused, or not done within its timeout. */
  CONNECT: "TRANSPORT_CONNECT",
  /** A second request (or connect) was started while one is outstanding on this client. */
  BUSY: "TRANSPORT_BUSY",
  /** The endpoint string is not one of the supported URL forms. */
  BAD_ENDPOINT: "TRANSPORT_BAD_ENDPOINT",
  /** An option has an invalid value (the message names the option). */
  BAD_OPTION: "TRANSPORT_BAD_OPTION",
  /** `listen()` could not bind (address in use, permission, path in use by a live server). */
  LISTEN: "TRANSPORT_LISTEN",
  /** The peer broke the framing: unsolicited bytes, bytes after the reply. The connection was closed. */
  PROTOCOL: "TRANSPORT_PROTOCOL",
  /** A `zmq+` endpoint was used but the optional peer dependency `zeromq` is not installed (the message names the install command). */
  ZMQ_MISSING: "TRANSPORT_ZMQ_MISSING",
  /** shm (issue 23): shared memory could not be mapped (no `koffi`, mmap refused); the client falls back to the socket. */
  SHM_UNAVAILABLE: "TRANSPORT_SHM_UNAVAILABLE",
  /** shm (issue 23): the shm directory (/dev/shm) has less room than a session mapping needs; the message names both sizes. */
  SHM_SPACE: "TRANSPORT_SHM_SPACE",
} as const;

/** Union of the stable error code strings. */
export type TransportErrorCode = (typeof TransportErrorCode)[keyof typeof TransportErrorCode];

// Brand shared by every installed copy of this package, so `instanceof` holds across two copies
// (undici lib/core/errors.js does the same).
const kTransportError = Symbol.for("@tapwire/transport.TransportError");

/**
 * The one error class of `@tapwire/transport`. Errors of a request are created when the request is
 * made, so their stack names the caller, even when the failure is detected later. `instanceof
 * TransportError` is true for errors of any installed copy of this package (a `Symbol.for` brand).
 */
export class TransportError extends Error {
  /** Stable machine-readable code. */
  readonly code: TransportErrorCode;

  constructor(code: TransportErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "TransportError";
    this.code = code;
  }

  /** True for a TransportError of any copy of this package. */
  static override [Symbol.hasInstance](instance: unknown): boolean {
    return (
      typeof instance === "object" &&
      instance !== null &&
      (instance as { [kTransportError]?: unknown })[kTransportError] === true
    );
  }

  /** The cross-copy brand `Symbol.for("@tapwire/transport.TransportError")` that `instanceof` reads; always true. */
  get [kTransportError](): true {
    return true;
  }
}

/**
 * Holds the caller's stack (captured cheaply once per call) so that an error detected later, in a
 * socket callback, still shows where the call was made.
 */
export class CallSite {
  declare readonly stack: string;
  constructor(fn: (...args: never[]) => unknown) {
    Error.captureStackTrace(this, fn);
  }

  /** A {@link TransportError} whose stack is the caller's stack. */
  error(code: TransportErrorCode, message: string, cause?: unknown): TransportError {
    const err =
      cause === undefined ? new TransportError(code, message) : new TransportError(code, message, { cause });
    const site = this.stack;
    const nl = site.indexOf("\n");
    err.stack = `TransportError [${code}]: ${message}${nl < 0 ? "" : site.slice(nl)}`;
    return err;
  }
}

/**
 * A request's failure, carried as a value to the request's own async frame where it becomes a
 * {@link TransportError}: created there, the error's (zero-cost, async) stack names the caller,
 * without capturing a stack for every request that succeeds.
 */
export class Failure {
  constructor(
    readonly code: TransportErrorCode,
    readonly why: string,
    readonly cause: unknown,
  ) {}

  toError(): TransportError {
    return this.cause === undefined
      ? new TransportError(this.code, this.why)
      : new TransportError(this.code, this.why, { cause: this.cause });
  }
}
