import { readFileSync } from "node:fs";
import type { Hello } from "@tapwire/wire";
import { decodeHello, WireError } from "@tapwire/wire";
import { TraceError, TraceErrorCode } from "./errors.js";
import {
  TraceHeaderOffset as H,
  RecordOffset as R,
  RECORD_ALIGN,
  RECORD_HEAD_SIZE,
  RecordFlag,
  RecordKind,
  TRACE_FORMAT_VERSION,
  TRACE_HEADER_SIZE,
  TRACE_MAGIC,
} from "./format.js";

/** The decoded file header of a trace (docs/trace.md "File header"). */
export interface TraceHeader {
  /** Format version (1). */
  version: number;
  /** `"client"` or `"worker"`. */
  source: "client" | "worker";
  /** `"all"`, `"sampled"` or `"none"`. */
  rowsPolicy: "all" | "sampled" | "none";
  /** With sampled rows: one STEP in this many keeps its rows (else 0). */
  rowsEvery: number;
  /** Wall clock when the trace began, Unix ms. */
  startUnixMs: number;
  /** The first HELLO of the trace (auth zeroed). */
  hello: Hello;
  /** The writer's name. */
  writerName: string;
}

/** One record of a trace (docs/trace.md "Records"). */
export interface TraceRecord {
  /** {@link RecordKind}. */
  kind: RecordKind;
  /** {@link RecordFlag} bits. */
  flags: number;
  /** Microseconds since the trace began. */
  tUs: number;
  /** The frame's seq (0 for GAP / END). */
  seq: number;
  /** Bytes of the frame on the wire. */
  frameLen: number;
  /** The stored bytes, `frame[0, stored)` (a view into the file buffer). */
  stored: Uint8Array;
  /** REPLY: RTT in µs measured by the writer; GAP / END: records dropped. */
  aux: number;
}

/** A parsed trace file. */
export interface Trace {
  /** The file header. */
  header: TraceHeader;
  /** Every whole record in file order. */
  records: TraceRecord[];
  /** True when the last record is END (a clean close); false for a cut file (kill -9). */
  complete: boolean;
  /** Records the writer dropped (sum of GAP records, or END's count). */
  dropped: number;
  /** Bytes after the last whole record (a cut write). */
  trailingBytes: number;
}

function badFile(msg: string): TraceError {
  return new TraceError(TraceErrorCode.BAD_FILE, msg);
}

/**
 * Parses a trace (docs/trace.md) from its bytes. A file cut inside a record (the writer was
 * killed) parses up to the last whole record with `complete: false`. Frames are views into `buf`.
 *
 * @throws TraceError `TRACE_BAD_FILE` naming the first violation (magic, version, sizes, kind).
 */
export function parseTrace(buf: Uint8Array): Trace {
  if (buf.length < TRACE_HEADER_SIZE)
    throw badFile(`trace of ${buf.length} bytes is shorter than its ${TRACE_HEADER_SIZE}-byte header`);
  for (let i = 0; i < TRACE_MAGIC.length; i++) {
    if (buf[i] !== TRACE_MAGIC[i]) throw badFile("not a tapwire trace (magic is not TAPTRACE)");
  }
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const version = dv.getUint16(H.VERSION, true);
  if (version !== TRACE_FORMAT_VERSION)
    throw badFile(`trace format version ${version}, this reader reads ${TRACE_FORMAT_VERSION}`);
  const headerLen = dv.getUint16(H.HEADER_LEN, true);
  if (headerLen !== TRACE_HEADER_SIZE) throw badFile(`header_len ${headerLen}, want ${TRACE_HEADER_SIZE}`);
  const src = buf[H.SOURCE];
  if (src !== 1 && src !== 2) throw badFile(`source ${src} is not 1 (client) or 2 (worker)`);
  const pol = buf[H.ROWS_POLICY]!;
  if (pol > 2) throw badFile(`rows_policy ${pol} is not 0, 1 or 2`);
  const helloLen = dv.getUint32(H.HELLO_LEN, true);
  if (helloLen !== 160) throw badFile(`hello_len ${helloLen}, want 160`);
  let hello: Hello;
  try {
    hello = decodeHello(buf.subarray(H.HELLO, H.HELLO + 160));
  } catch (e) {
    if (e instanceof WireError) throw badFile(`header HELLO: ${e.message}`);
    throw e;
  }
  const nameBytes = buf.subarray(H.WRITER_NAME, H.WRITER_NAME + 32);
  const nul = nameBytes.indexOf(0);
  const header: TraceHeader = {
    version,
    source: src === 1 ? "client" : "worker",
    rowsPolicy: pol === 0 ? "all" : pol === 1 ? "sampled" : "none",
    rowsEvery: dv.getUint16(H.ROWS_EVERY, true),
    startUnixMs: dv.getUint32(H.START_UNIX_MS, true) + dv.getUint32(H.START_UNIX_MS + 4, true) * 2 ** 32,
    hello,
    writerName: Buffer.from(nameBytes.subarray(0, nul < 0 ? 32 : nul)).toString("utf8"),
  };
  const records: TraceRecord[] = [];
  let at = headerLen;
  let complete = false;
  let dropped = 0;
  while (at + RECORD_HEAD_SIZE <= buf.length) {
    const len = dv.getUint32(at + R.RECORD_LEN, true);
    const kind = buf[at + R.KIND]!;
    const stored = dv.getUint32(at + R.STORED_LEN, true);
    const frameLen = dv.getUint32(at + R.FRAME_LEN, true);
    if (len < RECORD_HEAD_SIZE || len % RECORD_ALIGN !== 0)
      throw badFile(`record at ${at}: record_len ${len} is not a multiple of 8 >= 32`);
    if (at + len > buf.length) break;
    if (kind < RecordKind.REQUEST || kind > RecordKind.END)
      throw badFile(`record at ${at}: unknown kind ${kind}`);
    if (RECORD_HEAD_SIZE + stored > len)
      throw badFile(`record at ${at}: stored_len ${stored} does not fit record_len ${len}`);
    if (stored > frameLen) throw badFile(`record at ${at}: stored_len ${stored} > frame_len ${frameLen}`);
    const flags = buf[at + R.FLAGS]!;
    if (stored < frameLen && (flags & RecordFlag.ROWS_OMITTED) === 0) {
      throw badFile(`record at ${at}: stored_len ${stored} < frame_len ${frameLen} without ROWS_OMITTED`);
    }
    const rec: TraceRecord = {
      kind: kind as RecordKind,
      flags,
      tUs: dv.getUint32(at + R.T_US, true) + dv.getUint32(at + R.T_US + 4, true) * 2 ** 32,
      seq: dv.getUint32(at + R.SEQ, true),
      frameLen,
      stored: buf.subarray(at + R.FRAME, at + R.FRAME + stored),
      aux: dv.getUint32(at + R.AUX, true),
    };
    at += len;
    if (kind === RecordKind.GAP) dropped += rec.aux;
    if (kind === RecordKind.END) {
      complete = true;
      dropped = Math.max(dropped, rec.aux);
      break;
    }
    records.push(rec);
  }
  return { header, records, complete, dropped, trailingBytes: buf.length - at };
}

/** Reads and parses a trace file ({@link parseTrace}). */
export function readTrace(path: string): Trace {
  let buf: Buffer;
  try {
    buf = readFileSync(path);
  } catch (e) {
    throw new TraceError(TraceErrorCode.IO, `cannot read trace ${path}: ${(e as Error).message}`, {
      cause: e,
    });
  }
  return parseTrace(buf);
}

/**
 * The frame of a record as it was on the wire: the stored bytes, then zeros for omitted rows
 * (ROWS_OMITTED), so every offset of the frame header and body stays valid.
 */
export function recordFrame(rec: TraceRecord): Uint8Array {
  if (rec.stored.length === rec.frameLen) return rec.stored;
  const out = new Uint8Array(rec.frameLen);
  out.set(rec.stored, 0);
  return out;
}
