/**
 * bfloat16 helpers. A bf16 value is the upper 16 bits of an IEEE-754 binary32; conversion from
 * f32 rounds to nearest, ties to even; NaN stays NaN (quiet, sign kept); infinities stay
 * infinities; values that round past the largest finite bf16 become infinities (IEEE behaviour).
 * Bytes are little-endian (CONTRACT 2).
 */

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** Bits of a bf16 (u16) from an f32 bit pattern (u32), round to nearest even. */
export function f32BitsToBf16(bits: number): number {
  bits >>>= 0;
  if ((bits & 0x7f800000) === 0x7f800000 && (bits & 0x007fffff) !== 0) {
    return ((bits >>> 16) | 0x0040) & 0xffff;
  }
  return ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16) & 0xffff;
}

/** Converts a number to bf16 bits (u16), via f32, rounding to nearest even. */
export function f32ToBf16(x: number): number {
  f32[0] = x;
  return f32BitsToBf16(u32[0]!);
}

/** Converts bf16 bits (u16) to the number they represent (exact). */
export function bf16ToF32(bits: number): number {
  u32[0] = (bits & 0xffff) << 16;
  return f32[0]!;
}

/**
 * Encodes `src` as little-endian bf16 into `dst` starting at byte `offset`
 * (`dst` needs `2 * src.length` bytes from there). No allocation.
 */
export function encodeBf16(src: Float32Array, dst: Uint8Array, offset = 0): void {
  const n = src.length;
  if (offset < 0 || offset + 2 * n > dst.length) {
    throw new RangeError(`encodeBf16: ${2 * n} bytes at offset ${offset} do not fit in ${dst.length}`);
  }
  for (let i = 0; i < n; i++) {
    f32[0] = src[i]!;
    const h = f32BitsToBf16(u32[0]!);
    dst[offset + 2 * i] = h & 0xff;
    dst[offset + 2 * i + 1] = h >>> 8;
  }
}

/**
 * Decodes `dst.length` little-endian bf16 values from `src` starting at byte `offset` into `dst`.
 * No allocation.
 */
export function decodeBf16(src: Uint8Array, dst: Float32Array, offset = 0): void {
  const n = dst.length;
  if (offset < 0 || offset + 2 * n > src.length) {
    throw new RangeError(`decodeBf16: ${2 * n} bytes at offset ${offset} exceed ${src.length}`);
  }
  for (let i = 0; i < n; i++) {
    u32[0] = (src[offset + 2 * i]! | (src[offset + 2 * i + 1]! << 8)) << 16;
    dst[i] = f32[0]!;
  }
}
