import type { ReqEntry } from "@tapwire/wire";
import {
  APP_HEADER_SIZE,
  Capability,
  decodeStepReply,
  EntryFlag,
  encodeHello,
  FrameStatus,
  frame,
  helloAuth,
  Op,
  ReplyFlag,
  ReqStatus,
  SampleMode,
} from "@tapwire/wire";
import { afterEach, describe, expect, test } from "vitest";
import type { Drafter, DraftOutput, Worker } from "../src/index.js";
import { createWorker, NullDrafter } from "../src/index.js";
import {
  entry,
  entryFieldOffset,
  GEOM,
  helloFor,
  helloOn,
  IDENT_D,
  IDENT_M,
  nullDrafter,
  Raw,
  ROW_BYTES,
  rowsBytes,
  Sess,
  stepFrame,
  uniqueSock,
} from "./helpers.js";

const { NEED_DRAFT, RESYNC, RELEASE } = EntryFlag;

/** Workers and connections opened by a test, closed after it. */
const open: { workers: Worker[]; raws: Raw[] } = { workers: [], raws: [] };
afterEach(async () => {
  for (const r of open.raws.splice(0)) r.close();
  await Promise.all(open.workers.splice(0).map((w) => w.close()));
});

async function start(
  opts: Partial<Parameters<typeof createWorker>[0]> = {},
  endpoint = "tcp://127.0.0.1:0",
): Promise<{ w: Worker; d: Drafter; ep: string }> {
  const d = opts.drafter ?? nullDrafter();
  const w = await createWorker({
    drafter: d,
    listen: [endpoint],
    maxSlots: 32,
    maxRowsPerStep: 256,
    ...opts,
  });
  open.workers.push(w);
  return { w, d, ep: w.endpoints[0]! };
}

async function conn(ep: string): Promise<Raw> {
  const r = await new Raw(ep).connect();
  open.raws.push(r);
  return r;
}

async function session(ep: string, d: Drafter, id = 0x1234, over = {}): Promise<Sess> {
  const s = new Sess(await conn(ep), id, d, helloFor(d, over));
  const h = await s.doHello();
  expect(h.status).toBe(FrameStatus.OK);
  return s;
}

function positions(rows: Uint8Array): number[] {
  const out: number[] = [];
  for (let i = 0; i < rows.length; i += ROW_BYTES) out.push(rows[i]! | (rows[i + 1]! << 8));
  return out;
}

function range(a: number, b: number): number[] {
  return Array.from({ length: Math.max(0, b - a) }, (_, i) => a + i);
}

describe("CONTRACT 4: header", () => {
  test.each([
    [
      "fewer than 24 bytes",
      () => frame({ op: Op.PING, seq: 9, session: 5 }).subarray(0, 13),
      { op: Op.PING, seq: 9, session: 0 },
    ],
    [
      "only 5 bytes",
      () => frame({ op: Op.PING, seq: 9, session: 5 }).subarray(0, 5),
      { op: 0, seq: 0, session: 0 },
    ],
    [
      "wrong magic",
      () => {
        const f = frame({ op: Op.STEP, seq: 3, session: 4 });
        f[0] = 0x45;
        return f;
      },
      { op: Op.STEP, seq: 3, session: 4 },
    ],
    [
      "body_len not matching",
      () => {
        const f = frame({ op: Op.PING, seq: 3, session: 4 }, new Uint8Array(8));
        f[16] = 9;
        return f;
      },
      { op: Op.PING, seq: 3, session: 4 },
    ],
  ])("unreadable header (%s): BAD_FRAME echoing what is present, then close", async (_n, make, echo) => {
    const { ep } = await start();
    const r = await conn(ep);
    const a = await r.send(make());
    expect(a.status).toBe(FrameStatus.BAD_FRAME);
    expect({ op: a.op, seq: a.seq, session: a.session }).toEqual(echo);
    await expect(r.send(frame({ op: Op.PING, seq: 1, session: 0 }))).rejects.toThrow();
  });

  test("wrong version: BAD_VERSION, connection stays usable", async () => {
    const { ep } = await start();
    const r = await conn(ep);
    const f = frame({ op: Op.PING, seq: 3, session: 4 });
    f[4] = 2;
    const a = await r.send(f);
    expect(a).toMatchObject({ status: FrameStatus.BAD_VERSION, op: Op.PING, seq: 3, session: 4 });
    expect((await r.send(frame({ op: Op.PING, seq: 4, session: 0 }))).status).toBe(FrameStatus.OK);
  });

  test("reserved field and request status byte must be 0 (BAD_FRAME)", async () => {
    const { ep } = await start();
    const r = await conn(ep);
    const f = frame({ op: Op.PING, seq: 3, session: 4 });
    f[20] = 1;
    expect((await r.send(f)).status).toBe(FrameStatus.BAD_FRAME);
    const g = frame({ op: Op.PING, seq: 3, session: 4, status: 2 });
    expect((await r.send(g)).status).toBe(FrameStatus.BAD_FRAME);
    expect((await r.send(frame({ op: Op.PING, seq: 4, session: 0 }))).status).toBe(FrameStatus.OK);
  });

  test("unknown op: UNKNOWN_OP echoing the op", async () => {
    const { ep } = await start();
    const r = await conn(ep);
    const a = await r.send(frame({ op: 9, seq: 3, session: 4 }));
    expect(a).toMatchObject({ status: FrameStatus.UNKNOWN_OP, op: 9, seq: 3, session: 4 });
  });
});

describe("CONTRACT 10: PING, STATS", () => {
  test("PING echoes up to 1 KiB with any session, larger is TOO_LARGE", async () => {
    const { ep } = await start();
    const r = await conn(ep);
    const body = rowsBytes(0, 64, 16); // 1024 bytes
    const a = await r.send(frame({ op: Op.PING, seq: 1, session: 0 }, body));
    expect(a.status).toBe(FrameStatus.OK);
    expect(a.body).toEqual(body);
    const b = await r.send(frame({ op: Op.PING, seq: 2, session: 77 }, new Uint8Array(1025)));
    expect(b.status).toBe(FrameStatus.TOO_LARGE);
    expect(b.body.length).toBe(0);
  });

  test("STATS answers JSON of the worker's stats; above 1 KiB is TOO_LARGE", async () => {
    const { ep, d } = await start({ name: "w-stats" });
    const s = await session(ep, d);
    await s.step([entry({ slot: 0, anchorPos: 2, nRows: 2 })]);
    const a = await s.raw.send(frame({ op: Op.STATS, seq: 0, session: 0 }));
    expect(a.status).toBe(FrameStatus.OK);
    const j = JSON.parse(Buffer.from(a.body).toString("utf8"));
    expect(j.name).toBe("w-stats");
    expect(j.session).toBe(0x1234);
    const c = j.counters as Record<string, number>;
    expect(c.sessions).toBe(1);
    expect(c.frames_step).toBe(1);
    expect(c.entries_ok).toBe(1);
    expect(c.rows_applied).toBe(2);
    expect(c.request_bytes).toBeGreaterThan(0);
    expect(j.histograms.drafter_seconds.count).toBe(1);
    const b = await s.raw.send(frame({ op: Op.STATS, seq: 0, session: 0 }, new Uint8Array(1025)));
    expect(b.status).toBe(FrameStatus.TOO_LARGE);
  });
});

describe("CONTRACT 6.1: HELLO", () => {
  test("OK reply carries the worker's HelloReply", async () => {
    const { ep, d } = await start({ name: "hello-w" });
    const s = new Sess(await conn(ep), 5, d);
    const a = await s.doHello();
    expect(a.status).toBe(FrameStatus.OK);
    expect(a.reply).toMatchObject({
      window: GEOM.window,
      numSpec: GEOM.numSpec,
      vocabSize: GEOM.vocabSize,
      rowBytes: ROW_BYTES,
      maxSlots: 32,
      maxRowsPerStep: 256,
      windowsKept: 0,
      workerName: "hello-w",
      capabilities: Capability.TAPS_BF16 | Capability.TOP32 | Capability.MARGIN,
    });
    expect(a.reply!.drafterIdentity).toEqual(IDENT_D);
    expect(a.reply!.markovIdentity).toEqual(IDENT_M);
  });

  test("body size and session 0 are BAD_FRAME", async () => {
    const { ep, d } = await start();
    const r = await conn(ep);
    const body = encodeHello(helloFor(d));
    expect((await r.send(frame({ op: Op.HELLO, seq: 1, session: 5 }, body.subarray(0, 159)))).status).toBe(
      FrameStatus.BAD_FRAME,
    );
    expect((await r.send(frame({ op: Op.HELLO, seq: 1, session: 0 }, body))).status).toBe(
      FrameStatus.BAD_FRAME,
    );
  });

  test("version comes first: a bad version with a bad body is BAD_VERSION", async () => {
    const { ep } = await start();
    const r = await conn(ep);
    const f = frame({ op: Op.HELLO, seq: 1, session: 5 }, new Uint8Array(3));
    f[4] = 7;
    expect((await r.send(f)).status).toBe(FrameStatus.BAD_VERSION);
  });

  test("UNAUTHORIZED without the right token, before identities; OK with it (CONTRACT 11)", async () => {
    const { ep, d } = await start({ token: "s3cret" });
    const r = await conn(ep);
    const wrong = new Sess(r, 5, d, helloFor(d), "other");
    expect((await wrong.doHello()).status).toBe(FrameStatus.UNAUTHORIZED);
    const none = new Sess(r, 5, d, helloFor(d));
    const a = await none.doHello();
    expect(a.status).toBe(FrameStatus.UNAUTHORIZED);
    expect(a.body.length).toBe(0);
    // auth is checked before identities
    const badId = new Sess(r, 5, d, helloFor(d, { drafterIdentity: new Uint8Array(32) }), "nope");
    expect((await badId.doHello()).status).toBe(FrameStatus.UNAUTHORIZED);
    // auth binds session and seq
    const replay = new Sess(r, 5, d, helloFor(d));
    expect((await replay.doHello({ auth: helloAuth("s3cret", 5, 99) })).status).toBe(
      FrameStatus.UNAUTHORIZED,
    );
    const good = new Sess(r, 5, d, helloFor(d), "s3cret");
    expect((await good.doHello()).status).toBe(FrameStatus.OK);
  });

  test("IDENTITY_MISMATCH carries the worker's HelloReply; identities are checked before config", async () => {
    const { ep, d } = await start();
    const s = new Sess(await conn(ep), 5, d);
    for (const over of [
      { drafterIdentity: new Uint8Array(32).fill(1) },
      { markovIdentity: new Uint8Array(32).fill(1), window: 3 },
    ]) {
      const a = await s.doHello(over);
      expect(a.status).toBe(FrameStatus.IDENTITY_MISMATCH);
      expect(a.reply!.drafterIdentity).toEqual(IDENT_D);
      expect(a.reply!.markovIdentity).toEqual(IDENT_M);
      expect(a.reply!.windowsKept).toBe(0);
    }
    // Nothing changed: no session exists.
    expect((await s.step([entry({ slot: 0 })])).status).toBe(FrameStatus.NO_SESSION);
  });

  test.each([
    ["window", { window: 9 }],
    ["num_spec", { numSpec: 3 }],
    ["vocab_size", { vocabSize: 255 }],
    ["row_bytes", { rowBytes: ROW_BYTES + 2, hidden: GEOM.hidden + 1 }],
    ["row_bytes != num_taps*hidden*2", { rowBytes: ROW_BYTES, hidden: GEOM.hidden + 1 }],
    ["tap layout", { numTaps: 4, hidden: 2 }],
    ["row_dtype", { rowDtype: 2 }],
    ["unknown sample mode", { sampleMode: 2 }],
    ["unknown hello_flags", { helloFlags: 2 }],
    ["max_slots above the worker's", { maxSlots: 33 }],
    ["max_rows_per_step above the worker's", { maxRowsPerStep: 257 }],
  ])("CONFIG_MISMATCH (%s) carries the HelloReply", async (_n, over) => {
    const { ep, d } = await start();
    const s = new Sess(await conn(ep), 5, d);
    const a = await s.doHello(over);
    expect(a.status).toBe(FrameStatus.CONFIG_MISMATCH);
    expect(a.reply).toMatchObject({
      window: GEOM.window,
      numSpec: GEOM.numSpec,
      rowBytes: ROW_BYTES,
      maxSlots: 32,
    });
    expect((await s.step([entry({ slot: 0 })])).status).toBe(FrameStatus.NO_SESSION);
  });

  test("CONFIG_MISMATCH: TOP32 without the capability, TOP32 with vocab < 32, WANT_MARGIN without MARGIN", async () => {
    const greedyOnly = nullDrafter({ capabilities: Capability.TAPS_BF16 });
    const { ep } = await start({ drafter: greedyOnly });
    const s = new Sess(await conn(ep), 5, greedyOnly);
    expect((await s.doHello({ sampleMode: SampleMode.TOP32, helloFlags: 0 })).status).toBe(
      FrameStatus.CONFIG_MISMATCH,
    );
    expect((await s.doHello({ helloFlags: 1 })).status).toBe(FrameStatus.CONFIG_MISMATCH);
    expect((await s.doHello({ helloFlags: 0 })).status).toBe(FrameStatus.OK);
    const tiny = nullDrafter({ vocabSize: 16 });
    const t = await start({ drafter: tiny });
    const s2 = new Sess(await conn(t.ep), 5, tiny);
    expect((await s2.doHello({ sampleMode: SampleMode.TOP32 })).status).toBe(FrameStatus.CONFIG_MISMATCH);
    expect((await s2.doHello()).status).toBe(FrameStatus.OK);
  });
});

describe("CONTRACT 6.2: sessions and seq", () => {
  test("STEP and RESET without the current session: NO_SESSION", async () => {
    const { ep, d } = await start();
    const r = await conn(ep);
    const lone = new Sess(r, 9, d);
    expect((await lone.step([entry({ slot: 0 })])).status).toBe(FrameStatus.NO_SESSION);
    expect((await lone.simple(Op.RESET)).status).toBe(FrameStatus.NO_SESSION);
    await session(ep, d, 10);
    expect((await lone.step([entry({ slot: 0 })])).status).toBe(FrameStatus.NO_SESSION);
    expect((await lone.simple(Op.RESET)).status).toBe(FrameStatus.NO_SESSION);
  });

  test("STALE_SEQ for a seq not newer than the highest; nothing applied", async () => {
    const { ep, d, w } = await start();
    const s = await session(ep, d);
    expect((await s.step([entry({ slot: 0, anchorPos: 2, nRows: 2 })])).status).toBe(FrameStatus.OK);
    const seq = s.seq;
    const again = await s.step([entry({ slot: 1, anchorPos: 2, nRows: 2 })], { seq });
    expect(again.status).toBe(FrameStatus.STALE_SEQ);
    const older = await s.step([entry({ slot: 1, anchorPos: 2, nRows: 2 })], { seq: seq - 1 });
    expect(older.status).toBe(FrameStatus.STALE_SEQ);
    expect(w.debugWindow(1).known).toBe(false);
    expect((await s.simple(Op.RESET)).status).toBe(FrameStatus.OK);
    // RESET took a seq: re-sending it is stale, for RESET and HELLO alike
    const r = await s.raw.send(frame({ op: Op.RESET, seq: s.seq, session: s.session }));
    expect(r.status).toBe(FrameStatus.STALE_SEQ);
    s.seq--;
    expect((await s.doHello()).status).toBe(FrameStatus.STALE_SEQ);
  });

  test("seq compares as a serial number across the 2^32 wrap", async () => {
    const { ep, d } = await start();
    const s = new Sess(await conn(ep), 3, d);
    s.seq = 0xfffffffe;
    expect((await s.doHello()).status).toBe(FrameStatus.OK); // seq 2^32-1
    expect((await s.step([entry({ slot: 0 })], { seq: 0 })).status).toBe(FrameStatus.OK);
    expect((await s.step([entry({ slot: 0 })], { seq: 0xffffffff })).status).toBe(FrameStatus.STALE_SEQ);
    expect((await s.step([entry({ slot: 0 })], { seq: 0x7fffffff })).status).toBe(FrameStatus.OK);
    expect((await s.step([entry({ slot: 0 })], { seq: 0xffffffff })).status).toBe(FrameStatus.STALE_SEQ);
  });

  test("takeover (allow): a new session drops every window; the old one gets NO_SESSION", async () => {
    const { ep, d, w } = await start();
    const a = await session(ep, d, 1);
    await a.step([
      entry({ slot: 0, anchorPos: 3, nRows: 3 }),
      entry({ slot: 5, generation: 4, anchorPos: 1, nRows: 1 }),
    ]);
    expect(w.debugWindow(5).nRows).toBe(1);
    const b = new Sess(await conn(ep), 2, d);
    const h = await b.doHello();
    expect(h.status).toBe(FrameStatus.OK);
    expect(h.reply!.windowsKept).toBe(0);
    expect(w.debugWindow(0)).toMatchObject({ known: false, nRows: 0 });
    expect(w.debugWindow(5)).toMatchObject({ known: false, nRows: 0 });
    expect((await a.step([entry({ slot: 0 })])).status).toBe(FrameStatus.NO_SESSION);
    // The new session sees a fresh slot: an older generation than before is no longer stale.
    const st = await b.step([entry({ slot: 5, generation: 1, anchorPos: 1, nRows: 1 })]);
    expect(st.views!.status[0]).toBe(ReqStatus.OK);
  });

  test("takeover (refuse): BUSY within the lease, OK once it expired", async () => {
    let now = 1000;
    const { ep, d, w } = await start({ takeover: "refuse", sessionLease: 10_000, now: () => now });
    const a = await session(ep, d, 1);
    await a.step([entry({ slot: 0, anchorPos: 2, nRows: 2 })]);
    const b = new Sess(await conn(ep), 2, d);
    now += 9_999;
    const busy = await b.doHello();
    expect(busy.status).toBe(FrameStatus.BUSY);
    expect(w.debugWindow(0).nRows).toBe(2);
    // an OK STEP renews the lease
    expect((await a.step([entry({ slot: 0, anchorPos: 3, rowStart: 2, nRows: 1 })])).status).toBe(
      FrameStatus.OK,
    );
    now += 9_999;
    expect((await b.doHello()).status).toBe(FrameStatus.BUSY);
    now += 2;
    expect((await b.doHello()).status).toBe(FrameStatus.OK);
    expect(w.debugWindow(0).known).toBe(false);
    expect((await a.step([entry({ slot: 0 })])).status).toBe(FrameStatus.NO_SESSION);
  });

  test("re-HELLO of the current session keeps windows and reports windows_kept", async () => {
    const { ep, d, w } = await start();
    const s = await session(ep, d, 7);
    await s.step([
      entry({ slot: 0, anchorPos: 3, nRows: 3 }),
      entry({ slot: 1, anchorPos: 2, nRows: 2 }),
      entry({ slot: 2, anchorPos: 0 }),
    ]);
    const s2 = new Sess(await conn(ep), 7, d);
    s2.seq = s.seq;
    const h = await s2.doHello();
    expect(h.status).toBe(FrameStatus.OK);
    expect(h.reply!.windowsKept).toBe(2);
    expect(positions(w.debugWindow(0).rows)).toEqual([0, 1, 2]);
    const st = await s2.step([entry({ slot: 0, anchorPos: 4, rowStart: 3, nRows: 1 })]);
    expect(st.views!.windowRows[0]).toBe(4);
  });
});

describe("CONTRACT 7.2: STEP structure", () => {
  /** Builds a valid 2-entry STEP, lets `mutate` break it, and checks BAD_FRAME with nothing applied. */
  async function expectBad(
    mutate: (f: Uint8Array, dv: DataView) => unknown,
    entries?: ReqEntry[],
    over = {},
  ): Promise<void> {
    const { ep, d, w } = await start();
    const s = await session(ep, d, 0x55, over);
    const sampled = (over as { sampleMode?: number }).sampleMode === SampleMode.TOP32;
    const es = entries ?? [
      entry({ slot: 0, anchorPos: 2, nRows: 2 }),
      entry({ slot: 1, anchorPos: 3, nRows: 3 }),
    ];
    const f = stepFrame({
      seq: s.seq + 1,
      session: s.session,
      entries: es,
      sampleMeta: sampled ? es.map(() => ({ seed: 1, topK: 4, tempMilli: 0 })) : null,
    });
    const res = mutate(f, new DataView(f.buffer, f.byteOffset, f.byteLength));
    const g = res instanceof Uint8Array ? res : f;
    const a = await s.raw.send(g);
    expect(a.status).toBe(FrameStatus.BAD_FRAME);
    expect(w.debugWindow(0).known).toBe(false);
    expect(w.debugWindow(1).known).toBe(false);
    // seq not consumed: the same seq is accepted next
    const ok = await s.step([entry({ slot: 0 })], { seq: s.seq + 1 });
    expect(ok.status).toBe(FrameStatus.OK);
  }
  const B = APP_HEADER_SIZE;
  const setBodyLen = (f: Uint8Array, dv: DataView) => dv.setUint32(16, f.length - B, true);

  test("body size does not match (7.3)", () =>
    expectBad((f) => {
      const g = f.slice(0, f.length - 1);
      setBodyLen(g, new DataView(g.buffer));
      return g;
    }));
  test("body shorter than the prefix", () =>
    expectBad(() => frame({ op: Op.STEP, seq: 2, session: 0x55 }, new Uint8Array(8))));
  test("step_flags != 0", () => expectBad((_f, dv) => dv.setUint32(B + 4, 1, true)));
  test("n_req > max_slots", () =>
    expectBad((_f, dv) => dv.setUint32(B + 8, 17, true), undefined, { maxSlots: 16 }));
  test("n_rows > max_rows_per_step", () =>
    expectBad(() => undefined, [entry({ slot: 0, anchorPos: 5, nRows: 5 })], { maxRowsPerStep: 4 }));
  test("slot >= max_slots", () =>
    expectBad((_f, dv) => dv.setUint32(entryFieldOffset(1, 0), 16, true), undefined, { maxSlots: 16 }));
  test("slot twice", () => expectBad((_f, dv) => dv.setUint32(entryFieldOffset(1, 0), 0, true)));
  test("sum of entry n_rows != n_rows", () =>
    expectBad((_f, dv) => {
      dv.setUint32(entryFieldOffset(1, 20), 2, true);
      dv.setUint32(entryFieldOffset(1, 16), 1, true);
    }));
  test("n_out > N", () =>
    expectBad((_f, dv) => dv.setUint16(entryFieldOffset(0, 24), GEOM.numSpec + 1, true)));
  test("row_start + n_rows != anchor_pos", () =>
    expectBad((_f, dv) => dv.setUint32(entryFieldOffset(0, 8), 3, true)));
  test("unknown flag bits", () =>
    expectBad((_f, dv) => dv.setUint16(entryFieldOffset(0, 26), 8 | NEED_DRAFT, true)));
  test("reserved != 0", () => expectBad((_f, dv) => dv.setUint32(entryFieldOffset(1, 28), 1, true)));
  test("RELEASE with NEED_DRAFT", () =>
    expectBad(
      (_f, dv) => dv.setUint16(entryFieldOffset(1, 26), RELEASE | NEED_DRAFT, true),
      [entry({ slot: 0, anchorPos: 2, nRows: 2 }), entry({ slot: 1, flags: RELEASE })],
    ));
  test("RELEASE with RESYNC", () =>
    expectBad(
      (_f, dv) => dv.setUint16(entryFieldOffset(1, 26), RELEASE | RESYNC, true),
      [entry({ slot: 0, anchorPos: 2, nRows: 2 }), entry({ slot: 1, flags: RELEASE })],
    ));
  test("RELEASE with rows", () =>
    expectBad((_f, dv) => dv.setUint16(entryFieldOffset(1, 26), RELEASE, true)));
  test.each([0, 33])("TOP32 session: top_k %i", (k) =>
    expectBad((_f, dv) => dv.setUint16(B + 16 + 8 + 4, k, true), undefined, { sampleMode: SampleMode.TOP32 }),
  );

  test("TOO_LARGE above the session's limit, before any parsing", async () => {
    const { ep, d, w } = await start();
    const s = await session(ep, d, 0x55, { maxSlots: 4, maxRowsPerStep: 8 });
    // rows_offset_for(4) + 8 rows is the limit; one row more with one entry is above it
    const f = stepFrame({
      seq: s.seq + 1,
      session: s.session,
      entries: [entry({ slot: 0, anchorPos: 14, nRows: 14 })],
    });
    const a = await s.raw.send(f);
    expect(a.status).toBe(FrameStatus.TOO_LARGE);
    expect(w.debugWindow(0).known).toBe(false);
    expect((await s.step([entry({ slot: 0, anchorPos: 8, nRows: 8 })])).status).toBe(FrameStatus.OK);
  });
});

describe("CONTRACT 7.1, 7.2: applying entries", () => {
  test("append, gap and overlap (PARTIAL_WINDOW), NEED_RESYNC, RESYNC", async () => {
    const { ep, d, w } = await start();
    const s = await session(ep, d);
    const W = GEOM.window;
    let r = await s.step([entry({ slot: 3, anchorPos: 5, nRows: 5 })]);
    expect([r.views!.status[0], r.views!.windowRows[0]]).toEqual([ReqStatus.OK, 5]);
    r = await s.step([entry({ slot: 3, anchorPos: 11, rowStart: 5, nRows: 6 })]); // append beyond W
    expect([r.views!.status[0], r.views!.windowRows[0]]).toEqual([ReqStatus.OK, W]);
    expect(positions(w.debugWindow(3).rows)).toEqual(range(11 - W, 11));
    // no rows, anchor moved: the window ends elsewhere
    r = await s.step([entry({ slot: 3, anchorPos: 12 })]);
    expect([r.views!.status[0], r.views!.windowRows[0]]).toEqual([ReqStatus.NEED_RESYNC, 0]);
    expect(r.views!.draftIds[0]).toBe(0); // NEED_RESYNC gets no draft
    // gap: rows 14..16 replace the window; 3 of min(W, 16) rows
    r = await s.step([entry({ slot: 3, anchorPos: 16, rowStart: 13, nRows: 3 })]);
    expect([r.views!.status[0], r.views!.windowRows[0]]).toEqual([ReqStatus.PARTIAL_WINDOW, 3]);
    expect(positions(w.debugWindow(3).rows)).toEqual([13, 14, 15]);
    // overlap: rows 14..17 replace the window
    r = await s.step([entry({ slot: 3, anchorPos: 18, rowStart: 14, nRows: 4 })]);
    expect([r.views!.status[0], r.views!.windowRows[0]]).toEqual([ReqStatus.PARTIAL_WINDOW, 4]);
    expect(positions(w.debugWindow(3).rows)).toEqual([14, 15, 16, 17]);
    // RESYNC with the whole ring
    r = await s.step([entry({ slot: 3, anchorPos: 18, rowStart: 10, nRows: 8, flags: NEED_DRAFT | RESYNC })]);
    expect([r.views!.status[0], r.views!.windowRows[0]]).toEqual([ReqStatus.OK, 8]);
    expect(positions(w.debugWindow(3).rows)).toEqual(range(10, 18));
    // RESYNC with more than W rows keeps the last W
    r = await s.step([
      entry({ slot: 3, anchorPos: 30, rowStart: 18, nRows: 12, flags: NEED_DRAFT | RESYNC }),
    ]);
    expect(positions(w.debugWindow(3).rows)).toEqual(range(22, 30));
    // RESYNC with fewer rows than readable: PARTIAL_WINDOW
    r = await s.step([entry({ slot: 3, anchorPos: 31, rowStart: 28, nRows: 3, flags: NEED_DRAFT | RESYNC })]);
    expect([r.views!.status[0], r.views!.windowRows[0]]).toEqual([ReqStatus.PARTIAL_WINDOW, 3]);
  });

  test("anchor_pos 0 is OK with no rows; statuses hold without NEED_DRAFT too", async () => {
    const { ep, d } = await start();
    const s = await session(ep, d);
    const r = await s.step([
      entry({ slot: 0, anchorPos: 0 }),
      entry({ slot: 1, anchorPos: 4, nRows: 4, flags: 0 }),
      entry({ slot: 2, anchorPos: 4, rowStart: 2, nRows: 2, flags: 0 }),
      entry({ slot: 4, anchorPos: 4, flags: 0 }),
    ]);
    expect(Array.from(r.views!.status)).toEqual([
      ReqStatus.OK,
      ReqStatus.OK,
      ReqStatus.PARTIAL_WINDOW,
      ReqStatus.NEED_RESYNC,
    ]);
    expect(Array.from(r.views!.windowRows)).toEqual([0, 4, 2, 0]);
    expect(r.views!.draftIds[0]).toBe(8); // anchor token 7 + 1
    expect(Array.from(r.views!.draftIds.subarray(4))).toEqual(new Array(12).fill(0));
  });

  test("generation newer resets, equal keeps, older is STALE_GENERATION (across the wrap)", async () => {
    const { ep, d, w } = await start();
    const s = await session(ep, d);
    let r = await s.step([entry({ slot: 0, generation: 0xfffffffe, anchorPos: 3, nRows: 3 })]);
    expect(r.views!.status[0]).toBe(ReqStatus.OK);
    r = await s.step([entry({ slot: 0, generation: 0xfffffffe, anchorPos: 4, rowStart: 3, nRows: 1 })]);
    expect(r.views!.windowRows[0]).toBe(4);
    // 1 is newer than 2^32-2: reset, then rows 0..1
    r = await s.step([entry({ slot: 0, generation: 1, anchorPos: 6, rowStart: 4, nRows: 2 })]);
    expect([r.views!.status[0], r.views!.windowRows[0]]).toEqual([ReqStatus.PARTIAL_WINDOW, 2]);
    expect(w.debugWindow(0)).toMatchObject({ generation: 1, firstPos: 4, nRows: 2 });
    // older across the wrap
    r = await s.step([entry({ slot: 0, generation: 0xffffffff, anchorPos: 7, rowStart: 6, nRows: 1 })]);
    expect([r.views!.status[0], r.views!.windowRows[0], r.views!.generation[0]]).toEqual([
      ReqStatus.STALE_GENERATION,
      0,
      0xffffffff,
    ]);
    expect(r.views!.draftIds[0]).toBe(0);
    expect(w.debugWindow(0)).toMatchObject({ generation: 1, firstPos: 4, nRows: 2 });
    // STALE_GENERATION with RELEASE changes nothing either
    r = await s.step([entry({ slot: 0, generation: 0, flags: RELEASE })]);
    expect(r.views!.status[0]).toBe(ReqStatus.STALE_GENERATION);
    expect(w.debugWindow(0).nRows).toBe(2);
  });

  test("RELEASE drops the window, keeps the generation: status OK, window_rows 0", async () => {
    const { ep, d, w } = await start();
    const s = await session(ep, d);
    await s.step([entry({ slot: 2, generation: 5, anchorPos: 4, nRows: 4 })]);
    const r = await s.step([entry({ slot: 2, generation: 5, anchorPos: 4, flags: RELEASE })]);
    expect([r.views!.status[0], r.views!.windowRows[0]]).toEqual([ReqStatus.OK, 0]);
    expect(w.debugWindow(2)).toMatchObject({ known: true, generation: 5, nRows: 0 });
    const r2 = await s.step([entry({ slot: 2, generation: 4 })]);
    expect(r2.views!.status[0]).toBe(ReqStatus.STALE_GENERATION);
  });

  test("n_out: k = N when 0, else min(n_out, N); the rest is zero (6.3)", async () => {
    const { ep, d } = await start();
    const s = await session(ep, d);
    const r = await s.step([
      entry({ slot: 0, nOut: 0, anchorToken: 10 }),
      entry({ slot: 1, nOut: 1, anchorToken: 20 }),
      entry({ slot: 2, nOut: 3, anchorToken: 30 }),
      entry({ slot: 3, nOut: 2, anchorToken: 40, flags: 0 }),
    ]);
    const ids = Array.from(r.views!.draftIds);
    expect(ids).toEqual([11, 12, 13, 14, 21, 0, 0, 0, 31, 32, 33, 0, 0, 0, 0, 0]);
    expect(Array.from(r.views!.confidence)).toEqual([
      0.5, 0.5, 0.5, 0.5, 0.5, 0, 0, 0, 0.5, 0.5, 0.5, 0, 0, 0, 0, 0,
    ]);
    expect(r.views!.margin![4]).toBe(1);
    expect(r.views!.margin![5]).toBe(0);
  });

  test("MARGIN exactly when WANT_MARGIN", async () => {
    const { ep, d } = await start();
    const s = await session(ep, d, 8, { helloFlags: 0 });
    const r = await s.step([entry({ slot: 0 })]);
    expect(r.views!.replyFlags & ReplyFlag.MARGIN).toBe(0);
    expect(r.views!.margin).toBeNull();
    const s2 = await session(ep, d, 9, { helloFlags: 1 });
    const r2 = await s2.step([entry({ slot: 0 })]);
    expect(r2.views!.replyFlags).toBe(ReplyFlag.MARGIN);
  });

  test("TOP32 session: SAMPLED replies pass validateSampled; greedy entries have no q", async () => {
    const { ep, d } = await start();
    const s = await session(ep, d, 8, { sampleMode: SampleMode.TOP32 });
    const entries = [
      entry({ slot: 0, anchorToken: 100, nOut: 3 }),
      entry({ slot: 1, anchorToken: 200 }),
      entry({ slot: 2, anchorToken: 250, anchorPos: 1 }), // NEED_RESYNC: no draft, no q
      entry({ slot: 3, anchorToken: 5, nOut: 2 }),
    ];
    const sampleMeta = [
      { seed: 11, topK: 32, tempMilli: 700 },
      { seed: 12, topK: 4, tempMilli: 0 },
      { seed: 13, topK: 5, tempMilli: 1000 },
      { seed: 0xffffffff, topK: 1, tempMilli: 1 },
    ];
    const r = await s.step(entries, { sampleMeta });
    const v = r.views!;
    expect(v.replyFlags & ReplyFlag.SAMPLED).toBe(ReplyFlag.SAMPLED);
    expect(Array.from(v.sampledMask!)).toEqual([1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0]);
    let sum = 0;
    for (let t = 0; t < 32; t++) sum += v.proposalQ![t]!;
    expect(sum).toBe(2 ** 24);
    expect(v.proposalQ![4 * 32]).toBe(0); // greedy entry
    expect(v.proposalQ![12 * 32]).toBe(2 ** 24); // top_k 1
  });
});

describe("CONTRACT 7.2 step 5: batched drafting", () => {
  class Recording implements Drafter {
    readonly drafterIdentity = IDENT_D;
    readonly markovIdentity = IDENT_M;
    readonly window = GEOM.window;
    readonly numSpec = GEOM.numSpec;
    readonly vocabSize = GEOM.vocabSize;
    readonly numTaps = GEOM.numTaps;
    readonly hidden = GEOM.hidden;
    readonly capabilities = Capability.TAPS_BF16 | Capability.MARGIN | Capability.TOP32;
    calls: { slot: number; k: number; nRows: number; rows: number[] }[][] = [];
    inFlight = 0;
    maxInFlight = 0;
    mode: "ok" | "throw" | "reject" | "bad" | "async" = "ok";
    inner = new NullDrafter({ ...GEOM });
    draft(
      batch: readonly import("../src/index.js").DraftBatchEntry[],
      out: DraftOutput,
    ): void | Promise<void> {
      this.calls.push(batch.map((e) => ({ slot: e.slot, k: e.k, nRows: e.nRows, rows: positions(e.rows) })));
      if (this.mode === "throw") {
        out.draftIds[0] = 99; // a partial write that must not leak
        throw new Error("boom");
      }
      if (this.mode === "reject") return Promise.reject(new Error("async boom"));
      this.inner.draft(batch, out);
      if (this.mode === "bad") out.confidence[batch[0]!.index * out.numSpec] = Number.NaN;
      if (this.mode === "async") {
        this.inFlight++;
        this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
        return new Promise((resolve) =>
          setTimeout(() => {
            this.inFlight--;
            resolve();
          }, 5),
        );
      }
    }
  }

  test("one call per STEP with every consumed entry and its window rows", async () => {
    const rec = new Recording();
    const { ep } = await start({ drafter: rec });
    const s = await session(ep, rec);
    await s.step([
      entry({ slot: 0, anchorPos: 3, nRows: 3, nOut: 2 }),
      entry({ slot: 1, anchorPos: 3, flags: NEED_DRAFT }), // NEED_RESYNC
      entry({ slot: 2, anchorPos: 2, nRows: 2, flags: 0 }), // no NEED_DRAFT
      entry({ slot: 3, anchorPos: 12, rowStart: 10, nRows: 2 }), // PARTIAL
    ]);
    expect(rec.calls).toEqual([
      [
        { slot: 0, k: 2, nRows: 3, rows: [0, 1, 2] },
        { slot: 3, k: 4, nRows: 2, rows: [10, 11] },
      ],
    ]);
    await s.step([entry({ slot: 1, anchorPos: 3, flags: 0 })]);
    expect(rec.calls.length).toBe(1); // nothing consumed: no call
  });

  test("a throwing drafter: DRAFT_FAILED for the batch, values zero, windows applied", async () => {
    const rec = new Recording();
    rec.mode = "throw";
    const { ep, w } = await start({ drafter: rec });
    const s = await session(ep, rec);
    const r = await s.step([
      entry({ slot: 0, anchorPos: 3, nRows: 3 }),
      entry({ slot: 1, anchorPos: 1, flags: 0 }),
    ]);
    expect(r.status).toBe(FrameStatus.OK);
    expect(Array.from(r.views!.status)).toEqual([ReqStatus.DRAFT_FAILED, ReqStatus.NEED_RESYNC]);
    expect(r.views!.draftIds[0]).toBe(0);
    expect(w.debugWindow(0).nRows).toBe(3);
    rec.mode = "reject";
    const r2 = await s.step([entry({ slot: 0, anchorPos: 4, rowStart: 3, nRows: 1 })]);
    expect(r2.views!.status[0]).toBe(ReqStatus.DRAFT_FAILED);
    rec.mode = "ok";
    const r3 = await s.step([entry({ slot: 0, anchorPos: 5, rowStart: 4, nRows: 1 })]);
    expect(r3.views!.status[0]).toBe(ReqStatus.OK);
    expect((w.stats().counters as Record<string, number>).drafter_errors).toBe(2);
  });

  test("a drafter writing values that break 6.3: that entry DRAFT_FAILED, the others OK", async () => {
    const rec = new Recording();
    rec.mode = "bad";
    const { ep } = await start({ drafter: rec });
    const s = await session(ep, rec);
    const r = await s.step([entry({ slot: 0 }), entry({ slot: 1 })]);
    expect(Array.from(r.views!.status)).toEqual([ReqStatus.DRAFT_FAILED, ReqStatus.OK]);
  });

  test("an async drafter never sees two STEPs at once, across connections", async () => {
    const rec = new Recording();
    rec.mode = "async";
    const { ep } = await start({ drafter: rec });
    const s = await session(ep, rec);
    const others = await Promise.all([conn(ep), conn(ep), conn(ep)]);
    // CONTRACT 6.2 (1.1): each connection binds itself with a same-session re-HELLO first.
    for (const raw of others) await helloOn(raw, s);
    const sends = others.map((raw, i) => {
      const f = stepFrame({ seq: 100 + i, session: s.session, entries: [entry({ slot: i })] });
      return raw.send(f);
    });
    const pingConns = await Promise.all([conn(ep), conn(ep)]);
    const pings = pingConns.map((raw) => raw.send(frame({ op: Op.PING, seq: 1, session: 0 })));
    const res = await Promise.all(sends);
    await Promise.all(pings);
    expect(rec.maxInFlight).toBe(1);
    expect(res.filter((a) => a.status === FrameStatus.OK).length).toBeGreaterThanOrEqual(1);
    for (const a of res) {
      if (a.status !== FrameStatus.OK) expect(a.status).toBe(FrameStatus.STALE_SEQ);
      else {
        const v = decodeStepReply(a.body, { nReq: 1, numSpec: 4, margin: true, sampled: false });
        expect(v.status[0]).toBe(ReqStatus.OK);
      }
    }
  });
});

describe("CONTRACT 10: RESET", () => {
  test("drops all slot state and keeps the session", async () => {
    const { ep, d, w } = await start();
    const s = await session(ep, d);
    await s.step([
      entry({ slot: 0, anchorPos: 3, nRows: 3 }),
      entry({ slot: 1, generation: 9, anchorPos: 1, nRows: 1 }),
    ]);
    expect((await s.simple(Op.RESET)).status).toBe(FrameStatus.OK);
    expect(w.debugWindow(0).known).toBe(false);
    expect(w.debugWindow(1).known).toBe(false);
    const r = await s.step([
      entry({ slot: 0, anchorPos: 4, rowStart: 3, nRows: 1 }),
      entry({ slot: 1, generation: 2 }),
    ]);
    expect(r.status).toBe(FrameStatus.OK);
    expect(Array.from(r.views!.status)).toEqual([ReqStatus.PARTIAL_WINDOW, ReqStatus.OK]);
  });
});

describe("transports", () => {
  test("a unix socket and tcp share one worker state", async () => {
    const d = nullDrafter();
    const w = await createWorker({
      drafter: d,
      listen: ["tcp://127.0.0.1:0", `unix://${uniqueSock("both")}`],
    });
    open.workers.push(w);
    expect(w.endpoints[1]!.startsWith("unix://")).toBe(true);
    const a = await session(w.endpoints[0]!, d, 77);
    await a.step([entry({ slot: 0, anchorPos: 2, nRows: 2 })]);
    const b = new Sess(await conn(w.endpoints[1]!), 77, d);
    b.seq = a.seq;
    // CONTRACT 6.2 (1.1): the second connection binds itself with a same-session re-HELLO.
    expect((await b.doHello()).status).toBe(FrameStatus.OK);
    const r = await b.step([entry({ slot: 0, anchorPos: 3, rowStart: 2, nRows: 1 })]);
    expect(r.views!.windowRows[0]).toBe(3);
  });
});

describe("zmq", () => {
  test("HELLO + STEP over zmq+tcp, and BAD_FRAME for an unreadable header", async () => {
    const { ep, d, w } = await start({}, "zmq+tcp://127.0.0.1:0");
    expect(ep.startsWith("zmq+tcp://127.0.0.1:")).toBe(true);
    const s = await session(ep, d, 91);
    const r = await s.step([entry({ slot: 0, anchorPos: 2, nRows: 2 })]);
    expect(r.views!.windowRows[0]).toBe(2);
    expect(w.debugWindow(0).nRows).toBe(2);
    const bad = await conn(ep);
    const a = await bad.send(new Uint8Array(10));
    expect(a.status).toBe(FrameStatus.BAD_FRAME);
  });
});

describe("options", () => {
  test.each([
    ["maxSlots", { maxSlots: 0 }],
    ["maxRowsPerStep", { maxRowsPerStep: -1 }],
    ["takeover", { takeover: "maybe" }],
    ["sessionLease", { sessionLease: 1.5 }],
    ["name", { name: "x".repeat(33) }],
    ["token", { token: "" }],
    ["listen", { listen: [] }],
    ["slotBufferWindows", { slotBufferWindows: 1 }],
    ["logger", { logger: { info() {} } }],
    ["now", { now: 5 }],
    ["registry", { registry: {} }],
    ["drafter", { drafter: null }],
  ])("bad %s is refused naming it", async (name, over) => {
    await expect(createWorker({ drafter: nullDrafter(), ...(over as object) })).rejects.toThrow(name);
  });
});
