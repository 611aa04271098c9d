/**
 * The tester's own frame builder and parser, written from the CONTRACT tables (4, 6.1, 7.3, 7.4)
 * and not from `@tapwire/wire`'s codec: only its constants are imported, so a mistake in the
 * codec that tapwire's worker and client share cannot hide from the tester.
 */
import { createHmac } from "node:crypto";
import {
  APP_HEADER_SIZE,
  HELLO_BODY_SIZE,
  HELLO_REPLY_BODY_SIZE,
  REQ_ENTRY_SIZE,
  ROWS_ALIGN,
  SAMPLE_META_SIZE,
  STEP_PREFIX_SIZE,
  STEP_REPLY_PREFIX_SIZE,
  TOP_K_MAX,
} from "@tapwire/wire";

/** Header fields (CONTRACT 4). Every field may be set to any value, valid or not. */
export interface HeaderFields {
  magic?: number;
  version?: number;
  op: number;
  status?: number;
  seq: number;
  session: number;
  /** Default: the body's length. */
  bodyLen?: number;
  reserved?: number;
}

/** A parsed header. */
export interface ParsedHeader {
  magicOk: boolean;
  version: number;
  op: number;
  status: number;
  seq: number;
  session: number;
  bodyLen: number;
  reserved: number;
}

export const MAGIC_LE = 0x4b505344; // "DSPK" read as a little-endian u32

/** Reads a little-endian u32. */
export function u32(b: Uint8Array, o: number): number {
  return (b[o]! | (b[o + 1]! << 8) | (b[o + 2]! << 16) | (b[o + 3]! << 24)) >>> 0;
}

/** Reads a little-endian u16. */
export function u16(b: Uint8Array, o: number): number {
  return b[o]! | (b[o + 1]! << 8);
}

/** Writes a little-endian u32 (the value is taken mod 2^32). */
export function w32(b: Uint8Array, o: number, v: number): void {
  const x = v >>> 0;
  b[o] = x & 0xff;
  b[o + 1] = (x >>> 8) & 0xff;
  b[o + 2] = (x >>> 16) & 0xff;
  b[o + 3] = (x >>> 24) & 0xff;
}

/** Writes a little-endian u16. */
export function w16(b: Uint8Array, o: number, v: number): void {
  b[o] = v & 0xff;
  b[o + 1] = (v >>> 8) & 0xff;
}

/** A whole message: header then body (CONTRACT 4). */
export function frame(h: HeaderFields, body: Uint8Array = new Uint8Array(0)): Uint8Array {
  const out = new Uint8Array(APP_HEADER_SIZE + body.length);
  w32(out, 0, h.magic ?? MAGIC_LE);
  w16(out, 4, h.version ?? 1);
  out[6] = h.op & 0xff;
  out[7] = (h.status ?? 0) & 0xff;
  w32(out, 8, h.seq);
  w32(out, 12, h.session);
  w32(out, 16, h.bodyLen ?? body.length);
  w32(out, 20, h.reserved ?? 0);
  out.set(body, APP_HEADER_SIZE);
  return out;
}

/** Parses a header; null when fewer than 24 bytes. */
export function parseHeader(m: Uint8Array): ParsedHeader | null {
  if (m.length < APP_HEADER_SIZE) return null;
  return {
    magicOk: u32(m, 0) === MAGIC_LE,
    version: u16(m, 4),
    op: m[6]!,
    status: m[7]!,
    seq: u32(m, 8),
    session: u32(m, 12),
    bodyLen: u32(m, 16),
    reserved: u32(m, 20),
  };
}

/** The little-endian u32 length prefix of the stream transports (CONTRACT 3). */
export function lePrefix(n: number): Uint8Array {
  const p = new Uint8Array(4);
  w32(p, 0, n);
  return p;
}

/** HELLO request fields (CONTRACT 6.1); any value may be out of range on purpose. */
export interface HelloFields {
  drafterIdentity: Uint8Array;
  markovIdentity: Uint8Array;
  window: number;
  numSpec: number;
  sampleMode: number;
  rowDtype: number;
  numTaps: number;
  hidden: number;
  rowBytes: number;
  vocabSize: number;
  maxSlots: number;
  maxRowsPerStep: number;
  helloFlags: number;
  auth: Uint8Array;
  clientName: string;
}

/** The 160-byte HELLO body (CONTRACT 6.1). */
export function helloBody(f: HelloFields): Uint8Array {
  const b = new Uint8Array(HELLO_BODY_SIZE);
  b.set(f.drafterIdentity.subarray(0, 32), 0);
  b.set(f.markovIdentity.subarray(0, 32), 32);
  w16(b, 64, f.window);
  w16(b, 66, f.numSpec);
  b[68] = f.sampleMode & 0xff;
  b[69] = f.rowDtype & 0xff;
  w16(b, 70, f.numTaps);
  w32(b, 72, f.hidden);
  w32(b, 76, f.rowBytes);
  w32(b, 80, f.vocabSize);
  w32(b, 84, f.maxSlots);
  w32(b, 88, f.maxRowsPerStep);
  w32(b, 92, f.helloFlags);
  b.set(f.auth.subarray(0, 32), 96);
  b.set(Buffer.from(f.clientName, "utf8").subarray(0, 32), 128);
  return b;
}

/** HMAC-SHA256(key = token, msg = "tapwire/hello" ‖ session u32 ‖ seq u32), CONTRACT 6.1. */
export function helloHmac(token: string, session: number, seq: number): Uint8Array {
  const msg = new Uint8Array(13 + 8);
  msg.set(Buffer.from("tapwire/hello", "ascii"), 0);
  w32(msg, 13, session);
  w32(msg, 17, seq);
  return new Uint8Array(createHmac("sha256", token).update(msg).digest());
}

/** A parsed HelloReply (CONTRACT 6.1). */
export interface HelloReplyFields {
  drafterIdentity: Uint8Array;
  markovIdentity: Uint8Array;
  window: number;
  numSpec: number;
  capabilities: number;
  maxSlots: number;
  maxRowsPerStep: number;
  vocabSize: number;
  rowBytes: number;
  windowsKept: number;
  reserved: number;
  workerNameBytes: Uint8Array;
}

/** Parses a 128-byte HelloReply body; null when the size is wrong. */
export function parseHelloReply(b: Uint8Array): HelloReplyFields | null {
  if (b.length !== HELLO_REPLY_BODY_SIZE) return null;
  return {
    drafterIdentity: b.slice(0, 32),
    markovIdentity: b.slice(32, 64),
    window: u16(b, 64),
    numSpec: u16(b, 66),
    capabilities: u32(b, 68),
    maxSlots: u32(b, 72),
    maxRowsPerStep: u32(b, 76),
    vocabSize: u32(b, 80),
    rowBytes: u32(b, 84),
    windowsKept: u32(b, 88),
    reserved: u32(b, 92),
    workerNameBytes: b.slice(96, 128),
  };
}

/** A HelloReply body built by the scripted worker of the client mode. */
export function helloReplyBody(
  f: Omit<HelloReplyFields, "workerNameBytes"> & { workerName: string },
): Uint8Array {
  const b = new Uint8Array(HELLO_REPLY_BODY_SIZE);
  b.set(f.drafterIdentity.subarray(0, 32), 0);
  b.set(f.markovIdentity.subarray(0, 32), 32);
  w16(b, 64, f.window);
  w16(b, 66, f.numSpec);
  w32(b, 68, f.capabilities);
  w32(b, 72, f.maxSlots);
  w32(b, 76, f.maxRowsPerStep);
  w32(b, 80, f.vocabSize);
  w32(b, 84, f.rowBytes);
  w32(b, 88, f.windowsKept);
  w32(b, 92, f.reserved);
  b.set(Buffer.from(f.workerName, "utf8").subarray(0, 32), 96);
  return b;
}

/** `rows_offset_for(n_req)` (CONTRACT 7.3): rows start 64-aligned relative to the frame start. */
export function rowsOffsetFor(nReq: number, sampled: boolean): number {
  const end = STEP_PREFIX_SIZE + (sampled ? SAMPLE_META_SIZE * nReq : 0) + REQ_ENTRY_SIZE * nReq;
  const abs = APP_HEADER_SIZE + end;
  const aligned = Math.ceil(abs / ROWS_ALIGN) * ROWS_ALIGN;
  return aligned - APP_HEADER_SIZE;
}

/** One ReqEntry as the tester writes it (CONTRACT 7.3); every field may be out of range. */
export interface EntryFields {
  slot: number;
  generation: number;
  anchorPos: number;
  anchorToken: number;
  rowStart: number;
  nRows: number;
  nOut: number;
  flags: number;
  reserved?: number;
  /** TOP32 sessions: sample meta of the entry. */
  seed?: number;
  topK?: number;
  tempMilli?: number;
}

/** A STEP body (CONTRACT 7.3). `rows` holds `n_rows * row_bytes` bytes, entry by entry. */
export interface StepFields {
  stepId: number;
  stepFlags?: number;
  entries: EntryFields[];
  /** Default: sum of the entries' n_rows. */
  nRows?: number;
  /** Default: entries.length. */
  nReq?: number;
  sampled: boolean;
  rows: Uint8Array;
  /** Non-zero padding byte (a case that checks padding is ignored or not). */
  padByte?: number;
}

/** Builds a STEP body (CONTRACT 7.3). */
export function stepBody(f: StepFields): Uint8Array {
  const n = f.entries.length;
  const off = rowsOffsetFor(n, f.sampled);
  const b = new Uint8Array(off + f.rows.length);
  const nRows = f.nRows ?? f.entries.reduce((s, e) => s + e.nRows, 0);
  w32(b, 0, f.stepId);
  w32(b, 4, f.stepFlags ?? 0);
  w32(b, 8, f.nReq ?? n);
  w32(b, 12, nRows);
  let o = STEP_PREFIX_SIZE;
  if (f.sampled) {
    for (const e of f.entries) {
      w32(b, o, e.seed ?? 1);
      w16(b, o + 4, e.topK ?? 8);
      w16(b, o + 6, e.tempMilli ?? 0);
      o += SAMPLE_META_SIZE;
    }
  }
  for (const e of f.entries) {
    w32(b, o, e.slot);
    w32(b, o + 4, e.generation);
    w32(b, o + 8, e.anchorPos);
    w32(b, o + 12, e.anchorToken);
    w32(b, o + 16, e.rowStart);
    w32(b, o + 20, e.nRows);
    w16(b, o + 24, e.nOut);
    w16(b, o + 26, e.flags);
    w32(b, o + 28, e.reserved ?? 0);
    o += REQ_ENTRY_SIZE;
  }
  if (f.padByte !== undefined) b.fill(f.padByte, o, off);
  b.set(f.rows, off);
  return b;
}

/** A STEP reply as read off the wire (CONTRACT 7.4). */
export interface StepReplyFields {
  stepId: number;
  nReq: number;
  numSpec: number;
  replyFlags: number;
  workerUs: number;
  status: Uint8Array;
  windowRows: Uint16Array;
  generation: Uint32Array;
  draftIds: Int32Array;
  confidence: Float32Array;
  margin: Float32Array | null;
  sampledMask: Uint8Array | null;
  supportIds: Int32Array | null;
  proposalQ: Uint32Array | null;
  /** Padding bytes after status and window_rows (must be zero). */
  paddingNonZero: string | null;
}

/** Expected body size of a STEP reply (CONTRACT 7.4). */
export function stepReplySize(nReq: number, numSpec: number, margin: boolean, sampled: boolean): number {
  const pad4 = (x: number) => Math.ceil(x / 4) * 4;
  const nN = nReq * numSpec;
  let s = STEP_REPLY_PREFIX_SIZE + pad4(nReq) + pad4(2 * nReq) + 4 * nReq + 4 * nN + 4 * nN;
  if (margin) s += 4 * nN;
  if (sampled) s += pad4(nN) + 4 * nN * TOP_K_MAX * 2;
  return s;
}

/**
 * Parses a STEP reply body by its own prefix (n_req, num_spec, flags). Returns a string naming
 * the problem when the body cannot hold what the prefix announces.
 */
export function parseStepReply(b: Uint8Array): StepReplyFields | string {
  if (b.length < STEP_REPLY_PREFIX_SIZE)
    return `STEP reply body of ${b.length} bytes is shorter than its 16-byte prefix`;
  const nReq = u32(b, 4);
  const numSpec = u16(b, 8);
  const replyFlags = u16(b, 10);
  const margin = (replyFlags & 1) !== 0;
  const sampled = (replyFlags & 2) !== 0;
  if (nReq > 1 << 20 || numSpec > 4096) return `STEP reply announces n_req ${nReq}, num_spec ${numSpec}`;
  const want = stepReplySize(nReq, numSpec, margin, sampled);
  if (b.length !== want) {
    return `STEP reply body is ${b.length} bytes; n_req ${nReq}, num_spec ${numSpec}, reply_flags ${replyFlags} make it ${want}`;
  }
  const pad4 = (x: number) => Math.ceil(x / 4) * 4;
  const nN = nReq * numSpec;
  const copy = new Uint8Array(b); // aligned copy for typed views
  const buf = copy.buffer;
  let o = STEP_REPLY_PREFIX_SIZE;
  let paddingNonZero: string | null = null;
  const status = copy.slice(o, o + nReq);
  for (let i = o + nReq; i < o + pad4(nReq); i++)
    if (copy[i] !== 0) paddingNonZero = `status padding byte ${i - o}`;
  o += pad4(nReq);
  const windowRows = new Uint16Array(buf.slice(o, o + 2 * nReq));
  for (let i = o + 2 * nReq; i < o + pad4(2 * nReq); i++)
    if (copy[i] !== 0) paddingNonZero = `window_rows padding byte ${i - o}`;
  o += pad4(2 * nReq);
  const generation = new Uint32Array(buf.slice(o, o + 4 * nReq));
  o += 4 * nReq;
  const draftIds = new Int32Array(buf.slice(o, o + 4 * nN));
  o += 4 * nN;
  const confidence = new Float32Array(buf.slice(o, o + 4 * nN));
  o += 4 * nN;
  let marginArr: Float32Array | null = null;
  if (margin) {
    marginArr = new Float32Array(buf.slice(o, o + 4 * nN));
    o += 4 * nN;
  }
  let sampledMask: Uint8Array | null = null;
  let supportIds: Int32Array | null = null;
  let proposalQ: Uint32Array | null = null;
  if (sampled) {
    sampledMask = copy.slice(o, o + nN);
    for (let i = o + nN; i < o + pad4(nN); i++)
      if (copy[i] !== 0) paddingNonZero = `sampled_mask padding byte ${i - o}`;
    o += pad4(nN);
    supportIds = new Int32Array(buf.slice(o, o + 4 * nN * TOP_K_MAX));
    o += 4 * nN * TOP_K_MAX;
    proposalQ = new Uint32Array(buf.slice(o, o + 4 * nN * TOP_K_MAX));
  }
  return {
    stepId: u32(b, 0),
    nReq,
    numSpec,
    replyFlags,
    workerUs: u32(b, 12),
    status,
    windowRows,
    generation,
    draftIds,
    confidence,
    margin: marginArr,
    sampledMask,
    supportIds,
    proposalQ,
    paddingNonZero,
  };
}

/** Builds a STEP reply body (the scripted worker of the client mode). */
export function stepReplyBody(r: Omit<StepReplyFields, "paddingNonZero">): Uint8Array {
  const margin = r.margin !== null;
  const sampled = r.sampledMask !== null;
  const size = stepReplySize(r.nReq, r.numSpec, margin, sampled);
  const b = new Uint8Array(size);
  const pad4 = (x: number) => Math.ceil(x / 4) * 4;
  const nN = r.nReq * r.numSpec;
  w32(b, 0, r.stepId);
  w32(b, 4, r.nReq);
  w16(b, 8, r.numSpec);
  w16(b, 10, r.replyFlags);
  w32(b, 12, r.workerUs);
  let o = STEP_REPLY_PREFIX_SIZE;
  b.set(r.status.subarray(0, r.nReq), o);
  o += pad4(r.nReq);
  b.set(new Uint8Array(r.windowRows.buffer, r.windowRows.byteOffset, 2 * r.nReq), o);
  o += pad4(2 * r.nReq);
  b.set(new Uint8Array(r.generation.buffer, r.generation.byteOffset, 4 * r.nReq), o);
  o += 4 * r.nReq;
  b.set(new Uint8Array(r.draftIds.buffer, r.draftIds.byteOffset, 4 * nN), o);
  o += 4 * nN;
  b.set(new Uint8Array(r.confidence.buffer, r.confidence.byteOffset, 4 * nN), o);
  o += 4 * nN;
  if (r.margin !== null) {
    b.set(new Uint8Array(r.margin.buffer, r.margin.byteOffset, 4 * nN), o);
    o += 4 * nN;
  }
  if (sampled) {
    b.set(r.sampledMask!.subarray(0, nN), o);
    o += pad4(nN);
    b.set(new Uint8Array(r.supportIds!.buffer, r.supportIds!.byteOffset, 4 * nN * TOP_K_MAX), o);
    o += 4 * nN * TOP_K_MAX;
    b.set(new Uint8Array(r.proposalQ!.buffer, r.proposalQ!.byteOffset, 4 * nN * TOP_K_MAX), o);
  }
  return b;
}

/** Bytes to lowercase hex. */
export function hex(b: Uint8Array): string {
  return Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString("hex");
}

/** Lowercase hex to bytes. */
export function unhex(s: string): Uint8Array {
  return new Uint8Array(Buffer.from(s, "hex"));
}
