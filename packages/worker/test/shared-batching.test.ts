// CONTRACT 12.1 "Batching": STEPs of several sessions drafted in one call give replies
// byte-identical (except worker_us) to each STEP drafted alone, over random interleavings
// (fast-check), with the ReferenceDrafter (sync) and an async drafter; worker_us includes
// queueing; one session flooding cannot starve another.
import { createDefaultPair } from "@tapwire/reference-model";
import { encodeHello, FrameStatus, frame, Op } from "@tapwire/wire";
import fc from "fast-check";
import { describe, expect, test } from "vitest";
import type { DraftBatchEntry, Drafter, DraftOutput, FrameConn } from "../src/index.js";
import { NullDrafter, ReferenceDrafter, WorkerCore } from "../src/index.js";
import { entry, GEOM, helloFor, IDENT_D, IDENT_M, stepFrame } from "./helpers.js";
import { interleavingProperty } from "./interleave.js";

/** A NullDrafter that answers after a macrotask (an async drafter like ONNX Runtime's). */
class SlowDrafter extends NullDrafter {
  sizes: number[] = [];
  /** Duration of each call, ms. */
  durations: number[] = [];
  override draft(batch: readonly DraftBatchEntry[], out: DraftOutput): Promise<void> {
    this.sizes.push(batch.length);
    const t0 = performance.now();
    return new Promise((resolve) =>
      setTimeout(() => {
        super.draft(batch, out);
        this.durations.push(performance.now() - t0);
        resolve();
      }, 2),
    );
  }
}

describe("CONTRACT 12.1: cross-session batching", () => {
  test("reference drafter: random interleavings of 4 sessions give the replies each STEP gets alone", async () => {
    const { head } = createDefaultPair({ target: { hidden: 64 } });
    const d = new ReferenceDrafter(head);
    const p = interleavingProperty(d, 4, 5);
    await fc.assert(p.prop, { numRuns: 25, seed: 1201 });
    // The property ran merged calls (else it proved nothing about batching).
    expect(p.merged()).toBeGreaterThan(0);
  }, 120_000);

  test("async drafter: the same, and STEPs arriving during a call join the next one", async () => {
    const d = new SlowDrafter({ ...GEOM, drafterIdentity: IDENT_D, markovIdentity: IDENT_M });
    const p = interleavingProperty(d as Drafter, 3, 4);
    await fc.assert(p.prop, { numRuns: 20, seed: 1202 });
    expect(p.merged()).toBeGreaterThan(0);
  }, 120_000);

  test("worker_us runs from arrival: a queued STEP's includes the call it waited for", async () => {
    const d = new SlowDrafter({ ...GEOM, drafterIdentity: IDENT_D, markovIdentity: IDENT_M });
    const core = new WorkerCore({ drafter: d, maxSlots: 8, maxRowsPerStep: 64, maxSessions: 2 });
    const ca: FrameConn = {};
    const cb: FrameConn = {};
    for (const [c, s] of [
      [ca, 0x71],
      [cb, 0x72],
    ] as const) {
      await core.handle(
        frame({ op: Op.HELLO, seq: 1, session: s }, encodeHello(helloFor(d, { maxSlots: 8 }))),
        c,
      );
    }
    const st = (s: number) => stepFrame({ seq: 2, session: s, entries: [entry({ slot: 0 })] });
    const [ra, rb] = await Promise.all([core.handle(st(0x71), ca), core.handle(st(0x72), cb)]);
    const us = (r: Uint8Array) => Buffer.from(r).readUInt32LE(36);
    expect(ra[7]).toBe(FrameStatus.OK);
    expect(rb[7]).toBe(FrameStatus.OK);
    // B arrived while A's call ran and joined the next: its worker_us covers (nearly all of) A's
    // call and all of its own (lower bounds only: load can only lengthen them).
    expect(d.durations.length).toBe(2);
    expect(us(rb)).toBeGreaterThanOrEqual(Math.floor(1000 * (d.durations[1]! + 0.5 * d.durations[0]!)));
  });

  test("fairness: a session flooding STEPs on many connections cannot starve another", async () => {
    const d = new SlowDrafter({ ...GEOM, drafterIdentity: IDENT_D, markovIdentity: IDENT_M });
    const core = new WorkerCore({
      drafter: d,
      maxSlots: 16,
      maxRowsPerStep: 64,
      maxSessions: 2,
      maxBatchEntries: 4,
    });
    const A = 0x81;
    const B = 0x82;
    let seqA = 0;
    const flood: FrameConn[] = Array.from({ length: 8 }, () => ({}));
    for (const c of flood) {
      await core.handle(frame({ op: Op.HELLO, seq: ++seqA, session: A }, encodeHello(helloFor(d))), c);
    }
    const cb: FrameConn = {};
    await core.handle(frame({ op: Op.HELLO, seq: 1, session: B }, encodeHello(helloFor(d))), cb);
    let stop = false;
    const calls = () => (core.stats().counters as Record<string, number>).drafter_calls!;
    // A: every connection keeps one STEP of 4 entries outstanding (a flood of 8 at a time).
    const floods = flood.map(async (c) => {
      while (!stop) {
        const entries = [0, 1, 2, 3].map((s) => entry({ slot: s }));
        const r = await core.handle(stepFrame({ seq: ++seqA, session: A, entries }), c);
        if (r[7] !== FrameStatus.OK) throw new Error(`flood STEP status ${r[7]}`);
      }
    });
    // B: 10 STEPs; each is drafted within the next two calls after it arrives.
    const waits: number[] = [];
    for (let i = 0; i < 10; i++) {
      await new Promise((r) => setTimeout(r, 1));
      const before = calls();
      const r = await core.handle(stepFrame({ seq: i + 2, session: B, entries: [entry({ slot: 0 })] }), cb);
      expect(r[7]).toBe(FrameStatus.OK);
      waits.push(calls() - before);
    }
    stop = true;
    await Promise.all(floods);
    expect(Math.max(...waits)).toBeLessThanOrEqual(3);
    // The flood was one STEP per call at a time (at most 4 entries), never B's STEP plus 8 of A's.
    expect(Math.max(...d.sizes)).toBeLessThanOrEqual(5);
  });
});
