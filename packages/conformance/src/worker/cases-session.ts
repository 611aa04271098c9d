// Over 500 lines on purpose: a table of numbered cases (one object per case, each with its cited
// sentence); splitting it would only scatter one contract section's table over files.
/** Worker cases of CONTRACT 6.2: sessions, sequence numbers, takeover and bound connections (1.1). */
import { Op } from "@tapwire/wire";
import { frame, rowsOffsetFor } from "../frames.js";
import type { CaseCheck, CaseDef } from "../runner.js";
import type { Bound, WorkerCtx } from "./context.js";
import { st } from "./context.js";

type W = CaseDef<WorkerCtx>;

const BOUND =
  "CONTRACT 6.2 (1.1): STEP and RESET are accepted only on a connection bound to the current session; on any other connection (never bound, or bound to a session that has since been replaced) they are NO_SESSION, whatever session id they carry.";
const SEQ =
  "CONTRACT 6.2: STEP and RESET with a seq that is not newer than the session's highest: STALE_SEQ. Otherwise the seq becomes the highest.";
const ORDER =
  "CONTRACT 6.2: order of checks for STEP and RESET: bound connection and session (NO_SESSION) → seq (STALE_SEQ) → size (TOO_LARGE) → structure (7.2).";
const NEWSESS =
  "CONTRACT 6.2: a HELLO whose session differs from the current one makes the worker drop all slot state (every window and every generation) and take that session as current, with its seq as the session's highest seq.";

/** Largest STEP body of a bound session (CONTRACT 7.2). */
export function stepLimit(ctx: WorkerCtx, b: Bound): number {
  return rowsOffsetFor(b.maxSlots, b.sampled) + b.maxRowsPerStep * ctx.g.rowBytes;
}

async function withWindow(ctx: WorkerCtx, t: CaseCheck, sess = ctx.main): Promise<Bound> {
  const b = await ctx.bound(t, { sess });
  await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 4, nRows: 4, flags: 3, generation: 5 })]);
  return b;
}

/** Takes over with a fresh session on a new connection (waits out the lease under `refuse`). */
async function takeOver(ctx: WorkerCtx, t: CaseCheck): Promise<Bound> {
  return ctx.bound(t, { sess: ctx.newSess(), reset: false });
}

function stepOn(ctx: WorkerCtx, b: Bound, over: { session?: number; seq?: number } = {}): Uint8Array {
  return ctx.stepMsg(b, [ctx.entry(b, { slot: 0, anchorPos: 4 })], over);
}

export const sessionCases: W[] = [
  {
    id: "6.2.1",
    title: "HELLO with session 0 → BAD_FRAME, and the current session stays",
    cite: "CONTRACT 6.2: a HELLO with session 0 is BAD_FRAME.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await withWindow(ctx, t);
      const p = await ctx.peer();
      await ctx.refused(t, p, ctx.helloMsg(0, 1, ctx.helloFields(0, 1)), 3, "HELLO with session 0");
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 4, generation: 5 })]);
    },
  },
  {
    id: "6.2.2",
    title:
      "STEP carrying the current session id with a newer seq, on a connection that never said HELLO → NO_SESSION",
    cite: BOUND,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      const p = await ctx.peer();
      await ctx.refused(t, p, stepOn(ctx, b), 1, "STEP on an unbound connection");
    },
  },
  {
    id: "6.2.3",
    title: "STEP on a connection that never said HELLO → NO_SESSION",
    cite: BOUND,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      const p = await ctx.peer();
      await ctx.refused(
        t,
        p,
        stepOn(ctx, b, { session: ctx.rng.nonZero(), seq: 1 }),
        1,
        "STEP of an unknown session on an unbound connection",
      );
    },
  },
  {
    id: "6.2.4",
    title:
      "RESET carrying the current session id on a connection that never said HELLO → NO_SESSION (windows kept)",
    cite: BOUND,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await withWindow(ctx, t);
      const p = await ctx.peer();
      await ctx.refused(
        t,
        p,
        frame({ op: Op.RESET, seq: b.sess.next, session: b.sess.id }),
        1,
        "RESET on an unbound connection",
      );
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 4, generation: 5 })]);
    },
  },
  {
    id: "6.2.5",
    title: "STEP with session 0 on a bound connection → NO_SESSION",
    cite: "CONTRACT 6.2: STEP and RESET with a session other than the current one: NO_SESSION.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      await ctx.refused(t, b.peer, stepOn(ctx, b, { session: 0 }), 1, "STEP with session 0");
    },
  },
  {
    id: "6.2.6",
    title: "STEP with another session id on a bound connection → NO_SESSION",
    cite: "CONTRACT 6.2: STEP and RESET with a session other than the current one: NO_SESSION.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      await ctx.refused(
        t,
        b.peer,
        stepOn(ctx, b, { session: (b.sess.id ^ 0x5a5a) >>> 0 || 1 }),
        1,
        "STEP of another session",
      );
    },
  },
  {
    id: "6.2.7",
    title: "RESET with another session id on a bound connection → NO_SESSION",
    cite: "CONTRACT 6.2: STEP and RESET with a session other than the current one: NO_SESSION.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      await ctx.refused(
        t,
        b.peer,
        frame({ op: Op.RESET, seq: b.sess.next, session: (b.sess.id + 1) >>> 0 || 1 }),
        1,
        "RESET of another session",
      );
    },
  },
  ...[
    ["6.2.8", "STEP with seq equal to the session's highest → STALE_SEQ", 0],
    ["6.2.9", "STEP with seq one below the highest → STALE_SEQ", -1],
    ["6.2.10", "STEP with seq highest + 2^31 (not newer in serial arithmetic) → STALE_SEQ", 2 ** 31],
    ["6.2.11", "STEP with seq highest + 2^31 + 1 (older in serial arithmetic) → STALE_SEQ", 2 ** 31 + 1],
  ].map(
    ([id, title, d]): W => ({
      id: id as string,
      title: title as string,
      cite: `${SEQ} CONTRACT 2: newer(a, b) := ((a - b) mod 2^32) in [1, 2^31).`,
      async run(ctx: WorkerCtx, t: CaseCheck) {
        const b = await ctx.bound(t);
        await ctx.refused(
          t,
          b.peer,
          stepOn(ctx, b, { seq: (b.sess.hi + (d as number)) >>> 0 }),
          2,
          "STEP with a stale seq",
        );
      },
    }),
  ),
  {
    id: "6.2.12",
    title: "STEP with seq highest + 2^31 - 1 (the newest newer) → OK, and it becomes the highest",
    cite: `${SEQ} CONTRACT 2: newer(a, b) := ((a - b) mod 2^32) in [1, 2^31).`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      const old = b.sess.hi;
      const far = (old + 2 ** 31 - 1) >>> 0;
      b.sess.hi = (far - 1) >>> 0;
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 0 })]);
      await ctx.refused(
        t,
        b.peer,
        stepOn(ctx, b, { seq: (old + 1) >>> 0 }),
        2,
        "STEP with the seq after the old highest",
      );
    },
  },
  {
    id: "6.2.13",
    title: "sequence numbers wrap: STEPs with seq 0xfffffffe, 0xffffffff, 0, 1 are all OK",
    cite: "CONTRACT 2: sequence numbers are u32 compared as serial numbers (RFC 1982).",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const s = ctx.newSess(0xffffffff - 30);
      const b = await ctx.bound(t, { sess: s, reset: false });
      b.sess.hi = 0xfffffffd;
      for (let i = 0; i < 4; i++) await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 0 })]);
      t.must(b.sess.hi === 1, "the session's highest seq 1", () => String(b.sess.hi));
    },
  },
  {
    id: "6.2.14",
    title: "RESET with seq equal to the highest → STALE_SEQ",
    cite: SEQ,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      await ctx.refused(
        t,
        b.peer,
        frame({ op: Op.RESET, seq: b.sess.hi, session: b.sess.id }),
        2,
        "RESET with a stale seq",
      );
    },
  },
  {
    id: "6.2.15",
    title: "a RESET's seq becomes the highest: a STEP with the same seq → STALE_SEQ",
    cite: SEQ,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      await ctx.refused(t, b.peer, stepOn(ctx, b, { seq: b.sess.hi }), 2, "STEP with the RESET's seq");
    },
  },
  {
    id: "6.2.16",
    title: "a re-HELLO of the current session with seq equal to the highest → STALE_SEQ",
    cite: "CONTRACT 6.2: a HELLO with the current session ... its seq MUST be newer than the session's highest seq, else STALE_SEQ.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t, { reset: false });
      const seq = b.sess.hi;
      await ctx.refused(
        t,
        b.peer,
        ctx.helloMsg(b.sess.id, seq, ctx.helloFields(b.sess.id, seq)),
        2,
        "re-HELLO with the highest seq",
      );
    },
  },
  {
    id: "6.2.17",
    title: "a re-HELLO of the current session with an older seq → STALE_SEQ",
    cite: "CONTRACT 6.2: a HELLO with the current session ... its seq MUST be newer than the session's highest seq, else STALE_SEQ.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t, { reset: false });
      const seq = (b.sess.hi - 100) >>> 0;
      await ctx.refused(
        t,
        b.peer,
        ctx.helloMsg(b.sess.id, seq, ctx.helloFields(b.sess.id, seq)),
        2,
        "re-HELLO with an older seq",
      );
    },
  },
  {
    id: "6.2.18",
    title: "a re-HELLO's seq becomes the highest: a STEP with it → STALE_SEQ, the next one OK",
    cite: SEQ,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      await ctx.helloOk(t, b.peer, b.sess, { sampleMode: b.sampled ? 1 : 0, helloFlags: b.margin ? 1 : 0 });
      await ctx.refused(t, b.peer, stepOn(ctx, b, { seq: b.sess.hi }), 2, "STEP with the re-HELLO's seq");
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 0 })]);
    },
  },
  {
    id: "6.2.19",
    title:
      "a re-HELLO of the current session keeps the windows: windows_kept counts them, a slot continues OK",
    cite: "CONTRACT 6.2: a HELLO with the current session keeps the slot state (windows_kept = the number of slots whose window is non-empty).",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      await ctx.stepOk(t, b, [
        ctx.entry(b, { slot: 0, anchorPos: 3, nRows: 3, flags: 3 }),
        ctx.entry(b, { slot: 2, anchorPos: 5, nRows: 2, flags: 3 }),
        ctx.entry(b, { slot: 3, anchorPos: 0, flags: 2 }),
      ]);
      const p2 = await ctx.peer();
      const { r } = await ctx.helloOk(t, p2, b.sess, {
        sampleMode: b.sampled ? 1 : 0,
        helloFlags: b.margin ? 1 : 0,
      });
      t.must(r.windowsKept === 2, "windows_kept 2 (slots 0 and 2; slot 3 is empty)", () =>
        String(r.windowsKept),
      );
      await ctx.stepOk(t, { ...b, peer: p2 }, [
        ctx.entry(b, { slot: 0, anchorPos: 3 }),
        ctx.entry(b, { slot: 2, anchorPos: 6, nRows: 1 }),
      ]);
    },
  },
  {
    id: "6.2.20",
    title: "a HELLO of a new session drops every window: windows_kept 0, a continuing slot is NEED_RESYNC",
    cite: NEWSESS,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await withWindow(ctx, t);
      const b2 = await takeOver(ctx, t);
      t.must(b2.helloReply.windowsKept === 0, "windows_kept 0", () => String(b2.helloReply.windowsKept));
      await ctx.stepOk(t, b2, [ctx.entry(b2, { slot: 0, anchorPos: 4, generation: 5 })]);
    },
  },
  {
    id: "6.2.21",
    title:
      "a HELLO of a new session drops every generation: an older generation is accepted, not STALE_GENERATION",
    cite: NEWSESS,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await withWindow(ctx, t);
      const b2 = await takeOver(ctx, t);
      await ctx.stepOk(t, b2, [ctx.entry(b2, { slot: 0, anchorPos: 2, nRows: 2, flags: 3, generation: 2 })]);
    },
  },
  {
    id: "6.2.22",
    title: "a new session's HELLO seq becomes its highest: a STEP with that seq → STALE_SEQ, the next OK",
    cite: NEWSESS,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b2 = await takeOver(ctx, t);
      await ctx.refused(t, b2.peer, stepOn(ctx, b2, { seq: b2.sess.hi }), 2, "STEP with the HELLO's seq");
      await ctx.stepOk(t, b2, [ctx.entry(b2, { slot: 0, anchorPos: 0 })]);
    },
  },
  {
    id: "6.2.23",
    title: "a new session may start at any seq, even one older than the replaced session's highest",
    cite: NEWSESS,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await ctx.bound(t);
      const s = ctx.newSess((ctx.main.hi - 1000) >>> 0);
      const b2 = await ctx.bound(t, { sess: s, reset: false });
      await ctx.stepOk(t, b2, [ctx.entry(b2, { slot: 0, anchorPos: 0 })]);
    },
  },
  {
    id: "6.2.24",
    title:
      "a HELLO that makes a new session current unbinds every other connection: the old one's STEP → NO_SESSION",
    cite: `${BOUND} A HELLO that makes a new session current unbinds every other connection.`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const a = await ctx.bound(t);
      await takeOver(ctx, t);
      await ctx.refused(t, a.peer, stepOn(ctx, a), 1, "STEP of the replaced session");
    },
  },
  {
    id: "6.2.25",
    title:
      "a connection bound to a replaced session is not bound to the new one: its STEP carrying the new id → NO_SESSION",
    cite: BOUND,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const a = await ctx.bound(t);
      const b2 = await takeOver(ctx, t);
      await ctx.refused(
        t,
        a.peer,
        ctx.stepMsg(a, [ctx.entry(a, { slot: 0, anchorPos: 0 })], { session: b2.sess.id, seq: b2.sess.next }),
        1,
        "STEP of the new session on the old connection",
      );
      await ctx.stepOk(t, b2, [ctx.entry(b2, { slot: 0, anchorPos: 0 })]);
    },
  },
  {
    id: "6.2.26",
    title: "a same-session re-HELLO on a second connection leaves the first bound (both STEP)",
    cite: "CONTRACT 6.2 (1.1): a same-session re-HELLO binds its own connection and leaves the others bound.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const a = await ctx.bound(t);
      const p2 = await ctx.peer();
      await ctx.helloOk(t, p2, a.sess, { sampleMode: a.sampled ? 1 : 0, helloFlags: a.margin ? 1 : 0 });
      await ctx.stepOk(t, a, [ctx.entry(a, { slot: 0, anchorPos: 1, nRows: 1, flags: 3 })]);
      await ctx.stepOk(t, { ...a, peer: p2 }, [ctx.entry(a, { slot: 0, anchorPos: 2, nRows: 1 })]);
    },
  },
  {
    id: "6.2.27",
    title: "a session replaced and later taken back is new: its old connections stay unbound (NO_SESSION)",
    cite: "CONTRACT 11 (1.1): a connection stays bound only to the session it said HELLO to: a session that was replaced and is later taken back is new, and old connections stay unbound.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const a = await ctx.bound(t);
      await takeOver(ctx, t);
      const back = await ctx.bound(t, { sess: a.sess, reset: false });
      await ctx.refused(t, a.peer, stepOn(ctx, a), 1, "STEP on the connection bound before the takeover");
      t.must(back.helloReply.windowsKept === 0, "the taken-back session starts empty (windows_kept 0)", () =>
        String(back.helloReply.windowsKept),
      );
    },
  },
  {
    id: "6.2.28",
    title: "takeover allow: another session's HELLO while the current one is active → OK, it takes over",
    cite: "CONTRACT 6.2: a HELLO whose session differs makes the worker take that session as current — unless configured takeover: refuse.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (ctx.takeover !== "allow") t.info("a worker with takeover allow", "takeover refuse (see 6.2.29)");
      const a = await ctx.bound(t);
      const p = await ctx.peer();
      const s = ctx.newSess();
      const seq = s.next;
      const r = await p.call(
        t,
        ctx.helloMsg(s.id, seq, ctx.helloFields(s.id, seq)),
        "HELLO of another session",
      );
      t.must(r.h.status === 0, "OK", () => st(r.h.status));
      ctx.okFrame(s, seq, true);
      await ctx.refused(t, a.peer, stepOn(ctx, a), 1, "STEP of the replaced session");
    },
  },
  {
    id: "6.2.29",
    title:
      "takeover refuse: another session's HELLO within the lease → BUSY, and the current session is untouched",
    cite: "CONTRACT 6.2: configured takeover: refuse and the current session had a frame answered OK within session_lease: BUSY. CONTRACT 11: with a token the default is refuse.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (ctx.takeover !== "refuse")
        t.info("a worker with takeover refuse (a token, or --takeover refuse)", "takeover allow");
      const a = await withWindow(ctx, t);
      const p = await ctx.peer();
      const s = ctx.newSess();
      const seq = s.next;
      const r = await p.call(
        t,
        ctx.helloMsg(s.id, seq, ctx.helloFields(s.id, seq)),
        "HELLO of another session",
      );
      t.must(r.h.status === 10, "BUSY", () => st(r.h.status));
      await ctx.stepOk(t, a, [ctx.entry(a, { slot: 0, anchorPos: 4, generation: 5 })]);
    },
  },
  {
    id: "6.2.30",
    title: "takeover refuse: after the lease has run out, another session's HELLO → OK",
    cite: "CONTRACT 6.2: BUSY only while the current session had a frame answered OK within session_lease (default 10 s).",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (ctx.takeover !== "refuse") t.info("a worker with takeover refuse", "takeover allow");
      await ctx.bound(t);
      await takeOver(ctx, t);
    },
  },
  {
    id: "6.2.31",
    title: "order: a STEP with a stale seq on an unbound connection → NO_SESSION (not STALE_SEQ)",
    cite: ORDER,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      const p = await ctx.peer();
      await ctx.refused(t, p, stepOn(ctx, b, { seq: b.sess.hi }), 1, "stale STEP on an unbound connection");
    },
  },
  {
    id: "6.2.32",
    title: "order: a RESET with a stale seq on an unbound connection → NO_SESSION",
    cite: ORDER,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      const p = await ctx.peer();
      await ctx.refused(
        t,
        p,
        frame({ op: Op.RESET, seq: b.sess.hi, session: b.sess.id }),
        1,
        "stale RESET on an unbound connection",
      );
    },
  },
  {
    id: "6.2.33",
    title: "order: a STEP with a stale seq that is also too large → STALE_SEQ",
    cite: ORDER,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t, { maxSlots: 2, maxRowsPerStep: 2 });
      const m = ctx.stepMsg(b, [ctx.entry(b, { slot: 0, anchorPos: 30, nRows: 30, flags: 3 })], {
        seq: b.sess.hi,
      });
      await ctx.refused(t, b.peer, m, 2, "stale, too large STEP");
    },
  },
  {
    id: "6.2.34",
    title: "order: a STEP that is too large and structurally broken → TOO_LARGE",
    cite: ORDER,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t, { maxSlots: 2, maxRowsPerStep: 2 });
      const m = ctx.stepMsg(
        b,
        [ctx.entry(b, { slot: 0, anchorPos: 30, nRows: 30, flags: 3 | 8, reserved: 7 })],
        { stepFlags: 1 },
      );
      await ctx.refused(t, b.peer, m, 9, "too large, broken STEP");
    },
  },
  {
    id: "6.2.35",
    title: "the session's max_slots is its HELLO's: with max_slots 4, slot 4 → BAD_FRAME",
    cite: "CONTRACT 6.2: the session's limits are those its HELLO asked for; 7.2 checks frames against them.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (ctx.g.maxSlots < 5) t.info("a worker with max_slots > 4", `max_slots ${ctx.g.maxSlots}`);
      const b = await ctx.bound(t, { maxSlots: 4 });
      await ctx.refused(
        t,
        b.peer,
        ctx.stepMsg(b, [ctx.entry(b, { slot: 4, anchorPos: 0 })]),
        3,
        "STEP with slot 4",
      );
    },
  },
  {
    id: "6.2.36",
    title:
      "the session's max_rows_per_step is its HELLO's: with 2, a STEP of 3 rows → BAD_FRAME or TOO_LARGE by its size",
    cite: "CONTRACT 6.2: the session's limits are those its HELLO asked for; CONTRACT 7.2: n_rows <= max_rows_per_step; a body above the limit is TOO_LARGE.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t, { maxSlots: 8, maxRowsPerStep: 2 });
      const m = ctx.stepMsg(b, [ctx.entry(b, { slot: 0, anchorPos: 3, nRows: 3, flags: 3 })]);
      const want = m.length - 24 > stepLimit(ctx, b) ? 9 : 3;
      await ctx.refused(t, b.peer, m, want, "STEP of 3 rows");
    },
  },
  {
    id: "6.2.37",
    title:
      "a re-HELLO with a larger max_slots raises the session's limit (slot 6 accepted after max_slots 8)",
    cite: "CONTRACT 6.2: the session's limits are those its HELLO asked for.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (ctx.g.maxSlots < 8) t.info("a worker with max_slots >= 8", `max_slots ${ctx.g.maxSlots}`);
      const b = await ctx.bound(t, { maxSlots: 4 });
      await ctx.refused(
        t,
        b.peer,
        ctx.stepMsg(b, [ctx.entry(b, { slot: 6, anchorPos: 0 })]),
        3,
        "slot 6 with max_slots 4",
      );
      const { f } = await ctx.helloOk(t, b.peer, b.sess, {
        sampleMode: b.sampled ? 1 : 0,
        helloFlags: b.margin ? 1 : 0,
        maxSlots: 8,
      });
      await ctx.stepOk(t, { ...b, maxSlots: f.maxSlots }, [ctx.entry(b, { slot: 6, anchorPos: 0 })]);
    },
  },
  {
    id: "6.2.38",
    title: "a re-HELLO switching the session to TOP32 makes its STEPs carry sample meta (OK)",
    cite: "CONTRACT 6.2: the session's shape is that of its HELLO; CONTRACT 7.3: sample meta only in TOP32 sessions.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (!ctx.hasTop32) t.unimplemented("TOP32");
      const b = await ctx.bound(t, { sampled: false });
      await ctx.helloOk(t, b.peer, b.sess, { sampleMode: 1, helloFlags: b.margin ? 1 : 0 });
      const b2 = { ...b, sampled: true };
      await ctx.stepOk(t, b2, [ctx.entry(b2, { slot: 0, anchorPos: 2, nRows: 2, flags: 3 })]);
    },
  },
];
