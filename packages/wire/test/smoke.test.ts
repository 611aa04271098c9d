import { expect, test } from "vitest";
import { APP_HEADER_SIZE, decodeHeader, FrameStatus, frame, Op, WireError } from "../src/index.js";

test("a PING frame round-trips through the header codec (CONTRACT 4)", () => {
  const msg = frame({ op: Op.PING, seq: 7, session: 0 }, Uint8Array.of(1, 2, 3));
  expect(msg.length).toBe(APP_HEADER_SIZE + 3);
  expect(decodeHeader(msg)).toEqual({ op: Op.PING, status: 0, seq: 7, session: 0, bodyLen: 3 });
  msg[4] = 2;
  expect(() => decodeHeader(msg)).toThrow(WireError);
  try {
    decodeHeader(msg);
  } catch (e) {
    expect((e as WireError).status).toBe(FrameStatus.BAD_VERSION);
  }
});
