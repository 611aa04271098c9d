// CONTRACT 7.4: STEP reply layout, worker-side encoder, client-side decoder.
import { describe, expect, test } from "vitest";
import {
  beginStepReply,
  decodeHeader,
  decodeStepReply,
  MAX_NUM_SPEC,
  peekStepReplyShape,
  type ReplyShape,
  setReplyWorkerUs,
  stepReplyBodySize,
  stepReplyLayout,
} from "../src/index.js";
import { alignedBuf, expectWireError, validReply } from "./helpers.js";

const shape = (over: Partial<ReplyShape> = {}): ReplyShape => ({
  nReq: 3,
  numSpec: 4,
  margin: true,
  sampled: false,
  ...over,
});

describe("layout (CONTRACT 7.4)", () => {
  test("sizes follow the table, every array 4-aligned", () => {
    const s = (nReq: number, numSpec: number, margin: boolean, sampled: boolean) =>
      stepReplyBodySize({ nReq, numSpec, margin, sampled });
    const pad4 = (x: number) => Math.ceil(x / 4) * 4;
    for (const n of [0, 1, 2, 3, 4, 5, 255, 256]) {
      for (const N of [1, 2, 3, 8, 32]) {
        const nn = n * N;
        expect(s(n, N, false, false)).toBe(16 + pad4(n) + pad4(2 * n) + 4 * n + 8 * nn);
        expect(s(n, N, true, false)).toBe(16 + pad4(n) + pad4(2 * n) + 4 * n + 12 * nn);
        expect(s(n, N, true, true)).toBe(16 + pad4(n) + pad4(2 * n) + 4 * n + 12 * nn + pad4(nn) + 256 * nn);
        const l = stepReplyLayout({ nReq: n, numSpec: N, margin: true, sampled: true });
        for (const off of [
          l.windowRows,
          l.generation,
          l.draftIds,
          l.confidence,
          l.margin,
          l.sampledMask,
          l.supportIds,
          l.proposalQ,
        ]) {
          expect(off % 4).toBe(0);
        }
      }
    }
    expect(stepReplyLayout(shape()).margin).toBeGreaterThan(0);
    expect(stepReplyLayout(shape({ margin: false })).margin).toBe(-1);
    expect(stepReplyLayout(shape()).sampledMask).toBe(-1);
  });
});

describe("beginStepReply / decodeStepReply", () => {
  test("worker writes through views; client reads the same values through views of the receive buffer", () => {
    const { buf, frameLength, body, ctx } = validReply(3, 4, { margin: true, sampled: true });
    setReplyWorkerUs(buf, 1234.4);
    const h = decodeHeader(buf, frameLength);
    expect(h).toEqual({ op: 2, status: 0, seq: 9, session: 77, bodyLen: frameLength - 24 });
    const r = decodeStepReply(body, { nReq: 3, numSpec: 4, margin: true, sampled: true });
    expect(r.stepId).toBe(5);
    expect(r.workerUs).toBe(1234);
    expect(r.replyFlags).toBe(3);
    expect(Array.from(r.generation)).toEqual(ctx.entries.map((e) => e.generation));
    expect(r.draftIds.buffer).toBe(buf.buffer); // views, not copies
    expect(r.proposalQ?.buffer).toBe(buf.buffer);
    expect(r.supportIds?.length).toBe(3 * 4 * 32);
    expect(r.sampledMask?.length).toBe(12);
    expect(r.margin?.[0]).toBe(1.25);
  });
  test("beginStepReply zero-fills a dirty buffer", () => {
    const buf = alignedBuf(4096).fill(0xff);
    const v = beginStepReply(buf, { seq: 1, session: 2, stepId: 3, ...shape() });
    expect(buf.subarray(24 + 16, v.frameLength).every((b) => b === 0)).toBe(true);
    expect(buf[v.frameLength]).toBe(0xff);
  });
  test("an unaligned body is copied to an aligned one and decodes the same", () => {
    const { body } = validReply(2, 3);
    const raw = new Uint8Array(body.length + 1);
    raw.set(body, 1);
    const un = raw.subarray(1);
    expect(un.byteOffset % 4).toBe(1);
    const r = decodeStepReply(un, { nReq: 2, numSpec: 3, margin: true, sampled: false });
    expect(Array.from(r.draftIds)).toEqual(
      Array.from(decodeStepReply(body, { nReq: 2, numSpec: 3, margin: true, sampled: false }).draftIds),
    );
    expect(r.draftIds.buffer).not.toBe(raw.buffer);
  });
  test("beginStepReply argument checks", () => {
    const buf = alignedBuf(1024);
    expectWireError(
      () => beginStepReply(buf.subarray(2), { seq: 1, session: 1, stepId: 1, ...shape() }),
      "WIRE_BAD_ARGUMENT",
      "4-aligned",
    );
    expectWireError(
      () => beginStepReply(buf.subarray(0, 100), { seq: 1, session: 1, stepId: 1, ...shape() }),
      "WIRE_BAD_ARGUMENT",
      "does not fit",
    );
    expectWireError(
      () => beginStepReply(buf, { seq: -1, session: 1, stepId: 1, ...shape() }),
      "WIRE_BAD_ARGUMENT",
      "seq",
    );
    expectWireError(
      () => beginStepReply(buf, { seq: 1, session: 1, stepId: 1, ...shape({ numSpec: 1e6 }) }),
      "WIRE_BAD_ARGUMENT",
      "numSpec",
    );
  });
  test("setReplyWorkerUs clamps", () => {
    const { buf, body } = validReply(1, 1);
    for (const [v, want] of [
      [-5, 0],
      [2 ** 40, 0xffffffff],
      [Number.NaN, 0],
      [7.6, 8],
    ] as const) {
      setReplyWorkerUs(buf, v);
      expect(peekStepReplyShape(body).nReq).toBe(1);
      expect(new DataView(buf.buffer).getUint32(24 + 12, true)).toBe(want);
    }
    expectWireError(() => setReplyWorkerUs(new Uint8Array(30), 1), "WIRE_BAD_ARGUMENT");
  });
});

describe("decodeStepReply: exact-size and echo checks of CONTRACT 7.4", () => {
  const { body } = validReply(3, 4, { margin: true });
  const ok = shape();
  const patched = (off: number, bytes: number[]) => {
    const b = alignedBuf(body.length);
    b.set(body);
    b.set(bytes, off);
    return b;
  };
  test("the valid reply decodes", () => {
    expect(decodeStepReply(body, ok).nReq).toBe(3);
  });
  const table: [string, () => Uint8Array, ReplyShape, string][] = [
    ["shorter than the prefix", () => body.subarray(0, 15), ok, "shorter than the 16-byte prefix"],
    ["n_req differs", () => body, shape({ nReq: 2 }), "n_req 3 != 2"],
    ["num_spec differs", () => body, shape({ numSpec: 5 }), "num_spec 4 != session num_spec 5"],
    ["MARGIN missing", () => patched(10, [0, 0]), ok, "lacks MARGIN"],
    ["MARGIN unasked", () => body, shape({ margin: false }), "MARGIN the session did not ask"],
    ["SAMPLED in a greedy session", () => patched(10, [3, 0]), ok, "SAMPLED (q) in a greedy session"],
    ["SAMPLED missing in TOP32", () => body, shape({ sampled: true }), "sampled ids without q"],
    ["unknown flag bit", () => patched(10, [5, 0]), ok, "unknown bits 0x4"],
    ["one byte short", () => body.subarray(0, body.length - 1), ok, "bytes, want"],
    [
      "one word long",
      () => {
        const b = alignedBuf(body.length + 4);
        b.set(body);
        return b;
      },
      ok,
      "bytes, want",
    ],
    ["status padding", () => patched(16 + 3, [1]), ok, "status padding"],
    ["window_rows padding", () => patched(16 + 4 + 6, [1]), ok, "window_rows padding"],
  ];
  for (const [name, make, expect_, text] of table) {
    test(name, () => {
      expectWireError(() => decodeStepReply(make(), expect_), "WIRE_BAD_REPLY", text);
    });
  }
  test("sampled_mask padding", () => {
    const v = validReply(1, 3, { sampled: true });
    const l = stepReplyLayout({ nReq: 1, numSpec: 3, margin: true, sampled: true });
    v.body[l.sampledMask + 3] = 1;
    expectWireError(
      () => decodeStepReply(v.body, { nReq: 1, numSpec: 3, margin: true, sampled: true }),
      "WIRE_BAD_REPLY",
      "sampled_mask padding",
    );
  });
  test("every truncation of a valid reply body is a typed BAD_REPLY", () => {
    const v = validReply(2, 2, { sampled: true });
    const s = { nReq: 2, numSpec: 2, margin: true, sampled: true };
    for (let n = 0; n < v.body.length; n++)
      expectWireError(() => decodeStepReply(v.body.subarray(0, n), s), "WIRE_BAD_REPLY");
  });
});

describe("decodeStepReply: boundaries", () => {
  test("n_req 0 and num_spec 1, 32 round-trip", () => {
    for (const [n, N] of [
      [0, 4],
      [1, 1],
      [1, MAX_NUM_SPEC],
      [256, 8],
    ] as const) {
      for (const sampled of [false, true]) {
        const v = validReply(n, N, { sampled });
        const r = decodeStepReply(v.body, { nReq: n, numSpec: N, margin: true, sampled });
        expect(r.draftIds.length).toBe(n * N);
        expect(Array.from(r.draftIds)).toEqual(Array.from(v.views.draftIds));
      }
    }
  });
  test("peekStepReplyShape reads the prefix", () => {
    const v = validReply(2, 3, { sampled: true });
    expect(peekStepReplyShape(v.body)).toEqual({ nReq: 2, numSpec: 3, margin: true, sampled: true });
    expectWireError(() => peekStepReplyShape(v.body.subarray(0, 15)), "WIRE_BAD_REPLY");
  });
});
