// fast-check properties: round trips of every frame kind; garbage and mutations raise only
// WireError; any single corrupted reply value is caught and named (CONTRACT 6.3, 8).
import fc from "fast-check";
import { describe, expect, test } from "vitest";
import {
  APP_HEADER_SIZE,
  beginStepReply,
  checkReplyValues,
  decodeHeader,
  decodeHello,
  decodeHelloReply,
  decodeStepReply,
  decodeStepRequest,
  EntryFlag,
  encodeHello,
  encodeHelloReply,
  FrameAccumulator,
  frame,
  fromHex,
  type Hello,
  type HelloReply,
  partialHeader,
  peekStepReplyShape,
  type ReplyContext,
  type ReqEntry,
  ReqStatus,
  rowsOffsetFor,
  type SampleMeta,
  splitFrame,
  validateSampled,
  WireError,
  writeStepPrefix,
} from "../src/index.js";
import { alignedBuf, loadCases, validReply } from "./helpers.js";

const RUNS = { numRuns: 200 };
const u8 = fc.integer({ min: 0, max: 0xff });
const u16 = fc.integer({ min: 0, max: 0xffff });
const u32 = fc.integer({ min: 0, max: 0xffffffff });
const id32 = fc.uint8Array({ minLength: 32, maxLength: 32 });
const name = fc
  .string({ unit: "grapheme", maxLength: 12 })
  .filter((s) => !s.includes("\0") && new TextEncoder().encode(s).length <= 32);

const helloArb: fc.Arbitrary<Hello> = fc.record({
  drafterIdentity: id32,
  markovIdentity: id32,
  window: u16,
  numSpec: u16,
  sampleMode: u8,
  rowDtype: u8,
  numTaps: u16,
  hidden: u32,
  rowBytes: u32,
  vocabSize: u32,
  maxSlots: u32,
  maxRowsPerStep: u32,
  helloFlags: u32,
  auth: id32,
  clientName: name,
});
const helloReplyArb: fc.Arbitrary<HelloReply> = fc.record({
  drafterIdentity: id32,
  markovIdentity: id32,
  window: u16,
  numSpec: u16,
  capabilities: u32,
  maxSlots: u32,
  maxRowsPerStep: u32,
  vocabSize: u32,
  rowBytes: u32,
  windowsKept: u32,
  workerName: name,
});

/** Only WireError may escape; returns whether it threw. */
function onlyWireError(fn: () => unknown): boolean {
  try {
    fn();
    return false;
  } catch (e) {
    if (!(e instanceof WireError)) throw e;
    expect(typeof e.code).toBe("string");
    expect(e.message.length).toBeGreaterThan(0);
    return true;
  }
}

describe("round trips", () => {
  test("header + body", () => {
    fc.assert(
      fc.property(u8, u8, u32, u32, fc.uint8Array({ maxLength: 64 }), (op, status, seq, session, body) => {
        const m = frame({ op, status, seq, session }, body);
        const { header, body: b } = splitFrame(m);
        expect(header).toEqual({ op, status, seq, session, bodyLen: body.length });
        expect(Array.from(b)).toEqual(Array.from(body));
      }),
      RUNS,
    );
  });
  test("HELLO", () => {
    fc.assert(
      fc.property(helloArb, (h) => {
        const b = encodeHello(h);
        expect(decodeHello(b)).toEqual(h);
        expect(Array.from(encodeHello(decodeHello(b)))).toEqual(Array.from(b));
      }),
      RUNS,
    );
  });
  test("HelloReply", () => {
    fc.assert(
      fc.property(helloReplyArb, (r) => {
        const b = encodeHelloReply(r);
        expect(decodeHelloReply(b)).toEqual(r);
      }),
      RUNS,
    );
  });

  const stepArb = fc
    .record({
      sampled: fc.boolean(),
      rowBytes: fc.integer({ min: 1, max: 64 }),
      numSpec: fc.integer({ min: 1, max: 32 }),
      stepId: u32,
      seq: u32,
      session: u32,
      slots: fc.uniqueArray(fc.integer({ min: 0, max: 63 }), { maxLength: 20 }),
    })
    .chain((s) =>
      fc.record({
        s: fc.constant(s),
        entries: fc.tuple(
          ...s.slots.map((slot) =>
            fc
              .record({
                generation: u32,
                anchorPos: fc.integer({ min: 0, max: 0xffffffff }),
                anchorToken: u32,
                nRows: fc.integer({ min: 0, max: 4 }),
                nOut: fc.integer({ min: 0, max: s.numSpec }),
                flags: fc.constantFrom(0, 1, 2, 3, 4),
              })
              .map((e): ReqEntry => {
                const release = e.flags === EntryFlag.RELEASE;
                const nRows = release ? 0 : Math.min(e.nRows, e.anchorPos);
                return { slot, ...e, nRows, rowStart: nRows > 0 ? e.anchorPos - nRows : e.anchorPos };
              }),
          ),
        ),
        meta: fc.array(fc.record({ seed: u32, topK: fc.integer({ min: 1, max: 32 }), tempMilli: u16 }), {
          minLength: s.slots.length,
          maxLength: s.slots.length,
        }),
      }),
    );
  test("STEP request: writeStepPrefix then decodeStepRequest", () => {
    fc.assert(
      fc.property(stepArb, ({ s, entries, meta }) => {
        const nRows = entries.reduce((a, e) => a + e.nRows, 0);
        const sampleMeta: SampleMeta[] | null = s.sampled ? meta : null;
        const off = APP_HEADER_SIZE + rowsOffsetFor(entries.length, s.sampled);
        const buf = new Uint8Array(off + nRows * s.rowBytes + 7).fill(0x5a);
        for (let i = off; i < buf.length; i++) buf[i] = (i * 13) & 0xff;
        const len = writeStepPrefix(buf, { ...s, entries, sampleMeta, nRows });
        const { header, body } = splitFrame(buf, len, { request: true });
        expect(header.seq).toBe(s.seq);
        const r = decodeStepRequest(body, { ...s, maxSlots: 64, maxRowsPerStep: 80 });
        expect(r.entries).toEqual(entries);
        expect(r.sampleMeta).toEqual(sampleMeta);
        expect(r.stepId).toBe(s.stepId);
        for (let i = 0; i < r.rows.length; i++) expect(r.rows[i]).toBe(((off + i) * 13) & 0xff);
      }),
      RUNS,
    );
  });
  test("STEP reply: beginStepReply, fill, decodeStepReply", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 12 }),
        fc.integer({ min: 1, max: 32 }),
        fc.boolean(),
        fc.boolean(),
        u32,
        fc.integer({ min: 0, max: 2 ** 32 - 1 }),
        (n, N, margin, sampled, stepId, seed) => {
          const buf = alignedBuf(24 + 16 + 12 * n + 12 * n * N + 260 * n * N + 8);
          const v = beginStepReply(buf, { seq: 1, session: 2, stepId, nReq: n, numSpec: N, margin, sampled });
          let x = seed;
          const rnd = () => {
            x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
            return x;
          };
          for (const a of [
            v.status,
            v.windowRows,
            v.generation,
            v.draftIds,
            v.sampledMask,
            v.supportIds,
            v.proposalQ,
          ]) {
            if (a) for (let i = 0; i < a.length; i++) a[i] = rnd();
          }
          for (const a of [v.confidence, v.margin])
            if (a) for (let i = 0; i < a.length; i++) a[i] = rnd() / 2 ** 32;
          const { body } = splitFrame(buf, v.frameLength);
          const r = decodeStepReply(body, { nReq: n, numSpec: N, margin, sampled });
          expect(r.stepId).toBe(stepId);
          for (const k of [
            "status",
            "windowRows",
            "generation",
            "draftIds",
            "confidence",
            "margin",
            "sampledMask",
            "supportIds",
            "proposalQ",
          ] as const) {
            const a = r[k];
            const b = v[k];
            expect(a === null ? null : Array.from(a)).toEqual(b === null ? null : Array.from(b));
          }
        },
      ),
      RUNS,
    );
  });
});

/** Runs every decoder over `msg` the way a worker and a client would. Only WireError may escape. */
function decodeEverything(
  msg: Uint8Array,
  shape: { nReq: number; numSpec: number; margin: boolean; sampled: boolean },
): void {
  partialHeader(msg);
  onlyWireError(() => decodeHeader(msg, undefined, { request: true }));
  onlyWireError(() => new FrameAccumulator({ maxFrameBytes: 1 << 16 }).push(msg));
  let body = msg;
  onlyWireError(() => {
    body = splitFrame(msg).body;
  });
  onlyWireError(() => decodeHello(body));
  onlyWireError(() => decodeHelloReply(body));
  for (const sampled of [false, true]) {
    onlyWireError(() =>
      decodeStepRequest(body, { sampled, rowBytes: 48, maxSlots: 64, maxRowsPerStep: 64, numSpec: 8 }),
    );
  }
  onlyWireError(() => {
    const r = decodeStepReply(body, peekStepReplyShape(body));
    const ctx: ReplyContext = {
      stepId: r.stepId,
      vocabSize: 1000,
      window: 16,
      numSpec: r.numSpec,
      entries: Array.from({ length: r.nReq }, (_, i) => ({
        slot: i,
        generation: r.generation[i]!,
        anchorPos: 40,
        nOut: 0,
        flags: 1,
      })),
      sampleMeta: r.sampledMask
        ? Array.from({ length: r.nReq }, () => ({ seed: 0, topK: 3, tempMilli: 1000 }))
        : null,
    };
    checkReplyValues(r, ctx);
    validateSampled(r, ctx);
  });
  onlyWireError(() => decodeStepReply(body, shape));
}

describe("garbage never raises anything but WireError", () => {
  const shape = { nReq: 1, numSpec: 2, margin: true, sampled: false };
  test("random bytes", () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 700 }), (b) => decodeEverything(b, shape)),
      { numRuns: 500 },
    );
  });
  test("random bytes behind a valid header", () => {
    fc.assert(
      fc.property(u8, u8, fc.uint8Array({ maxLength: 700 }), (op, status, b) =>
        decodeEverything(frame({ op: op % 6, status: status % 12, seq: 1, session: 1 }, b), shape),
      ),
      { numRuns: 500 },
    );
  });
  const seeds = loadCases().map((c) => fromHex(c.hex));
  const valid = fromHex(loadCases().find((c) => c.name === "step_reply_top32#1")!.hex);
  test("mutated vector frames: flipped bytes, truncation, extension", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: seeds.length - 1 }),
        fc.array(fc.tuple(fc.nat(), u8), { minLength: 1, maxLength: 6 }),
        fc.integer({ min: -8, max: 8 }),
        (which, flips, resize) => {
          const orig = seeds[which]!;
          let m = orig.slice();
          for (const [pos, val] of flips) m[pos % m.length] = val;
          if (resize < 0) m = m.subarray(0, Math.max(0, m.length + resize));
          else if (resize > 0) {
            const big = new Uint8Array(m.length + resize);
            big.set(m);
            m = big;
          }
          decodeEverything(m, shape);
          // the decoder still works afterwards
          expect(splitFrame(valid).header.op).toBe(2);
        },
      ),
      { numRuns: 1000 },
    );
  });
});

describe("any single corrupted value of a valid reply is caught and named", () => {
  // A valid reply where some entries are not consumed (no NEED_DRAFT, or NEED_RESYNC), so every
  // kind of position exists: consumed, tail after n_out, and not-consumed entries.
  function makeReply(n: number, N: number, notConsumed: number[], sampled: boolean) {
    const v = validReply(n, N, { margin: true, sampled });
    notConsumed.forEach((sel, i) => {
      if (i >= n || sel === 0) return;
      const e = v.ctx.entries[i] as ReqEntry;
      if (sel === 1) e.flags = 0;
      else {
        v.views.status[i] = ReqStatus.NEED_RESYNC;
        v.views.windowRows[i] = 0;
      }
      v.views.draftIds.fill(0, i * N, (i + 1) * N);
      v.views.confidence.fill(0, i * N, (i + 1) * N);
      v.views.margin!.fill(0, i * N, (i + 1) * N);
      v.views.sampledMask?.fill(0, i * N, (i + 1) * N);
      v.views.supportIds?.fill(0, i * N * 32, (i + 1) * N * 32);
      v.views.proposalQ?.fill(0, i * N * 32, (i + 1) * N * 32);
    });
    return v;
  }
  const consumedK = (v: ReturnType<typeof makeReply>, i: number) => {
    const e = v.ctx.entries[i]!;
    const N = v.views.numSpec;
    if ((e.flags & 1) === 0 || v.views.status[i]! > 1) return 0;
    return e.nOut === 0 ? N : Math.min(e.nOut, N);
  };

  test("draft id, confidence or margin (CONTRACT 6.3)", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 24 }),
        fc.integer({ min: 1, max: 8 }),
        fc.array(fc.integer({ min: 0, max: 2 }), { maxLength: 24 }),
        fc.nat(),
        fc.nat(),
        fc.constantFrom("id", "conf", "margin"),
        fc.nat(),
        (n, N, nc, ei, pj, what, pick) => {
          const v = makeReply(n, N, nc, false);
          checkReplyValues(v.views, v.ctx);
          const i = ei % n;
          const j = pj % N;
          const live = j < consumedK(v, i);
          const p = i * N + j;
          if (what === "id") {
            const bad = live ? [-1, 1000, 2 ** 31 - 1, -(2 ** 31)] : [1, -1, 999];
            v.views.draftIds[p] = bad[pick % bad.length]!;
          } else {
            const arr = what === "conf" ? v.views.confidence : v.views.margin!;
            const bad = live
              ? what === "conf"
                ? [Number.NaN, -0.5, 1.0000001, Number.POSITIVE_INFINITY]
                : [Number.NaN, -1e-3, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY]
              : [-0, 0.5, 1e-40, Number.NaN];
            arr[p] = bad[pick % bad.length]!;
          }
          let msg = "";
          try {
            checkReplyValues(v.views, v.ctx);
          } catch (e) {
            expect(e).toBeInstanceOf(WireError);
            msg = (e as WireError).message;
          }
          expect(msg).toContain(
            `slot ${i} position ${j}: ${what === "id" ? "draft id" : what === "conf" ? "confidence" : "margin"}`,
          );
        },
      ),
      { numRuns: 400 },
    );
  });

  test("generation echo or window_rows of any entry (CONTRACT 7.2 steps 5-6, 7.4)", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 24 }),
        fc.integer({ min: 1, max: 8 }),
        fc.array(fc.integer({ min: 0, max: 2 }), { maxLength: 24 }),
        fc.nat(),
        fc.boolean(),
        fc.integer({ min: 1, max: 0xffff }),
        (n, N, nc, ei, gen, delta) => {
          const v = makeReply(n, N, nc, false);
          checkReplyValues(v.views, v.ctx);
          const i = ei % n;
          if (gen) v.views.generation[i] = (v.views.generation[i]! + delta) >>> 0;
          else v.views.windowRows[i] = (v.views.windowRows[i]! + delta) & 0xffff;
          let msg = "";
          try {
            checkReplyValues(v.views, v.ctx);
          } catch (e) {
            expect(e).toBeInstanceOf(WireError);
            msg = (e as WireError).message;
          }
          expect(msg).toContain(`slot ${i}: ${gen ? "generation echo" : ""}`);
        },
      ),
      { numRuns: 300 },
    );
  });

  test("sampled mask, support ids or q (CONTRACT 8)", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 12 }),
        fc.integer({ min: 1, max: 4 }),
        fc.array(fc.integer({ min: 0, max: 2 }), { maxLength: 12 }),
        fc.nat(),
        fc.nat(),
        fc.constantFrom("mask", "support", "q"),
        fc.nat(),
        fc.nat(),
        (n, N, nc, ei, pj, what, slotT, pick) => {
          const v = makeReply(n, N, nc, true);
          checkReplyValues(v.views, v.ctx);
          validateSampled(v.views, v.ctx);
          const i = ei % n;
          const j = pj % N;
          const p = i * N + j;
          const t = slotT % 32;
          const live = j < consumedK(v, i);
          const topK = v.ctx.sampleMeta![i]!.topK;
          const b = p * 32 + t;
          if (what === "mask") v.views.sampledMask![p] = live ? [0, 2, 255][pick % 3]! : 1 + (pick % 255);
          else if (what === "support") {
            // within top_k an id can only be wrong by range or by repeating another (a different
            // distinct id is a valid support); beyond top_k any non-zero id is wrong
            const other = v.views.supportIds![p * 32 + ((t + 1) % topK)]!;
            const dup = topK > 1 ? other : -1;
            v.views.supportIds![b] = live && t < topK ? [-1, 1000, dup][pick % 3]! : 1 + (pick % 999);
          } else {
            const cur = v.views.proposalQ![b]!;
            v.views.proposalQ![b] = live && t < topK ? (cur + 1 + (pick % 5)) >>> 0 : 1 + (pick % 7);
          }
          let msg = "";
          try {
            validateSampled(v.views, v.ctx);
          } catch (e) {
            expect(e).toBeInstanceOf(WireError);
            msg = (e as WireError).message;
          }
          expect(msg).toContain(`slot ${i} position ${j}:`);
        },
      ),
      { numRuns: 400 },
    );
  });
});
