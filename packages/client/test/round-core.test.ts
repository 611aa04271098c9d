// Unit tests of RoundCore's ring and sync bookkeeping against a fake client whose "worker" is a
// model of CONTRACT 7.1/7.2 (the real worker is exercised in the integration tests).
import {
  APP_HEADER_SIZE,
  beginStepReply,
  checkReplyValues,
  decodeStepRequest,
  EntryFlag,
  maxStepBodySize,
  ReqStatus,
  rowsOffsetFor,
  splitFrame,
  stepReplyBodySize,
  writeStepPrefix,
} from "@tapwire/wire";
import fc from "fast-check";
import { describe, expect, test } from "vitest";
import {
  ClientError,
  DepthPolicy,
  type RoundClient,
  RoundCore,
  type RoundRequest,
  type StepCall,
  type StepOutcome,
  type StepOutcomeReason,
} from "../src/index.js";

const W = 4;
const N = 3;
const ROW = 4; // numTaps 1, hidden 2
const V = 100;

interface ModelSlot {
  gen: number;
  first: number; // position of the window's first row
  rows: Uint8Array[];
}

type Fault =
  | null
  | "timeout_applied"
  | "timeout_not_applied"
  | "bad_reply_applied"
  | "frame_no_session"
  | "frame_busy"
  | "reconnect_keep"
  | "reconnect_drop"
  | "down"
  | "skip_one";

/** A fake RoundClient whose worker is a model of CONTRACT 7.1 / 7.2. */
class FakeClient implements RoundClient {
  readonly options = {
    window: W,
    numSpec: N,
    rowBytes: ROW,
    maxSlots: 6,
    maxRowsPerStep: 10,
    sampled: false,
    wantMargin: true,
  };
  readonly sendBuffer: Uint8Array;
  readonly replyBuf: Uint8Array;
  disabled = false;
  epoch = 1;
  up = true;
  slots = new Map<number, ModelSlot>();
  fault: Fault = null;
  steps: { entries: { slot: number; flags: number; nRows: number; rowStart: number }[] }[] = [];
  newSessions: string[] = [];
  resets = 0;
  partsSteps = 0;
  /** The `rows` parts of every STEP (the array copied, the views as given), null when staged. */
  rowsSeen: (Uint8Array[] | null)[] = [];

  constructor(maxRowsPerStep = 10) {
    this.options.maxRowsPerStep = maxRowsPerStep;
    this.sendBuffer = new Uint8Array(APP_HEADER_SIZE + maxStepBodySize({ ...this.options }));
    this.replyBuf = new Uint8Array(
      APP_HEADER_SIZE + stepReplyBodySize({ nReq: 6, numSpec: N, margin: true, sampled: false }),
    );
  }
  connectionEpoch(): number | null {
    return this.up && !this.disabled ? this.epoch : null;
  }
  rowsOffset(n: number): number {
    return APP_HEADER_SIZE + rowsOffsetFor(n, false);
  }
  newSession(reason: string): void {
    this.newSessions.push(reason);
    this.slots.clear();
    this.epoch++;
  }
  async reset(): Promise<void> {
    this.resets++;
    this.slots.clear();
  }

  // CONTRACT 7.1 / 7.2 applied to the model; returns [status, held] per entry
  apply(body: Uint8Array): { status: number[]; held: number[]; req: ReturnType<typeof decodeStepRequest> } {
    const req = decodeStepRequest(body, { ...this.options });
    const status: number[] = [];
    const held: number[] = [];
    let off = 0;
    for (const e of req.entries) {
      const carried: Uint8Array[] = [];
      for (let r = 0; r < e.nRows; r++) {
        carried.push(Uint8Array.from(req.rows.subarray((off + r) * ROW, (off + r + 1) * ROW)));
      }
      off += e.nRows;
      let s = this.slots.get(e.slot);
      if (s === undefined || ((e.generation - s.gen) >>> 0 > 0 && (e.generation - s.gen) >>> 0 < 2 ** 31)) {
        s = { gen: e.generation, first: 0, rows: [] };
        this.slots.set(e.slot, s);
      } else if (e.generation !== s.gen) {
        status.push(ReqStatus.STALE_GENERATION);
        held.push(0);
        continue;
      }
      const end = s.first + s.rows.length;
      if (e.flags & EntryFlag.RESYNC) {
        s.rows = carried.slice(-W);
        s.first = e.rowStart + e.nRows - s.rows.length;
      } else if (e.nRows > 0) {
        if ((s.rows.length > 0 && e.rowStart === end) || (s.rows.length === 0 && e.rowStart === 0)) {
          s.rows.push(...carried);
          if (s.rows.length === 0) s.first = e.rowStart;
          while (s.rows.length > W) {
            s.rows.shift();
            s.first++;
          }
        } else {
          s.rows = carried.slice(-W);
          s.first = e.rowStart + e.nRows - s.rows.length;
        }
      }
      if (e.flags & EntryFlag.RELEASE) {
        s.rows = [];
        s.first = 0;
        status.push(ReqStatus.OK);
        held.push(0);
        continue;
      }
      const expected = Math.min(W, e.anchorPos);
      const h = s.first + s.rows.length === e.anchorPos ? s.rows.length : 0;
      held.push(h);
      status.push(h === expected ? ReqStatus.OK : h > 0 ? ReqStatus.PARTIAL_WINDOW : ReqStatus.NEED_RESYNC);
    }
    return { status, held, req };
  }

  async step(call: StepCall): Promise<StepOutcome> {
    const fail = (reason: StepOutcomeReason, unknownApply: boolean): StepOutcome => ({
      ok: false,
      reason,
      unknownApply,
      rttUs: 1,
      reply: null,
      error: reason,
    });
    if (call.epoch !== this.epoch) return fail("reconnected", false);
    const n = call.nEntries ?? call.entries.length;
    this.rowsSeen.push(call.rows === undefined ? null : [...call.rows]);
    if (call.rows !== undefined) {
      // parts mode: gather them where a staged STEP would hold them
      let off = this.rowsOffset(n);
      for (const r of call.rows) {
        this.sendBuffer.set(r, off);
        off += r.length;
      }
      this.partsSteps++;
    }
    const len = writeStepPrefix(this.sendBuffer, {
      seq: 1,
      session: 1,
      stepId: call.stepId,
      entries: call.entries,
      nEntries: n,
      nRows: call.nRows,
      rowBytes: ROW,
    });
    const { body } = splitFrame(this.sendBuffer, len);
    this.steps.push({
      entries: call.entries
        .slice(0, n)
        .map((e) => ({ slot: e.slot, flags: e.flags, nRows: e.nRows, rowStart: e.rowStart })),
    });
    const fault = this.fault;
    this.fault = null;
    switch (fault) {
      case "timeout_not_applied":
        decodeStepRequest(body, { ...this.options });
        this.up = false;
        this.epoch++;
        return fail("timeout", true);
      case "frame_no_session":
      case "frame_busy":
        decodeStepRequest(body, { ...this.options });
        this.up = false;
        this.epoch++;
        return fail(fault, false);
      default:
        break;
    }
    const { status, held, req } = this.apply(body);
    if (fault === "timeout_applied" || fault === "bad_reply_applied") {
      this.up = false;
      this.epoch++;
      return fail(fault === "timeout_applied" ? "timeout" : "bad_reply", true);
    }
    const r = beginStepReply(this.replyBuf, {
      seq: 1,
      session: 1,
      stepId: call.stepId,
      nReq: n,
      numSpec: N,
      margin: true,
      sampled: false,
    });
    for (let i = 0; i < n; i++) {
      const e = req.entries[i]!;
      let st = status[i]!;
      if (
        fault === "skip_one" &&
        i === 0 &&
        st <= ReqStatus.PARTIAL_WINDOW &&
        !(e.flags & EntryFlag.RELEASE)
      ) {
        st = ReqStatus.SKIPPED;
      }
      r.status[i] = st;
      r.windowRows[i] = held[i]!;
      r.generation[i] = e.generation;
      if (e.flags & EntryFlag.NEED_DRAFT && st <= ReqStatus.PARTIAL_WINDOW) {
        const k = e.nOut === 0 ? N : Math.min(e.nOut, N);
        for (let j = 0; j < k; j++) {
          r.draftIds[i * N + j] = (e.anchorToken + j + 1) % V;
          r.confidence[i * N + j] = 0.5;
          r.margin![i * N + j] = 1;
        }
      }
    }
    checkReplyValues(r, {
      stepId: call.stepId,
      vocabSize: V,
      window: W,
      numSpec: N,
      entries: call.entries,
      nEntries: n,
    });
    return { ok: true, reason: "ok", unknownApply: false, rttUs: 1, reply: r, error: null };
  }

  windowOf(slot: number): { first: number; rows: Uint8Array[] } | null {
    const s = this.slots.get(slot);
    return s === undefined ? null : { first: s.first, rows: s.rows };
  }
}

function rows(start: number, n: number, slot: number): Uint8Array {
  const b = new Uint8Array(n * ROW);
  for (let i = 0; i < n; i++) {
    const v = ((start + i) * 7 + slot * 31) & 0xff;
    b.set([v, slot, (start + i) & 0xff, 0xaa], i * ROW);
  }
  return b;
}

// The engine side: per slot a running request that accepts some tokens each round.
class Engine {
  reqs = new Map<number, { gen: number; anchor: number; pendingFrom: number }>();
  nextGen = 1;
  start(slot: number, prompt: number): void {
    this.reqs.set(slot, { gen: this.nextGen++, anchor: prompt, pendingFrom: 0 });
  }
  accept(slot: number, n: number): void {
    const r = this.reqs.get(slot)!;
    r.anchor += n;
  }
  /**
   * With `ring`, rows of up to W positions are written straight into the views
   * `core.rowsTarget` gives (zero-copy staging) for the requests `ring` picks.
   */
  input(core?: RoundCore, ring?: (slot: number, anchor: number) => boolean): RoundRequest[] {
    const out: RoundRequest[] = [];
    for (const [slot, r] of this.reqs) {
      const n = r.anchor - r.pendingFrom;
      if (core !== undefined && n > 0 && n <= W && (ring?.(slot, r.anchor) ?? true)) {
        const views = core.rowsTarget(slot, r.gen, r.pendingFrom, n);
        const src = rows(r.pendingFrom, n, slot);
        let off = 0;
        for (const v of views) {
          v.set(src.subarray(off, off + v.length));
          off += v.length;
        }
        expect(off).toBe(src.length);
        out.push({ slot, generation: r.gen, anchorPos: r.anchor, anchorToken: r.anchor % V, rowsInRing: n });
      } else {
        out.push({
          slot,
          generation: r.gen,
          anchorPos: r.anchor,
          anchorToken: r.anchor % V,
          newRows: n > 0 ? rows(r.pendingFrom, n, slot) : null,
        });
      }
      r.pendingFrom = r.anchor;
    }
    return out;
  }
}

function expectInSync(core: RoundCore, fake: FakeClient, engine: Engine): void {
  for (const [slot, r] of engine.reqs) {
    const view = core.slotView(slot);
    const win = fake.windowOf(slot);
    expect(win, `slot ${slot}`).not.toBeNull();
    const expectedRows = Math.min(W, r.anchor);
    expect(view.ringEnd).toBe(r.anchor);
    expect(win!.first + win!.rows.length).toBe(r.anchor);
    expect(win!.rows.length).toBe(expectedRows);
    const ring = view.rows.subarray(view.rows.length - expectedRows * ROW);
    expect(Buffer.concat(win!.rows)).toEqual(Buffer.from(ring));
  }
}

describe("RoundCore (CONTRACT 7.5) with a fake client", () => {
  test("rows leave as views of the rings by default (parts), the same view objects every W rounds; stage copies", async () => {
    const fake = new FakeClient();
    const core = new RoundCore({ client: fake });
    expect(core.rowsMode).toBe("parts");
    const eng = new Engine();
    eng.start(0, 2);
    eng.start(1, 3);
    await core.round({ requests: eng.input() });
    const sent: Uint8Array[][] = [];
    const given: Uint8Array[] = [];
    for (let r = 0; r < 2 * W; r++) {
      eng.accept(0, 1);
      eng.accept(1, 1);
      const input = eng.input();
      given.push(input[0]!.newRows!);
      const res = await core.round({ requests: input });
      expect(res.outcome).toBe("ok");
      expect(res.resynced).toBe(0);
      const parts = fake.rowsSeen.at(-1)!;
      expect(parts).toHaveLength(2);
      // the ring's copy of the new row, not the engine's buffer
      expect(Buffer.from(parts[0]!)).toEqual(Buffer.from(given[r]!));
      expect(parts[0]!.buffer).not.toBe(given[r]!.buffer);
      sent.push(parts);
    }
    for (let r = 0; r < W; r++) {
      expect(sent[r + W]![0]).toBe(sent[r]![0]);
      expect(sent[r + W]![1]).toBe(sent[r]![1]);
      expect(sent[r]![0]!.buffer).toBe(sent[0]![0]!.buffer);
    }
    expectInSync(core, fake, eng);

    const fake2 = new FakeClient();
    const staged = new RoundCore({ client: fake2, rowsMode: "stage" });
    const eng2 = new Engine();
    eng2.start(0, 2);
    await staged.round({ requests: eng2.input() });
    eng2.accept(0, 1);
    await staged.round({ requests: eng2.input() });
    expect(fake2.rowsSeen).toEqual([null, null]);
    expect(fake2.partsSteps).toBe(0);
    expectInSync(staged, fake2, eng2);
  });

  test("new request resyncs with the whole ring, then only new rows", async () => {
    const fake = new FakeClient();
    const core = new RoundCore({ client: fake });
    const eng = new Engine();
    eng.start(0, 6);
    let res = await core.round({ requests: eng.input() });
    expect(res.outcome).toBe("ok");
    expect(fake.steps[0]!.entries).toEqual([
      { slot: 0, flags: EntryFlag.NEED_DRAFT | EntryFlag.RESYNC, nRows: W, rowStart: 2 },
    ]);
    expect(res.drafts[0]!.reason).toBe("ok");
    expect(res.drafts[0]!.k).toBe(N);
    expect(Array.from(res.drafts[0]!.ids)).toEqual([7, 8, 9]);
    eng.accept(0, 2);
    res = await core.round({ requests: eng.input() });
    expect(fake.steps[1]!.entries).toEqual([{ slot: 0, flags: EntryFlag.NEED_DRAFT, nRows: 2, rowStart: 6 }]);
    expect(res.resynced).toBe(0);
    expectInSync(core, fake, eng);
    // no new rows: an entry with no rows still drafts
    res = await core.round({ requests: eng.input() });
    expect(fake.steps[2]!.entries[0]!.nRows).toBe(0);
    expect(res.drafts[0]!.reason).toBe("ok");
  });

  test("target-only rounds yield to the event loop, so the connect loop's timers run", async () => {
    const fake = new FakeClient();
    fake.up = false;
    const core = new RoundCore({ client: fake });
    let fired = false;
    const t = setTimeout(() => {
      fired = true;
    }, 1);
    // An engine awaiting round() back to back: without a macrotask turn per target-only round
    // this loop would spin in the microtask queue and the timer could never fire.
    let rounds = 0;
    while (!fired && rounds < 200_000) {
      const r = await core.round({ requests: [] });
      expect(r.outcome).toBe("not_ready");
      rounds++;
    }
    clearTimeout(t);
    expect(fired).toBe(true);
  });

  test("epoch change resyncs every slot; target-only while down", async () => {
    const fake = new FakeClient();
    const core = new RoundCore({ client: fake });
    const eng = new Engine();
    eng.start(0, 3);
    eng.start(1, 5);
    await core.round({ requests: eng.input() });
    fake.up = false;
    eng.accept(0, 1);
    eng.accept(1, 2);
    const down = await core.round({ requests: eng.input() });
    expect(down.outcome).toBe("not_ready");
    expect(down.drafts.map((d) => d.reason)).toEqual(["not_ready", "not_ready"]);
    expect(fake.steps.length).toBe(1);
    fake.up = true;
    fake.epoch++; // reconnected, worker kept windows (same session) but RoundCore cannot know
    eng.accept(0, 1);
    const res = await core.round({ requests: eng.input() });
    expect(res.resynced).toBe(2);
    expect(fake.steps[1]!.entries.every((e) => e.flags & EntryFlag.RESYNC)).toBe(true);
    expectInSync(core, fake, eng);
  });

  test("unknown outcomes resync the STEP's slots; not-applied statuses resend the same rows", async () => {
    const fake = new FakeClient();
    const core = new RoundCore({ client: fake });
    const eng = new Engine();
    eng.start(2, 4);
    await core.round({ requests: eng.input() });
    eng.accept(2, 1);
    fake.fault = "timeout_applied";
    const t = await core.round({ requests: eng.input() });
    expect(t.outcome).toBe("timeout");
    expect(t.drafts[0]!.k).toBe(0);
    expect(core.slotView(2).needResync).toBe(true);
    fake.up = true;
    eng.accept(2, 1);
    await core.round({ requests: eng.input() });
    expect(fake.steps.at(-1)!.entries[0]!.flags & EntryFlag.RESYNC).toBeTruthy();
    expectInSync(core, fake, eng);

    fake.fault = "frame_no_session";
    eng.accept(2, 2);
    const f = await core.round({ requests: eng.input() });
    expect(f.outcome).toBe("frame_no_session");
    fake.up = true;
    await core.round({ requests: eng.input() });
    expectInSync(core, fake, eng);
  });

  test("PARTIAL_WINDOW / NEED_RESYNC trigger a resync", async () => {
    const fake = new FakeClient();
    const core = new RoundCore({ client: fake });
    const eng = new Engine();
    eng.start(0, 5);
    await core.round({ requests: eng.input() });
    fake.slots.get(0)!.rows.splice(0, 2); // the worker lost rows: it will answer PARTIAL_WINDOW
    fake.slots.get(0)!.first += 2;
    eng.accept(0, 1);
    const r = await core.round({ requests: eng.input() });
    expect(r.drafts[0]!.reason).toBe("partial_window");
    expect(core.slotView(0).needResync).toBe(true);
    await core.round({ requests: eng.input() });
    expect(fake.steps.at(-1)!.entries[0]!.flags & EntryFlag.RESYNC).toBeTruthy();
    expectInSync(core, fake, eng);
    fake.slots.get(0)!.rows = []; // NEED_RESYNC next
    const r2 = await core.round({ requests: eng.input() });
    expect(r2.drafts[0]!.reason).toBe("need_resync");
    expect(r2.drafts[0]!.k).toBe(0);
    await core.round({ requests: eng.input() });
    expectInSync(core, fake, eng);
  });

  test("entries past max_rows_per_step are deferred whole, and go first next round", async () => {
    const fake = new FakeClient(6);
    const core = new RoundCore({ client: fake });
    const eng = new Engine();
    eng.start(0, 4);
    eng.start(1, 4);
    const r = await core.round({ requests: eng.input() });
    expect(r.deferred).toBe(1);
    expect(r.drafts[1]!.reason).toBe("deferred");
    expect(fake.steps[0]!.entries.map((e) => e.slot)).toEqual([0]);
    const r2 = await core.round({ requests: eng.input() });
    expect(fake.steps[1]!.entries.map((e) => e.slot)).toEqual([1, 0]);
    expect(r2.deferred).toBe(0);
    expectInSync(core, fake, eng);
  });

  test("RELEASE for finished requests, retried until answered; a new generation resyncs", async () => {
    const fake = new FakeClient();
    const core = new RoundCore({ client: fake });
    const eng = new Engine();
    eng.start(0, 3);
    eng.start(1, 3);
    await core.round({ requests: eng.input() });
    eng.reqs.delete(1);
    fake.fault = "frame_busy";
    await core.round({ requests: eng.input(), release: [1] });
    expect(fake.steps[1]!.entries.find((e) => e.slot === 1)!.flags).toBe(EntryFlag.RELEASE);
    fake.up = true;
    await core.round({ requests: eng.input() });
    expect(fake.steps[2]!.entries.find((e) => e.slot === 1)!.flags).toBe(EntryFlag.RELEASE);
    expect(fake.windowOf(1)!.rows.length).toBe(0);
    await core.round({ requests: eng.input() });
    expect(fake.steps[3]!.entries.find((e) => e.slot === 1)).toBeUndefined();
    eng.start(1, 2);
    await core.round({ requests: eng.input() });
    expect(fake.steps[4]!.entries.find((e) => e.slot === 1)!.flags & EntryFlag.RESYNC).toBeTruthy();
    expectInSync(core, fake, eng);
  });

  test("STALE_GENERATION starts a new session", async () => {
    const fake = new FakeClient();
    const core = new RoundCore({ client: fake });
    const eng = new Engine();
    eng.start(0, 3);
    await core.round({ requests: eng.input() });
    fake.slots.get(0)!.gen = 1000; // the worker holds a newer generation than rank 0 ever sent
    const r = await core.round({ requests: eng.input() });
    expect(r.drafts[0]!.reason).toBe("stale_generation");
    expect(fake.newSessions.length).toBe(1);
    await core.round({ requests: eng.input() });
    expectInSync(core, fake, eng);
  });

  test("input the worker would refuse is thrown before anything is sent", async () => {
    const fake = new FakeClient();
    const core = new RoundCore({ client: fake });
    const base = { generation: 1, anchorPos: 2, anchorToken: 1, newRows: rows(0, 2, 0) };
    const cases: [RoundRequest[], string][] = [
      [[{ ...base, slot: 6 }], "slot 6"],
      [
        [
          { ...base, slot: 0 },
          { ...base, slot: 0 },
        ],
        "twice",
      ],
      [[{ ...base, slot: 0, nOut: 4 }], "nOut"],
      [[{ ...base, slot: 0, newRows: new Uint8Array(3) }], "multiple"],
      [[{ ...base, slot: 0, newRowsStart: 1 }], "do not end"],
    ];
    for (const [reqs, msg] of cases) {
      await expect(core.round({ requests: reqs })).rejects.toThrow(ClientError);
      await expect(core.round({ requests: reqs })).rejects.toThrow(msg);
    }
    expect(fake.steps.length).toBe(0);
    await core.round({ requests: [{ ...base, slot: 0, generation: 5 }] });
    await expect(core.round({ requests: [{ ...base, slot: 0, generation: 4 }] })).rejects.toThrow("older");
    await expect(
      core.round({ requests: [{ ...base, slot: 0, generation: 5, anchorPos: 4, newRows: rows(3, 1, 0) }] }),
    ).rejects.toThrow("ring ends at 2");
  });

  test("rowsTarget: the engine writes rows into the ring and they leave from there, never copied (CONTRACT 7.5)", async () => {
    const fake = new FakeClient();
    const core = new RoundCore({ client: fake });
    const eng = new Engine();
    eng.start(0, 3); // a new request: its prompt rows written in place too
    eng.start(1, 2);
    let res = await core.round({ requests: eng.input(core) });
    expect(res.outcome).toBe("ok");
    expect(res.resynced).toBe(2);
    expectInSync(core, fake, eng);
    for (let r = 0; r < 3 * W; r++) {
      eng.accept(0, 1 + (r % 3)); // 1..3 rows: some ranges wrap the ring (two views)
      eng.accept(1, 1);
      const targets: Uint8Array[][] = [];
      const input: RoundRequest[] = [];
      for (const [slot, q] of eng.reqs) {
        const n = q.anchor - q.pendingFrom;
        const views = core.rowsTarget(slot, q.gen, q.pendingFrom, n);
        targets.push([...views]);
        const src = rows(q.pendingFrom, n, slot);
        let off = 0;
        for (const v of views) {
          v.set(src.subarray(off, off + v.length));
          off += v.length;
        }
        input.push({ slot, generation: q.gen, anchorPos: q.anchor, anchorToken: 1, rowsInRing: n });
        q.pendingFrom = q.anchor;
      }
      res = await core.round({ requests: input });
      expect(res.outcome).toBe("ok");
      expect(res.resynced).toBe(0);
      // the STEP's row parts are the very views the engine wrote into
      expect(fake.rowsSeen.at(-1)).toEqual(targets.flat());
      for (const [i, v] of fake.rowsSeen.at(-1)!.entries()) expect(v).toBe(targets.flat()[i]);
      expectInSync(core, fake, eng);
    }
  });

  test("rowsTarget: a reservation is checked against the round; bad arguments throw before anything changes", async () => {
    const fake = new FakeClient();
    const core = new RoundCore({ client: fake });
    await core.round({
      requests: [{ slot: 0, generation: 2, anchorPos: 2, anchorToken: 1, newRows: rows(0, 2, 0) }],
    });
    expect(() => core.rowsTarget(6, 2, 2, 1)).toThrow("slot 6");
    expect(() => core.rowsTarget(0, 2, 2, 0)).toThrow("outside 1..4");
    expect(() => core.rowsTarget(0, 2, 2, W + 1)).toThrow("outside 1..4");
    expect(() => core.rowsTarget(0, 2, 3, 1)).toThrow("ring ends at 2");
    expect(() => core.rowsTarget(0, 1, 2, 1)).toThrow("older");
    expect(() => core.rowsTarget(0, 2, 0xffffffff, 1)).toThrow("u32");
    const one = { slot: 0, generation: 2, anchorPos: 3, anchorToken: 1 };
    // no reservation yet
    await expect(core.round({ requests: [{ ...one, rowsInRing: 1 }] })).rejects.toThrow("reservation (none)");
    core.rowsTarget(0, 2, 2, 1)[0]!.set(rows(2, 1, 0));
    await expect(core.round({ requests: [{ ...one, anchorPos: 4, rowsInRing: 2 }] })).rejects.toThrow(
      "1 rows from 2, generation 2",
    );
    await expect(core.round({ requests: [{ ...one, generation: 3, rowsInRing: 1 }] })).rejects.toThrow(
      "reservation",
    );
    await expect(
      core.round({ requests: [{ ...one, rowsInRing: 1, newRows: rows(2, 1, 0) }] }),
    ).rejects.toThrow("both newRows and rowsInRing");
    await expect(core.round({ requests: [{ ...one, rowsInRing: 0.5 }] })).rejects.toThrow("rowsInRing 0.5");
    expect(fake.steps.length).toBe(1);
    const ok = await core.round({ requests: [{ ...one, rowsInRing: 1 }] });
    expect(ok.outcome).toBe("ok");
    expect(core.slotView(0).ringEnd).toBe(3);
    expect(Buffer.from(fake.windowOf(0)!.rows.at(-1)!)).toEqual(Buffer.from(rows(2, 1, 0)));
    // consumed: the same rowsInRing again has no reservation
    await expect(core.round({ requests: [{ ...one, anchorPos: 4, rowsInRing: 1 }] })).rejects.toThrow(
      "(none)",
    );
    // a released generation cannot take rows; a newer one can, and empties the old ring
    await core.round({ requests: [], release: [0] });
    expect(() => core.rowsTarget(0, 2, 3, 1)).toThrow("released");
    core.rowsTarget(0, 7, 0, 2);
    expect(core.slotView(0).rows.length).toBe(0);
  });

  test("rowsTarget: rows it overwrites leave the ring at once, so a round that never comes cannot resync stale rows", async () => {
    const fake = new FakeClient();
    const core = new RoundCore({ client: fake });
    await core.round({
      requests: [{ slot: 0, generation: 1, anchorPos: W, anchorToken: 1, newRows: rows(0, W, 0) }],
    });
    expect(core.slotView(0)).toMatchObject({ ringStart: 0, ringEnd: W });
    core.rowsTarget(0, 1, W, 2);
    // positions 0 and 1 shared their ring rows with W and W + 1: no longer claimed
    const v = core.slotView(0);
    expect(v).toMatchObject({ ringStart: 2, ringEnd: W });
    expect(Buffer.from(v.rows)).toEqual(Buffer.from(rows(2, W - 2, 0)));
  });

  test("depth policy spends the budget on the best prefixes", async () => {
    const fake = new FakeClient();
    const core = new RoundCore({ client: fake, depthPolicy: new DepthPolicy({ budget: 4 }) });
    const eng = new Engine();
    eng.start(0, 3);
    eng.start(1, 3);
    const r = await core.round({ requests: eng.input() });
    // equal gains 0.5, 0.25, 0.125 per request: 2 + 2
    expect(r.drafts.map((d) => d.depth)).toEqual([2, 2]);
    expect(r.expectedAccepted).toBeCloseTo(1.5, 9);
  });

  test("property: random rounds and faults keep the worker's windows equal to the rings after a good round", () => {
    const faults: Fault[] = [
      null,
      "timeout_applied",
      "timeout_not_applied",
      "bad_reply_applied",
      "frame_no_session",
      "frame_busy",
      "reconnect_keep",
      "reconnect_drop",
      "down",
      "skip_one",
    ];
    const op = fc.oneof(
      fc.record({ kind: fc.constant("accept" as const), slot: fc.nat(5), n: fc.integer({ min: 0, max: 6 }) }),
      fc.record({
        kind: fc.constant("start" as const),
        slot: fc.nat(5),
        prompt: fc.integer({ min: 0, max: 9 }),
      }),
      fc.record({ kind: fc.constant("finish" as const), slot: fc.nat(5) }),
      fc.record({ kind: fc.constant("fault" as const), fault: fc.constantFrom(...faults) }),
    );
    return fc.assert(
      fc.asyncProperty(
        fc.array(op, { maxLength: 40 }),
        fc.integer({ min: W, max: 12 }),
        fc.constantFrom("copy", "ring", "mixed"),
        async (ops, maxRows, staging) => {
          const fake = new FakeClient(maxRows);
          const core = new RoundCore({ client: fake });
          const eng = new Engine();
          let release: number[] = [];
          // rows through newRows (copied into the rings), rowsTarget (written in place), or both
          const input = (): RoundRequest[] =>
            staging === "copy"
              ? eng.input()
              : eng.input(core, staging === "ring" ? undefined : (slot, anchor) => (slot + anchor) % 2 === 0);
          const runRound = async (): Promise<void> => {
            const res = await core.round({ requests: input(), release });
            release = [];
            for (const d of res.drafts) {
              if (d.k > 0) {
                expect(res.outcome).toBe("ok");
                expect(["ok", "partial_window"]).toContain(d.reason);
              }
            }
            if (res.outcome !== "ok") fake.up = true;
          };
          for (const o of ops) {
            if (o.kind === "start") {
              if (eng.reqs.has(o.slot)) release = release.filter((s) => s !== o.slot);
              eng.start(o.slot, o.prompt);
            } else if (o.kind === "accept") {
              if (eng.reqs.has(o.slot)) eng.accept(o.slot, o.n);
            } else if (o.kind === "finish") {
              if (eng.reqs.delete(o.slot)) release.push(o.slot);
            } else if (o.fault === "reconnect_keep") {
              fake.epoch++;
            } else if (o.fault === "reconnect_drop") {
              fake.epoch++;
              fake.slots.clear();
            } else if (o.fault === "down") {
              fake.up = false;
            } else {
              fake.fault = o.fault;
            }
            await runRound();
          }
          // rounds until nothing is deferred and the round succeeded
          fake.fault = null;
          fake.up = true;
          for (let i = 0; i < 20; i++) {
            const res = await core.round({ requests: input(), release });
            release = [];
            if (res.outcome === "ok" || res.outcome === "idle") {
              if (res.deferred === 0 && res.drafts.every((d) => !core.slotView(d.slot).needResync)) break;
            }
          }
          expectInSync(core, fake, eng);
          for (const [slot, s] of fake.slots) {
            if (!eng.reqs.has(slot)) expect(s.rows.length).toBe(0);
          }
        },
      ),
      { numRuns: 150 },
    );
  });
});
