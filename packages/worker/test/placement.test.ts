// STEP rows received in place (docs/worker.md "Rows received in place"): over tcp and unix the
// transport reads the rows of a large STEP straight into the slots' buffers, right after their
// windows, and the apply step commits them there. Counters prove which path ran; windows must be
// byte-identical to what was sent; a STEP answered non-OK, a connection dropped mid-rows, and a
// frame of another connection overtaking a placement must behave as CONTRACT 7.2 demands.
import * as net from "node:net";
import { uniqueSocketPath } from "@tapwire/testing";
import type { ReqEntry } from "@tapwire/wire";
import {
  EntryFlag,
  encodeHello,
  FrameStatus,
  frame,
  Op,
  ReqStatus,
  SampleMode,
  splitFrame,
} from "@tapwire/wire";
import { afterEach, describe, expect, test } from "vitest";
import type { Worker } from "../src/index.js";
import { createWorker } from "../src/index.js";
import { entry, helloFor, nullDrafter, Raw, rowsBytes, Sess, stepFrame } from "./helpers.js";

// The bench's row size: 3 taps x 4096 bf16 = 24 576 bytes; W = 8.
const GEO = { numTaps: 3, hidden: 4096, window: 8 } as const;
const RB = GEO.numTaps * GEO.hidden * 2;
const drafter = nullDrafter(GEO);
const HELLO = helloFor(drafter, { maxSlots: 16, maxRowsPerStep: 128 });

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const f of cleanups.splice(0).reverse()) await f();
});

function counters(w: Worker): Record<string, number> {
  return w.stats().counters as Record<string, number>;
}

async function start(listen: string, over: { receiveInPlace?: boolean } = {}): Promise<Worker> {
  const w = await createWorker({ drafter, listen: [listen], maxSlots: 16, maxRowsPerStep: 128, ...over });
  cleanups.push(() => w.close());
  return w;
}

async function session(w: Worker, id: number): Promise<Sess> {
  const raw = await new Raw(w.endpoints[0]!).connect();
  cleanups.push(() => raw.close());
  const s = new Sess(raw, id, drafter, HELLO);
  expect((await s.doHello()).status).toBe(FrameStatus.OK);
  return s;
}

/** Expected window of a slot: rows of positions [first, first + n) as stepFrame writes them. */
function expectWindow(w: Worker, slot: number, first: number, n: number, salt = 0): void {
  const got = w.debugWindow(slot);
  expect(got.nRows).toBe(n);
  if (n > 0) expect(got.firstPos).toBe(first);
  expect(Buffer.compare(Buffer.from(got.rows), Buffer.from(rowsBytes(first, n, RB, salt)))).toBe(0);
}

/** A raw stream connection writing frames in pieces (to stop mid-frame, or interleave). */
class Piecewise {
  private acc = Buffer.alloc(0);
  private waiters: ((b: Buffer) => void)[] = [];
  readonly closed: Promise<void>;
  private constructor(readonly sock: net.Socket) {
    sock.on("data", (d: Buffer) => {
      this.acc = Buffer.concat([this.acc, d]);
      while (this.acc.length >= 4 && this.acc.length >= 4 + this.acc.readUInt32LE(0)) {
        const n = this.acc.readUInt32LE(0);
        const body = this.acc.subarray(4, 4 + n);
        this.acc = this.acc.subarray(4 + n);
        this.waiters.shift()?.(body);
      }
    });
    sock.on("error", () => {});
    this.closed = new Promise((r) => sock.once("close", () => r()));
  }
  static async open(endpoint: string): Promise<Piecewise> {
    const m = /^tcp:\/\/(.+):(\d+)$/.exec(endpoint);
    const sock = await new Promise<net.Socket>((resolve, reject) => {
      const s =
        m !== null
          ? net.connect({ host: m[1]!, port: Number(m[2]) }, () => resolve(s))
          : net.connect({ path: endpoint.slice("unix://".length) }, () => resolve(s));
      s.once("error", reject);
    });
    sock.setNoDelay(true);
    const p = new Piecewise(sock);
    cleanups.push(() => sock.destroy());
    return p;
  }
  /** Writes the length prefix and `msg[from, to)` (from 0: the prefix first). */
  write(msg: Uint8Array, from: number, to: number): Promise<void> {
    const parts: Uint8Array[] = [];
    if (from === 0) {
      const h = Buffer.alloc(4);
      h.writeUInt32LE(msg.length);
      parts.push(h);
    }
    parts.push(msg.subarray(from, to));
    return new Promise((r) => this.sock.write(Buffer.concat(parts), () => r()));
  }
  /**
   * A same-session re-HELLO of `s` on this connection, so that it is bound (CONTRACT 6.2, 1.1:
   * STEP only on a connection that said HELLO); the other connections stay bound.
   */
  async hello(s: Sess): Promise<void> {
    const msg = frame({ op: Op.HELLO, seq: ++s.seq, session: s.session }, encodeHello(s.hello));
    await this.write(msg, 0, msg.length);
    expect((await this.reply()).status).toBe(FrameStatus.OK);
  }
  reply(): Promise<{ status: number; body: Uint8Array }> {
    return new Promise((resolve) =>
      this.waiters.push((b) => {
        const { header, body } = splitFrame(b, b.length);
        resolve({ status: header.status, body: body.slice() });
      }),
    );
  }
}

async function until(cond: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 2000 && !cond(); i++) await new Promise((r) => setTimeout(r, 5));
  expect(cond(), what).toBe(true);
}

const SCHEMES = [
  { scheme: "tcp", listen: () => "tcp://127.0.0.1:0", piecewise: true },
  { scheme: "unix", listen: () => `unix://${uniqueSocketPath("wp")}`, piecewise: true },
  // issue 23: the rows are copied once from the client's mapping into the windows
  { scheme: "shm+unix", listen: () => `shm+unix://${uniqueSocketPath("wm")}`, piecewise: false },
];

for (const c of SCHEMES) {
  describe(`${c.scheme}: STEP rows received in place`, () => {
    test("appends, RESYNC, generation resets, growth and compaction: rows placed, windows byte-identical", async () => {
      const w = await start(c.listen());
      const s = await session(w, 0x501);
      const slots = [0, 1, 2, 3, 4, 5, 6, 7];
      const ends = slots.map(() => 0);
      const gens = slots.map(() => 1);
      let sent = 0;
      // 40 STEPs of 8 slots: 1 row each (the buffers grow 8 -> 16 -> 32 rows, then compact every
      // 24 appends), every 5th STEP 3 rows, every 7th a RESYNC of slot 2, every 11th a new
      // generation of slot 5 (its window restarts at 0).
      for (let k = 0; k < 40; k++) {
        const entries: ReqEntry[] = slots.map((slot) => {
          let n = k % 5 === 4 ? 3 : 1;
          let flags: number = EntryFlag.NEED_DRAFT;
          let rowStart = ends[slot]!;
          if (slot === 2 && k % 7 === 6) {
            flags |= EntryFlag.RESYNC;
            n = 8;
            rowStart = Math.max(0, ends[slot]! + 1 - 8);
          }
          if (slot === 5 && k % 11 === 10) {
            gens[slot]!++;
            rowStart = 0;
          }
          ends[slot] = rowStart + n;
          sent += n;
          return entry({ slot, generation: gens[slot]!, rowStart, nRows: n, anchorPos: rowStart + n, flags });
        });
        const a = await s.step(entries);
        expect(a.status).toBe(FrameStatus.OK);
        expect(Array.from(a.views!.status)).toEqual(slots.map(() => ReqStatus.OK));
        for (const slot of slots) {
          const n = Math.min(8, ends[slot]!);
          expectWindow(w, slot, ends[slot]! - n, n);
        }
      }
      const cn = counters(w);
      expect(cn.steps_placed).toBe(40);
      expect(cn.rows_placed).toBe(sent);
      expect(cn.rows_copied).toBe(0);
      expect(cn.rows_applied).toBe(sent);
      expect(cn.placements_lost).toBe(0);
      expect(cn.transport_server_placed_messages).toBe(40);
    });

    test("a STEP that arrives whole, one with an entry above W rows, and receiveInPlace: false are copied", async () => {
      const w = await start(c.listen());
      const s = await session(w, 0x502);
      // 12 rows for one slot (> W): declined, copied (the window keeps the last 8).
      expect((await s.step([entry({ slot: 1, nRows: 12, anchorPos: 12 })])).status).toBe(FrameStatus.OK);
      expectWindow(w, 1, 4, 8);
      expect(counters(w).rows_copied).toBe(12);
      expect(counters(w).rows_placed).toBe(0);
      expect(counters(w).transport_server_placed_messages ?? 0).toBe(0);
      const off = await start(c.listen(), { receiveInPlace: false });
      const t = await session(off, 0x503);
      const e = [0, 1, 2, 3].map((slot) => entry({ slot, nRows: 2, anchorPos: 2 }));
      expect((await t.step(e)).status).toBe(FrameStatus.OK);
      expect(counters(off).rows_copied).toBe(8);
      expect(counters(off).rows_placed).toBe(0);
      expectWindow(off, 3, 0, 2);
    });

    // Partial writes on the socket (a STEP stopped mid-rows): a stream property; over shm a
    // request reaches the worker whole (its doorbell names every byte), so there is no mid-rows state.
    if (c.piecewise) {
      test("a placed STEP answered non-OK changes nothing (CONTRACT 7.2): STALE_SEQ and NO_SESSION after another connection's frame", async () => {
        const w = await start(c.listen());
        const s = await session(w, 0x504);
        const base = [0, 1, 2, 3].map((slot) => entry({ slot, nRows: 2, anchorPos: 2 }));
        expect((await s.step(base)).status).toBe(FrameStatus.OK);
        const before = [0, 1, 2, 3].map((k) => w.debugWindow(k));
        // Connection A: a STEP appending 2 rows to every slot, with seq 20; head and some rows only.
        const a = await Piecewise.open(w.endpoints[0]!);
        await a.hello(s);
        const msgA = stepFrame({
          seq: 20,
          session: 0x504,
          entries: [0, 1, 2, 3].map((slot) => entry({ slot, rowStart: 2, nRows: 2, anchorPos: 4 })),
          rowBytes: RB,
        });
        const placedBefore = counters(w).steps_placed ?? 0;
        await a.write(msgA, 0, 70_000);
        await until(() => counters(w).steps_placed === placedBefore + 1, "A placed");
        // The session's own connection moves seq past A's, touching other slots only.
        s.seq = 24;
        expect((await s.step([entry({ slot: 10, nRows: 1, anchorPos: 1 })])).status).toBe(FrameStatus.OK);
        await a.write(msgA, 70_000, msgA.length);
        expect((await a.reply()).status).toBe(FrameStatus.STALE_SEQ);
        // A's rows sat in free space after the windows: nothing changed.
        for (const k of [0, 1, 2, 3]) expect(w.debugWindow(k)).toEqual(before[k]);
        expect(counters(w).placements_lost).toBe(0);
        // And the windows go on as if A had never been sent.
        const more = [0, 1, 2, 3].map((slot) => entry({ slot, rowStart: 2, nRows: 2, anchorPos: 4 }));
        expect((await s.step(more)).status).toBe(FrameStatus.OK);
        for (const k of [0, 1, 2, 3]) expectWindow(w, k, 0, 4);
        // Again, overtaken by a takeover (a HELLO of another session): NO_SESSION, nothing applied.
        const msgB = stepFrame({
          seq: 40,
          session: 0x504,
          entries: [0, 1, 2, 3].map((slot) => entry({ slot, rowStart: 2, nRows: 2, anchorPos: 4 })),
          rowBytes: RB,
        });
        await a.write(msgB, 0, 70_000);
        await until(() => counters(w).steps_placed === placedBefore + 2, "B placed");
        const other = await session(w, 0x777);
        expect((await other.step([entry({ slot: 9, nRows: 3, anchorPos: 3 })])).status).toBe(FrameStatus.OK);
        await a.write(msgB, 70_000, msgB.length);
        expect((await a.reply()).status).toBe(FrameStatus.NO_SESSION);
        for (const k of [0, 1, 2, 3]) expectWindow(w, k, 0, 0);
        expectWindow(w, 9, 0, 3);
        // Placed and applied: base, more, the new session's 3 rows; never A's or B's.
        expect(counters(w).rows_placed).toBe(8 + 8 + 3);
        expect(counters(w).steps_placed).toBe(placedBefore + 4);
      });

      test("a re-HELLO lowering max_slots between placement and apply: the placed STEP is checked again, BAD_FRAME, nothing applied", async () => {
        const w = await start(c.listen());
        const s = await session(w, 0x507);
        const slots = [0, 1, 2, 3, 4, 5, 6, 7];
        expect((await s.step(slots.map((slot) => entry({ slot, nRows: 1, anchorPos: 1 })))).status).toBe(
          FrameStatus.OK,
        );
        const a = await Piecewise.open(w.endpoints[0]!);
        await a.hello(s);
        const msg = stepFrame({
          seq: 30,
          session: 0x507,
          entries: slots.map((slot) => entry({ slot, rowStart: 1, nRows: 1, anchorPos: 2 })),
          rowBytes: RB,
        });
        await a.write(msg, 0, 70_000);
        await until(() => counters(w).steps_placed === 2, "placed");
        s.seq = 24;
        expect((await s.doHello({ maxSlots: 4 })).status).toBe(FrameStatus.OK);
        await a.write(msg, 70_000, msg.length);
        expect((await a.reply()).status).toBe(FrameStatus.BAD_FRAME);
        for (const slot of [0, 1, 2, 3]) expectWindow(w, slot, 0, 1);
        for (const slot of [4, 5, 6, 7]) expectWindow(w, slot, 0, 0);
        // The session goes on: its next STEP is placed and applied.
        const r = await s.step(
          [0, 1, 2, 3].map((slot) => entry({ slot, rowStart: 1, nRows: 2, anchorPos: 3 })),
        );
        expect(r.status).toBe(FrameStatus.OK);
        for (const slot of [0, 1, 2, 3]) expectWindow(w, slot, 0, 3);
        expect(counters(w).rows_placed).toBe(8 + 8);
      });

      test("a connection dropped mid-rows leaves the windows untouched; the next STEPs are placed correctly", async () => {
        const w = await start(c.listen());
        const s = await session(w, 0x505);
        const slots = [0, 1, 2, 3, 4, 5];
        expect((await s.step(slots.map((slot) => entry({ slot, nRows: 3, anchorPos: 3 })))).status).toBe(
          FrameStatus.OK,
        );
        const a = await Piecewise.open(w.endpoints[0]!);
        await a.hello(s);
        const msg = stepFrame({
          seq: s.seq + 1,
          session: 0x505,
          entries: slots.map((slot) => entry({ slot, rowStart: 3, nRows: 2, anchorPos: 5 })),
          rowBytes: RB,
          salt: 99,
        });
        await a.write(msg, 0, 150_000);
        await until(() => counters(w).steps_placed === 2, "placed");
        a.sock.destroy();
        await a.closed;
        await until(() => (counters(w).transport_server_errors ?? 0) >= 1, "truncated request counted");
        for (const slot of slots) expectWindow(w, slot, 0, 3);
        // The same STEP from the session's own connection: applied, windows exact (the pending
        // placement of the dropped frame is abandoned first).
        const r = await s.step(slots.map((slot) => entry({ slot, rowStart: 3, nRows: 2, anchorPos: 5 })));
        expect(r.status).toBe(FrameStatus.OK);
        expect(Array.from(r.views!.status)).toEqual(slots.map(() => ReqStatus.OK));
        for (const slot of slots) expectWindow(w, slot, 0, 5);
        expect(counters(w).rows_placed).toBe(18 + 12);
        expect(counters(w).placements_lost).toBe(0);
      });

      test("interleaving guard: another connection's STEP on the same slots between placement and apply -> those entries NEED_RESYNC, windows dropped, never clobbered", async () => {
        const w = await start(c.listen());
        const s = await session(w, 0x506);
        const slots = [0, 1, 2, 3];
        expect((await s.step(slots.map((slot) => entry({ slot, nRows: 2, anchorPos: 2 })))).status).toBe(
          FrameStatus.OK,
        );
        // A (seq 30) is placed: rows 2..3 of slots 0-3 go after the windows.
        const a = await Piecewise.open(w.endpoints[0]!);
        await a.hello(s);
        const msg = stepFrame({
          seq: 30,
          session: 0x506,
          entries: [
            ...slots.map((slot) => entry({ slot, rowStart: 2, nRows: 2, anchorPos: 4 })),
            entry({ slot: 7, nRows: 1, anchorPos: 1 }),
          ],
          rowBytes: RB,
          salt: 5,
        });
        await a.write(msg, 0, 60_000);
        await until(() => counters(w).steps_placed === 2, "A placed");
        // B (seq 29, same session, another connection of the client) appends to slots 0 and 1.
        s.seq = 28;
        const b = await s.step([0, 1].map((slot) => entry({ slot, rowStart: 2, nRows: 2, anchorPos: 4 })));
        expect(b.status).toBe(FrameStatus.OK);
        for (const slot of [0, 1]) expectWindow(w, slot, 0, 4);
        // A's remaining rows arrive (into the abandoned buffers for slots 0-1: B's windows hold).
        await a.write(msg, 60_000, msg.length);
        expect((await a.reply()).status).toBe(FrameStatus.OK);
        // Slots 0-1: A's placement was overtaken: window dropped, NEED_RESYNC. Slots 2-3 and 7: applied.
        s.seq = 30;
        const probe = await s.step(
          [0, 1, 2, 3, 7].map((slot) => entry({ slot, anchorPos: slot === 7 ? 1 : 4, flags: 0 })),
        );
        expect(Array.from(probe.views!.status)).toEqual([
          ReqStatus.NEED_RESYNC,
          ReqStatus.NEED_RESYNC,
          ReqStatus.OK,
          ReqStatus.OK,
          ReqStatus.OK,
        ]);
        expectWindow(w, 0, 0, 0);
        expectWindow(w, 1, 0, 0);
        const two = w.debugWindow(2);
        expect(two.nRows).toBe(4);
        expect(
          Buffer.compare(Buffer.from(two.rows.subarray(0, 2 * RB)), Buffer.from(rowsBytes(0, 2, RB))),
        ).toBe(0);
        expect(
          Buffer.compare(Buffer.from(two.rows.subarray(2 * RB)), Buffer.from(rowsBytes(2, 2, RB, 5))),
        ).toBe(0);
        expect(counters(w).placements_lost).toBe(2);
        expect(counters(w).rows_placed).toBe(8 + 4 + 5);
      });
    }
  });
}

test("TOP32 session over unix: sample meta in the head, rows placed, sampled drafts valid", async () => {
  const w = await start(`unix://${uniqueSocketPath("wt")}`);
  const raw = await new Raw(w.endpoints[0]!).connect();
  cleanups.push(() => raw.close());
  const s = new Sess(raw, 0x520, drafter, { ...HELLO, sampleMode: SampleMode.TOP32 });
  expect((await s.doHello()).status).toBe(FrameStatus.OK);
  const slots = [0, 3, 5, 9, 11];
  for (let k = 0; k < 3; k++) {
    const e = slots.map((slot) => entry({ slot, rowStart: 2 * k, nRows: 2, anchorPos: 2 * k + 2 }));
    const meta = slots.map((_, i) => ({ seed: 7 + i, topK: 4, tempMilli: i % 2 === 0 ? 800 : 0 }));
    const a = await s.step(e, { sampleMeta: meta });
    expect(a.status).toBe(FrameStatus.OK);
    expect(Array.from(a.views!.status)).toEqual(slots.map(() => ReqStatus.OK));
  }
  for (const slot of slots) expectWindow(w, slot, 0, 6);
  expect(counters(w).rows_placed).toBe(30);
  expect(counters(w).rows_copied).toBe(0);
});

test("zmq: the copy path (whole messages), windows identical", async () => {
  const w = await start(`zmq+ipc://${uniqueSocketPath("wq")}`);
  const s = await session(w, 0x510);
  const e = [0, 1, 2, 3, 4, 5].map((slot) => entry({ slot, nRows: 2, anchorPos: 2 }));
  expect((await s.step(e)).status).toBe(FrameStatus.OK);
  expectWindow(w, 5, 0, 2);
  expect(counters(w).rows_copied).toBe(12);
  expect(counters(w).rows_placed).toBe(0);
});
