/**
 * Issue 23 item 1 (the EC fixed cost): hand-written MessagePack for the two messages on every
 * transfer's path, the XferReq and the XferAck (EC-CONTRACT 3). Measured inside a 1 MiB transfer
 * (docs/benchmarks/ec-connector.md "Fixed cost"), the generic codecs cost ~145 µs on the critical
 * path: they run once per transfer on caches the 1 MiB stream just flushed.
 *
 * The encoders write the same minimal MessagePack as `@msgpack/msgpack` (fixmap, fixstr/str8/16,
 * the smallest unsigned integer, bin8/16/32, fixarray/array16/32) straight into one exact-size
 * buffer; a value they do not cover (a negative or non-safe integer) returns `null` and the caller
 * uses the generic encoder.
 *
 * The decoders are a fast path only: they accept the canonical shape of a valid message (a fixmap
 * of the known keys, each with its expected type, no duplicate, nothing trailing) and return
 * `null` for anything else, so that the caller runs the strict generic decoder (`decodeFlatMap`,
 * EC-CONTRACT 9.1) on it, which then accepts or rejects it with its own error. A message the fast
 * path accepts decodes to exactly what the strict path returns (test/xfer-codec.test.ts checks both
 * on valid and hostile inputs).
 */
// A value import from protocol.ts, which imports this module: MAX_STRING_BYTES is read only when a
// message is decoded, after both modules have evaluated (one owner of the EC-CONTRACT 3 limit).
import { MAX_STRING_BYTES, type XferAck, type XferReq, type XferStatus } from "./protocol.js";

/** The highest status value (NACK_INTERNAL). */
const MAX_STATUS = 5;

// ---- encoding ----

const te = new TextEncoder();

/** Byte length of the minimal encoding of an unsigned safe integer. */
function uintLen(v: number): number {
  return v < 0x80 ? 1 : v < 0x100 ? 2 : v < 0x1_0000 ? 3 : v < 0x1_0000_0000 ? 5 : 9;
}

function okUint(v: unknown): v is number {
  return typeof v === "number" && Number.isSafeInteger(v) && v >= 0;
}

function strHeadLen(n: number): number {
  return n < 32 ? 1 : n < 0x100 ? 2 : n < 0x1_0000 ? 3 : 5;
}

function binHeadLen(n: number): number {
  return n < 0x100 ? 2 : n < 0x1_0000 ? 3 : 5;
}

/** Writes into one exact-size array of its own (as `@msgpack/msgpack` returns: no shared slab). */
class Writer {
  readonly b: Uint8Array;
  p = 0;
  constructor(n: number) {
    this.b = new Uint8Array(n);
  }
  u8(v: number): void {
    this.b[this.p++] = v;
  }
  u16(v: number): void {
    this.b[this.p++] = v >>> 8;
    this.b[this.p++] = v & 0xff;
  }
  u32(v: number): void {
    this.b[this.p++] = v >>> 24;
    this.b[this.p++] = (v >>> 16) & 0xff;
    this.b[this.p++] = (v >>> 8) & 0xff;
    this.b[this.p++] = v & 0xff;
  }
  /** The bytes, or null when the precomputed size was wrong (never expected; the caller falls back). */
  done(): Uint8Array | null {
    return this.p === this.b.length ? this.b : null;
  }
  mapHead(n: number): void {
    this.u8(0x80 | n); // fixmap: the messages here have at most 12 keys
  }
  /** An ASCII key (the contract's keys). */
  key(k: string): void {
    this.u8(0xa0 | k.length);
    for (let i = 0; i < k.length; i++) this.b[this.p++] = k.charCodeAt(i);
  }
  /** A string field: its minimal str header, then its bytes (an ASCII string char by char). */
  str(s: Str): void {
    const n = s.length;
    if (n < 32) this.u8(0xa0 | n);
    else if (n < 0x100) {
      this.u8(0xd9);
      this.u8(n);
    } else if (n < 0x1_0000) {
      this.u8(0xda);
      this.u16(n);
    } else {
      this.u8(0xdb);
      this.u32(n);
    }
    if (typeof s === "string") for (let i = 0; i < n; i++) this.b[this.p++] = s.charCodeAt(i);
    else {
      this.b.set(s, this.p);
      this.p += n;
    }
  }
  uint(v: number): void {
    if (v < 0x80) this.u8(v);
    else if (v < 0x100) {
      this.u8(0xcc);
      this.u8(v);
    } else if (v < 0x1_0000) {
      this.u8(0xcd);
      this.u16(v);
    } else if (v < 0x1_0000_0000) {
      this.u8(0xce);
      this.u32(v);
    } else {
      this.u8(0xcf);
      this.u32(Math.floor(v / 0x1_0000_0000));
      this.u32(v >>> 0);
    }
  }
  bin(v: Uint8Array): void {
    const n = v.length;
    if (n < 0x100) {
      this.u8(0xc4);
      this.u8(n);
    } else if (n < 0x1_0000) {
      this.u8(0xc5);
      this.u16(n);
    } else {
      this.u8(0xc6);
      this.u32(n);
    }
    this.b.set(v, this.p);
    this.p += n;
  }
}

/** A string field to write: ASCII as the string itself (written char by char), else its UTF-8. */
type Str = string | Uint8Array;

/** `s` when it is ASCII (its length is its UTF-8 length), else its UTF-8 bytes. */
function strField(s: string): Str {
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) >= 0x80) return te.encode(s);
  return s;
}

/** The minimal-header length plus bytes of a string field. */
function strLen(s: Str): number {
  return strHeadLen(s.length) + s.length;
}

/** The encoded `compatibility_hash`, `session_id` and `connector_version` entries of the last request. */
let reqMid: { ch: string; sid: string; v: number; bytes: Uint8Array } | null = null;

/** Those three entries (a session's requests all carry the same: encoded once, then copied). */
function requestMiddle(ch: string, sid: string, v: number): Uint8Array {
  const m = reqMid;
  if (m !== null && m.ch === ch && m.sid === sid && m.v === v) return m.bytes;
  const chs = strField(ch);
  const sids = strField(sid);
  const w = new Writer(19 + strLen(chs) + 11 + strLen(sids) + 18 + uintLen(v));
  w.key("compatibility_hash");
  w.str(chs);
  w.key("session_id");
  w.str(sids);
  w.key("connector_version");
  w.uint(v);
  reqMid = { ch, sid, v, bytes: w.b };
  return w.b;
}

/**
 * The XferReq map (EC-CONTRACT 3, the keys and order of protocol.ts `encodeXferReq`), or `null`
 * when a value needs the generic encoder (a negative or non-safe `connector_version`).
 */
export function fastEncodeXferReq(req: XferReq): Uint8Array | null {
  const v = req.connectorVersion;
  if (!okUint(v) || (req.xferId !== undefined && !okUint(req.xferId))) return null;
  if (typeof req.mmHash !== "string" || typeof req.compatibilityHash !== "string") return null;
  if (typeof req.sessionId !== "string") return null;
  const mm = strField(req.mmHash);
  const mid = requestMiddle(req.compatibilityHash, req.sessionId, v);
  let keys = 4;
  // the map header, the mm_hash entry, the middle entries; the optional ones below
  let n = 1 + 8 + strLen(mm) + mid.length;
  if (req.readAhead === true) {
    keys++;
    n += 11 + 1;
  }
  if (req.ackAhead === true) {
    keys++;
    n += 10 + 1;
  }
  if (req.xferId !== undefined) {
    keys++;
    n += 8 + uintLen(req.xferId);
  }
  if (req.dataReq === true) {
    keys++;
    n += 9 + 1;
  }
  const w = new Writer(n);
  w.mapHead(keys);
  w.key("mm_hash");
  w.str(mm);
  w.b.set(mid, w.p);
  w.p += mid.length;
  if (req.readAhead === true) {
    w.key("read_ahead");
    w.u8(1);
  }
  if (req.ackAhead === true) {
    w.key("ack_ahead");
    w.u8(1);
  }
  if (req.xferId !== undefined) {
    w.key("xfer_id");
    w.uint(req.xferId);
  }
  if (req.dataReq === true) {
    w.key("data_req");
    w.u8(1);
  }
  return w.done();
}

/**
 * The XferAck map (EC-CONTRACT 3, the keys and order of protocol.ts `encodeXferAck`), or `null`
 * when a value needs the generic encoder.
 */
export function fastEncodeXferAck(ack: XferAck): Uint8Array | null {
  const blocks = ack.srcBlockIndices;
  if (!Array.isArray(blocks) || !okUint(ack.nbytes) || !okUint(ack.crc32) || !okUint(ack.status)) return null;
  if (ack.xferId !== undefined && !okUint(ack.xferId)) return null;
  if (!(ack.agentMetadata instanceof Uint8Array) || !(ack.memDescriptor instanceof Uint8Array)) return null;
  if (typeof ack.mmHash !== "string" || typeof ack.sessionId !== "string") return null;
  const mm = strField(ack.mmHash);
  const sid = strField(ack.sessionId);
  let blocksLen = blocks.length < 16 ? 1 : blocks.length < 0x1_0000 ? 3 : 5;
  for (let i = 0; i < blocks.length; i++) {
    const b = blocks[i];
    if (!okUint(b)) return null;
    blocksLen += uintLen(b);
  }
  const meta = ack.agentMetadata;
  const desc = ack.memDescriptor;
  let keys = 8;
  // the eight keys (1 + length each)
  let n = 1 + 8 + 7 + 11 + 18 + 15 + 15 + 7 + 6;
  n += strLen(mm) + uintLen(ack.status) + strLen(sid);
  n += blocksLen + binHeadLen(meta.length) + meta.length + binHeadLen(desc.length) + desc.length;
  n += uintLen(ack.nbytes) + uintLen(ack.crc32);
  if (ack.readAhead === true) {
    keys++;
    n += 12;
  }
  if (ack.ackAhead === true) {
    keys++;
    n += 11;
  }
  if (ack.xferId !== undefined) {
    keys++;
    n += 8 + uintLen(ack.xferId);
  }
  if (ack.dataReq === true) {
    keys++;
    n += 10;
  }
  const w = new Writer(n);
  w.mapHead(keys);
  w.key("mm_hash");
  w.str(mm);
  w.key("status");
  w.uint(ack.status);
  w.key("session_id");
  w.str(sid);
  w.key("src_block_indices");
  const c = blocks.length;
  if (c < 16) w.u8(0x90 | c);
  else if (c < 0x1_0000) {
    w.u8(0xdc);
    w.u16(c);
  } else {
    w.u8(0xdd);
    w.u32(c);
  }
  for (let i = 0; i < c; i++) w.uint(blocks[i]!);
  w.key("agent_metadata");
  w.bin(meta);
  w.key("mem_descriptor");
  w.bin(desc);
  w.key("nbytes");
  w.uint(ack.nbytes);
  w.key("crc32");
  w.uint(ack.crc32);
  if (ack.readAhead === true) {
    w.key("read_ahead");
    w.u8(1);
  }
  if (ack.ackAhead === true) {
    w.key("ack_ahead");
    w.u8(1);
  }
  if (ack.xferId !== undefined) {
    w.key("xfer_id");
    w.uint(ack.xferId);
  }
  if (ack.dataReq === true) {
    w.key("data_req");
    w.u8(1);
  }
  return w.done();
}

// ---- decoding (fast path; `null`: let the strict decoder decide) ----

/** A failed fast path: the strict decoder takes the message. */
const MISS = -1;

/** Key ids, by key name. */
const K = {
  mm_hash: 0,
  status: 1,
  session_id: 2,
  src_block_indices: 3,
  agent_metadata: 4,
  mem_descriptor: 5,
  nbytes: 6,
  crc32: 7,
  read_ahead: 8,
  ack_ahead: 9,
  xfer_id: 10,
  data_req: 11,
  compatibility_hash: 12,
  connector_version: 13,
} as const;
const KEY_BYTES: readonly (readonly [number, Uint8Array])[] = Object.entries(K).map(
  ([k, id]) => [id, Buffer.from(k, "latin1")] as const,
);
/** Keys by length, for the byte-for-byte match. */
const BY_LEN: (readonly [number, Uint8Array])[][] = [];
for (const e of KEY_BYTES) {
  const len = e[1].length;
  BY_LEN[len] ??= [];
  BY_LEN[len].push(e);
}

class Reader {
  readonly b: Uint8Array;
  readonly buf: Buffer;
  p = 0;
  constructor(b: Uint8Array) {
    this.b = b;
    this.buf = Buffer.from(b.buffer, b.byteOffset, b.byteLength);
  }
  /** A known fixstr key's id, or MISS. */
  key(): number {
    const b = this.b;
    if (this.p >= b.length) return MISS;
    const t = b[this.p]!;
    if (t < 0xa0 || t > 0xbf) return MISS;
    const len = t & 0x1f;
    const start = this.p + 1;
    if (start + len > b.length) return MISS;
    const cands = BY_LEN[len];
    if (cands === undefined) return MISS;
    for (const [id, kb] of cands) {
      let same = true;
      for (let i = 0; i < len; i++) {
        if (b[start + i] !== kb[i]) {
          same = false;
          break;
        }
      }
      if (same) {
        this.p = start + len;
        return id;
      }
    }
    return MISS;
  }
  /** An unsigned integer (fixint, uint8/16/32), or MISS. */
  uint(): number {
    const b = this.b;
    const p = this.p;
    if (p >= b.length) return MISS;
    const t = b[p]!;
    if (t <= 0x7f) {
      this.p = p + 1;
      return t;
    }
    if (t === 0xcc && p + 2 <= b.length) {
      this.p = p + 2;
      return b[p + 1]!;
    }
    if (t === 0xcd && p + 3 <= b.length) {
      this.p = p + 3;
      return (b[p + 1]! << 8) | b[p + 2]!;
    }
    if (t === 0xce && p + 5 <= b.length) {
      this.p = p + 5;
      return ((b[p + 1]! << 24) >>> 0) + ((b[p + 2]! << 16) | (b[p + 3]! << 8) | b[p + 4]!);
    }
    return MISS;
  }
  /** An ASCII fixstr/str8 of at most 256 bytes, or null. */
  str(): string | null {
    const b = this.b;
    let p = this.p;
    if (p >= b.length) return null;
    const t = b[p]!;
    let len: number;
    if (t >= 0xa0 && t <= 0xbf) {
      len = t & 0x1f;
      p += 1;
    } else if (t === 0xd9 && p + 2 <= b.length) {
      len = b[p + 1]!;
      p += 2;
    } else return null;
    if (len > MAX_STRING_BYTES || p + len > b.length) return null;
    // ASCII only (valid UTF-8, the same characters as latin1); anything else: the strict decoder.
    for (let i = p; i < p + len; i++) if (b[i]! >= 0x80) return null;
    this.p = p + len;
    return this.buf.toString("latin1", p, p + len);
  }
  /** A bin8/16/32 (copied, as the strict decoder does), or null. */
  bin(): Uint8Array | null {
    const b = this.b;
    let p = this.p;
    if (p >= b.length) return null;
    const t = b[p]!;
    let len: number;
    if (t === 0xc4 && p + 2 <= b.length) {
      len = b[p + 1]!;
      p += 2;
    } else if (t === 0xc5 && p + 3 <= b.length) {
      len = (b[p + 1]! << 8) | b[p + 2]!;
      p += 3;
    } else if (t === 0xc6 && p + 5 <= b.length) {
      len = ((b[p + 1]! << 24) >>> 0) + ((b[p + 2]! << 16) | (b[p + 3]! << 8) | b[p + 4]!);
      p += 5;
    } else return null;
    if (p + len > b.length) return null;
    this.p = p + len;
    return b.slice(p, p + len);
  }
  /** An array of at most `max` unsigned integers, or null. */
  uints(max: number): number[] | null {
    const b = this.b;
    const p = this.p;
    if (p >= b.length) return null;
    const t = b[p]!;
    let n: number;
    if (t >= 0x90 && t <= 0x9f) {
      n = t & 0x0f;
      this.p = p + 1;
    } else if (t === 0xdc && p + 3 <= b.length) {
      n = (b[p + 1]! << 8) | b[p + 2]!;
      this.p = p + 3;
    } else return null;
    if (n > max || n > b.length - this.p) return null;
    const out = new Array<number>(n);
    for (let i = 0; i < n; i++) {
      const v = this.uint();
      if (v === MISS) return null;
      out[i] = v;
    }
    return out;
  }
}

/** The fixmap header's entry count, or MISS. */
function mapHead(r: Reader): number {
  const t = r.b[0];
  if (t === undefined || t < 0x80 || t > 0x8f) return MISS;
  r.p = 1;
  return t & 0x0f;
}

/**
 * Fast path of protocol.ts `decodeXferAck` (EC-CONTRACT 3): the ack when `bytes` is the canonical
 * encoding of a valid XferAck of at most `maxBlocks` blocks, else `null` (run the strict decoder).
 */
export function fastDecodeXferAck(bytes: Uint8Array, maxBlocks: number): XferAck | null {
  const r = new Reader(bytes);
  const n = mapHead(r);
  if (n === MISS) return null;
  let seen = 0;
  let mmHash: string | null = null;
  let status = -1;
  let sessionId: string | null = null;
  let blocks: number[] | null = null;
  let meta: Uint8Array | null = null;
  let desc: Uint8Array | null = null;
  let nbytes = -1;
  let crc = -1;
  let flags = 0;
  let xferId = -1;
  for (let i = 0; i < n; i++) {
    const k = r.key();
    if (k === MISS || k >= K.compatibility_hash || (seen & (1 << k)) !== 0) return null;
    seen |= 1 << k;
    switch (k) {
      case K.mm_hash:
        mmHash = r.str();
        if (mmHash === null) return null;
        break;
      case K.session_id:
        sessionId = r.str();
        if (sessionId === null) return null;
        break;
      case K.status:
        status = r.uint();
        if (status === MISS || status > MAX_STATUS) return null;
        break;
      case K.src_block_indices:
        blocks = r.uints(maxBlocks);
        if (blocks === null) return null;
        break;
      case K.agent_metadata:
        meta = r.bin();
        if (meta === null) return null;
        break;
      case K.mem_descriptor:
        desc = r.bin();
        if (desc === null) return null;
        break;
      case K.nbytes:
        nbytes = r.uint();
        if (nbytes === MISS) return null;
        break;
      case K.crc32:
        crc = r.uint();
        if (crc === MISS) return null;
        break;
      case K.xfer_id:
        xferId = r.uint();
        if (xferId === MISS) return null;
        break;
      default: {
        // read_ahead, ack_ahead, data_req: an integer; only 1 means yes.
        const v = r.uint();
        if (v === MISS) return null;
        if (v === 1) flags |= 1 << k;
      }
    }
  }
  if (r.p !== bytes.length || mmHash === null || status < 0) return null;
  const ok = status === 0;
  if (
    ok &&
    (sessionId === null || blocks === null || meta === null || desc === null || nbytes < 0 || crc < 0)
  )
    return null;
  const empty = new Uint8Array(0);
  const ack: XferAck = {
    mmHash,
    status: status as XferStatus,
    sessionId: sessionId ?? "",
    srcBlockIndices: blocks ?? [],
    agentMetadata: meta ?? empty,
    memDescriptor: desc ?? empty,
    nbytes: Math.max(nbytes, 0),
    crc32: Math.max(crc, 0),
  };
  if (ok && (flags & (1 << K.read_ahead)) !== 0) ack.readAhead = true;
  if (ok && (flags & (1 << K.ack_ahead)) !== 0) ack.ackAhead = true;
  if (ok && (flags & (1 << K.data_req)) !== 0) ack.dataReq = true;
  if (xferId >= 0) ack.xferId = xferId;
  return ack;
}

/**
 * Fast path of the XferReq decoders (protocol.ts `decodeXferReq`, the producer's): the request
 * when `bytes` is the canonical encoding of a valid XferReq with only the contract's keys, else
 * `null` (run the strict decoder; it also sees any other key, e.g. an admin `op`, EC-CONTRACT 9.3).
 */
export function fastDecodeXferReq(bytes: Uint8Array): XferReq | null {
  const r = new Reader(bytes);
  const n = mapHead(r);
  if (n === MISS) return null;
  let seen = 0;
  let mmHash: string | null = null;
  let compat: string | null = null;
  let sessionId: string | null = null;
  let version = -1;
  let flags = 0;
  let xferId = -1;
  for (let i = 0; i < n; i++) {
    const k = r.key();
    if (k === MISS || (seen & (1 << k)) !== 0) return null;
    seen |= 1 << k;
    switch (k) {
      case K.mm_hash:
        mmHash = r.str();
        if (mmHash === null) return null;
        break;
      case K.compatibility_hash:
        compat = r.str();
        if (compat === null) return null;
        break;
      case K.session_id:
        sessionId = r.str();
        if (sessionId === null) return null;
        break;
      case K.connector_version:
        version = r.uint();
        if (version === MISS) return null;
        break;
      case K.xfer_id:
        xferId = r.uint();
        if (xferId === MISS) return null;
        break;
      case K.read_ahead:
      case K.ack_ahead:
      case K.data_req: {
        const v = r.uint();
        if (v === MISS) return null;
        if (v === 1) flags |= 1 << k;
        break;
      }
      default:
        return null; // an ack key in a request: the strict decoder decides
    }
  }
  if (r.p !== bytes.length || mmHash === null || compat === null || sessionId === null || version < 0)
    return null;
  return {
    mmHash,
    compatibilityHash: compat,
    sessionId,
    connectorVersion: version,
    ...((flags & (1 << K.read_ahead)) !== 0 ? { readAhead: true } : {}),
    ...((flags & (1 << K.ack_ahead)) !== 0 ? { ackAhead: true } : {}),
    ...(xferId >= 0 ? { xferId } : {}),
    ...((flags & (1 << K.data_req)) !== 0 ? { dataReq: true } : {}),
  };
}
