// Over 500 lines on purpose: the ec-producer --events cases and the SUB / DEALER script they share.
/**
 * The ec-producer `--events` mode: EC-CONTRACT 10.1 (the PUB stream), 10.2 (replay and snapshot)
 * and 10.5 (admin evict) against a producer's events and replay endpoints, from raw ZeroMQ
 * sockets, every message decoded by the tester's own type-keeping MessagePack reader and checked
 * against the tables of the contract. Changes are driven through the producer's admin socket
 * (`encode` / `evict`, EC-CONTRACT 9.3 and 10.5) when `--admin` is given.
 */
import { randomUUID } from "node:crypto";
import { Dealer, Subscriber } from "zeromq";
import type { RunReport } from "../report.js";
import { makeReport } from "../report.js";
import type { CaseCheck, CaseDef, RunOptions } from "../runner.js";
import { runCases } from "../runner.js";
import type { Typed } from "./msgpack.js";
import { decodeTyped, mapEntries, mpFloat, mpMap, mpNestingBomb, mpStr, mpUint } from "./msgpack.js";

/** Options of the ec-producer `--events` mode. */
export interface EcEventsSuiteOptions {
  /** The producer's events PUB endpoint (`tcp://…`). */
  events: string;
  /** The producer's replay ROUTER endpoint. */
  replay: string;
  /** The producer's admin endpoint (drives encode / evict; without it those cases are INFORMATIONAL). */
  admin?: string;
  /** Its control endpoint and compatibility hash (the "pinned" evict case pins through a grant). */
  control?: string;
  /** compatibility_hash for the control request. */
  compatibilityHash?: string;
  /** An entry the producer holds ready since start (prepopulated). */
  mmHash?: string;
  /** Its cache size in blocks. */
  numBlocks?: number;
  /** Its block size (checks free_blocks against the blocks of a stored entry). */
  blockBytes?: number;
  /** Reply timeout (default 2000 ms); a dropped request is judged after min(timeout, 300 ms). */
  timeoutMs?: number;
}

/** EC-CONTRACT 10.1 / 10.2 numbers, from the contract text. */
const MAX_HASHES = 1024;
const MAX_BYTES = 65_280;
const MIN_RING = 4096;
const MAX_PEERS = 256;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const EVENT_KEYS = ["incarnation", "seq", "kind", "mm_hashes", "free_blocks", "num_blocks"];

/** One received message, checked. */
export interface Ev {
  /** Arrival time (ms, performance.now). */
  at: number;
  /** The message bytes. */
  bytes: Uint8Array;
  /** Its entries. */
  m: Map<string, Typed>;
  incarnation: string;
  seq: number;
  kind: string;
  hashes: string[];
  free: number;
  num: number;
  hb: number;
  requestId: string | null;
  page: number;
  more: boolean | null;
  /** Departures from the tables of 10.1 / 10.2 (empty when it conforms). */
  problems: string[];
}

function flatProblems(m: Map<string, Typed>): string[] {
  const p: string[] = [];
  for (const [k, v] of m) {
    if (v.t === "map" || v.t === "ext") p.push(`${k} is a ${v.t} (the map is flat)`);
    if (v.t === "array" && k !== "mm_hashes") p.push(`${k} is an array (the only array is mm_hashes)`);
  }
  return p;
}

/** Decodes and checks one message against 10.1 (an event) or 10.2 (a page, an end). */
export function checkMessage(bytes: Uint8Array, frames = 1): Ev {
  const ev: Ev = {
    at: performance.now(),
    bytes,
    m: new Map(),
    incarnation: "",
    seq: -1,
    kind: "",
    hashes: [],
    free: -1,
    num: -1,
    hb: -1,
    requestId: null,
    page: -1,
    more: null,
    problems: [],
  };
  const p = ev.problems;
  if (frames !== 1) p.push(`${frames} frames (single-frame, no topic prefix)`);
  let v: Typed;
  try {
    v = decodeTyped(bytes, 2);
  } catch (e) {
    p.push(`not one MessagePack value: ${(e as Error).message}`);
    return ev;
  }
  const m = mapEntries(v);
  if (m === null) {
    p.push(`a ${v.t}, not a map of string keys`);
    return ev;
  }
  ev.m = m;
  p.push(...flatProblems(m));
  const s = (k: string) => {
    const x = m.get(k);
    if (x === undefined) p.push(`key ${k} missing`);
    else if (x.t !== "str") p.push(`${k} is ${x.t}, not str`);
    return x?.t === "str" ? x.v : "";
  };
  const i = (k: string, need = true) => {
    const x = m.get(k);
    if (x === undefined) {
      if (need) p.push(`key ${k} missing`);
      return -1;
    }
    if (x.t !== "int") p.push(`${k} is ${x.t}, not int`);
    else if (x.v < 0) p.push(`${k} ${x.v} is negative`);
    return x.t === "int" ? x.v : -1;
  };
  ev.kind = s("kind");
  ev.incarnation = s("incarnation");
  if (!UUID.test(ev.incarnation))
    p.push(`incarnation ${JSON.stringify(ev.incarnation)} is not a lowercase UUID`);
  ev.seq = i("seq");
  if (ev.seq >= 2 ** 53) p.push(`seq ${ev.seq} not below 2^53`);
  if (m.has("request_id")) ev.requestId = s("request_id");
  if (ev.kind === "end") {
    ev.hb = i("heartbeat_ms");
    if (ev.requestId === null) p.push("key request_id missing");
    return ev;
  }
  const hs = m.get("mm_hashes");
  if (hs === undefined) p.push("key mm_hashes missing");
  else if (hs.t !== "array") p.push(`mm_hashes is ${hs.t}, not an array`);
  else {
    for (const h of hs.v) {
      if (h.t !== "str") p.push(`an mm_hashes element is ${h.t}, not str`);
      else ev.hashes.push(h.v);
    }
    if (hs.v.length > MAX_HASHES) p.push(`${hs.v.length} hashes (at most ${MAX_HASHES})`);
  }
  ev.free = i("free_blocks");
  ev.num = i("num_blocks");
  if (ev.free > ev.num && ev.num >= 0) p.push(`free_blocks ${ev.free} > num_blocks ${ev.num}`);
  if (ev.seq === 0) p.push("seq 0 (seq starts at 1)");
  if (ev.kind === "hello") {
    ev.hb = i("heartbeat_ms");
    if (!(ev.hb > 0)) p.push(`heartbeat_ms ${ev.hb} is not positive`);
    if (ev.hashes.length !== 0) p.push("a hello with hashes");
  }
  if (ev.kind === "snapshot") {
    ev.page = i("page");
    const mo = m.get("more");
    if (mo?.t !== "bool") p.push(`more is ${mo?.t ?? "missing"}, not bool`);
    else ev.more = mo.v;
    if (ev.requestId === null) p.push("key request_id missing");
  }
  // A published message is at most 65,280 bytes; a replayed copy adds at most the request_id pair.
  const limit = ev.requestId !== null && ev.kind !== "snapshot" ? 64 * 1024 : MAX_BYTES;
  if (bytes.length > limit) p.push(`${bytes.length} bytes (at most ${limit})`);
  return ev;
}

/** An answer to a replay request. */
export interface Answer {
  /** Every reply carrying the request's id, in arrival order (the end last when complete). */
  msgs: Ev[];
  /** The end, when it came. */
  end: Ev | null;
}

/** Context of the --events cases: one SUB for the whole run, DEALERs per case. */
export class EcEventsCtx {
  readonly opts: EcEventsSuiteOptions;
  readonly timeoutMs: number;
  readonly dropMs: number;
  /** Every live message of the run, in arrival order. */
  readonly live: Ev[] = [];
  /** Replay DEALERs that sent well-formed requests, with the time of their last one (10.2 peers). */
  readonly peers = new Map<Dealer, number>();
  private sub: Subscriber | null = null;
  private waiters: (() => void)[] = [];
  private dealers: Dealer[] = [];
  private adminSock: Dealer | null = null;
  private adminQueue: Promise<unknown> = Promise.resolve();

  constructor(opts: EcEventsSuiteOptions) {
    this.opts = opts;
    this.timeoutMs = opts.timeoutMs ?? 2000;
    this.dropMs = Math.min(this.timeoutMs, 300);
  }

  /** Subscribes to everything on the events endpoint. */
  start(): void {
    const sub = new Subscriber({ linger: 0, receiveHighWaterMark: 0 });
    sub.subscribe();
    sub.connect(this.opts.events);
    this.sub = sub;
    void (async () => {
      try {
        for await (const frames of sub) {
          this.live.push(checkMessage(frames[0] ?? new Uint8Array(0), frames.length));
          const w = this.waiters.splice(0);
          for (const f of w) f();
        }
      } catch {
        // closed
      }
    })();
  }

  /** The incarnation of the live stream so far ("" before any message). */
  get incarnation(): string {
    return this.live.at(-1)?.incarnation ?? "";
  }

  /** Waits for a live message at index >= `from` matching `pred`. */
  async waitLive(pred: (e: Ev) => boolean, from: number, timeoutMs: number): Promise<Ev | null> {
    const end = performance.now() + timeoutMs;
    for (let i = from; ; ) {
      while (i < this.live.length) {
        const e = this.live[i++]!;
        if (pred(e)) return e;
      }
      const left = end - performance.now();
      if (left <= 0) return null;
      await new Promise<void>((r) => {
        const t = setTimeout(r, left);
        this.waiters.push(() => {
          clearTimeout(t);
          r();
        });
      });
    }
  }

  /** Waits for the next hello (after index `from`), within three heartbeats. */
  async nextHello(from = this.live.length): Promise<Ev | null> {
    const hb = this.live.findLast((e) => e.kind === "hello")?.hb ?? 2000;
    return this.waitLive((e) => e.kind === "hello", from, 3 * hb + this.timeoutMs);
  }

  /** A new replay DEALER (a new peer). */
  dealer(): Dealer {
    const d = new Dealer({ linger: 0, receiveHighWaterMark: 0 });
    d.connect(this.opts.replay);
    this.dealers.push(d);
    return d;
  }

  /** A request map from raw values (`over` replaces or removes keys). */
  req(
    requestId: string,
    incarnation: string,
    since: number,
    over: Record<string, Uint8Array | null> = {},
  ): Uint8Array {
    const base: Record<string, Uint8Array | null> = {
      request_id: mpStr(requestId),
      incarnation: mpStr(incarnation),
      since: mpUint(since),
      ...over,
    };
    return mpMap(Object.entries(base).filter((e): e is [string, Uint8Array] => e[1] !== null));
  }

  /** Sends a well-formed request and collects its answer until `end` (or the timeout). */
  async ask(incarnation: string, since: number, d = this.dealer(), delayMs = 0): Promise<Answer> {
    const id = randomUUID();
    this.peers.set(d, performance.now());
    await d.send(this.req(id, incarnation, since));
    if (delayMs > 0) await new Promise((r) => setTimeout(r, delayMs));
    return this.collect(d, id, this.timeoutMs);
  }

  /** Reads replies with `id` until an end; other ids are skipped. */
  async collect(d: Dealer, id: string | null, timeoutMs: number): Promise<Answer> {
    const out: Answer = { msgs: [], end: null };
    d.receiveTimeout = timeoutMs;
    for (;;) {
      let frames: Buffer[];
      try {
        frames = await d.receive();
      } catch {
        return out;
      }
      const e = checkMessage(frames[0] ?? new Uint8Array(0), frames.length);
      if (id !== null && e.requestId !== id) continue;
      out.msgs.push(e);
      if (e.kind === "end") {
        out.end = e;
        return out;
      }
    }
  }

  /** True when nothing comes back on `d` within the drop window. */
  async silent(d: Dealer): Promise<boolean> {
    const a = await this.collect(d, null, this.dropMs);
    return a.msgs.length === 0;
  }

  /** One admin request (answered in order). */
  admin(op: string, fields: Record<string, Uint8Array> = {}): Promise<Map<string, Typed> | null> {
    const run = async () => {
      if (this.adminSock === null) {
        this.adminSock = new Dealer({ linger: 0 });
        this.adminSock.connect(this.opts.admin!);
      }
      const s = this.adminSock;
      await s.send(mpMap([["op", mpStr(op)], ...Object.entries(fields)]));
      s.receiveTimeout = this.timeoutMs * 5;
      try {
        const [f] = await s.receive();
        return mapEntries(decodeTyped(f!, 8));
      } catch {
        return null;
      }
    };
    const p = this.adminQueue.then(run, run);
    this.adminQueue = p;
    return p;
  }

  /** Sends many admin requests without waiting, then reads as many replies (one step's worth of changes). */
  async adminBatch(reqs: [string, Record<string, Uint8Array>][]): Promise<(string | null)[]> {
    const d = new Dealer({ linger: 0, sendHighWaterMark: 0, receiveHighWaterMark: 0 });
    d.connect(this.opts.admin!);
    this.dealers.push(d);
    const msgs = reqs.map(([op, f]) => mpMap([["op", mpStr(op)], ...Object.entries(f)]));
    const sending = (async () => {
      for (const m of msgs) await d.send(m);
    })();
    const out: (string | null)[] = [];
    d.receiveTimeout = this.timeoutMs * 10;
    try {
      for (let i = 0; i < reqs.length; i++) {
        const [f] = await d.receive();
        const r = mapEntries(decodeTyped(f!, 8))?.get("result");
        out.push(r?.t === "str" ? r.v : null);
      }
    } catch {
      // a missing reply shows as a short list
    }
    await sending;
    return out;
  }

  needAdmin(t: CaseCheck): void {
    if (this.opts.admin === undefined) t.info("the producer's admin endpoint (--admin)", "not given");
  }

  closeCase(): void {
    for (const d of this.dealers) d.close();
    this.dealers = [];
  }

  close(): void {
    this.closeCase();
    this.sub?.close();
    this.adminSock?.close();
  }
}

type E = CaseDef<EcEventsCtx>;

const C101 =
  'EC-CONTRACT 10.1: one MessagePack map per message: single-frame, no topic prefix, at most 65,280 bytes, flat (the only array is mm_hashes, of strings); every event map has {"incarnation": str, "seq": int, "kind": str, "mm_hashes": [str], "free_blocks": int, "num_blocks": int}; incarnation is a UUID (lowercase, 8-4-4-4-12).';
const C102 =
  "EC-CONTRACT 10.2: when incarnation is the producer's and messages since + 1 .. are all still in its ring (at least the last 4,096 messages), the answer is those messages in order, each as published plus request_id; either answer ends with {kind: end, request_id, incarnation, seq, heartbeat_ms}.";
const C102S =
  'EC-CONTRACT 10.2: otherwise the answer is a snapshot: pages {"kind": "snapshot", "request_id", "incarnation", "seq", "page": int, "more": bool, "mm_hashes": [str], "free_blocks", "num_blocks"}, numbered from 0, every page with the same seq (the last published message), each page within the limits of 10.1, the last with more: false.';
const C102M =
  "EC-CONTRACT 10.2: the request is decoded as in 3 (unknown keys ignored; malformed, a negative since included: dropped unanswered, counted); request_id at most 64 bytes.";

const hex = (s: string) => Buffer.from(s).toString("hex").slice(0, 16);
const tag = () => `conf-${randomUUID().slice(0, 8)}`;

/** Flattened (kind:hash) of stored/evicted messages. */
function flat(evs: readonly Ev[]): string[] {
  const out: string[] = [];
  for (const e of evs)
    if (e.kind === "stored" || e.kind === "evicted") for (const h of e.hashes) out.push(`${e.kind}:${h}`);
  return out;
}

function problemsOf(evs: readonly Ev[]): string {
  const bad = evs.find((e) => e.problems.length > 0);
  return bad === undefined ? "" : `seq ${bad.seq} (${bad.kind}): ${bad.problems.join("; ")}`;
}

/** Checks a whole answer: every reply keyed by the id, the end last, replay in order or snapshot pages. */
function checkAnswer(t: CaseCheck, a: Answer, since: number): "replay" | "snapshot" {
  t.must(a.end !== null, "an answer closed by an end", () => `${a.msgs.length} messages and no end`);
  const end = a.end!;
  t.must(problemsOf(a.msgs) === "", "every reply within the tables of 10.1 / 10.2", () => problemsOf(a.msgs));
  const body = a.msgs.slice(0, -1);
  if (body.some((e) => e.kind === "snapshot")) {
    t.must(
      body.every((e) => e.kind === "snapshot"),
      "a snapshot answer holds only pages before its end",
      () => body.map((e) => e.kind).join(","),
    );
    for (const [i, e] of body.entries()) {
      t.must(e.page === i, `page ${i} (pages numbered from 0, in order)`, String(e.page));
      t.must(e.seq === end.seq, `every page with the end's seq ${end.seq}`, String(e.seq));
      t.must(e.incarnation === end.incarnation, "every page of the end's incarnation", e.incarnation);
      t.must(e.more === i < body.length - 1, `more ${i < body.length - 1} on page ${i}`, String(e.more));
    }
    return "snapshot";
  }
  for (const [i, e] of body.entries()) {
    t.must(e.seq === since + 1 + i, `replayed seq ${since + 1 + i} (messages since + 1 .. in order)`, () =>
      body.map((x) => x.seq).join(","),
    );
  }
  t.must(
    since + body.length === end.seq,
    `the replay reaches the end's seq ${end.seq}`,
    () => `${body.length} messages after since ${since}`,
  );
  return "replay";
}

function setOfSnapshot(a: Answer): Set<string> {
  const s = new Set<string>();
  for (const e of a.msgs) if (e.kind === "snapshot") for (const h of e.hashes) s.add(h);
  return s;
}

function applyLog(evs: readonly Ev[]): Set<string> {
  const s = new Set<string>();
  for (const e of evs) {
    if (e.kind === "stored") for (const h of e.hashes) s.add(h);
    if (e.kind === "evicted") for (const h of e.hashes) s.delete(h);
  }
  return s;
}

const str = (x: string) => mpStr(x);

const EVENT_CASES: E[] = [
  {
    id: "10.1.1",
    title:
      "a live message is one single-frame flat map with exactly the keys and types of 10.1; incarnation a lowercase UUID",
    cite: C101,
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const e = await ctx.waitLive(() => true, 0, 3 * 2000 + ctx.timeoutMs);
      t.must(
        e !== null,
        "a live message within three default heartbeats (a hello every heartbeat_ms)",
        "none",
      );
      t.must(e.problems.length === 0, "a message within the table of 10.1", () => e.problems.join("; "));
      const extra = [...e.m.keys()].filter((k) => !EVENT_KEYS.includes(k) && k !== "heartbeat_ms");
      if (extra.length > 0) t.note(`extra keys ${extra.join(", ")} (allowed: subscribers ignore them)`);
    },
  },
  {
    id: "10.1.2",
    title: "hellos carry heartbeat_ms and come every heartbeat_ms whether or not anything changed",
    cite: 'EC-CONTRACT 10.1: "hello": no hashes, with one more key "heartbeat_ms": int; sent as seq 1 at start and then every heartbeat_ms (default 2,000), whether or not anything changed.',
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const a = await ctx.nextHello();
      t.must(a !== null, "a hello", "none within three heartbeats");
      // Three intervals, averaged: one late timer or a busy tester does not decide the case.
      let b: Ev = a;
      for (let i = 0; i < 3; i++) {
        const n = await ctx.nextHello(ctx.live.indexOf(b) + 1);
        t.must(n !== null, `another hello within three heartbeats (${3 * a.hb} ms)`, "none");
        b = n;
      }
      const gap = (b.at - a.at) / 3;
      t.must(
        gap >= a.hb * 0.5,
        `hellos about heartbeat_ms ${a.hb} apart (mean of three), not much sooner`,
        `${gap.toFixed(0)} ms`,
      );
      t.should(
        gap <= a.hb * 2,
        `hellos about heartbeat_ms ${a.hb} apart (mean of three)`,
        `${gap.toFixed(0)} ms`,
      );
      t.must(b.hb === a.hb, "the same heartbeat_ms in every hello", `${a.hb} then ${b.hb}`);
    },
  },
  {
    id: "10.1.4",
    title: "an admin encode of a new mm_hash publishes it as stored; free_blocks right after the change",
    cite: "EC-CONTRACT 10.1: \"stored\": these entries became ready; free_blocks is the cache's free count right after the message's last change.",
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      ctx.needAdmin(t);
      const h = tag();
      const from = ctx.live.length;
      const before = ctx.live.at(-1);
      const r = await ctx.admin("encode", { mm_hash: str(h), nbytes: mpUint(3000) });
      t.must(r?.get("result")?.t === "str", "an admin encode result", "no reply");
      const e = await ctx.waitLive((x) => x.kind === "stored" && x.hashes.includes(h), from, 3 * 2000);
      t.must(e !== null, `a stored message naming ${h}`, "none");
      const bb = ctx.opts.blockBytes;
      const only = ctx.live.slice(from, ctx.live.indexOf(e) + 1).filter((x) => x.kind !== "hello");
      if (bb !== undefined && before !== undefined && only.length === 1 && e.hashes.length === 1) {
        const need = Math.ceil(3000 / bb);
        t.must(
          before.free - e.free === need,
          `free_blocks down by ${need} blocks`,
          `${before.free} → ${e.free}`,
        );
      } else t.note("free_blocks arithmetic not checked (no --block-bytes or other changes in between)");
    },
  },
  {
    id: "10.1.5",
    title: "re-encoding a ready entry publishes nothing",
    cite: "EC-CONTRACT 10.1: re-encoding an entry that is already ready publishes nothing.",
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      ctx.needAdmin(t);
      const h = tag();
      await ctx.admin("encode", { mm_hash: str(h), nbytes: mpUint(100) });
      const first = await ctx.waitLive((x) => x.kind === "stored" && x.hashes.includes(h), 0, 6000);
      t.must(first !== null, `a stored message naming ${h}`, "none");
      const from = ctx.live.length;
      await ctx.admin("encode", { mm_hash: str(h), nbytes: mpUint(100) });
      const hello = await ctx.nextHello(from);
      t.must(hello !== null, "the next hello", "none");
      const again = ctx.live.slice(from).filter((x) => x.hashes.includes(h));
      t.must(again.length === 0, `no message naming ${h} again`, () =>
        again.map((x) => `${x.kind}@${x.seq}`).join(","),
      );
    },
  },
  {
    id: "10.1.6",
    title: "an admin evict publishes evicted; evicting a missing entry publishes nothing",
    cite: 'EC-CONTRACT 10.1: "evicted": these entries left the cache, for any reason (eviction to make room, admin evict).',
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      ctx.needAdmin(t);
      const h = tag();
      await ctx.admin("encode", { mm_hash: str(h), nbytes: mpUint(100) });
      await ctx.waitLive((x) => x.kind === "stored" && x.hashes.includes(h), 0, 6000);
      const from = ctx.live.length;
      const r = await ctx.admin("evict", { mm_hash: str(h) });
      const res = r?.get("result");
      t.must(res?.t === "str" && res.v === "evicted", 'admin evict → "evicted"', () => JSON.stringify(res));
      const e = await ctx.waitLive((x) => x.kind === "evicted" && x.hashes.includes(h), from, 6000);
      t.must(e !== null, `an evicted message naming ${h}`, "none");
      const from2 = ctx.live.length;
      const r2 = await ctx.admin("evict", { mm_hash: str(h) });
      const res2 = r2?.get("result");
      t.must(res2?.t === "str" && res2.v === "missing", 'a second evict → "missing"', () =>
        JSON.stringify(res2),
      );
      await ctx.nextHello(from2);
      t.must(
        !ctx.live.slice(from2).some((x) => x.hashes.includes(h)),
        "no event for the missing entry",
        "one",
      );
    },
  },
  {
    id: "10.1.7",
    title: "changes are published in the order they happened; a change and its reversal are both published",
    cite: "EC-CONTRACT 10.1: changes are published within one poll_step of happening, in the order they happened; a change and its reversal within one step are both published (the stream is a log, never a diff).",
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      ctx.needAdmin(t);
      const [a, b] = [tag(), tag()];
      const from = ctx.live.length;
      const res = await ctx.adminBatch([
        ["encode", { mm_hash: str(a), nbytes: mpUint(100) }],
        ["encode", { mm_hash: str(b), nbytes: mpUint(100) }],
        ["evict", { mm_hash: str(a) }],
        ["encode", { mm_hash: str(a), nbytes: mpUint(100) }],
        ["evict", { mm_hash: str(b) }],
      ]);
      t.must(res.join(",") === "ready,ready,evicted,ready,evicted", "the five admin results", res.join(","));
      const want = [`stored:${a}`, `stored:${b}`, `evicted:${a}`, `stored:${a}`, `evicted:${b}`];
      const done = await ctx.waitLive(
        () => flat(ctx.live.slice(from)).filter((x) => x.endsWith(a) || x.endsWith(b)).length >= 5,
        from,
        6000,
      );
      const got = flat(ctx.live.slice(from)).filter((x) => x.endsWith(a) || x.endsWith(b));
      t.must(done !== null && got.join(" ") === want.join(" "), want.join(" "), got.join(" "));
    },
  },
  {
    id: "10.1.8",
    title:
      "1,300 changes at once (1,000 short and 300 of 250-byte hashes): split over consecutive messages of at most 1,024 hashes and 65,280 bytes",
    cite: "EC-CONTRACT 10.1: a message carries at most 1,024 hashes and never passes that size: longer lists are split over consecutive messages.",
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      ctx.needAdmin(t);
      const nb = ctx.opts.numBlocks;
      if (nb === undefined || nb < 1400)
        t.info("a cache of at least 1,400 blocks (--num-blocks)", String(nb ?? "not given"));
      const base = tag();
      const hs = [
        ...Array.from({ length: 1000 }, (_, i) => `${base}-${i}`),
        ...Array.from({ length: 300 }, (_, i) => `${base}-${i}-${"x".repeat(250 - base.length - 8)}`),
      ];
      const from = ctx.live.length;
      const res = await ctx.adminBatch(hs.map((h) => ["encode", { mm_hash: str(h), nbytes: mpUint(1) }]));
      t.must(
        res.length === hs.length && res.every((r) => r === "ready"),
        "1,300 ready",
        () => `${res.filter((r) => r === "ready").length} ready`,
      );
      const mine = (x: Ev) => x.hashes.some((h) => h.startsWith(base));
      await ctx.waitLive(() => flat(ctx.live.slice(from).filter(mine)).length >= hs.length, from, 10_000);
      const evs = ctx.live.slice(from).filter(mine);
      t.must(problemsOf(evs) === "", "every message within the limits", () => problemsOf(evs));
      const got = flat(evs);
      t.must(
        got.join("\n") === hs.map((h) => `stored:${h}`).join("\n"),
        "every change once, in order",
        `${got.length} changes`,
      );
      const maxH = Math.max(...evs.map((e) => e.hashes.length));
      const maxB = Math.max(...evs.map((e) => e.bytes.length));
      t.note(`${evs.length} messages, at most ${maxH} hashes and ${maxB} bytes`);
      const res2 = await ctx.adminBatch(hs.map((h) => ["evict", { mm_hash: str(h) }]));
      t.must(
        res2.every((r) => r === "evicted"),
        "1,300 evicted",
        () => `${res2.filter((r) => r === "evicted").length}`,
      );
    },
  },
  {
    id: "10.1.9",
    title: "seq 1 is the hello; entries held at start (prepopulated) are published as stored after it",
    cite: 'EC-CONTRACT 10.1: a new incarnation starts empty in its subscribers\' eyes: entries it holds at start (prepopulated) are published as "stored" after its first hello.',
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const inc = ctx.incarnation;
      t.must(inc !== "", "a live message (the incarnation)", "none");
      const a = await ctx.ask(inc, 0);
      if (a.msgs[0]?.kind === "snapshot") t.info("a ring still holding seq 1", "a snapshot answer");
      const kind = checkAnswer(t, a, 0);
      t.must(kind === "replay", "a replay from seq 1", kind);
      t.must(a.msgs[0]?.kind === "hello", "seq 1 is a hello", a.msgs[0]?.kind ?? "nothing");
      const h = ctx.opts.mmHash;
      if (h === undefined) {
        t.note("no --mm-hash: the prepopulated entry not checked");
        return;
      }
      const at = a.msgs.findIndex((e) => e.kind === "stored" && e.hashes.includes(h));
      t.must(at > 0, `the prepopulated ${h} stored after the first hello`, "not in the log");
    },
  },
  {
    id: "10.1.10",
    title: "a replayed message is the live one plus request_id",
    cite: "EC-CONTRACT 10.1: every message, hellos included, is kept for replay (10.2); 10.2: each as published plus request_id.",
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      await ctx.nextHello();
      const lastLive = ctx.live.slice(-10);
      const first = lastLive[0]!;
      const a = await ctx.ask(first.incarnation, first.seq - 1);
      checkAnswer(t, a, first.seq - 1);
      for (const e of lastLive) {
        const r = a.msgs.find((x) => x.seq === e.seq);
        t.must(r !== undefined, `seq ${e.seq} in the replay`, "missing");
        const pick = (m: Map<string, Typed>) =>
          JSON.stringify([...m].filter(([k]) => k !== "request_id").sort(([x], [y]) => (x < y ? -1 : 1)));
        t.must(
          pick(r.m) === pick(e.m),
          `seq ${e.seq} replayed as published`,
          () => `${pick(r.m)} vs ${pick(e.m)}`,
        );
      }
    },
  },
  {
    id: "10.1.11",
    title:
      "num_blocks the same in every message (and --num-blocks when given); 0 <= free_blocks <= num_blocks",
    cite: C101,
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const evs = ctx.live.filter((e) => e.num >= 0);
      t.must(evs.length > 0, "live messages", "none");
      const nums = new Set(evs.map((e) => e.num));
      t.must(nums.size === 1, "one num_blocks", [...nums].join(","));
      const nb = ctx.opts.numBlocks;
      if (nb !== undefined) t.must(nums.has(nb), `num_blocks ${nb}`, [...nums].join(","));
      t.must(
        evs.every((e) => e.free >= 0 && e.free <= e.num),
        "free_blocks within [0, num_blocks]",
        "out of range",
      );
    },
  },
  {
    id: "10.1.3",
    title: "over the whole run: seq grows by exactly 1 per message of an incarnation, in arrival order",
    cite: "EC-CONTRACT 10.1: seq starts at 1 and grows by exactly 1 per message of that incarnation (below 2^53).",
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const evs = ctx.live.filter((e) => e.seq >= 0);
      t.must(evs.length >= 3, "live messages", String(evs.length));
      for (let i = 1; i < evs.length; i++) {
        const [a, b] = [evs[i - 1]!, evs[i]!];
        if (a.incarnation !== b.incarnation) continue;
        t.must(b.seq === a.seq + 1, `seq ${a.seq + 1} after ${a.seq}`, () => `${b.seq} (${b.kind})`);
      }
      t.note(`${evs.length} live messages checked`);
    },
  },
];

const REPLAY_CASES: E[] = [
  {
    id: "10.2.1",
    title:
      "an up-to-date subscriber (since = the last seq) gets the end alone (or only what was published meanwhile)",
    cite: `${C102} An up-to-date subscriber gets this alone.`,
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const h = await ctx.nextHello();
      t.must(h !== null, "a hello", "none");
      const a = await ctx.ask(h.incarnation, h.seq);
      checkAnswer(t, a, h.seq);
      t.must(
        a.end!.incarnation === h.incarnation,
        "the end names the producer's incarnation",
        a.end!.incarnation,
      );
      t.must(a.end!.hb === h.hb, `the end's heartbeat_ms ${h.hb}`, String(a.end!.hb));
    },
  },
  {
    id: "10.2.2",
    title:
      "since = last - 50 (or 1) of this incarnation: exactly messages since + 1 .. in order, then the end",
    cite: C102,
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const h = await ctx.nextHello();
      t.must(h !== null && h.seq > 2, "a hello after two messages", String(h?.seq));
      const since = Math.max(1, h.seq - 50);
      const a = await ctx.ask(h.incarnation, since);
      t.must(checkAnswer(t, a, since) === "replay", "a replay", "a snapshot");
    },
  },
  {
    id: "10.2.3",
    title: "another incarnation → a snapshot whose set equals the log replayed from seq 1",
    cite: C102S,
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const inc = ctx.incarnation;
      const snap = await ctx.ask(randomUUID(), 5);
      t.must(checkAnswer(t, snap, 5) === "snapshot", "a snapshot", "a replay");
      const log = await ctx.ask(inc, 0);
      if (log.msgs[0]?.kind !== "hello" || log.end === null) {
        t.note("the ring no longer holds seq 1: the set is not cross-checked");
        return;
      }
      checkAnswer(t, log, 0);
      const atSnap = log.msgs.filter((e) => e.seq <= snap.end!.seq);
      const want = applyLog(atSnap);
      const got = setOfSnapshot(snap);
      const miss = [...want].filter((x) => !got.has(x)).length;
      const extra = [...got].filter((x) => !want.has(x)).length;
      t.must(
        miss === 0 && extra === 0,
        `the snapshot set (${want.size} entries) as of seq ${snap.end!.seq}`,
        `${miss} missing, ${extra} extra`,
      );
    },
  },
  {
    id: "10.2.4",
    title: 'no view (incarnation "", since 0) → a snapshot',
    cite: `${C102S} ("0 and \\"\\" when it has no view")`,
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const a = await ctx.ask("", 0);
      t.must(checkAnswer(t, a, 0) === "snapshot", "a snapshot", "a replay");
      const pages = a.msgs.length - 1;
      t.note(`${pages} page(s), ${setOfSnapshot(a).size} entries`);
    },
  },
  {
    id: "10.2.5",
    title: "since past the last published seq → a snapshot",
    cite: `${C102S} (a since past the last published seq included)`,
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const a = await ctx.ask(ctx.incarnation, 2 ** 31);
      t.must(checkAnswer(t, a, 2 ** 31) === "snapshot", "a snapshot", "a replay");
    },
  },
  {
    id: "10.2.6",
    title:
      "after 4,200 more messages: since = last - 4,096 is replayed whole even when read late (the ring and the send queue); since = 1 is never a partial replay",
    cite: `${C102} The producer's replay socket holds one whole answer per peer in its send queue.`,
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      ctx.needAdmin(t);
      const h = tag();
      const ops: [string, Record<string, Uint8Array>][] = [];
      for (let i = 0; i < 2100; i++)
        ops.push(["encode", { mm_hash: str(h), nbytes: mpUint(1) }], ["evict", { mm_hash: str(h) }]);
      const res = await ctx.adminBatch(ops);
      t.must(res.length === ops.length, `${ops.length} admin replies`, String(res.length));
      const hello = await ctx.nextHello();
      t.must(
        hello !== null && hello.seq > MIN_RING + 10,
        `more than ${MIN_RING} messages`,
        String(hello?.seq),
      );
      const since = hello.seq - MIN_RING;
      const a = await ctx.ask(hello.incarnation, since, ctx.dealer(), 500);
      t.must(
        checkAnswer(t, a, since) === "replay",
        `a replay of the last ${MIN_RING} messages`,
        "a snapshot",
      );
      const old = await ctx.ask(hello.incarnation, 1);
      const kind = checkAnswer(t, old, 1);
      if (kind === "replay") t.note("the ring holds every message since seq 2 (a ring larger than 4,096)");
    },
  },
  {
    id: "10.2.7",
    title:
      "snapshot pages stay within 1,024 hashes and 65,280 bytes (a set of 1,200 entries, 200 of 250 bytes)",
    cite: C102S,
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      ctx.needAdmin(t);
      const nb = ctx.opts.numBlocks;
      if (nb === undefined || nb < 1300)
        t.info("a cache of at least 1,300 blocks (--num-blocks)", String(nb ?? "not given"));
      const base = tag();
      const hs = [
        ...Array.from({ length: 1000 }, (_, i) => `${base}-${i}`),
        ...Array.from({ length: 200 }, (_, i) => `${base}-${i}-${"y".repeat(250 - base.length - 8)}`),
      ];
      await ctx.adminBatch(hs.map((x) => ["encode", { mm_hash: str(x), nbytes: mpUint(1) }]));
      const a = await ctx.ask("", 0);
      t.must(checkAnswer(t, a, 0) === "snapshot", "a snapshot", "a replay");
      const got = setOfSnapshot(a);
      t.must(
        hs.every((x) => got.has(x)),
        "every entry in the pages",
        `${hs.filter((x) => got.has(x)).length} of ${hs.length}`,
      );
      t.must(a.msgs.length - 1 >= 2, "more than one page", String(a.msgs.length - 1));
      await ctx.adminBatch(hs.map((x) => ["evict", { mm_hash: str(x) }]));
    },
  },
  ...(
    [
      ["10.2.8", "not MessagePack", () => Uint8Array.of(0xc1, 0x00)],
      ["10.2.9", "not a map (an array)", () => Uint8Array.of(0x93, 1, 2, 3)],
      ["10.2.10", "since missing", (c: EcEventsCtx) => c.req("a", "", 0, { since: null })],
      ["10.2.11", "since -1", (c: EcEventsCtx) => c.req("a", "", 0, { since: Uint8Array.of(0xff) })],
      ["10.2.12", "since 2.0 (a float)", (c: EcEventsCtx) => c.req("a", "", 0, { since: mpFloat(2) })],
      [
        "10.2.13",
        "since true (a boolean)",
        (c: EcEventsCtx) => c.req("a", "", 0, { since: Uint8Array.of(0xc3) }),
      ],
      ["10.2.14", "request_id of 65 bytes", (c: EcEventsCtx) => c.req("r".repeat(65), "", 0)],
      [
        "10.2.15",
        "incarnation an integer",
        (c: EcEventsCtx) => c.req("a", "", 0, { incarnation: mpUint(7) }),
      ],
      ["10.2.16", "a nested map", (c: EcEventsCtx) => c.req("a", "", 0, { x: mpMap([["y", mpUint(1)]]) })],
      [
        "10.2.17",
        "a nesting bomb (60 KiB)",
        () => {
          const b = new Uint8Array(60 * 1024);
          b.set([0x81, 0xa1, 0x61], 0);
          b.set(mpNestingBomb(60 * 1024 - 4), 3);
          return b;
        },
      ],
      [
        "10.2.18",
        "a declared string length past the end",
        () => Uint8Array.of(0x81, 0xaa, ...Buffer.from("request_id"), 0xdb, 0x7f, 0xff, 0xff, 0xff),
      ],
      ["10.2.19", "two frames", (c: EcEventsCtx) => [c.req("a", "", 0), c.req("b", "", 0)]],
      [
        "10.2.20",
        "over 64 KiB",
        (c: EcEventsCtx) => {
          const big = Buffer.alloc(5 + 70_000, 0x78);
          big[0] = 0xdb; // str32: a string of 70,000 bytes
          big.writeUInt32BE(70_000, 1);
          return c.req("a", "", 0, { incarnation: new Uint8Array(big) });
        },
      ],
    ] as [string, string, (c: EcEventsCtx) => Uint8Array | Uint8Array[]][]
  ).map(
    ([id, what, build]): E => ({
      id,
      title: `a request that is ${what}: dropped unanswered; the producer answers a proper one after`,
      cite: `${C102M} EC-CONTRACT 9.1: messages are bounded as in 9.1.`,
      async run(ctx: EcEventsCtx, t: CaseCheck) {
        const d = ctx.dealer();
        const m = build(ctx);
        await d.send(Array.isArray(m) ? m : [m]);
        t.must(await ctx.silent(d), "no reply", "a reply");
        const ok = await ctx.ask("", 0, id === "10.2.20" ? ctx.dealer() : d);
        t.must(ok.end !== null, "a proper request answered after it", "no end");
      },
    }),
  ),
  {
    id: "10.2.21",
    title: "unknown extra keys in a request are ignored: answered; every reply carries the request_id",
    cite: "EC-CONTRACT 10.2: the request is decoded as in 3 (unknown keys ignored); every reply map carries the request's request_id.",
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const d = ctx.dealer();
      const id = `x-${hex(randomUUID())}`;
      ctx.peers.set(d, performance.now());
      await d.send(ctx.req(id, "", 0, { later_field: mpStr("v"), another: mpUint(3) }));
      const a = await ctx.collect(d, null, ctx.timeoutMs);
      t.must(a.end !== null, "an answer with an end", "none");
      t.must(
        a.msgs.every((e) => e.requestId === id),
        `request_id ${id} on every reply`,
        () => a.msgs.map((e) => e.requestId).join(","),
      );
    },
  },
  {
    id: "10.5.1",
    title:
      'admin evict answers {op: evict, mm_hash, result}: "evicted", "missing", and "pinned" for an entry a grant pins',
    cite: 'EC-CONTRACT 10.5: the admin socket (9.3) takes {"op": "evict", "mm_hash": str} and answers {"op": "evict", "mm_hash", "result": "evicted" | "missing" | "pinned"} (a pinned entry is not evicted).',
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      ctx.needAdmin(t);
      const h = tag();
      await ctx.admin("encode", { mm_hash: str(h), nbytes: mpUint(100) });
      const r = await ctx.admin("evict", { mm_hash: str(h) });
      const keys = r === null ? "no reply" : [...r.keys()].sort().join(",");
      t.must(keys === "mm_hash,op,result", "exactly op, mm_hash, result", keys);
      t.must(r?.get("op")?.t === "str" && (r.get("op") as { v: string }).v === "evict", "op evict", "other");
      const m = r?.get("mm_hash");
      t.must(m?.t === "str" && m.v === h, `mm_hash ${h} echoed`, JSON.stringify(m));
      const miss = (await ctx.admin("evict", { mm_hash: str(h) }))?.get("result");
      t.must(miss?.t === "str" && miss.v === "missing", "missing", JSON.stringify(miss));
      const { control, compatibilityHash, mmHash } = ctx.opts;
      if (control === undefined || compatibilityHash === undefined || mmHash === undefined) {
        t.note("pinned not checked (needs the control endpoint, --compatibility-hash and --mm-hash)");
        return;
      }
      const c = new Dealer({ linger: 0, receiveTimeout: ctx.timeoutMs });
      c.connect(control);
      try {
        await c.send(
          mpMap([
            ["mm_hash", mpStr(mmHash)],
            ["compatibility_hash", mpStr(compatibilityHash)],
            ["session_id", mpStr(randomUUID())],
            ["connector_version", mpUint(2)],
          ]),
        );
        const [ack] = await c.receive();
        const st = mapEntries(decodeTyped(ack!, 8))?.get("status");
        t.must(st?.t === "int" && st.v === 0, "an OK grant (the entry pinned)", JSON.stringify(st));
        const p = (await ctx.admin("evict", { mm_hash: str(mmHash) }))?.get("result");
        t.must(p?.t === "str" && p.v === "pinned", "pinned (not evicted)", JSON.stringify(p));
      } finally {
        c.close();
      }
    },
  },
  {
    id: "10.2.22",
    title: `beyond ${MAX_PEERS} peers within 30 s, requests of new peers are dropped; a known peer is still answered (runs last)`,
    cite: "EC-CONTRACT 10.2: a peer is a routing id that sent a well-formed request within the last 30 s; beyond 256 of them, requests of new peers are dropped and counted.",
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const now = performance.now();
      const recent = [...ctx.peers.values()].filter((at) => now - at < 30_000).length;
      const n = MAX_PEERS - recent + 20;
      const ds = Array.from({ length: n }, () => ctx.dealer());
      const ok = await Promise.all(ds.map((d) => ctx.ask("", 1 << 30, d).then((a) => a.end !== null)));
      const answered = ok.filter(Boolean).length;
      t.must(
        answered <= MAX_PEERS - recent,
        `at most ${MAX_PEERS - recent} of ${n} new peers answered`,
        String(answered),
      );
      t.must(answered > 0, "new peers answered up to the cap", "none");
      const k = ds[ok.indexOf(true)] ?? ds[0]!;
      const again = await ctx.ask("", 1 << 30, k);
      t.must(again.end !== null, "a known peer still answered", "no end");
    },
  },
];

/** Every --events case, in run order. */
export const EC_EVENTS_CASES: readonly CaseDef<EcEventsCtx>[] = [...EVENT_CASES, ...REPLAY_CASES];

/** Runs the --events cases against `opts.events` / `opts.replay`. */
export async function runEcEventsSuite(opts: EcEventsSuiteOptions, run: RunOptions = {}): Promise<RunReport> {
  const started = new Date();
  const ctx = new EcEventsCtx(opts);
  ctx.start();
  try {
    const results = await runCases(EC_EVENTS_CASES, ctx, {
      caseTimeoutMs: 60_000,
      ...run,
      after: async () => ctx.closeCase(),
    });
    return makeReport(
      "ec-producer --events",
      opts.events,
      {
        replay: opts.replay,
        admin: opts.admin ?? "none",
        mm_hash: opts.mmHash ?? "none",
        num_blocks: opts.numBlocks ?? "unknown",
      },
      results,
      started,
    );
  } finally {
    ctx.close();
  }
}
