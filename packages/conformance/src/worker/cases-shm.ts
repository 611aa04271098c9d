/**
 * Worker cases of the `shm+unix://` transport (issue 23), built from the tables of
 * docs/transport.md "shm: requests through shared memory on one host" alone: the ATTACH and its
 * refusals, every doorbell rule that closes a connection, the unbound limits on a doorbell's
 * `total`, the inline fallback, and no session file left behind. On other schemes every case
 * is INFORMATIONAL.
 */
import { existsSync, readdirSync, symlinkSync, unlinkSync } from "node:fs";
import { join } from "node:path";
import { Op } from "@tapwire/wire";
import type { RawConn, Received } from "../conn.js";
import { connectStream } from "../conn.js";
import { frame, u32 } from "../frames.js";
import type { CaseCheck, CaseDef } from "../runner.js";
import type { Region } from "../shm.js";
import {
  attachMsg,
  bellMsg,
  connectShm,
  DEFAULT_SHM_DIR,
  SessionFile,
  ShmAttachStatus,
  type ShmConn,
} from "../shm.js";
import type { WorkerCtx } from "./context.js";
import { describe, st } from "./context.js";

type W = CaseDef<WorkerCtx>;

const DOC = 'CONTRACT 3 over shm+unix (docs/transport.md "shm"):';
const ATTACH_CITE = `${DOC} the server opens the named file read-only (O_NOFOLLOW; a regular file of exactly the announced size, owned by the server's user, no group/other bits; the name must match tapwire-<digits>-<16 hex>, looked up in shmDir only), maps it and answers OK; otherwise REFUSED (1), and the client falls back to inline BELLs.`;
const CLOSE_CITE = `${DOC} the server checks, and closes the connection with a TRANSPORT_PROTOCOL error, on: an unknown kind; a BELL shorter than its regions; a region that is empty, reaches past the mapping (u32 offsets, no wrap) or overlaps another region of the same BELL; regions before an ATTACH, or a second ATTACH; a seq other than the previous one plus 1 (replays and skips); total not the sum.`;

const dirOf = (ctx: WorkerCtx) => ctx.opts.shmDir ?? DEFAULT_SHM_DIR;
const mapBytes = (ctx: WorkerCtx) => 2 * (ctx.opts.shmBytes ?? 1 << 20);

function onlyShm(ctx: WorkerCtx, t: CaseCheck): void {
  if (!ctx.shm) t.info("a shm+unix:// endpoint (docs/transport.md shm)", ctx.ep.scheme);
}

/** A ShmConn with ATTACH done and answered OK. */
async function attached(ctx: WorkerCtx, t: CaseCheck): Promise<ShmConn> {
  const c = ctx.adopt(await connectShm(ctx.ep, ctx.timeoutMs * 2, ctx.shmOptions));
  t.must(c.attached, "the ATTACH of a well-formed session file answered OK (0)", () =>
    c.attachStatus === null ? "no ATTACH answer" : `status ${c.attachStatus}`,
  );
  return c;
}

/** The unix socket alone (nothing sent yet). */
async function bare(ctx: WorkerCtx): Promise<RawConn> {
  return ctx.adopt(await connectStream(ctx.ep.path, ctx.timeoutMs * 2));
}

/** A session file of the tester, closed (and unlinked) after the case. */
function file(ctx: WorkerCtx, bytes = mapBytes(ctx), name?: string, mode?: number): SessionFile {
  const f = new SessionFile(dirOf(ctx), bytes, name, mode);
  ctx.adopt({ close: () => f.close() } as unknown as RawConn);
  return f;
}

const ping = (seq: number, body = 8) =>
  frame({ op: Op.PING, seq, session: 0 }, new Uint8Array(body).fill(0x5a));

/** Requires an OK PING reply echoing `seq`. */
function pingOk(t: CaseCheck, r: Received, seq: number, what: string): void {
  t.must(r.kind === "msg" && r.bytes.length >= 24, `a PING reply to ${what}`, () => describe(r));
  t.must(r.bytes[7] === 0 && u32(r.bytes, 8) === seq, `OK echoing seq ${seq} (${what})`, () => describe(r));
}

/** The worker still serves: a fresh attached connection's PING through the mapping is answered OK. */
async function stillServes(ctx: WorkerCtx, t: CaseCheck): Promise<void> {
  const c = await attached(ctx, t);
  c.send(ping(77));
  pingOk(t, await c.recv(ctx.timeoutMs), 77, "a PING on a fresh connection after the close");
}

/** Requires the connection closed without an answer, then that a fresh connection is served. */
async function closedNoAnswer(ctx: WorkerCtx, t: CaseCheck, c: RawConn, what: string): Promise<void> {
  const r = await c.recv(ctx.timeoutMs);
  t.must(r.kind === "closed", `the connection closed without an answer after ${what}`, () =>
    r.kind === "msg" ? `an answer: ${describe(r)}` : describe(r),
  );
  await stillServes(ctx, t);
}

/** Sends ATTACH `msg` on a bare socket and returns the answer. */
async function attachRaw(ctx: WorkerCtx, msg: Uint8Array): Promise<{ c: RawConn; r: Received }> {
  const c = await bare(ctx);
  c.send(msg);
  return { c, r: await c.recv(ctx.timeoutMs) };
}

/** An ATTACH that must be answered REFUSED (1), leaving the connection usable with inline BELLs. */
async function refused(ctx: WorkerCtx, t: CaseCheck, msg: Uint8Array, what: string): Promise<void> {
  const { c, r } = await attachRaw(ctx, msg);
  t.must(r.kind === "msg" && r.bytes.length === 4, `a 4-byte ATTACH answer to ${what}`, () => describe(r));
  t.must(
    u32(r.bytes, 0) === ShmAttachStatus.REFUSED,
    `REFUSED (1) for ${what}`,
    () => `status ${u32(r.bytes, 0)}`,
  );
  // The fallback: the connection stays and carries requests inline.
  c.send(bellMsg(1, [], ping(5)));
  pingOk(t, await c.recv(ctx.timeoutMs), 5, `an inline BELL after the refused ATTACH (${what})`);
}

/** A bound-free attached connection, then `bell` (raw doorbell bytes), which must close it. */
async function badBell(
  ctx: WorkerCtx,
  t: CaseCheck,
  what: string,
  bell: (c: ShmConn) => Uint8Array,
  before?: (c: ShmConn) => Promise<void>,
): Promise<void> {
  onlyShm(ctx, t);
  const c = await attached(ctx, t);
  if (before !== undefined) await before(c);
  c.sendBell(bell(c));
  await closedNoAnswer(ctx, t, c, what);
}

/** Writes a PING of `seq` at `offset` and returns its region. */
function put(c: ShmConn, offset: number, seq: number): Region {
  const m = ping(seq);
  c.file!.write(offset, m);
  return { offset, length: m.length };
}

export const shmCases: W[] = [
  {
    id: "3.shm.1",
    title:
      "ATTACH of a well-formed session file → OK; a PING placed in the mapping (one region) is answered; the file is unlinked",
    cite: `${ATTACH_CITE} The client then unlinks the file: from then on only the two mappings hold it.`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      onlyShm(ctx, t);
      const c = await attached(ctx, t);
      t.must(!existsSync(c.file!.path), `${c.file!.path} unlinked after the ATTACH`, "it is still there");
      c.sendBell(bellMsg(1, [put(c, 4096, 9)], new Uint8Array(0)));
      pingOk(t, await c.recv(ctx.timeoutMs), 9, "a one-region BELL");
    },
  },
  {
    id: "3.shm.2",
    title: "a HELLO as inline head + 3 regions in reverse offset order is their concatenation (OK)",
    cite: `${DOC} a BELL's request is its inline bytes followed by its regions of the mapping, in order; total is their sum.`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      onlyShm(ctx, t);
      const c = await attached(ctx, t);
      if (ctx.main.id !== ctx.current) await ctx.leaseOut();
      const seq = (ctx.main.hi + 5) >>> 0;
      const m = ctx.helloMsg(ctx.main.id, seq, ctx.helloFields(ctx.main.id, seq));
      const cuts = [10, 24, 100, m.length];
      const offs = [3 * 8192, 2 * 8192 + 1, 8192 + 3];
      const regions: Region[] = [];
      for (let i = 0; i < 3; i++) {
        c.file!.write(offs[i]!, m.subarray(cuts[i]!, cuts[i + 1]!));
        regions.push({ offset: offs[i]!, length: cuts[i + 1]! - cuts[i]! });
      }
      c.sendBell(bellMsg(1, regions, m.subarray(0, 10)));
      const r = await c.recv(ctx.timeoutMs);
      t.must(r.kind === "msg" && r.bytes[7] === 0 && u32(r.bytes, 8) === seq, "HELLO answered OK", () =>
        describe(r),
      );
      ctx.okFrame(ctx.main, seq, ctx.main.id !== ctx.current);
    },
  },
  {
    id: "3.shm.3",
    title:
      "the mapping is read at each BELL: the same offset rewritten between two BELLs gives the second request",
    cite: `${DOC} the regions a BELL names belong to the server from the BELL until its reply; a caller writes the stage area between a reply and the next request.`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      onlyShm(ctx, t);
      const c = await attached(ctx, t);
      c.sendBell(bellMsg(1, [put(c, 0, 101)], new Uint8Array(0)));
      pingOk(t, await c.recv(ctx.timeoutMs), 101, "the first BELL");
      c.sendBell(bellMsg(2, [put(c, 0, 202)], new Uint8Array(0)));
      pingOk(t, await c.recv(ctx.timeoutMs), 202, "the second BELL over the same offset");
    },
  },
  {
    id: "3.shm.4",
    title: "ATTACH with version 2 → closed without an answer; the worker serves a fresh connection",
    cite: `${DOC} ATTACH carries version=1 (the server closes the connection on another version: docs/contract-notes.md issue 23).`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      onlyShm(ctx, t);
      const f = file(ctx);
      const { r } = await attachRaw(ctx, attachMsg(f.name, f.bytes, 2));
      t.must(r.kind === "closed", "closed without an answer for version 2", () => describe(r));
      await stillServes(ctx, t);
    },
  },
  {
    id: "3.shm.5",
    title:
      "ATTACH of a mapping size that is not a page multiple, or below 2 x 64 KiB → closed; a fresh connection is served",
    cite: `${DOC} mapping bytes: 2 x shmBytes, a page multiple (shmBytes from 64 KiB: docs/contract-notes.md issue 23).`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      onlyShm(ctx, t);
      for (const bytes of [mapBytes(ctx) + 100, 64 * 1024]) {
        const f = file(ctx, bytes);
        const { c, r } = await attachRaw(ctx, attachMsg(f.name, bytes));
        t.must(r.kind === "closed", `closed without an answer for a ${bytes}-byte mapping`, () =>
          describe(r),
        );
        c.close();
      }
      await stillServes(ctx, t);
    },
  },
  {
    id: "3.shm.6",
    title: "ATTACH announcing a size other than the file's → REFUSED; inline BELLs still served",
    cite: ATTACH_CITE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      onlyShm(ctx, t);
      const f = file(ctx);
      await refused(ctx, t, attachMsg(f.name, 2 * f.bytes), "a size twice the file's");
    },
  },
  {
    id: "3.shm.7",
    title: "ATTACH naming a file that does not exist → REFUSED",
    cite: ATTACH_CITE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      onlyShm(ctx, t);
      await refused(
        ctx,
        t,
        attachMsg(`tapwire-${process.pid}-0000000000000000`, mapBytes(ctx)),
        "a missing file",
      );
    },
  },
  {
    id: "3.shm.8",
    title: "ATTACH of names outside tapwire-<digits>-<16 hex> (an existing file, a path) → REFUSED",
    cite: ATTACH_CITE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      onlyShm(ctx, t);
      const f = file(ctx, mapBytes(ctx), `tapwire-${process.pid}-${"ab".repeat(7)}X`);
      await refused(ctx, t, attachMsg(f.name, f.bytes), `the existing file ${f.name}`);
      const g = file(ctx);
      await refused(
        ctx,
        t,
        attachMsg(`../${dirOf(ctx).split("/").pop()}/${g.name}`, g.bytes),
        "a relative path",
      );
      await refused(ctx, t, attachMsg(g.path, g.bytes), "an absolute path");
    },
  },
  {
    id: "3.shm.9",
    title: "ATTACH of a file with group/other bits (0644), or of a symlink to a good file → REFUSED",
    cite: ATTACH_CITE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      onlyShm(ctx, t);
      const f = file(ctx, mapBytes(ctx), undefined, 0o644);
      await refused(ctx, t, attachMsg(f.name, f.bytes), "a 0644 file");
      const g = file(ctx);
      const link = `tapwire-${process.pid}-${"cd".repeat(8)}`;
      symlinkSync(g.path, join(dirOf(ctx), link));
      try {
        await refused(ctx, t, attachMsg(link, g.bytes), "a symlink (O_NOFOLLOW)");
      } finally {
        unlinkSync(join(dirOf(ctx), link));
      }
    },
  },
  {
    id: "3.shm.10",
    title: "ATTACH whose name length disagrees with its bytes, or is above 64 → closed",
    cite: `${DOC} ATTACH: name length u32, name (latin1, <= 64 bytes).`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      onlyShm(ctx, t);
      const f = file(ctx);
      const short = attachMsg(f.name, f.bytes);
      short[12] = short[12]! + 1;
      const { r } = await attachRaw(ctx, short);
      t.must(r.kind === "closed", "closed for a name length past the message", () => describe(r));
      const long = attachMsg(`tapwire-${process.pid}-${"0".repeat(60)}`, f.bytes);
      const x = await attachRaw(ctx, long);
      t.must(x.r.kind === "closed", "closed for a 70-byte name", () => describe(x.r));
      await stillServes(ctx, t);
    },
  },
  {
    id: "3.shm.11",
    title: "a second ATTACH on one connection → closed",
    cite: CLOSE_CITE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await badBell(ctx, t, "a second ATTACH", (c) => attachMsg(c.file!.name, c.file!.bytes));
    },
  },
  {
    id: "3.shm.12",
    title: "a BELL naming regions before any ATTACH → closed (an inline BELL is served)",
    cite: CLOSE_CITE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      onlyShm(ctx, t);
      const c = await bare(ctx);
      c.send(bellMsg(1, [], ping(3)));
      pingOk(t, await c.recv(ctx.timeoutMs), 3, "an inline BELL without ATTACH (the fallback)");
      c.send(bellMsg(2, [{ offset: 0, length: 32 }], new Uint8Array(0)));
      await closedNoAnswer(ctx, t, c, "regions before an ATTACH");
    },
  },
  {
    id: "3.shm.13",
    title: "a region reaching past the mapping by one byte → closed",
    cite: CLOSE_CITE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await badBell(ctx, t, "a region past the mapping", (c) =>
        bellMsg(1, [{ offset: c.file!.bytes - 31, length: 32 }], new Uint8Array(0)),
      );
    },
  },
  {
    id: "3.shm.14",
    title: "a region whose offset + length wraps u32 (0xffffffe0 + 64) → closed",
    cite: CLOSE_CITE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await badBell(ctx, t, "a wrapping region", () =>
        bellMsg(1, [{ offset: 0xffffffe0, length: 64 }], new Uint8Array(0)),
      );
    },
  },
  {
    id: "3.shm.15",
    title: "two regions of one BELL overlapping by one byte → closed",
    cite: CLOSE_CITE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await badBell(ctx, t, "overlapping regions", (c) =>
        bellMsg(1, [put(c, 0, 1), { offset: 31, length: 8 }], new Uint8Array(0)),
      );
    },
  },
  {
    id: "3.shm.16",
    title: "an empty region → closed",
    cite: CLOSE_CITE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await badBell(ctx, t, "an empty region", (c) =>
        bellMsg(1, [put(c, 0, 1), { offset: 4096, length: 0 }], new Uint8Array(0)),
      );
    },
  },
  {
    id: "3.shm.17",
    title: "a replayed BELL seq (1 after 1) → closed",
    cite: CLOSE_CITE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await badBell(
        ctx,
        t,
        "a replayed seq",
        (c) => bellMsg(1, [put(c, 0, 2)], new Uint8Array(0)),
        async (c) => {
          c.sendBell(bellMsg(1, [put(c, 0, 1)], new Uint8Array(0)));
          pingOk(t, await c.recv(ctx.timeoutMs), 1, "BELL seq 1");
        },
      );
    },
  },
  {
    id: "3.shm.18",
    title: "a skipped BELL seq (3 after 1), and a first BELL with seq 0 → closed",
    cite: `${CLOSE_CITE} The first BELL of a connection has seq 1.`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      onlyShm(ctx, t);
      const a = await attached(ctx, t);
      a.sendBell(bellMsg(0, [put(a, 0, 1)], new Uint8Array(0)));
      const r = await a.recv(ctx.timeoutMs);
      t.must(r.kind === "closed", "closed for a first BELL with seq 0", () => describe(r));
      await badBell(
        ctx,
        t,
        "a skipped seq",
        (c) => bellMsg(3, [put(c, 0, 3)], new Uint8Array(0)),
        async (c) => {
          c.sendBell(bellMsg(1, [put(c, 0, 1)], new Uint8Array(0)));
          pingOk(t, await c.recv(ctx.timeoutMs), 1, "BELL seq 1");
        },
      );
    },
  },
  {
    id: "3.shm.19",
    title: "a BELL whose total is not the sum of its regions and inline bytes (one more, one less) → closed",
    cite: CLOSE_CITE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await badBell(ctx, t, "total one above the sum", (c) =>
        bellMsg(1, [put(c, 0, 1)], new Uint8Array(4), 37),
      );
      await badBell(ctx, t, "total one below the sum", (c) =>
        bellMsg(1, [put(c, 0, 1)], new Uint8Array(4), 35),
      );
    },
  },
  {
    id: "3.shm.20",
    title: "a BELL shorter than its regions (3 announced, 1 sent), and one announcing 65 regions → closed",
    cite: `${CLOSE_CITE} Region count u16 (<= 64).`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await badBell(ctx, t, "a BELL shorter than its regions", (c) => {
        const m = bellMsg(1, [put(c, 0, 1)], new Uint8Array(0));
        m[12] = 3;
        return m;
      });
      await badBell(ctx, t, "65 regions", (c) => {
        const regions = Array.from({ length: 65 }, (_, i) => ({ offset: 64 * i, length: 32 }));
        for (const r of regions) c.file!.write(r.offset, new Uint8Array(32));
        return bellMsg(1, regions, new Uint8Array(0));
      });
    },
  },
  {
    id: "3.shm.21",
    title: "an unknown kind (3), and a plain CONTRACT message with no doorbell → closed",
    cite: CLOSE_CITE,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      await badBell(ctx, t, "kind 3", (c) => {
        const m = bellMsg(1, [put(c, 0, 1)], new Uint8Array(0));
        m[0] = 3;
        return m;
      });
      onlyShm(ctx, t);
      const c = await bare(ctx);
      c.send(ping(4));
      await closedNoAnswer(ctx, t, c, "a PING sent as on unix:// (its magic read as a kind)");
    },
  },
  ...(["mapping", "inline"] as const).map(
    (where, i): W => ({
      id: `3.shm.${22 + i}`,
      title: `before HELLO, a STEP of 8 KiB ${where === "mapping" ? "in the mapping" : "inline (the fallback)"} → NO_SESSION from its first 24 bytes, then closed`,
      cite: `${DOC} the CONTRACT 11 limits apply to total (unboundMaxMessageBytes with onOversize getting the request's own first 24 bytes). CONTRACT 11: a STEP above 4 KiB before HELLO is answered NO_SESSION from the header alone, then the connection closes.`,
      async run(ctx: WorkerCtx, t: CaseCheck) {
        onlyShm(ctx, t);
        const c = where === "mapping" ? await attached(ctx, t) : await bare(ctx);
        const seq = 0x1234;
        const m = new Uint8Array(8192);
        m.set(frame({ op: Op.STEP, seq, session: 0x7654321, bodyLen: 8192 - 24 }).subarray(0, 24));
        if (where === "mapping") {
          (c as ShmConn).file!.write(8192, m);
          (c as ShmConn).sendBell(bellMsg(1, [{ offset: 8192, length: m.length }], new Uint8Array(0)));
        } else c.send(bellMsg(1, [], m));
        const r = await c.recv(ctx.timeoutMs);
        t.must(r.kind === "msg" && r.bytes.length >= 24, "a reply (NO_SESSION)", () => describe(r));
        t.must(r.bytes[7] === 1 && u32(r.bytes, 8) === seq, "NO_SESSION echoing the STEP's seq", () =>
          describe(r),
        );
        t.must(await c.waitClosed(ctx.timeoutMs), "the connection closed after the reply", "it stayed open");
        await stillServes(ctx, t);
      },
    }),
  ),
  {
    id: "3.shm.24",
    title:
      "a bound connection: a STEP whose region is the whole mapping, beyond the worker's message limit → refused or closed, never OK",
    cite: `${DOC} the CONTRACT 11 limits apply to total (maxMessageBytes).`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      onlyShm(ctx, t);
      const b = await ctx.bound(t);
      const c = b.peer.raw as ShmConn;
      const n = c.file!.bytes;
      const seq = b.sess.next;
      c.file!.write(0, frame({ op: Op.STEP, seq, session: b.sess.id, bodyLen: n - 24 }).subarray(0, 24));
      c.sendBell(bellMsg(c.nextSeq, [{ offset: 0, length: n }], new Uint8Array(0)));
      c.nextSeq++;
      const r = await c.recv(ctx.timeoutMs);
      if (r.kind === "msg") t.must(r.bytes[7] !== 0, `not OK for a ${n}-byte STEP`, () => describe(r));
      else t.must(r.kind === "closed", "a refusal or a close", () => describe(r));
      t.note(r.kind === "msg" ? `answered ${st(r.bytes[7]!)}` : "closed");
      await stillServes(ctx, t);
    },
  },
  {
    id: "3.shm.25",
    title: "nothing of the tester left in shmDir: every session file of this process is unlinked",
    cite: `${DOC} the client unlinks the file once the server answered the ATTACH, so nothing is left in /dev/shm.`,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      onlyShm(ctx, t);
      ctx.closeAll();
      const mine = readdirSync(dirOf(ctx)).filter((n) => n.startsWith(`tapwire-${process.pid}-`));
      t.must(mine.length === 0, `no tapwire-${process.pid}-* in ${dirOf(ctx)}`, () => mine.join(", "));
    },
  },
];
