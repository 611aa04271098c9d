import { EcError } from "./errors.js";

/**
 * A MessagePack float as decoded by {@link decodeFlatMap}: kept apart from integers, so a float is
 * never accepted where an integer is required, not even `2.0` (EC-CONTRACT 9.1).
 */
export class MsgFloat {
  constructor(readonly value: number) {}
}

/** A decoded value of a flat control map. */
export type FlatValue = null | boolean | number | MsgFloat | string | Uint8Array | number[] | string[];

/** Limits of {@link decodeFlatMap}. */
export interface FlatLimits {
  /** Keys whose value may be an array (of integers only). */
  readonly arrays?: ReadonlySet<string>;
  /** Most entries in the map (default 64). */
  readonly maxEntries?: number;
  /** Most elements in an allowed array (default: what the bytes can hold). */
  readonly maxArray?: number;
  /** Keys whose value may be an array of strings (EC-CONTRACT 10.1 `mm_hashes`), at most `maxArray`. */
  readonly stringArrays?: ReadonlySet<string>;
  /** Longest string in a string array, in UTF-8 bytes (default 256, EC-CONTRACT 3). */
  readonly maxStringBytes?: number;
}

const NO_ARRAYS: ReadonlySet<string> = new Set();
const UTF8_FATAL = new TextDecoder("utf-8", { fatal: true });

/**
 * EC-CONTRACT 9.1: decodes one control message that must be a single flat MessagePack map with
 * string keys. The only container allowed inside it is an array of integers under a key listed in
 * `limits.arrays`; a nested map or array, an ext, a declared length (of the map, an array, a
 * string or a bin) longer than the bytes that remain, a duplicate key, or trailing bytes is
 * malformed. Every length is checked against the remaining bytes *before* anything is allocated,
 * so a hostile message costs at most its own size: a nested-array bomb fails at its first nested
 * byte, a 2^32-entry map header at its header. Throws `EC_MALFORMED` naming the first problem.
 */
export function decodeFlatMap(
  bytes: Uint8Array,
  what: string,
  limits: FlatLimits = {},
): Record<string, FlatValue> {
  const r = new FlatReader(bytes, what);
  const n = r.mapHeader();
  const maxEntries = limits.maxEntries ?? 64;
  if (n > maxEntries) r.fail(`map of ${n} entries (at most ${maxEntries})`);
  // Each entry needs at least two bytes (a fixstr key and a one-byte value).
  if (n * 2 > r.left) r.fail(`map declares ${n} entries but only ${r.left} bytes remain`);
  const arrays = limits.arrays ?? NO_ARRAYS;
  const strArrays = limits.stringArrays ?? NO_ARRAYS;
  const out: Record<string, FlatValue> = Object.create(null) as Record<string, FlatValue>;
  for (let i = 0; i < n; i++) {
    const key = r.key();
    if (Object.hasOwn(out, key)) r.fail(`duplicate key ${key}`);
    const max = limits.maxArray ?? Number.MAX_SAFE_INTEGER;
    out[key] = strArrays.has(key)
      ? r.stringArray(max, key, limits.maxStringBytes ?? 256)
      : r.value(arrays.has(key) ? max : -1, key);
  }
  if (r.left !== 0) r.fail(`${r.left} trailing bytes`);
  return out;
}

class FlatReader {
  readonly #b: Uint8Array;
  readonly #v: DataView;
  readonly #what: string;
  #p = 0;

  constructor(bytes: Uint8Array, what: string) {
    this.#b = bytes;
    this.#v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.#what = what;
  }

  get left(): number {
    return this.#b.length - this.#p;
  }

  fail(why: string): never {
    throw new EcError("EC_MALFORMED", `${this.#what}: not a flat MessagePack map (${why})`);
  }

  #need(n: number): void {
    if (n > this.left) this.fail(`a length of ${n} runs past the end (${this.left} bytes remain)`);
  }

  #u8(): number {
    this.#need(1);
    return this.#b[this.#p++]!;
  }

  #uint(size: 1 | 2 | 4): number {
    this.#need(size);
    const p = this.#p;
    this.#p += size;
    return size === 1 ? this.#v.getUint8(p) : size === 2 ? this.#v.getUint16(p) : this.#v.getUint32(p);
  }

  mapHeader(): number {
    const t = this.#u8();
    if (t >= 0x80 && t <= 0x8f) return t & 0x0f;
    if (t === 0xde) return this.#uint(2);
    if (t === 0xdf) return this.#uint(4);
    return this.fail("the message is not a map");
  }

  key(): string {
    const t = this.#u8();
    const len = this.#strLen(t);
    if (len < 0) this.fail("a key is not a string");
    return this.#str(len);
  }

  /** One value; `maxArray` >= 0 allows an array of integers of at most that many elements. */
  value(maxArray: number, key: string): FlatValue {
    const t = this.#u8();
    if (t <= 0x7f) return t;
    if (t >= 0xe0) return t - 0x100;
    const sl = this.#strLen(t);
    if (sl >= 0) return this.#str(sl);
    switch (t) {
      case 0xc0:
        return null;
      case 0xc2:
        return false;
      case 0xc3:
        return true;
      case 0xc4:
        return this.#bin(this.#uint(1));
      case 0xc5:
        return this.#bin(this.#uint(2));
      case 0xc6:
        return this.#bin(this.#uint(4));
      case 0xca:
        this.#need(4);
        this.#p += 4;
        return new MsgFloat(this.#v.getFloat32(this.#p - 4));
      case 0xcb:
        this.#need(8);
        this.#p += 8;
        return new MsgFloat(this.#v.getFloat64(this.#p - 8));
      case 0xdc:
      case 0xdd:
        return this.#array(t === 0xdc ? this.#uint(2) : this.#uint(4), maxArray, key);
      default:
        if (t >= 0x90 && t <= 0x9f) return this.#array(t & 0x0f, maxArray, key);
        if (t >= 0x80 && t <= 0x8f) return this.fail(`${key}: a nested map`);
        if (t === 0xde || t === 0xdf) return this.fail(`${key}: a nested map`);
        if (t >= 0xcc && t <= 0xd3) return this.#int(t);
        return this.fail(`${key}: unsupported type 0x${t.toString(16)}`);
    }
  }

  /** EC-CONTRACT 10.1: an array of strings (nothing else inside), each at most `maxBytes` bytes. */
  stringArray(maxArray: number, key: string, maxBytes: number): string[] {
    const t = this.#u8();
    const n =
      t >= 0x90 && t <= 0x9f ? t & 0x0f : t === 0xdc ? this.#uint(2) : t === 0xdd ? this.#uint(4) : -1;
    if (n < 0) this.fail(`${key} is not an array`);
    if (n > maxArray) this.fail(`${key}: array of ${n} elements (at most ${maxArray})`);
    if (n > this.left) this.fail(`${key}: array declares ${n} elements but only ${this.left} bytes remain`);
    const out = new Array<string>(n);
    for (let i = 0; i < n; i++) {
      const len = this.#strLen(this.#u8());
      if (len < 0) this.fail(`${key}[${i}] is not a string`);
      if (len > maxBytes) this.fail(`${key}[${i}] is longer than ${maxBytes} bytes`);
      out[i] = this.#str(len);
    }
    return out;
  }

  #array(n: number, maxArray: number, key: string): number[] {
    if (maxArray < 0) this.fail(`${key}: an array where none is declared`);
    if (n > maxArray) this.fail(`${key}: array of ${n} elements (at most ${maxArray})`);
    if (n > this.left) this.fail(`${key}: array declares ${n} elements but only ${this.left} bytes remain`);
    const out = new Array<number>(n);
    for (let i = 0; i < n; i++) {
      const t = this.#u8();
      if (t <= 0x7f) out[i] = t;
      else if (t >= 0xe0) out[i] = t - 0x100;
      else if (t >= 0xcc && t <= 0xd3) out[i] = this.#int(t);
      else if ((t >= 0x90 && t <= 0x9f) || t === 0xdc || t === 0xdd || (t >= 0x80 && t <= 0x8f)) {
        this.fail(`${key}: a nested container`);
      } else this.fail(`${key}[${i}] is not an integer`);
    }
    return out;
  }

  /** uint8..uint64 (0xcc-0xcf), int8..int64 (0xd0-0xd3); beyond 2^53 is malformed. */
  #int(t: number): number {
    const size = 1 << (t & 0x03);
    this.#need(size);
    const p = this.#p;
    this.#p += size;
    const v = this.#v;
    const signed = t >= 0xd0;
    let x: number;
    if (size === 1) x = signed ? v.getInt8(p) : v.getUint8(p);
    else if (size === 2) x = signed ? v.getInt16(p) : v.getUint16(p);
    else if (size === 4) x = signed ? v.getInt32(p) : v.getUint32(p);
    else {
      const big = signed ? v.getBigInt64(p) : v.getBigUint64(p);
      if (big > BigInt(Number.MAX_SAFE_INTEGER) || big < BigInt(Number.MIN_SAFE_INTEGER)) {
        this.fail("an integer beyond 2^53");
      }
      x = Number(big);
    }
    return x;
  }

  /** A str header's length, or -1 when `t` is not a str type. */
  #strLen(t: number): number {
    if (t >= 0xa0 && t <= 0xbf) return t & 0x1f;
    if (t === 0xd9) return this.#uint(1);
    if (t === 0xda) return this.#uint(2);
    if (t === 0xdb) return this.#uint(4);
    return -1;
  }

  #str(len: number): string {
    this.#need(len);
    const p = this.#p;
    this.#p += len;
    try {
      return UTF8_FATAL.decode(this.#b.subarray(p, p + len));
    } catch {
      return this.fail("a string is not UTF-8");
    }
  }

  #bin(len: number): Uint8Array {
    this.#need(len);
    const p = this.#p;
    this.#p += len;
    return this.#b.slice(p, p + len);
  }
}
