// CONTRACT 12.1 "Batching", the batch gather (docs/worker.md "Batch gather"): after a call, the
// sessions it answered are awaited, so closed-loop sessions meet in one call instead of splitting
// into alternating groups; a lone session is never delayed; a missing session is waited for at
// most the bound, once; a closed session is not waited for; --batch-gather-us 0 turns it off.
// Every check is a condition (which STEPs one call drafted, counters), never a duration.
import { encodeHello, FrameStatus, frame, Op } from "@tapwire/wire";
import { describe, expect, test } from "vitest";
import { LONE_RUN } from "../src/batcher.js";
import { FLAGS, parseFlags, UsageError } from "../src/bin/flags.js";
import type { DraftBatchEntry, DraftOutput, FrameConn, WorkerCoreOptions } from "../src/index.js";
import { CORE_DEFAULTS, NullDrafter, WorkerCore } from "../src/index.js";
import { entry, GEOM, helloFor, IDENT_D, IDENT_M, stepFrame } from "./helpers.js";

/** A NullDrafter that answers on the next event-loop turn (like ONNX Runtime's run). */
class AsyncDrafter extends NullDrafter {
  /** Entries (here: STEPs of one entry) of every call, in order. */
  readonly sizes: number[] = [];
  override draft(batch: readonly DraftBatchEntry[], out: DraftOutput): Promise<void> {
    this.sizes.push(batch.length);
    return new Promise((resolve) =>
      setImmediate(() => {
        super.draft(batch, out);
        resolve();
      }),
    );
  }
}

interface Rig {
  core: WorkerCore;
  d: AsyncDrafter;
  conns: FrameConn[];
  seq: number[];
  ids: number[];
}

async function rig(n: number, over: Partial<WorkerCoreOptions> = {}): Promise<Rig> {
  const d = new AsyncDrafter({ ...GEOM, drafterIdentity: IDENT_D, markovIdentity: IDENT_M });
  const core = new WorkerCore({ drafter: d, maxSlots: 4, maxRowsPerStep: 64, maxSessions: 4, ...over });
  const r: Rig = { core, d, conns: [], seq: [], ids: [] };
  for (let k = 0; k < n; k++) {
    const c: FrameConn = {};
    const id = 0x9100 + k;
    const a = await core.handle(
      frame({ op: Op.HELLO, seq: 1, session: id }, encodeHello(helloFor(d, { maxSlots: 4 }))),
      c,
    );
    expect(a[7]).toBe(FrameStatus.OK);
    r.conns.push(c);
    r.seq.push(1);
    r.ids.push(id);
  }
  return r;
}

/** Session k's next STEP (one entry), handed to the core now; resolves with its reply. */
function step(r: Rig, k: number): Promise<Uint8Array> {
  const msg = stepFrame({ seq: ++r.seq[k]!, session: r.ids[k]!, entries: [entry({ slot: 0 })] });
  const p = r.core.handle(msg, r.conns[k]!);
  return Promise.resolve(p).then((a) => {
    expect(a[7]).toBe(FrameStatus.OK);
    return a;
  });
}

/** One closed-loop round: every session in `ks` sends its STEP in the same turn; the calls it took. */
async function round(r: Rig, ks: number[]): Promise<number[]> {
  const before = r.d.sizes.length;
  await Promise.all(ks.map((k) => step(r, k)));
  return r.d.sizes.slice(before);
}

const counter = (core: WorkerCore, name: string): number =>
  (core.stats().counters as Record<string, number>)[name] ?? 0;

describe("CONTRACT 12.1 batching: the batch gather", () => {
  test("closed-loop sessions meet in one call (without the gather: a solo call, then the rest)", async () => {
    const r = await rig(3);
    const all = [0, 1, 2];
    const rounds: number[][] = [];
    for (let i = 0; i < 6; i++) rounds.push(await round(r, all));
    // The first round cannot gather (nobody was answered yet): A alone, B and C merged.
    expect(rounds[0]).toEqual([1, 2]);
    // From then on the sessions the last call answered are awaited: every round is one call.
    for (const calls of rounds.slice(2)) expect(calls).toEqual([3]);
    expect(counter(r.core, "batch_gathers")).toBeGreaterThan(0);
  });

  test("a lone session is drafted at once: the gather never delays it", async () => {
    const r = await rig(1);
    for (let i = 0; i < 5; i++) {
      const before = r.d.sizes.length;
      const p = step(r, 0);
      // The drafter was called within handle(), before any timer or turn could pass.
      expect(r.d.sizes.length).toBe(before + 1);
      await p;
    }
    expect(counter(r.core, "batch_gathers")).toBe(0);
  });

  test("a session that does not come back is awaited at most the bound, and only once", async () => {
    const r = await rig(2);
    for (let i = 0; i < 3; i++) await round(r, [0, 1]);
    expect(await round(r, [0, 1])).toEqual([2]);
    // (The first round's gather, before the sessions met, ended by its bound too.)
    const t0 = counter(r.core, "batch_gather_timeouts");
    // Only A goes on: its STEP waits for B (a gather), which ends by its bound.
    expect(await round(r, [0])).toEqual([1]);
    expect(counter(r.core, "batch_gather_timeouts")).toBe(t0 + 1);
    // B was not in that call, so A's next STEPs are drafted at once.
    for (let i = 0; i < 3; i++) {
      const before = r.d.sizes.length;
      const p = step(r, 0);
      expect(r.d.sizes.length).toBe(before + 1);
      await p;
    }
    expect(counter(r.core, "batch_gather_timeouts")).toBe(t0 + 1);
  });

  test("a session whose connections closed is not awaited", async () => {
    const r = await rig(2);
    for (let i = 0; i < 3; i++) await round(r, [0, 1]);
    expect(await round(r, [0, 1])).toEqual([2]);
    const g0 = counter(r.core, "batch_gathers");
    r.core.connectionClosed(r.conns[1]!);
    const before = r.d.sizes.length;
    const p = step(r, 0);
    expect(r.d.sizes.length).toBe(before + 1);
    await p;
    expect(counter(r.core, "batch_gathers")).toBe(g0);
  });

  test("batchGatherUs 0 turns it off: the rounds stay split", async () => {
    const r = await rig(3, { batchGatherUs: 0 });
    for (let i = 0; i < 4; i++) expect(await round(r, [0, 1, 2])).toEqual([1, 2]);
    expect(counter(r.core, "batch_gathers")).toBe(0);
  });

  test("batchGatherUs is validated (named) and --batch-gather-us is a documented flag", () => {
    const d = new NullDrafter({ ...GEOM, drafterIdentity: IDENT_D, markovIdentity: IDENT_M });
    expect(() => new WorkerCore({ drafter: d, maxSessions: 2, batchGatherUs: -1 })).toThrow(/batchGatherUs/);
    expect(() => new WorkerCore({ drafter: d, maxSessions: 2, batchGatherUs: 1.5 })).toThrow(/batchGatherUs/);
    expect(FLAGS["batch-gather-us"].default).toBe(CORE_DEFAULTS.batchGatherUs);
    expect(() => parseFlags(["--batch-gather-us", "-3"])).toThrow(UsageError);
  });
});

describe("CONTRACT 12.1 batching: a synchronous drafter and a lone session", () => {
  /** A NullDrafter (synchronous) that records the entries of each call. */
  class SyncDrafter extends NullDrafter {
    readonly sizes: number[] = [];
    override draft(batch: readonly DraftBatchEntry[], out: DraftOutput): void {
      this.sizes.push(batch.length);
      super.draft(batch, out);
    }
  }

  async function syncRig(): Promise<{
    core: WorkerCore;
    d: SyncDrafter;
    send: (k: number) => Promise<Uint8Array>;
  }> {
    const d = new SyncDrafter({ ...GEOM, drafterIdentity: IDENT_D, markovIdentity: IDENT_M });
    // The batch gather off: these tests are about the turn a synchronous call holds.
    const core = new WorkerCore({
      drafter: d,
      maxSlots: 4,
      maxRowsPerStep: 64,
      maxSessions: 4,
      batchGatherUs: 0,
    });
    const conns: FrameConn[] = [{}, {}];
    const seq = [1, 1];
    for (const k of [0, 1]) {
      const hello = frame(
        { op: Op.HELLO, seq: 1, session: 0x9200 + k },
        encodeHello(helloFor(d, { maxSlots: 4 })),
      );
      expect((await core.handle(hello, conns[k]!))[7]).toBe(FrameStatus.OK);
    }
    const send = (k: number) =>
      Promise.resolve(
        core.handle(
          stepFrame({ seq: ++seq[k]!, session: 0x9200 + k, entries: [entry({ slot: 0 })] }),
          conns[k]!,
        ),
      );
    return { core, d, send };
  }

  test("after LONE_RUN calls of one session alone the turn is not held: another session's STEP is drafted at once", async () => {
    const { d, send } = await syncRig();
    for (let i = 0; i < LONE_RUN; i++) {
      // Each STEP in a turn of its own (the previous call's turn has ended).
      await new Promise((r) => setImmediate(r));
      await send(0);
    }
    await new Promise((r) => setImmediate(r));
    const before = d.sizes.length;
    const a = send(0);
    // A's call ended; without the lone-run rule B would be queued until the turn ends.
    const b = send(1);
    expect(d.sizes.length).toBe(before + 2);
    await Promise.all([a, b]);
    expect(d.sizes.slice(before)).toEqual([1, 1]);
  });

  test("with two sessions sending, a synchronous call holds its turn: STEPs of that turn are merged", async () => {
    const { d, send } = await syncRig();
    for (let i = 0; i < LONE_RUN; i++) {
      await new Promise((r) => setImmediate(r));
      await Promise.all([send(0), send(1)]);
    }
    await new Promise((r) => setImmediate(r));
    const before = d.sizes.length;
    await Promise.all([send(0), send(1), send(0)]);
    // A alone (nothing ran), then B and A's next STEP read in the same turn, drafted together.
    expect(d.sizes.slice(before)).toEqual([1, 2]);
  });
});

describe("CONTRACT 12.1 batching: the gather of a cheap drafter", () => {
  test("a bound below a timer tick gathers for one event-loop turn, not a 1 ms timer", async () => {
    // 500 µs: below 1 ms whatever the calls take on a loaded machine.
    const r = await rig(2, { batchGatherUs: 500 });
    for (let i = 0; i < 3; i++) await round(r, [0, 1]);
    expect(await round(r, [0, 1])).toEqual([2]);
    const before = r.d.sizes.length;
    const p = step(r, 0);
    // A waits for B; with a 1 ms timer the call would not start within two turns.
    expect(r.d.sizes.length).toBe(before);
    await new Promise((res) => setImmediate(res));
    await new Promise((res) => setImmediate(res));
    expect(r.d.sizes.length).toBe(before + 1);
    await p;
  });
});
