// CONTRACT 7.2 (structural checks) and 7.3 (STEP request layout).
import { describe, expect, test } from "vitest";
import {
  APP_HEADER_SIZE,
  decodeHeader,
  decodeStepRequest,
  EntryFlag,
  FrameStatus,
  maxStepBodySize,
  type ReqEntry,
  rowsOffsetFor,
  type SampleMeta,
  type StepLimits,
  stepRequestBodySize,
  writeStepPrefix,
} from "../src/index.js";
import { entry, expectWireError } from "./helpers.js";

const ROW = 48;
const limits = (over: Partial<StepLimits> = {}): StepLimits => ({
  sampled: false,
  rowBytes: ROW,
  maxSlots: 8,
  maxRowsPerStep: 16,
  numSpec: 4,
  ...over,
});

/** Builds a STEP frame; returns the body (a view). Rows are filled with a pattern first. */
function build(
  entries: ReqEntry[],
  meta: SampleMeta[] | null = null,
  nRows?: number,
  rowBytes = ROW,
): Uint8Array {
  const rows = nRows ?? entries.reduce((s, e) => s + e.nRows, 0);
  const off = APP_HEADER_SIZE + rowsOffsetFor(entries.length, meta !== null);
  const buf = new Uint8Array(off + rows * rowBytes).fill(0xcd);
  for (let i = off; i < buf.length; i++) buf[i] = i & 0xff;
  const len = writeStepPrefix(buf, {
    seq: 3,
    session: 4,
    stepId: 99,
    entries,
    sampleMeta: meta,
    nRows: rows,
    rowBytes,
  });
  expect(len).toBe(buf.length);
  return buf.subarray(APP_HEADER_SIZE, len);
}

/** Patch a u32/u16 of the body at `off`. */
function patch32(body: Uint8Array, off: number, v: number): Uint8Array {
  const b = body.slice();
  new DataView(b.buffer).setUint32(off, v, true);
  return b;
}
function patch16(body: Uint8Array, off: number, v: number): Uint8Array {
  const b = body.slice();
  new DataView(b.buffer).setUint16(off, v, true);
  return b;
}

describe("rowsOffsetFor (CONTRACT 7.3)", () => {
  test("smallest offset after the entries with 24 + offset a multiple of 64", () => {
    for (const sampled of [false, true]) {
      for (let n = 0; n <= 300; n++) {
        const end = 16 + (sampled ? 8 * n : 0) + 32 * n;
        const off = rowsOffsetFor(n, sampled);
        expect((24 + off) % 64).toBe(0);
        expect(off).toBeGreaterThanOrEqual(end);
        expect(off - end).toBeLessThan(64);
      }
    }
    expect(rowsOffsetFor(0, false)).toBe(40);
    expect(rowsOffsetFor(1, false)).toBe(104);
    expect(rowsOffsetFor(3, false)).toBe(168);
    expect(rowsOffsetFor(4, true)).toBe(232);
    expect(stepRequestBodySize(3, 8, 48, false)).toBe(168 + 384);
    expect(maxStepBodySize(limits())).toBe(rowsOffsetFor(8, false) + 16 * ROW);
  });
});

describe("writeStepPrefix (CONTRACT 7.3)", () => {
  test("fills header, prefix, entries and padding in front of untouched rows", () => {
    const entries = [
      entry({ slot: 2, anchorPos: 12, rowStart: 10, nRows: 2, nOut: 3, flags: 3, generation: 0xfffffffe }),
    ];
    const off = APP_HEADER_SIZE + rowsOffsetFor(1, false);
    const buf = new Uint8Array(off + 2 * ROW).fill(0xcd);
    const n = writeStepPrefix(buf, { seq: 1, session: 2, stepId: 3, entries, nRows: 2, rowBytes: ROW });
    expect(n).toBe(buf.length);
    expect(decodeHeader(buf, n, { request: true })).toEqual({
      op: 2,
      status: 0,
      seq: 1,
      session: 2,
      bodyLen: n - 24,
    });
    expect(Array.from(buf.subarray(off))).toEqual(new Array(2 * ROW).fill(0xcd)); // rows untouched
    expect(Array.from(buf.subarray(24 + 16 + 32, off))).toEqual(new Array(off - 72).fill(0)); // padding zeroed
    const dv = new DataView(buf.buffer);
    expect(dv.getUint32(24, true)).toBe(3);
    expect(dv.getUint32(28, true)).toBe(0);
    expect(dv.getUint32(32, true)).toBe(1);
    expect(dv.getUint32(36, true)).toBe(2);
    expect(dv.getUint32(40 + 4, true)).toBe(0xfffffffe);
    expect(dv.getUint16(40 + 24, true)).toBe(3);
    expect(dv.getUint16(40 + 26, true)).toBe(3);
    expect(dv.getUint32(40 + 28, true)).toBe(0);
  });
  test.each([1, 2, 3, 4, 8])(
    "writes correctly into a subarray at byteOffset %i of a shared ArrayBuffer",
    (at) => {
      const entries = [
        entry({ slot: 1 }),
        entry({ slot: 6, generation: 0xabcdef01, nOut: 0xfffe, flags: 0x8001 & 0x7 }),
      ];
      const backing = new Uint8Array(4096).fill(0xee);
      const buf = backing.subarray(at, at + 24 + rowsOffsetFor(2, true) + 2 * ROW);
      const meta = [
        { seed: 1, topK: 2, tempMilli: 3 },
        { seed: 4, topK: 5, tempMilli: 6 },
      ];
      const n = writeStepPrefix(buf, {
        seq: 1,
        session: 2,
        stepId: 3,
        entries,
        sampleMeta: meta,
        nRows: 2,
        rowBytes: ROW,
      });
      expect(backing.subarray(0, at).every((b) => b === 0xee)).toBe(true);
      expect(backing[at + n]).toBe(0xee);
      const r = decodeStepRequest(buf.subarray(24, n), limits({ sampled: true, numSpec: 0xffff }));
      expect(r.entries).toEqual(entries);
      expect(r.sampleMeta).toEqual(meta);
      expect(r.stepId).toBe(3);
    },
  );
  test("nEntries writes a prefix of the entries array", () => {
    const entries = [entry({ slot: 0 }), entry({ slot: 1 }), entry({ slot: 2 })];
    const buf = new Uint8Array(1024);
    const n = writeStepPrefix(buf, {
      seq: 1,
      session: 2,
      stepId: 3,
      entries,
      nEntries: 2,
      nRows: 2,
      rowBytes: ROW,
    });
    expect(n).toBe(24 + rowsOffsetFor(2, false) + 2 * ROW);
    expect(decodeStepRequest(buf.subarray(24, n), limits()).entries.map((e) => e.slot)).toEqual([0, 1]);
  });
  test("sample meta sits between prefix and entries", () => {
    const body = build([entry({ slot: 1 })], [{ seed: 0xdeadbeef, topK: 32, tempMilli: 700 }]);
    const dv = new DataView(body.buffer, body.byteOffset);
    expect(dv.getUint32(16, true)).toBe(0xdeadbeef);
    expect(dv.getUint16(20, true)).toBe(32);
    expect(dv.getUint16(22, true)).toBe(700);
    expect(dv.getUint32(24, true)).toBe(1); // first entry's slot
  });
  test("argument checks", () => {
    const buf = new Uint8Array(4096);
    const p = { seq: 1, session: 2, stepId: 3, entries: [entry()], nRows: 1, rowBytes: ROW };
    expectWireError(
      () => writeStepPrefix(buf, { ...p, nRows: 2 }),
      "WIRE_BAD_ARGUMENT",
      "carry 1 rows, nRows is 2",
    );
    expectWireError(() => writeStepPrefix(buf, { ...p, nEntries: 2 }), "WIRE_BAD_ARGUMENT", "nEntries");
    expectWireError(() => writeStepPrefix(buf, { ...p, seq: -1 }), "WIRE_BAD_ARGUMENT", "seq");
    expectWireError(
      () => writeStepPrefix(buf, { ...p, entries: [entry({ nOut: 70000 })] }),
      "WIRE_BAD_ARGUMENT",
      "entry 0",
    );
    expectWireError(
      () => writeStepPrefix(buf, { ...p, entries: [entry({ slot: 2 ** 32 })] }),
      "WIRE_BAD_ARGUMENT",
    );
    expectWireError(() => writeStepPrefix(buf.subarray(0, 150), p), "WIRE_BAD_ARGUMENT", "does not fit");
    expectWireError(() => writeStepPrefix(buf, { ...p, sampleMeta: [] }), "WIRE_BAD_ARGUMENT", "sampleMeta");
    for (const topK of [0, 33]) {
      expectWireError(
        () => writeStepPrefix(buf, { ...p, sampleMeta: [{ seed: 1, topK, tempMilli: 0 }] }),
        "WIRE_BAD_ARGUMENT",
        "topK",
      );
    }
  });
});

describe("decodeStepRequest: round trip", () => {
  test("entries, sample meta and a zero-copy view of the rows", () => {
    const entries = [
      entry({
        slot: 3,
        anchorPos: 20,
        rowStart: 17,
        nRows: 3,
        nOut: 2,
        flags: EntryFlag.NEED_DRAFT | EntryFlag.RESYNC,
      }),
      entry({ slot: 1, anchorPos: 7, rowStart: 7, nRows: 0, nOut: 0, flags: EntryFlag.RELEASE }),
      entry({ slot: 0, anchorPos: 2, rowStart: 0, nRows: 2, nOut: 4, flags: 0 }),
    ];
    const meta = [
      { seed: 1, topK: 1, tempMilli: 0 },
      { seed: 2, topK: 32, tempMilli: 65535 },
      { seed: 3, topK: 5, tempMilli: 1000 },
    ];
    const body = build(entries, meta);
    const r = decodeStepRequest(body, limits({ sampled: true }));
    expect(r.entries).toEqual(entries);
    expect(r.sampleMeta).toEqual(meta);
    expect(r.stepId).toBe(99);
    expect(r.nRows).toBe(5);
    expect(r.rows.length).toBe(5 * ROW);
    expect(r.rows.buffer).toBe(body.buffer);
    expect(r.rows.byteOffset).toBe(body.byteOffset + r.rowsOffset);
    expect(r.rows[0]).toBe((24 + r.rowsOffset) & 0xff);
  });
});

describe("decodeStepRequest: every structural rule of CONTRACT 7.2", () => {
  const base = () => [
    entry({ slot: 0, anchorPos: 10, rowStart: 8, nRows: 2 }),
    entry({ slot: 5, anchorPos: 4, rowStart: 3, nRows: 1, nOut: 4 }),
  ];
  // 4 entries: the first count where greedy and TOP32 layouts differ in size (CONTRACT 7.3 padding)
  const four = () => [0, 1, 2, 3].map((slot) => entry({ slot }));
  const fourMeta = () => [0, 1, 2, 3].map((seed) => ({ seed, topK: 1, tempMilli: 1 }));
  const E0 = 16; // body offset of entry 0 (greedy)
  const E1 = E0 + 32;
  const rules: [string, () => Uint8Array, string, Partial<StepLimits>?][] = [
    ["step_flags != 0", () => patch32(build(base()), 4, 1), "step_flags"],
    ["slot >= max_slots", () => build([entry({ slot: 8 })]), "slot >= max_slots 8"],
    ["slot twice", () => build([entry({ slot: 2 }), entry({ slot: 2 })]), "slot appears twice"],
    ["n_out > N", () => build([entry({ nOut: 5 })]), "n_out 5 > num_spec 4"],
    ["unknown flag bit", () => build([entry({ flags: 9 })]), "unknown flag bits 0x8"],
    ["reserved != 0", () => patch32(build(base()), E1 + 28, 1), "entry 1 (slot 5): reserved"],
    ["RELEASE with NEED_DRAFT", () => build([entry({ flags: 5, nRows: 0 })]), "RELEASE must come alone"],
    ["RELEASE with RESYNC", () => build([entry({ flags: 6, nRows: 0 })]), "RELEASE must come alone"],
    ["RELEASE with rows", () => build([entry({ flags: 4 })]), "RELEASE must come alone"],
    [
      "rows not ending at anchor",
      () => build([entry({ rowStart: 8 })]),
      "row_start 8 + n_rows 1 != anchor_pos 10",
    ],
    [
      "sum(n_rows) != n_rows",
      () => patch32(patch32(build(base()), E0 + 20, 1), E0 + 16, 9),
      "carry 2 rows, n_rows is 3",
    ],
    ["n_rows not matching the body", () => patch32(build(base()), 12, 2), "bytes, want"],
    ["body one byte short", () => build(base()).subarray(0, -1), "bytes, want"],
    [
      "body one byte long",
      () => {
        const b = build(base());
        const c = new Uint8Array(b.length + 1);
        c.set(b);
        return c;
      },
      "bytes, want",
    ],
    ["shorter than the prefix", () => new Uint8Array(15), "shorter than the 16-byte prefix"],
    [
      "top_k 0 (TOP32)",
      () =>
        build([entry()], [{ seed: 0, topK: 1, tempMilli: 1 }])
          .slice()
          .fill(0, 20, 22),
      "top_k 0",
      { sampled: true },
    ],
    [
      "top_k 33 (TOP32)",
      () => patch16(build([entry()], [{ seed: 0, topK: 1, tempMilli: 1 }]), 20, 33),
      "top_k 33",
      { sampled: true },
    ],
    // With one entry the two layouts have the same size; the misread fields then fail.
    [
      "sample meta in a greedy session",
      () => build([entry()], [{ seed: 0, topK: 1, tempMilli: 1 }]),
      "entry 0",
    ],
    ["sample meta in a greedy session (size)", () => build(four(), fourMeta()), "bytes, want"],
    ["no sample meta in a TOP32 session", () => build([entry()]), "entry 0", { sampled: true }],
    ["no sample meta in a TOP32 session (size)", () => build(four()), "bytes, want", { sampled: true }],
  ];
  for (const [name, make, text, over] of rules) {
    test(name, () => {
      const e = expectWireError(() => decodeStepRequest(make(), limits(over)), "WIRE_BAD_FRAME", text);
      expect(e.status).toBe(FrameStatus.BAD_FRAME);
    });
  }
  test("a valid frame of the same shape passes (the rules above are what fails)", () => {
    expect(decodeStepRequest(build(base()), limits()).nReq).toBe(2);
  });
  test("RELEASE alone, rows without NEED_DRAFT, n_out == N, anchor_pos 0 without rows are fine", () => {
    const r = decodeStepRequest(
      build([
        entry({ slot: 0, flags: EntryFlag.RELEASE, nRows: 0 }),
        entry({ slot: 1, flags: 0, nOut: 4 }),
        entry({ slot: 2, anchorPos: 0, rowStart: 0, nRows: 0, flags: EntryFlag.NEED_DRAFT }),
      ]),
      limits(),
    );
    expect(r.entries.length).toBe(3);
  });
});

describe("decodeStepRequest: boundaries (0, 1, max, max+1)", () => {
  const lim = limits({ maxSlots: 4, maxRowsPerStep: 6 });
  const many = (n: number, rowsEach: number) =>
    Array.from({ length: n }, (_, i) =>
      entry({ slot: i, anchorPos: 100, rowStart: 100 - rowsEach, nRows: rowsEach }),
    );
  test("n_req 0, 1, max pass; max+1 is BAD_FRAME (or TOO_LARGE when the body exceeds the maximum)", () => {
    for (const n of [0, 1, 4]) expect(decodeStepRequest(build(many(n, 1)), lim).nReq).toBe(n);
    // 5 entries with no rows fit under the body maximum (4 slots + 6 rows), so n_req is what fails
    expectWireError(
      () => decodeStepRequest(build(many(5, 0)), lim),
      "WIRE_BAD_FRAME",
      "n_req 5 > max_slots 4",
    );
  });
  test("n_rows 0, 1, max pass; max+1 is BAD_FRAME", () => {
    for (const rows of [0, 1, 6]) {
      expect(
        decodeStepRequest(build([entry({ anchorPos: 50, rowStart: 50 - rows, nRows: rows })]), lim).nRows,
      ).toBe(rows);
    }
    expectWireError(
      () => decodeStepRequest(build([entry({ anchorPos: 50, rowStart: 43, nRows: 7 })]), lim),
      "WIRE_BAD_FRAME",
      "n_rows 7 > max_rows_per_step 6",
    );
  });
  test("body at the maximum passes; one byte above is TOO_LARGE before anything else", () => {
    const max = maxStepBodySize(lim);
    const e = expectWireError(
      () => decodeStepRequest(new Uint8Array(max + 1), lim),
      "WIRE_TOO_LARGE",
      `${max + 1} bytes`,
    );
    expect(e.status).toBe(FrameStatus.TOO_LARGE);
    // the largest well-formed body: 4 entries carrying 6 rows in total is below max; max itself is BAD_FRAME (wrong shape)
    expectWireError(() => decodeStepRequest(new Uint8Array(max), lim), "WIRE_BAD_FRAME");
    const full = build([
      entry({ slot: 0, anchorPos: 9, rowStart: 6, nRows: 3 }),
      entry({ slot: 1, anchorPos: 9, rowStart: 6, nRows: 3 }),
      entry({ slot: 2, anchorPos: 9, rowStart: 9, nRows: 0 }),
      entry({ slot: 3, anchorPos: 9, rowStart: 9, nRows: 0 }),
    ]);
    expect(full.length).toBe(max);
    expect(decodeStepRequest(full, lim).nRows).toBe(6);
  });
  test("top_k 1 and 32 pass (TOP32)", () => {
    for (const topK of [1, 32]) {
      const r = decodeStepRequest(
        build([entry()], [{ seed: 0, topK, tempMilli: 0 }]),
        limits({ sampled: true }),
      );
      expect(r.sampleMeta?.[0]?.topK).toBe(topK);
    }
  });
  test("n_out 0, 1, N pass; N+1 fails", () => {
    for (const nOut of [0, 1, 4])
      expect(decodeStepRequest(build([entry({ nOut })]), limits()).entries[0]?.nOut).toBe(nOut);
    expectWireError(
      () => decodeStepRequest(build([entry({ nOut: 5 })]), limits()),
      "WIRE_BAD_FRAME",
      "n_out 5",
    );
  });
  test("row_start + n_rows is exact arithmetic (no u32 wrap)", () => {
    const body = build([entry({ anchorPos: 1, rowStart: 0, nRows: 1 })]);
    const wrapped = patch32(body, 16 + 16, 0xffffffff); // row_start 2^32-1: (2^32-1)+1 wraps to 0 != 1, and to 2^32 in exact math
    const lo = patch32(wrapped, 16 + 8, 0); // anchor_pos 0 == (2^32-1 + 1) mod 2^32
    expectWireError(() => decodeStepRequest(lo, limits()), "WIRE_BAD_FRAME", "row_start 4294967295");
  });
});
