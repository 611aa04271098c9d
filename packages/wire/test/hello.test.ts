// CONTRACT 6.1: HELLO, HelloReply, auth, client checks.
import { describe, expect, test } from "vitest";
import {
  Capability,
  checkHelloConfig,
  checkHelloReply,
  decodeHello,
  decodeHelloReply,
  encodeHello,
  encodeHelloReply,
  HELLO_BODY_SIZE,
  HELLO_REPLY_BODY_SIZE,
  helloAuth,
  SampleMode,
  toHex,
  verifyHelloAuth,
} from "../src/index.js";
import { bytes, expectWireError, sampleHello, sampleHelloReply } from "./helpers.js";

describe("HELLO body (CONTRACT 6.1)", () => {
  test("encodes 160 bytes at the contract's offsets", () => {
    const h = sampleHello({ window: 0x0102, numSpec: 7, sampleMode: 1, hidden: 0x0a0b0c0d, helloFlags: 1 });
    const b = encodeHello(h);
    expect(b.length).toBe(HELLO_BODY_SIZE);
    expect(b[0]).toBe(0xaa);
    expect(b[32]).toBe(0xbb);
    expect([b[64], b[65]]).toEqual([2, 1]);
    expect(b[66]).toBe(7);
    expect(b[68]).toBe(1);
    expect(b[69]).toBe(1);
    expect(Array.from(b.subarray(72, 76))).toEqual([0x0d, 0x0c, 0x0b, 0x0a]);
    expect(b[92]).toBe(1);
    expect(Array.from(b.subarray(96, 128))).toEqual(new Array(32).fill(0));
    expect(new TextDecoder().decode(b.subarray(128, 133))).toBe("rank0");
    expect(Array.from(b.subarray(133))).toEqual(new Array(27).fill(0));
    expect(decodeHello(b)).toEqual(h);
  });
  test("writes into a caller's buffer at an offset", () => {
    const out = new Uint8Array(200).fill(0xff);
    const view = encodeHello(sampleHello(), out, 24);
    expect(view.byteOffset).toBe(24);
    expect(view.buffer).toBe(out.buffer);
    expect(out[23]).toBe(0xff);
    expect(out[24 + 160]).toBe(0xff);
    expectWireError(() => encodeHello(sampleHello(), out, 41), "WIRE_BAD_ARGUMENT", "does not fit");
  });
  test("empty auth encodes as zeros", () => {
    const b = encodeHello(sampleHello({ auth: new Uint8Array(0) }));
    expect(Array.from(b.subarray(96, 128))).toEqual(new Array(32).fill(0));
  });
  test("size other than 160 is BAD_FRAME", () => {
    for (const n of [0, 1, 159, 161]) {
      const e = expectWireError(() => decodeHello(new Uint8Array(n)), "WIRE_BAD_FRAME", `${n} bytes`);
      expect(e.status).toBe(3);
    }
  });
  test("argument checks name the field", () => {
    expectWireError(() => encodeHello(sampleHello({ window: 65536 })), "WIRE_BAD_ARGUMENT", "window");
    expectWireError(() => encodeHello(sampleHello({ sampleMode: 256 })), "WIRE_BAD_ARGUMENT", "sampleMode");
    expectWireError(() => encodeHello(sampleHello({ vocabSize: -1 })), "WIRE_BAD_ARGUMENT", "vocabSize");
    expectWireError(
      () => encodeHello(sampleHello({ drafterIdentity: bytes(31, 1) })),
      "WIRE_BAD_ARGUMENT",
      "drafterIdentity",
    );
    expectWireError(() => encodeHello(sampleHello({ auth: bytes(16, 1) })), "WIRE_BAD_ARGUMENT", "auth");
    expectWireError(() => encodeHello(sampleHello({ clientName: "a\0b" })), "WIRE_BAD_ARGUMENT", "NUL");
  });
  test("names: 32 bytes of UTF-8 fit, 33 do not; multi-byte characters count in bytes", () => {
    expect(decodeHello(encodeHello(sampleHello({ clientName: "x".repeat(32) }))).clientName).toBe(
      "x".repeat(32),
    );
    expectWireError(
      () => encodeHello(sampleHello({ clientName: "x".repeat(33) })),
      "WIRE_BAD_ARGUMENT",
      "33 bytes",
    );
    expect(decodeHello(encodeHello(sampleHello({ clientName: "é".repeat(16) }))).clientName).toBe(
      "é".repeat(16),
    );
    expectWireError(
      () => encodeHello(sampleHello({ clientName: `${"é".repeat(16)}x` })),
      "WIRE_BAD_ARGUMENT",
    );
    expect(decodeHello(encodeHello(sampleHello({ clientName: "" }))).clientName).toBe("");
  });
  test("decoded byte strings are copies, not views of the receive buffer", () => {
    const b = encodeHello(sampleHello());
    const h = decodeHello(b);
    b.fill(0);
    expect(h.drafterIdentity[0]).toBe(0xaa);
  });
});

describe("HelloReply body (CONTRACT 6.1)", () => {
  test("round trip and offsets", () => {
    const r = sampleHelloReply({ capabilities: 5, windowsKept: 0x01020304, workerName: "w-1" });
    const b = encodeHelloReply(r);
    expect(b.length).toBe(HELLO_REPLY_BODY_SIZE);
    expect(b[68]).toBe(5);
    expect(Array.from(b.subarray(88, 92))).toEqual([4, 3, 2, 1]);
    expect(Array.from(b.subarray(92, 96))).toEqual([0, 0, 0, 0]);
    expect(decodeHelloReply(b)).toEqual(r);
  });
  test("size and reserved are refused as BAD_REPLY", () => {
    for (const n of [0, 1, 127, 129]) {
      expectWireError(() => decodeHelloReply(new Uint8Array(n)), "WIRE_BAD_REPLY", `${n} bytes`);
    }
    const b = encodeHelloReply(sampleHelloReply());
    b[93] = 1;
    expectWireError(() => decodeHelloReply(b), "WIRE_BAD_REPLY", "reserved");
  });
  test("argument checks", () => {
    expectWireError(
      () => encodeHelloReply(sampleHelloReply({ numSpec: 1e6 })),
      "WIRE_BAD_ARGUMENT",
      "numSpec",
    );
    expectWireError(
      () => encodeHelloReply(sampleHelloReply({ workerName: "y".repeat(40) })),
      "WIRE_BAD_ARGUMENT",
    );
  });
});

describe("HELLO auth (CONTRACT 6.1)", () => {
  test("HMAC-SHA256 over 'tapwire/hello' || session u32 LE || seq u32 LE", async () => {
    const { createHmac } = await import("node:crypto");
    const msg = Buffer.concat([Buffer.from("tapwire/hello"), Buffer.from([4, 3, 2, 1, 9, 0, 0, 0])]);
    const want = createHmac("sha256", "tok").update(msg).digest("hex");
    expect(toHex(helloAuth("tok", 0x01020304, 9))).toBe(want);
    expect(toHex(helloAuth(new TextEncoder().encode("tok"), 0x01020304, 9))).toBe(want);
  });
  test("verify accepts the right auth only", () => {
    const a = helloAuth("tok", 5, 6);
    expect(verifyHelloAuth("tok", 5, 6, a)).toBe(true);
    expect(verifyHelloAuth("tok2", 5, 6, a)).toBe(false);
    expect(verifyHelloAuth("tok", 5, 7, a)).toBe(false);
    expect(verifyHelloAuth("tok", 6, 6, a)).toBe(false);
    expect(verifyHelloAuth("tok", 5, 6, new Uint8Array(32))).toBe(false);
    expect(verifyHelloAuth("tok", 5, 6, a.subarray(0, 31))).toBe(false);
  });
});

describe("checkHelloReply: client checks of an OK reply (CONTRACT 6.1, 9.3)", () => {
  test("a matching reply passes", () => {
    expect(checkHelloReply(sampleHello(), sampleHelloReply())).toBeNull();
  });
  const cases: [string, Parameters<typeof sampleHello>[0], Parameters<typeof sampleHelloReply>[0], string][] =
    [
      [
        "drafter identity",
        {},
        { drafterIdentity: bytes(32, 0xcc) },
        `drafter identity: worker ${"cc".repeat(32)}, ours ${"aa".repeat(32)}`,
      ],
      ["markov identity", {}, { markovIdentity: bytes(32, 1) }, "markov identity: worker 0101"],
      ["window", {}, { window: 8 }, "window: worker 8, ours 16"],
      ["num_spec", {}, { numSpec: 3 }, "num_spec: worker 3"],
      [
        "TOP32",
        { sampleMode: SampleMode.TOP32 },
        { capabilities: Capability.TAPS_BF16 | Capability.MARGIN },
        "TOP32",
      ],
      ["TAPS_BF16", {}, { capabilities: Capability.TOP32 | Capability.MARGIN }, "TAPS_BF16"],
      ["MARGIN", { helloFlags: 1 }, { capabilities: Capability.TAPS_BF16 }, "MARGIN"],
      ["max_slots", {}, { maxSlots: 63 }, "max_slots: worker 63 < 64"],
      ["max_rows_per_step", {}, { maxRowsPerStep: 255 }, "max_rows_per_step: worker 255 < 256"],
      ["vocab_size", {}, { vocabSize: 999 }, "vocab_size: worker 999"],
      ["row_bytes", {}, { rowBytes: 1 }, "row_bytes: worker 1"],
    ];
  for (const [name, h, r, text] of cases) {
    test(name, () => {
      expect(checkHelloReply(sampleHello(h), sampleHelloReply(r))).toContain(text);
    });
  }
  test("MARGIN is not needed without WANT_MARGIN; larger limits are fine", () => {
    expect(
      checkHelloReply(sampleHello({ helloFlags: 0 }), sampleHelloReply({ capabilities: 1, maxSlots: 1e6 })),
    ).toBeNull();
  });
  test("every difference is listed", () => {
    const r = checkHelloReply(sampleHello(), sampleHelloReply({ window: 1, vocabSize: 2 }));
    expect(r).toContain("window");
    expect(r).toContain("vocab_size");
  });
});

describe("checkHelloConfig: CONFIG_MISMATCH rules that need only the HELLO (CONTRACT 6.1)", () => {
  const table: [Parameters<typeof sampleHello>[0], string | null][] = [
    [{}, null],
    [{ window: 0 }, "window 0"],
    [{ window: 1 }, null],
    [{ window: 4096 }, null],
    [{ window: 4097 }, "window 4097"],
    [{ numSpec: 0 }, "num_spec 0"],
    [{ numSpec: 1 }, null],
    [{ numSpec: 32 }, null],
    [{ numSpec: 33 }, "num_spec 33"],
    [{ sampleMode: 2 }, "sample_mode 2"],
    [{ rowDtype: 2 }, "row_dtype 2"],
    [{ rowBytes: 385 }, "row_bytes 385"],
    [{ helloFlags: 2 }, "hello_flags bits 0x2"],
    [{ helloFlags: 0x80000001 }, "hello_flags bits 0x80000000"],
    [{ helloFlags: 1 }, null],
    [{ sampleMode: 1, vocabSize: 31 }, "vocab_size >= 32"],
    [{ sampleMode: 1, vocabSize: 32 }, null],
  ];
  for (const [over, want] of table) {
    test(JSON.stringify(over), () => {
      const r = checkHelloConfig(sampleHello(over));
      if (want === null) expect(r).toBeNull();
      else expect(r).toContain(want);
    });
  }
});
