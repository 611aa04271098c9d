import { EcError, isIntInRange } from "../errors.js";
import { bin, int, packMsg, str, unpackMap } from "../protocol.js";

/** Data-plane frame header: a 4-byte length of the frame body that follows. */
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
/** ERROR (server → reader): the READ is refused; the server then closes. */
export interface ErrorFrame {
  readonly op: "error";
  readonly code: RefusalCode;
  readonly message: string;
}
/** Frames a data server receives. */
export type ToServer = ReadFrame | NotifFrame;
/** Frames a reader receives. */
export type ToReader = DataFrame | ErrorFrame;

/** Reads a frame's length prefix at `off`. */
export function frameLength(buf: Buffer, off = 0): number {
  return buf.readUInt32BE(off);
}

/** One frame: length prefix and body. */
export function encodeFrame(f: ToServer | ToReader): Buffer {
  const body = packMsg(f);
  const out = Buffer.allocUnsafe(LEN_BYTES + body.length);
  out.writeUInt32BE(body.length, 0);
  out.set(body, LEN_BYTES);
  return out;
}

/** Decodes a frame body received by a data server; `numBlocks` bounds a READ's block list. */
export function decodeToServer(body: Uint8Array, numBlocks: number): ToServer {
  const m = unpackMap(body, "data frame");
  const op = str(m, "op", "data frame");
  if (op === "notif") return { op, msg: bin(m, "msg", "notif") };
  if (op !== "read") throw new EcError("EC_MALFORMED", `unknown op ${op}`);
  const key = bin(m, "key", "read");
  if (key.length > MAX_KEY_BYTES) throw new EcError("EC_MALFORMED", "read: key too long");
  const blocks = m["blocks"];
  if (!Array.isArray(blocks) || blocks.length === 0 || blocks.length > numBlocks) {
    throw new EcError("EC_MALFORMED", "read: blocks is not a non-empty array within the cache size");
  }
  for (const b of blocks) {
    if (!isIntInRange(b, 0)) {
      throw new EcError("EC_MALFORMED", "read: a block index is not a non-negative integer");
    }
  }
  return {
    op,
    key,
    blocks: blocks as number[],
    nbytes: int(m, "nbytes", "read", 1),
    reader: str(m, "reader", "read", MAX_READER_BYTES),
    instance: str(m, "instance", "read"),
  };
}

/** Decodes a frame body received by a reader. */
export function decodeToReader(body: Uint8Array): ToReader {
  const m = unpackMap(body, "data frame");
  if (m["op"] === "data") return { op: "data", nbytes: int(m, "nbytes", "data", 0) };
  if (m["op"] === "error") {
    const code = str(m, "code", "error");
    if (!Object.hasOwn(REFUSAL_CODES, code)) throw new EcError("EC_MALFORMED", `error: unknown code ${code}`);
    return { op: "error", code: code as RefusalCode, message: str(m, "message", "error", 1024) };
  }
  throw new EcError("EC_MALFORMED", "unexpected data-plane answer");
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
