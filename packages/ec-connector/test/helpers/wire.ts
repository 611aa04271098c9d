/**
 * Data-plane frames built by hand from the byte tables of docs/ec-protocol.md ("Data plane wire
 * format"), with a DataView and nothing from the package's encoder: a test that talks to the real
 * server with these bytes fails if the encoder and the document drift apart.
 */
const te = new TextEncoder();

function frame(body: Uint8Array): Buffer {
  const out = Buffer.alloc(4 + body.length);
  new DataView(out.buffer, out.byteOffset).setUint32(0, body.length, true);
  out.set(body, 4);
  return out;
}

/** READ (op 0x01): offsets are within the body, after the 4-byte length. */
export function handRead(f: {
  key: string;
  reader: string;
  instance: string;
  blocks: readonly number[];
  nbytes: number;
}): Buffer {
  const key = te.encode(f.key);
  const reader = te.encode(f.reader);
  const instance = te.encode(f.instance);
  const body = new Uint8Array(20 + key.length + reader.length + instance.length + 4 * f.blocks.length);
  const v = new DataView(body.buffer);
  v.setUint8(0, 0x01);
  v.setUint8(1, 0);
  v.setUint16(2, key.length, true);
  v.setUint16(4, reader.length, true);
  v.setUint16(6, instance.length, true);
  v.setUint32(8, f.blocks.length, true);
  v.setBigUint64(12, BigInt(f.nbytes), true);
  let off = 20;
  for (const part of [key, reader, instance]) {
    body.set(part, off);
    off += part.length;
  }
  for (const b of f.blocks) {
    v.setUint32(off, b, true);
    off += 4;
  }
  return frame(body);
}

/** NOTIF (op 0x04). */
export function handNotif(key: string): Buffer {
  const k = te.encode(key);
  const body = new Uint8Array(4 + k.length);
  const v = new DataView(body.buffer);
  v.setUint8(0, 0x04);
  v.setUint16(2, k.length, true);
  body.set(k, 4);
  return frame(body);
}

/** DATA (op 0x02) header: `nbytes` raw bytes follow it. */
export function handData(nbytes: number): Buffer {
  const body = new Uint8Array(12);
  const v = new DataView(body.buffer);
  v.setUint8(0, 0x02);
  v.setBigUint64(4, BigInt(nbytes), true);
  return frame(body);
}

/** ERROR (op 0x03) with a refusal code (1..5) and a message. */
export function handError(code: number, message: string): Buffer {
  const m = te.encode(message);
  const body = new Uint8Array(4 + m.length);
  const v = new DataView(body.buffer);
  v.setUint8(0, 0x03);
  v.setUint8(1, code);
  v.setUint16(2, m.length, true);
  body.set(m, 4);
  return frame(body);
}

/** A parsed frame a server sent: op and the body's fields, read by offset from the tables. */
export type HandFrame =
  | { op: "data"; nbytes: number; size: number }
  | { op: "ack"; ack: Buffer; size: number }
  | { op: "error"; code: number; message: string; size: number };

/** Parses the server frame at the start of `b` (undefined while incomplete). */
export function parseServerFrame(b: Buffer): HandFrame | undefined {
  if (b.length < 4) return undefined;
  const len = b.readUInt32LE(0);
  if (b.length < 4 + len) return undefined;
  const v = new DataView(b.buffer, b.byteOffset + 4, len);
  const op = v.getUint8(0);
  if (op === 0x02) return { op: "data", nbytes: Number(v.getBigUint64(4, true)), size: 4 + len };
  // docs/ec-protocol.md 3.3: ACK = op, 3 reserved zero bytes, the XferAck's MessagePack bytes.
  if (op === 0x06) {
    if (v.getUint8(1) !== 0 || v.getUint8(2) !== 0 || v.getUint8(3) !== 0) throw new Error("ACK reserved");
    return { op: "ack", ack: Buffer.from(b.subarray(8, 4 + len)), size: 4 + len };
  }
  if (op === 0x03) {
    const n = v.getUint16(2, true);
    return {
      op: "error",
      code: v.getUint8(1),
      message: b.subarray(8, 8 + n).toString("utf8"),
      size: 4 + len,
    };
  }
  throw new Error(`unknown op ${op}`);
}

/**
 * READ_AHEAD (op 0x05, docs/ec-protocol.md 3.2): the READ's fixed part with `wait_ms` (u32) where
 * READ has `block_count`, and no block list.
 */
export function handReadAhead(f: {
  key: string;
  reader: string;
  instance: string | Uint8Array;
  nbytes: number;
  waitMs: number;
  /** docs/ec-protocol.md 3.3: the flags byte at body offset 1 (bit 0 `ack_first`; default 0). */
  flags?: number;
}): Buffer {
  const key = te.encode(f.key);
  const reader = te.encode(f.reader);
  const instance = typeof f.instance === "string" ? te.encode(f.instance) : f.instance;
  const body = new Uint8Array(20 + key.length + reader.length + instance.length);
  const v = new DataView(body.buffer);
  v.setUint8(0, 0x05);
  v.setUint8(1, f.flags ?? 0);
  v.setUint16(2, key.length, true);
  v.setUint16(4, reader.length, true);
  v.setUint16(6, instance.length, true);
  v.setUint32(8, f.waitMs, true);
  v.setBigUint64(12, BigInt(f.nbytes), true);
  let off = 20;
  for (const part of [key, reader, instance]) {
    body.set(part, off);
    off += part.length;
  }
  return frame(body);
}

/** READ with `instance` given as raw bytes (what a reader gets wrong when it skips the hex). */
export function handReadRawInstance(f: {
  key: string;
  reader: string;
  instance: Uint8Array;
  blocks: readonly number[];
  nbytes: number;
}): Buffer {
  const key = te.encode(f.key);
  const reader = te.encode(f.reader);
  const body = new Uint8Array(20 + key.length + reader.length + f.instance.length + 4 * f.blocks.length);
  const v = new DataView(body.buffer);
  v.setUint8(0, 0x01);
  v.setUint16(2, key.length, true);
  v.setUint16(4, reader.length, true);
  v.setUint16(6, f.instance.length, true);
  v.setUint32(8, f.blocks.length, true);
  v.setBigUint64(12, BigInt(f.nbytes), true);
  let off = 20;
  for (const part of [key, reader, f.instance]) {
    body.set(part, off);
    off += part.length;
  }
  for (const b of f.blocks) {
    v.setUint32(off, b, true);
    off += 4;
  }
  return frame(body);
}

/** ACK (op 0x06, docs/ec-protocol.md 3.3): op, 3 reserved zero bytes, then the XferAck bytes. */
export function handAck(ack: Uint8Array, bodyLen = 4 + ack.length): Buffer {
  const out = Buffer.alloc(4 + 4 + ack.length);
  new DataView(out.buffer, out.byteOffset).setUint32(0, bodyLen, true);
  out[4] = 0x06;
  out.set(ack, 8);
  return out;
}

/**
 * XFER_REQ (op 0x0c, docs/ec-protocol.md 3.5): body offsets 0 op, 1 reserved, 2 u16 `reader_len`,
 * 4 u16 `instance_len`, 6 u16 `req_len`, 8 u64 `nbytes`, 16 `reader`, `instance`, `req` (the
 * XferReq map). `reserved` and `bodyLen` let a test break the frame on purpose.
 */
export function handXferReq(f: {
  reader: string;
  instance: string;
  nbytes: number;
  req: Uint8Array;
  reserved?: number;
  bodyLen?: number;
}): Buffer {
  const reader = te.encode(f.reader);
  const instance = te.encode(f.instance);
  const body = new Uint8Array(16 + reader.length + instance.length + f.req.length);
  const v = new DataView(body.buffer);
  v.setUint8(0, 0x0c);
  v.setUint8(1, f.reserved ?? 0);
  v.setUint16(2, reader.length, true);
  v.setUint16(4, instance.length, true);
  v.setUint16(6, f.req.length, true);
  v.setBigUint64(8, BigInt(f.nbytes), true);
  let off = 16;
  for (const part of [reader, instance, f.req]) {
    body.set(part, off);
    off += part.length;
  }
  const out = frame(body);
  if (f.bodyLen !== undefined) out.writeUInt32LE(f.bodyLen, 0);
  return out;
}

/**
 * Like {@link parseServerFrame}, with docs/ec-protocol.md 3.5's ACK flags byte (body offset 1,
 * bit 0 `final`: no DATA follows); only an XFER_REQ may be answered so.
 */
export function parseServerFrame35(b: Buffer): (HandFrame & { final?: boolean }) | undefined {
  if (b.length >= 8 && b.readUInt32LE(0) <= b.length - 4 && b[4] === 0x06 && b[5] === 1) {
    const len = b.readUInt32LE(0);
    if (b[6] !== 0 || b[7] !== 0) throw new Error("ACK reserved");
    return { op: "ack", ack: Buffer.from(b.subarray(8, 4 + len)), size: 4 + len, final: true };
  }
  return parseServerFrame(b);
}
