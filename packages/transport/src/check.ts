// Argument and option checks shared by the clients, the servers and option validation.
import { TransportError } from "./errors.js";
import { MAX_TIMER_MS, type Reply } from "./options.js";

function badOption(name: string, value: unknown, want: string): TransportError {
  return new TransportError("TRANSPORT_BAD_OPTION", `option ${name}: ${String(value)} is not ${want}`);
}

/** The one integer-in-range check of this package (options, hook results). */
export function isIntIn(value: unknown, min: number, max: number): value is number {
  return typeof value === "number" && Number.isInteger(value) && value >= min && value <= max;
}

/** Validates an integer option in [min, max]; returns the default when undefined. */
export function intOption(name: string, value: unknown, dflt: number, min: number, max: number): number {
  if (value === undefined) return dflt;
  if (!isIntIn(value, min, max)) throw badOption(name, value, `an integer in [${min}, ${max}]`);
  return value;
}

/** Validates a timeout argument in ms (positive, finite) and clamps it to what timers support. */
export function timeoutArg(name: string, value: unknown): number {
  if (typeof value !== "number" || !(value > 0) || !Number.isFinite(value)) {
    throw new TransportError(
      "TRANSPORT_BAD_OPTION",
      `${name}: ${String(value)} is not a positive number of ms`,
    );
  }
  return Math.min(Math.ceil(value), MAX_TIMER_MS);
}

/** Validates the buffer arguments of a request. */
export function checkBuffers(parts: readonly Uint8Array[], replyBuf: Uint8Array): number {
  if (!(replyBuf instanceof Uint8Array)) {
    throw new TransportError("TRANSPORT_BAD_OPTION", "replyBuf: not a Uint8Array");
  }
  let total = 0;
  for (let i = 0; i < parts.length; i++) {
    const p = parts[i];
    if (!(p instanceof Uint8Array)) {
      throw new TransportError("TRANSPORT_BAD_OPTION", `parts[${i}]: not a Uint8Array`);
    }
    total += p.length;
  }
  return total;
}

const NO_PARTS: readonly Uint8Array[] = [];

/**
 * Validates a request's message arguments (one `msg`, or `parts` when `msg` is null) and returns
 * the request's byte count. Shared by every client so all schemes refuse the same input alike.
 */
export function checkRequestArgs(
  msg: Uint8Array | null,
  parts: readonly Uint8Array[],
  replyBuf: Uint8Array,
): number {
  if (msg === null) return checkBuffers(parts, replyBuf);
  if (!(msg instanceof Uint8Array)) throw new TransportError("TRANSPORT_BAD_OPTION", "msg: not a Uint8Array");
  return msg.length + checkBuffers(NO_PARTS, replyBuf);
}

/**
 * Checks a client may send a request of `total` bytes now: one outstanding request at most
 * (TRANSPORT_BUSY), an open connection (TRANSPORT_CLOSED, with the reason it closed), and the
 * size limit (TRANSPORT_TOO_LARGE). Throws in the caller's frame, so stacks name the caller.
 */
export function checkRequestState(
  endpoint: string,
  pending: boolean,
  open: boolean,
  closeReason: string,
  total: number,
  maxMessageBytes: number,
): void {
  if (pending) {
    throw new TransportError("TRANSPORT_BUSY", `a request to ${endpoint} is already outstanding`);
  }
  if (!open) throw new TransportError("TRANSPORT_CLOSED", `${endpoint}: ${closeReason}`);
  if (total > maxMessageBytes) {
    throw new TransportError(
      "TRANSPORT_TOO_LARGE",
      `request of ${total} bytes above maxMessageBytes ${maxMessageBytes}`,
    );
  }
}

/**
 * The byte count of a non-null handler (or onOversize) reply, or the error refusing it: one
 * buffer or an array of them, at most `maxMessageBytes` in all (CONTRACT 3). Shared by every
 * server, so all schemes refuse the same replies alike.
 */
export function replyBytes(r: unknown, maxMessageBytes: number): number | TransportError {
  let total = 0;
  if (r instanceof Uint8Array) {
    total = r.length;
  } else if (Array.isArray(r)) {
    for (const p of r) {
      if (!(p instanceof Uint8Array)) {
        return new TransportError("TRANSPORT_BAD_OPTION", "handler reply part is not a Uint8Array");
      }
      total += p.length;
    }
  } else {
    return new TransportError(
      "TRANSPORT_BAD_OPTION",
      "handler returned neither a Uint8Array, an array of them, nor null",
    );
  }
  if (total > maxMessageBytes) {
    return new TransportError(
      "TRANSPORT_TOO_LARGE",
      `handler reply of ${total} bytes above maxMessageBytes ${maxMessageBytes}`,
    );
  }
  return total;
}

/** A promise-like handler result (a handler may return a reply or a promise of one). */
export function isThenable(v: unknown): v is PromiseLike<Reply> {
  return typeof v === "object" && v !== null && typeof (v as { then?: unknown }).then === "function";
}
