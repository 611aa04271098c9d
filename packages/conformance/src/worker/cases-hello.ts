// Over 500 lines on purpose: a table of numbered cases (one object per case, each with its cited
// sentence); splitting it would only scatter one contract section's table over files.
/** Worker cases of CONTRACT 5 (statuses change nothing) and 6.1 (HELLO checks, auth, HelloReply). */
import { Op } from "@tapwire/wire";
import type { HelloFields } from "../frames.js";
import { frame, helloBody, helloHmac, hex } from "../frames.js";
import type { CaseCheck, CaseDef } from "../runner.js";
import { helloReplyProblems } from "../validate.js";
import type { Bound, WorkerCtx } from "./context.js";
import { st } from "./context.js";

type W = CaseDef<WorkerCtx>;

const CHECK_ORDER =
  "CONTRACT 6.1: worker order of checks: version (BAD_VERSION) → body size (BAD_FRAME) → auth (UNAUTHORIZED, with a token) → identities (IDENTITY_MISMATCH) → window, num_spec, vocab_size, row_bytes, sample mode, max_slots and max_rows_per_step (CONFIG_MISMATCH) → session (6.2) → OK.";

/** A HELLO of a fresh session with `over`, expected `status`; for the mismatches the body must be the worker's HelloReply. */
async function helloStatus(
  ctx: WorkerCtx,
  t: CaseCheck,
  over: Partial<HelloFields>,
  status: number,
  opts: { sess?: number; seq?: number; body?: (b: Uint8Array) => Uint8Array; version?: number } = {},
): Promise<void> {
  const p = await ctx.peer();
  const sess = opts.sess ?? ctx.rng.nonZero();
  const seq = opts.seq ?? ctx.rng.u32();
  const f = ctx.helloFields(sess, seq, over);
  let body = helloBody(f);
  if (opts.body !== undefined) body = opts.body(body);
  const r = await p.call(
    t,
    frame(
      { op: Op.HELLO, seq, session: sess, ...(opts.version !== undefined ? { version: opts.version } : {}) },
      body,
    ),
    "HELLO",
  );
  t.must(r.h.status === status, st(status), () => st(r.h.status));
  if (status === 5 || status === 6) {
    const { r: hr, problems } = helloReplyProblems(r.body, status, null);
    t.must(
      hr !== null && problems.length === 0,
      `${st(status)} carries the worker's HelloReply (CONTRACT 5, 6.1)`,
      () => problems.join("; "),
    );
    const g = ctx.g;
    const diffs: string[] = [];
    if (hex(hr.drafterIdentity) !== hex(g.drafterIdentity)) diffs.push("drafter_identity");
    if (hex(hr.markovIdentity) !== hex(g.markovIdentity)) diffs.push("markov_identity");
    if (hr.window !== g.window) diffs.push(`window ${hr.window}`);
    if (hr.numSpec !== g.numSpec) diffs.push(`num_spec ${hr.numSpec}`);
    if (hr.vocabSize !== g.vocab) diffs.push(`vocab_size ${hr.vocabSize}`);
    if (hr.rowBytes !== g.rowBytes) diffs.push(`row_bytes ${hr.rowBytes}`);
    if (hr.windowsKept !== 0) diffs.push(`windows_kept ${hr.windowsKept}`);
    t.must(diffs.length === 0, "the HelloReply holds the worker's own values (windows_kept 0)", () =>
      diffs.join(", "),
    );
  }
}

function mismatch(
  id: string,
  title: string,
  over: (c: WorkerCtx) => Partial<HelloFields>,
  status: number,
  cite: string,
  guard?: (c: WorkerCtx, t: CaseCheck) => void,
): W {
  return {
    id,
    title,
    cite,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      guard?.(ctx, t);
      await helloStatus(ctx, t, over(ctx), status);
    },
  };
}

const flip = (b: Uint8Array, i = 0) => {
  const c = new Uint8Array(b);
  c[i]! ^= 0x01;
  return c;
};

const CFG =
  "CONTRACT 6.1: window, num_spec, vocab_size, row_bytes, sample mode supported, max_slots and max_rows_per_step within its own limits (CONFIG_MISMATCH); the HelloReply is sent with CONFIG_MISMATCH so the client can say what differs.";
const CFG2 =
  "CONTRACT 6.1: the worker also refuses with CONFIG_MISMATCH: row_bytes != num_taps*hidden*2, row_dtype != 1, unknown hello_flags bits, and TOP32 with vocab_size < 32.";
const ID = "CONTRACT 6.1: identities (IDENTITY_MISMATCH), with the worker's HelloReply as body.";

/** Bound session with one window held at slot 0 (anchor 4), for "changed nothing" cases. */
async function withWindow(ctx: WorkerCtx, t: CaseCheck): Promise<Bound> {
  const b = await ctx.bound(t);
  await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 4, nRows: 4, flags: 3 })]);
  return b;
}

/** The window of slot 0 still ends at 4 and the connection is still bound. */
async function intact(ctx: WorkerCtx, t: CaseCheck, b: Bound): Promise<void> {
  await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 4 })]);
}

function unchangedByHello(
  id: string,
  title: string,
  over: (c: WorkerCtx) => Partial<HelloFields>,
  status: number,
  mod?: {
    body?: (b: Uint8Array) => Uint8Array;
    version?: number;
    sameSession?: boolean;
    needToken?: boolean;
  },
): W {
  return {
    id,
    title,
    cite: "CONTRACT 5: a worker that answers a non-OK status has changed no state for that frame (the current session, its windows and its bound connections stay).",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (mod?.needToken === true && ctx.token === null)
        t.info("a worker with a token (--token)", "the tester has no token");
      const b = await withWindow(ctx, t);
      const sess = mod?.sameSession === true ? b.sess.id : ctx.rng.nonZero();
      const seq = mod?.sameSession === true ? b.sess.next : ctx.rng.u32();
      await helloStatus(ctx, t, over(ctx), status, {
        sess,
        seq,
        ...(mod?.body ? { body: mod.body } : {}),
        ...(mod?.version !== undefined ? { version: mod.version } : {}),
      });
      await intact(ctx, t, b);
    },
  };
}

export const statusCases: W[] = [
  {
    id: "5.1.1",
    title: "a STALE_SEQ STEP changed nothing: its rows are not applied",
    cite: "CONTRACT 5: a worker that answers a non-OK status has changed no state for that frame.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await withWindow(ctx, t);
      const m = ctx.stepMsg(b, [ctx.entry(b, { slot: 0, anchorPos: 6, nRows: 2, rowStart: 4, flags: 1 })], {
        seq: b.sess.hi,
      });
      await ctx.refused(t, b.peer, m, 2, "STEP with the highest seq again");
      await intact(ctx, t, b);
    },
  },
  {
    id: "5.1.2",
    title: "a BAD_FRAME STEP does not consume its seq: the same seq is accepted next",
    cite: "CONTRACT 5: a non-OK answer changed no state (CONTRACT 6.2: only an accepted frame's seq becomes the highest).",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await withWindow(ctx, t);
      const seq = b.sess.next;
      const bad = ctx.stepMsg(
        b,
        [ctx.entry(b, { slot: 0, anchorPos: 6, nRows: 2, rowStart: 4, flags: 1 | 8 })],
        { seq },
      );
      await ctx.refused(t, b.peer, bad, 3, "STEP with flag bit 3");
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 4 })]);
    },
  },
  {
    id: "5.1.3",
    title: "a BAD_FRAME STEP applies nothing: rows of its valid first entry are not in the window",
    cite: "CONTRACT 7.2: structural checks first; any failure answers BAD_FRAME and applies nothing.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await withWindow(ctx, t);
      const bad = ctx.stepMsg(b, [
        ctx.entry(b, { slot: 0, anchorPos: 6, nRows: 2, rowStart: 4, flags: 1 }),
        ctx.entry(b, { slot: 1, anchorPos: 1, nRows: 1, flags: 3, reserved: 1 }),
      ]);
      await ctx.refused(t, b.peer, bad, 3, "STEP whose second entry has reserved != 0");
      await intact(ctx, t, b);
    },
  },
  {
    id: "5.1.4",
    title: "a TOO_LARGE STEP does not consume its seq",
    cite: "CONTRACT 5: a non-OK answer changed no state; CONTRACT 7.2: a body above the session's limit is TOO_LARGE.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t, { maxSlots: 2, maxRowsPerStep: 2 });
      const seq = b.sess.next;
      const big = ctx.stepMsg(b, [ctx.entry(b, { slot: 0, anchorPos: 40, nRows: 40, flags: 3 })], { seq });
      await ctx.refused(
        t,
        b.peer,
        big,
        9,
        "STEP above rows_offset_for(max_slots) + max_rows_per_step * row_bytes",
      );
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 2, nRows: 2, flags: 3 })]);
    },
  },
  {
    id: "5.1.5",
    title: "a NO_SESSION STEP from an unbound connection changed nothing: neither its rows nor its seq",
    cite: "CONTRACT 5: a non-OK answer changed no state; CONTRACT 6.2: STEP on a connection not bound is NO_SESSION.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await withWindow(ctx, t);
      const other = await ctx.peer();
      const seq = b.sess.next;
      const m = ctx.stepMsg(b, [ctx.entry(b, { slot: 0, anchorPos: 6, nRows: 2, rowStart: 4, flags: 1 })], {
        seq,
      });
      await ctx.refused(t, other, m, 1, "STEP of the current session on a connection that never said HELLO");
      await intact(ctx, t, b);
    },
  },
  {
    id: "5.1.6",
    title: "a BAD_VERSION STEP does not consume its seq",
    cite: "CONTRACT 5: a non-OK answer changed no state.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await withWindow(ctx, t);
      const m = ctx.stepMsg(b, [ctx.entry(b, { slot: 0, anchorPos: 4 })]);
      m[4] = 2;
      await ctx.refused(t, b.peer, m, 4, "STEP with version 2");
      await intact(ctx, t, b);
    },
  },
  {
    id: "5.1.7",
    title: "an UNKNOWN_OP frame of the session changes nothing",
    cite: "CONTRACT 5: a non-OK answer changed no state.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await withWindow(ctx, t);
      await ctx.refused(t, b.peer, frame({ op: 9, seq: b.sess.next, session: b.sess.id }), 7, "op 9");
      await intact(ctx, t, b);
    },
  },
  unchangedByHello(
    "5.1.8",
    "an IDENTITY_MISMATCH HELLO of another session does not take over (windows and binding stay)",
    (c) => ({ drafterIdentity: flip(c.g.drafterIdentity) }),
    5,
  ),
  unchangedByHello(
    "5.1.9",
    "a CONFIG_MISMATCH HELLO of another session does not take over",
    (c) => ({ window: c.g.window === 1 ? 2 : c.g.window - 1 }),
    6,
  ),
  unchangedByHello(
    "5.1.10",
    "a BAD_FRAME HELLO (159-byte body) of another session does not take over",
    () => ({}),
    3,
    { body: (b) => b.subarray(0, 159) },
  ),
  unchangedByHello("5.1.11", "a BAD_VERSION HELLO of another session does not take over", () => ({}), 4, {
    version: 2,
  }),
  unchangedByHello(
    "5.1.12",
    "an UNAUTHORIZED HELLO of another session does not take over (token)",
    () => ({ auth: new Uint8Array(32) }),
    8,
    { needToken: true },
  ),
  unchangedByHello(
    "5.1.13",
    "a CONFIG_MISMATCH re-HELLO of the current session keeps its windows and binding",
    (c) => ({ numSpec: c.g.numSpec === 1 ? 2 : c.g.numSpec - 1 }),
    6,
    { sameSession: true },
  ),
  {
    id: "5.1.14",
    title: "a CONFIG_MISMATCH re-HELLO of the current session does not consume its seq",
    cite: "CONTRACT 5: a non-OK answer changed no state (the session's highest seq is unchanged).",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t, { reset: false });
      const seq = b.sess.next;
      await helloStatus(ctx, t, { vocabSize: ctx.g.vocab + 1 }, 6, { sess: b.sess.id, seq });
      await ctx.helloOk(
        t,
        b.peer,
        b.sess,
        { sampleMode: b.sampled ? 1 : 0, helloFlags: b.margin ? 1 : 0 },
        seq,
      );
    },
  },
];

/** Run last: every status seen in the run is a CONTRACT 5 status. */
export const statusSummaryCase: W = {
  id: "5.1.15",
  title: "every frame status the worker sent in this run is one of the 12 of CONTRACT 5",
  cite: "CONTRACT 5: frame statuses are 0..11.",
  async run(ctx: WorkerCtx, t: CaseCheck) {
    const bad = [...ctx.statuses.keys()].filter((s) => s > 11);
    t.must(bad.length === 0, "statuses 0..11 only", () => `saw ${bad.join(", ")}`);
    t.note(`statuses seen: ${[...ctx.statuses.entries()].map(([s, n]) => `${st(s)}×${n}`).join(", ")}`);
  },
};

export const helloCases: W[] = [
  {
    id: "6.1.1",
    title: "a HELLO with the worker's identities and geometry → OK with a valid HelloReply",
    cite: "CONTRACT 6.1: client checks of an OK reply: identities equal; window and num_spec equal; TAPS_BF16; max_slots and max_rows_per_step at least what it asked; vocab_size and row_bytes equal.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await ctx.bound(t, { reset: false });
    },
  },
  {
    id: "6.1.2",
    title: "a new session's HelloReply has windows_kept 0",
    cite: "CONTRACT 6.1: windows_kept (slot windows kept from before this HELLO; 0 for a new session).",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const s = ctx.newSess();
      const b = await ctx.bound(t, { sess: s, reset: false });
      t.must(b.helloReply.windowsKept === 0, "windows_kept 0", () => String(b.helloReply.windowsKept));
    },
  },
  {
    id: "6.1.3",
    title: "a WANT_MARGIN HELLO is answered with the MARGIN capability",
    cite: "CONTRACT 6.1: client checks of an OK reply: MARGIN capability when WANT_MARGIN.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (!ctx.hasMargin) t.unimplemented("MARGIN (the worker does not offer it)");
      const b = await ctx.bound(t, { margin: true, reset: false });
      t.must(
        (b.helloReply.capabilities & 4) !== 0,
        "MARGIN",
        () => `capabilities ${b.helloReply.capabilities}`,
      );
    },
  },
  {
    id: "6.1.4",
    title: "a TOP32 HELLO is answered OK with the TOP32 capability",
    cite: "CONTRACT 6.1: client checks of an OK reply: TOP32 capability when sample_mode is TOP32.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t, { sampled: true, reset: false });
      t.must(
        (b.helloReply.capabilities & 2) !== 0,
        "TOP32",
        () => `capabilities ${b.helloReply.capabilities}`,
      );
    },
  },
  {
    id: "6.1.5",
    title:
      "a HELLO asking fewer slots and rows than the worker's limits is OK, the reply's limits at least those",
    cite: "CONTRACT 6.2: the session's limits are those its HELLO asked for (at most the worker's own).",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await ctx.bound(t, { maxSlots: 1, maxRowsPerStep: 1, reset: false });
    },
  },
  {
    id: "6.1.6",
    title: "a HELLO asking exactly the worker's max_slots and max_rows_per_step is OK",
    cite: "CONTRACT 6.1: max_slots and max_rows_per_step within its own limits.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await ctx.bound(t, { maxSlots: ctx.g.maxSlots, maxRowsPerStep: ctx.g.maxRowsPerStep, reset: false });
    },
  },
  mismatch("6.1.7", "HELLO body of 159 bytes → BAD_FRAME", () => ({}), 3, CHECK_ORDER),
  mismatch("6.1.8", "HELLO body of 161 bytes → BAD_FRAME", () => ({}), 3, CHECK_ORDER),
  mismatch("6.1.9", "HELLO with an empty body → BAD_FRAME", () => ({}), 3, CHECK_ORDER),
  mismatch(
    "6.1.10",
    "drafter_identity differs in one bit → IDENTITY_MISMATCH with the worker's HelloReply",
    (c) => ({ drafterIdentity: flip(c.g.drafterIdentity, 31) }),
    5,
    ID,
  ),
  mismatch(
    "6.1.11",
    "markov_identity differs → IDENTITY_MISMATCH with the worker's HelloReply",
    (c) => ({ markovIdentity: flip(c.g.markovIdentity, 0) }),
    5,
    ID,
  ),
  mismatch(
    "6.1.12",
    "window one less than the worker's (or 2 for W = 1) → CONFIG_MISMATCH",
    (c) => ({ window: c.g.window === 1 ? 2 : c.g.window - 1 }),
    6,
    CFG,
  ),
  mismatch("6.1.13", "window 0 → CONFIG_MISMATCH", () => ({ window: 0 }), 6, CFG),
  mismatch(
    "6.1.14",
    "window 4097 → CONFIG_MISMATCH",
    () => ({ window: 4097 }),
    6,
    "CONTRACT 6.1: window W (1..4096).",
  ),
  mismatch(
    "6.1.15",
    "num_spec differs → CONFIG_MISMATCH",
    (c) => ({ numSpec: c.g.numSpec === 1 ? 2 : c.g.numSpec - 1 }),
    6,
    CFG,
  ),
  mismatch(
    "6.1.16",
    "num_spec 0 → CONFIG_MISMATCH",
    () => ({ numSpec: 0 }),
    6,
    "CONTRACT 6.1: num_spec N (1..32).",
  ),
  mismatch(
    "6.1.17",
    "num_spec 33 → CONFIG_MISMATCH",
    () => ({ numSpec: 33 }),
    6,
    "CONTRACT 6.1: num_spec N (1..32).",
  ),
  mismatch(
    "6.1.18",
    "vocab_size one more than the worker's → CONFIG_MISMATCH",
    (c) => ({ vocabSize: c.g.vocab + 1 }),
    6,
    CFG,
  ),
  mismatch(
    "6.1.19",
    "row_bytes (with num_taps x hidden x 2 equal to it) differs from the worker's → CONFIG_MISMATCH",
    (c) => ({ numTaps: c.g.numTaps, hidden: c.g.hidden + 1, rowBytes: c.g.numTaps * (c.g.hidden + 1) * 2 }),
    6,
    CFG,
  ),
  mismatch(
    "6.1.20",
    "row_bytes != num_taps * hidden * 2 → CONFIG_MISMATCH",
    (c) => ({ hidden: c.g.hidden + 1 }),
    6,
    CFG2,
  ),
  mismatch("6.1.21", "row_dtype 0 → CONFIG_MISMATCH", () => ({ rowDtype: 0 }), 6, CFG2),
  mismatch("6.1.22", "row_dtype 2 → CONFIG_MISMATCH", () => ({ rowDtype: 2 }), 6, CFG2),
  mismatch(
    "6.1.23",
    "sample_mode 2 (unknown) → CONFIG_MISMATCH",
    () => ({ sampleMode: 2 }),
    6,
    "CONTRACT 6.1: sample mode supported (CONFIG_MISMATCH); sample_mode is 0 GREEDY or 1 TOP32.",
  ),
  mismatch(
    "6.1.24",
    "sample_mode TOP32 on a worker without the TOP32 capability → CONFIG_MISMATCH",
    () => ({ sampleMode: 1 }),
    6,
    CFG,
    (c, t) => {
      if (c.hasTop32) t.info("a worker without TOP32", "the worker offers TOP32 (see 6.1.4)");
    },
  ),
  mismatch(
    "6.1.25",
    "TOP32 with vocab_size < 32 → CONFIG_MISMATCH",
    () => ({ sampleMode: 1 }),
    6,
    CFG2,
    (c, t) => {
      if (c.g.vocab >= 32) t.info("a worker whose vocabulary is below 32", `vocab ${c.g.vocab}`);
    },
  ),
  mismatch("6.1.26", "hello_flags bit 1 (unknown) → CONFIG_MISMATCH", () => ({ helloFlags: 2 }), 6, CFG2),
  mismatch(
    "6.1.27",
    "hello_flags bit 31 (unknown) → CONFIG_MISMATCH",
    () => ({ helloFlags: 0x80000000 }),
    6,
    CFG2,
  ),
  mismatch(
    "6.1.28",
    "max_slots above the worker's → CONFIG_MISMATCH",
    (c) => ({ maxSlots: c.g.maxSlots + 1 }),
    6,
    CFG,
  ),
  mismatch(
    "6.1.29",
    "max_rows_per_step above the worker's → CONFIG_MISMATCH",
    (c) => ({ maxRowsPerStep: c.g.maxRowsPerStep + 1 }),
    6,
    CFG,
    (c, t) => {
      if (c.g.maxRowsPerStep === 0xffffffff) t.info("a finite max_rows_per_step", "2^32 - 1");
    },
  ),
  mismatch(
    "6.1.30",
    "WANT_MARGIN on a worker without MARGIN → CONFIG_MISMATCH",
    () => ({ helloFlags: 1 }),
    6,
    "CONTRACT 6.1: unknown or unsupported hello_flags are CONFIG_MISMATCH (a client would disable on an OK without MARGIN).",
    (c, t) => {
      if (c.hasMargin) t.info("a worker without MARGIN", "the worker offers MARGIN (see 6.1.3)");
    },
  ),
  {
    id: "6.1.31",
    title: "check order: wrong version and wrong body size → BAD_VERSION",
    cite: CHECK_ORDER,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await helloStatus(ctx, t, {}, 4, { version: 3, body: (b) => b.subarray(0, 100) });
    },
  },
  {
    id: "6.1.32",
    title: "check order: wrong body size and wrong identity → BAD_FRAME",
    cite: CHECK_ORDER,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await helloStatus(ctx, t, { drafterIdentity: new Uint8Array(32).fill(7) }, 3, {
        body: (b) => b.subarray(0, 150),
      });
    },
  },
  {
    id: "6.1.33",
    title: "check order: wrong identity and wrong window → IDENTITY_MISMATCH",
    cite: CHECK_ORDER,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await helloStatus(ctx, t, { markovIdentity: flip(ctx.g.markovIdentity, 5), window: 0 }, 5);
    },
  },
  {
    id: "6.1.34",
    title: "check order (token): wrong auth and wrong identity → UNAUTHORIZED",
    cite: CHECK_ORDER,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (ctx.token === null) t.info("a worker with a token (--token)", "no token given");
      await helloStatus(
        ctx,
        t,
        { auth: new Uint8Array(32).fill(1), drafterIdentity: flip(ctx.g.drafterIdentity) },
        8,
      );
    },
  },
  {
    id: "6.1.35",
    title:
      "check order: a wrong config on a stale re-HELLO of the current session → CONFIG_MISMATCH (config before session)",
    cite: CHECK_ORDER,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t, { reset: false });
      await helloStatus(ctx, t, { numSpec: 0 }, 6, { sess: b.sess.id, seq: b.sess.hi });
    },
  },
  {
    id: "6.1.36",
    title: "token: a HELLO with zero auth → UNAUTHORIZED",
    cite: "CONTRACT 11: with a token configured, a HELLO without the right auth is UNAUTHORIZED.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (ctx.token === null) t.info("a worker with a token (--token)", "no token given");
      await helloStatus(ctx, t, { auth: new Uint8Array(32) }, 8);
    },
  },
  {
    id: "6.1.37",
    title: "token: HMAC under another key → UNAUTHORIZED",
    cite: 'CONTRACT 6.1: auth = HMAC-SHA256(key = shared token, msg = "tapwire/hello" ‖ session u32 ‖ seq u32).',
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (ctx.token === null) t.info("a worker with a token (--token)", "no token given");
      const sess = ctx.rng.nonZero();
      const seq = ctx.rng.u32();
      await helloStatus(ctx, t, { auth: helloHmac(`${ctx.token}x`, sess, seq) }, 8, { sess, seq });
    },
  },
  {
    id: "6.1.38",
    title: "token: the right key over another seq (a replayed auth with a new seq) → UNAUTHORIZED",
    cite: "CONTRACT 6.1: the auth covers session u32 ‖ seq u32.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (ctx.token === null) t.info("a worker with a token (--token)", "no token given");
      const sess = ctx.rng.nonZero();
      const seq = ctx.rng.u32();
      await helloStatus(ctx, t, { auth: helloHmac(ctx.token!, sess, seq + 1) }, 8, { sess, seq });
    },
  },
  {
    id: "6.1.39",
    title: "token: the right key over another session → UNAUTHORIZED",
    cite: "CONTRACT 6.1: the auth covers session u32 ‖ seq u32.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (ctx.token === null) t.info("a worker with a token (--token)", "no token given");
      const sess = ctx.rng.nonZero();
      const seq = ctx.rng.u32();
      await helloStatus(ctx, t, { auth: helloHmac(ctx.token!, sess ^ 1, seq) }, 8, { sess, seq });
    },
  },
  {
    id: "6.1.40",
    title: 'token: the HMAC of the contract (key = token, "tapwire/hello" ‖ session LE ‖ seq LE) → OK',
    cite: 'CONTRACT 6.1: auth: zeros, or HMAC-SHA256(key = shared token, msg = "tapwire/hello" ‖ session u32 ‖ seq u32).',
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (ctx.token === null) t.info("a worker with a token (--token)", "no token given");
      await ctx.bound(t, { reset: false });
    },
  },
  {
    id: "6.1.41",
    title: "the HelloReply's worker_name is UTF-8, NUL-padded; reserved is 0",
    cite: "CONTRACT 6.1: HelloReply: reserved (0); worker_name, UTF-8, NUL-padded.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t, { reset: false });
      t.note(
        `worker_name ${JSON.stringify(Buffer.from(b.helloReply.workerNameBytes).toString("utf8").replace(/\0+$/, ""))}`,
      );
    },
  },
];

// The three body-size cases need their own bodies.
for (const [id, n] of [
  ["6.1.7", 159],
  ["6.1.8", 161],
  ["6.1.9", 0],
] as const) {
  const c = helloCases.find((x) => x.id === id)!;
  c.run = async (ctx: WorkerCtx, t: CaseCheck) => {
    await helloStatus(ctx, t, {}, 3, {
      body: (b) => {
        const out = new Uint8Array(n);
        out.set(b.subarray(0, Math.min(n, b.length)));
        return out;
      },
    });
  };
}
