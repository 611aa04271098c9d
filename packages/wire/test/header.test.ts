// CONTRACT 4: the application header; frame splitting over a stream.
import { describe, expect, test } from "vitest";
import {
  APP_HEADER_SIZE,
  decodeHeader,
  encodeHeader,
  FrameAccumulator,
  FrameStatus,
  frame,
  fromHex,
  MAGIC,
  Op,
  partialHeader,
  splitFrame,
  WireError,
} from "../src/index.js";
import { expectWireError, loadCases } from "./helpers.js";

const ping = (body: Uint8Array, seq = 7, session = 0x01020304) => frame({ op: Op.PING, seq, session }, body);

describe("encodeHeader / decodeHeader (CONTRACT 4)", () => {
  test("layout: magic, version, op, status, seq, session, body_len, reserved, little-endian", () => {
    const buf = new Uint8Array(30).fill(0xee);
    encodeHeader(buf, 3, { op: 2, status: 9, seq: 0x11223344, session: 0xaabbccdd, bodyLen: 0x01020304 });
    expect(Array.from(buf.subarray(0, 3))).toEqual([0xee, 0xee, 0xee]);
    expect(Array.from(buf.subarray(3, 27))).toEqual([
      0x44, 0x53, 0x50, 0x4b, 1, 0, 2, 9, 0x44, 0x33, 0x22, 0x11, 0xdd, 0xcc, 0xbb, 0xaa, 4, 3, 2, 1, 0, 0, 0,
      0,
    ]);
    expect(buf[27]).toBe(0xee);
    expect(Array.from(buf.subarray(3, 7))).toEqual(Array.from(MAGIC));
  });
  test("round trip with extreme field values", () => {
    for (const h of [
      { op: 0, status: 0, seq: 0, session: 0, bodyLen: 0 },
      { op: 255, status: 255, seq: 0xffffffff, session: 0xffffffff, bodyLen: 5 },
    ]) {
      const msg = new Uint8Array(24 + h.bodyLen);
      encodeHeader(msg, 0, h);
      expect(decodeHeader(msg)).toEqual(h);
    }
  });
  test("encodeHeader refuses out-of-range fields and a short buffer, naming the field", () => {
    const b = new Uint8Array(24);
    const ok = { op: 1, status: 0, seq: 1, session: 1, bodyLen: 0 };
    expectWireError(() => encodeHeader(b, 0, { ...ok, op: 256 }), "WIRE_BAD_ARGUMENT", "op");
    expectWireError(() => encodeHeader(b, 0, { ...ok, status: -1 }), "WIRE_BAD_ARGUMENT", "status");
    expectWireError(() => encodeHeader(b, 0, { ...ok, seq: 2 ** 32 }), "WIRE_BAD_ARGUMENT", "seq");
    expectWireError(() => encodeHeader(b, 0, { ...ok, session: 1.5 }), "WIRE_BAD_ARGUMENT", "session");
    expectWireError(() => encodeHeader(b, 0, { ...ok, bodyLen: -1 }), "WIRE_BAD_ARGUMENT", "bodyLen");
    expectWireError(() => encodeHeader(b, 1, ok), "WIRE_BAD_ARGUMENT", "does not fit");
  });

  test("every failure is told apart", () => {
    const good = ping(Uint8Array.of(1, 2, 3));
    const mut = (f: (m: Uint8Array) => void) => {
      const m = good.slice();
      f(m);
      return m;
    };
    expectWireError(
      () => decodeHeader(good.subarray(0, 23)),
      "WIRE_BAD_FRAME",
      "shorter than the 24-byte header",
    );
    expectWireError(() => decodeHeader(mut((m) => (m[3] = 0x4c))), "WIRE_BAD_FRAME", "bad magic");
    const v = expectWireError(() => decodeHeader(mut((m) => (m[4] = 2))), "WIRE_BAD_VERSION", "version 2");
    expect(v.status).toBe(FrameStatus.BAD_VERSION);
    expectWireError(() => decodeHeader(mut((m) => (m[5] = 1))), "WIRE_BAD_VERSION", "version 257");
    expectWireError(() => decodeHeader(mut((m) => (m[23] = 1))), "WIRE_BAD_FRAME", "reserved");
    expectWireError(() => decodeHeader(mut((m) => (m[16] = 4))), "WIRE_BAD_FRAME", "body_len 4");
    expectWireError(() => decodeHeader(mut((m) => (m[16] = 2))), "WIRE_BAD_FRAME", "body_len 2");
    expectWireError(() => decodeHeader(good, 26), "WIRE_BAD_FRAME", "body_len 3 does not match the 2");
    const st = mut((m) => (m[7] = 3));
    expect(decodeHeader(st).status).toBe(3); // a reply may carry any status
    const e = expectWireError(
      () => decodeHeader(st, undefined, { request: true }),
      "WIRE_BAD_FRAME",
      "request status",
    );
    expect(e.status).toBe(FrameStatus.BAD_FRAME);
    expectWireError(() => decodeHeader(good, 28), "WIRE_BAD_ARGUMENT", "length 28");
  });

  test("version is checked before reserved and length (a version-2 frame gets BAD_VERSION)", () => {
    const m = ping(Uint8Array.of(1));
    m[4] = 2;
    m[20] = 1;
    m[16] = 9;
    expectWireError(() => decodeHeader(m), "WIRE_BAD_VERSION");
  });

  test("a frame in a larger receive buffer: length selects the message", () => {
    const msg = ping(Uint8Array.of(9, 8));
    const big = new Uint8Array(100);
    big.set(msg);
    expect(decodeHeader(big, msg.length).bodyLen).toBe(2);
    const { body } = splitFrame(big, msg.length);
    expect(Array.from(body)).toEqual([9, 8]);
    expect(body.buffer).toBe(big.buffer); // a view, not a copy
    expectWireError(() => decodeHeader(big), "WIRE_BAD_FRAME", "body_len");
  });

  test("every truncated prefix of a valid frame is a typed BAD_FRAME", () => {
    for (const c of loadCases().filter((x) => x.valid)) {
      const msg = fromHex(c.hex);
      for (let n = 0; n < msg.length; n++) {
        const e = expectWireError(() => splitFrame(msg, n), "WIRE_BAD_FRAME");
        expect(e.status).toBe(FrameStatus.BAD_FRAME);
      }
      expect(splitFrame(msg).header.bodyLen).toBe(msg.length - 24);
    }
  });

  test("frame() defaults status 0 and an empty body", () => {
    const m = frame({ op: Op.STATS, seq: 1, session: 0 });
    expect(m.length).toBe(APP_HEADER_SIZE);
    expect(decodeHeader(m, undefined, { request: true })).toEqual({
      op: 4,
      status: 0,
      seq: 1,
      session: 0,
      bodyLen: 0,
    });
    expect(decodeHeader(frame({ op: 3, status: 9, seq: 1, session: 0 })).status).toBe(9);
  });
});

describe("partialHeader: the fields a BAD_FRAME answer echoes (CONTRACT 4)", () => {
  const msg = ping(new Uint8Array(0), 0x0a0b0c0d, 0x01020304);
  const table: [number, { op: number; seq: number; session: number }][] = [
    [0, { op: 0, seq: 0, session: 0 }],
    [6, { op: 0, seq: 0, session: 0 }],
    [7, { op: 3, seq: 0, session: 0 }],
    [11, { op: 3, seq: 0, session: 0 }],
    [12, { op: 3, seq: 0x0a0b0c0d, session: 0 }],
    [15, { op: 3, seq: 0x0a0b0c0d, session: 0 }],
    [16, { op: 3, seq: 0x0a0b0c0d, session: 0x01020304 }],
    [24, { op: 3, seq: 0x0a0b0c0d, session: 0x01020304 }],
  ];
  for (const [n, want] of table) {
    test(`${n} bytes`, () => {
      expect(partialHeader(msg.subarray(0, n))).toEqual(want);
      expect(partialHeader(msg, n)).toEqual(want);
    });
  }
  test("reads fields even behind a bad magic", () => {
    const m = msg.slice();
    m[0] = 0;
    expect(partialHeader(m).seq).toBe(0x0a0b0c0d);
  });
});

describe("FrameAccumulator: a stream of frames", () => {
  const frames = [
    ping(Uint8Array.of(1, 2, 3), 1),
    ping(new Uint8Array(0), 2),
    ping(new Uint8Array(300).fill(7), 3),
    ...loadCases()
      .filter((c) => c.valid)
      .map((c) => fromHex(c.hex)),
  ];
  const stream = new Uint8Array(frames.reduce((s, f) => s + f.length, 0));
  let o = 0;
  for (const f of frames) {
    stream.set(f, o);
    o += f.length;
  }
  const hexes = frames.map((f) => Buffer.from(f).toString("hex"));

  test("byte at a time", () => {
    const acc = new FrameAccumulator();
    const got: Uint8Array[] = [];
    for (let i = 0; i < stream.length; i++) got.push(...acc.push(stream.subarray(i, i + 1)));
    expect(got.map((f) => Buffer.from(f).toString("hex"))).toEqual(hexes);
    expect(acc.buffered).toBe(0);
  });
  test("split at every offset", () => {
    for (let cut = 0; cut <= stream.length; cut += 1) {
      const acc = new FrameAccumulator();
      const got = [...acc.push(stream.subarray(0, cut)), ...acc.push(stream.subarray(cut))];
      expect(got.length).toBe(frames.length);
      expect(Buffer.from(got[got.length - 1]!).toString("hex")).toBe(hexes[hexes.length - 1]);
    }
  });
  test("bad magic is refused as soon as the header is in, and the accumulator stays poisoned", () => {
    const acc = new FrameAccumulator();
    const bad = ping(Uint8Array.of(1));
    bad[0] = 0x45;
    expect(acc.push(bad.subarray(0, 23))).toEqual([]);
    expectWireError(() => acc.push(bad.subarray(23, 24)), "WIRE_BAD_FRAME", "magic");
    expectWireError(() => acc.push(ping(new Uint8Array(0))), "WIRE_BAD_FRAME", "magic");
  });
  test("oversize frames are refused before the body is buffered (CONTRACT 3, 11)", () => {
    const acc = new FrameAccumulator({ maxFrameBytes: 24 + 10 });
    expect(acc.push(ping(new Uint8Array(10))).length).toBe(1);
    const big = ping(new Uint8Array(11));
    const e = expectWireError(() => acc.push(big.subarray(0, 24)), "WIRE_TOO_LARGE", "35 bytes");
    expect(e.status).toBe(FrameStatus.TOO_LARGE);
  });
  test("a bad header is BAD_FRAME even when its body_len is above the limit", () => {
    const acc = new FrameAccumulator({ maxFrameBytes: 1024 });
    const junk = ping(new Uint8Array(0));
    junk[0] = 0x00; // magic broken
    new DataView(junk.buffer).setUint32(16, 0xffffffff, true); // and an absurd body_len
    expectWireError(() => acc.push(junk), "WIRE_BAD_FRAME", "magic");
  });
  test("request mode refuses a non-zero status byte", () => {
    const acc = new FrameAccumulator({ request: true });
    expectWireError(
      () => acc.push(frame({ op: 3, status: 1, seq: 1, session: 0 })),
      "WIRE_BAD_FRAME",
      "request status",
    );
  });
  test("bad version is told apart", () => {
    const m = ping(Uint8Array.of(1));
    m[4] = 9;
    expectWireError(() => new FrameAccumulator().push(m), "WIRE_BAD_VERSION");
  });
  test("options are validated", () => {
    expectWireError(() => new FrameAccumulator({ maxFrameBytes: 3 }), "WIRE_BAD_ARGUMENT", "maxFrameBytes");
  });
  test("garbage only ever raises WireError", () => {
    for (let seed = 1; seed < 200; seed++) {
      const acc = new FrameAccumulator({ maxFrameBytes: 4096 });
      let x = seed;
      const junk = new Uint8Array(200).map(() => {
        x = (x * 1103515245 + 12345) >>> 0;
        return x >>> 24;
      });
      try {
        acc.push(junk);
      } catch (e) {
        expect(e).toBeInstanceOf(WireError);
      }
    }
  });
});
