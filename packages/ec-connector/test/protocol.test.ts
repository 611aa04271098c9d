import { encode } from "@msgpack/msgpack";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import type { XferAck } from "../src/index.js";
import {
  compatibilityHash,
  decodeXferAck,
  decodeXferReq,
  EC_CONNECTOR_VERSION,
  EcError,
  EXPECTED_NACKS,
  encodeXferAck,
  encodeXferReq,
  nackAck,
  RETRYABLE_NACKS,
  XferStatus,
} from "../src/index.js";

const REQ = { mm_hash: "h1", compatibility_hash: "c".repeat(64), session_id: "s-1", connector_version: 2 };
const ACK = {
  mm_hash: "h1",
  status: 0,
  session_id: "s-1",
  src_block_indices: [3, 4],
  agent_metadata: new Uint8Array([1, 2]),
  mem_descriptor: new Uint8Array([3]),
  nbytes: 100,
  crc32: 0xffffffff,
};

function malformed(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(EcError);
    expect((err as EcError).code).toBe("EC_MALFORMED");
    return (err as EcError).message;
  }
  throw new Error("expected EC_MALFORMED");
}

describe("compatibility hash (EC-CONTRACT 2)", () => {
  it("is the SHA-256 of the canonical JSON array (cross-checked with Python's json/hashlib)", () => {
    expect(EC_CONNECTOR_VERSION).toBe(2);
    expect(
      compatibilityHash({
        modelId: "Qwen/Qwen2.5-VL-7B-Instruct",
        dtype: "bfloat16",
        hiddenSize: 3584,
        blockBytes: 65536,
      }),
    ).toBe("2029b5464d83227d86b2b8f594694e04be0c6b2d3729805ac66a859bf1ed2722");
    const base = { modelId: "m", dtype: "bf16", hiddenSize: 8, blockBytes: 64 };
    const h = compatibilityHash(base);
    expect(compatibilityHash({ ...base, blockBytes: 128 })).not.toBe(h);
    expect(compatibilityHash(base, 3)).not.toBe(h);
    expect(() => compatibilityHash({ ...base, hiddenSize: 0 })).toThrow(/hiddenSize/);
  });
});

describe("status sets (EC-CONTRACT 3)", () => {
  it("has the contract's values", () => {
    expect(XferStatus).toEqual({
      OK: 0,
      NACK_MISSING: 1,
      NACK_NOT_READY: 2,
      NACK_INCOMPAT: 3,
      NACK_VERSION: 4,
      NACK_INTERNAL: 5,
    });
    expect([...EXPECTED_NACKS].sort()).toEqual([1, 2]);
    expect([...RETRYABLE_NACKS]).toEqual([2]);
  });
});

describe("XferReq codec (EC-CONTRACT 3)", () => {
  it("round-trips and uses the exact string keys", () => {
    const bytes = encodeXferReq({
      mmHash: "h1",
      compatibilityHash: "c".repeat(64),
      sessionId: "s-1",
      connectorVersion: 2,
    });
    expect(Buffer.from(bytes).equals(Buffer.from(encode(REQ)))).toBe(true);
    expect(decodeXferReq(bytes)).toEqual({
      mmHash: "h1",
      compatibilityHash: "c".repeat(64),
      sessionId: "s-1",
      connectorVersion: 2,
    });
  });

  it("ignores unknown extra keys", () => {
    expect(decodeXferReq(encode({ ...REQ, future: 7, note: "x", blob: new Uint8Array(2) })).mmHash).toBe(
      "h1",
    );
  });

  it("refuses a container under an unknown key (EC-CONTRACT 9.1: one flat map)", () => {
    expect(() => decodeXferReq(encode({ ...REQ, future: [1, { x: 2 }] }))).toThrow(
      /array where none is declared/,
    );
    expect(() => decodeXferReq(encode({ ...REQ, future: { x: 2 } }))).toThrow(/nested map/);
  });

  const cases: [string, unknown, RegExp][] = [
    ["not a map (array)", [1, 2], /not a map/],
    ["not a map (string)", "x", /not a map/],
    ["not a map (nil)", null, /not a map/],
    ["not a map (bin)", new Uint8Array(3), /not a map/],
    ["missing mm_hash", { ...REQ, mm_hash: undefined }, /missing mm_hash/],
    ["missing session_id", { ...REQ, session_id: undefined }, /missing session_id/],
    ["mm_hash not a string", { ...REQ, mm_hash: 7 }, /mm_hash is not a string/],
    ["version is a boolean", { ...REQ, connector_version: true }, /connector_version is not an integer/],
    ["version is a float", { ...REQ, connector_version: 2.5 }, /connector_version is not an integer/],
    ["string of 257 bytes", { ...REQ, session_id: "x".repeat(257) }, /session_id is longer than 256/],
    ["string of 129 two-byte chars", { ...REQ, mm_hash: "é".repeat(129) }, /mm_hash is longer than 256/],
  ];
  for (const [name, value, re] of cases) {
    it(`rejects ${name}`, () => {
      const v =
        value !== null && typeof value === "object" && !Array.isArray(value) && !(value instanceof Uint8Array)
          ? Object.fromEntries(Object.entries(value).filter(([, x]) => x !== undefined))
          : value;
      expect(malformed(() => decodeXferReq(encode(v)))).toMatch(re);
    });
  }

  it("accepts exactly 256 UTF-8 bytes", () => {
    expect(decodeXferReq(encode({ ...REQ, mm_hash: "é".repeat(128) })).mmHash).toHaveLength(128);
  });

  it("rejects every truncation and trailing bytes", () => {
    const bytes = encode(REQ);
    for (let n = 0; n < bytes.length; n++) malformed(() => decodeXferReq(bytes.subarray(0, n)));
    malformed(() => decodeXferReq(Buffer.concat([bytes, Buffer.from([0xc0])])));
  });
});

describe("XferAck codec (EC-CONTRACT 3)", () => {
  it("round-trips an OK ack and a NACK", () => {
    const ack: XferAck = {
      mmHash: "h1",
      status: XferStatus.OK,
      sessionId: "s-1",
      srcBlockIndices: [3, 4],
      agentMetadata: new Uint8Array([1, 2]),
      memDescriptor: new Uint8Array([3]),
      nbytes: 100,
      crc32: 0xffffffff,
    };
    const bytes = encodeXferAck(ack);
    expect(Buffer.from(bytes).equals(Buffer.from(encode(ACK)))).toBe(true);
    expect(decodeXferAck(bytes, 16)).toEqual(ack);
    const nack = nackAck("h2", XferStatus.NACK_NOT_READY);
    expect(decodeXferAck(encodeXferAck(nack), 16)).toEqual(nack);
    // a NACK with only mm_hash and status decodes (the rest are empty)
    expect(decodeXferAck(encode({ mm_hash: "h3", status: 1 }), 16)).toEqual(
      nackAck("h3", XferStatus.NACK_MISSING),
    );
  });

  const cases: [string, unknown, RegExp][] = [
    ["missing status", { ...ACK, status: undefined }, /missing status/],
    ["unknown status", { ...ACK, status: 9 }, /unknown status 9/],
    ["boolean status", { ...ACK, status: false }, /status is not an integer/],
    ["OK without crc32", { ...ACK, crc32: undefined }, /missing crc32/],
    ["OK without agent_metadata", { ...ACK, agent_metadata: undefined }, /missing agent_metadata/],
    ["agent_metadata as string", { ...ACK, agent_metadata: "x" }, /agent_metadata is not binary/],
    ["negative block index", { ...ACK, src_block_indices: [1, -1] }, /src_block_indices\[1\]/],
    ["float block index", { ...ACK, src_block_indices: [1.5] }, /src_block_indices\[0\]/],
    ["boolean block index", { ...ACK, src_block_indices: [true] }, /src_block_indices\[0\]/],
    ["block list not an array", { ...ACK, src_block_indices: 3 }, /not an array/],
    [
      "too many block indices",
      { ...ACK, src_block_indices: Array.from({ length: 17 }, (_, i) => i) },
      /exceed the cache's 16/,
    ],
    ["negative nbytes", { ...ACK, nbytes: -1 }, /nbytes -1 outside/],
    ["crc32 above 32 bits", { ...ACK, crc32: 2 ** 32 }, /crc32 .* outside/],
    ["NACK with a wrongly typed extra", { mm_hash: "h", status: 1, nbytes: "x" }, /nbytes is not an integer/],
  ];
  for (const [name, value, re] of cases) {
    it(`rejects ${name}`, () => {
      const v = Object.fromEntries(Object.entries(value as object).filter(([, x]) => x !== undefined));
      expect(malformed(() => decodeXferAck(encode(v), 16))).toMatch(re);
    });
  }

  it("rejects every truncation", () => {
    const bytes = encode(ACK);
    for (let n = 0; n < bytes.length; n++) malformed(() => decodeXferAck(bytes.subarray(0, n), 16));
  });

  it("round-trips arbitrary valid acks (property)", () => {
    const arb = fc.record({
      mmHash: fc.string({ maxLength: 64 }),
      status: fc.constantFrom(0, 1, 2, 3, 4, 5) as fc.Arbitrary<XferAck["status"]>,
      sessionId: fc.string({ maxLength: 64 }),
      srcBlockIndices: fc.array(fc.nat({ max: 2 ** 31 }), { maxLength: 64 }),
      agentMetadata: fc.uint8Array({ maxLength: 64 }),
      memDescriptor: fc.uint8Array({ maxLength: 64 }),
      nbytes: fc.nat(),
      crc32: fc.nat({ max: 0xffffffff }),
    });
    fc.assert(
      fc.property(arb, (ack) => {
        expect(decodeXferAck(encodeXferAck(ack), 64)).toEqual(ack);
      }),
    );
  });

  it("throws only EC_MALFORMED on random and mutated bytes, and keeps working (fuzz)", () => {
    const good = encode(ACK);
    fc.assert(
      fc.property(
        fc.oneof(
          fc.uint8Array({ maxLength: 128 }),
          fc.tuple(fc.nat({ max: good.length - 1 }), fc.integer({ min: 0, max: 255 })).map(([i, b]) => {
            const m = Uint8Array.from(good);
            m[i] = b;
            return m;
          }),
        ),
        (bytes) => {
          for (const f of [() => decodeXferAck(bytes, 16), () => decodeXferReq(bytes)]) {
            try {
              f();
            } catch (err) {
              expect(err).toBeInstanceOf(EcError);
              expect((err as EcError).code).toBe("EC_MALFORMED");
            }
          }
          expect(decodeXferAck(good, 16).nbytes).toBe(100);
        },
      ),
      { numRuns: 1000 },
    );
  });
});

describe("XferReq codec properties", () => {
  it("round-trips arbitrary requests within the limits (property)", () => {
    const s = fc.string({ maxLength: 64 });
    fc.assert(
      fc.property(
        s,
        s,
        s,
        fc.integer({ min: -(2 ** 40), max: 2 ** 40 }),
        (mmHash, compat, sessionId, connectorVersion) => {
          const req = { mmHash, compatibilityHash: compat, sessionId, connectorVersion };
          expect(decodeXferReq(encodeXferReq(req))).toEqual(req);
        },
      ),
    );
  });
});

describe("agent metadata and memory descriptor codecs (EC-CONTRACT 5.3)", () => {
  it("round-trip (property) and reject garbage, truncation, wrong types and oversize strings", async () => {
    const { decodeAgentMetadata, decodeMemDescriptor, encodeAgentMetadata, encodeMemDescriptor } =
      await import("../src/index.js");
    fc.assert(
      fc.property(
        fc.record({
          name: fc.string({ maxLength: 64 }),
          instance: fc.stringMatching(/^[0-9a-f]{0,16}$/),
          endpoint: fc.string({ maxLength: 200 }),
        }),
        fc.integer({ min: 1, max: 2 ** 30 }),
        fc.integer({ min: 1, max: 2 ** 30 }),
        (meta, numBlocks, blockBytes) => {
          expect(decodeAgentMetadata(encodeAgentMetadata(meta))).toEqual(meta);
          expect(decodeMemDescriptor(encodeMemDescriptor({ numBlocks, blockBytes }))).toEqual({
            numBlocks,
            blockBytes,
          });
        },
      ),
    );
    const good = encodeAgentMetadata({ name: "a", instance: "0123", endpoint: "tcp://127.0.0.1:1" });
    for (let n = 0; n < good.length; n++) malformed(() => decodeAgentMetadata(good.subarray(0, n)));
    malformed(() => decodeAgentMetadata(encode({ name: "a", instance: 1, endpoint: "x" })));
    malformed(() => decodeAgentMetadata(encode({ name: "a".repeat(257), instance: "1", endpoint: "x" })));
    malformed(() => decodeAgentMetadata(encode({ name: "a", instance: "1", endpoint: "x".repeat(1025) })));
    malformed(() => decodeMemDescriptor(encode({ num_blocks: 0, block_bytes: 4 })));
    malformed(() => decodeMemDescriptor(encode({ num_blocks: true, block_bytes: 4 })));
    malformed(() => decodeMemDescriptor(new Uint8Array([0xc1])));
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 64 }), (bytes) => {
        for (const f of [() => decodeAgentMetadata(bytes), () => decodeMemDescriptor(bytes)]) {
          try {
            f();
          } catch (err) {
            expect((err as EcError).code).toBe("EC_MALFORMED");
          }
        }
      }),
    );
  });
});
