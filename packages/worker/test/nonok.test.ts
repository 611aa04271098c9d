import {
  encodeHello,
  FrameStatus,
  frame,
  HELLO_BODY_SIZE,
  helloAuth,
  Op,
  ReqStatus,
  SampleMode,
} from "@tapwire/wire";
import { afterEach, describe, expect, test } from "vitest";
import type { DraftBatchEntry, Drafter, DraftOutput, Worker } from "../src/index.js";
import { createWorker, WindowStore } from "../src/index.js";
import { entry, helloFor, nullDrafter, Raw, Sess, stepFrame } from "./helpers.js";

const open: { workers: Worker[]; raws: Raw[] } = { workers: [], raws: [] };
afterEach(async () => {
  for (const r of open.raws.splice(0)) r.close();
  await Promise.all(open.workers.splice(0).map((w) => w.close()));
});

async function conn(ep: string): Promise<Raw> {
  const r = await new Raw(ep).connect();
  open.raws.push(r);
  return r;
}

/**
 * A NullDrafter whose identity or vocabulary getter can be made to throw: the only way to reach
 * the worker's internal-failure paths without patching it.
 */
class Flaky implements Drafter {
  readonly inner = nullDrafter();
  throwIdentity = false;
  throwVocab = false;
  get drafterIdentity(): Uint8Array {
    if (this.throwIdentity) throw new Error("identity unavailable");
    return this.inner.drafterIdentity;
  }
  get markovIdentity(): Uint8Array {
    return this.inner.markovIdentity;
  }
  get window(): number {
    return this.inner.window;
  }
  get numSpec(): number {
    return this.inner.numSpec;
  }
  get vocabSize(): number {
    if (this.throwVocab) throw new Error("vocab unavailable");
    return this.inner.vocabSize;
  }
  get numTaps(): number {
    return this.inner.numTaps;
  }
  get hidden(): number {
    return this.inner.hidden;
  }
  get capabilities(): number {
    return this.inner.capabilities;
  }
  draft(batch: readonly DraftBatchEntry[], out: DraftOutput): void {
    this.inner.draft(batch, out);
  }
}

function counters(w: Worker): Record<string, number> {
  return w.stats().counters as Record<string, number>;
}

describe("CONTRACT 5: a worker that answers a non-OK status has changed no state", () => {
  test("every non-OK status, with a live session: session, highest seq, windows and lease unchanged", async () => {
    const TOKEN = "tok";
    const LEASE = 10_000;
    let now = 1_000;
    const d = new Flaky();
    const w = await createWorker({
      drafter: d,
      listen: ["tcp://127.0.0.1:0"],
      maxSlots: 32,
      maxRowsPerStep: 256,
      token: TOKEN,
      takeover: "refuse",
      sessionLease: LEASE,
      now: () => now,
    });
    open.workers.push(w);
    const ep = w.endpoints[0]!;
    const r = await conn(ep);
    const S = 0x51;
    const s = new Sess(r, S, d, helloFor(d, { maxSlots: 8, maxRowsPerStep: 16 }), TOKEN);
    expect((await s.doHello()).status).toBe(FrameStatus.OK);
    // CONTRACT 6.2 (1.2): the lease protects S only while a connection bound to it is open; `r`
    // is closed below by an unreadable header, so S keeps a second bound connection.
    const keep = new Sess(await conn(ep), S, d, s.hello, TOKEN);
    keep.seq = s.seq;
    expect((await keep.doHello()).status).toBe(FrameStatus.OK);
    s.seq = keep.seq;
    const st = await s.step([
      entry({ slot: 0, generation: 3, anchorPos: 5, nRows: 5 }),
      entry({ slot: 1, generation: 9, anchorPos: 2, nRows: 2 }),
    ]);
    expect(st.status).toBe(FrameStatus.OK);
    const lastOk = now;
    const h = s.seq; // the session's highest seq
    const snapshot = () => ({
      session: w.stats().session,
      highestSeq: w.stats().highest_seq,
      windows: [0, 1, 2, 3].map((slot) => w.debugWindow(slot)),
      heldWindows: w.stats().windows_held,
    });
    const before = snapshot();
    expect(before.highestSeq).toBe(h);
    now += 5_000; // inside the lease

    const expectStatus = async (raw: Raw, msg: Uint8Array, status: number, what: string) => {
      const a = await raw.send(msg);
      expect({ what, status: a.status }).toEqual({ what, status });
      expect(snapshot()).toEqual(before);
    };
    const rowsStep = (seq: number, session = S) =>
      stepFrame({
        seq,
        session,
        entries: [
          entry({ slot: 0, generation: 3, anchorPos: 6, rowStart: 5, nRows: 1 }),
          entry({ slot: 2, generation: 1, anchorPos: 1, nRows: 1 }),
        ],
      });
    const helloMsg = (session: number, seq: number, over = {}, token: string | null = TOKEN) => {
      const body = encodeHello({
        ...helloFor(d, { maxSlots: 8, maxRowsPerStep: 16 }),
        auth: token === null ? new Uint8Array(32) : helloAuth(token, session, seq),
        ...over,
      });
      return frame({ op: Op.HELLO, seq, session }, body);
    };

    // NO_SESSION
    await expectStatus(r, rowsStep(h + 1, 0x99), FrameStatus.NO_SESSION, "STEP of another session");
    await expectStatus(
      r,
      frame({ op: Op.RESET, seq: h + 1, session: 0x99 }),
      FrameStatus.NO_SESSION,
      "RESET",
    );
    // STALE_SEQ
    await expectStatus(r, rowsStep(h), FrameStatus.STALE_SEQ, "STEP, same seq");
    await expectStatus(
      r,
      frame({ op: Op.RESET, seq: h, session: S }),
      FrameStatus.STALE_SEQ,
      "RESET, same seq",
    );
    await expectStatus(r, helloMsg(S, h), FrameStatus.STALE_SEQ, "re-HELLO, same seq");
    // BAD_FRAME (structure) and BAD_VERSION
    const twice = rowsStep(h + 1);
    new DataView(twice.buffer, twice.byteOffset).setUint32(24 + 16 + 32, 0, true); // slot 0 twice
    await expectStatus(r, twice, FrameStatus.BAD_FRAME, "STEP with a slot twice");
    const v2 = rowsStep(h + 1);
    v2[4] = 2;
    await expectStatus(r, v2, FrameStatus.BAD_VERSION, "STEP version 2");
    const v2reset = frame({ op: Op.RESET, seq: h + 1, session: S });
    v2reset[4] = 2;
    await expectStatus(r, v2reset, FrameStatus.BAD_VERSION, "RESET version 2");
    // TOO_LARGE: a STEP above the session's limit, RESET and PING bodies above 1 KiB. On the
    // session's own connection: since CONTRACT 1.1 (6.2) an unbound one is NO_SESSION first.
    const big = stepFrame({
      seq: h + 1,
      session: S,
      entries: [entry({ slot: 0, generation: 3, anchorPos: 40, rowStart: 0, nRows: 40 })],
    });
    await expectStatus(r, big, FrameStatus.TOO_LARGE, "STEP above the session's size limit");
    await expectStatus(
      r,
      frame({ op: Op.RESET, seq: h + 1, session: S }, new Uint8Array(1025)),
      FrameStatus.TOO_LARGE,
      "RESET body",
    );
    await expectStatus(
      r,
      helloMsg(S, h + 1).subarray(0, 24 + HELLO_BODY_SIZE - 1),
      FrameStatus.BAD_FRAME,
      "unreadable HELLO",
    );
    // (the unreadable header closed that connection)
    const r2 = await conn(ep);
    await expectStatus(
      r2,
      frame({ op: Op.HELLO, seq: h + 1, session: S }, new Uint8Array(12)),
      FrameStatus.BAD_FRAME,
      "HELLO body size",
    );
    // UNAUTHORIZED (same session and another one)
    await expectStatus(
      r2,
      helloMsg(S, h + 1, {}, "wrong"),
      FrameStatus.UNAUTHORIZED,
      "re-HELLO, wrong token",
    );
    await expectStatus(r2, helloMsg(0x77, 1, {}, null), FrameStatus.UNAUTHORIZED, "HELLO without auth");
    // IDENTITY_MISMATCH, CONFIG_MISMATCH (same session and another one)
    const otherId = { drafterIdentity: new Uint8Array(32).fill(9) };
    await expectStatus(r2, helloMsg(S, h + 1, otherId), FrameStatus.IDENTITY_MISMATCH, "re-HELLO, identity");
    await expectStatus(r2, helloMsg(0x77, 1, otherId), FrameStatus.IDENTITY_MISMATCH, "HELLO, identity");
    // A lowered max_slots that is otherwise wrong must not drop slots >= it.
    const badCfg = { window: d.window + 1, maxSlots: 1 };
    await expectStatus(r2, helloMsg(S, h + 1, badCfg), FrameStatus.CONFIG_MISMATCH, "re-HELLO, config");
    await expectStatus(r2, helloMsg(0x77, 1, badCfg), FrameStatus.CONFIG_MISMATCH, "HELLO, config");
    await expectStatus(
      r2,
      helloMsg(0x77, 1, { sampleMode: SampleMode.TOP32, vocabSize: 16 }),
      FrameStatus.CONFIG_MISMATCH,
      "HELLO, TOP32 config",
    );
    // UNKNOWN_OP
    await expectStatus(r2, frame({ op: 9, seq: h + 1, session: S }), FrameStatus.UNKNOWN_OP, "op 9");
    // BUSY: another session within the lease
    await expectStatus(r2, helloMsg(0x77, 1), FrameStatus.BUSY, "HELLO of another session");
    // INTERNAL: an unexpected failure before anything is applied
    const other2 = helloMsg(0x77, 2);
    const same1 = helloMsg(S, h + 1);
    d.throwIdentity = true;
    await expectStatus(r2, other2, FrameStatus.INTERNAL, "HELLO, drafter identity throws");
    await expectStatus(r2, same1, FrameStatus.INTERNAL, "re-HELLO, drafter identity throws");
    d.throwIdentity = false;
    expect(counters(w).internal_errors).toBe(2);

    // None of these renewed the lease: just past it (from the last OK frame) a takeover works.
    now = lastOk + LEASE - 1;
    await expectStatus(r2, helloMsg(0x77, 3), FrameStatus.BUSY, "HELLO of another session, end of lease");
    now = lastOk + LEASE;
    expect((await r2.send(helloMsg(0x77, 4))).status).toBe(FrameStatus.OK);
    expect(w.stats().session).toBe(0x77);
  });

  test("a STEP that fails inside the worker after it was applied is still OK: DRAFT_FAILED / NEED_RESYNC, never INTERNAL", async () => {
    const d = new Flaky();
    const w = await createWorker({ drafter: d, listen: ["tcp://127.0.0.1:0"], maxSlots: 8 });
    open.workers.push(w);
    const s = new Sess(await conn(w.endpoints[0]!), 5, d, helloFor(d, { maxSlots: 8 }));
    expect((await s.doHello()).status).toBe(FrameStatus.OK);

    // The value check after the drafter fails: the windows are applied, the frame is OK, the
    // consumed entries are DRAFT_FAILED with zero values (6.3, checked by Sess.step).
    d.throwVocab = true;
    let r = await s.step([
      entry({ slot: 0, anchorPos: 3, nRows: 3 }),
      entry({ slot: 1, anchorPos: 2, nRows: 2, flags: 0 }),
    ]);
    d.throwVocab = false;
    expect(r.status).toBe(FrameStatus.OK);
    expect(Array.from(r.views!.status)).toEqual([ReqStatus.DRAFT_FAILED, ReqStatus.OK]);
    expect(Array.from(r.views!.windowRows)).toEqual([3, 2]);
    expect(w.debugWindow(0).nRows).toBe(3);
    expect(counters(w).internal_errors).toBe(1);
    expect(counters(w).replies_internal).toBe(0);
    r = await s.step([entry({ slot: 0, anchorPos: 4, rowStart: 3, nRows: 1 })]);
    expect(r.views!.status[0]).toBe(ReqStatus.OK);

    // Applying rows fails (as a failed allocation would): that slot's window is dropped and the
    // entry answers NEED_RESYNC; the other entries of the frame are applied; the frame is OK.
    const store = WindowStore.prototype as unknown as { applyRows: (...a: unknown[]) => void };
    const applyRows = store.applyRows;
    store.applyRows = function (this: unknown, ...a: unknown[]) {
      if (a[0] === 0) throw new RangeError("Array buffer allocation failed");
      return applyRows.apply(this, a);
    };
    try {
      r = await s.step([
        entry({ slot: 0, anchorPos: 5, rowStart: 4, nRows: 1 }),
        entry({ slot: 1, anchorPos: 3, rowStart: 2, nRows: 1 }),
      ]);
    } finally {
      store.applyRows = applyRows;
    }
    expect(r.status).toBe(FrameStatus.OK);
    expect(Array.from(r.views!.status)).toEqual([ReqStatus.NEED_RESYNC, ReqStatus.OK]);
    expect(Array.from(r.views!.windowRows)).toEqual([0, 3]);
    expect(w.debugWindow(0)).toMatchObject({ known: true, nRows: 0 });
    expect(counters(w).replies_internal).toBe(0);
    // A RESYNC repairs it.
    r = await s.step([entry({ slot: 0, anchorPos: 5, rowStart: 0, nRows: 5, flags: 3 })]);
    expect([r.views!.status[0], r.views!.windowRows[0]]).toEqual([ReqStatus.OK, 5]);
  });
});
