// Over 500 lines on purpose: the table of CONTRACT 9.2 / 9.3 rows, each a numbered case with its
// cited sentence and its judgement of the client's next move.
/**
 * Client cases (CONTRACT 6.1, 6.2, 7.5, 9): the scripted worker breaks one reply of a STEP or a
 * HELLO and judges, from what arrives on the wire next, whether the rank-0 client did what
 * CONTRACT 9.2 / 9.3 ask: drop the connection and reconnect after backoff resyncing the STEP's
 * slots, reconnect at once, start a new session, or disable for good.
 */
import { Op } from "@tapwire/wire";
import { frame, stepReplyBody } from "../frames.js";
import type { CaseCheck, CaseDef } from "../runner.js";
import type { ClientCtx, HelloEvent, StepEvent } from "./context.js";

type C = CaseDef<ClientCtx>;
type Parts = ReturnType<ClientCtx["replyParts"]>;

const TABLE =
  "CONTRACT 9.2: reply does not echo op/seq/session, or cannot be parsed, or breaks 6.3/7.4/8 → bad_reply: drop connection (backoff); resync the STEP's slots, and record the first violation.";
const UNKNOWN =
  "CONTRACT 9.2: request timed out / transport error → applied unknown: drop connection (backoff); resync the STEP's slots. CONTRACT 3: a request that times out leaves the connection unusable: the client closes it.";
const FATAL =
  "CONTRACT 9.2, 9.3: a fatal frame status (BAD_FRAME, BAD_VERSION, IDENTITY_MISMATCH, CONFIG_MISMATCH, UNKNOWN_OP, UNAUTHORIZED, TOO_LARGE) disables the client for the rest of the run: it never reconnects; every round is target-only.";
const HELLO_CHECKS =
  "CONTRACT 6.1: client checks of an OK reply (any failure disables the client, 9.3): identities equal; window and num_spec equal; TOP32 capability when sample_mode is TOP32; TAPS_BF16; MARGIN when WANT_MARGIN; max_slots and max_rows_per_step at least what it asked; vocab_size and row_bytes equal.";

type Reaction = "backoff" | "now" | "disable" | "new-session";

/**
 * Watches what the client does after a fault at `faultAt` on connection `s` (when a STEP was
 * faulted) and judges it against `want`.
 */
async function judge(
  ctx: ClientCtx,
  t: CaseCheck,
  want: Reaction,
  faultAt: number,
  s: StepEvent | null,
  sess: number,
): Promise<void> {
  const b = ctx.opts.backoffMs;
  if (want === "disable") {
    ctx.disabled.add(sess);
    ctx.opts.onNeedClient?.(`session ${sess} must now be disabled`);
    const evs = await ctx.watch(ctx.disableWaitMs);
    const again = evs.find(
      (e) => e.h !== null && e.h.session === sess && (e.h.op === Op.HELLO || e.h.op === Op.STEP),
    );
    t.must(
      again === undefined,
      `no HELLO or STEP of session ${sess} for ${ctx.disableWaitMs} ms (disabled)`,
      () => `op ${again!.h!.op} after ${Math.round(again!.ev.at - faultAt)} ms`,
    );
    if (s !== null && !s.conn.closed) s.conn.close();
    return;
  }
  // A reconnect: the next HELLO of the same session (or of a new one for new-session).
  let usedAfter = false;
  let closedByPeer = s === null || s.conn.closed;
  const hello = await ctx.until(
    t,
    want === "new-session" ? "a HELLO of a new session" : `a re-HELLO of session ${sess}`,
    (ev, h) => {
      if (s !== null && ev.conn.id === s.conn.id) {
        if (ev.kind === "close") closedByPeer = true;
        if (ev.kind === "msg" && h?.op === Op.STEP) usedAfter = true;
      }
      if (ev.kind !== "msg" || h === null || h.op !== Op.HELLO) return null;
      if (want === "new-session" ? h.session === sess : h.session !== sess) return null;
      return { ev, h };
    },
    ctx.waitMs + (b ?? 0) * 2,
  );
  const delay = hello.ev.at - faultAt;
  t.must(
    !usedAfter,
    "no STEP on the connection of the unknown outcome after it",
    "the client sent another STEP on it",
  );
  if (want === "backoff" && s !== null && s.conn !== hello.ev.conn && ctx.listener.stream) {
    t.must(closedByPeer || s.conn.closed, "the client dropped the connection", "it stayed open");
  }
  if (b !== undefined) {
    if (want === "backoff")
      t.must(delay >= 0.8 * b, `the re-HELLO after the backoff (${b} ms)`, `after ${Math.round(delay)} ms`);
    else
      t.must(
        delay < 0.5 * b,
        `the re-HELLO at once (well before the ${b} ms backoff)`,
        `after ${Math.round(delay)} ms`,
      );
  } else t.note(`re-HELLO after ${Math.round(delay)} ms (pass --backoff-ms to judge the delay)`);
  // Answer it like a conforming worker, then judge the resync (CONTRACT 7.5).
  const ev = hello.ev as Extract<typeof hello.ev, { kind: "msg" }>;
  ctx.auto(ev);
  if (ctx.session !== hello.h.session) return;
  if (s === null) return;
  const slots = new Set(s.req.entries.filter((e) => (e.flags & 4) === 0).map((e) => e.slot));
  const next = await ctx.nextStep(t, (x) => x.req.entries.some((e) => slots.has(e.slot)));
  const bad = next.req.entries.filter((e) => slots.has(e.slot) && (e.flags & 4) === 0 && (e.flags & 2) === 0);
  ctx.auto({ kind: "msg", conn: next.conn, msg: next.msg, at: next.at });
  t.must(
    bad.length === 0,
    "the first STEP of the new epoch resyncs the faulted STEP's slots (RESYNC, CONTRACT 7.5)",
    () => `slots ${bad.map((e) => e.slot).join(", ")} sent without RESYNC`,
  );
  const short = next.req.entries.filter(
    (e) => slots.has(e.slot) && (e.flags & 2) !== 0 && e.nRows !== Math.min(ctx.W, e.anchorPos),
  );
  if (short.length > 0)
    t.note(
      `resync of slots ${short.map((e) => e.slot).join(", ")} carried fewer than min(W, anchor_pos) rows (the ring held fewer?)`,
    );
}

function reply(
  ctx: ClientCtx,
  s: StepEvent,
  mutate: (p: Parts) => void,
  hdr: Partial<{ op: number; seq: number; session: number; status: number }> = {},
  bodyDelta = 0,
): void {
  const p = ctx.replyParts(s.req, false);
  mutate(p);
  let body = stepReplyBody(p);
  if (bodyDelta !== 0) {
    const b = new Uint8Array(Math.max(0, body.length + bodyDelta));
    b.set(body.subarray(0, Math.min(body.length, b.length)));
    body = b;
  }
  s.conn.send(
    frame(
      {
        op: hdr.op ?? Op.STEP,
        seq: hdr.seq ?? s.h.seq,
        session: hdr.session ?? s.h.session,
        status: hdr.status ?? 0,
      },
      body,
    ),
  );
}

/** Index of the first consumed entry (NEED_DRAFT, status usable in our reply) or -1. */
function consumedIndex(s: StepEvent, p: Parts): number {
  return s.req.entries.findIndex((e, i) => (e.flags & 1) !== 0 && (p.status[i] === 0 || p.status[i] === 1));
}

/** A STEP-reply fault followed by the expected reaction. */
function stepFault(
  id: string,
  title: string,
  cite: string,
  want: Reaction,
  fault: (ctx: ClientCtx, t: CaseCheck, s: StepEvent) => void,
  pick?: (ctx: ClientCtx, s: StepEvent) => boolean,
): C {
  return {
    id,
    title,
    cite,
    async run(ctx: ClientCtx, t: CaseCheck) {
      const s = await ctx.nextStep(
        t,
        (x) => x.req.entries.length > 0 && (pick === undefined || pick(ctx, x)),
      );
      const sess = s.h.session;
      // The faulted STEP is not applied by this worker: it forgets what it held for the session.
      fault(ctx, t, s);
      await judge(ctx, t, want, performance.now(), s, sess);
    },
  };
}

const withConsumed = (ctx: ClientCtx, s: StepEvent) => {
  const p = ctx.replyParts(s.req, false);
  // Statuses from a dry run of the oracle (replyParts(apply=false) answers OK for all).
  return consumedIndex(s, p) >= 0;
};

function badValue(
  id: string,
  title: string,
  set: (ctx: ClientCtx, p: Parts, i: number) => void,
  guard?: (ctx: ClientCtx) => string | null,
): C {
  return stepFault(
    id,
    title,
    TABLE,
    "backoff",
    (ctx, t, s) => {
      const g = guard?.(ctx) ?? null;
      if (g !== null) {
        s.conn.send(ctx.replyFor(s.h, s.req).msg);
        t.info(g, "not applicable to this session");
      }
      reply(ctx, s, (p) => {
        const i = consumedIndex(s, p);
        // A consumed entry gets drafts: fill them as a conforming worker would, then break one.
        const good = ctx.replyParts(s.req, false);
        p.draftIds.set(good.draftIds);
        p.confidence.set(good.confidence);
        set(ctx, p, i);
      });
    },
    withConsumed,
  );
}

function statusFault(id: string, status: number, name: string, want: Reaction, cite: string): C {
  return stepFault(
    id,
    `STEP answered ${name} → ${want === "disable" ? "disabled (no reconnect)" : want === "now" ? "re-HELLO at once, slots resynced" : "reconnect after backoff, slots resynced"}`,
    cite,
    want,
    (_ctx, _t, s) => {
      s.conn.send(frame({ op: Op.STEP, status, seq: s.h.seq, session: s.h.session }));
    },
  );
}

/** Gets a HELLO out of the client: answers its next STEP NO_SESSION (it must re-HELLO at once). */
async function forceHello(ctx: ClientCtx, t: CaseCheck): Promise<HelloEvent> {
  if (ctx.session !== 0) {
    const s = await ctx.nextStep(t, () => true);
    s.conn.send(frame({ op: Op.STEP, status: 1, seq: s.h.seq, session: s.h.session }));
  }
  return ctx.nextHello(t, (h) => !ctx.disabled.has(h.session));
}

function helloFault(
  id: string,
  title: string,
  cite: string,
  want: Reaction,
  answer: (ctx: ClientCtx, hl: HelloEvent) => void,
  guard?: (ctx: ClientCtx, hl: HelloEvent) => string | null,
): C {
  return {
    id,
    title,
    cite,
    async run(ctx: ClientCtx, t: CaseCheck) {
      const hl = await forceHello(ctx, t);
      const g = guard?.(ctx, hl) ?? null;
      if (g !== null) {
        ctx.auto({ kind: "msg", conn: hl.conn, msg: hl.msg, at: hl.at });
        t.info(g, "not applicable to this client's HELLO");
      }
      ctx.checkHello(hl.h, hl.msg.subarray(24));
      answer(ctx, hl);
      await judge(ctx, t, want, performance.now(), null, hl.h.session);
    },
  };
}

function okHelloWith(
  id: string,
  what: string,
  over: (ctx: ClientCtx, hl: HelloEvent) => Partial<Parameters<ClientCtx["helloReply"]>[1]>,
  guard?: (ctx: ClientCtx, hl: HelloEvent) => string | null,
): C {
  return helloFault(
    id,
    `an OK HelloReply with ${what} → disabled`,
    HELLO_CHECKS,
    "disable",
    (ctx, hl) => {
      hl.conn.send(
        frame({ op: Op.HELLO, seq: hl.h.seq, session: hl.h.session }, ctx.helloReply(0, over(ctx, hl))),
      );
    },
    guard,
  );
}

const flip = (b: Uint8Array) => {
  const c = new Uint8Array(b);
  c[0]! ^= 0xff;
  return c;
};

export const CLIENT_CASES: readonly C[] = [
  {
    id: "9.1.1",
    title:
      "the client connects and says HELLO with a valid body (session non-zero, row_bytes = num_taps*hidden*2, bf16, known flags)",
    cite: "CONTRACT 6.1, 6.2, 9.1: a background loop owns connect + HELLO; a successful HELLO installs the connection.",
    async run(ctx: ClientCtx, t: CaseCheck) {
      if (ctx.session !== 0) t.info("the first HELLO of a client", "the client was already connected");
      const hl = await ctx.nextHello(t);
      ctx.violations = [];
      ctx.checkHello(hl.h, hl.msg.subarray(24));
      ctx.auto({ kind: "msg", conn: hl.conn, msg: hl.msg, at: hl.at });
      t.must(
        ctx.session === hl.h.session,
        "the HELLO matches the scripted worker (answered OK)",
        () => "it did not: check --window/--num-spec/--vocab/--num-taps/--hidden/identities",
      );
    },
  },
  {
    id: "9.1.2",
    title: "the first STEP after a HELLO carries every slot it holds with RESYNC (a new epoch)",
    cite: "CONTRACT 7.5: a slot is sent with RESYNC and its whole ring when the epoch changed since the slot was last synced, or the request is new in the slot.",
    async run(ctx: ClientCtx, t: CaseCheck) {
      const hl = await forceHello(ctx, t);
      ctx.auto({ kind: "msg", conn: hl.conn, msg: hl.msg, at: hl.at });
      const s = await ctx.nextStep(t);
      ctx.auto({ kind: "msg", conn: s.conn, msg: s.msg, at: s.at });
      const bad = s.req.entries.filter((e) => (e.flags & 4) === 0 && e.anchorPos > 0 && (e.flags & 2) === 0);
      t.must(
        bad.length === 0,
        "RESYNC on every entry of the first STEP of an epoch",
        () => `slots ${bad.map((e) => e.slot).join(", ")} without RESYNC`,
      );
    },
  },
  {
    id: "9.1.3",
    title: "a slot answered NEED_RESYNC is resent with RESYNC in the next STEP that carries it",
    cite: "CONTRACT 7.5: a slot is sent with RESYNC when the worker answered PARTIAL_WINDOW or NEED_RESYNC for it.",
    async run(ctx: ClientCtx, t: CaseCheck) {
      const s = await ctx.nextStep(t, (x) =>
        x.req.entries.some((e) => (e.flags & 4) === 0 && e.anchorPos > 0),
      );
      const i = s.req.entries.findIndex((e) => (e.flags & 4) === 0 && e.anchorPos > 0);
      const parts = ctx.replyParts(s.req, true);
      ctx.hi = s.h.seq;
      parts.status[i] = 2;
      parts.windowRows[i] = 0;
      const N = ctx.N;
      parts.draftIds.fill(0, i * N, (i + 1) * N);
      parts.confidence.fill(0, i * N, (i + 1) * N);
      parts.margin?.fill(0, i * N, (i + 1) * N);
      if (parts.sampledMask !== null) {
        parts.sampledMask.fill(0, i * N, (i + 1) * N);
        parts.supportIds!.fill(0, i * N * 32, (i + 1) * N * 32);
        parts.proposalQ!.fill(0, i * N * 32, (i + 1) * N * 32);
      }
      s.conn.send(frame({ op: Op.STEP, seq: s.h.seq, session: s.h.session }, stepReplyBody(parts)));
      const slot = s.req.entries[i]!.slot;
      const gen = s.req.entries[i]!.generation;
      const next = await ctx.nextStep(t, (x) => x.req.entries.some((e) => e.slot === slot));
      ctx.auto({ kind: "msg", conn: next.conn, msg: next.msg, at: next.at });
      const e = next.req.entries.find((x) => x.slot === slot)!;
      if (e.generation !== gen || (e.flags & 4) !== 0)
        t.info("the same request in the slot", `generation ${e.generation}, flags ${e.flags}`);
      t.must((e.flags & 2) !== 0, `slot ${slot} with RESYNC`, () => `flags ${e.flags}, ${e.nRows} rows`);
    },
  },
  stepFault(
    "9.2.1",
    "a reply whose op is not STEP's → bad_reply: drop, backoff, resync",
    TABLE,
    "backoff",
    (ctx, _t, s) => reply(ctx, s, () => {}, { op: Op.PING }),
  ),
  stepFault("9.2.2", "a reply whose seq is not the request's → bad_reply", TABLE, "backoff", (ctx, _t, s) =>
    reply(ctx, s, () => {}, { seq: (s.h.seq + 1) >>> 0 }),
  ),
  stepFault(
    "9.2.3",
    "a reply whose session is not the request's → bad_reply",
    TABLE,
    "backoff",
    (ctx, _t, s) => reply(ctx, s, () => {}, { session: (s.h.session ^ 1) >>> 0 }),
  ),
  stepFault(
    "9.2.4",
    "a reply body cut 4 bytes short (cannot be parsed) → bad_reply",
    TABLE,
    "backoff",
    (ctx, _t, s) => reply(ctx, s, () => {}, {}, -4),
  ),
  stepFault(
    "9.2.5",
    "a reply body 4 bytes longer than 7.4 gives → bad_reply",
    `${TABLE} CONTRACT 7.4: the reply has exactly this size.`,
    "backoff",
    (ctx, _t, s) => reply(ctx, s, () => {}, {}, 4),
  ),
  stepFault(
    "9.2.6",
    "a reply with another step_id → bad_reply",
    `${TABLE} CONTRACT 7.4: the client also checks step_id.`,
    "backoff",
    (ctx, _t, s) =>
      reply(ctx, s, (p) => {
        p.stepId = (p.stepId + 1) >>> 0;
      }),
  ),
  stepFault(
    "9.2.7",
    "a reply whose n_req is one less (sized for it) → bad_reply",
    `${TABLE} CONTRACT 7.4: the client checks n_req.`,
    "backoff",
    (ctx, _t, s) => {
      const p = ctx.replyParts({ ...s.req, entries: s.req.entries.slice(0, -1) }, false);
      p.stepId = s.req.stepId;
      s.conn.send(frame({ op: Op.STEP, seq: s.h.seq, session: s.h.session }, stepReplyBody(p)));
    },
  ),
  stepFault(
    "9.2.8",
    "a reply whose num_spec is N + 1 (sized for it) → bad_reply",
    `${TABLE} CONTRACT 7.4: the client checks num_spec.`,
    "backoff",
    (ctx, _t, s) => {
      const p = ctx.replyParts(s.req, false);
      const n = p.nReq;
      const N1 = ctx.N + 1;
      s.conn.send(
        frame(
          { op: Op.STEP, seq: s.h.seq, session: s.h.session },
          stepReplyBody({
            ...p,
            numSpec: N1,
            draftIds: new Int32Array(n * N1),
            confidence: new Float32Array(n * N1),
            margin: p.margin ? new Float32Array(n * N1) : null,
            sampledMask: p.sampledMask ? new Uint8Array(n * N1) : null,
            supportIds: p.supportIds ? new Int32Array(n * N1 * 32) : null,
            proposalQ: p.proposalQ ? new Uint32Array(n * N1 * 32) : null,
          }),
        ),
      );
    },
  ),
  stepFault(
    "9.2.9",
    "a reply with a wrong generation echo → bad_reply",
    `${TABLE} CONTRACT 7.4: the client checks every generation echo.`,
    "backoff",
    (ctx, _t, s) =>
      reply(ctx, s, (p) => {
        p.generation[0] = (p.generation[0]! + 1) >>> 0;
      }),
  ),
  stepFault(
    "9.2.10",
    "a reply whose MARGIN flag differs from the session (sized for it) → bad_reply",
    `${TABLE} CONTRACT 7.4: MARGIN is set exactly when the session asked WANT_MARGIN.`,
    "backoff",
    (ctx, _t, s) =>
      reply(ctx, s, (p) => {
        const nN = p.nReq * p.numSpec;
        p.margin = p.margin === null ? new Float32Array(nN) : null;
        p.replyFlags ^= 1;
      }),
  ),
  stepFault(
    "9.2.11",
    "a reply whose SAMPLED flag differs from the session (sized for it) → bad_reply",
    `${TABLE} CONTRACT 7.4: SAMPLED exactly in TOP32 sessions.`,
    "backoff",
    (ctx, _t, s) =>
      reply(ctx, s, (p) => {
        const nN = p.nReq * p.numSpec;
        if (p.sampledMask === null) {
          p.sampledMask = new Uint8Array(nN);
          p.supportIds = new Int32Array(nN * 32);
          p.proposalQ = new Uint32Array(nN * 32);
        } else {
          p.sampledMask = null;
          p.supportIds = null;
          p.proposalQ = null;
        }
        p.replyFlags ^= 2;
      }),
  ),
  badValue("9.2.12", "a drafted id equal to vocab_size (6.3) → bad_reply", (ctx, p, i) => {
    p.draftIds[i * ctx.N] = ctx.V;
  }),
  badValue("9.2.13", "a drafted id of -1 (6.3) → bad_reply", (ctx, p, i) => {
    p.draftIds[i * ctx.N] = -1;
  }),
  badValue("9.2.14", "a confidence NaN (6.3) → bad_reply", (ctx, p, i) => {
    p.confidence[i * ctx.N] = Number.NaN;
  }),
  badValue("9.2.15", "a confidence of 1.5 (6.3) → bad_reply", (ctx, p, i) => {
    p.confidence[i * ctx.N] = 1.5;
  }),
  badValue(
    "9.2.16",
    "a negative margin (6.3) → bad_reply",
    (ctx, p, i) => {
      p.margin![i * ctx.N] = -1;
    },
    (ctx) => (ctx.shape?.margin === true ? null : "a WANT_MARGIN session"),
  ),
  stepFault(
    "9.2.17",
    "non-zero values in an entry that is not consumed (6.3) → bad_reply",
    `${TABLE} CONTRACT 6.3: every position of an entry that is not consumed: draft id 0, confidence 0.0, margin 0.0 — exactly.`,
    "backoff",
    (ctx, _t, s) =>
      reply(ctx, s, (p) => {
        p.status[0] = 2;
        p.windowRows[0] = 0;
        p.draftIds[0] = 1;
        p.confidence[0] = 0.25;
      }),
  ),
  {
    id: "9.2.18",
    title: "a value past k = n_out in a consumed entry (6.3) → bad_reply",
    cite: TABLE,
    async run(ctx: ClientCtx, t: CaseCheck) {
      const short = (e: { flags: number; nOut: number }) =>
        (e.flags & 1) !== 0 && e.nOut > 0 && e.nOut < ctx.N;
      let s: StepEvent;
      try {
        s = await ctx.nextStep(t, (x) => x.req.entries.some(short));
      } catch {
        t.info("a STEP entry with 0 < n_out < N", `none within ${ctx.waitMs} ms`);
      }
      reply(ctx, s, (p) => {
        const i = s.req.entries.findIndex(short);
        const e = s.req.entries[i]!;
        p.draftIds[i * ctx.N + e.nOut] = 3;
        p.confidence[i * ctx.N + e.nOut] = 0.5;
      });
      await judge(ctx, t, "backoff", performance.now(), s, s.h.session);
    },
  },
  stepFault(
    "9.2.19",
    "an entry answered OK with window_rows below min(W, anchor_pos) → bad_reply",
    `${TABLE} CONTRACT 7.2 steps 5-6: OK exactly when held == min(W, anchor_pos); window_rows = held.`,
    "backoff",
    (ctx, _t, s) =>
      reply(ctx, s, (p) => {
        const i = s.req.entries.findIndex((e) => (e.flags & 4) === 0 && e.anchorPos > 0);
        p.status[Math.max(0, i)] = 0;
        p.windowRows[Math.max(0, i)] = 0;
      }),
    (_ctx, s) => s.req.entries.some((e) => (e.flags & 4) === 0 && e.anchorPos > 0),
  ),
  stepFault(
    "9.2.20",
    "an entry status 9 (not a request status) → bad_reply",
    `${TABLE} CONTRACT 7.2: request statuses 0..5.`,
    "backoff",
    (ctx, _t, s) =>
      reply(ctx, s, (p) => {
        p.status[0] = 9;
      }),
  ),
  badValue(
    "9.2.21",
    "TOP32: a sampled position whose q does not sum to 2^24 (8) → bad_reply",
    (ctx, p, i) => {
      p.proposalQ![i * ctx.N * 32] = (p.proposalQ![i * ctx.N * 32] ?? 0) + 1;
    },
    (ctx) => (ctx.shape?.sampled === true ? null : "a TOP32 session"),
  ),
  badValue(
    "9.2.22",
    "TOP32: a sampled mask on a greedy session's values / q without sampling (8) → bad_reply",
    (ctx, p, i) => {
      p.sampledMask![i * ctx.N] = 0;
      p.proposalQ![i * ctx.N * 32] = 5;
    },
    (ctx) => (ctx.shape?.sampled === true ? null : "a TOP32 session"),
  ),
  stepFault(
    "9.2.23",
    "no reply at all (the request times out) → drop the connection, backoff, resync",
    UNKNOWN,
    "backoff",
    () => {},
  ),
  stepFault(
    "9.2.24",
    "the worker closes the connection on the STEP (transport error) → backoff, resync",
    UNKNOWN,
    "backoff",
    (_ctx, _t, s) => s.conn.close(),
  ),
  stepFault(
    "9.2.25",
    "half a reply, then the connection closes (a reset mid-reply) → backoff, resync",
    UNKNOWN,
    "backoff",
    (ctx, _t, s) => {
      const m = ctx.replyFor(s.h, s.req, false).msg;
      const whole = new Uint8Array(4 + m.length);
      whole.set([m.length & 0xff, (m.length >>> 8) & 0xff, (m.length >>> 16) & 0xff, m.length >>> 24]);
      whole.set(m, 4);
      s.conn.sendRaw(whole.subarray(0, 4 + Math.floor(m.length / 2)));
      setTimeout(() => s.conn.close(), 20);
    },
  ),
  stepFault("9.2.26", "an unknown frame status (12) → bad_reply", TABLE, "backoff", (_ctx, _t, s) =>
    s.conn.send(frame({ op: Op.STEP, status: 12, seq: s.h.seq, session: s.h.session })),
  ),
  statusFault(
    "9.2.27",
    1,
    "NO_SESSION",
    "now",
    "CONTRACT 9.2: NO_SESSION → frame_no_session: not applied; reconnect without backoff.",
  ),
  statusFault(
    "9.2.28",
    2,
    "STALE_SEQ",
    "now",
    "CONTRACT 9.2: STALE_SEQ → frame_stale_seq: not applied; reconnect without backoff.",
  ),
  statusFault("9.2.29", 10, "BUSY", "backoff", "CONTRACT 9.2: BUSY → frame_busy: reconnect with backoff."),
  statusFault(
    "9.2.30",
    11,
    "INTERNAL",
    "backoff",
    "CONTRACT 9.2: INTERNAL → frame_internal: reconnect with backoff.",
  ),
  statusFault("9.2.31", 3, "BAD_FRAME", "disable", FATAL),
  statusFault("9.2.32", 4, "BAD_VERSION", "disable", FATAL),
  statusFault("9.2.33", 5, "IDENTITY_MISMATCH", "disable", FATAL),
  statusFault("9.2.34", 6, "CONFIG_MISMATCH", "disable", FATAL),
  statusFault("9.2.35", 7, "UNKNOWN_OP", "disable", FATAL),
  statusFault("9.2.36", 8, "UNAUTHORIZED", "disable", FATAL),
  statusFault("9.2.37", 9, "TOO_LARGE", "disable", FATAL),
  helloFault(
    "9.3.1",
    "HELLO answered IDENTITY_MISMATCH (with the worker's HelloReply) → disabled",
    "CONTRACT 9.3: HELLO mismatches disable the client, with a reason naming what differs.",
    "disable",
    (ctx, hl) => {
      hl.conn.send(
        frame(
          { op: Op.HELLO, status: 5, seq: hl.h.seq, session: hl.h.session },
          ctx.helloReply(0, { drafterIdentity: flip(ctx.drafterIdentity) }),
        ),
      );
    },
  ),
  helloFault("9.3.2", "HELLO answered CONFIG_MISMATCH → disabled", "CONTRACT 9.3.", "disable", (ctx, hl) => {
    hl.conn.send(
      frame(
        { op: Op.HELLO, status: 6, seq: hl.h.seq, session: hl.h.session },
        ctx.helloReply(0, { window: ctx.W + 1 }),
      ),
    );
  }),
  ...[
    ["9.3.3", 8, "UNAUTHORIZED"],
    ["9.3.4", 4, "BAD_VERSION"],
    ["9.3.5", 3, "BAD_FRAME"],
  ].map(([id, status, name]) =>
    helloFault(id as string, `HELLO answered ${name} → disabled`, FATAL, "disable", (_ctx, hl) => {
      hl.conn.send(frame({ op: Op.HELLO, status: status as number, seq: hl.h.seq, session: hl.h.session }));
    }),
  ),
  helloFault(
    "9.3.6",
    "HELLO answered BUSY → reconnect after backoff (same session)",
    "CONTRACT 5, 9.2: BUSY → reconnect with backoff (HELLO only, 6.2).",
    "backoff",
    (_ctx, hl) => {
      hl.conn.send(frame({ op: Op.HELLO, status: 10, seq: hl.h.seq, session: hl.h.session }));
    },
  ),
  helloFault(
    "9.3.7",
    "HELLO answered INTERNAL → reconnect after backoff",
    "CONTRACT 5: INTERNAL → reconnect with backoff.",
    "backoff",
    (_ctx, hl) => {
      hl.conn.send(frame({ op: Op.HELLO, status: 11, seq: hl.h.seq, session: hl.h.session }));
    },
  ),
  helloFault(
    "9.3.8",
    "HELLO answered STALE_SEQ → a new session at once (1.1)",
    "CONTRACT 6.2 (1.1): the client starts a new session when a HELLO of its session is answered STALE_SEQ (retrying the same session can never succeed).",
    "new-session",
    (_ctx, hl) => {
      hl.conn.send(frame({ op: Op.HELLO, status: 2, seq: hl.h.seq, session: hl.h.session }));
    },
  ),
  helloFault(
    "9.3.9",
    "no HelloReply (the HELLO times out) → reconnect after backoff",
    "CONTRACT 9.1: after a failure the client waits backoff.",
    "backoff",
    () => {},
  ),
  helloFault(
    "9.3.10",
    "a HelloReply echoing another seq → not installed; reconnect after backoff",
    "CONTRACT 4, 9.1: a reply echoes seq; a failed HELLO is a connect failure (backoff).",
    "backoff",
    (ctx, hl) => {
      hl.conn.send(
        frame({ op: Op.HELLO, seq: (hl.h.seq + 1) >>> 0, session: hl.h.session }, ctx.helloReply(0)),
      );
    },
  ),
  okHelloWith("9.3.11", "another drafter_identity", (ctx) => ({
    drafterIdentity: flip(ctx.drafterIdentity),
  })),
  okHelloWith("9.3.12", "another markov_identity", (ctx) => ({ markovIdentity: flip(ctx.markovIdentity) })),
  okHelloWith("9.3.13", "another window", (ctx) => ({ window: ctx.W + 1 })),
  okHelloWith("9.3.14", "another num_spec", (ctx) => ({ numSpec: ctx.N === 32 ? 31 : ctx.N + 1 })),
  okHelloWith("9.3.15", "another vocab_size", (ctx) => ({ vocabSize: ctx.V + 1 })),
  okHelloWith("9.3.16", "another row_bytes", (ctx) => ({ rowBytes: ctx.rowBytes + 2 })),
  okHelloWith("9.3.17", "no TAPS_BF16 capability", () => ({ capabilities: 6 })),
  okHelloWith(
    "9.3.18",
    "no MARGIN capability for a WANT_MARGIN HELLO",
    () => ({ capabilities: 3 }),
    (_c, hl) => ((hl.f.helloFlags & 1) !== 0 ? null : "a WANT_MARGIN HELLO"),
  ),
  okHelloWith(
    "9.3.19",
    "no TOP32 capability for a TOP32 HELLO",
    () => ({ capabilities: 5 }),
    (_c, hl) => (hl.f.sampleMode === 1 ? null : "a TOP32 HELLO"),
  ),
  okHelloWith(
    "9.3.20",
    "max_slots below what the HELLO asked",
    (_c, hl) => ({ maxSlots: hl.f.maxSlots - 1 }),
    (_c, hl) => (hl.f.maxSlots > 0 ? null : "max_slots > 0"),
  ),
  okHelloWith(
    "9.3.21",
    "max_rows_per_step below what the HELLO asked",
    (_c, hl) => ({ maxRowsPerStep: hl.f.maxRowsPerStep - 1 }),
    (_c, hl) => (hl.f.maxRowsPerStep > 0 ? null : "max_rows_per_step > 0"),
  ),
];

/** Last: every request of the run passed the tester's checks (CONTRACT 4, 6.1, 6.2, 7.2, 7.3). */
export const CLIENT_SUMMARY: C = {
  id: "9.1.4",
  title:
    "every HELLO and STEP the client sent in this run passed CONTRACT 4, 6.1, 6.2 (seq newer, bound connection), 7.2 and 7.3",
  cite: "CONTRACT 7.2: structural checks; CONTRACT 6.2: seq newer than the session's highest; STEP only on a connection bound by an OK HELLO.",
  async run(ctx: ClientCtx, t: CaseCheck) {
    t.note(`${ctx.hellos} HELLOs, ${ctx.steps} STEPs seen`);
    t.must(ctx.allViolations.length === 0, "no violation", () => ctx.allViolations.slice(0, 5).join("; "));
  },
};
