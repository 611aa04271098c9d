import { checkU8, checkU32, rd16, rd32, wr16, wr32 } from "./bytes.js";
import { APP_HEADER_SIZE, frameStatusName, MAGIC_U32, VERSION } from "./constants.js";
import { badArgument, badFrame, WireError, WireErrorCode } from "./errors.js";

/**
 * Byte offsets of the fields of the 24-byte application header (CONTRACT 4): `magic` (4 bytes,
 * "DSPK"), `version` (u16), `op` (u8), `status` (u8; 0 in requests), `seq`, `session`,
 * `body_len` and `reserved` (u32 each, little-endian).
 */
export const HeaderOffset = {
  MAGIC: 0,
  VERSION: 4,
  OP: 6,
  STATUS: 7,
  SEQ: 8,
  SESSION: 12,
  BODY_LEN: 16,
  RESERVED: 20,
} as const;
const OFF_MAGIC = HeaderOffset.MAGIC;
const OFF_VERSION = HeaderOffset.VERSION;
const OFF_OP = HeaderOffset.OP;
const OFF_STATUS = HeaderOffset.STATUS;
const OFF_SEQ = HeaderOffset.SEQ;
const OFF_SESSION = HeaderOffset.SESSION;
const OFF_BODY_LEN = HeaderOffset.BODY_LEN;
const OFF_RESERVED = HeaderOffset.RESERVED;

/** Every field of a header as it stands, read by {@link peekHeader} without any check. */
export interface HeaderPeek {
  /** `magic` as a little-endian u32 ({@link MAGIC_U32} when it is "DSPK"). */
  magic: number;
  /** `version` (u16). */
  version: number;
  /** `op` (u8). */
  op: number;
  /** `status` (u8). */
  status: number;
  /** `seq` (u32). */
  seq: number;
  /** `session` (u32). */
  session: number;
  /** `body_len` (u32). */
  bodyLen: number;
  /** `reserved` (u32). */
  reserved: number;
}

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
  const h = examineHeader(msg, checkLength(msg, length), options?.request === true);
  if (h instanceof Error) throw h; // plain Error check: no branded hasInstance call on the hot path
  return h;
}

/**
 * The header of a request message of `length` bytes of which `head` holds at least the first 24,
 * when it passes every check of {@link decodeHeader} with `{ request: true }`; null otherwise
 * (and when `head` is shorter than 24 bytes). Never throws. For a receiver that sees a message's
 * first bytes before the rest (a transport's placement hook, CONTRACT 3).
 */
export function peekRequestHeader(head: Uint8Array, length: number): FrameHeader | null {
  if (head.length < APP_HEADER_SIZE || !Number.isInteger(length)) return null;
  const h = examineHeader(head, length, true);
  return h instanceof Error ? null : h;
}

// The checks of CONTRACT 4 on the header of a message of `n` bytes; reads only msg[0, 24) once
// n >= 24. The first problem is returned as an error, not thrown.
function examineHeader(msg: Uint8Array, n: number, request: boolean): FrameHeader | WireError {
  if (n < APP_HEADER_SIZE) return badFrame(`frame of ${n} bytes is shorter than the 24-byte header`);
  const magic = rd32(msg, OFF_MAGIC);
  if (magic !== MAGIC_U32) {
    return badFrame(
      `bad magic 0x${magic.toString(16).padStart(8, "0")} (want "DSPK" 0x4b505344 little-endian)`,
    );
  }
  const version = rd16(msg, OFF_VERSION);
  if (version !== VERSION) {
    return new WireError(WireErrorCode.BAD_VERSION, `unsupported version ${version} (want ${VERSION})`);
  }
  const reserved = rd32(msg, OFF_RESERVED);
  if (reserved !== 0) return badFrame(`header reserved field is ${reserved}, not 0`);
  const bodyLen = rd32(msg, OFF_BODY_LEN);
  if (bodyLen !== n - APP_HEADER_SIZE) {
    return badFrame(`body_len ${bodyLen} does not match the ${n - APP_HEADER_SIZE} bytes after the header`);
  }
  const status = msg[OFF_STATUS]!;
  if (request && status !== 0) {
    return badFrame(`request status byte is ${status} (${frameStatusName(status)}), not 0`);
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
 * The fields of the header at the start of `msg` as they stand, without checking any of them
 * (see {@link decodeHeader} for the checks), or null when fewer than 24 bytes are present. For
 * receivers that must look at a header before the message is whole: a transport's placement or
 * oversize hook, which sees only the first bytes of a message (CONTRACT 3, 11).
 */
export function peekHeader(msg: Uint8Array): HeaderPeek | null {
  if (msg.length < APP_HEADER_SIZE) return null;
  return {
    magic: rd32(msg, OFF_MAGIC),
    version: rd16(msg, OFF_VERSION),
    op: msg[OFF_OP]!,
    status: msg[OFF_STATUS]!,
    seq: rd32(msg, OFF_SEQ),
    session: rd32(msg, OFF_SESSION),
    bodyLen: rd32(msg, OFF_BODY_LEN),
    reserved: rd32(msg, OFF_RESERVED),
  };
}

/**
 * True when the header of the message `msg[0, length)` can be read at all (CONTRACT 4): at least
 * 24 bytes, magic "DSPK", and `24 + body_len == length`. A worker answers a message failing this
 * with BAD_FRAME echoing {@link partialHeader} and closes the connection; a readable header with
 * another fault (version, reserved, status byte) is answered by {@link decodeHeader}'s error on
 * an open connection. Never throws.
 */
export function headerReadable(msg: Uint8Array, length?: number): boolean {
  const n =
    length !== undefined && Number.isInteger(length) && length >= 0
      ? Math.min(length, msg.length)
      : msg.length;
  return (
    n >= APP_HEADER_SIZE &&
    rd32(msg, OFF_MAGIC) === MAGIC_U32 &&
    rd32(msg, OFF_BODY_LEN) === n - APP_HEADER_SIZE
  );
}

/**
 * The `op`, `seq` and `session` of a header that could not be decoded, each read only when its
 * bytes are wholly present in `msg[0, length)` and 0 otherwise, so that a worker can echo them in
 * its BAD_FRAME answer (CONTRACT 4). Never throws for any input.
 */
export function partialHeader(
  msg: Uint8Array,
  length?: number,
): {
  /** Header `op` (byte 6), or 0 when the message is shorter than 7 bytes. */
  op: number;
  /** Header `seq` (u32 LE at bytes 8–11), or 0 when those bytes are not all present. */
  seq: number;
  /** Header `session` (u32 LE at bytes 12–15), or 0 when those bytes are not all present. */
  session: number;
} {
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
): {
  /** The decoded, checked 24-byte application header. */
  header: FrameHeader;
  /** The body, `header.bodyLen` bytes from offset 24: a view into `msg`, not a copy. */
  body: Uint8Array;
} {
  const header = decodeHeader(msg, length, options);
  return { header, body: msg.subarray(APP_HEADER_SIZE, APP_HEADER_SIZE + header.bodyLen) };
}
