// CONTRACT 4 and 7.3 read before a message is whole: peekHeader, headerReadable,
// peekRequestHeader, peekStepPrefix (what a worker's placement and oversize hooks call).
import { describe, expect, test } from "vitest";
import {
  APP_HEADER_SIZE,
  decodeHeader,
  frame,
  HeaderOffset,
  headerReadable,
  MAGIC_U32,
  Op,
  peekHeader,
  peekRequestHeader,
  peekStepPrefix,
  StepPrefixOffset,
  VERSION,
} from "../src/index.js";

function msg(): Uint8Array {
  return frame({ op: Op.STEP, seq: 0x01020304, session: 0xa0b0c0d0 }, new Uint8Array(40));
}

describe("header peeks (CONTRACT 4)", () => {
  test("named offsets are the CONTRACT 4 table", () => {
    expect(HeaderOffset).toEqual({
      MAGIC: 0,
      VERSION: 4,
      OP: 6,
      STATUS: 7,
      SEQ: 8,
      SESSION: 12,
      BODY_LEN: 16,
      RESERVED: 20,
    });
    expect(StepPrefixOffset).toEqual({ STEP_ID: 0, STEP_FLAGS: 4, N_REQ: 8, N_ROWS: 12 });
  });

  test("peekHeader reads every field unchecked; null below 24 bytes", () => {
    const m = msg();
    m[HeaderOffset.VERSION] = 9;
    m[HeaderOffset.RESERVED] = 1;
    m[HeaderOffset.STATUS] = 3;
    expect(peekHeader(m)).toEqual({
      magic: MAGIC_U32,
      version: 9,
      op: Op.STEP,
      status: 3,
      seq: 0x01020304,
      session: 0xa0b0c0d0,
      bodyLen: 40,
      reserved: 1,
    });
    expect(peekHeader(m.subarray(0, 23))).toBeNull();
    expect(peekHeader(m.subarray(0, 24))?.bodyLen).toBe(40);
  });

  test("headerReadable: length, magic and body_len, nothing else", () => {
    const m = msg();
    expect(headerReadable(m)).toBe(true);
    expect(headerReadable(m, m.length - 1)).toBe(false);
    expect(headerReadable(m.subarray(0, 23))).toBe(false);
    const v = m.slice();
    v[HeaderOffset.VERSION] = 2; // readable, though decodeHeader refuses it
    expect(headerReadable(v)).toBe(true);
    const bad = m.slice();
    bad[0] = 0x45;
    expect(headerReadable(bad)).toBe(false);
  });

  test("peekRequestHeader on the first 24 bytes agrees with decodeHeader on the whole message", () => {
    const m = msg();
    const whole = decodeHeader(m, m.length, { request: true });
    expect(peekRequestHeader(m.subarray(0, APP_HEADER_SIZE), m.length)).toEqual(whole);
    expect(peekRequestHeader(m.subarray(0, 20), m.length)).toBeNull();
    expect(peekRequestHeader(m.subarray(0, 24), m.length + 1)).toBeNull();
    for (const [off, val] of [
      [HeaderOffset.MAGIC, 0],
      [HeaderOffset.VERSION, VERSION + 1],
      [HeaderOffset.STATUS, 1],
      [HeaderOffset.RESERVED, 1],
    ] as const) {
      const c = m.slice();
      c[off] = val;
      expect(() => decodeHeader(c, c.length, { request: true })).toThrow();
      expect(peekRequestHeader(c.subarray(0, 24), c.length), `byte ${off}`).toBeNull();
    }
  });

  test("peekStepPrefix reads the 16-byte STEP prefix; null when shorter", () => {
    const b = new Uint8Array(16);
    const dv = new DataView(b.buffer);
    dv.setUint32(StepPrefixOffset.STEP_ID, 7, true);
    dv.setUint32(StepPrefixOffset.STEP_FLAGS, 1, true);
    dv.setUint32(StepPrefixOffset.N_REQ, 0xffffffff, true);
    dv.setUint32(StepPrefixOffset.N_ROWS, 3, true);
    expect(peekStepPrefix(b)).toEqual({ stepId: 7, stepFlags: 1, nReq: 0xffffffff, nRows: 3 });
    expect(peekStepPrefix(b.subarray(0, 15))).toBeNull();
  });
});
