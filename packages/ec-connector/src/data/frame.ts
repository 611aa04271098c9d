import { EcError } from "../errors.js";

/** Data-plane frame header: a u32 little-endian length of the frame body that follows. */
export const LEN_BYTES = 4;
/** Largest data-plane control frame (a READ with many block ids fits easily). */
export const MAX_DATA_FRAME_BYTES = 1 << 20;
/** Longest grant key / notification message in bytes. */
export const MAX_KEY_BYTES = 1024;
/** Longest `reader` agent name in a READ, bytes. */
export const MAX_READER_BYTES = 512;

/** Why a data server refuses a READ (EC-CONTRACT 5.3), with its wire number. */
export const REFUSAL_CODES = {
  instance_mismatch: 1,
  no_grant: 2,
  expired: 3,
  blocks_mismatch: 4,
  bad_nbytes: 5,
} as const;
/** One of the {@link REFUSAL_CODES} names. */
export type RefusalCode = keyof typeof REFUSAL_CODES;

/** READ (reader → server): stream the granted `blocks` of `key`. */
export interface ReadFrame {
  readonly op: "read";
  readonly key: Uint8Array;
  readonly blocks: readonly number[];
  readonly nbytes: number;
  readonly reader: string;
  readonly instance: string;
}
/**
 * READ_AHEAD (reader → server, tapwire 1.2 capability, docs/ec-protocol.md 3.2): stream the blocks
 * of the grant `key` as soon as it exists (waiting up to `waitMs`), `nbytes` being the grant's byte
 * count; sent only to a producer whose XferAck carried `read_ahead` = 1.
 */
export interface ReadAheadFrame {
  readonly op: "read_ahead";
  readonly key: Uint8Array;
  readonly nbytes: number;
  readonly waitMs: number;
  readonly reader: string;
  readonly instance: string;
  /**
   * docs/ec-protocol.md 3.3 (flags bit 0, `ack_first`): the server sends the grant's XferAck as an
   * ACK frame before DATA. Only to a producer whose XferAck carried `ack_ahead` = 1.
   */
  readonly ackFirst?: boolean;
}
/** NOTIF (reader → server): the read of `msg` (the grant key) is complete. */
export interface NotifFrame {
  readonly op: "notif";
  readonly msg: Uint8Array;
}
/** DATA (server → reader): `nbytes` raw block bytes follow. */
export interface DataFrame {
  readonly op: "data";
  readonly nbytes: number;
}
/**
 * ACK (server → reader, docs/ec-protocol.md 3.3): the XferAck of the grant a READ_AHEAD with
 * `ack_first` waits for, the same MessagePack bytes the control plane carries; DATA follows.
 */
export interface AckFrame {
  readonly op: "ack";
  readonly ack: Uint8Array;
  /**
   * docs/ec-protocol.md 3.5 (flags bit 0, `final`): no DATA follows (the answer to an XFER_REQ
   * that was NACKed); the connection is then free for the next request. Only to an XFER_REQ.
   */
  readonly final?: boolean;
}
/** ERROR (server → reader): the READ is refused; the server then closes. */
export interface ErrorFrame {
  readonly op: "error";
  readonly code: RefusalCode;
  readonly message: string;
}
/** Frames a data server receives. */
export type ToServer = ReadFrame | NotifFrame | ReadAheadFrame;
/** Frames a reader receives. */
export type ToReader = DataFrame | ErrorFrame | AckFrame;

/** Frame op codes (the first body byte; docs/ec-protocol.md "Data plane wire format"). */
export const DATA_OPS = {
  read: 0x01,
  data: 0x02,
  error: 0x03,
  notif: 0x04,
  read_ahead: 0x05,
  ack: 0x06,
} as const;

/** Longest XferAck an ACK frame carries: the control plane's 64 KiB limit (EC-CONTRACT 9.1). */
export const MAX_ACK_BYTES = 64 * 1024;
/** Fixed part of an ACK body: op and 3 reserved bytes. */
export const ACK_FIXED = 4;
/** Largest ACK body a reader accepts (only on a READ_AHEAD that asked for it). */
export const MAX_ACK_FRAME_BYTES = ACK_FIXED + MAX_ACK_BYTES;

/** Longest wait a READ_AHEAD may ask for, ms (docs/ec-protocol.md 3.2). */
export const MAX_READ_AHEAD_WAIT_MS = 60_000;

/** Fixed part of each frame body, bytes (the variable fields follow it). */
const READ_FIXED = 20;
const DATA_FIXED = 12;
const ERROR_FIXED = 4;
const NOTIF_FIXED = 4;
/** Longest instance id in a READ, bytes. */
const MAX_INSTANCE_BYTES = 256;
/** Longest ERROR message, bytes. */
const MAX_ERROR_MESSAGE_BYTES = 1024;
/** Largest frame body a reader accepts (an ERROR with the longest message; DATA is 12). */
export const MAX_READER_FRAME_BYTES = ERROR_FIXED + MAX_ERROR_MESSAGE_BYTES;
/** Largest READ body for a server of `numBlocks` blocks (what its receive buffer is sized from). */
export function maxReadFrameBytes(numBlocks: number): number {
  return Math.min(
    MAX_DATA_FRAME_BYTES,
    READ_FIXED + MAX_KEY_BYTES + MAX_READER_BYTES + MAX_INSTANCE_BYTES + 4 * numBlocks,
  );
}
const CODE_NAMES = Object.fromEntries(Object.entries(REFUSAL_CODES).map(([k, v]) => [v, k])) as Record<
  number,
  RefusalCode
>;
const UTF8 = new TextEncoder();
const UTF8_FATAL = new TextDecoder("utf-8", { fatal: true });
/** For `instance`: invalid bytes become U+FFFD, which no (hex) instance id contains. */
const UTF8_LOOSE = new TextDecoder("utf-8");

/** Reads a frame's length prefix (u32 little-endian) at `off`. */
export function frameLength(buf: Buffer, off = 0): number {
  return buf.readUInt32LE(off);
}

function malformed(what: string): never {
  throw new EcError("EC_MALFORMED", `data frame: ${what}`);
}

/** Writes a u64 little-endian (values up to 2^53 - 1). */
function writeU64(b: Buffer, v: number, off: number): void {
  b.writeUInt32LE(v % 0x1_0000_0000, off);
  b.writeUInt32LE(Math.floor(v / 0x1_0000_0000), off + 4);
}

/** Reads a u64 little-endian; beyond 2^53 - 1 it is malformed. */
function readU64(b: Buffer, off: number): number {
  const hi = b.readUInt32LE(off + 4);
  if (hi >= 0x20_0000) malformed("u64 beyond 2^53 - 1");
  return hi * 0x1_0000_0000 + b.readUInt32LE(off);
}

function utf8(b: Buffer, start: number, len: number, what: string): string {
  try {
    return UTF8_FATAL.decode(b.subarray(start, start + len));
  } catch {
    return malformed(`${what} is not UTF-8`);
  }
}

/** A frame's bytes: the u32 LE length prefix, then the body (all integers little-endian). */
export function encodeFrame(f: ToServer | ToReader): Buffer {
  switch (f.op) {
    case "read": {
      const reader = UTF8.encode(f.reader);
      const instance = UTF8.encode(f.instance);
      const body = READ_FIXED + f.key.length + reader.length + instance.length + 4 * f.blocks.length;
      const b = Buffer.alloc(LEN_BYTES + body);
      b.writeUInt32LE(body, 0);
      b[4] = DATA_OPS.read;
      b.writeUInt16LE(f.key.length, 6);
      b.writeUInt16LE(reader.length, 8);
      b.writeUInt16LE(instance.length, 10);
      b.writeUInt32LE(f.blocks.length, 12);
      writeU64(b, f.nbytes, 16);
      let off = LEN_BYTES + READ_FIXED;
      b.set(f.key, off);
      off += f.key.length;
      b.set(reader, off);
      off += reader.length;
      b.set(instance, off);
      off += instance.length;
      for (const blk of f.blocks) {
        b.writeUInt32LE(blk, off);
        off += 4;
      }
      return b;
    }
    case "read_ahead": {
      const reader = UTF8.encode(f.reader);
      const instance = UTF8.encode(f.instance);
      const body = READ_FIXED + f.key.length + reader.length + instance.length;
      const b = Buffer.alloc(LEN_BYTES + body);
      b.writeUInt32LE(body, 0);
      b[4] = DATA_OPS.read_ahead;
      b[5] = f.ackFirst === true ? 1 : 0;
      b.writeUInt16LE(f.key.length, 6);
      b.writeUInt16LE(reader.length, 8);
      b.writeUInt16LE(instance.length, 10);
      b.writeUInt32LE(f.waitMs, 12);
      writeU64(b, f.nbytes, 16);
      let off = LEN_BYTES + READ_FIXED;
      b.set(f.key, off);
      off += f.key.length;
      b.set(reader, off);
      off += reader.length;
      b.set(instance, off);
      return b;
    }
    case "data": {
      const b = Buffer.alloc(LEN_BYTES + DATA_FIXED);
      b.writeUInt32LE(DATA_FIXED, 0);
      b[4] = DATA_OPS.data;
      writeU64(b, f.nbytes, 8);
      return b;
    }
    case "ack": {
      if (f.ack.length < 1 || f.ack.length > MAX_ACK_BYTES) {
        throw new EcError(
          "EC_BAD_ARGUMENT",
          `ACK frame: ack of ${f.ack.length} bytes outside [1, ${MAX_ACK_BYTES}]`,
        );
      }
      const b = Buffer.alloc(LEN_BYTES + ACK_FIXED + f.ack.length);
      b.writeUInt32LE(ACK_FIXED + f.ack.length, 0);
      b[4] = DATA_OPS.ack;
      if (f.final === true) b[5] = 1; // 3.5: no DATA follows
      b.set(f.ack, LEN_BYTES + ACK_FIXED);
      return b;
    }
    case "error": {
      let msg = UTF8.encode(f.message);
      if (msg.length > MAX_ERROR_MESSAGE_BYTES) {
        // Cut before a UTF-8 lead byte so the message stays valid UTF-8.
        let end = MAX_ERROR_MESSAGE_BYTES;
        while (end > 0 && (msg[end]! & 0xc0) === 0x80) end--;
        msg = msg.subarray(0, end);
      }
      const b = Buffer.alloc(LEN_BYTES + ERROR_FIXED + msg.length);
      b.writeUInt32LE(ERROR_FIXED + msg.length, 0);
      b[4] = DATA_OPS.error;
      b[5] = REFUSAL_CODES[f.code];
      b.writeUInt16LE(msg.length, 6);
      b.set(msg, LEN_BYTES + ERROR_FIXED);
      return b;
    }
    case "notif": {
      const b = Buffer.alloc(LEN_BYTES + NOTIF_FIXED + f.msg.length);
      b.writeUInt32LE(NOTIF_FIXED + f.msg.length, 0);
      b[4] = DATA_OPS.notif;
      b.writeUInt16LE(f.msg.length, 6);
      b.set(f.msg, LEN_BYTES + NOTIF_FIXED);
      return b;
    }
  }
}

/**
 * The first 8 bytes of an ACK frame carrying `ackLen` bytes of XferAck (length prefix, op, flags):
 * the same bytes as `encodeFrame({ op: "ack", ... })` up to the ack itself, which the caller writes
 * next (corked: one writev, no copy of the ack; issue 23 item 1).
 */
export function encodeAckHead(ackLen: number, final = false): Buffer {
  if (ackLen < 1 || ackLen > MAX_ACK_BYTES) {
    throw new EcError("EC_BAD_ARGUMENT", `ACK frame: ack of ${ackLen} bytes outside [1, ${MAX_ACK_BYTES}]`);
  }
  const b = Buffer.alloc(LEN_BYTES + ACK_FIXED);
  b.writeUInt32LE(ACK_FIXED + ackLen, 0);
  b[4] = DATA_OPS.ack;
  if (final) b[5] = 1;
  return b;
}

/**
 * Decodes a frame body (the bytes after the length prefix) received by a data server. Every
 * length is checked against the body before anything is read or copied; `numBlocks` bounds a
 * READ's block list. Throws `EC_MALFORMED` naming the first problem.
 */
export function decodeToServer(body: Uint8Array, numBlocks: number): ToServer {
  const b = Buffer.from(body.buffer, body.byteOffset, body.length);
  if (b.length < 1) malformed("empty body");
  const op = b[0]!;
  if (op === DATA_OPS.notif) {
    if (b.length < NOTIF_FIXED) malformed("NOTIF shorter than its fixed part");
    if (b[1] !== 0) malformed("NOTIF reserved byte is not 0");
    const keyLen = b.readUInt16LE(2);
    if (keyLen < 1 || keyLen > MAX_KEY_BYTES)
      malformed(`NOTIF key_len ${keyLen} outside [1, ${MAX_KEY_BYTES}]`);
    if (b.length !== NOTIF_FIXED + keyLen) malformed("NOTIF body_len does not match key_len");
    return { op: "notif", msg: b.subarray(NOTIF_FIXED) };
  }
  if (op === DATA_OPS.read_ahead) return decodeReadAhead(b);
  if (op !== DATA_OPS.read) malformed(`unknown op ${op}`);
  if (b.length < READ_FIXED) malformed("READ shorter than its fixed part");
  if (b[1] !== 0) malformed("READ reserved byte is not 0");
  const keyLen = b.readUInt16LE(2);
  const readerLen = b.readUInt16LE(4);
  const instanceLen = b.readUInt16LE(6);
  const count = b.readUInt32LE(8);
  if (keyLen < 1 || keyLen > MAX_KEY_BYTES) malformed(`READ key_len ${keyLen} outside [1, ${MAX_KEY_BYTES}]`);
  if (readerLen > MAX_READER_BYTES) malformed(`READ reader_len ${readerLen} over ${MAX_READER_BYTES}`);
  if (instanceLen < 1 || instanceLen > MAX_INSTANCE_BYTES) {
    malformed(`READ instance_len ${instanceLen} outside [1, ${MAX_INSTANCE_BYTES}]`);
  }
  if (count < 1 || count > numBlocks) malformed(`READ block_count ${count} outside [1, ${numBlocks}]`);
  if (b.length !== READ_FIXED + keyLen + readerLen + instanceLen + 4 * count) {
    malformed("READ body_len does not match its field lengths");
  }
  // nbytes 0 is not malformed: it fails rule 5 (bad_nbytes), answered with an ERROR (3.1).
  const nbytes = readU64(b, 12);
  let off = READ_FIXED;
  const key = b.subarray(off, off + keyLen);
  off += keyLen;
  const reader = utf8(b, off, readerLen, "READ reader");
  off += readerLen;
  // Not UTF-8 (e.g. the 8 raw bytes instead of their 16 hex characters) cannot be this server's
  // instance: ERROR 1 instance_mismatch, not a silent close (3.1).
  const instance = UTF8_LOOSE.decode(b.subarray(off, off + instanceLen));
  off += instanceLen;
  const blocks = new Array<number>(count);
  for (let i = 0; i < count; i++) blocks[i] = b.readUInt32LE(off + 4 * i);
  return { op: "read", key, blocks, nbytes, reader, instance };
}

function decodeReadAhead(b: Buffer): ReadAheadFrame {
  if (b.length < READ_FIXED) malformed("READ_AHEAD shorter than its fixed part");
  // 3.3: the flags byte; bit 0 ack_first, every other bit 0.
  if ((b[1]! & ~1) !== 0) malformed("READ_AHEAD flags other than ack_first are set");
  const keyLen = b.readUInt16LE(2);
  const readerLen = b.readUInt16LE(4);
  const instanceLen = b.readUInt16LE(6);
  const waitMs = b.readUInt32LE(8);
  if (keyLen < 1 || keyLen > MAX_KEY_BYTES)
    malformed(`READ_AHEAD key_len ${keyLen} outside [1, ${MAX_KEY_BYTES}]`);
  if (readerLen > MAX_READER_BYTES) malformed(`READ_AHEAD reader_len ${readerLen} over ${MAX_READER_BYTES}`);
  if (instanceLen < 1 || instanceLen > MAX_INSTANCE_BYTES) {
    malformed(`READ_AHEAD instance_len ${instanceLen} outside [1, ${MAX_INSTANCE_BYTES}]`);
  }
  if (waitMs < 1 || waitMs > MAX_READ_AHEAD_WAIT_MS) {
    malformed(`READ_AHEAD wait_ms ${waitMs} outside [1, ${MAX_READ_AHEAD_WAIT_MS}]`);
  }
  if (b.length !== READ_FIXED + keyLen + readerLen + instanceLen) {
    malformed("READ_AHEAD body_len does not match its field lengths");
  }
  const nbytes = readU64(b, 12);
  let off = READ_FIXED;
  const key = b.subarray(off, off + keyLen);
  off += keyLen;
  const reader = utf8(b, off, readerLen, "READ_AHEAD reader");
  off += readerLen;
  // Not UTF-8 cannot be this server's (hex) instance: answered ERROR 1, not closed (3.1).
  const instance = UTF8_LOOSE.decode(b.subarray(off, off + instanceLen));
  return {
    op: "read_ahead",
    key,
    nbytes,
    waitMs,
    reader,
    instance,
    ...(b[1] === 1 ? { ackFirst: true } : {}),
  };
}

/** Decodes a frame body received by a reader (DATA or ERROR); throws `EC_MALFORMED`. */
export function decodeToReader(body: Uint8Array): ToReader {
  const b = Buffer.from(body.buffer, body.byteOffset, body.length);
  if (b.length < 1) malformed("empty body");
  if (b[0] === DATA_OPS.data) {
    if (b.length !== DATA_FIXED) malformed(`DATA body_len ${b.length} is not ${DATA_FIXED}`);
    if (b[1] !== 0 || b[2] !== 0 || b[3] !== 0) malformed("DATA reserved bytes are not 0");
    return { op: "data", nbytes: readU64(b, 4) };
  }
  if (b[0] === DATA_OPS.error) {
    if (b.length < ERROR_FIXED) malformed("ERROR shorter than its fixed part");
    const code = CODE_NAMES[b[1]!];
    if (code === undefined) malformed(`ERROR unknown code ${b[1]}`);
    const len = b.readUInt16LE(2);
    if (len > MAX_ERROR_MESSAGE_BYTES || b.length !== ERROR_FIXED + len) {
      malformed("ERROR body_len does not match message_len");
    }
    return { op: "error", code, message: utf8(b, ERROR_FIXED, len, "ERROR message") };
  }
  if (b[0] === DATA_OPS.ack) {
    if (b.length <= ACK_FIXED || b.length > MAX_ACK_FRAME_BYTES) {
      malformed(`ACK body_len ${b.length} outside [${ACK_FIXED + 1}, ${MAX_ACK_FRAME_BYTES}]`);
    }
    // 3.5: byte 5 is the flags byte (bit 0 `final`); the reader accepts `final` only on an XFER_REQ.
    if ((b[1]! & ~1) !== 0 || b[2] !== 0 || b[3] !== 0) malformed("ACK reserved bytes are not 0");
    return {
      op: "ack",
      ack: Uint8Array.from(b.subarray(ACK_FIXED)),
      ...(b[1] === 1 ? { final: true } : {}),
    };
  }
  return malformed("unexpected data-plane answer");
}

/** Runs of consecutive block ids as region byte ranges covering the first `nbytes` bytes. */
export function segments(
  blocks: readonly number[],
  bb: number,
  nbytes: number,
): { segStart: number[]; segLen: number[] } {
  const segStart: number[] = [];
  const segLen: number[] = [];
  let left = nbytes;
  for (let i = 0; i < blocks.length && left > 0; i++) {
    const n = Math.min(bb, left);
    const start = blocks[i]! * bb;
    const last = segStart.length - 1;
    if (last >= 0 && segStart[last]! + segLen[last]! === start) segLen[last]! += n;
    else {
      segStart.push(start);
      segLen.push(n);
    }
    left -= n;
  }
  return { segStart, segLen };
}
