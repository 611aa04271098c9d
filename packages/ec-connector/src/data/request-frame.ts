import { EcError } from "../errors.js";
import { LEN_BYTES, MAX_READER_BYTES } from "./frame.js";

/**
 * docs/ec-protocol.md 3.5 (tapwire 1.2, optional capability `data_req`): the XFER_REQ frame, a
 * transfer request sent on the data connection itself. It carries the XferReq map (EC-CONTRACT 3,
 * the same MessagePack bytes the control plane would carry) and the byte count the reader expects;
 * the producer validates and grants it as a control-plane XferReq (EC-CONTRACT 4.2, 5.3, 9.2) and
 * answers on the same connection: ACK then DATA and the bytes, or an ACK with `final` (a NACK).
 */
export const XFER_REQ_OP = 0x0c;
/** Fixed part of an XFER_REQ body: op, reserved, three u16 lengths, u64 `nbytes`. */
export const XFER_REQ_FIXED = 16;
/** Longest XferReq map an XFER_REQ carries, bytes (its strings are at most 256 bytes each). */
export const MAX_XFER_REQ_BYTES = 2048;
/** Longest instance id, bytes (as for READ). */
const MAX_INSTANCE_BYTES = 256;
/** Largest XFER_REQ body (a server buffers at most this for one). */
export const MAX_XFER_REQ_FRAME_BYTES =
  XFER_REQ_FIXED + MAX_READER_BYTES + MAX_INSTANCE_BYTES + MAX_XFER_REQ_BYTES;

/** A decoded XFER_REQ (docs/ec-protocol.md 3.5). */
export interface XferReqFrame {
  /** The reader's label, as READ's `reader`. */
  readonly reader: string;
  /** The server instance the reader means (READ's `instance`, loosely decoded). */
  readonly instance: string;
  /** The byte count the reader expects (must equal the grant's). */
  readonly nbytes: number;
  /** The XferReq map, MessagePack (decoded strictly by the producer, EC-CONTRACT 3, 9.1). */
  readonly req: Uint8Array;
}

const UTF8 = new TextEncoder();
const UTF8_FATAL = new TextDecoder("utf-8", { fatal: true });
const UTF8_LOOSE = new TextDecoder("utf-8");

function malformed(what: string): never {
  throw new EcError("EC_MALFORMED", `data frame: ${what}`);
}

/** True for a body whose op is XFER_REQ. */
export function isXferReqOp(op: number | undefined): boolean {
  return op === XFER_REQ_OP;
}

/** The XFER_REQ frame's bytes (length prefix included). */
export function encodeXferReqFrame(f: {
  /** The reader's label (or its UTF-8 bytes, encoded once by the caller). */
  reader: string | Uint8Array;
  /** The server's instance id (or its UTF-8 bytes). */
  instance: string | Uint8Array;
  nbytes: number;
  req: Uint8Array;
}): Buffer {
  const reader = typeof f.reader === "string" ? UTF8.encode(f.reader) : f.reader;
  const instance = typeof f.instance === "string" ? UTF8.encode(f.instance) : f.instance;
  if (reader.length > MAX_READER_BYTES || instance.length < 1 || instance.length > MAX_INSTANCE_BYTES) {
    throw new EcError("EC_BAD_ARGUMENT", "XFER_REQ: reader or instance out of range");
  }
  if (f.req.length < 1 || f.req.length > MAX_XFER_REQ_BYTES) {
    throw new EcError(
      "EC_BAD_ARGUMENT",
      `XFER_REQ: request of ${f.req.length} bytes outside [1, ${MAX_XFER_REQ_BYTES}]`,
    );
  }
  const body = XFER_REQ_FIXED + reader.length + instance.length + f.req.length;
  const b = Buffer.allocUnsafe(LEN_BYTES + body);
  b.writeUInt32LE(body, 0);
  b[4] = XFER_REQ_OP;
  b[5] = 0;
  b.writeUInt16LE(reader.length, 6);
  b.writeUInt16LE(instance.length, 8);
  b.writeUInt16LE(f.req.length, 10);
  b.writeUInt32LE(f.nbytes % 0x1_0000_0000, 12);
  b.writeUInt32LE(Math.floor(f.nbytes / 0x1_0000_0000), 16);
  let off = LEN_BYTES + XFER_REQ_FIXED;
  b.set(reader, off);
  off += reader.length;
  b.set(instance, off);
  off += instance.length;
  b.set(f.req, off);
  return b;
}

/**
 * Decodes an XFER_REQ body (after the length prefix). Every length is checked against the body
 * before anything is read; throws `EC_MALFORMED` naming the first problem.
 */
export function decodeXferReqFrame(body: Uint8Array): XferReqFrame {
  const b = Buffer.from(body.buffer, body.byteOffset, body.length);
  if (b.length < XFER_REQ_FIXED) malformed("XFER_REQ shorter than its fixed part");
  if (b[0] !== XFER_REQ_OP) malformed(`not an XFER_REQ (op ${b[0]})`);
  if (b[1] !== 0) malformed("XFER_REQ reserved byte is not 0");
  const readerLen = b.readUInt16LE(2);
  const instanceLen = b.readUInt16LE(4);
  const reqLen = b.readUInt16LE(6);
  if (readerLen > MAX_READER_BYTES) malformed(`XFER_REQ reader_len ${readerLen} over ${MAX_READER_BYTES}`);
  if (instanceLen < 1 || instanceLen > MAX_INSTANCE_BYTES) {
    malformed(`XFER_REQ instance_len ${instanceLen} outside [1, ${MAX_INSTANCE_BYTES}]`);
  }
  if (reqLen < 1 || reqLen > MAX_XFER_REQ_BYTES) {
    malformed(`XFER_REQ req_len ${reqLen} outside [1, ${MAX_XFER_REQ_BYTES}]`);
  }
  if (b.length !== XFER_REQ_FIXED + readerLen + instanceLen + reqLen) {
    malformed("XFER_REQ body_len does not match its field lengths");
  }
  const hi = b.readUInt32LE(12);
  if (hi >= 0x20_0000) malformed("u64 beyond 2^53 - 1");
  const nbytes = hi * 0x1_0000_0000 + b.readUInt32LE(8);
  let off = XFER_REQ_FIXED;
  let reader: string;
  // Issue 23: ASCII (the usual label) is valid UTF-8 and reads the same as latin1, without a
  // TextDecoder call; anything else goes through the fatal decoder as before.
  if (isAscii(b, off, readerLen)) reader = b.toString("latin1", off, off + readerLen);
  else {
    try {
      reader = UTF8_FATAL.decode(b.subarray(off, off + readerLen));
    } catch {
      return malformed("XFER_REQ reader is not UTF-8");
    }
  }
  off += readerLen;
  // Not UTF-8 cannot be this server's (hex) instance: answered ERROR 1, as for READ (3.1).
  const instance = isAscii(b, off, instanceLen)
    ? b.toString("latin1", off, off + instanceLen)
    : UTF8_LOOSE.decode(b.subarray(off, off + instanceLen));
  off += instanceLen;
  return { reader, instance, nbytes, req: b.subarray(off, off + reqLen) };
}

function isAscii(b: Uint8Array, off: number, len: number): boolean {
  for (let i = off; i < off + len; i++) if (b[i]! >= 0x80) return false;
  return true;
}
