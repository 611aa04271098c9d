// Little-endian byte access (CONTRACT 2) straight on the Uint8Array: no DataView is created per
// call, so hot paths that write or read a few fields allocate nothing.
import { badArgument } from "./errors.js";

export function rd16(b: Uint8Array, o: number): number {
  return b[o]! | (b[o + 1]! << 8);
}
export function rd32(b: Uint8Array, o: number): number {
  return (b[o]! | (b[o + 1]! << 8) | (b[o + 2]! << 16) | (b[o + 3]! << 24)) >>> 0;
}
export function wr16(b: Uint8Array, o: number, v: number): void {
  b[o] = v;
  b[o + 1] = v >>> 8;
}
export function wr32(b: Uint8Array, o: number, v: number): void {
  b[o] = v;
  b[o + 1] = v >>> 8;
  b[o + 2] = v >>> 16;
  b[o + 3] = v >>> 24;
}

/** The one integer-in-range check of the package: `v` is an integer in `[lo, hi]`. */
export function isIntIn(v: number, lo: number, hi: number): boolean {
  return Number.isInteger(v) && v >= lo && v <= hi;
}
export function isU8(v: number): boolean {
  return isIntIn(v, 0, 0xff);
}
export function isU16(v: number): boolean {
  return isIntIn(v, 0, 0xffff);
}
export function isU32(v: number): boolean {
  return isIntIn(v, 0, 0xffffffff);
}

export function checkU8(what: string, v: number): void {
  if (!isU8(v)) throw badArgument(`${what} ${v} is not a u8`);
}
export function checkU16(what: string, v: number): void {
  if (!isU16(v)) throw badArgument(`${what} ${v} is not a u16`);
}
export function checkU32(what: string, v: number): void {
  if (!isU32(v)) throw badArgument(`${what} ${v} is not a u32`);
}

export function pad4(n: number): number {
  return (n + 3) & ~3;
}

export function isZero(b: Uint8Array, from: number, to: number): boolean {
  for (let i = from; i < to; i++) if (b[i] !== 0) return false;
  return true;
}

const HEX = Array.from({ length: 256 }, (_, i) => i.toString(16).padStart(2, "0"));

/** Lowercase hex of bytes. */
export function toHex(b: Uint8Array): string {
  let s = "";
  for (let i = 0; i < b.length; i++) s += HEX[b[i]!];
  return s;
}

/**
 * Bytes of a hex string (even length, hex digits only, either case).
 * @throws WireError `WIRE_BAD_ARGUMENT` naming an odd length or the first non-hex character.
 */
export function fromHex(hex: string): Uint8Array {
  if (hex.length % 2 !== 0) throw badArgument(`hex string of odd length ${hex.length}`);
  const bad = hex.search(/[^0-9a-fA-F]/);
  if (bad >= 0) throw badArgument(`hex string has ${JSON.stringify(hex[bad])} at index ${bad}`);
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = Number.parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return out;
}

const views = new WeakMap<ArrayBufferLike, DataView>();

/**
 * A DataView over the whole ArrayBuffer of `b` (add `b.byteOffset` to offsets), created once per
 * buffer and cached weakly: hot paths that write many fields into a reused send buffer neither
 * allocate per call nor keep the buffer alive.
 */
export function viewOf(b: Uint8Array): DataView {
  const ab = b.buffer;
  let dv = views.get(ab);
  if (dv === undefined) {
    dv = new DataView(ab);
    views.set(ab, dv);
  }
  return dv;
}

const words = new WeakMap<ArrayBufferLike, Uint32Array>();

/**
 * A Uint32Array over the whole words of the ArrayBuffer of `b`, cached weakly like
 * {@link viewOf}. Index `(b.byteOffset + off) >> 2` for 4-aligned offsets; host byte order.
 */
export function wordsOf(b: Uint8Array): Uint32Array {
  const ab = b.buffer;
  let w = words.get(ab);
  if (w === undefined) {
    w = new Uint32Array(ab, 0, ab.byteLength >>> 2);
    words.set(ab, w);
  }
  return w;
}

export const IS_LITTLE_ENDIAN = new Uint8Array(Uint16Array.of(1).buffer)[0] === 1;
