// Over 500 lines on purpose: a table of numbered cases (one object per case, each with its cited
// sentence); splitting it would only scatter one contract section's table over files.
/** Worker cases of CONTRACT 10 (PING, STATS, RESET) and 11 (limits before HELLO, garbage, fuzz). */
import { Op } from "@tapwire/wire";
import type { Received } from "../conn.js";
import { frame, lePrefix, parseStepReply } from "../frames.js";
import type { CaseCheck, CaseDef } from "../runner.js";
import { ShmConn } from "../shm.js";
import { headerProblems } from "../validate.js";
import type { Bound, Peer, WorkerCtx } from "./context.js";
import { describe, st } from "./context.js";

type W = CaseDef<WorkerCtx>;

const PING =
  "CONTRACT 10: PING: any session (0 allowed); body up to 1 KiB is echoed (larger: TOO_LARGE). Touches no session state.";
const STATS =
  "CONTRACT 10: STATS: any session (0 allowed); request body empty (ignored if not; above 1 KiB: TOO_LARGE); reply body is UTF-8 JSON of the worker's stats snapshot.";
const LEAK =
  "CONTRACT 10 (1.1): on a connection that is not bound to the current session (6.2) the snapshot MUST NOT contain the current session id or its seq.";
const RESET =
  "CONTRACT 10: RESET: current session only (6.2 seq rules); drops all slot state, keeps the session.";
const PRE =
  "CONTRACT 11 (1.1): on a connection that is not bound a worker accepts messages of at most 4 KiB. A larger length prefix is refused before the body is buffered: the worker reads the 24-byte header alone and answers NO_SESSION to a STEP or RESET and TOO_LARGE to anything else, or just closes when no readable header arrives; it closes that connection either way.";
const GARBAGE =
  "CONTRACT 11: garbage on a connection never crashes a worker or a client; it ends that connection or that frame with a status, and is counted.";

async function statsJson(t: CaseCheck, p: Peer, session = 0): Promise<string> {
  const r = await p.call(t, frame({ op: Op.STATS, seq: 1, session }), "STATS");
  t.must(r.h.status === 0, "STATS answered OK", () => st(r.h.status));
  let text = "";
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(r.body);
  } catch {
    t.must(false, "a UTF-8 body", "invalid UTF-8");
  }
  let j: unknown;
  try {
    j = JSON.parse(text);
  } catch (e) {
    t.must(false, "a JSON body", () => `${String(e)}: ${text.slice(0, 80)}`);
  }
  t.must(typeof j === "object" && j !== null, "a JSON object (the stats snapshot)", () => typeof j);
  return text;
}

/** Where the session id or its highest seq appear in a STATS text. */
function leaks(text: string, id: number, hi: number): string[] {
  const out: string[] = [];
  const h8 = id.toString(16).padStart(8, "0");
  if (new RegExp(`(^|[^0-9])${id}([^0-9]|$)`).test(text)) out.push(`session id ${id} (decimal)`);
  if (text.toLowerCase().includes(h8)) out.push(`session id 0x${h8} (hex)`);
  if (new RegExp(`(^|[^0-9])${hi}([^0-9]|$)`).test(text)) out.push(`highest seq ${hi}`);
  return out;
}

async function withWindow(ctx: WorkerCtx, t: CaseCheck): Promise<Bound> {
  const b = await ctx.bound(t);
  await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 4, nRows: 4, flags: 3, generation: 5 })]);
  return b;
}

/** Sends only the 24-byte header of a message announcing `total` bytes (stream), or the whole message (ZeroMQ). */
async function headerOnly(ctx: WorkerCtx, p: Peer, h: Uint8Array, total: number): Promise<Received> {
  if (ctx.stream) {
    p.raw.sendRaw(lePrefix(total));
    p.raw.sendRaw(h);
  } else if (p.raw instanceof ShmConn && p.raw.inline(total)) {
    // shm+unix, too large for the mapping: inline, the header alone after the BELL (as on a stream;
    // writing the whole body would race the worker's close against reading its answer).
    p.raw.sendInlineHead(h, total);
  } else {
    const m = new Uint8Array(total);
    m.set(h);
    p.raw.send(m);
    // A ZeroMQ socket drops a message above its maxMessageSize silently: wait less for it.
    // shm+unix: the whole request is in the mapping and the doorbell's total is checked (issue 23).
    if (!ctx.closes) return p.raw.recv(Math.min(ctx.timeoutMs, 500));
  }
  return p.raw.recv(ctx.timeoutMs);
}

function preHello(
  id: string,
  title: string,
  op: number,
  total: number,
  status: number,
  session: (c: WorkerCtx) => number,
): W {
  return {
    id,
    title,
    cite: PRE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t, { reset: false });
      const p = await ctx.peer();
      const sess = session(ctx);
      const seq = b.sess.next;
      const h = frame({ op, seq, session: sess, bodyLen: total - 24 });
      const r = await headerOnly(ctx, p, h.subarray(0, 24), total);
      if (!ctx.closes) {
        // ZeroMQ has no length prefix: the whole message arrives and may be answered by its own checks.
        if (r.kind === "timeout") {
          t.note("ZeroMQ: the message was dropped (no reply)");
          return;
        }
        t.must(
          r.kind === "msg" && r.bytes[7] !== 0,
          `${st(status)} (or any refusal, or the message dropped)`,
          () => describe(r),
        );
        return;
      }
      t.must(r.kind === "msg", `${st(status)} answered from the header alone, before the body arrives`, () =>
        describe(r),
      );
      const hp = headerProblems(r.bytes, { op, seq, session: sess });
      t.must(hp.problems.length === 0, "a valid reply echoing the header", () => hp.problems.join("; "));
      t.must(r.bytes[7] === status, st(status), () => describe(r));
      t.must(
        await p.raw.waitClosed(ctx.timeoutMs),
        "the connection closed after the reply",
        "it stayed open",
      );
    },
  };
}

export const miscCases: W[] = [
  {
    id: "10.1",
    title: "PING with session 0 and an empty body → OK, empty body",
    cite: PING,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const p = await ctx.peer();
      const r = await p.call(t, frame({ op: Op.PING, seq: 5, session: 0 }), "PING");
      t.must(
        r.h.status === 0 && r.body.length === 0,
        "OK with an empty body",
        () => `${st(r.h.status)}, ${r.body.length} bytes`,
      );
    },
  },
  {
    id: "10.2",
    title: "PING with a 1024-byte body → OK echoing it byte for byte",
    cite: PING,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const p = await ctx.peer();
      const body = ctx.rng.bytes(1024);
      const r = await p.call(t, frame({ op: Op.PING, seq: 6, session: 0 }, body), "PING");
      t.must(
        r.h.status === 0 && Buffer.from(r.body).equals(Buffer.from(body)),
        "OK echoing the body",
        () => `${st(r.h.status)}, ${r.body.length} bytes`,
      );
    },
  },
  {
    id: "10.3",
    title: "PING with a 1025-byte body → TOO_LARGE",
    cite: PING,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t, { reset: false });
      const r = await b.peer.call(
        t,
        frame({ op: Op.PING, seq: 7, session: 0 }, new Uint8Array(1025)),
        "PING",
      );
      t.must(r.h.status === 9, "TOO_LARGE", () => st(r.h.status));
    },
  },
  {
    id: "10.4",
    title: "PING carrying the session id and the next seq touches no state: a STEP with that seq is still OK",
    cite: PING,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await withWindow(ctx, t);
      const r = await b.peer.call(t, frame({ op: Op.PING, seq: b.sess.next, session: b.sess.id }), "PING");
      t.must(r.h.status === 0, "OK", () => st(r.h.status));
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 4, generation: 5 })]);
    },
  },
  {
    id: "10.5",
    title: "PING on an unbound connection does not bind it: a STEP after it → NO_SESSION",
    cite: `${PING} ${"CONTRACT 6.2: a connection becomes bound when a HELLO of that session is answered OK on it."}`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      const p = await ctx.peer();
      await p.call(t, frame({ op: Op.PING, seq: b.sess.next, session: b.sess.id }), "PING");
      await ctx.refused(
        t,
        p,
        ctx.stepMsg(b, [ctx.entry(b, { slot: 0, anchorPos: 0 })]),
        1,
        "STEP after a PING",
      );
    },
  },
  {
    id: "10.6",
    title: "STATS with session 0 → OK, a UTF-8 JSON object",
    cite: STATS,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await statsJson(t, await ctx.peer());
    },
  },
  {
    id: "10.7",
    title: "STATS with a 100-byte body → OK (the body is ignored)",
    cite: STATS,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const p = await ctx.peer();
      const r = await p.call(
        t,
        frame({ op: Op.STATS, seq: 9, session: 0 }, new Uint8Array(100).fill(0x41)),
        "STATS",
      );
      t.must(r.h.status === 0, "OK", () => st(r.h.status));
    },
  },
  {
    id: "10.8",
    title: "STATS with a 1025-byte body → TOO_LARGE",
    cite: STATS,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t, { reset: false });
      const r = await b.peer.call(
        t,
        frame({ op: Op.STATS, seq: 9, session: 0 }, new Uint8Array(1025)),
        "STATS",
      );
      t.must(r.h.status === 9, "TOO_LARGE", () => st(r.h.status));
    },
  },
  {
    id: "10.9",
    title: "STATS on a connection that never said HELLO contains neither the current session id nor its seq",
    cite: LEAK,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await withWindow(ctx, t);
      const text = await statsJson(t, await ctx.peer());
      const l = leaks(text, b.sess.id, b.sess.hi);
      t.must(l.length === 0, "no session id and no seq in the snapshot", () => `it contains ${l.join(", ")}`);
    },
  },
  {
    id: "10.10",
    title: "STATS carrying the current session id on an unbound connection leaks neither",
    cite: LEAK,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await withWindow(ctx, t);
      const text = await statsJson(t, await ctx.peer(), b.sess.id);
      const l = leaks(text, b.sess.id, b.sess.hi);
      t.must(l.length === 0, "no session id and no seq in the snapshot", () => `it contains ${l.join(", ")}`);
    },
  },
  {
    id: "10.11",
    title:
      "STATS on a connection bound to a replaced session contains neither the new session id nor its seq",
    cite: LEAK,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const a = await ctx.bound(t);
      const b2 = await ctx.bound(t, { sess: ctx.newSess(), reset: false });
      const text = await statsJson(t, a.peer);
      const l = leaks(text, b2.sess.id, b2.sess.hi);
      t.must(l.length === 0, "no current session id and no seq", () => `it contains ${l.join(", ")}`);
    },
  },
  {
    id: "10.12",
    title: "STATS does not bind a connection: a STEP after it → NO_SESSION",
    cite: "CONTRACT 6.2: only an OK HELLO binds a connection.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      const p = await ctx.peer();
      await statsJson(t, p, b.sess.id);
      await ctx.refused(
        t,
        p,
        ctx.stepMsg(b, [ctx.entry(b, { slot: 0, anchorPos: 0 })]),
        1,
        "STEP after STATS",
      );
    },
  },
  {
    id: "10.13",
    title: "RESET drops every window: a continuing slot is NEED_RESYNC, a re-HELLO reports windows_kept 0",
    cite: RESET,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await withWindow(ctx, t);
      await ctx.resetOk(t, b);
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 4, generation: 5 })]);
      const { r } = await ctx.helloOk(t, b.peer, b.sess, {
        sampleMode: b.sampled ? 1 : 0,
        helloFlags: b.margin ? 1 : 0,
      });
      t.must(r.windowsKept === 0, "windows_kept 0", () => String(r.windowsKept));
    },
  },
  {
    id: "10.14",
    title: "RESET keeps the session: the bound connection STEPs on with the next seq",
    cite: RESET,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await withWindow(ctx, t);
      await ctx.resetOk(t, b);
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 1, anchorPos: 2, nRows: 2, flags: 3 })]);
    },
  },
  {
    id: "10.15",
    title: "RESET drops generations too: an older generation after it is accepted",
    cite: `${RESET} (all slot state: CONTRACT 7.1 keeps per slot a generation and a window)`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await withWindow(ctx, t);
      await ctx.resetOk(t, b);
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 1, nRows: 1, flags: 3, generation: 2 })]);
    },
  },
  {
    id: "10.16",
    title: "PING with session 0xffffffff and seq 0 → OK (any session)",
    cite: PING,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const p = await ctx.peer();
      const r = await p.call(t, frame({ op: Op.PING, seq: 0, session: 0xffffffff }), "PING");
      t.must(r.h.status === 0, "OK", () => st(r.h.status));
    },
  },

  // 11 before HELLO.
  {
    id: "11.1",
    title:
      "before HELLO, a 4096-byte message (PING with a 4072-byte body) is read and answered (TOO_LARGE for PING)",
    cite: `${PRE} ${PING}`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const p = await ctx.peer();
      const r = await p.call(
        t,
        frame({ op: Op.PING, seq: 11, session: 0 }, new Uint8Array(4096 - 24)),
        "a 4096-byte PING",
      );
      t.must(
        r.h.status === 9,
        "TOO_LARGE (the message itself is within 4 KiB; the PING body is above 1 KiB)",
        () => st(r.h.status),
      );
    },
  },
  preHello(
    "11.2",
    "before HELLO, a STEP announcing 4097 bytes: NO_SESSION from its header alone, then closed",
    Op.STEP,
    4097,
    1,
    (c) => c.main.id,
  ),
  preHello(
    "11.3",
    "before HELLO, a STEP announcing 1 MiB: NO_SESSION from its header alone, then closed",
    Op.STEP,
    1 << 20,
    1,
    (c) => c.main.id,
  ),
  preHello(
    "11.4",
    "before HELLO, a STEP of an unknown session announcing 32 MiB: NO_SESSION, then closed",
    Op.STEP,
    32 << 20,
    1,
    (c) => c.rng.nonZero(),
  ),
  preHello(
    "11.5",
    "before HELLO, a RESET announcing 64 KiB: NO_SESSION, then closed",
    Op.RESET,
    64 << 10,
    1,
    (c) => c.main.id,
  ),
  preHello(
    "11.6",
    "before HELLO, a PING announcing 8 KiB: TOO_LARGE, then closed",
    Op.PING,
    8 << 10,
    9,
    () => 0,
  ),
  preHello(
    "11.7",
    "before HELLO, a HELLO announcing 5000 bytes: TOO_LARGE, then closed",
    Op.HELLO,
    5000,
    9,
    (c) => c.main.id,
  ),
  preHello(
    "11.8",
    "before HELLO, a STATS announcing 5000 bytes: TOO_LARGE, then closed",
    Op.STATS,
    5000,
    9,
    () => 0,
  ),
  {
    id: "11.9",
    title: "before HELLO, a large prefix followed by an unreadable header: closed (no OK)",
    cite: PRE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (!ctx.stream) t.info("a length prefix (stream transports)", ctx.ep.scheme);
      const p = await ctx.peer();
      p.raw.sendRaw(lePrefix(1 << 20));
      p.raw.sendRaw(ctx.rng.bytes(24));
      const r = await p.raw.recv(ctx.timeoutMs);
      if (r.kind === "msg") {
        t.must(r.bytes[7] !== 0, "no OK", () => describe(r));
        t.must(await p.raw.waitClosed(ctx.timeoutMs), "the connection closed", "it stayed open");
        return;
      }
      t.must(r.kind === "closed", "the connection closed", () => describe(r));
    },
  },
  {
    id: "11.10",
    title: "after HELLO, the bound connection carries a STEP above 64 KiB (OK)",
    cite: "CONTRACT 11 (1.1): only a bound connection can carry a large STEP; the worker raises the limit once a connection is bound.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const want = Math.ceil(70_000 / ctx.g.rowBytes);
      const rowsMax = Math.min(ctx.g.maxRowsPerStep, Math.max(want, 64));
      if (rowsMax * ctx.g.rowBytes < 65_536)
        t.info(
          "a session whose largest STEP is above 64 KiB",
          `max_rows_per_step ${ctx.g.maxRowsPerStep} x row_bytes ${ctx.g.rowBytes}`,
        );
      const b = await ctx.bound(t, { maxSlots: 4, maxRowsPerStep: rowsMax });
      const n = Math.min(rowsMax, want);
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: n, nRows: n, flags: 3 })]);
    },
  },
  {
    id: "11.11",
    title:
      "a connection bound to a replaced session is unbound again: a STEP announcing 1 MiB → NO_SESSION, then closed",
    cite: `${PRE} A connection stays bound only to the session it said HELLO to.`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const a = await ctx.bound(t);
      await ctx.bound(t, { sess: ctx.newSess(), reset: false });
      const seq = a.sess.next;
      const h = frame({ op: Op.STEP, seq, session: a.sess.id, bodyLen: (1 << 20) - 24 });
      const r = await headerOnly(ctx, a.peer, h.subarray(0, 24), 1 << 20);
      if (!ctx.closes && r.kind === "timeout") {
        t.note("ZeroMQ: dropped");
        return;
      }
      t.must(r.kind === "msg" && r.bytes[7] === 1, "NO_SESSION from the header alone", () => describe(r));
      if (ctx.closes)
        t.must(await a.peer.raw.waitClosed(ctx.timeoutMs), "the connection closed", "it stayed open");
    },
  },

  // 11 garbage and fuzz.
  {
    id: "11.12",
    title:
      "60 random messages (random bytes, valid length prefix) on fresh connections: each answered by a readable frame or a close; the worker serves after",
    cite: GARBAGE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      for (let i = 0; i < 60; i++) {
        const p = await ctx.peer();
        const n = ctx.rng.int(300);
        const m = ctx.rng.bytes(n);
        if (n >= 4 && ctx.rng.int(2) === 0) m.set([0x44, 0x53, 0x50, 0x4b]);
        const r = await p.exchange(m);
        if (r.kind === "msg") {
          const hp = headerProblems(r.bytes, null);
          t.must(hp.problems.length === 0, `a readable reply to garbage #${i}`, () => hp.problems.join("; "));
          ctx.noteStatus(r.bytes[7]);
        } else t.must(r.kind === "closed", `a reply or a close for garbage #${i}`, () => describe(r));
        p.raw.close();
      }
      const q = await ctx.peer();
      const r = await q.call(t, frame({ op: Op.PING, seq: 1, session: 0 }), "PING after the garbage");
      t.must(r.h.status === 0, "OK", () => st(r.h.status));
    },
  },
  {
    id: "11.13",
    title:
      "200 frames with random header fields and a valid magic and body_len: every reply readable and echoing; nothing OK but PING/STATS",
    cite: GARBAGE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      let p = await ctx.peer();
      for (let i = 0; i < 200; i++) {
        const op = ctx.rng.int(8);
        const version = ctx.rng.int(4) === 0 ? ctx.rng.int(3) : 1;
        const status = ctx.rng.int(4) === 0 ? ctx.rng.int(256) : 0;
        const reserved = ctx.rng.int(6) === 0 ? ctx.rng.u32() : 0;
        const m = frame(
          {
            op,
            version,
            status,
            reserved,
            seq: ctx.rng.u32(),
            session: ctx.rng.int(3) === 0 ? 0 : ctx.rng.u32(),
          },
          ctx.rng.bytes(ctx.rng.int(200)),
        );
        const r = await p.exchange(m);
        if (r.kind !== "msg") {
          t.must(r.kind === "closed", `a reply or a close for frame #${i}`, () => describe(r));
          p = await ctx.peer();
          continue;
        }
        const hp = headerProblems(r.bytes, {
          op: m[6]!,
          seq: (m[8]! | (m[9]! << 8) | (m[10]! << 16) | (m[11]! << 24)) >>> 0,
          session: (m[12]! | (m[13]! << 8) | (m[14]! << 16) | (m[15]! << 24)) >>> 0,
        });
        t.must(hp.problems.length === 0, `a readable, echoing reply to frame #${i}`, () =>
          hp.problems.join("; "),
        );
        ctx.noteStatus(r.bytes[7]);
        if (r.bytes[7] === 0)
          t.must(
            (op === Op.PING || op === Op.STATS) && version === 1 && status === 0 && reserved === 0,
            `frame #${i} (op ${op}, version ${version}, status ${status}, reserved ${reserved}) refused`,
            "OK",
          );
      }
    },
  },
  {
    id: "11.14",
    title:
      "every fourth truncation of a valid HELLO (0..183 bytes, framed) → BAD_FRAME or a close; the session is untouched",
    cite: `${GARBAGE} CONTRACT 4: an unreadable header is BAD_FRAME, then close; CONTRACT 6.1: body size is BAD_FRAME.`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await withWindow(ctx, t);
      const s = ctx.rng.nonZero();
      const full = ctx.helloMsg(s, 1, ctx.helloFields(s, 1));
      for (let n = 0; n < full.length; n += 4) {
        const p = await ctx.peer();
        const r = await p.exchange(full.subarray(0, n));
        if (r.kind === "msg") t.must(r.bytes[7] === 3, `BAD_FRAME for ${n} bytes`, () => describe(r));
        else t.must(r.kind === "closed", `a reply or a close for ${n} bytes`, () => describe(r));
        p.raw.close();
      }
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 4, generation: 5 })]);
    },
  },
  {
    id: "11.15",
    title:
      "40 single-bit flips of a valid STEP on a bound connection: every reply readable, OK replies well-formed; the session still serves",
    cite: GARBAGE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      let b = await ctx.bound(t);
      for (let i = 0; i < 40; i++) {
        const e = [
          ctx.entry(b, { slot: 0, anchorPos: 2, nRows: 2, flags: 3 }),
          ctx.entry(b, { slot: 1, anchorPos: 1, nRows: 1, flags: 3 }),
        ];
        const seq = b.sess.next;
        const m = ctx.stepMsg(b, e, { seq });
        const bit = ctx.rng.int(Math.min(m.length, 24 + 16 + (b.sampled ? 16 : 0) + 64) * 8);
        m[bit >> 3]! ^= 1 << (bit & 7);
        const r = await b.peer.exchange(m);
        if (r.kind !== "msg") {
          t.must(r.kind === "closed", `a reply or a close for flip ${bit}`, () => describe(r));
          b = await ctx.bound(t);
          continue;
        }
        const hp = headerProblems(r.bytes, null);
        t.must(hp.problems.length === 0, `a readable reply for flip ${bit}`, () => hp.problems.join("; "));
        // ZeroMQ: a refused unreadable header forgets the peer (its "connection"), so bind again.
        if (r.bytes[7] !== 0 && !ctx.stream) b = await ctx.bound(t);
        if (r.bytes[7] === 0 && r.bytes[6] === Op.STEP) {
          const sr = parseStepReply(r.bytes.subarray(24));
          t.must(typeof sr !== "string", `a well-formed STEP reply for flip ${bit}`, () => String(sr));
          ctx.okFrame(
            b.sess,
            (r.bytes[8]! | (r.bytes[9]! << 8) | (r.bytes[10]! << 16) | (r.bytes[11]! << 24)) >>> 0,
            false,
          );
          await ctx.resetOk(t, b);
        }
      }
      // The last flip may have been an unreadable header (the worker closes that connection).
      b = await ctx.bound(t);
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 1, nRows: 1, flags: 3 })]);
    },
  },
  {
    id: "11.16",
    title:
      "4 KiB of random bytes with no valid prefix: the connection ends (or frames are refused), the worker serves after",
    cite: GARBAGE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const p = await ctx.peer();
      p.raw.sendRaw(ctx.rng.bytes(4096));
      const r = await p.raw.recv(ctx.timeoutMs);
      if (r.kind === "msg")
        t.must(
          r.bytes[7] !== 0 || r.bytes[6] === Op.PING || r.bytes[6] === Op.STATS,
          "no OK for garbage",
          () => describe(r),
        );
      p.raw.close();
      const q = await ctx.peer();
      const rr = await q.call(t, frame({ op: Op.PING, seq: 2, session: 0 }), "PING");
      t.must(rr.h.status === 0, "OK", () => st(rr.h.status));
    },
  },
  {
    id: "11.17",
    title:
      "50 connections opened and dropped (some mid-prefix, some mid-header): the bound session still serves",
    cite: GARBAGE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await withWindow(ctx, t);
      // CONTRACT 11 lets a worker refuse or evict unbound connections beyond its limits.
      const settled = await Promise.allSettled(Array.from({ length: 50 }, () => ctx.conn()));
      const conns = settled.flatMap((x) => (x.status === "fulfilled" ? [x.value] : []));
      if (conns.length < 50) t.note(`${50 - conns.length} of 50 connections refused (connection limits)`);
      conns.forEach((c, i) => {
        if (i % 3 === 1) c.sendRaw(Uint8Array.of(0x40, 0));
        if (i % 3 === 2) c.sendRaw(new Uint8Array([...lePrefix(64), 0x44, 0x53]));
      });
      await new Promise((r) => setTimeout(r, 20));
      for (const c of conns) c.close();
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 4, generation: 5 })]);
    },
  },
  {
    id: "11.18",
    title:
      "garbage that ends the bound connection does not end the session: a re-HELLO on a new connection keeps its windows",
    cite: `${GARBAGE} CONTRACT 6.2: a HELLO with the current session keeps the slot state.`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await withWindow(ctx, t);
      const r = await b.peer.exchange(ctx.rng.bytes(10));
      t.must(r.kind === "msg" || r.kind === "closed", "a reply or a close", () => describe(r));
      const p2 = await ctx.peer();
      const { r: hr } = await ctx.helloOk(t, p2, b.sess, {
        sampleMode: b.sampled ? 1 : 0,
        helloFlags: b.margin ? 1 : 0,
      });
      t.must(hr.windowsKept === 1, "windows_kept 1", () => String(hr.windowsKept));
    },
  },
  {
    id: "11.20",
    title:
      "an unbound connection with no whole message for unbound_idle_ms is closed; a bound one idle as long is not",
    cite: "CONTRACT 11 (1.1): an unbound connection with no whole message for unbound_idle_ms (default 10 s) is closed.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const idle = ctx.opts.unboundIdleMs;
      if (idle === undefined || idle > 15_000)
        t.info("the worker's unbound_idle_ms under 15 s (--unbound-idle-ms)", String(idle ?? "not given"));
      if (!ctx.closes)
        t.info("a stream or shm transport (a ZeroMQ peer has no connection to close)", ctx.ep.scheme);
      const b = await ctx.bound(t);
      const p = await ctx.peer();
      p.raw.sendRaw(Uint8Array.of(0x40, 0)); // half a length prefix: never a whole message
      const closed = await p.raw.waitClosed(idle! + 1500);
      t.must(closed, `the unbound connection closed within ${idle} ms (+1.5 s)`, "it stayed open");
      t.must(!b.peer.raw.isClosed, "the bound connection, as idle, stays open", "it was closed");
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 0 })]);
    },
  },
  {
    id: "11.21",
    title:
      "unbound connections beyond half of max_connections: the idle-longest are closed, a bound connection is kept and served",
    cite: "CONTRACT 11 (1.1): a worker holds max_connections (default 64), of which at most half unbound; when a new connection would pass the limit, the unbound connection idle longest is closed to make room (with none to close, the new one is refused).",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const max = ctx.opts.maxConnections;
      if (max === undefined || max > 256)
        t.info("the worker's max_connections (--max-connections, at most 256)", String(max ?? "not given"));
      if (!ctx.closes) t.info("a stream or shm transport", ctx.ep.scheme);
      const b = await ctx.bound(t);
      const half = Math.floor(max! / 2);
      const first = await ctx.conn();
      first.sendRaw(Uint8Array.of(1));
      await new Promise((r) => setTimeout(r, 30));
      const more = await Promise.allSettled(Array.from({ length: half + 2 }, () => ctx.conn()));
      const opened = more.filter((x) => x.status === "fulfilled").length;
      t.must(
        await first.waitClosed(ctx.timeoutMs),
        `the idle-longest unbound connection closed once ${half + 3} were open`,
        "it stayed open",
      );
      t.note(`${opened} of ${half + 2} later connections accepted`);
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: 0 })]);
    },
  },
  {
    id: "11.19",
    title: "ZeroMQ: multipart garbage (5 random parts) is answered or dropped; the worker serves after",
    cite: `${GARBAGE} CONTRACT 3: a multipart send is the concatenation of its parts.`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (ctx.stream) t.info("a ZeroMQ transport", ctx.ep.scheme);
      const p = await ctx.peer();
      p.raw.sendParts(Array.from({ length: 5 }, () => ctx.rng.bytes(1 + ctx.rng.int(40))));
      const r = await p.raw.recv(ctx.timeoutMs);
      if (r.kind === "msg")
        t.must(headerProblems(r.bytes, null).problems.length === 0, "a readable reply", () => describe(r));
      const q = await ctx.peer();
      const rr = await q.call(t, frame({ op: Op.PING, seq: 3, session: 0 }), "PING");
      t.must(rr.h.status === 0, "OK", () => st(rr.h.status));
    },
  },
];
