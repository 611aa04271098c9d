/**
 * The script of the ec-producer `--events` mode (its cases are in events.ts): EC-CONTRACT 10.1 (the PUB stream), 10.2 (replay and snapshot)
 * and 10.5 (admin evict) against a producer's events and replay endpoints, from raw ZeroMQ
 * sockets, every message decoded by the tester's own type-keeping MessagePack reader and checked
 * against the tables of the contract. Changes are driven through the producer's admin socket
 * (`encode` / `evict`, EC-CONTRACT 9.3 and 10.5) when `--admin` is given.
 */
import { randomUUID } from "node:crypto";
import { Dealer, Subscriber } from "zeromq";
import type { CaseCheck } from "../runner.js";
import type { Typed } from "./msgpack.js";
import { decodeTyped, mapEntries, mpMap, mpStr, mpUint } from "./msgpack.js";

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
/** Most hashes in one message (10.1). */
export const MAX_HASHES = 1024;
/** Most bytes of one published message (10.1). */
export const MAX_BYTES = 65_280;
/** Fewest messages a ring keeps (10.2). */
export const MIN_RING = 4096;
/** Most replay peers within 30 s (10.2). */
export const MAX_PEERS = 256;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
/** The keys every event map has (EC-CONTRACT 10.1). */
export const EVENT_KEYS = ["incarnation", "seq", "kind", "mm_hashes", "free_blocks", "num_blocks"];

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
    // At most WINDOW requests ahead of the replies: a producer's admin ROUTER may drop replies to
    // a peer that reads slower than it sends (ZeroMQ's send high-water mark, 1,000 by default).
    const WINDOW = 500;
    const out: (string | null)[] = [];
    let wake: (() => void) | null = null;
    let done = false;
    const sending = (async () => {
      for (const [i, m] of msgs.entries()) {
        while (!done && i - out.length >= WINDOW) await new Promise<void>((r) => (wake = r));
        if (done) break;
        await d.send(m);
      }
    })();
    d.receiveTimeout = this.timeoutMs * 10;
    try {
      for (let i = 0; i < reqs.length; i++) {
        const [f] = await d.receive();
        const r = mapEntries(decodeTyped(f!, 8))?.get("result");
        out.push(r?.t === "str" ? r.v : null);
        const w = wake as (() => void) | null;
        wake = null;
        w?.();
      }
    } catch {
      // a missing reply shows as a short list
    }
    done = true;
    (wake as (() => void) | null)?.();
    d.close();
    await sending.catch(() => undefined);
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

/** A short hex tag of a string. */
export const hex = (s: string): string => Buffer.from(s).toString("hex").slice(0, 16);
/** A fresh mm_hash for a case. */
export const tag = () => `conf-${randomUUID().slice(0, 8)}`;

/** Flattened (kind:hash) of stored/evicted messages. */
/** The (kind:hash) changes of stored/evicted messages, in order. */
export function flat(evs: readonly Ev[]): string[] {
  const out: string[] = [];
  for (const e of evs)
    if (e.kind === "stored" || e.kind === "evicted") for (const h of e.hashes) out.push(`${e.kind}:${h}`);
  return out;
}

/** The first message that departs from the tables, described ("" when none does). */
export function problemsOf(evs: readonly Ev[]): string {
  const bad = evs.find((e) => e.problems.length > 0);
  return bad === undefined ? "" : `seq ${bad.seq} (${bad.kind}): ${bad.problems.join("; ")}`;
}

/** Checks a whole answer: every reply keyed by the id, the end last, replay in order or snapshot pages. */
export function checkAnswer(t: CaseCheck, a: Answer, since: number): "replay" | "snapshot" {
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

/** The union of an answer's snapshot pages. */
export function setOfSnapshot(a: Answer): Set<string> {
  const s = new Set<string>();
  for (const e of a.msgs) if (e.kind === "snapshot") for (const h of e.hashes) s.add(h);
  return s;
}

/** The resident set a log of events leaves. */
export function applyLog(evs: readonly Ev[]): Set<string> {
  const s = new Set<string>();
  for (const e of evs) {
    if (e.kind === "stored") for (const h of e.hashes) s.add(h);
    if (e.kind === "evicted") for (const h of e.hashes) s.delete(h);
  }
  return s;
}

/** A MessagePack str. */
export const str = (x: string): Uint8Array => mpStr(x);
