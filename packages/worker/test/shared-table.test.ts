// CONTRACT 12.1, the session table of a shared worker as a state machine: WorkerCore with an
// injected clock and explicit connections (no sockets; the socket tests are shared-socket.test.ts).
import type { Hello } from "@tapwire/wire";
import { Capability, decodeHelloReply, encodeHello, FrameStatus, frame, Op, splitFrame } from "@tapwire/wire";
import { describe, expect, test } from "vitest";
import type { FrameConn, WorkerCoreOptions } from "../src/index.js";
import { WorkerCore } from "../src/index.js";
import { entry, GEOM, helloFor, nullDrafter, ROW_BYTES, stepFrame } from "./helpers.js";

const d = nullDrafter();
const LEASE = 1_000;
const IDLE = 5_000;
/** One session's reservation with `maxSlots` 4: 4 x W x row_bytes. */
const RES4 = 4 * GEOM.window * ROW_BYTES;

interface Conn extends FrameConn {
  unbound: number;
  name: string;
}

function conn(name: string): Conn {
  const c: Conn = { unbound: 0, name, unbind: () => void c.unbound++ };
  return c;
}

class Rig {
  now = 1_000;
  readonly core: WorkerCore;
  readonly seqs = new Map<number, number>();
  constructor(over: Partial<WorkerCoreOptions> = {}) {
    this.core = new WorkerCore({
      drafter: d,
      maxSlots: 16,
      maxRowsPerStep: 64,
      maxSessions: 2,
      sessionLease: LEASE,
      sessionIdleMs: IDLE,
      now: () => this.now,
      ...over,
    });
  }
  nextSeq(s: number): number {
    const v = (this.seqs.get(s) ?? 0) + 1;
    this.seqs.set(s, v);
    return v;
  }
  async send(c: FrameConn, msg: Uint8Array) {
    const r = await this.core.handle(msg, c);
    const { header, body } = splitFrame(r, r.length);
    return { ...header, body: body.slice() };
  }
  async hello(c: FrameConn, s: number, over: Partial<Hello> = {}) {
    const a = await this.send(
      c,
      frame(
        { op: Op.HELLO, seq: this.nextSeq(s), session: s },
        encodeHello(helloFor(d, { maxSlots: 4, ...over })),
      ),
    );
    return { ...a, reply: a.body.length === 128 ? decodeHelloReply(a.body) : null };
  }
  /** Slot `slot` gets rows 0..n-1 (salted by the session, so windows differ). */
  step(c: FrameConn, s: number, slot: number, n: number, session = s) {
    return this.send(
      c,
      stepFrame({
        seq: this.nextSeq(s),
        session,
        entries: [entry({ slot, anchorPos: n, nRows: n, flags: 3 })],
        salt: s & 0xff,
      }),
    );
  }
  reset(c: FrameConn, s: number) {
    return this.send(c, frame({ op: Op.RESET, seq: this.nextSeq(s), session: s }));
  }
  async stats(c: FrameConn): Promise<{ json: Record<string, unknown>; text: string }> {
    const a = await this.send(c, frame({ op: Op.STATS, seq: 1, session: 0 }));
    const text = Buffer.from(a.body).toString("utf8");
    return { json: JSON.parse(text) as Record<string, unknown>, text };
  }
  window(slot: number, s: number) {
    return this.core.debugWindow(slot, s);
  }
}

const A = 0xa1a1a1a1;
const B = 0xb2b2b2b2;
const C = 0xc3c3c3c3;

describe("CONTRACT 12.1: a shared worker's sessions", () => {
  test("K = 1 (default) sets no SHARED bit; K > 1 sets it in every HelloReply", async () => {
    const one = new Rig({ maxSessions: 1 });
    const a1 = await one.hello(conn("a"), A);
    expect(a1.reply!.capabilities & Capability.SHARED).toBe(0);
    const two = new Rig();
    const a2 = await two.hello(conn("a"), A);
    expect(a2.reply!.capabilities & Capability.SHARED).toBe(Capability.SHARED);
    // Also on a refusal that carries a HelloReply (CONFIG_MISMATCH).
    const bad = await two.hello(conn("x"), B, { window: GEOM.window + 1 });
    expect(bad.status).toBe(FrameStatus.CONFIG_MISMATCH);
    expect(bad.reply!.capabilities & Capability.SHARED).toBe(Capability.SHARED);
  });

  test("each held session has its own slots, generations and seq; STEP acts on the connection's session", async () => {
    const r = new Rig();
    const ca = conn("a");
    const cb = conn("b");
    expect((await r.hello(ca, A)).status).toBe(FrameStatus.OK);
    expect((await r.hello(cb, B)).status).toBe(FrameStatus.OK);
    expect((await r.step(ca, A, 3, 5)).status).toBe(FrameStatus.OK);
    expect((await r.step(cb, B, 3, 2)).status).toBe(FrameStatus.OK);
    const wa = r.window(3, A);
    const wb = r.window(3, B);
    expect([wa.nRows, wb.nRows]).toEqual([5, 2]);
    expect(
      Buffer.from(wa.rows.subarray(0, ROW_BYTES)).equals(Buffer.from(wb.rows.subarray(0, ROW_BYTES))),
    ).toBe(false);
    // B's id on A's connection: NO_SESSION (the connection is bound to A), nothing changes.
    expect((await r.step(ca, B, 3, 7, B)).status).toBe(FrameStatus.NO_SESSION);
    expect(r.window(3, B).nRows).toBe(2);
    // Seq per session: A's seq is far ahead of B's; B's next seq is still newer for B.
    for (let i = 0; i < 5; i++) await r.step(ca, A, 1, 1);
    expect((await r.step(cb, B, 1, 1)).status).toBe(FrameStatus.OK);
    // A stale seq of B is B's business only.
    const stale = stepFrame({ seq: 1, session: B, entries: [entry({ slot: 0 })] });
    expect((await r.send(cb, stale)).status).toBe(FrameStatus.STALE_SEQ);
    expect((await r.step(ca, A, 1, 1)).status).toBe(FrameStatus.OK);
  });

  test("a HELLO moves its connection to its session and unbinds no connection of another", async () => {
    const r = new Rig();
    const a1 = conn("a1");
    const a2 = conn("a2");
    await r.hello(a1, A);
    r.seqs.set(A, r.seqs.get(A)!);
    expect((await r.hello(a2, A)).status).toBe(FrameStatus.OK);
    expect((await r.hello(a2, B)).status).toBe(FrameStatus.OK);
    // a2 now acts on B; a1 still on A.
    expect((await r.step(a2, B, 0, 1)).status).toBe(FrameStatus.OK);
    expect((await r.step(a1, A, 0, 3)).status).toBe(FrameStatus.OK);
    expect((await r.step(a2, A, 0, 3)).status).toBe(FrameStatus.NO_SESSION);
    expect([a1.unbound, a2.unbound]).toEqual([0, 0]);
    expect(r.core.heldSessions).toEqual([A, B]);
  });

  test("RESET drops the slot state of its own session only", async () => {
    const r = new Rig();
    const ca = conn("a");
    const cb = conn("b");
    await r.hello(ca, A);
    await r.hello(cb, B);
    await r.step(ca, A, 2, 4);
    await r.step(cb, B, 2, 4);
    expect((await r.reset(ca, A)).status).toBe(FrameStatus.OK);
    expect(r.window(2, A).known).toBe(false);
    expect(r.window(2, B).nRows).toBe(4);
    // RESET on an unbound connection: NO_SESSION.
    expect((await r.reset(conn("x"), B)).status).toBe(FrameStatus.NO_SESSION);
    expect(r.window(2, B).nRows).toBe(4);
  });

  test("at capacity with every session live: BUSY, and BUSY changes no state", async () => {
    const r = new Rig();
    const ca = conn("a");
    const cb = conn("b");
    await r.hello(ca, A);
    await r.hello(cb, B);
    await r.step(ca, A, 0, 3);
    const before = {
      ids: r.core.heldSessions,
      wa: r.window(0, A),
      stats: (await r.stats(ca)).json.highest_seq,
    };
    const cc = conn("c");
    expect((await r.hello(cc, C)).status).toBe(FrameStatus.BUSY);
    expect(r.core.heldSessions).toEqual(before.ids);
    expect(r.window(0, A)).toEqual(before.wa);
    expect((await r.stats(ca)).json.highest_seq).toBe(before.stats);
    expect((await r.step(cc, C, 0, 1)).status).toBe(FrameStatus.NO_SESSION);
    expect([ca.unbound, cb.unbound]).toEqual([0, 0]);
  });

  test("a session whose last bound connection closed is droppable: the next HELLO is admitted at once", async () => {
    const r = new Rig();
    const ca = conn("a");
    const cb = conn("b");
    await r.hello(ca, A);
    await r.hello(cb, B);
    r.core.connectionClosed(ca);
    expect((await r.hello(conn("c"), C)).status).toBe(FrameStatus.OK);
    expect(r.core.heldSessions).toEqual([B, C]);
  });

  test("past the lease with an open connection: droppable, idle longest first, as few as needed", async () => {
    const r = new Rig({ maxSessions: 3 });
    const ca = conn("a");
    const cb = conn("b");
    const cc = conn("c");
    await r.hello(ca, A);
    r.now += 10;
    await r.hello(cb, B);
    r.now += 10;
    await r.hello(cc, C);
    r.now += LEASE + 100; // all three past the lease, A idle longest
    const D = 0xd4d4d4d4;
    expect((await r.hello(conn("d"), D)).status).toBe(FrameStatus.OK);
    expect(r.core.heldSessions).toEqual([B, C, D]);
    // A's connection stays open but is unbound: its next STEP is NO_SESSION.
    expect(ca.unbound).toBe(1);
    expect((await r.step(ca, A, 0, 1)).status).toBe(FrameStatus.NO_SESSION);
    expect(cb.unbound).toBe(0);
  });

  test("never a live session: a live one is kept even when it is idle longer than a droppable one", async () => {
    const r = new Rig();
    const ca = conn("a");
    const cb = conn("b");
    await r.hello(ca, A);
    r.now += LEASE / 2;
    await r.hello(cb, B);
    r.core.connectionClosed(cb); // B droppable; A idle longer but live
    r.now += LEASE / 4;
    expect((await r.hello(conn("c"), C)).status).toBe(FrameStatus.OK);
    expect(r.core.heldSessions).toEqual([A, C]);
  });

  test("reservations: alone above max_window_bytes is CONFIG_MISMATCH; the whole plan first, nothing dropped on BUSY", async () => {
    // Room for 8 slots' reservation; K = 3.
    const r = new Rig({ maxSessions: 3, maxWindowBytes: 2 * RES4 });
    const too = await r.hello(conn("x"), C, { maxSlots: 12 });
    expect(too.status).toBe(FrameStatus.CONFIG_MISMATCH);
    const ca = conn("a");
    const cb = conn("b");
    await r.hello(ca, A, { maxSlots: 3 }); // 3 of 8
    await r.hello(cb, B, { maxSlots: 4 }); // 7 of 8
    r.core.connectionClosed(ca); // A droppable, B live
    // C asks 8 slots: needs A's and B's room; B is live -> BUSY, and A is NOT dropped.
    expect((await r.hello(conn("c"), C, { maxSlots: 8 })).status).toBe(FrameStatus.BUSY);
    expect(r.core.heldSessions).toEqual([A, B]);
    // C asks 2 slots: fits once A is dropped (seats are free: K = 3, but bytes are not).
    expect((await r.hello(conn("c"), C, { maxSlots: 2 })).status).toBe(FrameStatus.OK);
    expect(r.core.heldSessions).toEqual([B, C]);
    expect((await r.stats(cb)).json.worker).toMatchObject({ window_bytes_reserved: RES4 + RES4 / 2 });
  });

  test("a re-HELLO's reservation is checked with its own old one counted free", async () => {
    const r = new Rig({ maxSessions: 2, maxWindowBytes: 2 * RES4 });
    const ca = conn("a");
    const cb = conn("b");
    await r.hello(ca, A, { maxSlots: 4 });
    await r.hello(cb, B, { maxSlots: 2 });
    // A grows to 6 slots: 6 + 2 = 8 fits with its old 4 counted free.
    expect((await r.hello(ca, A, { maxSlots: 6 })).status).toBe(FrameStatus.OK);
    // A grows to 7: 7 + 2 > 8 and B is live: BUSY; A keeps its 6.
    expect((await r.hello(ca, A, { maxSlots: 7 })).status).toBe(FrameStatus.BUSY);
    expect((await r.stats(ca)).json.reservation_bytes).toBe((6 * RES4) / 4);
  });

  test("a session idle for session_idle_ms is dropped, open connection or not, and its memory returned", async () => {
    const r = new Rig();
    const ca = conn("a");
    const cb = conn("b");
    await r.hello(ca, A);
    await r.hello(cb, B);
    await r.step(ca, A, 0, 8);
    await r.step(ca, A, 1, 8);
    const held = (await r.stats(cb)).json.worker as Record<string, number>;
    expect(held.slot_bytes).toBeGreaterThan(0);
    r.now += IDLE / 2;
    await r.step(cb, B, 0, 1); // B stays fresh
    r.now += IDLE / 2;
    r.core.sweepIdle();
    expect(r.core.heldSessions).toEqual([B]);
    expect(ca.unbound).toBe(1);
    const after = (await r.stats(cb)).json.worker as Record<string, number>;
    expect(after.sessions_held).toBe(1);
    expect(after.slot_bytes).toBeLessThan(held.slot_bytes!);
    expect((await r.step(ca, A, 0, 1)).status).toBe(FrameStatus.NO_SESSION);
    // Its client re-HELLOs: a new session (windows_kept 0).
    const again = await r.hello(ca, A);
    expect(again.status).toBe(FrameStatus.OK);
    expect(again.reply!.windowsKept).toBe(0);
    const counters = (await r.stats(cb)).json.counters as Record<string, number>;
    expect(counters.sessions_dropped_idle).toBe(1);
    expect(counters.sessions_admitted).toBe(3);
  });

  test("STATS: a bound connection sees its own session and worker totals only; unbound, no id and no seq", async () => {
    const r = new Rig();
    const ca = conn("a");
    const cb = conn("b");
    await r.hello(ca, A);
    await r.hello(cb, B);
    for (let i = 0; i < 3; i++) await r.step(cb, B, i, 2);
    const bSeq = r.seqs.get(B)!;
    const sa = await r.stats(ca);
    expect(sa.json.session).toBe(A);
    expect(sa.json.steps).toBe(0);
    expect(sa.text).not.toContain(String(B));
    expect(sa.text.toLowerCase()).not.toContain(B.toString(16));
    expect(sa.text).not.toContain(`"highest_seq":${bSeq}`);
    expect((sa.json.worker as Record<string, number>).sessions_held).toBe(2);
    const sb = await r.stats(cb);
    expect([sb.json.session, sb.json.highest_seq, sb.json.steps]).toEqual([B, bSeq, 3]);
    const su = await r.stats(conn("u"));
    expect(su.json.session).toBeUndefined();
    expect(su.json.highest_seq).toBeUndefined();
    for (const id of [A, B]) {
      expect(su.text).not.toContain(String(id));
      expect(su.text.toLowerCase()).not.toContain(id.toString(16));
    }
  });

  test("per-client metrics: at most 32 client_name labels, the rest counted as other", async () => {
    const r = new Rig();
    for (let i = 0; i < 40; i++) {
      const c = conn(`c${i}`);
      expect((await r.hello(c, 0x100 + i, { clientName: `engine-${i}` })).status).toBe(FrameStatus.OK);
      expect((await r.step(c, 0x100 + i, 0, 1)).status).toBe(FrameStatus.OK);
      r.core.connectionClosed(c);
    }
    const text = r.core.clientMetricsText();
    const rounds = text.split("\n").filter((l) => l.includes("client_rounds_total{"));
    expect(rounds.length).toBe(33);
    expect(text).toContain('client_rounds_total{client="other"} 8');
    expect(text).toContain('client_rounds_total{client="engine-0"} 1');
  });
});
