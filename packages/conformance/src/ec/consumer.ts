// Over 500 lines on purpose: the scripted producer (control ROUTER and data server) and the cases
// that drive it share one script state per run; the MessagePack reader is in msgpack.ts.
/**
 * The ec-consumer mode: a scripted producer (a ZeroMQ ROUTER for the control plane and a data
 * server written from docs/ec-protocol.md section 3.1) that a consumer asks for embeddings. It
 * answers with stray, foreign-session, duplicate and wrong-size acks, every NACK, malformed acks
 * and refused reads, and judges from the wire what the consumer does next (EC-CONTRACT 3, 5.3, 6).
 */
import { randomBytes } from "node:crypto";
import * as net from "node:net";
import * as zmq from "zeromq";
import { ConformanceError } from "../errors.js";
import type { RunReport } from "../report.js";
import { makeReport } from "../report.js";
import type { CaseCheck, CaseDef, RunOptions } from "../runner.js";
import { runCases } from "../runner.js";
import type { Typed } from "./msgpack.js";
import { decodeTyped, mapEntries, mpMap, mpNestingBomb, mpStr, mpUint } from "./msgpack.js";

/** Options of the ec-consumer mode. */
export interface EcConsumerSuiteOptions {
  /** Where the scripted producer's control ROUTER listens (`tcp://host:port` or `zmq+tcp://…`). */
  listen: string;
  /** The compatibility_hash the consumer must send (EC-CONTRACT 2). */
  compatibilityHash: string;
  /** The scripted producer's cache (default 64 blocks of 4096 bytes). */
  blocks?: number;
  /** Bytes per block of the scripted producer (default 4096). */
  blockBytes?: number;
  /** The consumer's ack timeout (default 2000 ms, EC-CONTRACT 6.3): a re-request is expected after it. */
  ackTimeoutMs?: number;
  /** How long to wait for the consumer's next move (default 5000 ms). */
  timeoutMs?: number;
  /** Called with the control endpoint once bound (point the consumer at it). */
  onListening?: (control: string) => void;
}

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

/** zlib's CRC-32 (EC-CONTRACT 3: as node:zlib crc32 computes it). */
export function crc32(b: Uint8Array): number {
  let c = 0xffffffff;
  for (let i = 0; i < b.length; i++) c = CRC_TABLE[(c ^ b[i]!) & 0xff]! ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

interface XferReqEv {
  rid: Buffer;
  mmHash: string;
  sessionId: string;
  at: number;
}

interface ReadEv {
  key: string;
  blocks: number[];
  nbytes: number;
  instance: string;
  at: number;
}

interface Grant {
  blocks: number[];
  nbytes: number;
  /** The READ is answered ERROR (code) instead of DATA. */
  refuse?: number;
}

/** Context of the ec-consumer mode. */
export class EcConsumerCtx {
  readonly opts: EcConsumerSuiteOptions;
  readonly blocks: number;
  readonly blockBytes: number;
  readonly waitMs: number;
  readonly ackTimeoutMs: number;
  readonly region: Uint8Array;
  instance = randomBytes(8).toString("hex");
  dataEndpoint = "";
  control = "";
  private router: zmq.Router | null = null;
  private server: net.Server | null = null;
  private sockets = new Set<net.Socket>();
  private reqs: XferReqEv[] = [];
  private reqWaiters: (() => void)[] = [];
  readonly reads: ReadEv[] = [];
  readonly notifs: { key: string; at: number }[] = [];
  readonly grants = new Map<string, Grant>();
  /** Problems with what the consumer sent (every request is checked). */
  violations: string[] = [];
  allViolations: string[] = [];
  private nextBlock = 0;
  requestsSeen = 0;

  constructor(opts: EcConsumerSuiteOptions) {
    this.opts = opts;
    this.blocks = opts.blocks ?? 64;
    this.blockBytes = opts.blockBytes ?? 4096;
    this.waitMs = opts.timeoutMs ?? 5000;
    this.ackTimeoutMs = opts.ackTimeoutMs ?? 2000;
    this.region = new Uint8Array(this.blocks * this.blockBytes);
    for (let i = 0; i < this.region.length; i++) this.region[i] = (i * 131 + 7) & 0xff;
  }

  private violation(s: string): void {
    this.violations.push(s);
    if (this.allViolations.length < 50) this.allViolations.push(s);
  }

  /** Binds the ROUTER and the data server. */
  async start(): Promise<void> {
    const url = this.opts.listen.replace(/^zmq\+/, "");
    const r = new zmq.Router({ linger: 0 });
    await r.bind(url);
    this.router = r;
    this.control = r.lastEndpoint ?? url;
    void (async () => {
      for (;;) {
        let parts: Buffer[];
        try {
          parts = await r.receive();
        } catch {
          return;
        }
        this.onControl(parts[0]!, parts.slice(1));
      }
    })();
    this.server = net.createServer((s) => this.onData(s));
    await new Promise<void>((res) => this.server!.listen(0, "127.0.0.1", () => res()));
    this.dataEndpoint = `tcp://127.0.0.1:${(this.server.address() as net.AddressInfo).port}`;
  }

  async close(): Promise<void> {
    this.router?.close();
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((res) => (this.server ? this.server.close(() => res()) : res()));
  }

  /** EC-CONTRACT 3: every XferReq the consumer sends is checked key by key. */
  private onControl(rid: Buffer, parts: Buffer[]): void {
    if (parts.length !== 1)
      this.violation(`EC-CONTRACT 9.1: the consumer sent a ${parts.length}-part message`);
    const b = new Uint8Array(Buffer.concat(parts));
    if (b.length > 64 * 1024) this.violation("EC-CONTRACT 9.1: a control message above 64 KiB");
    let m: Map<string, Typed> | null = null;
    try {
      m = mapEntries(decodeTyped(b));
    } catch (e) {
      this.violation(`EC-CONTRACT 3: the consumer sent a message that is not MessagePack: ${String(e)}`);
      return;
    }
    if (m === null) {
      this.violation("EC-CONTRACT 3: the consumer sent a message that is not a map of string keys");
      return;
    }
    const s = (k: string): string | null => {
      const x = m!.get(k);
      if (x === undefined || x.t !== "str") {
        this.violation(`EC-CONTRACT 3: XferReq ${k} is ${x?.t ?? "missing"}, not str`);
        return null;
      }
      if (x.bytes > 256) this.violation(`EC-CONTRACT 3: XferReq ${k} over 256 bytes`);
      return x.v;
    };
    const mmHash = s("mm_hash");
    const hash = s("compatibility_hash");
    const sessionId = s("session_id");
    const v = m.get("connector_version");
    if (v === undefined || v.t !== "int")
      this.violation(`EC-CONTRACT 3: connector_version is ${v?.t ?? "missing"}, not int`);
    else if (v.v !== 2) this.violation(`EC-CONTRACT 2: connector_version ${v.v}, not 2`);
    if (hash !== null && hash !== this.opts.compatibilityHash)
      this.violation("EC-CONTRACT 2: compatibility_hash differs from the producer's");
    if (sessionId === "") this.violation("EC-CONTRACT 4.2: an empty session_id");
    if (mmHash === null || sessionId === null) return;
    this.requestsSeen++;
    this.reqs.push({ rid, mmHash, sessionId, at: performance.now() });
    const w = this.reqWaiters;
    this.reqWaiters = [];
    for (const f of w) f();
  }

  /** The data server of docs/ec-protocol.md 3.1 (READ → DATA or ERROR; NOTIF recorded). */
  private onData(sock: net.Socket): void {
    this.sockets.add(sock);
    sock.on("error", () => undefined);
    sock.on("close", () => this.sockets.delete(sock));
    let buf = Buffer.alloc(0);
    sock.on("data", (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 5) {
        const len = buf.readUInt32LE(0);
        if (len === 0 || len > 1 << 20) {
          sock.destroy();
          return;
        }
        if (buf.length < 4 + len) return;
        const f = buf.subarray(0, 4 + len);
        buf = buf.subarray(4 + len);
        const op = f[4];
        if (op === 1) {
          const keyLen = f.readUInt16LE(6);
          const readerLen = f.readUInt16LE(8);
          const instLen = f.readUInt16LE(10);
          const count = f.readUInt32LE(12);
          const nbytes = Number(f.readBigUInt64LE(16));
          let o = 24;
          const key = f.subarray(o, o + keyLen).toString("utf8");
          o += keyLen + readerLen;
          const instance = f.subarray(o, o + instLen).toString("utf8");
          o += instLen;
          const blocks: number[] = [];
          for (let i = 0; i < count; i++) blocks.push(f.readUInt32LE(o + 4 * i));
          this.reads.push({ key, blocks, nbytes, instance, at: performance.now() });
          const g = this.grants.get(key);
          const code =
            instance !== this.instance
              ? 1
              : g === undefined
                ? 2
                : g.refuse !== undefined
                  ? g.refuse
                  : g.blocks.join() !== blocks.join()
                    ? 4
                    : g.nbytes !== nbytes
                      ? 5
                      : 0;
          if (code !== 0) {
            const e = Buffer.alloc(8);
            e.writeUInt32LE(4, 0);
            e[4] = 3;
            e[5] = code;
            sock.end(e);
            return;
          }
          const h = Buffer.alloc(16);
          h.writeUInt32LE(12, 0);
          h[4] = 2;
          h.writeBigUInt64LE(BigInt(nbytes), 8);
          sock.write(h);
          sock.write(this.bytesOf(blocks, nbytes));
        } else if (op === 4) {
          const keyLen = f.readUInt16LE(6);
          this.notifs.push({ key: f.subarray(8, 8 + keyLen).toString("utf8"), at: performance.now() });
        } else {
          sock.destroy();
          return;
        }
      }
    });
  }

  /** The bytes of `blocks` cut at `nbytes`. */
  bytesOf(blocks: number[], nbytes: number): Buffer {
    const out = Buffer.alloc(nbytes);
    let o = 0;
    for (const b of blocks) {
      const n = Math.min(this.blockBytes, nbytes - o);
      if (n <= 0) break;
      out.set(this.region.subarray(b * this.blockBytes, b * this.blockBytes + n), o);
      o += n;
    }
    return out;
  }

  /** Blocks for `nbytes` (round-robin over the region). */
  allocate(nbytes: number): number[] {
    const n = Math.ceil(nbytes / this.blockBytes);
    const out: number[] = [];
    for (let i = 0; i < n; i++) {
      out.push(this.nextBlock);
      this.nextBlock = (this.nextBlock + 1) % this.blocks;
    }
    return out;
  }

  agentMetadata(instance = this.instance): Uint8Array {
    return mpMap([
      ["name", mpStr("conformance-producer")],
      ["instance", mpStr(instance)],
      ["endpoint", mpStr(this.dataEndpoint)],
    ]);
  }

  memDescriptor(): Uint8Array {
    return mpMap([
      ["num_blocks", mpUint(this.blocks)],
      ["block_bytes", mpUint(this.blockBytes)],
    ]);
  }

  /** An XferAck map (values overridable, raw msgpack). */
  ackBytes(a: {
    mmHash: string;
    status: number;
    sessionId: string;
    blocks: number[];
    nbytes: number;
    crc32: number;
    meta?: Uint8Array;
    over?: Record<string, Uint8Array>;
  }): Uint8Array {
    const bin = (b: Uint8Array) => {
      const h = Buffer.alloc(5);
      h[0] = 0xc6;
      h.writeUInt32BE(b.length, 1);
      return new Uint8Array(Buffer.concat([h, b]));
    };
    const arr = new Uint8Array(
      Buffer.concat([
        Buffer.from([0xdc, a.blocks.length >> 8, a.blocks.length & 0xff]),
        ...a.blocks.map((x) => Buffer.from(mpUint(x))),
      ]),
    );
    const ok = a.status === 0;
    return mpMap(
      Object.entries({
        mm_hash: mpStr(a.mmHash),
        status: mpUint(a.status),
        session_id: mpStr(ok ? a.sessionId : ""),
        src_block_indices: ok ? arr : Uint8Array.of(0x90),
        agent_metadata: bin(ok ? (a.meta ?? this.agentMetadata()) : new Uint8Array(0)),
        mem_descriptor: bin(ok ? this.memDescriptor() : new Uint8Array(0)),
        nbytes: mpUint(ok ? a.nbytes : 0),
        crc32: mpUint(ok ? a.crc32 : 0),
        ...(a.over ?? {}),
      }),
    );
  }

  /** Grants `nbytes` of `mmHash` to `sessionId` and returns the ack. */
  grant(
    mmHash: string,
    sessionId: string,
    nbytes: number,
    opts: { refuse?: number; crcDelta?: number } = {},
  ): { ack: Uint8Array; blocks: number[] } {
    const blocks = this.allocate(nbytes);
    this.grants.set(`${sessionId}:${mmHash}`, {
      blocks,
      nbytes,
      ...(opts.refuse !== undefined ? { refuse: opts.refuse } : {}),
    });
    const crc = (crc32(this.bytesOf(blocks, nbytes)) + (opts.crcDelta ?? 0)) >>> 0;
    return { ack: this.ackBytes({ mmHash, status: 0, sessionId, blocks, nbytes, crc32: crc }), blocks };
  }

  send(rid: Buffer, msg: Uint8Array | Uint8Array[]): void {
    if (Array.isArray(msg) && msg.length === 0) return;
    void this.router?.send([rid, ...(Array.isArray(msg) ? msg : [msg])]).catch(() => undefined);
  }

  /** The next XferReq (matching `pred`); others are granted at once like a conforming producer. */
  async nextReq(
    t: CaseCheck,
    pred: (r: XferReqEv) => boolean = () => true,
    ms = this.waitMs,
    nbytes = 10_000,
  ): Promise<XferReqEv> {
    const deadline = performance.now() + ms;
    for (;;) {
      const r = this.reqs.shift();
      if (r !== undefined) {
        if (pred(r)) return r;
        this.send(r.rid, this.grant(r.mmHash, r.sessionId, nbytes).ack);
        continue;
      }
      const left = deadline - performance.now();
      t.must(left > 0, "an XferReq from the consumer", `none within ${ms} ms`);
      await new Promise<void>((res) => {
        const timer = setTimeout(res, left);
        this.reqWaiters.push(() => {
          clearTimeout(timer);
          res();
        });
      });
    }
  }

  /** Answers everything like a conforming producer for `ms`, returning the requests seen. */
  async serve(ms: number, nbytes = 10_000): Promise<XferReqEv[]> {
    const seen: XferReqEv[] = [];
    const deadline = performance.now() + ms;
    for (;;) {
      const r = this.reqs.shift();
      if (r !== undefined) {
        seen.push(r);
        this.send(r.rid, this.grant(r.mmHash, r.sessionId, nbytes).ack);
        continue;
      }
      const left = deadline - performance.now();
      if (left <= 0) return seen;
      await new Promise<void>((res) => {
        const timer = setTimeout(res, left);
        this.reqWaiters.push(() => {
          clearTimeout(timer);
          res();
        });
      });
    }
  }
}

type E = CaseDef<EcConsumerCtx>;
const C62 =
  "EC-CONTRACT 6.2: ignore unknown or duplicate acks and acks whose session_id is not this session's; for a NACK: RETRYABLE → retryable, else → tombstoned; for OK: check that src_block_indices has as many blocks as the local allocation and nbytes fits (else tombstoned), register the peer and post the READ.";
const C63 =
  "EC-CONTRACT 6.3: WAITING_ACK → (past ack_timeout_s) ACK_TIMEOUT → retryable; READ ERR → READ_FAILED → tombstoned.";
const C3 =
  "EC-CONTRACT 3: a malformed message is dropped, counted and logged; it never raises out of a poll.";

/** Waits `ms` answering normally; returns READs of `key` and re-requests of `mmHash` seen. */
async function after(
  ctx: EcConsumerCtx,
  ms: number,
  key: string,
  mmHash: string,
): Promise<{ reads: ReadEv[]; again: XferReqEv[] }> {
  const before = ctx.reads.length;
  const seen = await ctx.serve(ms);
  return {
    reads: ctx.reads.slice(before).filter((r) => r.key === key),
    again: seen.filter((r) => r.mmHash === mmHash),
  };
}

function nackCase(id: string, status: number, name: string): E {
  const retry = status === 2;
  return {
    id,
    title: `${name} → ${retry ? "re-requested (retryable)" : "tombstoned: never re-requested, nothing read"}`,
    cite: `${C62} RETRYABLE_NACKS = {NOT_READY}.`,
    async run(ctx: EcConsumerCtx, t: CaseCheck) {
      const r = await ctx.nextReq(t);
      ctx.send(
        r.rid,
        ctx.ackBytes({ mmHash: r.mmHash, status, sessionId: "", blocks: [], nbytes: 0, crc32: 0 }),
      );
      const { reads, again } = await after(
        ctx,
        retry ? ctx.waitMs : Math.max(400, ctx.ackTimeoutMs * 1.4),
        `${r.sessionId}:${r.mmHash}`,
        r.mmHash,
      );
      if (retry) t.must(again.length > 0, `a re-request of ${r.mmHash}`, "none");
      else {
        t.must(reads.length === 0, "nothing read after a NACK", () => `${reads.length} READs`);
        t.must(again.length === 0, `no re-request of ${r.mmHash}`, () => `${again.length} re-requests`);
      }
    },
  };
}

function ignoredAck(
  id: string,
  title: string,
  cite: string,
  bad: (ctx: EcConsumerCtx, r: XferReqEv) => Uint8Array | Uint8Array[],
  opts: { strayKey?: (r: XferReqEv) => string } = {},
): E {
  return {
    id,
    title,
    cite,
    async run(ctx: EcConsumerCtx, t: CaseCheck) {
      const r = await ctx.nextReq(t);
      const key = opts.strayKey?.(r) ?? `${r.sessionId}:${r.mmHash}`;
      const before = ctx.reads.length;
      ctx.send(r.rid, bad(ctx, r));
      // The consumer must read nothing for it and, its ack never having come, ask again after ack_timeout.
      const t0 = performance.now();
      const again = await ctx.nextReq(t, (x) => x.mmHash === r.mmHash, ctx.waitMs + ctx.ackTimeoutMs);
      const reads = ctx.reads.slice(before).filter((x) => x.key === key);
      t.must(
        reads.length === 0,
        "nothing read for an ack it must ignore",
        () => `READ of ${key} (blocks ${reads[0]!.blocks})`,
      );
      const waited = again.at - t0;
      if (ctx.opts.ackTimeoutMs !== undefined)
        t.must(
          waited >= 0.7 * ctx.ackTimeoutMs,
          `the re-request after ack_timeout (${ctx.ackTimeoutMs} ms)`,
          `after ${Math.round(waited)} ms`,
        );
      const g = ctx.grant(again.mmHash, again.sessionId, 10_000);
      ctx.send(again.rid, g.ack);
      await ctx.serve(150);
      const ok = ctx.reads.filter((x) => x.key === `${again.sessionId}:${again.mmHash}`);
      t.must(ok.length >= 1, "the READ of the proper grant that followed", "none");
    },
  };
}

/** Every ec-consumer case but the closing summary, in run order. */
export const EC_CONSUMER_CASES: readonly CaseDef<EcConsumerCtx>[] = [
  {
    id: "6.1.1",
    title:
      "XferReqs carry exactly the four keys with their types, version 2, the producer's hash and a session id",
    cite: 'EC-CONTRACT 3: XferReq: {"mm_hash": str, "compatibility_hash": str, "session_id": str, "connector_version": int}; EC-CONTRACT 6.1: a UUID made once per session.',
    async run(ctx: EcConsumerCtx, t: CaseCheck) {
      const r = await ctx.nextReq(t);
      ctx.send(r.rid, ctx.grant(r.mmHash, r.sessionId, 10_000).ack);
      t.note(`session_id ${r.sessionId}`);
    },
  },
  {
    id: "6.2.1",
    title:
      "an OK ack → a READ of exactly the granted blocks under the key session_id:mm_hash, then its completion notification",
    cite: `${C62} EC-CONTRACT 4.3, 5.2: a READ copies the remote blocks, in order, then delivers notifMsg "{session_id}:{mm_hash}".`,
    async run(ctx: EcConsumerCtx, t: CaseCheck) {
      const r = await ctx.nextReq(t);
      const key = `${r.sessionId}:${r.mmHash}`;
      const g = ctx.grant(r.mmHash, r.sessionId, 10_000);
      ctx.send(r.rid, g.ack);
      const deadline = performance.now() + ctx.waitMs;
      while (performance.now() < deadline && !ctx.notifs.some((n) => n.key === key)) await ctx.serve(50);
      const reads = ctx.reads.filter((x) => x.key === key);
      t.must(reads.length === 1, "one READ of the key", () => `${reads.length}`);
      t.must(
        reads[0]!.blocks.join() === g.blocks.join() &&
          reads[0]!.nbytes === 10_000 &&
          reads[0]!.instance === ctx.instance,
        "the granted blocks, nbytes and instance",
        () => JSON.stringify(reads[0]),
      );
      t.must(
        ctx.notifs.some((n) => n.key === key),
        `the notification ${key}`,
        "none",
      );
    },
  },
  ignoredAck(
    "6.2.2",
    "an ack whose session_id is another session's → ignored (nothing read), re-requested after ack_timeout",
    C62,
    (ctx, r) => ctx.grant(r.mmHash, `${r.sessionId}-other`, 10_000).ack,
    { strayKey: (r) => `${r.sessionId}-other:${r.mmHash}` },
  ),
  ignoredAck(
    "6.2.3",
    "a stray ack for an mm_hash never asked → ignored",
    C62,
    (ctx, r) => ctx.grant(`${r.mmHash}-stray`, r.sessionId, 10_000).ack,
    { strayKey: (r) => `${r.sessionId}:${r.mmHash}-stray` },
  ),
  {
    id: "6.2.4",
    title: "a duplicate OK ack → one READ only",
    cite: C62,
    async run(ctx: EcConsumerCtx, t: CaseCheck) {
      const r = await ctx.nextReq(t);
      const g = ctx.grant(r.mmHash, r.sessionId, 10_000);
      ctx.send(r.rid, g.ack);
      ctx.send(r.rid, g.ack);
      await ctx.serve(Math.min(1000, ctx.waitMs));
      const reads = ctx.reads.filter((x) => x.key === `${r.sessionId}:${r.mmHash}`);
      t.must(reads.length === 1, "exactly one READ", () => `${reads.length}`);
    },
  },
  {
    id: "6.2.5",
    title:
      "an OK ack with more blocks than the local allocation → tombstoned: nothing read, not re-requested",
    cite: `${C62} (wrong size)`,
    async run(ctx: EcConsumerCtx, t: CaseCheck) {
      const r = await ctx.nextReq(t);
      const g = ctx.grant(r.mmHash, r.sessionId, 10_000 + 3 * ctx.blockBytes);
      ctx.send(r.rid, g.ack);
      const { reads, again } = await after(
        ctx,
        Math.max(400, ctx.ackTimeoutMs * 1.4),
        `${r.sessionId}:${r.mmHash}`,
        r.mmHash,
      );
      t.must(reads.length === 0, "nothing read", () => `${reads.length} READs`);
      t.must(again.length === 0, "no re-request (tombstoned)", () => `${again.length}`);
    },
  },
  {
    id: "6.2.6",
    title: "an OK ack whose nbytes does not fit its blocks → tombstoned: nothing read",
    cite: `${C62} (nbytes fits)`,
    async run(ctx: EcConsumerCtx, t: CaseCheck) {
      const r = await ctx.nextReq(t);
      const blocks = ctx.allocate(10_000);
      ctx.send(
        r.rid,
        ctx.ackBytes({
          mmHash: r.mmHash,
          status: 0,
          sessionId: r.sessionId,
          blocks,
          nbytes: blocks.length * ctx.blockBytes + 1,
          crc32: 0,
        }),
      );
      const { reads } = await after(
        ctx,
        Math.max(400, ctx.ackTimeoutMs * 1.4),
        `${r.sessionId}:${r.mmHash}`,
        r.mmHash,
      );
      t.must(reads.length === 0, "nothing read", () => `${reads.length} READs`);
    },
  },
  nackCase("6.2.7", 2, "NACK_NOT_READY"),
  nackCase("6.2.8", 1, "NACK_MISSING"),
  nackCase("6.2.9", 3, "NACK_INCOMPAT"),
  nackCase("6.2.10", 4, "NACK_VERSION"),
  nackCase("6.2.11", 5, "NACK_INTERNAL"),
  ignoredAck(
    "6.2.12",
    "an ack whose nbytes is the float 10000.0 → malformed, dropped: nothing read, re-requested after ack_timeout",
    `${C3} EC-CONTRACT 9.1: a float is not an integer.`,
    (ctx, r) => {
      const blocks = ctx.allocate(10_000);
      const f = Buffer.alloc(9);
      f[0] = 0xcb;
      f.writeDoubleBE(10_000, 1);
      return ctx.ackBytes({
        mmHash: r.mmHash,
        status: 0,
        sessionId: r.sessionId,
        blocks,
        nbytes: 10_000,
        crc32: 0,
        over: { nbytes: new Uint8Array(f) },
      });
    },
  ),
  ignoredAck("6.2.13", "an ack that is a nesting bomb → dropped", `${C3} EC-CONTRACT 9.1.`, () =>
    mpNestingBomb(50_000),
  ),
  ignoredAck(
    "6.2.14",
    "an ack in two ZeroMQ parts → dropped (multipart is malformed)",
    `${C3} EC-CONTRACT 9.1.`,
    (ctx, r) => {
      const a = ctx.grant(r.mmHash, r.sessionId, 10_000).ack;
      return [a.subarray(0, 9), a.subarray(9)];
    },
  ),
  ignoredAck("6.2.15", "an ack without crc32 → malformed, dropped", C3, (_ctx, r) => {
    return mpMap([
      ["mm_hash", mpStr(r.mmHash)],
      ["status", mpUint(0)],
      ["session_id", mpStr(r.sessionId)],
      ["src_block_indices", Uint8Array.of(0x90)],
      ["agent_metadata", Uint8Array.of(0xc4, 0)],
      ["mem_descriptor", Uint8Array.of(0xc4, 0)],
      ["nbytes", mpUint(10_000)],
    ]);
  }),
  ignoredAck(
    "6.3.1",
    "no ack at all → ACK_TIMEOUT, re-requested after ack_timeout",
    C63,
    () => [] as Uint8Array[],
  ),
  {
    id: "6.3.2",
    title: "a READ refused by the data server (ERROR no_grant) → READ_FAILED, tombstoned: not re-requested",
    cite: C63,
    async run(ctx: EcConsumerCtx, t: CaseCheck) {
      const r = await ctx.nextReq(t);
      ctx.send(r.rid, ctx.grant(r.mmHash, r.sessionId, 10_000, { refuse: 2 }).ack);
      const { reads, again } = await after(
        ctx,
        Math.max(800, ctx.ackTimeoutMs * 1.5),
        `${r.sessionId}:${r.mmHash}`,
        r.mmHash,
      );
      t.must(reads.length === 1, "one READ (refused)", () => `${reads.length}`);
      t.must(again.length === 0, "no re-request", () => `${again.length}`);
    },
  },
  {
    id: "6.2.16",
    title:
      "a producer with new agent metadata (restarted: new instance) → the READ is addressed to the new instance",
    cite: "EC-CONTRACT 6.2: register the peer — re-register when its metadata changed (producer restarted); EC-CONTRACT 5.3: a restarted producer has new metadata.",
    async run(ctx: EcConsumerCtx, t: CaseCheck) {
      ctx.instance = randomBytes(8).toString("hex");
      const r = await ctx.nextReq(t);
      ctx.send(r.rid, ctx.grant(r.mmHash, r.sessionId, 10_000).ack);
      await ctx.serve(Math.min(1000, ctx.waitMs));
      const reads = ctx.reads.filter((x) => x.key === `${r.sessionId}:${r.mmHash}`);
      t.must(
        reads.length === 1 && reads[0]!.instance === ctx.instance,
        `one READ for instance ${ctx.instance}`,
        () => reads.map((x) => x.instance).join(", ") || "none",
      );
    },
  },
];

/** Last: every XferReq the consumer sent passed EC-CONTRACT 3's checks. */
export const EC_CONSUMER_SUMMARY: E = {
  id: "6.1.2",
  title:
    "every XferReq of the run had exactly EC-CONTRACT 3's keys and types, version 2 and the producer's hash",
  cite: "EC-CONTRACT 3, 6.1.",
  async run(ctx: EcConsumerCtx, t: CaseCheck) {
    t.note(`${ctx.requestsSeen} XferReqs, ${ctx.reads.length} READs, ${ctx.notifs.length} notifications`);
    t.must(ctx.allViolations.length === 0, "no violation", () => ctx.allViolations.slice(0, 4).join("; "));
  },
};

/** Runs the ec-consumer cases: a scripted producer on `opts.listen` that a consumer asks for embeddings. */
export async function runEcConsumerSuite(
  opts: EcConsumerSuiteOptions,
  run: RunOptions = {},
): Promise<RunReport> {
  if (typeof opts.compatibilityHash !== "string")
    throw new ConformanceError("CONFORMANCE_BAD_OPTION", "ec-consumer needs --compatibility-hash");
  const started = new Date();
  const ctx = new EcConsumerCtx(opts);
  await ctx.start();
  opts.onListening?.(ctx.control);
  try {
    const defs = [...EC_CONSUMER_CASES, EC_CONSUMER_SUMMARY].map(
      (d): E => ({
        ...d,
        async run(c: EcConsumerCtx, t: CaseCheck) {
          c.violations = [];
          await d.run(c, t);
          t.must(c.violations.length === 0, "every XferReq valid (EC-CONTRACT 3)", () =>
            c.violations.slice(0, 3).join("; "),
          );
        },
      }),
    );
    const results = await runCases(defs, ctx, { caseTimeoutMs: 60_000, ...run });
    return makeReport(
      "ec-consumer",
      ctx.control,
      {
        data: ctx.dataEndpoint,
        blocks: ctx.blocks,
        block_bytes: ctx.blockBytes,
        ack_timeout_ms: opts.ackTimeoutMs ?? "unknown",
      },
      results,
      started,
    );
  } finally {
    await ctx.close();
  }
}
