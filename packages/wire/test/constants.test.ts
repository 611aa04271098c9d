// The tables, sizes and serial-number helpers of CONTRACT 2, 4, 5, 6.1, 7.2, 7.3, 7.4, 8 written
// out independently of src/constants.ts, so a changed code or name is caught.
import fc from "fast-check";
import { describe, expect, test } from "vitest";
import {
  APP_HEADER_SIZE,
  CAPABILITY_NAMES,
  Capability,
  DYADIC_ONE,
  ENTRY_FLAG_NAMES,
  ENTRY_FLAGS_MASK,
  EntryFlag,
  FATAL_FRAME_STATUS,
  FRAME_STATUS_NAMES,
  FrameStatus,
  flagNames,
  frameStatusName,
  HELLO_BODY_SIZE,
  HELLO_FLAG_NAMES,
  HELLO_FLAGS_MASK,
  HELLO_REPLY_BODY_SIZE,
  HelloFlag,
  MAGIC,
  MAGIC_U32,
  MAX_NUM_SPEC,
  MAX_WINDOW,
  OP_NAMES,
  Op,
  opName,
  REPLY_FLAG_NAMES,
  REQ_ENTRY_SIZE,
  REQ_STATUS_NAMES,
  ReplyFlag,
  ReqStatus,
  RowDtype,
  reqStatusName,
  SAMPLE_META_SIZE,
  SAMPLE_MODE_NAMES,
  SampleMode,
  serialAdd,
  serialNewer,
  TOP_K_MAX,
  USABLE_REQ_STATUS,
  VERSION,
} from "../src/index.js";

describe("tables (CONTRACT 4, 5, 6.1, 7.2, 7.3, 7.4)", () => {
  test("ops (CONTRACT 4)", () => {
    expect(Op).toEqual({ HELLO: 1, STEP: 2, PING: 3, STATS: 4, RESET: 5 });
    expect(OP_NAMES[2]).toBe("STEP");
    expect(opName(5)).toBe("RESET");
    expect(opName(9)).toBe("OP_9");
  });

  test("frame statuses and the fatal set (CONTRACT 5)", () => {
    const want = [
      "OK",
      "NO_SESSION",
      "STALE_SEQ",
      "BAD_FRAME",
      "BAD_VERSION",
      "IDENTITY_MISMATCH",
      "CONFIG_MISMATCH",
      "UNKNOWN_OP",
      "UNAUTHORIZED",
      "TOO_LARGE",
      "BUSY",
      "INTERNAL",
    ];
    want.forEach((name, code) => {
      expect(FrameStatus[name as keyof typeof FrameStatus]).toBe(code);
      expect(FRAME_STATUS_NAMES[code]).toBe(name);
      expect(frameStatusName(code)).toBe(name);
    });
    expect(Object.keys(FrameStatus)).toHaveLength(want.length);
    expect(frameStatusName(12)).toBe("STATUS_12");
    expect([...FATAL_FRAME_STATUS].sort((a, b) => a - b)).toEqual([3, 4, 5, 6, 7, 8, 9]);
    for (const s of [0, 1, 2, 10, 11]) expect(FATAL_FRAME_STATUS.has(s)).toBe(false);
  });

  test("request statuses and the usable set (CONTRACT 7.2)", () => {
    expect(ReqStatus).toEqual({
      OK: 0,
      PARTIAL_WINDOW: 1,
      NEED_RESYNC: 2,
      STALE_GENERATION: 3,
      SKIPPED: 4,
      DRAFT_FAILED: 5,
    });
    expect(REQ_STATUS_NAMES[3]).toBe("STALE_GENERATION");
    expect(reqStatusName(6)).toBe("REQ_STATUS_6");
    expect([...USABLE_REQ_STATUS].sort()).toEqual([0, 1]);
  });

  test("flag and capability bits with their names (CONTRACT 6.1, 7.3, 7.4)", () => {
    expect(EntryFlag).toEqual({ NEED_DRAFT: 1, RESYNC: 2, RELEASE: 4 });
    expect(ENTRY_FLAGS_MASK).toBe(7);
    expect(ENTRY_FLAG_NAMES[4]).toBe("RELEASE");
    expect(Capability).toEqual({ TAPS_BF16: 1, TOP32: 2, MARGIN: 4, SHARED: 8 }); // SHARED: CONTRACT 12.1 (1.2)
    expect(CAPABILITY_NAMES[2]).toBe("TOP32");
    expect(HelloFlag).toEqual({ WANT_MARGIN: 1 });
    expect(HELLO_FLAGS_MASK).toBe(1);
    expect(HELLO_FLAG_NAMES[1]).toBe("WANT_MARGIN");
    expect(ReplyFlag).toEqual({ MARGIN: 1, SAMPLED: 2 });
    expect(REPLY_FLAG_NAMES[2]).toBe("SAMPLED");
    expect(SampleMode).toEqual({ GREEDY: 0, TOP32: 1 });
    expect(SAMPLE_MODE_NAMES[1]).toBe("TOP32");
    expect(RowDtype).toEqual({ BF16: 1 });
  });

  test("flagNames lists set bits lowest first and names unknown ones", () => {
    expect(flagNames(ENTRY_FLAG_NAMES, 0)).toEqual([]);
    expect(flagNames(ENTRY_FLAG_NAMES, 3)).toEqual(["NEED_DRAFT", "RESYNC"]);
    expect(flagNames(CAPABILITY_NAMES, 7)).toEqual(["TAPS_BF16", "TOP32", "MARGIN"]);
    expect(flagNames(ENTRY_FLAG_NAMES, 0x8004)).toEqual(["RELEASE", "BIT_15"]);
    expect(flagNames(HELLO_FLAG_NAMES, 0x80000001)).toEqual(["WANT_MARGIN", "BIT_31"]);
    expect(flagNames(HELLO_FLAG_NAMES, 0x80000001 & ~HELLO_FLAGS_MASK)).toEqual(["BIT_31"]);
  });

  test("sizes (CONTRACT 4, 6.1, 7.3, 8)", () => {
    expect(APP_HEADER_SIZE).toBe(24);
    expect(HELLO_BODY_SIZE).toBe(160);
    expect(HELLO_REPLY_BODY_SIZE).toBe(128);
    expect(REQ_ENTRY_SIZE).toBe(32);
    expect(SAMPLE_META_SIZE).toBe(8);
    expect(TOP_K_MAX).toBe(32);
    expect(DYADIC_ONE).toBe(16_777_216);
    expect(MAX_WINDOW).toBe(4096);
    expect(MAX_NUM_SPEC).toBe(32);
    expect(VERSION).toBe(1);
    expect(new TextDecoder().decode(MAGIC)).toBe("DSPK");
    expect(new DataView(MAGIC.buffer).getUint32(0, true)).toBe(MAGIC_U32);
  });
});

describe("u32 serial numbers (CONTRACT 2, RFC 1982)", () => {
  const table: [number, number, boolean][] = [
    [1, 0, true],
    [0, 0, false],
    [0, 1, false],
    [0, 0xffffffff, true], // across the wrap
    [5, 0xfffffffe, true],
    [0xffffffff, 0, false],
    [0x7fffffff, 0, true], // 2^31 - 1 ahead
    [0x80000000, 0, false], // exactly 2^31 ahead: not newer either way
    [0, 0x80000000, false],
    [0x80000001, 0, false], // more than half way round: older
  ];
  for (const [a, b, want] of table) {
    test(`newer(${a}, ${b}) is ${want}`, () => expect(serialNewer(a, b)).toBe(want));
  }

  test("serialAdd wraps both ways", () => {
    expect(serialAdd(0xffffffff, 1)).toBe(0);
    expect(serialAdd(0, -1)).toBe(0xffffffff);
    expect(serialAdd(0xfffffff0, 0x20)).toBe(0x10);
    expect(serialAdd(7, 0)).toBe(7);
  });

  test("property: a + d is newer than a exactly for d in [1, 2^31), and then a is not newer", () => {
    fc.assert(
      fc.property(fc.nat({ max: 0xffffffff }), fc.nat({ max: 0xffffffff }), (a, d) => {
        const b = serialAdd(a, d);
        const newer = d >= 1 && d < 0x80000000;
        expect(serialNewer(b, a)).toBe(newer);
        if (newer) expect(serialNewer(a, b)).toBe(false);
      }),
    );
  });
});
