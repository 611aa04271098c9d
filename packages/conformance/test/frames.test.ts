/** The tester's own codec against the golden vectors (it shares no code with @tapwire/wire's codec). */
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import {
  frame,
  helloBody,
  helloHmac,
  hex,
  lePrefix,
  parseHeader,
  parseHelloReply,
  parseStepReply,
  rowsOffsetFor,
  stepReplySize,
  unhex,
} from "../src/frames.js";
import { framingVectors } from "../src/index.js";
import { WindowOracle } from "../src/oracle.js";

describe("framing-v1.json (shipped in the package)", () => {
  it("is the byte-identical copy of the shared vectors", () => {
    const b = readFileSync(new URL("./fixtures/framing-v1.json", import.meta.url));
    expect(createHash("sha256").update(b).digest("hex")).toBe(
      "a39c795d148791e12d00cbcddeb4e16d0946e8ce3d3cd0afa250e5e15d69482f",
    );
  });
  it("every stream_hex is the little-endian prefix and the message(s)", () => {
    for (const c of framingVectors()) {
      if (c.prefix_hex !== undefined) {
        expect(hex(lePrefix(c.length!))).toBe(c.prefix_hex);
        continue;
      }
      const msgs = c.messages_hex ?? [c.message_hex!];
      expect(msgs.map((m) => hex(lePrefix(m.length / 2)) + m).join("")).toBe(c.stream_hex);
    }
  });
  it("its HELLO, HelloReply and STEP reply messages parse with the tester's own codec", () => {
    const v = Object.fromEntries(framingVectors().map((c) => [c.name, c]));
    const hello = unhex(v["message_hello_request#1"]!.message_hex!);
    expect(parseHeader(hello)).toMatchObject({
      magicOk: true,
      version: 1,
      op: 1,
      status: 0,
      bodyLen: 160,
      reserved: 0,
    });
    const hr = unhex(v["message_hello_reply_ok#1"]!.message_hex!);
    expect(parseHelloReply(hr.subarray(24))).not.toBeNull();
    for (const n of ["message_step_reply_greedy#1", "message_step_reply_top32#1"]) {
      const r = parseStepReply(unhex(v[n]!.message_hex!).subarray(24));
      expect(typeof r).not.toBe("string");
    }
  });
});

describe("wire-v1.json through the tester's codec", () => {
  const wire = JSON.parse(readFileSync(new URL("./fixtures/wire-v1.json", import.meta.url), "utf8")) as {
    cases: { name: string; hex: string; valid: boolean; fields: Record<string, unknown> }[];
  };
  it("re-encodes every valid HELLO body byte for byte", () => {
    const cases = wire.cases.filter((c) => c.valid && c.name.startsWith("hello_request"));
    expect(cases.length).toBeGreaterThan(0);
    for (const c of cases) {
      const m = unhex(c.hex);
      const h = parseHeader(m)!;
      const f = c.fields.hello as Record<string, unknown>;
      const body = helloBody({
        drafterIdentity: unhex(f.drafter_identity as string),
        markovIdentity: unhex(f.markov_identity as string),
        window: f.window as number,
        numSpec: f.num_spec as number,
        sampleMode: f.sample_mode as number,
        rowDtype: f.row_dtype as number,
        numTaps: f.num_taps as number,
        hidden: f.hidden as number,
        rowBytes: f.row_bytes as number,
        vocabSize: f.vocab_size as number,
        maxSlots: f.max_slots as number,
        maxRowsPerStep: f.max_rows_per_step as number,
        helloFlags: f.hello_flags as number,
        auth: unhex(f.auth as string),
        clientName: f.client_name as string,
      });
      expect(hex(frame({ op: h.op, seq: h.seq, session: h.session }, body))).toBe(c.hex);
      // CONTRACT 6.1 auth, computed by the tester from the vector's token.
      if (typeof c.fields.token === "string")
        expect(hex(helloHmac(c.fields.token, h.session, h.seq))).toBe(f.auth);
    }
  });
  it("parses every valid STEP reply at the size 7.4 gives", () => {
    for (const c of wire.cases.filter((x) => x.valid && x.name.startsWith("step_reply"))) {
      const r = parseStepReply(unhex(c.hex).subarray(24));
      expect(typeof r).not.toBe("string");
      if (typeof r === "string") continue;
      expect(stepReplySize(r.nReq, r.numSpec, r.margin !== null, r.sampledMask !== null)).toBe(
        unhex(c.hex).length - 24,
      );
    }
  });
});

describe("rows_offset_for and the HMAC", () => {
  it("rows start 64-byte aligned relative to the frame start", () => {
    for (let n = 0; n < 40; n++)
      for (const s of [false, true]) {
        const o = rowsOffsetFor(n, s);
        expect((24 + o) % 64).toBe(0);
        expect(o).toBeGreaterThanOrEqual(16 + 32 * n + (s ? 8 * n : 0));
        expect(o - (16 + 32 * n + (s ? 8 * n : 0))).toBeLessThan(64);
      }
  });
  it("the HMAC covers tapwire/hello ‖ session LE ‖ seq LE", () => {
    expect(hex(helloHmac("k", 1, 2))).not.toBe(hex(helloHmac("k", 2, 1)));
    expect(hex(helloHmac("k", 0x01020304, 5))).toHaveLength(64);
  });
});

describe("the window oracle (CONTRACT 7.2)", () => {
  it("appends, trims to W, replaces on a gap, STALE_GENERATION on an older generation", () => {
    const o = new WindowOracle(4);
    const e = (x: Partial<Parameters<WindowOracle["apply"]>[0][0]>) => ({
      slot: 0,
      generation: 1,
      anchorPos: 0,
      anchorToken: 0,
      rowStart: 0,
      nRows: 0,
      nOut: 0,
      flags: 1,
      ...x,
    });
    expect(o.apply([e({ anchorPos: 3, nRows: 3, flags: 3 })])).toEqual([{ status: 0, windowRows: 3 }]);
    expect(o.apply([e({ anchorPos: 6, rowStart: 3, nRows: 3 })])).toEqual([{ status: 0, windowRows: 4 }]);
    expect(o.apply([e({ anchorPos: 9, rowStart: 8, nRows: 1 })])).toEqual([{ status: 1, windowRows: 1 }]);
    expect(o.apply([e({ anchorPos: 12 })])).toEqual([{ status: 2, windowRows: 0 }]);
    expect(o.apply([e({ generation: 0, anchorPos: 1, nRows: 1, flags: 3 })])).toEqual([
      { status: 3, windowRows: 0 },
    ]);
    expect(o.apply([e({ flags: 4 })])).toEqual([{ status: 0, windowRows: 0 }]);
  });
});
