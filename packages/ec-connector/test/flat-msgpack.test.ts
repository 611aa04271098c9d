import { encode } from "@msgpack/msgpack";
import { describe, expect, it } from "vitest";
import { decodeFlatMap, MsgFloat } from "../src/flat-msgpack.js";
import { decodeXferAck, decodeXferReq, EcError } from "../src/index.js";

// EC-CONTRACT 9.1: one flat map, refused before anything is built.
const REQ = { mm_hash: "h1", compatibility_hash: "c", session_id: "s", connector_version: 2 };
const MiB = 1024 * 1024;

function refused(bytes: Uint8Array, re: RegExp, arrays?: string[]): void {
  let err: unknown;
  try {
    decodeFlatMap(bytes, "msg", arrays === undefined ? {} : { arrays: new Set(arrays) });
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(EcError);
  expect((err as EcError).code).toBe("EC_MALFORMED");
  expect((err as Error).message).toMatch(re);
}

describe("flat control-message decoder (EC-CONTRACT 9.1)", () => {
  it("decodes a flat map: ints, strings, bins, bools, nil, floats kept apart, a declared int array", () => {
    const m = decodeFlatMap(
      encode({
        a: 1,
        b: -3,
        c: 2 ** 40,
        s: "x",
        z: new Uint8Array([1, 2]),
        t: true,
        n: null,
        f: 0.5,
        arr: [1, 300, 70000],
      }),
      "msg",
      { arrays: new Set(["arr"]) },
    );
    expect(m).toMatchObject({ a: 1, b: -3, c: 2 ** 40, s: "x", t: true, n: null, arr: [1, 300, 70000] });
    expect(m["z"]).toEqual(new Uint8Array([1, 2]));
    expect(m["f"]).toBeInstanceOf(MsgFloat);
  });

  it("the nested-array bomb (8 MiB of nested one-element arrays) is refused at its first nested byte", () => {
    const top = new Uint8Array(8 * MiB).fill(0x91); // [[[[...]]]] as the whole message
    refused(top, /not a map/);
    // inside a map value, under a key that may hold an array, and under one that may not
    const inMap = new Uint8Array(8 * MiB).fill(0x91);
    inMap.set([0x81, 0xa1, 0x78], 0); // {"x": [[[[...]]]]}
    refused(inMap, /nested container/, ["x"]);
    refused(inMap, /array where none is declared/);
    const heapBefore = process.memoryUsage().heapUsed;
    for (let i = 0; i < 100; i++) refused(inMap, /nested container/, ["x"]);
    // nothing was materialised: 100 bombs leave the heap where it was (the input is not on the heap)
    expect(process.memoryUsage().heapUsed - heapBefore).toBeLessThan(16 * MiB);
  });

  it("a 2^32-entry map header, or one longer than the bytes, is refused before any entry", () => {
    refused(new Uint8Array([0xdf, 0xff, 0xff, 0xff, 0xff]), /4294967295 entries/);
    refused(
      new Uint8Array([0xde, 0x00, 0x30, 0xa1, 0x61, 0x01]),
      /declares 48 entries but only 3 bytes remain/,
    );
    refused(
      new Uint8Array([0x81, 0xa1, 0x61, 0xdd, 0xff, 0xff, 0xff, 0xff]),
      /4294967295 elements but only 0/,
      ["a"],
    );
  });

  it("strings and bins past the end are refused", () => {
    refused(new Uint8Array([0x81, 0xa1, 0x61, 0xdb, 0x7f, 0xff, 0xff, 0xff, 0x41]), /runs past the end/);
    refused(new Uint8Array([0x81, 0xa1, 0x61, 0xc6, 0x80, 0x00, 0x00, 0x00, 0x00]), /runs past the end/);
    refused(new Uint8Array([0x81, 0xa1, 0x61, 0xa5, 0x41, 0x42]), /runs past the end/);
    refused(new Uint8Array([0x81, 0xbf, 0x61]), /runs past the end/); // the key itself
  });

  it("floats are not integers, even 2.0 (connector_version: 2.0 is refused)", () => {
    const float2 = encode(REQ, { forceIntegerToFloat: true });
    expect(float2.includes(0xcb)).toBe(true); // really a float64 on the wire
    expect(() => decodeXferReq(float2)).toThrow(/connector_version is not an integer/);
    const f32 = new Uint8Array([
      ...encode({ ...REQ, connector_version: undefined }, { ignoreUndefined: true }),
    ]);
    // the same request with connector_version as a float32 2.0, appended by hand
    const bytes = new Uint8Array([
      0x84,
      ...f32.subarray(1),
      0xb1,
      ...new TextEncoder().encode("connector_version"),
      0xca,
      0x40,
      0x00,
      0x00,
      0x00,
    ]);
    expect(() => decodeXferReq(bytes)).toThrow(/connector_version is not an integer/);
    expect(() =>
      decodeXferAck(encode({ mm_hash: "h", status: 1.0 }, { forceIntegerToFloat: true }), 16),
    ).toThrow(/status is not an integer/);
  });

  it("block indices must be integers (no floats, no nesting); ext, duplicate keys and trailing bytes are refused", () => {
    const ok = { mm_hash: "h", status: 1 };
    expect(() => decodeXferAck(encode({ ...ok, src_block_indices: [1, 2.5] }), 16)).toThrow(/not an integer/);
    expect(() => decodeXferAck(encode({ ...ok, src_block_indices: [[1]] }), 16)).toThrow(/nested container/);
    refused(new Uint8Array([0x81, 0xa1, 0x61, 0xd4, 0x01, 0x00]), /unsupported type 0xd4/);
    refused(new Uint8Array([0x82, 0xa1, 0x61, 0x01, 0xa1, 0x61, 0x02]), /duplicate key a/);
    refused(new Uint8Array([0x81, 0xa1, 0x61, 0x01, 0x00]), /1 trailing bytes/);
    refused(new Uint8Array([0x81, 0x01, 0x01]), /key is not a string/);
    refused(
      new Uint8Array([0x81, 0xa1, 0x61, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
      /beyond 2\^53/,
    );
  });
});

// Issue 23: the ASCII fast path of strings and the key cache change no result (EC-CONTRACT 9.1).
describe("flat decoder fast paths (issue 23)", () => {
  it("ASCII, multi-byte and long strings decode as UTF-8; invalid UTF-8 keys and values are refused", () => {
    const long = "k".repeat(40); // past the key cache's 32 bytes
    const m = decodeFlatMap(
      encode({ ascii: "emb-1k", ключ: "значение", [long]: "é".repeat(70), e: "" }),
      "msg",
    );
    expect(m).toEqual({ ascii: "emb-1k", ключ: "значение", [long]: "é".repeat(70), e: "" });
    // 0xa1 0xff: a one-byte key that is not UTF-8; 0x81 map, then key "a" with value 0xa1 0xc3.
    refused(new Uint8Array([0x81, 0xa1, 0xff, 0x01]), /not UTF-8/);
    refused(new Uint8Array([0x81, 0xa1, 0x61, 0xa1, 0xc3]), /not UTF-8/);
  });

  it("a key seen before decodes the same in every message, next to keys that differ in one byte", () => {
    for (let i = 0; i < 3; i++) {
      expect(decodeFlatMap(encode({ ...REQ, mm_hasi: i }), "msg")).toEqual({ ...REQ, mm_hasi: i });
      expect(decodeXferReq(encode({ ...REQ, mm_hash: `h${i}` })).mmHash).toBe(`h${i}`);
    }
  });

  it("a flood of distinct keys fills the bounded key cache and decoding stays exact afterwards", () => {
    for (let i = 0; i < 20; i++) {
      const o: Record<string, number> = {};
      for (let j = 0; j < 30; j++) o[`flood_${i}_${j}`] = j;
      expect(decodeFlatMap(encode(o), "msg")).toEqual(o);
    }
    expect(decodeFlatMap(encode({ fresh_key_after_flood: 7, ...REQ }), "msg")).toEqual({
      fresh_key_after_flood: 7,
      ...REQ,
    });
    // a cached key twice in one map is still a duplicate
    const dup = encode({ mm_hash: 1, mm_hasX: 2 });
    dup[17] = 0x68; // "mm_hasX" -> "mm_hash"
    refused(dup, /duplicate key mm_hash/);
  });
});
