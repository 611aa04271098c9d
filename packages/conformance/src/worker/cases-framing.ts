// Over 500 lines on purpose: a table of numbered cases (one object per case, each with its cited
// sentence); splitting it would only scatter one contract section's table over files.
/** Worker cases of CONTRACT 3 (transport framing) and 4 (the header). */
import { readFileSync } from "node:fs";
import { Op } from "@tapwire/wire";
import type { Received } from "../conn.js";
import { frame, hex, lePrefix, unhex, w32 } from "../frames.js";
import type { CaseCheck, CaseDef } from "../runner.js";
import type { Peer, WorkerCtx } from "./context.js";
import { describe, st } from "./context.js";

type W = CaseDef<WorkerCtx>;

/** One case of framing-v1.json (CONTRACT 3). */
export interface FramingCase {
  /** Case name (`message_ping_request#1`, `prefix_184`, ...). */
  name: string;
  /** One message, hex. */
  message_hex?: string;
  /** Several messages on one connection, hex. */
  messages_hex?: string[];
  /** Exactly what a conforming peer writes on the socket, hex. */
  stream_hex?: string;
  /** `prefix_*` cases: a length. */
  length?: number;
  /** `prefix_*` cases: its four prefix bytes, hex. */
  prefix_hex?: string;
}

let vectors: FramingCase[] | null = null;
/** The framing vectors shipped in this package (`fixtures/framing-v1.json`, CONTRACT 3). */
export function framingVectors(): FramingCase[] {
  if (vectors === null) {
    const url = new URL("../../test/fixtures/framing-v1.json", import.meta.url);
    vectors = (JSON.parse(readFileSync(url, "utf8")) as { cases: FramingCase[] }).cases;
  }
  return vectors;
}

function vec(name: string): FramingCase {
  const v = framingVectors().find((c) => c.name === name);
  if (v === undefined) throw new Error(`framing vector ${name} missing`);
  return v;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Sends a raw stream (stream transports) or the message (ZeroMQ). */
function sendVector(ctx: WorkerCtx, p: Peer, v: FramingCase): void {
  if (ctx.stream) p.raw.sendRaw(unhex(v.stream_hex!));
  else p.raw.send(unhex(v.message_hex!));
}

/** After an unreadable header: BAD_FRAME echoing what is present, then the connection closes (CONTRACT 4). */
async function unreadable(
  ctx: WorkerCtx,
  t: CaseCheck,
  msg: Uint8Array,
  echo: { op: number; seq: number; session: number },
): Promise<void> {
  const p = await ctx.peer();
  const r = await p.call(t, msg, `a ${msg.length}-byte message`, echo);
  t.must(r.h.status === 3, "BAD_FRAME", () => st(r.h.status));
  if (ctx.closes) {
    const closed = await p.raw.waitClosed(ctx.timeoutMs);
    t.must(
      closed,
      "the worker closes the connection after an unreadable header",
      "the connection stayed open",
    );
  } else t.note("ZeroMQ has no connection to close");
}

function headerCase(
  id: string,
  title: string,
  build: (ctx: WorkerCtx) => Uint8Array,
  status: number,
  echo: "all" | "partial" = "all",
  closes = false,
): W {
  return {
    id,
    title,
    cite:
      status === 4
        ? "CONTRACT 4: a receiver refuses a frame whose version is wrong (BAD_VERSION); a reply echoes op, seq and session."
        : closes
          ? "CONTRACT 4: when the header cannot be read (fewer than 24 bytes, wrong magic, body_len not matching) the worker answers BAD_FRAME echoing each of op, seq, session whose bytes are wholly present, and closes the connection."
          : status === 7
            ? "CONTRACT 4-5: op is 1..5; an unknown op is UNKNOWN_OP, echoing op, seq and session."
            : "CONTRACT 4: a receiver refuses a frame whose magic, version, reserved field or length is wrong (BAD_FRAME); a request whose status byte is not 0 is BAD_FRAME.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const msg = build(ctx);
      if (closes) {
        const n = msg.length;
        const e = {
          op: echo === "all" || n >= 7 ? (msg[6] ?? 0) : 0,
          seq: n >= 12 ? (msg[8]! | (msg[9]! << 8) | (msg[10]! << 16) | (msg[11]! << 24)) >>> 0 : 0,
          session: n >= 16 ? (msg[12]! | (msg[13]! << 8) | (msg[14]! << 16) | (msg[15]! << 24)) >>> 0 : 0,
        };
        if (n < 7) e.op = 0;
        await unreadable(ctx, t, msg, e);
        return;
      }
      const p = await ctx.peer();
      const r = await p.call(t, msg, title);
      t.must(r.h.status === status, st(status), () => st(r.h.status));
    },
  };
}

const rnd = (ctx: WorkerCtx) => ({ seq: ctx.rng.u32(), session: ctx.rng.u32() });

export const framingCases: W[] = [
  {
    id: "3.1.1",
    title:
      "framing vector message_ping_request#1 is answered with exactly the stream bytes of message_ping_reply#1",
    cite: "CONTRACT 3: framing-v1.json gives the exact stream bytes of several messages; both ends of every stream transport MUST produce and accept exactly those bytes.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const p = await ctx.peer();
      sendVector(ctx, p, vec("message_ping_request#1"));
      const r = await p.raw.recv(ctx.timeoutMs);
      t.must(r.kind === "msg", "the PING reply", () => describe(r));
      const want = vec("message_ping_reply#1");
      const got = ctx.stream ? hex(r.prefix!) + hex(r.bytes) : hex(r.bytes);
      const exp = ctx.stream ? want.stream_hex! : want.message_hex!;
      t.must(got === exp, `exactly ${exp.slice(0, 40)}…`, () => `${got.slice(0, 80)}…`);
    },
  },
  ...["message_hello_request#1", "message_step_request_greedy#1", "message_step_request_top32#1"].map(
    (name, i): W => ({
      id: `3.1.${2 + i}`,
      title: `framing vector ${name} is read as one message (a reply echoing its header arrives${name.includes("step") ? ": NO_SESSION, the connection never said HELLO" : ""})`,
      cite: "CONTRACT 3: each message = u32 length (little-endian) + length bytes; both ends MUST accept exactly the vector's bytes.",
      async run(ctx: WorkerCtx, t: CaseCheck) {
        const p = await ctx.peer();
        const v = vec(name);
        sendVector(ctx, p, v);
        const m = unhex(v.message_hex!);
        const r = await p.next(t, name, {
          op: m[6]!,
          seq: (m[8]! | (m[9]! << 8) | (m[10]! << 16) | (m[11]! << 24)) >>> 0,
          session: (m[12]! | (m[13]! << 8) | (m[14]! << 16) | (m[15]! << 24)) >>> 0,
        });
        if (name.includes("step"))
          t.must(r.h.status === 1, "NO_SESSION (CONTRACT 6.2: STEP on a connection that is not bound)", () =>
            st(r.h.status),
          );
        else {
          t.must(
            r.h.status !== 3 && r.h.status !== 9,
            "the HELLO read whole (any HELLO check may refuse it, not the framing)",
            () => st(r.h.status),
          );
          if (r.h.status === 0) ctx.current = r.h.session;
        }
      },
    }),
  ),
  {
    id: "3.1.5",
    title: "framing vector two_messages_in_one_stream: both messages read, answered in order",
    cite: "CONTRACT 3: one request message and then one response message, in order, per connection (a client sends one at a time; a worker given two back to back reads both).",
    level: "INFO",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const p = await ctx.peer();
      const v = vec("two_messages_in_one_stream");
      if (ctx.stream) p.raw.sendRaw(unhex(v.stream_hex!));
      else for (const m of v.messages_hex!) p.raw.send(unhex(m));
      const a = await p.raw.recv(ctx.timeoutMs);
      t.expect(a.kind === "msg" && a.bytes[6] === Op.PING, "the PING's reply first", () => describe(a));
      const b = await p.raw.recv(ctx.timeoutMs);
      t.expect(b.kind === "msg" && b.bytes[6] === Op.HELLO, "then the HELLO's reply", () => describe(b));
      if (b.kind === "msg" && b.bytes[7] === 0)
        ctx.current =
          (b.bytes[12]! | (b.bytes[13]! << 8) | (b.bytes[14]! << 16) | (b.bytes[15]! << 24)) >>> 0;
    },
  },
  {
    id: "3.1.6",
    title: "framing vector empty_message (00 00 00 00) is a message: BAD_FRAME echoing zeros, then closed",
    cite: "CONTRACT 3-4: a message of length 0 has no header: BAD_FRAME echoing nothing (zeros), then the worker closes the connection.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const p = await ctx.peer();
      if (ctx.stream) p.raw.sendRaw(unhex(vec("empty_message").stream_hex!));
      else p.raw.send(new Uint8Array(0));
      const r = await p.next(t, "an empty message", { op: 0, seq: 0, session: 0 });
      t.must(r.h.status === 3, "BAD_FRAME", () => st(r.h.status));
      if (ctx.closes)
        t.must(await p.raw.waitClosed(ctx.timeoutMs), "the connection closed", "it stayed open");
    },
  },
  {
    id: "3.1.7",
    title: "every reply's length prefix is a little-endian u32 (HelloReply: 98 00 00 00)",
    cite: "CONTRACT 3: the length prefix is little-endian like every integer of this contract (2).",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      // shm+unix: requests travel in doorbells, replies with the unix prefix (docs/transport.md "shm").
      if (!ctx.closes)
        t.info("a length prefix (stream transports)", `${ctx.ep.scheme}: one ZeroMQ message = one message`);
      const b = await ctx.bound(t, { reset: false });
      const seq = b.sess.next;
      const m = ctx.helloMsg(
        b.sess.id,
        seq,
        ctx.helloFields(b.sess.id, seq, { sampleMode: b.sampled ? 1 : 0, helloFlags: b.margin ? 1 : 0 }),
      );
      const r = await b.peer.call(t, m, "HELLO");
      ctx.okFrame(b.sess, seq, false);
      t.must(
        hex(r.prefix!) === hex(lePrefix(r.bytes.length)),
        `prefix ${hex(lePrefix(r.bytes.length))}`,
        () => hex(r.prefix!),
      );
      t.must(hex(r.prefix!) === "98000000", "98000000 (152 bytes, CONTRACT 6.1)", () => hex(r.prefix!));
    },
  },
  {
    id: "3.1.8",
    title:
      "a HELLO with a big-endian length prefix (00 00 00 b8) is refused: never answered OK, the connection closed",
    cite: "CONTRACT 3: a receiver MUST refuse a length above its configured maximum before allocating or buffering it, and close that connection (00 00 00 b8 is 3 GiB little-endian).",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (!ctx.stream) t.info("a length prefix (stream transports)", `${ctx.ep.scheme} has none`);
      const p = await ctx.peer();
      const m = ctx.helloMsg(ctx.main.id, ctx.main.next, ctx.helloFields(ctx.main.id, ctx.main.next));
      p.raw.sendRaw(Uint8Array.of(0, 0, 0, m.length));
      p.raw.sendRaw(m);
      const r = await p.raw.recv(ctx.timeoutMs);
      if (r.kind === "msg") {
        t.must(r.bytes[7] !== 0, "no OK reply", () => describe(r));
        const closed = await p.raw.waitClosed(ctx.timeoutMs);
        t.must(closed, "the connection closed after the refusal", "it stayed open");
        return;
      }
      t.must(r.kind === "closed", "the connection closed", () => describe(r));
    },
  },
  ...[
    ["3.1.9", "01000004", "framing vector prefix_over_64MiB_refused (01 00 00 04 = 64 MiB + 1)"],
    ["3.1.10", "ffffffff", "a prefix of 2^32 - 1"],
    ["3.1.11", "00000080", "a prefix of 2 GiB"],
  ].map(
    ([id, pre, what]): W => ({
      id: id!,
      title: `${what} followed by an unreadable header: refused before buffering, the connection closed`,
      cite: "CONTRACT 3: a receiver MUST refuse a length above its configured maximum (default 64 MiB) before allocating or buffering it, and close that connection.",
      async run(ctx: WorkerCtx, t: CaseCheck) {
        if (!ctx.stream) t.info("a length prefix (stream transports)", `${ctx.ep.scheme} has none`);
        const p = await ctx.peer();
        p.raw.sendRaw(unhex(pre!));
        p.raw.sendRaw(new Uint8Array(24));
        const r = await p.raw.recv(ctx.timeoutMs);
        if (r.kind === "msg") {
          t.must(r.bytes[7] !== 0, "no OK reply", () => describe(r));
          t.must(await p.raw.waitClosed(ctx.timeoutMs), "the connection closed", "it stayed open");
          return;
        }
        t.must(r.kind === "closed", "the connection closed", () => describe(r));
      },
    }),
  ),
  {
    id: "3.1.12",
    title: "a HELLO written one byte per write is read whole (OK)",
    cite: "CONTRACT 3: a stream carries messages, not writes: the reader assembles a message from any split.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (!ctx.stream) t.info("split writes (stream transports)", `${ctx.ep.scheme}`);
      const p = await ctx.peer();
      const seq = (ctx.main.hi + 3) >>> 0;
      if (ctx.main.id !== ctx.current) await ctx.leaseOut();
      const m = ctx.helloMsg(ctx.main.id, seq, ctx.helloFields(ctx.main.id, seq));
      const all = new Uint8Array([...lePrefix(m.length), ...m]);
      for (let i = 0; i < all.length; i++) {
        p.raw.sendRaw(all.subarray(i, i + 1));
        if (i % 16 === 0) await sleep(1);
      }
      const r = await p.next(t, "HELLO", { op: 1, seq, session: ctx.main.id });
      t.must(r.h.status === 0, "OK", () => st(r.h.status));
      ctx.okFrame(ctx.main, seq, ctx.main.id !== ctx.current);
    },
  },
  {
    id: "3.1.13",
    title: "HELLOs split at offsets 1, 2, 3, 4, 5, 23, 24, 25, 100 and 187 of the stream are each read whole",
    cite: "CONTRACT 3: each message = u32 length + length bytes; a receiver accepts it however the bytes are split.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (!ctx.stream) t.info("split writes (stream transports)", `${ctx.ep.scheme}`);
      const b = await ctx.bound(t, { reset: false });
      for (const cut of [1, 2, 3, 4, 5, 23, 24, 25, 100, 187]) {
        const seq = b.sess.next;
        const m = ctx.helloMsg(
          b.sess.id,
          seq,
          ctx.helloFields(b.sess.id, seq, { sampleMode: b.sampled ? 1 : 0, helloFlags: b.margin ? 1 : 0 }),
        );
        const all = new Uint8Array([...lePrefix(m.length), ...m]);
        b.peer.raw.sendRaw(all.subarray(0, cut));
        await sleep(2);
        b.peer.raw.sendRaw(all.subarray(cut));
        const r = await b.peer.next(t, `HELLO split at ${cut}`, { op: 1, seq, session: b.sess.id });
        t.must(r.h.status === 0, `OK for the split at ${cut}`, () => st(r.h.status));
        ctx.okFrame(b.sess, seq, false);
      }
    },
  },
  {
    id: "3.1.14",
    title: "a STEP of more than 4 KiB written in three parts with pauses is read whole (oracle-checked)",
    cite: "CONTRACT 3: a message is u32 length + length bytes, whatever the segmentation.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      const n = Math.min(b.maxRowsPerStep, Math.max(ctx.g.window, Math.ceil(5000 / ctx.g.rowBytes)));
      const e = ctx.entry(b, { slot: 0, anchorPos: n, nRows: n, flags: 3 });
      const seq = b.sess.next;
      const msg = ctx.stepMsg(b, [e], { seq });
      if (ctx.stream) {
        const all = new Uint8Array([...lePrefix(msg.length), ...msg]);
        const a = Math.floor(all.length / 3);
        b.peer.raw.sendRaw(all.subarray(0, 3));
        await sleep(5);
        b.peer.raw.sendRaw(all.subarray(3, a));
        await sleep(5);
        b.peer.raw.sendRaw(all.subarray(a));
      } else {
        b.peer.raw.sendParts([msg.subarray(0, 24), msg.subarray(24, 100), msg.subarray(100)]);
      }
      const r = await b.peer.next(t, "STEP", { op: 2, seq, session: b.sess.id });
      t.must(r.h.status === 0, "OK", () => st(r.h.status));
      ctx.okFrame(b.sess, seq, false);
      const [x] = b.sess.oracle.apply([e]);
      const wr = r.body[20]! | (r.body[21]! << 8);
      t.must(r.body[16] === x!.status, `entry status ${x!.status}`, () => String(r.body[16]));
      t.must(wr === x!.windowRows, `window_rows ${x!.windowRows}`, () => String(wr));
    },
  },
  {
    id: "3.1.15",
    title: "a length prefix split 2 + 2 bytes, then the body: PING read whole",
    cite: "CONTRACT 3: the u32 length may arrive in pieces.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (!ctx.stream) t.info("split writes (stream transports)", `${ctx.ep.scheme}`);
      const p = await ctx.peer();
      const { seq, session } = rnd(ctx);
      const m = frame({ op: Op.PING, seq, session }, Uint8Array.of(1, 2, 3));
      const pre = lePrefix(m.length);
      p.raw.sendRaw(pre.subarray(0, 2));
      await sleep(5);
      p.raw.sendRaw(pre.subarray(2));
      await sleep(5);
      p.raw.sendRaw(m);
      const r = await p.next(t, "PING", { op: 3, seq, session });
      t.must(
        r.h.status === 0 && hex(r.body) === "010203",
        "OK echoing 010203",
        () => `${st(r.h.status)} ${hex(r.body)}`,
      );
    },
  },
  {
    id: "3.1.16",
    title:
      "a connection dropped in the middle of a message does not stop the worker (a new connection is served)",
    cite: "CONTRACT 11: garbage on a connection never crashes a worker; it ends that connection.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const p = await ctx.peer();
      const m = frame({ op: Op.PING, seq: 1, session: 0 }, new Uint8Array(100));
      if (ctx.stream) p.raw.sendRaw(new Uint8Array([...lePrefix(m.length), ...m.subarray(0, 30)]));
      else p.raw.send(m.subarray(0, 30));
      await sleep(20);
      p.raw.close();
      const q = await ctx.peer();
      const r = await q.call(t, frame({ op: Op.PING, seq: 2, session: 0 }), "PING");
      t.must(r.h.status === 0, "OK", () => st(r.h.status));
    },
  },
  {
    id: "3.1.17",
    title: "ZeroMQ: a HELLO sent as three parts is the concatenation of its parts (OK)",
    cite: "CONTRACT 3: one ZeroMQ message = one message; a multipart send is the concatenation of its parts.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      if (ctx.stream) t.info("a ZeroMQ transport", `${ctx.ep.scheme}`);
      const p = await ctx.peer();
      if (ctx.main.id !== ctx.current) await ctx.leaseOut();
      const seq = (ctx.main.hi + 5) >>> 0;
      const m = ctx.helloMsg(ctx.main.id, seq, ctx.helloFields(ctx.main.id, seq));
      p.raw.sendParts([m.subarray(0, 10), m.subarray(10, 24), m.subarray(24)]);
      const r = await p.next(t, "HELLO", { op: 1, seq, session: ctx.main.id });
      t.must(r.h.status === 0, "OK", () => st(r.h.status));
      ctx.okFrame(ctx.main, seq, ctx.main.id !== ctx.current);
    },
  },
  {
    id: "3.1.18",
    title: "twenty PINGs in turn on one connection: each reply answers its own request, in order",
    cite: "CONTRACT 3: one request message and then one response message, in order, per client connection.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const p = await ctx.peer();
      for (let i = 0; i < 20; i++) {
        const seq = ctx.rng.u32();
        const r = await p.call(t, frame({ op: Op.PING, seq, session: 0 }, Uint8Array.of(i)), `PING ${i}`);
        t.must(
          r.h.status === 0 && r.body[0] === i,
          `PING ${i} echoed`,
          () => `${st(r.h.status)} body ${hex(r.body)}`,
        );
      }
    },
  },
  {
    id: "3.1.19",
    title: "a STEP at the session's max_rows_per_step (the largest message of the session) is accepted",
    cite: "CONTRACT 3, 11: a receiver accepts any length up to its maximum; the session's limits come from its HELLO.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t, {
        maxSlots: 4,
        maxRowsPerStep: Math.min(ctx.g.maxRowsPerStep, Math.max(ctx.g.window * 8, 64)),
      });
      const n = b.maxRowsPerStep;
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 1, anchorPos: n + 3, nRows: n, flags: 3 })]);
    },
  },
];

function hdrMsg(
  ctx: WorkerCtx,
  h: Partial<Parameters<typeof frame>[0]>,
  body = new Uint8Array(0),
): Uint8Array {
  const { seq, session } = rnd(ctx);
  return frame({ op: Op.PING, seq, session, ...h }, body);
}

function truncated(ctx: WorkerCtx, n: number): Uint8Array {
  const m = hdrMsg(ctx, { op: Op.STATS });
  return m.subarray(0, n);
}

export const headerCases: W[] = [
  headerCase(
    "4.1.1",
    "wrong magic (DSPX) → BAD_FRAME echoing op, seq, session, then closed",
    (c) => hdrMsg(c, { magic: 0x58505344 }),
    3,
    "all",
    true,
  ),
  headerCase(
    "4.1.2",
    "magic byte-swapped (KPSD) → BAD_FRAME, then closed",
    (c) => hdrMsg(c, { magic: 0x4453504b }),
    3,
    "all",
    true,
  ),
  headerCase(
    "4.1.3",
    "magic all zero → BAD_FRAME, then closed",
    (c) => hdrMsg(c, { magic: 0 }),
    3,
    "all",
    true,
  ),
  headerCase(
    "4.1.4",
    "version 2 → BAD_VERSION echoing op, seq, session",
    (c) => hdrMsg(c, { version: 2 }),
    4,
  ),
  headerCase("4.1.5", "version 0 → BAD_VERSION", (c) => hdrMsg(c, { version: 0 }), 4),
  headerCase(
    "4.1.6",
    "version 0x0100 (1 written big-endian) → BAD_VERSION",
    (c) => hdrMsg(c, { version: 0x100 }),
    4,
  ),
  headerCase("4.1.7", "version 0xffff → BAD_VERSION", (c) => hdrMsg(c, { version: 0xffff }), 4),
  headerCase(
    "4.1.8",
    "reserved = 1 → BAD_FRAME echoing op, seq, session",
    (c) => hdrMsg(c, { reserved: 1 }),
    3,
  ),
  headerCase("4.1.9", "reserved = 0x80000000 → BAD_FRAME", (c) => hdrMsg(c, { reserved: 0x80000000 }), 3),
  headerCase(
    "4.1.10",
    "body_len one more than the message holds → BAD_FRAME, then closed",
    (c) => hdrMsg(c, { bodyLen: 5 }, new Uint8Array(4)),
    3,
    "all",
    true,
  ),
  headerCase(
    "4.1.11",
    "body_len one less than the message holds → BAD_FRAME, then closed",
    (c) => hdrMsg(c, { bodyLen: 3 }, new Uint8Array(4)),
    3,
    "all",
    true,
  ),
  headerCase(
    "4.1.12",
    "body_len 0xffffffff → BAD_FRAME, then closed",
    (c) => hdrMsg(c, { bodyLen: 0xffffffff }, new Uint8Array(4)),
    3,
    "all",
    true,
  ),
  headerCase(
    "4.1.13",
    "a 23-byte message → BAD_FRAME echoing op, seq and session (all wholly present), then closed",
    (c) => truncated(c, 23),
    3,
    "partial",
    true,
  ),
  headerCase(
    "4.1.14",
    "a 15-byte message → BAD_FRAME echoing op and seq, session 0, then closed",
    (c) => truncated(c, 15),
    3,
    "partial",
    true,
  ),
  headerCase(
    "4.1.15",
    "an 11-byte message → BAD_FRAME echoing op, seq 0, session 0, then closed",
    (c) => truncated(c, 11),
    3,
    "partial",
    true,
  ),
  headerCase(
    "4.1.16",
    "a 7-byte message → BAD_FRAME echoing op only, then closed",
    (c) => truncated(c, 7),
    3,
    "partial",
    true,
  ),
  headerCase(
    "4.1.17",
    "a 6-byte message → BAD_FRAME echoing zeros, then closed",
    (c) => truncated(c, 6),
    3,
    "partial",
    true,
  ),
  headerCase("4.1.18", "a PING request with status 1 → BAD_FRAME", (c) => hdrMsg(c, { status: 1 }), 3),
  headerCase(
    "4.1.19",
    "a STATS request with status 0xff → BAD_FRAME",
    (c) => hdrMsg(c, { op: Op.STATS, status: 0xff }),
    3,
  ),
  headerCase(
    "4.1.20",
    "a HELLO with status 3 → BAD_FRAME",
    (c) => {
      const seq = c.main.next;
      return c.helloMsg(c.main.id, seq, c.helloFields(c.main.id, seq), { status: 3 });
    },
    3,
  ),
  headerCase("4.1.21", "op 0 → UNKNOWN_OP echoing op, seq, session", (c) => hdrMsg(c, { op: 0 }), 7),
  headerCase("4.1.22", "op 6 → UNKNOWN_OP", (c) => hdrMsg(c, { op: 6 }), 7),
  headerCase("4.1.23", "op 255 → UNKNOWN_OP", (c) => hdrMsg(c, { op: 255 }), 7),
  {
    id: "4.1.24",
    title: "a reply echoes seq 0xffffffff and session 0xdeadbeef of a PING",
    cite: "CONTRACT 4: a reply echoes op, seq and session of its request.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const p = await ctx.peer();
      const r = await p.call(t, frame({ op: Op.PING, seq: 0xffffffff, session: 0xdeadbeef }), "PING");
      t.must(r.h.status === 0, "OK", () => st(r.h.status));
    },
  },
  {
    id: "4.1.25",
    title: "a STEP with status byte 1 on a bound connection → BAD_FRAME, its seq not consumed",
    cite: "CONTRACT 4: a request whose status byte is not 0 is BAD_FRAME; CONTRACT 5: a non-OK answer changed no state.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      const e = [ctx.entry(b, { slot: 0, anchorPos: 2, nRows: 2, flags: 3 })];
      const m = ctx.stepMsg(b, e);
      m[7] = 1;
      await ctx.refused(t, b.peer, m, 3, "STEP with status 1");
      await ctx.stepOk(t, b, e);
    },
  },
  {
    id: "4.1.26",
    title: "after unreadable headers on other connections the worker still serves a bound connection",
    cite: "CONTRACT 11: garbage on a connection ends that connection with a status, and is counted; it never crashes a worker.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      for (let i = 0; i < 5; i++) {
        const p = await ctx.peer();
        const g = ctx.rng.bytes(30);
        const r: Received = await p.exchange(g);
        t.must(r.kind === "msg" || r.kind === "closed", "a reply or a close", () => describe(r));
      }
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 2, anchorPos: 1, nRows: 1, flags: 3 })]);
    },
  },
];

/** Sets a u32 in place (case builders). */
export function patch32(m: Uint8Array, off: number, v: number): Uint8Array {
  w32(m, off, v);
  return m;
}
