import { APP_HEADER_SIZE, encodeHeader, FrameStatus, WireError } from "@tapwire/wire";
import type { CoreMetrics } from "./metrics.js";

/**
 * @internal A reply with a small body (copied) in a buffer of its own: HELLO, every non-OK
 * status, PING, STATS, RESET. Counted by status and bytes.
 */
export function smallReply(
  m: CoreMetrics,
  op: number,
  status: number,
  seq: number,
  session: number,
  body?: Uint8Array,
): Uint8Array {
  const len = body?.length ?? 0;
  const out = new Uint8Array(APP_HEADER_SIZE + len);
  encodeHeader(out, 0, { op, status, seq, session, bodyLen: len });
  if (body !== undefined) out.set(body, APP_HEADER_SIZE);
  m.replies[status]?.inc();
  m.bytesOut.inc(out.length);
  return out;
}

/** @internal The frame status a worker answers for a decode error (CONTRACT 5): its own, else BAD_FRAME. */
export function statusOf(e: unknown): number {
  if (e instanceof WireError && e.status !== undefined) return e.status;
  return FrameStatus.BAD_FRAME;
}
