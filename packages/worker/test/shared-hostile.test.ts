// CONTRACT 11 on a shared worker (12.1): garbage, random frames of many sessions over many
// connections, and seat hoarding never throw, never leak a session into another's STATS, and
// leave the worker serving; a hoarder idle past the lease gives its seats up.
import { decodeHeader, encodeHello, FrameStatus, frame, Op } from "@tapwire/wire";
import fc from "fast-check";
import { describe, expect, test } from "vitest";
import type { FrameConn } from "../src/index.js";
import { WorkerCore } from "../src/index.js";
import { entry, helloFor, nullDrafter, stepFrame } from "./helpers.js";

const d = nullDrafter();

describe("CONTRACT 11 + 12.1: hostile input to a shared worker", () => {
  test("random frames and garbage of many sessions on many connections: a well-formed reply to each, state consistent", async () => {
    let now = 0;
    const core = new WorkerCore({
      drafter: d,
      maxSlots: 8,
      maxRowsPerStep: 64,
      maxSessions: 3,
      sessionLease: 50,
      now: () => now,
    });
    const conns: FrameConn[] = Array.from({ length: 6 }, () => ({}));
    const msgArb = fc.oneof(
      fc.uint8Array({ maxLength: 200 }),
      fc
        .record({ s: fc.integer({ min: 1, max: 5 }), seq: fc.integer({ min: 1, max: 50 }) })
        .map(({ s, seq }) =>
          frame({ op: Op.HELLO, seq, session: s }, encodeHello(helloFor(d, { maxSlots: 1 + (seq % 8) }))),
        ),
      fc
        .record({
          s: fc.integer({ min: 1, max: 5 }),
          seq: fc.integer({ min: 1, max: 50 }),
          slot: fc.integer({ min: 0, max: 9 }),
          n: fc.integer({ min: 0, max: 4 }),
        })
        .map(({ s, seq, slot, n }) =>
          stepFrame({ seq, session: s, entries: [entry({ slot, anchorPos: n, nRows: n, flags: 3 })] }),
        ),
      fc
        .record({ s: fc.integer({ min: 0, max: 5 }), op: fc.constantFrom(Op.RESET, Op.STATS, Op.PING, 9) })
        .map(({ s, op }) => frame({ op, seq: 99, session: s })),
    );
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.tuple(fc.integer({ min: 0, max: 5 }), msgArb, fc.boolean()), { maxLength: 60 }),
        async (ops) => {
          for (const [c, m, tick] of ops) {
            if (tick) now += 20;
            const r = await core.handle(m, conns[c]);
            expect(() => decodeHeader(r, r.length)).not.toThrow();
            if (c === 5 && m.length > 2 && m[2] === 0x50) core.connectionClosed(conns[c]!);
          }
          expect(core.heldSessions.length).toBeLessThanOrEqual(3);
          for (const c of conns) {
            const s = await core.handle(frame({ op: Op.STATS, seq: 1, session: 0 }), c);
            const j = JSON.parse(Buffer.from(s.subarray(24)).toString("utf8")) as { session?: number };
            if (j.session !== undefined) expect(core.heldSessions).toContain(j.session);
          }
        },
      ),
      { numRuns: 60, seed: 1204 },
    );
    expect((core.stats().counters as Record<string, number>).internal_errors).toBe(0);
  });

  test("a hoarder holding every seat idle past the lease gives one up to a real engine", async () => {
    let now = 0;
    const core = new WorkerCore({
      drafter: d,
      maxSlots: 8,
      maxRowsPerStep: 64,
      maxSessions: 4,
      sessionLease: 1000,
      now: () => now,
    });
    for (let s = 1; s <= 4; s++) {
      const r = await core.handle(
        frame({ op: Op.HELLO, seq: 1, session: 100 + s }, encodeHello(helloFor(d, { maxSlots: 8 }))),
        {},
      );
      expect(r[7]).toBe(FrameStatus.OK);
    }
    const engine: FrameConn = {};
    const hello = (seq: number) =>
      frame({ op: Op.HELLO, seq, session: 7 }, encodeHello(helloFor(d, { maxSlots: 8 })));
    expect((await core.handle(hello(1), engine))[7]).toBe(FrameStatus.BUSY);
    now += 1000;
    expect((await core.handle(hello(2), engine))[7]).toBe(FrameStatus.OK);
    expect(core.heldSessions).toEqual([102, 103, 104, 7]);
  });
});
