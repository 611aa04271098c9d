import { uniqueSocketPath } from "@tapwire/testing";
import type { ReqEntry } from "@tapwire/wire";
import {
  checkReplyValues,
  decodeStepReply,
  EntryFlag,
  FrameStatus,
  ReqStatus,
  serialNewer,
} from "@tapwire/wire";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import type { Worker } from "../src/index.js";
import { createWorker } from "../src/index.js";
import { helloFor, nullDrafter, Raw, Sess, stepFrame, writeRow } from "./helpers.js";

const W = 4;
const SLOTS = 6;

/** The simple model of CONTRACT 7.1/7.2: per slot a generation and a list of (position, salt) rows. */
interface ModelSlot {
  gen: number | null;
  rows: { pos: number; salt: number }[];
}

function applyModel(
  m: ModelSlot,
  e: ReqEntry,
  salt: number,
): { status: number; windowRows: number; consumed: boolean } {
  if (m.gen !== null && m.gen !== e.generation && !serialNewer(e.generation, m.gen)) {
    return { status: ReqStatus.STALE_GENERATION, windowRows: 0, consumed: false };
  }
  if (m.gen === null || m.gen !== e.generation) {
    m.gen = e.generation;
    m.rows = [];
  }
  if (e.flags & EntryFlag.RELEASE) {
    m.rows = [];
    return { status: ReqStatus.OK, windowRows: 0, consumed: false };
  }
  const resync = (e.flags & EntryFlag.RESYNC) !== 0;
  if (resync || e.nRows > 0) {
    const carried = Array.from({ length: e.nRows }, (_, i) => ({ pos: e.rowStart + i, salt }));
    const end = m.rows.length > 0 ? m.rows[m.rows.length - 1]!.pos + 1 : 0;
    const connects = m.rows.length === 0 ? e.rowStart === 0 : end === e.rowStart;
    m.rows = resync || !connects ? carried : [...m.rows, ...carried];
    m.rows = m.rows.slice(Math.max(0, m.rows.length - W));
  }
  const expected = Math.min(W, e.anchorPos);
  const end = m.rows.length > 0 ? m.rows[m.rows.length - 1]!.pos + 1 : -1;
  const held = end === e.anchorPos ? m.rows.length : 0;
  const status =
    held === expected ? ReqStatus.OK : held > 0 ? ReqStatus.PARTIAL_WINDOW : ReqStatus.NEED_RESYNC;
  return {
    status,
    windowRows: held,
    consumed: (e.flags & EntryFlag.NEED_DRAFT) !== 0 && status !== ReqStatus.NEED_RESYNC,
  };
}

function modelBytes(m: ModelSlot, rb: number): Uint8Array {
  const out = new Uint8Array(m.rows.length * rb);
  m.rows.forEach((r, i) => {
    writeRow(out, i * rb, r.pos, rb, r.salt);
  });
  return out;
}

/** A random entry for `slot`, built against the model so that appends and gaps both happen. */
const entryArb = (slot: number, maxN: number) =>
  fc.record({
    slot: fc.constant(slot),
    genDelta: fc.constantFrom(0, 0, 0, 0, 1, -1, 0x80000000),
    kind: fc.constantFrom("append", "append", "random", "none", "release"),
    n: fc.nat(maxN),
    start: fc.nat(24),
    anchor: fc.nat(30),
    needDraft: fc.boolean(),
    resync: fc.boolean(),
    nOut: fc.nat(4),
  });

const stepArb = (maxN: number) =>
  fc
    .uniqueArray(fc.nat(SLOTS - 1), { minLength: 1, maxLength: SLOTS })
    .chain((slots) => fc.tuple(...slots.map((s) => entryArb(s, maxN))));

// 16-byte rows: every STEP arrives in one read and its rows are copied. 32 KiB rows: STEPs above
// one 64 KiB read are received in place (rows placed into the slot buffers; a STEP with an entry
// above W rows is copied), so the model also checks placement, its compactions and growth, and
// the mix of both paths.
const CONFIGS = [
  {
    name: "16-byte rows over tcp (copied)",
    hidden: 4,
    maxN: W + 3,
    listen: () => "tcp://127.0.0.1:0",
    runs: 120,
  },
  {
    name: "32 KiB rows over unix (placed)",
    hidden: 8192,
    maxN: W + 1,
    listen: () => `unix://${uniqueSocketPath("wm")}`,
    runs: 50,
  },
  {
    name: "32 KiB rows over tcp (placed)",
    hidden: 8192,
    maxN: W + 1,
    listen: () => "tcp://127.0.0.1:0",
    runs: 40,
  },
];

describe.each(CONFIGS)("property: worker windows equal a simple model (CONTRACT 7.1, 7.2): $name", (cfg) => {
  const drafter = nullDrafter({ window: W, hidden: cfg.hidden });
  const ROW_BYTES = drafter.numTaps * drafter.hidden * 2;
  let worker: Worker;
  let raw: Raw;
  beforeAll(async () => {
    worker = await createWorker({ drafter, listen: [cfg.listen()], maxSlots: 8 });
    raw = await new Raw(worker.endpoints[0]!).connect();
  });
  afterAll(async () => {
    raw.close();
    await worker.close();
  });
  let sessionId = 1000;
  test("random STEP sequences", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(stepArb(cfg.maxN), { minLength: 1, maxLength: 14 }),
        fc.nat(),
        async (steps, gen0) => {
          const s = new Sess(raw, ++sessionId, drafter, helloFor(drafter, { maxSlots: 8 }));
          expect((await s.doHello()).status).toBe(FrameStatus.OK);
          const model: ModelSlot[] = Array.from({ length: SLOTS }, () => ({ gen: null, rows: [] }));
          // Start generations near the u32 wrap half of the time.
          const base = gen0 % 2 === 0 ? 0xfffffff0 : gen0 >>> 0;
          for (let si = 0; si < steps.length; si++) {
            const salt = si + 1;
            const entries: ReqEntry[] = steps[si]!.map((x) => {
              const m = model[x.slot]!;
              const generation = ((m.gen ?? base) + x.genDelta) >>> 0;
              const end = m.rows.length > 0 ? m.rows[m.rows.length - 1]!.pos + 1 : 0;
              let rowStart = 0;
              let nRows = 0;
              let anchorPos = x.anchor;
              let flags = (x.needDraft ? EntryFlag.NEED_DRAFT : 0) | (x.resync ? EntryFlag.RESYNC : 0);
              if (x.kind === "append") {
                rowStart = end;
                nRows = x.n;
                anchorPos = end + x.n;
              } else if (x.kind === "random") {
                rowStart = x.start;
                nRows = x.n;
                anchorPos = x.start + x.n;
              } else if (x.kind === "release") {
                flags = EntryFlag.RELEASE;
              }
              return {
                slot: x.slot,
                generation,
                anchorPos,
                anchorToken: 3,
                rowStart,
                nRows,
                nOut: x.nOut,
                flags,
              };
            });
            const expected = entries.map((e) => applyModel(model[e.slot]!, e, salt));
            s.seq++;
            const frameBytes = stepFrame({
              seq: s.seq,
              session: s.session,
              entries,
              salt,
              rowBytes: ROW_BYTES,
            });
            const a = await raw.send(frameBytes);
            expect(a.status).toBe(FrameStatus.OK);
            // The client's checks (6.3, 7.4) hold on every reply.
            const v = decodeStepReply(a.body, {
              nReq: entries.length,
              numSpec: 4,
              margin: true,
              sampled: false,
            });
            checkReplyValues(v, { stepId: 1, vocabSize: 256, window: W, numSpec: 4, entries });
            expect(Array.from(v.status)).toEqual(expected.map((x) => x.status));
            expect(Array.from(v.windowRows)).toEqual(expected.map((x) => x.windowRows));
            for (let i = 0; i < entries.length; i++) {
              const k = expected[i]!.consumed
                ? entries[i]!.nOut === 0
                  ? 4
                  : Math.min(4, entries[i]!.nOut)
                : 0;
              expect(v.confidence[i * 4]).toBe(k > 0 ? 0.5 : 0);
            }
            for (let slot = 0; slot < SLOTS; slot++) {
              const got = worker.debugWindow(slot);
              const m = model[slot]!;
              expect(got.known).toBe(m.gen !== null);
              if (m.gen !== null) expect(got.generation).toBe(m.gen);
              expect(got.nRows).toBe(m.rows.length);
              if (m.rows.length > 0) expect(got.firstPos).toBe(m.rows[0]!.pos);
              expect(Buffer.compare(Buffer.from(got.rows), Buffer.from(modelBytes(m, ROW_BYTES)))).toBe(0);
            }
          }
        },
      ),
      { numRuns: cfg.runs },
    );
    const c = worker.stats().counters as Record<string, number>;
    expect(c.placements_lost).toBe(0);
    expect((c.rows_placed ?? 0) + (c.rows_copied ?? 0)).toBe(c.rows_applied);
    if (cfg.hidden > 4) expect(c.rows_placed).toBeGreaterThan(0);
    else expect(c.rows_placed).toBe(0);
  });
});
