// Over 500 lines on purpose: a table of numbered cases (one object per case, each with its cited
// sentence of CONTRACT 12.1); splitting it would only scatter one section's table over files.
/**
 * Worker cases of CONTRACT 12.1 (1.2): a shared worker holding several sessions at once
 * (`tapwire-conformance worker --shared`). Every frame is built and every reply checked from the
 * contract tables (frames.ts, validate.ts), as the other worker cases.
 */
import { Op } from "@tapwire/wire";
import type { EntryFields, HelloFields, HelloReplyFields } from "../frames.js";
import { frame, u32 } from "../frames.js";
import type { CaseCheck, CaseDef } from "../runner.js";
import { helloReplyProblems } from "../validate.js";
import type { Bound, Peer, Sess, WorkerCtx } from "./context.js";
import { st } from "./context.js";

/** Options of the shared cases (flag names as `tapwire-worker`'s). */
export interface SharedOptions {
  /** The worker's `max_sessions` K (default 4). */
  maxSessions?: number;
  /** The worker's `session_idle_ms`, when known: 12.1.18 waits it out. */
  sessionIdleMs?: number;
  /** The worker's `max_window_bytes`, when known: 12.1.17 checks a reservation above it. */
  maxWindowBytes?: number;
}

/** The worker context plus what the shared cases know of the worker. */
export interface SharedCtx extends WorkerCtx {
  shared: Required<Pick<SharedOptions, "maxSessions">> & SharedOptions;
}

type S = CaseDef<SharedCtx>;

const SHARED_BIT = 8;
const WORDS_SHARED =
  "CONTRACT 12.1: a worker configured with max_sessions = K > 1 holds up to K sessions at once and sets capability bit 3 SHARED in every HelloReply.";
const OWN =
  "CONTRACT 12.1: each held session has its own slots (slot 3 of session A and slot 3 of session B are different windows), generations, highest seq, limits (from its HELLO), lease and bound connections.";
const ACTS =
  "CONTRACT 12.1: STEP and RESET act on the session their connection is bound to; RESET drops that session's slot state only.";
const MOVES =
  "CONTRACT 12.1: a HELLO binds its connection to its session (moving it from any other session it was bound to) and unbinds no connection of any other held session.";
const ADMIT =
  "CONTRACT 12.1: a HELLO of a session not held is admitted when, after dropping droppable sessions idle longest first, as few as needed, fewer than K sessions are held and its reservation fits; the worker decides the whole plan first and drops nothing unless the HELLO is then admitted (a BUSY changes no state, 5).";
const NEVER_LIVE =
  "CONTRACT 12.1: a session is live while it has an open bound connection and its idle time is below session_lease; a shared worker never drops a live session to admit another.";
const DROPPING =
  "CONTRACT 12.1: dropping a session discards its slot state and reservation and unbinds its connections, which stay open: their next STEP or RESET is NO_SESSION.";
const ISOLATION =
  "CONTRACT 12.1: STATS on a bound connection reports its own session (id, seq, slots, counters) and worker-wide totals, never another session's id, seq, slots or counters; on an unbound connection no session id and no seq at all (10).";
const BATCHING =
  "CONTRACT 12.1: drafting is a function of each entry's window, anchor token and sample meta only, so every reply MUST be byte-identical (except worker_us) to the reply the same STEP gets when it is drafted alone; a STEP that arrives while a drafter call runs joins the next call.";

/** A HELLO of `sess` on `peer`; the reply is validated (CONTRACT 6.1) whatever its status. */
async function hello(
  ctx: SharedCtx,
  t: CaseCheck,
  peer: Peer,
  sess: Sess,
  over: Partial<HelloFields> = {},
): Promise<{ status: number; f: HelloFields; r: HelloReplyFields | null; seq: number }> {
  const seq = (sess.hi + 17) >>> 0;
  const f = ctx.helloFields(sess.id, seq, over);
  const reply = await peer.call(t, ctx.helloMsg(sess.id, seq, f), `HELLO of session ${sess.id}`);
  const status = reply.h.status;
  let r: HelloReplyFields | null = null;
  if (reply.body.length > 0) {
    const v = helloReplyProblems(reply.body, status, f);
    t.must(v.problems.length === 0 && v.r !== null, "a valid HelloReply (CONTRACT 6.1)", () =>
      v.problems.join("; "),
    );
    r = v.r;
  }
  if (status === 0) sess.hi = seq;
  return { status, f, r, seq };
}

/**
 * A fresh session admitted on a new connection. A BUSY is retried for a bounded time: the
 * previous case's sessions become droppable only once the worker has seen their connections
 * close, which it may learn after this HELLO arrives.
 */
async function admit(
  ctx: SharedCtx,
  t: CaseCheck,
  o: { maxSlots?: number; sess?: Sess } = {},
): Promise<Bound> {
  const sess = o.sess ?? ctx.newSess();
  const peer = await ctx.peer();
  const sampled = ctx.sampleMode === "top32";
  const margin = ctx.hasMargin;
  const over: Partial<HelloFields> = { sampleMode: sampled ? 1 : 0, helloFlags: margin ? 1 : 0 };
  if (o.maxSlots !== undefined) over.maxSlots = o.maxSlots;
  const end = performance.now() + Math.max(3000, 4 * ctx.timeoutMs);
  for (;;) {
    const h = await hello(ctx, t, peer, sess, over);
    if (h.status === 0) {
      t.must(
        h.r !== null && (h.r.capabilities & SHARED_BIT) !== 0,
        "capability bit 3 SHARED in the HelloReply (CONTRACT 12.1)",
        () => `capabilities ${h.r?.capabilities}`,
      );
      t.must(h.r!.windowsKept === 0, "windows_kept 0 for a new session (CONTRACT 6.1)", () =>
        String(h.r!.windowsKept),
      );
      sess.oracle.reset();
      return {
        peer,
        sess,
        sampled,
        margin,
        maxSlots: h.f.maxSlots,
        maxRowsPerStep: h.f.maxRowsPerStep,
        hello: h.f,
        helloReply: h.r!,
      };
    }
    t.must(h.status === 10 && performance.now() < end, `HELLO of a new session answered OK`, () =>
      h.status === 10 ? "BUSY for longer than the earlier cases' connections take to close" : st(h.status),
    );
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** `n` sessions admitted at once, each on its own connection. */
async function admitMany(ctx: SharedCtx, t: CaseCheck, n: number): Promise<Bound[]> {
  const out: Bound[] = [];
  for (let i = 0; i < n; i++) out.push(await admit(ctx, t));
  return out;
}

/** Writes `rows` rows into slot `slot` of `b` (RESYNC, generation `gen`), checked by the oracle. */
async function fill(
  ctx: SharedCtx,
  t: CaseCheck,
  b: Bound,
  slot: number,
  rows: number,
  gen = 1,
): Promise<void> {
  await ctx.stepOk(t, b, [ctx.entry(b, { slot, anchorPos: rows, nRows: rows, flags: 3, generation: gen })]);
}

/** A STEP asking slot `slot` at `anchorPos` with no rows: its status shows what the worker holds. */
function probe(ctx: SharedCtx, b: Bound, slot: number, anchorPos: number, gen = 1): EntryFields {
  return ctx.entry(b, { slot, anchorPos, generation: gen });
}

/** A bound connection of `b`'s session checked whole: every probed slot as its oracle says. */
async function intact(ctx: SharedCtx, t: CaseCheck, b: Bound, slots: [number, number][]): Promise<void> {
  await ctx.stepOk(
    t,
    b,
    slots.map(([slot, pos]) => probe(ctx, b, slot, pos)),
  );
}

async function statsText(t: CaseCheck, peer: Peer): Promise<string> {
  const reply = await peer.call(t, frame({ op: Op.STATS, seq: 1, session: 0 }), "STATS");
  t.must(reply.h.status === 0, "STATS answered OK", () => st(reply.h.status));
  const text = Buffer.from(reply.body).toString("utf8");
  try {
    JSON.parse(text);
  } catch {
    t.must(false, "a STATS body of UTF-8 JSON (CONTRACT 10)", text.slice(0, 80));
  }
  return text;
}

/** Whether `text` names session `id` (decimal or hex). */
function names(text: string, id: number): boolean {
  const lower = text.toLowerCase();
  return lower.includes(String(id)) || lower.includes(id.toString(16).padStart(8, "0"));
}

function leaseKnown(ctx: SharedCtx, t: CaseCheck): number {
  if (ctx.opts.sessionLeaseMs === undefined)
    t.info("--session-lease-ms given (the case waits the lease out)", "not given");
  return ctx.leaseMs;
}

/** A reply body with worker_us (STEP reply body offset 12, CONTRACT 7.4) zeroed, as hex. */
function bodyNoUs(b: Uint8Array): string {
  const c = b.slice();
  c.fill(0, 12, 16);
  return Buffer.from(c).toString("hex");
}

export const sharedCases: S[] = [
  {
    id: "12.1.1",
    title: "HelloReply of a shared worker: capability bit 3 SHARED, on OK and on CONFIG_MISMATCH",
    cite: WORDS_SHARED,
    async run(ctx: SharedCtx, t: CaseCheck) {
      await admit(ctx, t);
      const p = await ctx.peer();
      const h = await hello(ctx, t, p, ctx.newSess(), { window: ctx.g.window === 1 ? 2 : ctx.g.window - 1 });
      t.must(h.status === 6, "a wrong window answered CONFIG_MISMATCH", st(h.status));
      t.must(
        h.r !== null && (h.r.capabilities & SHARED_BIT) !== 0,
        "SHARED in the CONFIG_MISMATCH HelloReply too",
        () => `capabilities ${h.r?.capabilities}`,
      );
    },
  },
  {
    id: "12.1.2",
    title: "slot 3 of session A and slot 3 of session B are different windows",
    cite: OWN,
    async run(ctx: SharedCtx, t: CaseCheck) {
      const [a, b] = await admitMany(ctx, t, 2);
      await fill(ctx, t, a!, 3, 4);
      // B's slot 3 holds nothing: NEED_RESYNC, window_rows 0 (the oracle of B says so).
      await intact(ctx, t, b!, [[3, 4]]);
      await fill(ctx, t, b!, 3, 2);
      // A's slot 3 still holds its 4 rows.
      await intact(ctx, t, a!, [[3, 4]]);
    },
  },
  {
    id: "12.1.3",
    title: "generations are per session: B's generation 1 of slot 0 is not stale after A's generation 9",
    cite: OWN,
    async run(ctx: SharedCtx, t: CaseCheck) {
      const [a, b] = await admitMany(ctx, t, 2);
      await fill(ctx, t, a!, 0, 2, 9);
      await fill(ctx, t, b!, 0, 2, 1);
      await ctx.stepOk(t, a!, [probe(ctx, a!, 0, 2, 9)]);
    },
  },
  {
    id: "12.1.4",
    title: "seq is per session: B's low seq is newer for B; A's seq not newer than A's highest is STALE_SEQ",
    cite: `${OWN} CONTRACT 6.2: with a seq that is not newer than the session's highest: STALE_SEQ.`,
    async run(ctx: SharedCtx, t: CaseCheck) {
      const sa = ctx.newSess(0x70000000);
      const sb = ctx.newSess(1000);
      const a = await admit(ctx, t, { sess: sa });
      const b = await admit(ctx, t, { sess: sb });
      await fill(ctx, t, a, 0, 1);
      await fill(ctx, t, b, 0, 1);
      const stale = ctx.stepMsg(a, [probe(ctx, a, 0, 1)], { seq: a.sess.hi });
      await ctx.refused(t, a.peer, stale, 2, "STEP of A with A's highest seq");
      await fill(ctx, t, b, 1, 1);
    },
  },
  {
    id: "12.1.5",
    title: "limits are per session: A asked max_slots 2, B asked 8; slot 5 is BAD_FRAME for A only",
    cite: `${OWN} CONTRACT 6.2: the session's limits are those its HELLO asked for.`,
    async run(ctx: SharedCtx, t: CaseCheck) {
      if (ctx.g.maxSlots < 8) t.info("a worker max_slots of at least 8", String(ctx.g.maxSlots));
      const a = await admit(ctx, t, { maxSlots: 2 });
      const b = await admit(ctx, t, { maxSlots: 8 });
      await fill(ctx, t, b, 5, 1);
      await ctx.refused(t, a.peer, ctx.stepMsg(a, [probe(ctx, a, 5, 1)]), 3, "STEP of A on slot 5");
      await fill(ctx, t, a, 1, 1);
    },
  },
  {
    id: "12.1.6",
    title: "a STEP carrying B's id on a connection bound to A → NO_SESSION; B unchanged",
    cite: `${ACTS} CONTRACT 6.2: STEP and RESET are accepted only on a connection bound to the session.`,
    async run(ctx: SharedCtx, t: CaseCheck) {
      const [a, b] = await admitMany(ctx, t, 2);
      await fill(ctx, t, b!, 0, 3);
      const m = ctx.stepMsg(b!, [ctx.entry(b!, { slot: 0, anchorPos: 4, nRows: 1, rowStart: 3, flags: 1 })], {
        session: b!.sess.id,
        seq: b!.sess.next,
      });
      await ctx.refused(t, a!.peer, m, 1, "STEP of session B on A's connection");
      await ctx.refused(
        t,
        a!.peer,
        frame({ op: Op.RESET, seq: b!.sess.next, session: b!.sess.id }),
        1,
        "RESET of session B on A's connection",
      );
      await intact(ctx, t, b!, [[0, 3]]);
    },
  },
  {
    id: "12.1.7",
    title: "HELLO of B on a connection bound to A moves it to B; A's other connection stays bound",
    cite: MOVES,
    async run(ctx: SharedCtx, t: CaseCheck) {
      const a = await admit(ctx, t);
      const b = await admit(ctx, t);
      await fill(ctx, t, a, 0, 2);
      // A second connection of A.
      const a2peer = await ctx.peer();
      const h = await hello(ctx, t, a2peer, a.sess);
      t.must(h.status === 0, "a same-session re-HELLO of A on another connection answered OK", st(h.status));
      t.must(h.r!.windowsKept === a.sess.oracle.nonEmpty, "windows_kept = A's non-empty windows", () =>
        String(h.r!.windowsKept),
      );
      // Move A's first connection to B.
      const mv = await hello(ctx, t, a.peer, b.sess);
      t.must(mv.status === 0, "HELLO of B on A's connection answered OK", st(mv.status));
      const moved: Bound = { ...b, peer: a.peer };
      await ctx.refused(
        t,
        a.peer,
        ctx.stepMsg(a, [probe(ctx, a, 0, 2)]),
        1,
        "STEP of A on the moved connection",
      );
      await fill(ctx, t, moved, 1, 1);
      // A's other connection and B's own are still bound.
      await intact(ctx, t, { ...a, peer: a2peer }, [[0, 2]]);
      await intact(ctx, t, b, [[1, 1]]);
    },
  },
  {
    id: "12.1.8",
    title: "a new session admitted while A is live unbinds nothing of A: A's windows and STEPs go on",
    cite: MOVES,
    async run(ctx: SharedCtx, t: CaseCheck) {
      const a = await admit(ctx, t);
      await fill(ctx, t, a, 2, 3);
      await admit(ctx, t);
      await intact(ctx, t, a, [[2, 3]]);
    },
  },
  {
    id: "12.1.9",
    title: "RESET of A drops A's slot state only; B's windows stay whole",
    cite: ACTS,
    async run(ctx: SharedCtx, t: CaseCheck) {
      const [a, b] = await admitMany(ctx, t, 2);
      await fill(ctx, t, a!, 0, 3);
      await fill(ctx, t, b!, 0, 3);
      await fill(ctx, t, b!, 1, 2);
      await ctx.resetOk(t, a!);
      await intact(ctx, t, a!, [[0, 3]]); // NEED_RESYNC by the oracle
      await intact(ctx, t, b!, [
        [0, 3],
        [1, 2],
      ]);
    },
  },
  {
    id: "12.1.10",
    title: "K sessions are held at once: each admitted with windows_kept 0, each with its own windows",
    cite: WORDS_SHARED,
    async run(ctx: SharedCtx, t: CaseCheck) {
      const bs = await admitMany(ctx, t, ctx.shared.maxSessions);
      for (let k = 0; k < bs.length; k++) await fill(ctx, t, bs[k]!, 0, 1 + (k % ctx.g.window));
      for (let k = 0; k < bs.length; k++) await intact(ctx, t, bs[k]!, [[0, 1 + (k % ctx.g.window)]]);
    },
  },
  {
    id: "12.1.11",
    title: "K live sessions: a HELLO of another is BUSY, and the BUSY changed no state",
    cite: `${ADMIT} ${NEVER_LIVE}`,
    async run(ctx: SharedCtx, t: CaseCheck) {
      const bs = await admitMany(ctx, t, ctx.shared.maxSessions);
      for (const b of bs) await fill(ctx, t, b, 0, 2);
      const x = ctx.newSess();
      const p = await ctx.peer();
      const h = await hello(ctx, t, p, x);
      t.must(h.status === 10, "HELLO of a (K+1)th session while K are live answered BUSY", st(h.status));
      await ctx.refused(
        t,
        p,
        frame({ op: Op.RESET, seq: x.next, session: x.id }),
        1,
        "RESET on the refused connection",
      );
      for (const b of bs) await intact(ctx, t, b, [[0, 2]]);
    },
  },
  {
    id: "12.1.12",
    title:
      "one of K sessions closes its connection: it is droppable, the next HELLO is admitted; the others keep their windows",
    cite: `${ADMIT} CONTRACT 12.1: a session is live while it has an open bound connection (one whose close the worker has not seen).`,
    async run(ctx: SharedCtx, t: CaseCheck) {
      const bs = await admitMany(ctx, t, ctx.shared.maxSessions);
      for (const b of bs) await fill(ctx, t, b, 0, 2);
      bs[0]!.peer.raw.close();
      await admit(ctx, t); // retries BUSY until the worker has seen the close
      for (const b of bs.slice(1)) await intact(ctx, t, b, [[0, 2]]);
    },
  },
  {
    id: "12.1.13",
    title:
      "K sessions idle past the lease, connections open: the next HELLO drops the one idle longest only; its connection stays open, NO_SESSION",
    cite: `${ADMIT} ${DROPPING}`,
    async run(ctx: SharedCtx, t: CaseCheck) {
      const lease = leaseKnown(ctx, t);
      const bs = await admitMany(ctx, t, ctx.shared.maxSessions);
      for (const b of bs) await fill(ctx, t, b, 0, 2);
      await new Promise((r) => setTimeout(r, 30));
      // bs[0] idle longest: the others answered OK after it.
      for (const b of bs.slice(1)) await intact(ctx, t, b, [[0, 2]]);
      await new Promise((r) => setTimeout(r, lease + 150));
      await admit(ctx, t);
      const d = bs[0]!;
      await ctx.refused(t, d.peer, ctx.stepMsg(d, [probe(ctx, d, 0, 2)]), 1, "STEP of the dropped session");
      await ctx.refused(
        t,
        d.peer,
        frame({ op: Op.RESET, seq: d.sess.next, session: d.sess.id }),
        1,
        "RESET of the dropped session",
      );
      for (const b of bs.slice(1)) await intact(ctx, t, b, [[0, 2]]);
    },
  },
  {
    id: "12.1.14",
    title:
      "never a live one: with one droppable session, a live session idle longer is kept and the droppable one dropped",
    cite: NEVER_LIVE,
    async run(ctx: SharedCtx, t: CaseCheck) {
      const bs = await admitMany(ctx, t, ctx.shared.maxSessions);
      for (const b of bs) await fill(ctx, t, b, 0, 2);
      // The last one (idle least) closes; bs[0] is live and idle longest.
      const last = bs[bs.length - 1]!;
      last.peer.raw.close();
      await admit(ctx, t);
      for (const b of bs.slice(0, -1)) await intact(ctx, t, b, [[0, 2]]);
    },
  },
  {
    id: "12.1.15",
    title: "re-HELLO of a held session keeps its windows (windows_kept) while other sessions come and go",
    cite: `${OWN} CONTRACT 12.1: a HELLO of a held session is a same-session re-HELLO (6.2).`,
    async run(ctx: SharedCtx, t: CaseCheck) {
      const a = await admit(ctx, t);
      await fill(ctx, t, a, 0, 2);
      await fill(ctx, t, a, 1, 3);
      const o = await admit(ctx, t);
      o.peer.raw.close();
      const h = await hello(ctx, t, a.peer, a.sess);
      t.must(h.status === 0, "re-HELLO of A answered OK", st(h.status));
      t.must(h.r!.windowsKept === 2, "windows_kept 2", () => String(h.r!.windowsKept));
      await intact(ctx, t, a, [
        [0, 2],
        [1, 3],
      ]);
    },
  },
  {
    id: "12.1.16",
    title: "a dropped session's client re-HELLOs: a new session (windows_kept 0), served again",
    cite: `${DROPPING} CONTRACT 12.1: its client re-HELLOs and resyncs (7.5).`,
    async run(ctx: SharedCtx, t: CaseCheck) {
      const lease = leaseKnown(ctx, t);
      const bs = await admitMany(ctx, t, ctx.shared.maxSessions);
      for (const b of bs) await fill(ctx, t, b, 0, 2);
      await new Promise((r) => setTimeout(r, 30));
      for (const b of bs.slice(1)) await intact(ctx, t, b, [[0, 2]]);
      await new Promise((r) => setTimeout(r, lease + 150));
      const n = await admit(ctx, t);
      n.peer.raw.close();
      const d = bs[0]!;
      const again = await admit(ctx, t, { sess: d.sess });
      await fill(ctx, t, again, 0, 1);
    },
  },
  {
    id: "12.1.17",
    title: "a HELLO whose reservation alone exceeds max_window_bytes → CONFIG_MISMATCH",
    cite: "CONTRACT 12.1: each held session reserves max_slots * W * row_bytes of its HELLO out of max_window_bytes; a HELLO whose reservation alone exceeds max_window_bytes is CONFIG_MISMATCH.",
    async run(ctx: SharedCtx, t: CaseCheck) {
      const mwb = ctx.shared.maxWindowBytes;
      if (mwb === undefined) t.info("--max-window-bytes given", "not given");
      const per = ctx.g.window * ctx.g.rowBytes;
      const slots = Math.floor(mwb / per) + 1;
      if (slots > ctx.g.maxSlots) t.info(`a worker max_slots of at least ${slots}`, String(ctx.g.maxSlots));
      const p = await ctx.peer();
      const h = await hello(ctx, t, p, ctx.newSess(), { maxSlots: slots });
      t.must(
        h.status === 6,
        `HELLO asking ${slots} slots (${slots * per} bytes) answered CONFIG_MISMATCH`,
        st(h.status),
      );
    },
  },
  {
    id: "12.1.18",
    title:
      "a session idle for session_idle_ms is dropped with its connection open: NO_SESSION, then a new session",
    cite: "CONTRACT 12.1: a held session whose idle time reaches session_idle_ms is dropped, open connection or not; its client re-HELLOs and resyncs (7.5).",
    async run(ctx: SharedCtx, t: CaseCheck) {
      const idle = ctx.shared.sessionIdleMs;
      if (idle === undefined) t.info("--session-idle-ms given", "not given");
      const a = await admit(ctx, t);
      await fill(ctx, t, a, 0, 2);
      // The worker may sweep on a timer: wait the idle time plus a bounded margin.
      const end = performance.now() + idle + Math.max(3000, idle);
      await new Promise((r) => setTimeout(r, idle + 50));
      let dropped = false;
      while (!dropped) {
        const m = ctx.stepMsg(a, [probe(ctx, a, 0, 2)]);
        const reply = await a.peer.call(t, m, "STEP after session_idle_ms");
        if (reply.h.status === 1) dropped = true;
        else {
          t.must(
            reply.h.status === 0 && performance.now() < end,
            "NO_SESSION once idle for session_idle_ms",
            () => st(reply.h.status),
          );
          // Answered OK: the worker had not swept yet, and the STEP renewed the idle time.
          ctx.okFrame(a.sess, u32(m, 8), false);
          a.sess.oracle.apply([probe(ctx, a, 0, 2)]);
          await new Promise((r) => setTimeout(r, idle + 50));
        }
      }
      const h = await hello(ctx, t, a.peer, a.sess);
      t.must(
        h.status === 0 && h.r!.windowsKept === 0,
        "its re-HELLO starts a new session (windows_kept 0)",
        () => `${st(h.status)} windows_kept ${h.r?.windowsKept}`,
      );
    },
  },
  {
    id: "12.1.19",
    title: "STATS on A's connection: A's id and seq, never B's id or seq",
    cite: ISOLATION,
    async run(ctx: SharedCtx, t: CaseCheck) {
      const a = await admit(ctx, t, { sess: ctx.newSess(0x2a000000) });
      const b = await admit(ctx, t, { sess: ctx.newSess(0x5b000000) });
      await fill(ctx, t, a, 0, 1);
      for (let i = 0; i < 3; i++) await fill(ctx, t, b, i, 1);
      const text = await statsText(t, a.peer);
      t.must(names(text, a.sess.id), "A's own session id in STATS on A's connection", text.slice(0, 120));
      t.must(!names(text, b.sess.id), "B's session id absent from STATS on A's connection", "present");
      t.must(!text.includes(String(b.sess.hi)), "B's seq absent from STATS on A's connection", "present");
    },
  },
  {
    id: "12.1.20",
    title: "STATS on an unbound connection: no held session's id or seq",
    cite: ISOLATION,
    async run(ctx: SharedCtx, t: CaseCheck) {
      const a = await admit(ctx, t, { sess: ctx.newSess(0x3c000000) });
      const b = await admit(ctx, t, { sess: ctx.newSess(0x4d000000) });
      await fill(ctx, t, a, 0, 1);
      await fill(ctx, t, b, 0, 1);
      const text = await statsText(t, await ctx.peer());
      for (const s of [a.sess, b.sess]) {
        t.must(!names(text, s.id), `session ${s.id} absent from STATS on an unbound connection`, "present");
        t.must(
          !text.includes(String(s.hi)),
          `seq ${s.hi} absent from STATS on an unbound connection`,
          "present",
        );
      }
    },
  },
  {
    id: "12.1.21",
    title:
      "the same STEP of two sessions sent at once (batched) and of a third alone: identical reply bodies except worker_us",
    cite: BATCHING,
    async run(ctx: SharedCtx, t: CaseCheck) {
      const bs = await admitMany(ctx, t, Math.min(3, ctx.shared.maxSessions));
      const n = Math.min(4, ctx.g.window);
      const slots = Math.min(4, ...bs.map((b) => b.maxSlots));
      const rows = ctx.rows(slots * n);
      const make = (b: Bound, stepId: number) => {
        const entries = Array.from({ length: slots }, (_, s) =>
          ctx.entry(b, { slot: s, anchorPos: n, nRows: n, flags: 3, anchorToken: (s * 7 + 3) % ctx.g.vocab }),
        );
        return { entries, msg: ctx.stepMsg(b, entries, { stepId, rows }) };
      };
      const [x, y] = [make(bs[0]!, 77), make(bs[1]!, 77)];
      // Both written before either reply is read: the worker may draft them in one call.
      bs[0]!.peer.raw.send(x.msg);
      bs[1]!.peer.raw.send(y.msg);
      const rx = await bs[0]!.peer.next(t, "STEP of A sent with B's", {
        op: Op.STEP,
        seq: u32(x.msg, 8),
        session: bs[0]!.sess.id,
      });
      const ry = await bs[1]!.peer.next(t, "STEP of B sent with A's", {
        op: Op.STEP,
        seq: u32(y.msg, 8),
        session: bs[1]!.sess.id,
      });
      t.must(
        rx.h.status === 0 && ry.h.status === 0,
        "both answered OK",
        `${st(rx.h.status)}, ${st(ry.h.status)}`,
      );
      ctx.okFrame(bs[0]!.sess, u32(x.msg, 8), false);
      ctx.okFrame(bs[1]!.sess, u32(y.msg, 8), false);
      t.must(
        bodyNoUs(rx.body) === bodyNoUs(ry.body),
        "identical reply bodies except worker_us",
        "they differ",
      );
      if (bs.length >= 3) {
        const z = make(bs[2]!, 77);
        const rz = await bs[2]!.peer.call(t, z.msg, "the same STEP of a third session, alone");
        t.must(rz.h.status === 0, "answered OK", st(rz.h.status));
        ctx.okFrame(bs[2]!.sess, u32(z.msg, 8), false);
        t.must(
          bodyNoUs(rz.body) === bodyNoUs(rx.body),
          "the STEP drafted alone has the same body",
          "it differs",
        );
      }
    },
  },
];
