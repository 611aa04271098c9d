import { checkU8, checkU32, rd16, rd32, wr16, wr32 } from "./bytes.js";
import { APP_HEADER_SIZE, frameStatusName, MAGIC_U32, VERSION } from "./constants.js";
import { badArgument, badFrame, WireError, WireErrorCode } from "./errors.js";

// CONTRACT 4: header field offsets.
/** Offset of `magic` (4 bytes, "DSPK"). */
const OFF_MAGIC = 0;
/** Offset of `version` (u16). */
const OFF_VERSION = 4;
/** Offset of `op` (u8). */
const OFF_OP = 6;
/** Offset of `status` (u8): 0 in requests, a frame status in replies. */
const OFF_STATUS = 7;
/** Offset of `seq` (u32). */
const OFF_SEQ = 8;
/** Offset of `session` (u32). */
const OFF_SESSION = 12;
/** Offset of `body_len` (u32). */
const OFF_BODY_LEN = 16;
/** Offset of `reserved` (u32, 0). */
const OFF_RESERVED = 20;

/** The fields of the 24-byte application header (CONTRACT 4). */
export interface FrameHeader {
  /** Operation code ({@link Op}). */
  op: number;
  /** 0 in requests; a {@link FrameStatus} in replies. */
  status: number;
  /** Request sequence number (u32); replies echo it. */
  seq: number;
  /** Session id (u32); replies echo it. */
  session: number;
  /** Bytes after the header. */
  bodyLen: number;
}

/** Options of {@link decodeHeader} and {@link splitFrame}. */
export interface DecodeHeaderOptions {
  /** The frame is a request: its `status` byte MUST be 0, else BAD_FRAME (CONTRACT 4). */
  request?: boolean;
}

/**
 * Writes a header at `offset` of `buf` (magic, version 1, reserved 0).
 * @throws WireError `WIRE_BAD_ARGUMENT` when a field is out of range or `buf` is too small.
 */
export function encodeHeader(buf: Uint8Array, offset: number, h: FrameHeader): void {
  if (!Number.isInteger(offset) || offset < 0 || offset + APP_HEADER_SIZE > buf.length) {
    throw badArgument(`header at offset ${offset} does not fit a buffer of ${buf.length} bytes`);
  }
  checkU8("op", h.op);
  checkU8("status", h.status);
  checkU32("seq", h.seq);
  checkU32("session", h.session);
  checkU32("bodyLen", h.bodyLen);
  writeHeaderUnchecked(buf, offset, h.op, h.status, h.seq, h.session, h.bodyLen);
}

/** @internal Header write without argument checks, for callers that checked already. */
export function writeHeaderUnchecked(
  buf: Uint8Array,
  o: number,
  op: number,
  status: number,
  seq: number,
  session: number,
  bodyLen: number,
): void {
  wr32(buf, o + OFF_MAGIC, MAGIC_U32);
  wr16(buf, o + OFF_VERSION, VERSION);
  buf[o + OFF_OP] = op;
  buf[o + OFF_STATUS] = status;
  wr32(buf, o + OFF_SEQ, seq);
  wr32(buf, o + OFF_SESSION, session);
  wr32(buf, o + OFF_BODY_LEN, bodyLen);
  wr32(buf, o + OFF_RESERVED, 0);
}

function checkLength(msg: Uint8Array, length: number | undefined): number {
  if (length === undefined) return msg.length;
  if (!Number.isInteger(length) || length < 0 || length > msg.length) {
    throw badArgument(`length ${length} outside the ${msg.length}-byte message`);
  }
  return length;
}

/**
 * Reads and checks the header of the message `msg[0, length)` (CONTRACT 4): at least 24 bytes,
 * magic "DSPK", version 1 (else `WIRE_BAD_VERSION`), reserved 0, and `24 + body_len == length`;
 * with `{ request: true }` also a zero status byte. Every failure but the version is
 * `WIRE_BAD_FRAME` with `status` BAD_FRAME, naming the first problem.
 */
export function decodeHeader(msg: Uint8Array, length?: number, options?: DecodeHeaderOptions): FrameHeader {
  const n = checkLength(msg, length);
  if (n < APP_HEADER_SIZE) throw badFrame(`frame of ${n} bytes is shorter than the 24-byte header`);
  const magic = rd32(msg, OFF_MAGIC);
  if (magic !== MAGIC_U32) {
    throw badFrame(
      `bad magic 0x${magic.toString(16).padStart(8, "0")} (want "DSPK" 0x4b505344 little-endian)`,
    );
  }
  const version = rd16(msg, OFF_VERSION);
  if (version !== VERSION) {
    throw new WireError(WireErrorCode.BAD_VERSION, `unsupported version ${version} (want ${VERSION})`);
  }
  const reserved = rd32(msg, OFF_RESERVED);
  if (reserved !== 0) throw badFrame(`header reserved field is ${reserved}, not 0`);
  const bodyLen = rd32(msg, OFF_BODY_LEN);
  if (bodyLen !== n - APP_HEADER_SIZE) {
    throw badFrame(`body_len ${bodyLen} does not match the ${n - APP_HEADER_SIZE} bytes after the header`);
  }
  const status = msg[OFF_STATUS]!;
  if (options?.request === true && status !== 0) {
    throw badFrame(`request status byte is ${status} (${frameStatusName(status)}), not 0`);
  }
  return {
    op: msg[OFF_OP]!,
    status,
    seq: rd32(msg, OFF_SEQ),
    session: rd32(msg, OFF_SESSION),
    bodyLen,
  };
}

/**
 * The `op`, `seq` and `session` of a header that could not be decoded, each read only when its
 * bytes are wholly present in `msg[0, length)` and 0 otherwise, so that a worker can echo them in
 * its BAD_FRAME answer (CONTRACT 4). Never throws for any input.
 */
export function partialHeader(
  msg: Uint8Array,
  length?: number,
): { op: number; seq: number; session: number } {
  const n = Math.min(
    msg.length,
    length !== undefined && Number.isInteger(length) && length >= 0 ? length : msg.length,
  );
  return {
    op: n >= OFF_OP + 1 ? msg[OFF_OP]! : 0,
    seq: n >= OFF_SEQ + 4 ? rd32(msg, OFF_SEQ) : 0,
    session: n >= OFF_SESSION + 4 ? rd32(msg, OFF_SESSION) : 0,
  };
}

/**
 * A new message: header plus a copy of `body` (empty when omitted). `status` defaults to 0.
 * For hot paths write into a preallocated buffer instead ({@link encodeHeader},
 * {@link writeStepPrefix}, {@link beginStepReply}).
 */
export function frame(
  h: { op: number; status?: number; seq: number; session: number },
  body?: Uint8Array,
): Uint8Array {
  const len = body?.length ?? 0;
  const out = new Uint8Array(APP_HEADER_SIZE + len);
  encodeHeader(out, 0, { op: h.op, status: h.status ?? 0, seq: h.seq, session: h.session, bodyLen: len });
  if (body !== undefined) out.set(body, APP_HEADER_SIZE);
  return out;
}

/**
 * Checks the header of `msg[0, length)` ({@link decodeHeader}) and returns it with the body as a
 * view (no copy) of `msg`.
 */
export function splitFrame(
  msg: Uint8Array,
  length?: number,
  options?: DecodeHeaderOptions,
): { header: FrameHeader; body: Uint8Array } {
  const header = decodeHeader(msg, length, options);
  return { header, body: msg.subarray(APP_HEADER_SIZE, APP_HEADER_SIZE + header.bodyLen) };
}
