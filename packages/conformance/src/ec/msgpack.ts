/**
 * A MessagePack reader that keeps each value's wire type (an `int` is not a `float 2.0`, a `bin`
 * is not a `str`), for checking EC-CONTRACT 3's "exact keys and types"; and byte builders for
 * the hostile messages of EC-CONTRACT 9.1 (nesting bombs, lying length headers).
 */

/** A decoded value with its MessagePack family. */
export type Typed =
  | { t: "int"; v: number }
  | { t: "float"; v: number }
  | { t: "str"; v: string; bytes: number }
  | { t: "bin"; v: Uint8Array }
  | { t: "bool"; v: boolean }
  | { t: "nil" }
  | { t: "array"; v: Typed[] }
  | { t: "map"; v: [Typed, Typed][] }
  | { t: "ext" };

/** Decodes one value; throws on truncation or nesting deeper than `maxDepth`. */
export function decodeTyped(b: Uint8Array, maxDepth = 8): Typed {
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  let o = 0;
  const need = (n: number) => {
    if (o + n > b.length) throw new Error(`truncated at ${o}`);
  };
  const str = (n: number): Typed => {
    need(n);
    const s = Buffer.from(b.subarray(o, o + n)).toString("utf8");
    o += n;
    return { t: "str", v: s, bytes: n };
  };
  const bin = (n: number): Typed => {
    need(n);
    const v = b.slice(o, o + n);
    o += n;
    return { t: "bin", v };
  };
  const read = (depth: number): Typed => {
    if (depth > maxDepth) throw new Error("nested too deep");
    need(1);
    const c = b[o++]!;
    if (c <= 0x7f) return { t: "int", v: c };
    if (c >= 0xe0) return { t: "int", v: c - 256 };
    if ((c & 0xe0) === 0xa0) return str(c & 0x1f);
    if ((c & 0xf0) === 0x90) return arr(c & 0x0f, depth);
    if ((c & 0xf0) === 0x80) return map(c & 0x0f, depth);
    switch (c) {
      case 0xc0:
        return { t: "nil" };
      case 0xc2:
        return { t: "bool", v: false };
      case 0xc3:
        return { t: "bool", v: true };
      case 0xc4:
        need(1);
        return bin(b[o++]!);
      case 0xc5:
        need(2);
        o += 2;
        return bin(dv.getUint16(o - 2));
      case 0xc6:
        need(4);
        o += 4;
        return bin(dv.getUint32(o - 4));
      case 0xca:
        need(4);
        o += 4;
        return { t: "float", v: dv.getFloat32(o - 4) };
      case 0xcb:
        need(8);
        o += 8;
        return { t: "float", v: dv.getFloat64(o - 8) };
      case 0xcc:
        need(1);
        return { t: "int", v: b[o++]! };
      case 0xcd:
        need(2);
        o += 2;
        return { t: "int", v: dv.getUint16(o - 2) };
      case 0xce:
        need(4);
        o += 4;
        return { t: "int", v: dv.getUint32(o - 4) };
      case 0xcf:
        need(8);
        o += 8;
        return { t: "int", v: Number(dv.getBigUint64(o - 8)) };
      case 0xd0:
        need(1);
        o += 1;
        return { t: "int", v: dv.getInt8(o - 1) };
      case 0xd1:
        need(2);
        o += 2;
        return { t: "int", v: dv.getInt16(o - 2) };
      case 0xd2:
        need(4);
        o += 4;
        return { t: "int", v: dv.getInt32(o - 4) };
      case 0xd3:
        need(8);
        o += 8;
        return { t: "int", v: Number(dv.getBigInt64(o - 8)) };
      case 0xd9:
        need(1);
        return str(b[o++]!);
      case 0xda:
        need(2);
        o += 2;
        return str(dv.getUint16(o - 2));
      case 0xdb:
        need(4);
        o += 4;
        return str(dv.getUint32(o - 4));
      case 0xdc:
        need(2);
        o += 2;
        return arr(dv.getUint16(o - 2), depth);
      case 0xdd:
        need(4);
        o += 4;
        return arr(dv.getUint32(o - 4), depth);
      case 0xde:
        need(2);
        o += 2;
        return map(dv.getUint16(o - 2), depth);
      case 0xdf:
        need(4);
        o += 4;
        return map(dv.getUint32(o - 4), depth);
      default:
        throw new Error(`type byte 0x${c.toString(16)} (ext or reserved)`);
    }
  };
  const arr = (n: number, depth: number): Typed => {
    if (n > b.length - o) throw new Error(`array of ${n} longer than the message`);
    const v: Typed[] = [];
    for (let i = 0; i < n; i++) v.push(read(depth + 1));
    return { t: "array", v };
  };
  const map = (n: number, depth: number): Typed => {
    if (n * 2 > b.length - o) throw new Error(`map of ${n} longer than the message`);
    const v: [Typed, Typed][] = [];
    for (let i = 0; i < n; i++) v.push([read(depth + 1), read(depth + 1)]);
    return { t: "map", v };
  };
  const out = read(0);
  if (o !== b.length) throw new Error(`${b.length - o} bytes after the value`);
  return out;
}

/** A flat map's entries by string key (null when not a map of string keys). */
export function mapEntries(v: Typed): Map<string, Typed> | null {
  if (v.t !== "map") return null;
  const m = new Map<string, Typed>();
  for (const [k, x] of v.v) {
    if (k.t !== "str") return null;
    m.set(k.v, x);
  }
  return m;
}

// Builders (msgpack bytes written by hand: the hostile ones no encoder would produce).

/** A str (str8/str16/str32 as needed). */
export function mpStr(s: string): Uint8Array {
  const b = Buffer.from(s, "utf8");
  if (b.length < 32) return Uint8Array.from([0xa0 | b.length, ...b]);
  if (b.length < 256) return Uint8Array.from([0xd9, b.length, ...b]);
  const h = Buffer.alloc(3);
  h[0] = 0xda;
  h.writeUInt16BE(b.length, 1);
  return new Uint8Array(Buffer.concat([h, b]));
}

/** A non-negative int (fixint / uint8 / uint16 / uint32). */
export function mpUint(n: number): Uint8Array {
  if (n < 128) return Uint8Array.of(n);
  if (n < 256) return Uint8Array.of(0xcc, n);
  if (n < 65536) return Uint8Array.of(0xcd, n >> 8, n & 0xff);
  const b = Buffer.alloc(5);
  b[0] = 0xce;
  b.writeUInt32BE(n >>> 0, 1);
  return new Uint8Array(b);
}

/** A float64. */
export function mpFloat(x: number): Uint8Array {
  const b = Buffer.alloc(9);
  b[0] = 0xcb;
  b.writeDoubleBE(x, 1);
  return new Uint8Array(b);
}

/** A map from already-encoded values. */
export function mpMap(entries: [string, Uint8Array][]): Uint8Array {
  const parts: Uint8Array[] = [
    entries.length < 16 ? Uint8Array.of(0x80 | entries.length) : Uint8Array.of(0xde, 0, entries.length),
  ];
  for (const [k, v] of entries) parts.push(mpStr(k), v);
  return new Uint8Array(Buffer.concat(parts));
}

/** `depth` nested one-element arrays around a 0 (the nesting bomb of EC-CONTRACT 9.1). */
export function mpNestingBomb(depth: number): Uint8Array {
  const b = new Uint8Array(depth + 1);
  b.fill(0x91, 0, depth);
  b[depth] = 0;
  return b;
}
