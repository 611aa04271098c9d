import { isDeepStrictEqual } from "node:util";
import { encode } from "@msgpack/msgpack";
import { describe, expect, it } from "vitest";
import { encodeAckHead, encodeFrame, LEN_BYTES } from "../src/data/frame.js";
import { decodeXferReqFrame, encodeXferReqFrame } from "../src/data/request-frame.js";
import type { XferAck, XferReq } from "../src/protocol.js";
import {
  decodeXferAck,
  decodeXferReq,
  encodeXferAck,
  encodeXferReq,
  genericEncodeXferAck,
  genericEncodeXferReq,
  strictDecodeXferAck,
  strictDecodeXferReq,
} from "../src/protocol.js";
import {
  fastDecodeXferAck,
  fastDecodeXferReq,
  fastEncodeXferAck,
  fastEncodeXferReq,
} from "../src/xfer-codec.js";

// Issue 23 item 1: the hand-written XferReq / XferAck codec (src/xfer-codec.ts) against the generic
// encoder and the strict decoder (EC-CONTRACT 3, 9.1). The fast decoders may only ever decline
// (null) or return exactly what the strict decoder returns; every error is the strict decoder's.

const SID = "3f2c1d2e-1111-2222-3333-444455556666";
const COMPAT = "ab".repeat(32);

const reqs: XferReq[] = [
  { mmHash: "h", compatibilityHash: COMPAT, sessionId: SID, connectorVersion: 2 },
  {
    mmHash: "emb-1048576",
    compatibilityHash: COMPAT,
    sessionId: SID,
    connectorVersion: 2,
    readAhead: true,
    ackAhead: true,
    xferId: 0,
    dataReq: true,
  },
  { mmHash: "x".repeat(31), compatibilityHash: "", sessionId: "s", connectorVersion: 127, xferId: 128 },
  { mmHash: "x".repeat(32), compatibilityHash: "c", sessionId: "s", connectorVersion: 255, xferId: 65_535 },
  { mmHash: "x".repeat(255), compatibilityHash: "c", sessionId: "s", connectorVersion: 256, xferId: 65_536 },
  {
    mmHash: "x".repeat(256),
    compatibilityHash: "c",
    sessionId: "s",
    connectorVersion: 2,
    xferId: 0xffff_ffff,
  },
  { mmHash: "é-ü-ß", compatibilityHash: "c", sessionId: "s", connectorVersion: 2 ** 40, ackAhead: true },
  { mmHash: "h", compatibilityHash: "c", sessionId: "s", connectorVersion: -1 },
];

const meta = Uint8Array.from({ length: 75 }, (_, i) => i);
const desc = Uint8Array.from({ length: 32 }, (_, i) => 255 - i);
const okAck = (blocks: number[], extra: Partial<XferAck> = {}): XferAck => ({
  mmHash: "emb",
  status: 0,
  sessionId: SID,
  srcBlockIndices: blocks,
  agentMetadata: meta,
  memDescriptor: desc,
  nbytes: blocks.length * 65_536,
  crc32: 0xdead_beef,
  ...extra,
});
const acks: XferAck[] = [
  okAck([1, 2, 3]),
  okAck(
    Array.from({ length: 16 }, (_, i) => i * 300),
    { readAhead: true, ackAhead: true, xferId: 77, dataReq: true },
  ),
  okAck(
    Array.from({ length: 1000 }, (_, i) => i * 70),
    { crc32: 0, nbytes: 2 ** 33 },
  ),
  okAck([], { agentMetadata: new Uint8Array(300), memDescriptor: new Uint8Array(70_000) }),
  {
    mmHash: "gone",
    status: 1,
    sessionId: "",
    srcBlockIndices: [],
    agentMetadata: new Uint8Array(0),
    memDescriptor: new Uint8Array(0),
    nbytes: 0,
    crc32: 0,
    xferId: 5,
  },
];

/** Valid messages made by hand (other key orders, optional keys missing or odd), for the decoders. */
const handMade: Uint8Array[] = [
  encode({ session_id: SID, connector_version: 2, mm_hash: "h", compatibility_hash: "c" }),
  encode({ mm_hash: "h", compatibility_hash: "c", session_id: "s", connector_version: 2, read_ahead: 2 }),
  encode({ mm_hash: "h", compatibility_hash: "c", session_id: "s", connector_version: 2, read_ahead: true }),
  encode({ mm_hash: "h", compatibility_hash: "c", session_id: "s", connector_version: 2, xfer_id: -1 }),
  encode({ mm_hash: "h", compatibility_hash: "c", session_id: "s", connector_version: 2, extra: [1] }),
  encode({ mm_hash: "h", compatibility_hash: "c", session_id: "s", connector_version: 2, op: "stats" }),
  encode({ mm_hash: "h", status: 2 }),
  encode({ mm_hash: "h", status: 9 }),
  encode({ mm_hash: "h", status: 0 }),
  encode({ mm_hash: "h", status: 1, session_id: 3 }),
  encode({ mm_hash: "h", status: 1, nbytes: 2, read_ahead: 1 }),
];

function outcome(f: () => unknown): { ok: unknown } | { err: string; code: unknown } {
  try {
    return { ok: f() };
  } catch (e) {
    return { err: (e as Error).message, code: (e as { code?: unknown }).code };
  }
}

/** Every truncation and every single-byte change of `b` (a few values per position). */
function* mutations(b: Uint8Array): Generator<Uint8Array> {
  for (let n = 0; n < b.length; n++) yield b.subarray(0, n);
  for (let i = 0; i < b.length; i++) {
    for (const v of [0x00, 0x01, 0x7f, 0x80, 0x8f, 0x90, 0xa0, 0xc0, 0xc4, 0xcc, 0xcf, 0xd9, 0xdc, 0xff]) {
      const m = Uint8Array.from(b);
      m[i] = v;
      yield m;
    }
    const m = Uint8Array.from(b);
    m[i] = m[i]! ^ 0x01;
    yield m;
  }
  const longer = new Uint8Array(b.length + 1);
  longer.set(b);
  yield longer;
}

describe("hand-written XferReq / XferAck codec (issue 23, EC-CONTRACT 3)", () => {
  it("encodes the same bytes as the generic MessagePack encoder", () => {
    for (const r of reqs) {
      expect(Buffer.from(encodeXferReq(r))).toEqual(Buffer.from(genericEncodeXferReq(r)));
      expect(encodeXferReq(r)).toBeInstanceOf(Uint8Array);
    }
    for (const a of acks) expect(Buffer.from(encodeXferAck(a))).toEqual(Buffer.from(genericEncodeXferAck(a)));
    // The fast encoder itself covered these (not the fallback): all but the negative version.
    expect(reqs.filter((r) => fastEncodeXferReq(r) === null)).toHaveLength(1);
    expect(acks.every((a) => fastEncodeXferAck(a) !== null)).toBe(true);
  });

  it("decodes what the strict decoder decodes, and the fast path takes the canonical messages", () => {
    for (const r of reqs) {
      const b = genericEncodeXferReq(r);
      expect(decodeXferReq(b)).toEqual(strictDecodeXferReq(b));
    }
    for (const a of acks) {
      const b = genericEncodeXferAck(a);
      expect(decodeXferAck(b, 2000)).toEqual(strictDecodeXferAck(b, 2000));
    }
    // The transfer's own messages go the fast way (else this feature is gone).
    expect(fastDecodeXferReq(encodeXferReq(reqs[1]!))).toEqual(strictDecodeXferReq(encodeXferReq(reqs[1]!)));
    expect(fastDecodeXferAck(encodeXferAck(acks[1]!), 1024)).toEqual(
      strictDecodeXferAck(encodeXferAck(acks[1]!), 1024),
    );
  });

  it("on hand-made and hostile inputs the fast path declines or agrees; errors are the strict decoder's", () => {
    const corpus: Uint8Array[] = [...handMade];
    for (const r of reqs.slice(0, 3)) corpus.push(...mutations(genericEncodeXferReq(r)));
    for (const a of [acks[0]!, acks[1]!, acks[4]!]) corpus.push(...mutations(genericEncodeXferAck(a)));
    let fastReq = 0;
    let fastAck = 0;
    let refused = 0;
    const bad: unknown[] = [];
    const same = (a: unknown, b: unknown, what: string, input: Uint8Array) => {
      if (!isDeepStrictEqual(a, b)) bad.push({ what, input: Buffer.from(input).toString("hex"), a, b });
    };
    for (const b of corpus) {
      const sr = outcome(() => strictDecodeXferReq(b));
      const fr = fastDecodeXferReq(b);
      if (fr !== null) {
        fastReq++;
        same(sr, { ok: fr }, "fast req", b);
      }
      same(
        outcome(() => decodeXferReq(b)),
        sr,
        "req",
        b,
      );
      for (const max of [1024, 2]) {
        const sa = outcome(() => strictDecodeXferAck(b, max));
        const fa = fastDecodeXferAck(b, max);
        if (fa !== null) {
          fastAck++;
          same(sa, { ok: fa }, "fast ack", b);
        }
        const got = outcome(() => decodeXferAck(b, max));
        same(got, sa, "ack", b);
        if ("err" in got) {
          refused++;
          if (got.code !== "EC_MALFORMED") bad.push({ what: "code", got });
        }
      }
    }
    expect(bad.slice(0, 3)).toEqual([]);
    // The corpus exercised both paths (valid mutations decode fast, hostile ones are refused).
    expect(fastReq).toBeGreaterThan(10);
    expect(fastAck).toBeGreaterThan(10);
    expect(refused).toBeGreaterThan(100);
  });

  it("declines an ack with more block indices than the cache (the strict decoder refuses it)", () => {
    const b = encodeXferAck(okAck([1, 2, 3, 4]));
    expect(fastDecodeXferAck(b, 3)).toBeNull();
    expect(() => decodeXferAck(b, 3)).toThrow(/exceed the cache's 3/);
  });

  it("declines duplicate keys, a non-ASCII string and trailing bytes (strict: refused or decoded)", () => {
    const dup = Uint8Array.from([...encode({ mm_hash: "h", status: 1 })]);
    dup[0] = 0x83; // three entries, the third a second mm_hash
    const withDup = new Uint8Array([...dup, 0xa7, ...Buffer.from("mm_hash"), 0xa1, 0x68]);
    expect(fastDecodeXferAck(withDup, 8)).toBeNull();
    expect(() => decodeXferAck(withDup, 8)).toThrow(/duplicate key mm_hash/);
    const nonAscii = encode({ mm_hash: "ħ", status: 1 });
    expect(fastDecodeXferAck(nonAscii, 8)).toBeNull();
    expect(decodeXferAck(nonAscii, 8).mmHash).toBe("ħ");
    const trailing = new Uint8Array([...encode({ mm_hash: "h", status: 1 }), 0]);
    expect(fastDecodeXferAck(trailing, 8)).toBeNull();
    expect(() => decodeXferAck(trailing, 8)).toThrow(/trailing/);
  });

  it("the ACK frame head plus the ack is the ACK frame (docs/ec-protocol.md 3.3, 3.5)", () => {
    const ack = encodeXferAck(acks[1]!);
    for (const final of [false, true]) {
      const whole = encodeFrame({ op: "ack", ack, ...(final ? { final: true } : {}) });
      expect(Buffer.concat([encodeAckHead(ack.length, final), ack])).toEqual(whole);
    }
    expect(() => encodeAckHead(0)).toThrow(/outside/);
    expect(() => encodeAckHead(64 * 1024 + 1)).toThrow(/outside/);
  });

  it("XFER_REQ labels: ASCII, other UTF-8 and not UTF-8 decode as before (3.5)", () => {
    const req = encodeXferReq(reqs[1]!);
    const body = (reader: string | Uint8Array, instance: string | Uint8Array) =>
      encodeXferReqFrame({ reader, instance, nbytes: 5, req }).subarray(LEN_BYTES);
    const a = decodeXferReqFrame(body("ec-consumer/00ff", "0123456789abcdef"));
    expect([a.reader, a.instance, a.nbytes]).toEqual(["ec-consumer/00ff", "0123456789abcdef", 5]);
    expect(Buffer.from(a.req)).toEqual(Buffer.from(req));
    const u = decodeXferReqFrame(body(Buffer.from("çø-消費者"), Buffer.from("ïd")));
    expect([u.reader, u.instance]).toEqual(["çø-消費者", "ïd"]);
    // Bytes given as bytes are sent as they are.
    expect(body(Buffer.from("r"), Buffer.from("i"))).toEqual(body("r", "i"));
    expect(() => decodeXferReqFrame(body(Uint8Array.of(0xff, 0x41), "i"))).toThrow(/reader is not UTF-8/);
    // An instance that is not UTF-8 decodes loosely (answered ERROR 1 by the server, not closed).
    expect(decodeXferReqFrame(body("r", Uint8Array.of(0xff))).instance).toBe("\ufffd");
  });
});
