import fc from "fast-check";
import { describe, expect, test } from "vitest";
import { bf16ToF32, decodeBf16, encodeBf16, f32BitsToBf16, f32ToBf16 } from "../src/index.js";

describe("bf16 (round to nearest, ties to even)", () => {
  const table: [string, number, number][] = [
    ["1.0", 0x3f800000, 0x3f80],
    ["exact tie rounds to even (down)", 0x3f808000, 0x3f80],
    ["exact tie rounds to even (up)", 0x3f818000, 0x3f82],
    ["just above tie rounds up", 0x3f808001, 0x3f81],
    ["just below tie rounds down", 0x3f807fff, 0x3f80],
    ["-0", 0x80000000, 0x8000],
    ["+inf", 0x7f800000, 0x7f80],
    ["-inf", 0xff800000, 0xff80],
    ["max finite f32 overflows to inf", 0x7f7fffff, 0x7f80],
    ["NaN with low payload stays NaN", 0x7f800001, 0x7fc0],
    ["negative NaN keeps sign", 0xffc00000, 0xffc0],
    ["smallest subnormal rounds to 0", 0x00000001, 0x0000],
  ];
  test.each(table)("%s", (_name, bits, expected) => {
    expect(f32BitsToBf16(bits)).toBe(expected);
  });

  test("f32ToBf16 of representable values is exact and bf16ToF32 inverts it", () => {
    for (const x of [0, 1, -1, 0.5, 3.140625, -1024, 2 ** -126, 65536]) {
      expect(bf16ToF32(f32ToBf16(x))).toBe(x);
    }
    expect(Number.isNaN(bf16ToF32(f32ToBf16(Number.NaN)))).toBe(true);
  });

  test("property: rounding picks the nearer neighbour, the even one on ties", () => {
    const f = new Float32Array(1);
    const u = new Uint32Array(f.buffer);
    fc.assert(
      fc.property(
        fc.float({ noNaN: true, noDefaultInfinity: true, min: Math.fround(-3e38), max: Math.fround(3e38) }),
        (x) => {
          f[0] = x;
          const bits = u[0]!;
          const down = bits >>> 16;
          const up = down + 1;
          const mag = Math.abs(f[0]!);
          const dDown = Math.abs(mag - Math.abs(bf16ToF32(down)));
          const dUp = Math.abs(Math.abs(bf16ToF32(up)) - mag);
          const expected = dDown < dUp ? down : dUp < dDown ? up : down % 2 === 0 ? down : up;
          return f32ToBf16(x) === (expected & 0xffff);
        },
      ),
      { seed: 42, numRuns: 3000 },
    );
  });

  test("property: bulk encode/decode matches scalar conversion, little-endian", () => {
    fc.assert(
      fc.property(fc.array(fc.float({ noNaN: true }), { maxLength: 64 }), fc.nat({ max: 7 }), (xs, off) => {
        const src = Float32Array.from(xs);
        const bytes = new Uint8Array(off + 2 * src.length);
        encodeBf16(src, bytes, off);
        const back = new Float32Array(src.length);
        decodeBf16(bytes, back, off);
        for (let i = 0; i < src.length; i++) {
          const h = f32ToBf16(src[i]!);
          if (bytes[off + 2 * i] !== (h & 0xff) || bytes[off + 2 * i + 1] !== h >>> 8) return false;
          if (!Object.is(back[i], bf16ToF32(h))) return false;
        }
        return true;
      }),
      { seed: 7, numRuns: 300 },
    );
  });

  test("bulk helpers refuse buffers that are too small", () => {
    expect(() => encodeBf16(new Float32Array(4), new Uint8Array(7))).toThrow(RangeError);
    expect(() => decodeBf16(new Uint8Array(7), new Float32Array(4))).toThrow(RangeError);
  });
});
