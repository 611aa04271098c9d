// Over 500 lines on purpose: the ec-producer mode's cases and the raw DEALER script they share
// (one session's requests, grants and leases); the data-plane reader is in data-reader.ts.
/**
 * The ec-producer mode: EC-CONTRACT 3, 4 and 9 against an encoder-cache producer's control
 * ROUTER, from a raw ZeroMQ DEALER. Every ack is decoded by the tester's own type-keeping
 * MessagePack reader and checked key by key.
 */
import { createHash, randomUUID } from "node:crypto";
import type { RawConn } from "../conn.js";
import { connect, parseEndpoint } from "../conn.js";
import { ConformanceError } from "../errors.js";
import type { RunReport } from "../report.js";
import { makeReport } from "../report.js";
import type { CaseCheck, CaseDef, RunOptions } from "../runner.js";
import { runCases } from "../runner.js";
import { crc32 } from "./consumer.js";
import { DataReader } from "./data-reader.js";
import type { Typed } from "./msgpack.js";
import { decodeTyped, mapEntries, mpFloat, mpMap, mpNestingBomb, mpStr, mpUint } from "./msgpack.js";

/** Options of the ec-producer mode. */
export interface EcProducerSuiteOptions {
  /** The producer's control endpoint (`tcp://` or `zmq+tcp://`, `ipc://` or `zmq+ipc://`). */
  endpoint: string;
  /** The producer's compatibility_hash (EC-CONTRACT 2), or its inputs below. */
  compatibilityHash?: string;
  /** compatibility input: model_id. */
  modelId?: string;
  /** compatibility input: dtype. */
  dtype?: string;
  /** compatibility input: hidden_size. */
  hiddenSize?: number;
  /** compatibility input: block_bytes (also checks that nbytes fits the acked blocks). */
  blockBytes?: number;
  /** An mm_hash the producer holds ready (the grant cases need one). */
  mmHash?: string;
  /** The producer's cache size in blocks (the quota cases need it). */
  numBlocks?: number;
  /** The producer's pin lease in ms (the lease case waits it out). */
  pinLeaseMs?: number;
  /** Reply timeout (default 2000 ms); a dropped message is judged after min(timeout, 200 ms). */
  timeoutMs?: number;
  /** Reserved for input generation (the cases are deterministic today). */
  seed?: number;
}

const KEYS = [
  "mm_hash",
  "status",
  "session_id",
  "src_block_indices",
  "agent_metadata",
  "mem_descriptor",
  "nbytes",
  "crc32",
];

/** EC-CONTRACT 2: lowercase hex SHA-256 of JSON `[connector_version, model_id, dtype, hidden_size, block_bytes]`. */
export function ecCompatibilityHash(
  modelId: string,
  dtype: string,
  hiddenSize: number,
  blockBytes: number,
  version = 2,
): string {
  return createHash("sha256")
    .update(JSON.stringify([version, modelId, dtype, hiddenSize, blockBytes]))
    .digest("hex");
}

/** A checked XferAck. */
export interface Ack {
  mmHash: string;
  status: number;
  sessionId: string;
  blocks: number[];
  nbytes: number;
  crc32: number;
  keys: string[];
  /** The decoded agent_metadata (EC-CONTRACT 5.3: name, instance, endpoint), when it decodes. */
  agent: { name: string; instance: string; endpoint: string } | null;
}

/** Context of the ec-producer mode. */
export class EcProducerCtx {
  readonly opts: EcProducerSuiteOptions;
  readonly hash: string;
  readonly timeoutMs: number;
  readonly dropMs: number;
  private conns: RawConn[] = [];
  /** Data-plane readers of the case (closed after it). */
  readers: DataReader[] = [];
  /** Acks seen in the run. */
  acks = 0;

  constructor(opts: EcProducerSuiteOptions) {
    this.opts = opts;
    this.timeoutMs = opts.timeoutMs ?? 2000;
    this.dropMs = Math.min(this.timeoutMs, 200);
    if (opts.compatibilityHash !== undefined) this.hash = opts.compatibilityHash;
    else if (
      opts.modelId !== undefined &&
      opts.dtype !== undefined &&
      opts.hiddenSize !== undefined &&
      opts.blockBytes !== undefined
    )
      this.hash = ecCompatibilityHash(opts.modelId, opts.dtype, opts.hiddenSize, opts.blockBytes);
    else
      throw new ConformanceError(
        "CONFORMANCE_BAD_OPTION",
        "ec-producer needs --compatibility-hash (or --model-id, --dtype, --hidden-size and --block-bytes)",
      );
  }

  /** A new DEALER (a new ZeroMQ peer). */
  async dealer(): Promise<RawConn> {
    const url = this.opts.endpoint.replace(/^tcp:\/\//, "zmq+tcp://").replace(/^ipc:\/\//, "zmq+ipc://");
    const c = await connect(parseEndpoint(url), this.timeoutMs * 2);
    this.conns.push(c);
    return c;
  }

  closeAll(): void {
    for (const c of this.conns) c.close();
    this.conns = [];
    for (const r of this.readers) r.close();
    this.readers = [];
  }

  /** An XferReq with `over` (raw msgpack values) replacing or removing keys. */
  req(
    mmHash: string,
    sessionId: string,
    over: Record<string, Uint8Array | null> = {},
    version = 2,
    hash = this.hash,
  ): Uint8Array {
    const base: Record<string, Uint8Array | null> = {
      mm_hash: mpStr(mmHash),
      compatibility_hash: mpStr(hash),
      session_id: mpStr(sessionId),
      connector_version: mpUint(version),
      ...over,
    };
    return mpMap(Object.entries(base).filter((e): e is [string, Uint8Array] => e[1] !== null));
  }

  /** Sends `msg` and requires an ack that passes EC-CONTRACT 3's key and type checks. */
  async ack(
    t: CaseCheck,
    c: RawConn,
    msg: Uint8Array,
    echo: { mmHash: string; sessionId: string },
  ): Promise<Ack> {
    c.send(msg);
    const r = await c.recv(this.timeoutMs);
    t.must(r.kind === "msg", "an XferAck", r.kind === "timeout" ? "no reply" : r.kind);
    const bytes = (r as { bytes: Uint8Array }).bytes;
    let v: Typed;
    try {
      v = decodeTyped(bytes);
    } catch (e) {
      t.must(false, "an ack in MessagePack", () => String(e));
      throw e;
    }
    const m = mapEntries(v);
    t.must(m !== null, "the ack is a map of string keys (EC-CONTRACT 3)", v.t);
    this.acks++;
    const p: string[] = [];
    for (const k of KEYS) if (!m.has(k)) p.push(`key ${k} missing`);
    const ty = (k: string, want: Typed["t"]) => {
      const x = m.get(k);
      if (x !== undefined && x.t !== want) p.push(`${k} is ${x.t}, not ${want}`);
    };
    ty("mm_hash", "str");
    ty("status", "int");
    ty("session_id", "str");
    ty("src_block_indices", "array");
    ty("agent_metadata", "bin");
    ty("mem_descriptor", "bin");
    ty("nbytes", "int");
    ty("crc32", "int");
    const get = <T extends Typed["t"]>(k: string, t: T) => {
      const x = m.get(k);
      return x !== undefined && x.t === t ? (x as Extract<Typed, { t: T }>) : undefined;
    };
    const blocksT = get("src_block_indices", "array");
    const blocks = (blocksT?.v ?? []).map((x) => (x.t === "int" ? x.v : Number.NaN));
    if (blocks.some((x) => !Number.isInteger(x) || x < 0))
      p.push("src_block_indices holds a non-integer or negative entry");
    const status = get("status", "int")?.v ?? -1;
    if (!(status >= 0 && status <= 5)) p.push(`status ${status} is not 0..5`);
    const mmHash = get("mm_hash", "str")?.v ?? "";
    if (mmHash !== echo.mmHash) p.push(`mm_hash ${JSON.stringify(mmHash)} does not echo the request's`);
    const sessionId = get("session_id", "str")?.v ?? "";
    const nbytes = get("nbytes", "int")?.v ?? -1;
    const crc = get("crc32", "int")?.v ?? -1;
    if (status === 0) {
      if (sessionId !== echo.sessionId)
        p.push(`session_id ${JSON.stringify(sessionId)} does not echo the request's`);
      if (blocks.length === 0) p.push("an OK ack without blocks");
      if (!(nbytes > 0)) p.push(`an OK ack with nbytes ${nbytes}`);
      if (!(crc >= 0 && crc <= 0xffffffff)) p.push(`crc32 ${crc} is not a u32`);
      const bb = this.opts.blockBytes;
      if (bb !== undefined && !(nbytes > (blocks.length - 1) * bb && nbytes <= blocks.length * bb))
        p.push(`nbytes ${nbytes} does not fit ${blocks.length} blocks of ${bb}`);
      if (new Set(blocks).size !== blocks.length) p.push("src_block_indices repeats a block");
      const nb = this.opts.numBlocks;
      if (nb !== undefined && blocks.some((x) => x >= nb)) p.push(`a block index >= num_blocks ${nb}`);
    } else {
      const meta = get("agent_metadata", "bin")?.v.length ?? 0;
      const desc = get("mem_descriptor", "bin")?.v.length ?? 0;
      if (sessionId !== "" || blocks.length !== 0 || meta !== 0 || desc !== 0 || nbytes !== 0 || crc !== 0)
        p.push("a NACK whose fields other than mm_hash and status are not empty");
    }
    t.must(p.length === 0, "an XferAck with exactly EC-CONTRACT 3's keys and types", () => p.join("; "));
    let agent: Ack["agent"] = null;
    const meta = get("agent_metadata", "bin")?.v;
    if (status === 0 && meta !== undefined) {
      try {
        const am = mapEntries(decodeTyped(meta));
        const sv = (k: string) => {
          const x = am?.get(k);
          return x?.t === "str" ? x.v : null;
        };
        const name = sv("name");
        const instance = sv("instance");
        const endpoint = sv("endpoint");
        if (name !== null && instance !== null && endpoint !== null) agent = { name, instance, endpoint };
      } catch {
        agent = null;
      }
    }
    return { mmHash, status, sessionId, blocks, nbytes, crc32: crc, keys: [...m.keys()], agent };
  }

  /** Sends `msg` (or parts) and requires no reply (dropped, EC-CONTRACT 3: nothing sent back), then a valid request still answered. */
  async dropped(t: CaseCheck, msg: Uint8Array | Uint8Array[]): Promise<void> {
    const c = await this.dealer();
    if (Array.isArray(msg)) c.sendParts(msg);
    else c.send(msg);
    const r = await c.recv(this.dropMs);
    t.must(r.kind === "timeout", "no reply: a malformed message is dropped, nothing is sent back", () =>
      r.kind === "msg" ? `a ${r.bytes.length}-byte reply` : r.kind,
    );
    const id = randomUUID();
    const h = `conformance-missing-${id}`;
    const a = await this.ack(t, c, this.req(h, id), { mmHash: h, sessionId: id });
    t.must(a.status === 1, "the producer still serves: NACK_MISSING for an unknown mm_hash", () =>
      String(a.status),
    );
  }
}

type P = CaseDef<EcProducerCtx>;
const C3 =
  "EC-CONTRACT 3: a message that is not a map, lacks a key, has a wrong type (booleans are not integers), a string over 256 UTF-8 bytes ... is malformed; a malformed message is dropped, counted and logged; a producer sends nothing back for it.";
const C91 =
  "EC-CONTRACT 9.1: a control message is one flat map; anything nested deeper is malformed and refused before it is built; a declared length longer than the bytes that remain is malformed; a float is not an integer, even 2.0; a multipart message is malformed; a message over 64 KiB is dropped by the socket.";
const C42 =
  "EC-CONTRACT 4.2: grant: version → hash → non-empty session_id (else NACK_INTERNAL) → pin_if_ready: no entry → NACK_MISSING; not ready → NACK_NOT_READY; ready → pinned.";

const missing = () => `conformance-missing-${randomUUID()}`;

function nack(
  id: string,
  title: string,
  cite: string,
  status: number,
  build: (ctx: EcProducerCtx, h: string, s: string) => Uint8Array,
  useReady = false,
): P {
  return {
    id,
    title,
    cite,
    async run(ctx: EcProducerCtx, t: CaseCheck) {
      if (useReady && ctx.opts.mmHash === undefined) t.info("a ready mm_hash (--mm-hash)", "none given");
      const h = useReady ? ctx.opts.mmHash! : missing();
      const s = randomUUID();
      const a = await ctx.ack(t, await ctx.dealer(), build(ctx, h, s), { mmHash: h, sessionId: s });
      t.must(a.status === status, `status ${status}`, () => String(a.status));
    },
  };
}

function malformed(
  id: string,
  title: string,
  cite: string,
  build: (ctx: EcProducerCtx) => Uint8Array | Uint8Array[],
): P {
  return {
    id,
    title,
    cite,
    async run(ctx: EcProducerCtx, t: CaseCheck) {
      await ctx.dropped(t, build(ctx));
    },
  };
}

function needReady(ctx: EcProducerCtx, t: CaseCheck): string {
  if (ctx.opts.mmHash === undefined) t.info("a ready mm_hash (--mm-hash)", "none given");
  return ctx.opts.mmHash!;
}

const CONTROL_CASES: CaseDef<EcProducerCtx>[] = [
  {
    id: "3.1",
    title:
      "an XferReq for a ready mm_hash → OK with exactly the eight keys, their types, the echoes, blocks that fit nbytes",
    cite: 'EC-CONTRACT 3: XferAck: {"mm_hash": str, "status": int, "session_id": str, "src_block_indices": [int], "agent_metadata": bin, "mem_descriptor": bin, "nbytes": int, "crc32": int}.',
    async run(ctx: EcProducerCtx, t: CaseCheck) {
      const h = needReady(ctx, t);
      const s = randomUUID();
      const a = await ctx.ack(t, await ctx.dealer(), ctx.req(h, s), { mmHash: h, sessionId: s });
      t.must(a.status === 0, "OK", () => String(a.status));
      const extra = a.keys.filter((k) => !KEYS.includes(k));
      if (extra.length > 0) t.note(`extra keys ${extra.join(", ")} (allowed: receivers ignore them)`);
    },
  },
  nack(
    "3.2",
    "an unknown mm_hash → NACK_MISSING, every other field empty",
    `${C42} EC-CONTRACT 3: on a NACK only mm_hash and status carry meaning, the rest are empty.`,
    1,
    (c, h, s) => c.req(h, s),
  ),
  nack(
    "3.3",
    "connector_version 1 → NACK_VERSION",
    "EC-CONTRACT 2: a producer NACKs a request whose version (NACK_VERSION) or hash (NACK_INCOMPAT) differs.",
    4,
    (c, h, s) => c.req(h, s, {}, 1),
  ),
  nack("3.4", "another compatibility_hash → NACK_INCOMPAT", "EC-CONTRACT 2.", 3, (c, h, s) =>
    c.req(h, s, {}, 2, "0".repeat(64)),
  ),
  nack("3.5", "order: wrong version and wrong hash → NACK_VERSION", C42, 4, (c, h, s) =>
    c.req(h, s, {}, 3, "f".repeat(64)),
  ),
  nack("3.6", "an empty session_id → NACK_INTERNAL", C42, 5, (c, h) => c.req(h, ""), true),
  nack("3.7", "order: wrong hash and an empty session_id → NACK_INCOMPAT", C42, 3, (c, h) =>
    c.req(h, "", {}, 2, "e".repeat(64)),
  ),
  nack(
    "3.8",
    "order: an empty session_id for an unknown mm_hash → NACK_INTERNAL (session before the cache)",
    C42,
    5,
    (c, h) => c.req(h, ""),
  ),
  nack(
    "3.9",
    "an unknown extra key is ignored: answered as without it",
    "EC-CONTRACT 3: unknown extra keys are ignored (so a later version can add fields).",
    1,
    (c, h, s) => c.req(h, s, { future_field: mpStr("x") }),
  ),
  nack(
    "3.10",
    "keys in another order are the same message",
    "EC-CONTRACT 3: MessagePack maps with these exact string keys.",
    1,
    (_c, h, s) =>
      mpMap([
        ["session_id", mpStr(s)],
        ["connector_version", mpUint(2)],
        ["mm_hash", mpStr(h)],
        ["compatibility_hash", mpStr(_c.hash)],
      ]),
  ),
  malformed("3.11", "an array instead of a map → dropped", C3, () => Uint8Array.of(0x92, 0x01, 0x02)),
  malformed("3.12", "a string instead of a map → dropped", C3, () => mpStr("mm_hash")),
  ...["mm_hash", "compatibility_hash", "session_id", "connector_version"].map((k, i) =>
    malformed(`3.${13 + i}`, `an XferReq without ${k} → dropped`, C3, (c) =>
      c.req(missing(), randomUUID(), { [k]: null }),
    ),
  ),
  malformed("3.17", "connector_version as the float 2.0 → dropped", `${C3} ${C91}`, (c) =>
    c.req(missing(), randomUUID(), { connector_version: mpFloat(2) }),
  ),
  malformed("3.18", "connector_version as true → dropped (booleans are not integers)", C3, (c) =>
    c.req(missing(), randomUUID(), { connector_version: Uint8Array.of(0xc3) }),
  ),
  malformed("3.19", 'connector_version as the string "2" → dropped', C3, (c) =>
    c.req(missing(), randomUUID(), { connector_version: mpStr("2") }),
  ),
  malformed("3.20", "mm_hash as an int → dropped", C3, (c) =>
    c.req("x", randomUUID(), { mm_hash: mpUint(7) }),
  ),
  malformed("3.21", "session_id as bin → dropped", C3, (c) =>
    c.req(missing(), "x", { session_id: Uint8Array.of(0xc4, 3, 0x61, 0x62, 0x63) }),
  ),
  malformed("3.22", "mm_hash of 257 UTF-8 bytes → dropped", C3, (c) => c.req("h".repeat(257), randomUUID())),
  malformed("3.23", "session_id of 300 UTF-8 bytes → dropped", C3, (c) => c.req(missing(), "é".repeat(150))),
  malformed("3.24", "bytes that are not MessagePack (0xc1) → dropped", C3, () =>
    Uint8Array.of(0xc1, 0xc1, 0xc1),
  ),
  malformed("3.25", "a map header announcing 4 entries with 2 present → dropped", C3, (c) =>
    c.req(missing(), randomUUID()).subarray(0, 30),
  ),
  malformed("3.26", "an empty message → dropped", C3, () => new Uint8Array(0)),
  malformed("9.1.1", "an XferReq sent as two ZeroMQ parts → dropped (multipart is malformed)", C91, (c) => {
    const m = c.req(missing(), randomUUID());
    return [m.subarray(0, 10), m.subarray(10)];
  }),
  malformed("9.1.2", "a nested map as a value → dropped", C91, (c) =>
    c.req(missing(), randomUUID(), { extra: mpMap([["a", mpUint(1)]]) }),
  ),
  malformed("9.1.3", "a nested array as an unknown key's value → dropped", C91, (c) =>
    c.req(missing(), randomUUID(), { extra: Uint8Array.of(0x91, 0x91, 0x01) }),
  ),
  malformed("9.1.4", "a nesting bomb (60,000 nested one-element arrays, under 64 KiB) → dropped", C91, () =>
    mpNestingBomb(60_000),
  ),
  malformed("9.1.5", "a nesting bomb inside an XferReq's unknown key → dropped", C91, (c) =>
    c.req(missing(), randomUUID(), { extra: mpNestingBomb(30_000) }),
  ),
  malformed("9.1.6", "a str32 header declaring 1 GB with 10 bytes present → dropped", C91, () =>
    mpMap([["mm_hash", Uint8Array.of(0xdb, 0x40, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)]]),
  ),
  malformed("9.1.7", "a map32 header declaring 2^32 - 1 entries → dropped", C91, () =>
    Uint8Array.of(0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 0x61, 0x01),
  ),
  malformed("9.1.8", "an array32 header declaring 2^32 - 1 entries as a value → dropped", C91, (c) =>
    c.req(missing(), randomUUID(), { extra: Uint8Array.of(0xdd, 0xff, 0xff, 0xff, 0xff, 1) }),
  ),
  malformed("9.1.9", "a bin32 header declaring more bytes than remain → dropped", C91, (c) =>
    c.req(missing(), randomUUID(), { extra: Uint8Array.of(0xc6, 0, 1, 0, 0, 1) }),
  ),
  malformed("9.1.10", "a message above 64 KiB → dropped (maxMessageSize)", C91, (c) =>
    c.req(missing(), randomUUID(), {
      pad: Uint8Array.from([0xc6, 0, 1, 0, 0x10, ...new Uint8Array(0x10010)]),
    }),
  ),
  malformed(
    "9.1.11",
    "an array of 10,000 ints under an unknown key → dropped (only src_block_indices may be an array)",
    C91,
    (c) =>
      c.req(missing(), randomUUID(), {
        extra: Uint8Array.from([0xdc, 0x27, 0x10, ...new Uint8Array(10_000)]),
      }),
  ),
  {
    id: "9.1.12",
    title: "after 20 nesting bombs the producer answers a valid request at once",
    cite: `${C91} EC-CONTRACT 8: garbage on the control plane never crashes either side.`,
    async run(ctx: EcProducerCtx, t: CaseCheck) {
      const c = await ctx.dealer();
      for (let i = 0; i < 20; i++) c.send(mpNestingBomb(60_000));
      const h = missing();
      const s = randomUUID();
      const a = await ctx.ack(t, c, ctx.req(h, s), { mmHash: h, sessionId: s });
      t.must(a.status === 1, "NACK_MISSING", () => String(a.status));
    },
  },
  {
    id: "4.2.1",
    title:
      "the same key asked again (a consumer that timed out) → granted again: the same blocks, nbytes and crc32",
    cite: "EC-CONTRACT 4.2: if the key already has a grant (the consumer timed out and asked again), the old pin is released first; the ack carries the block ids.",
    async run(ctx: EcProducerCtx, t: CaseCheck) {
      const h = needReady(ctx, t);
      const s = randomUUID();
      const c = await ctx.dealer();
      const a = await ctx.ack(t, c, ctx.req(h, s), { mmHash: h, sessionId: s });
      const b = await ctx.ack(t, c, ctx.req(h, s), { mmHash: h, sessionId: s });
      t.must(a.status === 0 && b.status === 0, "OK twice", () => `${a.status}, ${b.status}`);
      t.must(
        a.blocks.join() === b.blocks.join() && a.nbytes === b.nbytes && a.crc32 === b.crc32,
        "the same blocks, nbytes and crc32",
        () => `${a.blocks} / ${b.blocks}`,
      );
    },
  },
  {
    id: "4.2.2",
    title: "two sessions asking the same mm_hash are both granted",
    cite: "EC-CONTRACT 4.2: grants are keyed by session_id:mm_hash.",
    async run(ctx: EcProducerCtx, t: CaseCheck) {
      const h = needReady(ctx, t);
      const s1 = randomUUID();
      const s2 = randomUUID();
      const a = await ctx.ack(t, await ctx.dealer(), ctx.req(h, s1), { mmHash: h, sessionId: s1 });
      const b = await ctx.ack(t, await ctx.dealer(), ctx.req(h, s2), { mmHash: h, sessionId: s2 });
      t.must(a.status === 0 && b.status === 0, "OK for both", () => `${a.status}, ${b.status}`);
    },
  },
  {
    id: "9.2.1",
    title: "one ZeroMQ peer pinning past a quarter of the cache (fresh session ids) → NACK_NOT_READY",
    cite: "EC-CONTRACT 9.2: a producer bounds the blocks pinned for one session_id and for one ZeroMQ peer (max_pinned_blocks_per_peer, default a quarter of the cache); a request beyond a quota is answered NACK_NOT_READY.",
    async run(ctx: EcProducerCtx, t: CaseCheck) {
      const h = needReady(ctx, t);
      const nb = ctx.opts.numBlocks;
      if (nb === undefined) t.info("the cache size (--num-blocks)", "not given");
      const c = await ctx.dealer();
      const s0 = randomUUID();
      const first = await ctx.ack(t, c, ctx.req(h, s0), { mmHash: h, sessionId: s0 });
      const per = first.blocks.length;
      const limit = Math.ceil(nb! / 4 / per) + 2;
      let refused = -1;
      for (let i = 1; i < limit && refused < 0; i++) {
        const s = randomUUID();
        const a = await ctx.ack(t, c, ctx.req(h, s), { mmHash: h, sessionId: s });
        if (a.status === 2) refused = i;
      }
      t.must(
        refused > 0,
        `NACK_NOT_READY within ${limit} grants of ${per} blocks (cache ${nb})`,
        "every request granted",
      );
      t.note(`refused after ${refused} grants of ${per} blocks`);
      // Another peer is not held by this one's quota.
      const s = randomUUID();
      const other = await ctx.ack(t, await ctx.dealer(), ctx.req(h, s), { mmHash: h, sessionId: s });
      if (other.status !== 0) t.note(`another peer got status ${other.status} (the pinned-fraction cap?)`);
    },
  },
  {
    id: "4.4.1",
    title: "grants past their lease are released: after pin_lease the refused peer is granted again",
    cite: "EC-CONTRACT 4.4: a grant past its lease is revoked on the data plane and unpinned (counted, warned).",
    async run(ctx: EcProducerCtx, t: CaseCheck) {
      const h = needReady(ctx, t);
      const lease = ctx.opts.pinLeaseMs;
      if (lease === undefined || lease > 15_000)
        t.info("a pin lease under 15 s (--pin-lease-ms)", String(lease ?? "not given"));
      if (ctx.opts.numBlocks === undefined) t.info("the cache size (--num-blocks)", "not given");
      const c = await ctx.dealer();
      let refused = false;
      for (let i = 0; i < ctx.opts.numBlocks! + 2 && !refused; i++) {
        const s = randomUUID();
        refused = (await ctx.ack(t, c, ctx.req(h, s), { mmHash: h, sessionId: s })).status === 2;
      }
      t.must(refused, "a quota refusal first", "none");
      await new Promise((r) => setTimeout(r, lease! * 2 + 300));
      const s = randomUUID();
      const a = await ctx.ack(t, c, ctx.req(h, s), { mmHash: h, sessionId: s });
      t.must(a.status === 0, "OK once the leases ran out", () => String(a.status));
    },
  },
];

const C53 =
  "EC-CONTRACT 5.3: a READ is served only for a key with a live grant and only for exactly the blocks of that grant; anything else is refused (ERR at the reader, counted at the server). docs/ec-protocol.md 3.1: the server checks the instance (1), a grant for key (2), not expired (3), blocks equal, order included (4), nbytes (5), and refuses with ERROR, then closes.";

/** A fresh grant of the ready entry and a data-plane connection to its agent. */
async function granted(ctx: EcProducerCtx, t: CaseCheck): Promise<{ a: Ack; key: string; r: DataReader }> {
  const h = needReady(ctx, t);
  const s = randomUUID();
  const a = await ctx.ack(t, await ctx.dealer(), ctx.req(h, s), { mmHash: h, sessionId: s });
  t.must(a.status === 0, "a grant (OK ack)", () => String(a.status));
  t.must(
    a.agent !== null,
    "agent_metadata that decodes as {name, instance, endpoint} (docs/ec-protocol.md 3)",
    "it does not",
  );
  let r: DataReader;
  try {
    r = await DataReader.connect(a.agent.endpoint, ctx.timeoutMs);
  } catch (e) {
    t.info("a tcp:// or unix:// data plane the tester can read", `${a.agent.endpoint}: ${String(e)}`);
  }
  ctx.readers.push(r);
  return { a, key: `${s}:${h}`, r };
}

function refusedRead(
  id: string,
  title: string,
  code: number,
  mutate: (g: { a: Ack; key: string }) => { key: string; instance: string; blocks: number[]; nbytes: number },
): P {
  return {
    id,
    title,
    cite: C53,
    async run(ctx: EcProducerCtx, t: CaseCheck) {
      const g = await granted(ctx, t);
      const m = mutate(g);
      g.r.read(m.key, "conformance/reader", m.instance, m.blocks, m.nbytes);
      const res = await g.r.answer(ctx.timeoutMs);
      t.must(res.kind === "error" && res.code === code, `ERROR code ${code}`, () =>
        res.kind === "error" ? `ERROR code ${res.code} (${res.message})` : res.kind,
      );
      t.must(res.kind === "error" && res.closed, "then the connection closed", "it stayed open");
    },
  };
}

const DATA_CASES: P[] = [
  {
    id: "5.3.1",
    title:
      "a READ of the grant's key and blocks → DATA with nbytes bytes whose CRC-32 is the ack's crc32; the notification is accepted",
    cite: `${C53} EC-CONTRACT 3: crc32 is the CRC-32 (zlib's) of the entry's nbytes bytes.`,
    async run(ctx: EcProducerCtx, t: CaseCheck) {
      const g = await granted(ctx, t);
      g.r.read(g.key, "conformance/reader", g.a.agent!.instance, g.a.blocks, g.a.nbytes);
      const res = await g.r.answer(ctx.timeoutMs);
      t.must(res.kind === "data", "DATA", () =>
        res.kind === "error" ? `ERROR ${res.code} ${res.message}` : res.kind,
      );
      t.must(res.bytes.length === g.a.nbytes, `${g.a.nbytes} bytes`, () => String(res.bytes.length));
      t.must(crc32(res.bytes) === g.a.crc32, `CRC-32 ${g.a.crc32}`, () => String(crc32(res.bytes)));
      g.r.notif(g.key);
      t.must(!(await g.r.waitClosed(200)), "the connection stays open after the notification", "closed");
    },
  },
  {
    id: "4.3.1",
    title: "the completion notification ends the grant: a second READ of the key → ERROR no_grant",
    cite: 'EC-CONTRACT 4.3: a data-plane notification "{session_id}:{mm_hash}" completes that grant: unpin, drop the grant.',
    async run(ctx: EcProducerCtx, t: CaseCheck) {
      const g = await granted(ctx, t);
      g.r.read(g.key, "conformance/reader", g.a.agent!.instance, g.a.blocks, g.a.nbytes);
      const first = await g.r.answer(ctx.timeoutMs);
      t.must(first.kind === "data", "DATA for the first READ", first.kind);
      g.r.notif(g.key);
      // The producer drains notifications in poll_step (4.1): give it a few steps.
      let res: Awaited<ReturnType<DataReader["answer"]>> = { kind: "timeout" };
      for (let i = 0; i < 20; i++) {
        await new Promise((r) => setTimeout(r, 100));
        const again = await DataReader.connect(g.a.agent!.endpoint, ctx.timeoutMs);
        ctx.readers.push(again);
        again.read(g.key, "conformance/reader", g.a.agent!.instance, g.a.blocks, g.a.nbytes);
        res = await again.answer(ctx.timeoutMs);
        if (res.kind === "error") break;
      }
      t.must(
        res.kind === "error" && res.code === 2,
        "ERROR no_grant (2) once the notification was drained",
        () => (res.kind === "error" ? `ERROR ${res.code}` : res.kind),
      );
    },
  },
  refusedRead("5.3.2", "a READ of a key without a grant → ERROR no_grant, then closed", 2, (g) => ({
    key: `${g.key}-none`,
    instance: g.a.agent!.instance,
    blocks: g.a.blocks,
    nbytes: g.a.nbytes,
  })),
  refusedRead(
    "5.3.3",
    "a READ addressed to another instance → ERROR instance_mismatch, then closed",
    1,
    (g) => ({ key: g.key, instance: "0000000000000000", blocks: g.a.blocks, nbytes: g.a.nbytes }),
  ),
  refusedRead(
    "5.3.4",
    "a READ of other blocks than the grant's → ERROR blocks_mismatch, then closed",
    4,
    (g) => ({
      key: g.key,
      instance: g.a.agent!.instance,
      blocks: g.a.blocks.map((b) => b + 1),
      nbytes: g.a.nbytes,
    }),
  ),
  refusedRead("5.3.5", "a READ of the grant's blocks in another order → ERROR blocks_mismatch", 4, (g) => ({
    key: g.key,
    instance: g.a.agent!.instance,
    blocks: g.a.blocks.length > 1 ? [...g.a.blocks].reverse() : [g.a.blocks[0]! + 1],
    nbytes: g.a.nbytes,
  })),
  refusedRead("5.3.6", "a READ whose nbytes needs fewer blocks than it names → ERROR bad_nbytes", 5, (g) => ({
    key: g.key,
    instance: g.a.agent!.instance,
    blocks: g.a.blocks,
    nbytes: 1,
  })),
  {
    id: "4.4.2",
    title: "a grant past its lease is revoked on the data plane: its READ → ERROR (no_grant or expired)",
    cite: "EC-CONTRACT 4.4: a grant past its lease is revoked on the data plane and unpinned.",
    async run(ctx: EcProducerCtx, t: CaseCheck) {
      const lease = ctx.opts.pinLeaseMs;
      if (lease === undefined || lease > 15_000)
        t.info("a pin lease under 15 s (--pin-lease-ms)", String(lease ?? "not given"));
      const g = await granted(ctx, t);
      await new Promise((r) => setTimeout(r, lease! * 2 + 300));
      g.r.read(g.key, "conformance/reader", g.a.agent!.instance, g.a.blocks, g.a.nbytes);
      const res = await g.r.answer(ctx.timeoutMs);
      t.must(res.kind === "error" && (res.code === 2 || res.code === 3), "ERROR no_grant or expired", () =>
        res.kind === "error" ? `ERROR ${res.code}` : res.kind,
      );
    },
  },
  {
    id: "9.5.1",
    title: "garbage on the data plane closes that connection; the data server serves a proper READ after",
    cite: "EC-CONTRACT 9.5: nothing received ends the process; EC-CONTRACT 8: garbage on the data plane never crashes either side.",
    async run(ctx: EcProducerCtx, t: CaseCheck) {
      const g = await granted(ctx, t);
      const bad = await DataReader.connect(g.a.agent!.endpoint, ctx.timeoutMs);
      ctx.readers.push(bad);
      bad.raw(Uint8Array.of(0xff, 0xff, 0xff, 0x7f, 9, 9, 9, 9));
      t.must(await bad.waitClosed(ctx.timeoutMs), "the garbage connection closed", "it stayed open");
      g.r.read(g.key, "conformance/reader", g.a.agent!.instance, g.a.blocks, g.a.nbytes);
      const res = await g.r.answer(ctx.timeoutMs);
      t.must(res.kind === "data", "DATA for the proper READ", res.kind);
    },
  },
];

const C35 =
  "docs/ec-protocol.md 3.5 (tapwire 1.2, optional capability data_req): a producer offers data_req = 1 only on the OK ack of an XferReq carrying read_ahead, ack_ahead and data_req = 1; an XFER_REQ (op 0x0c) on a data connection is validated and granted as that XferReq (EC-CONTRACT 4.2, 5.3) and answered there: ACK then DATA, or an ACK flagged final (a NACK). A 1.1 request never sees the key.";
const WANTS_REQ = () => ({
  read_ahead: mpUint(1),
  ack_ahead: mpUint(1),
  xfer_id: mpUint(7),
  data_req: mpUint(1),
});

/** An OK ack offering data_req and a connection to its agent; UNIMPLEMENTED when not offered. */
async function offered(ctx: EcProducerCtx, t: CaseCheck): Promise<{ a: Ack; r: DataReader; h: string }> {
  const h = needReady(ctx, t);
  const s = randomUUID();
  const a = await ctx.ack(t, await ctx.dealer(), ctx.req(h, s, WANTS_REQ()), { mmHash: h, sessionId: s });
  t.must(a.status === 0, "a grant (OK ack)", () => String(a.status));
  if (!a.keys.includes("data_req")) t.unimplemented("requests on the data connection (data_req, 3.5)");
  t.must(a.agent !== null, "agent_metadata that decodes as {name, instance, endpoint}", "it does not");
  const r = await DataReader.connect(a.agent!.endpoint, ctx.timeoutMs);
  ctx.readers.push(r);
  return { a, r, h };
}

const REQ_CASES: P[] = [
  {
    id: "5.3.10",
    title: "an XferReq without data_req (a 1.1 or 3.3 consumer) gets an ack without the data_req key",
    cite: C35,
    async run(ctx: EcProducerCtx, t: CaseCheck) {
      const h = needReady(ctx, t);
      const s = randomUUID();
      const over = { read_ahead: mpUint(1), ack_ahead: mpUint(1), xfer_id: mpUint(9) };
      const a = await ctx.ack(t, await ctx.dealer(), ctx.req(h, s, over), { mmHash: h, sessionId: s });
      t.must(!a.keys.includes("data_req"), "no data_req key", () => a.keys.join(","));
      const s2 = randomUUID();
      const b = await ctx.ack(t, await ctx.dealer(), ctx.req(h, s2), { mmHash: h, sessionId: s2 });
      t.must(b.keys.length === KEYS.length, "exactly EC-CONTRACT 3's keys for a 1.1 XferReq", () =>
        b.keys.join(","),
      );
    },
  },
  {
    id: "5.3.11",
    title:
      "an XFER_REQ on a data connection → ACK (the XferAck, xfer_id echoed) then DATA whose CRC-32 is the ack's; NOTIF accepted",
    cite: C35,
    async run(ctx: EcProducerCtx, t: CaseCheck) {
      const { a, r, h } = await offered(ctx, t);
      const s = randomUUID();
      r.xferReq("conformance/reader", a.agent!.instance, a.nbytes, ctx.req(h, s, WANTS_REQ()));
      const f = await r.ackFrame(ctx.timeoutMs);
      t.must(f.kind === "ack" && !f.final, "an ACK frame (not final)", () =>
        f.kind === "ack" ? "a final ACK" : f.what,
      );
      const m = mapEntries(decodeTyped(f.ack));
      const st = m?.get("status");
      const id = m?.get("xfer_id");
      t.must(st?.t === "int" && st.v === 0, "status OK", () => JSON.stringify(st));
      t.must(id?.t === "int" && id.v === 7, "xfer_id 7 echoed", () => JSON.stringify(id));
      const res = await r.answer(ctx.timeoutMs);
      t.must(res.kind === "data", "DATA after the ACK", res.kind);
      t.must(crc32(res.bytes) === a.crc32, `CRC-32 ${a.crc32}`, () => String(crc32(res.bytes)));
      r.notif(`${s}:${h}`);
      t.must(!(await r.waitClosed(200)), "the connection stays open after the notification", "closed");
    },
  },
  {
    id: "5.3.12",
    title:
      "an XFER_REQ for an unknown mm_hash → an ACK flagged final (NACK_MISSING), the connection stays open, and no grant exists for its key",
    cite: `${C35} EC-CONTRACT 5.3: a READ is served only for a key with a live grant.`,
    async run(ctx: EcProducerCtx, t: CaseCheck) {
      const { a, r } = await offered(ctx, t);
      const s = randomUUID();
      const h = missing();
      r.xferReq("conformance/reader", a.agent!.instance, a.nbytes, ctx.req(h, s, WANTS_REQ()));
      const f = await r.ackFrame(ctx.timeoutMs);
      t.must(f.kind === "ack" && f.final, "a final ACK", () => (f.kind === "ack" ? "not final" : f.what));
      const st = mapEntries(decodeTyped(f.ack))?.get("status");
      t.must(st?.t === "int" && st.v === 1, "status NACK_MISSING (1)", () => JSON.stringify(st));
      t.must(!(await r.waitClosed(200)), "the connection stays open", "closed");
      r.read(`${s}:${h}`, "conformance/reader", a.agent!.instance, a.blocks, a.nbytes);
      const res = await r.answer(ctx.timeoutMs);
      t.must(res.kind === "error" && res.code === 2, "a READ of its key → ERROR no_grant", () =>
        res.kind === "error" ? `ERROR ${res.code}` : res.kind,
      );
    },
  },
  {
    id: "5.3.13",
    title:
      "a malformed XFER_REQ (reserved byte set, lengths that do not add up, a nested map) closes that connection; the server still serves",
    cite: `${C35} EC-CONTRACT 9.1, 9.5.`,
    async run(ctx: EcProducerCtx, t: CaseCheck) {
      const { a, r, h } = await offered(ctx, t);
      const good = ctx.req(h, randomUUID(), WANTS_REQ());
      const bads: Uint8Array[] = [
        Uint8Array.of(5, 0, 0, 0, 0x0c, 0, 0, 0, 0),
        Uint8Array.of(20, 0, 0, 0, 0x0c, 1, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x61, 0x62, 0x63, 0x64),
        mpNestingBomb(4),
      ];
      for (const [i, bad] of bads.entries()) {
        const c = await DataReader.connect(a.agent!.endpoint, ctx.timeoutMs);
        ctx.readers.push(c);
        if (i < 2) c.raw(bad);
        else c.xferReq("conformance/reader", a.agent!.instance, a.nbytes, bad);
        t.must(
          await c.waitClosed(ctx.timeoutMs),
          `malformed XFER_REQ ${i + 1} closed its connection`,
          "open",
        );
      }
      r.xferReq("conformance/reader", a.agent!.instance, a.nbytes, good);
      const f = await r.ackFrame(ctx.timeoutMs);
      t.must(f.kind === "ack" && !f.final, "a proper XFER_REQ is still served (ACK)", () =>
        f.kind === "ack" ? "final" : f.what,
      );
      t.must((await r.answer(ctx.timeoutMs)).kind === "data", "and DATA", "no DATA");
    },
  },
];

/** Every ec-producer case, in run order: the control plane, then the data plane. */
export const EC_PRODUCER_CASES: readonly CaseDef<EcProducerCtx>[] = [
  ...CONTROL_CASES,
  ...DATA_CASES,
  ...REQ_CASES,
];

/** Runs the ec-producer cases against `opts.endpoint`. */
export async function runEcProducerSuite(
  opts: EcProducerSuiteOptions,
  run: RunOptions = {},
): Promise<RunReport> {
  const started = new Date();
  const ctx = new EcProducerCtx(opts);
  const results = await runCases(EC_PRODUCER_CASES, ctx, { ...run, after: async () => ctx.closeAll() });
  return makeReport(
    "ec-producer",
    opts.endpoint,
    {
      compatibility_hash: ctx.hash,
      mm_hash: opts.mmHash ?? "none",
      num_blocks: opts.numBlocks ?? "unknown",
      pin_lease_ms: opts.pinLeaseMs ?? "unknown",
    },
    results,
    started,
  );
}
