// CONTRACT 12.1 metrics of a shared worker's solo calls (batcher.ts SOLO_TALLY): a STEP drafted
// at once, alone, is counted at once but its histogram observations (entries, STEPs 1, queue 0 s,
// call time) are tallied and folded in when SOLO_TALLY are pending or at the next read of the
// registry (snapshot, STATS, /metrics). Every read must see every call; nothing is held unbounded.
import { Registry } from "@tapwire/stats";
import { encodeHello, FrameStatus, frame, Op } from "@tapwire/wire";
import { describe, expect, test } from "vitest";
import { LONE_RUN, SOLO_TALLY } from "../src/batcher.js";
import type { FrameConn } from "../src/index.js";
import { NullDrafter, WorkerCore } from "../src/index.js";
import { entry, GEOM, helloFor, IDENT_D, IDENT_M, stepFrame } from "./helpers.js";

async function lone(): Promise<{ core: WorkerCore; registry: Registry; step: (n: number) => Promise<void> }> {
  const d = new NullDrafter({ ...GEOM, drafterIdentity: IDENT_D, markovIdentity: IDENT_M });
  const registry = new Registry({ prefix: "tapwire_worker_" });
  const core = new WorkerCore({ drafter: d, maxSlots: 4, maxRowsPerStep: 64, maxSessions: 4, registry });
  const c: FrameConn = {};
  const id = 0x7a11;
  const hello = frame({ op: Op.HELLO, seq: 1, session: id }, encodeHello(helloFor(d, { maxSlots: 4 })));
  expect((await core.handle(hello, c))[7]).toBe(FrameStatus.OK);
  let seq = 1;
  const step = async (n: number): Promise<void> => {
    const entries = Array.from({ length: n }, (_, slot) => entry({ slot }));
    const a = await core.handle(stepFrame({ seq: ++seq, session: id, entries }), c);
    expect(a[7]).toBe(FrameStatus.OK);
  };
  return { core, registry, step };
}

describe("CONTRACT 12.1 metrics: solo calls are tallied, and every read sees them", () => {
  test("a snapshot right after a few solo calls counts each (STEPs 1, queue 0, entries, call time)", async () => {
    const { core, step } = await lone();
    await step(2);
    await step(3);
    await step(1);
    const h = core.stats().histograms as Record<string, { count: number; sum: number; max: number }>;
    expect(h.batch_steps).toMatchObject({ count: 3, sum: 3 });
    expect(h.batch_entries).toMatchObject({ count: 3, sum: 6, max: 3 });
    expect(h.batch_queue_seconds!.count).toBe(3);
    expect(h.batch_call_seconds!.count).toBe(3);
    expect((core.stats().counters as Record<string, number>).drafter_calls).toBe(3);
  });

  test("the Prometheus text folds them in too, and reset forgets the pending ones", async () => {
    const { registry, step } = await lone();
    await step(2);
    await step(2);
    const text = await registry.prometheus();
    expect(text).toContain("tapwire_worker_batch_steps_count 2");
    expect(text).toContain("tapwire_worker_batch_entries_sum 4");
    await step(1);
    registry.reset();
    expect(registry.snapshot().histograms.batch_steps!.count).toBe(0);
    await step(1);
    expect(registry.snapshot().histograms.batch_entries).toMatchObject({ count: 1, sum: 1 });
  });

  test(`at most SOLO_TALLY (${SOLO_TALLY}) calls wait unobserved, read or not`, async () => {
    const { registry, step } = await lone();
    const steps = registry.histogram("batch_steps", { unit: "none" });
    const queue = registry.histogram("batch_queue_seconds", { unit: "seconds" });
    // The first calls of a lone session hold the event-loop turn (LONE_RUN), so its next STEP is
    // queued; from then on it is drafted at once, alone (a solo call).
    for (let i = 0; i < 2 * LONE_RUN; i++) await step(1);
    const before = registry.snapshot().histograms.batch_steps!.count;
    expect(before).toBe(2 * LONE_RUN);
    const queued = queue.max;
    for (let i = 0; i < SOLO_TALLY + 5; i++) await step(1);
    // Nothing read the registry: only the full tally was folded, the last 5 still wait.
    expect(steps.count).toBe(before + SOLO_TALLY);
    expect(registry.snapshot().histograms.batch_steps!.count).toBe(before + SOLO_TALLY + 5);
    expect(steps.count).toBe(before + SOLO_TALLY + 5);
    // Solo calls waited 0 s: the largest queue time is still one of the first calls'.
    expect(queue.max).toBe(queued);
  });
});
