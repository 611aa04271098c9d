import fc from "fast-check";
import { describe, expect, test } from "vitest";
import {
  ReferenceModelError,
  readSafetensors,
  type SafetensorsTensor,
  writeSafetensors,
} from "../src/index.js";

function file(header: unknown, data: Uint8Array = new Uint8Array(0)): Uint8Array {
  const json = new TextEncoder().encode(typeof header === "string" ? header : JSON.stringify(header));
  const out = new Uint8Array(8 + json.length + data.length);
  new DataView(out.buffer).setUint32(0, json.length, true);
  out.set(json, 8);
  out.set(data, 8 + json.length);
  return out;
}

function codeOf(f: () => unknown): string {
  try {
    f();
  } catch (e) {
    if (e instanceof ReferenceModelError) return e.code;
    throw e;
  }
  return "OK";
}

const tensorArb = fc
  .record({
    dtype: fc.constantFrom("F32", "BF16", "I32", "U8", "F64", "I64"),
    shape: fc.array(fc.integer({ min: 0, max: 4 }), { maxLength: 3 }),
  })
  .chain(({ dtype, shape }) => {
    const size = { F32: 4, BF16: 2, I32: 4, U8: 1, F64: 8, I64: 8 }[dtype]!;
    const n = shape.reduce((a, b) => a * b, 1) * size;
    return fc
      .uint8Array({ minLength: n, maxLength: n })
      .map((data): SafetensorsTensor => ({ dtype, shape, data }));
  });

describe("safetensors", () => {
  test("property: write then read round-trips tensors and metadata", () => {
    fc.assert(
      fc.property(
        fc.uniqueArray(
          fc.tuple(
            fc.string({ minLength: 1, maxLength: 12 }).filter((s) => s !== "__metadata__"),
            tensorArb,
          ),
          {
            selector: (t) => t[0],
            maxLength: 6,
          },
        ),
        fc.dictionary(fc.string({ maxLength: 8 }), fc.string({ maxLength: 8 })),
        (entries, md) => {
          const m = new Map(entries);
          const buf = writeSafetensors(m, md);
          const hdr = new DataView(buf.buffer).getUint32(0, true);
          if ((8 + hdr) % 8 !== 0) return false;
          const meta = new Map<string, string>();
          const back = readSafetensors(buf, { metadata: meta });
          if (back.size !== m.size) return false;
          for (const [name, t] of m) {
            const b = back.get(name);
            if (!b || b.dtype !== t.dtype || JSON.stringify(b.shape) !== JSON.stringify(t.shape))
              return false;
            if (Buffer.compare(Buffer.from(b.data), Buffer.from(t.data)) !== 0) return false;
          }
          return JSON.stringify(Object.fromEntries(meta)) === JSON.stringify(md);
        },
      ),
      { seed: 17, numRuns: 300 },
    );
  });

  test("reads a hand-made file with metadata; tensor data are views", () => {
    const data = new Uint8Array([1, 0, 0, 0, 2, 0, 0, 0, 9, 9]);
    const buf = file(
      {
        __metadata__: { format: "pt" },
        b: { dtype: "U8", shape: [2], data_offsets: [8, 10] },
        a: { dtype: "I32", shape: [2], data_offsets: [0, 8] },
      },
      data,
    );
    const t = readSafetensors(buf);
    expect(t.get("a")!.shape).toEqual([2]);
    expect(Array.from(t.get("b")!.data)).toEqual([9, 9]);
    expect(t.get("a")!.data.buffer).toBe(buf.buffer);
  });

  const bad: [string, () => Uint8Array, string][] = [
    ["fewer than 8 bytes", () => new Uint8Array(7), "RM_SAFETENSORS_TRUNCATED"],
    ["header length 0", () => new Uint8Array(8), "RM_SAFETENSORS_HEADER"],
    [
      "header length beyond the file",
      () => {
        const b = file({});
        new DataView(b.buffer).setUint32(0, 100, true);
        return b;
      },
      "RM_SAFETENSORS_TRUNCATED",
    ],
    [
      "header length above 2^32",
      () => {
        const b = file({});
        new DataView(b.buffer).setUint32(4, 1, true);
        return b;
      },
      "RM_SAFETENSORS_HEADER",
    ],
    ["not JSON", () => file("{nope"), "RM_SAFETENSORS_HEADER"],
    ["JSON array", () => file("[1, 2]"), "RM_SAFETENSORS_HEADER"],
    ["leading space", () => file(" {}"), "RM_SAFETENSORS_HEADER"],
    ["invalid UTF-8", () => file('{"\xff":1}').map((x, i) => (i === 10 ? 0xff : x)), "RM_SAFETENSORS_HEADER"],
    ["metadata not object", () => file({ __metadata__: [] }), "RM_SAFETENSORS_HEADER"],
    ["metadata value not string", () => file({ __metadata__: { a: 1 } }), "RM_SAFETENSORS_HEADER"],
    ["entry not object", () => file({ a: 3 }), "RM_SAFETENSORS_HEADER"],
    [
      "unknown dtype",
      () => file({ a: { dtype: "F128", shape: [], data_offsets: [0, 0] } }),
      "RM_SAFETENSORS_DTYPE",
    ],
    [
      "negative dim",
      () => file({ a: { dtype: "U8", shape: [-1], data_offsets: [0, 0] } }),
      "RM_SAFETENSORS_SHAPE",
    ],
    [
      "fractional dim",
      () => file({ a: { dtype: "U8", shape: [1.5], data_offsets: [0, 0] } }),
      "RM_SAFETENSORS_SHAPE",
    ],
    ["offsets missing", () => file({ a: { dtype: "U8", shape: [0] } }), "RM_SAFETENSORS_OFFSETS"],
    [
      "offsets reversed",
      () => file({ a: { dtype: "U8", shape: [0], data_offsets: [2, 1] } }, new Uint8Array(2)),
      "RM_SAFETENSORS_OFFSETS",
    ],
    [
      "offsets past data",
      () => file({ a: { dtype: "U8", shape: [4], data_offsets: [0, 4] } }, new Uint8Array(3)),
      "RM_SAFETENSORS_OFFSETS",
    ],
    [
      "size mismatch",
      () => file({ a: { dtype: "F32", shape: [2], data_offsets: [0, 4] } }, new Uint8Array(4)),
      "RM_SAFETENSORS_SHAPE",
    ],
    [
      "overlap",
      () =>
        file(
          {
            a: { dtype: "U8", shape: [2], data_offsets: [0, 2] },
            b: { dtype: "U8", shape: [2], data_offsets: [1, 3] },
          },
          new Uint8Array(3),
        ),
      "RM_SAFETENSORS_OFFSETS",
    ],
    [
      "hole",
      () => file({ a: { dtype: "U8", shape: [1], data_offsets: [1, 2] } }, new Uint8Array(2)),
      "RM_SAFETENSORS_OFFSETS",
    ],
    [
      "trailing bytes",
      () => file({ a: { dtype: "U8", shape: [1], data_offsets: [0, 1] } }, new Uint8Array(2)),
      "RM_SAFETENSORS_OFFSETS",
    ],
  ];
  test.each(bad)("refuses %s", (_name, make, code) => {
    expect(codeOf(() => readSafetensors(make()))).toBe(code);
  });

  test("header limit is an option", () => {
    const buf = file({ a: { dtype: "U8", shape: [0], data_offsets: [0, 0] } });
    expect(codeOf(() => readSafetensors(buf, { maxHeaderBytes: 10 }))).toBe("RM_SAFETENSORS_HEADER");
    expect(codeOf(() => readSafetensors(buf))).toBe("OK");
    expect(codeOf(() => readSafetensors(buf, { maxHeaderBytes: 1.5 }))).toBe("RM_BAD_CONFIG");
    expect(() => readSafetensors(buf, { maxHeaderBytes: -1 })).toThrow(/maxHeaderBytes/);
  });

  test("writer refuses inconsistent tensors", () => {
    const m = new Map<string, SafetensorsTensor>([
      ["a", { dtype: "F32", shape: [3], data: new Uint8Array(8) }],
    ]);
    expect(codeOf(() => writeSafetensors(m))).toBe("RM_SAFETENSORS_SHAPE");
    m.set("a", { dtype: "Q4", shape: [], data: new Uint8Array(0) });
    expect(codeOf(() => writeSafetensors(m))).toBe("RM_SAFETENSORS_DTYPE");
  });

  test("fuzz: truncation at every offset and random byte flips fail only with package errors", () => {
    const m = new Map<string, SafetensorsTensor>([
      ["w", { dtype: "F32", shape: [2, 3], data: new Uint8Array(24).map((_, i) => i) }],
      ["b", { dtype: "BF16", shape: [3], data: new Uint8Array(6) }],
    ]);
    const good = writeSafetensors(m, { k: "v" });
    for (let n = 0; n < good.length; n++) {
      expect(codeOf(() => readSafetensors(good.subarray(0, n)))).not.toBe("OK");
    }
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.nat(), fc.integer({ min: 1, max: 255 })), { minLength: 1, maxLength: 4 }),
        (flips) => {
          const b = Uint8Array.from(good);
          for (const [pos, x] of flips) b[pos % b.length] = b[pos % b.length]! ^ x;
          codeOf(() => readSafetensors(b));
          // Still works on the intact file afterwards.
          return readSafetensors(good).size === 2;
        },
      ),
      { seed: 5, numRuns: 2000 },
    );
  });

  test("fuzz: random bytes fail only with package errors", () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 200 }), (bytes) => {
        codeOf(() => readSafetensors(bytes));
        return true;
      }),
      { seed: 6, numRuns: 2000 },
    );
  });
});
