import { randomUUID } from "node:crypto";
import type { Counter, Gauge, Registry } from "@tapwire/stats";
import type { Logger } from "pino";
import { Publisher, Router } from "zeromq";
import type { CurveServerOptions } from "./curve.js";
import { checkCurveServer, zap } from "./curve.js";
import { checkIntOption, EcError } from "./errors.js";
import { decodeFlatMap } from "./flat-msgpack.js";
import { silentLogger } from "./metrics.js";
import { int, MAX_CONTROL_MESSAGE_BYTES, MAX_STRING_BYTES, packMsg, str } from "./protocol.js";

/** EC-CONTRACT 10.1 / 10.2: the numbers of the residency events. */
export const EVENTS_LIMITS = {
  /** Most hashes in one message (10.1). */
  maxHashes: 1024,
  /** Most bytes of one published message (10.1: a replayed copy with its request_id stays within 64 KiB). */
  maxMessageBytes: 65_280,
  /** Fewest messages the replay ring keeps (10.2). */
  minRingMessages: 4096,
  /** Longest `request_id` in bytes (10.2). */
  maxRequestIdBytes: 64,
  /** Most replay peers within {@link EVENTS_LIMITS.peerWindowMs} (10.2). */
  maxReplayPeers: 256,
  /** A replay peer counts for this long after its last well-formed request (10.2). */
  peerWindowMs: 30_000,
} as const;

/** Defaults of {@link ResidencyEvents}. */
export const EVENTS_DEFAULTS = {
  /** EC-CONTRACT 10.1: the hello period. */
  heartbeatMs: 2_000,
  /** EC-CONTRACT 10.2: messages kept for replay. */
  ringMessages: EVENTS_LIMITS.minRingMessages,
} as const;

/** The kinds of a published event (EC-CONTRACT 10.1). */
export const EventKind = { STORED: "stored", EVICTED: "evicted", HELLO: "hello" } as const;
/** One of {@link EventKind}. */
export type EventKind = (typeof EventKind)[keyof typeof EventKind];

/** Options of {@link ResidencyEvents.start} (the `events*` options of `EcProducer`). */
export interface ResidencyEventsOptions {
  /** ZeroMQ endpoint of the PUB socket (EC-CONTRACT 10.1), e.g. `tcp://127.0.0.1:0`. */
  events: string;
  /** ZeroMQ endpoint of the replay ROUTER (EC-CONTRACT 10.2). */
  replay: string;
  /** Cache size announced in every message (`num_blocks`). */
  numBlocks: number;
  /** The cache's free block count (read right after each change). */
  freeBlocks: () => number;
  /** Hello period in ms (default 2,000; EC-CONTRACT 10.1). */
  heartbeatMs?: number;
  /** Messages kept for replay (default and minimum 4,096; EC-CONTRACT 10.2). */
  ringMessages?: number;
  /** EC-CONTRACT 9.4: make both sockets CURVE servers accepting only `curve.allow`. */
  curve?: CurveServerOptions;
  /** Where the `producer_events_*` metrics go. */
  registry: Registry;
  /** pino logger (default: silent). */
  logger?: Logger;
  /** Called for each CURVE handshake refused on either socket. */
  onAuthRefused?: (why: string) => void;
}

interface EventsMetrics {
  published: Counter;
  hashes: Counter;
  requests: Counter;
  replays: Counter;
  snapshots: Counter;
  malformed: Counter;
  peersRefused: Counter;
  disconnects: Counter;
  replaced: Counter;
  seq: Gauge;
  ring: Gauge;
}

function eventsMetrics(r: Registry): EventsMetrics {
  return {
    published: r.counter(
      "producer_events_published",
      "residency event messages published (EC-CONTRACT 10.1)",
    ),
    hashes: r.counter("producer_events_hashes", "mm_hashes carried by published stored/evicted messages"),
    requests: r.counter(
      "producer_replay_requests",
      "well-formed replay requests answered (EC-CONTRACT 10.2)",
    ),
    replays: r.counter("producer_replay_answers_ring", "replay answers served from the ring"),
    snapshots: r.counter("producer_replay_answers_snapshot", "replay answers served as a snapshot"),
    malformed: r.counter(
      "producer_replay_malformed",
      "replay requests dropped unanswered as malformed (EC-CONTRACT 10.2)",
    ),
    peersRefused: r.counter(
      "producer_replay_peers_refused",
      "replay requests of a new peer dropped beyond 256 peers in 30 s (EC-CONTRACT 10.2)",
    ),
    disconnects: r.counter(
      "producer_replay_disconnects",
      "replay connections dropped: an over-64-KiB message (EC-CONTRACT 9.1) or a peer gone",
    ),
    replaced: r.counter(
      "producer_replay_answers_replaced",
      "unsent rests of answers dropped because the same peer asked again",
    ),
    seq: r.gauge("producer_events_seq", "seq of the last published residency event"),
    ring: r.gauge("producer_events_ring_messages", "messages held in the replay ring"),
  };
}

interface Change {
  kind: "stored" | "evicted";
  mmHash: string;
  free: number;
}

/**
 * One peer's answer in the send queue: ring messages `ringNext ..= ringLast` made on the way out
 * (the answer costs no copy of the ring), then the snapshot pages, then `end`.
 */
interface Outgoing {
  identity: Uint8Array;
  rid: Uint8Array;
  ringNext: number;
  ringLast: number;
  pages: Uint8Array[];
  next: number;
  end: Uint8Array;
}

const te = new TextEncoder();

/** Bytes of a MessagePack str of `n` UTF-8 bytes. */
function strSize(n: number): number {
  return n + (n < 32 ? 1 : n < 256 ? 2 : n < 65_536 ? 3 : 5);
}

/**
 * Upper bound of an event map's bytes without its hashes: every integer at its 9-byte form, the
 * array header at its 5-byte form, the longest kind, plus `extra` bytes of further keys.
 */
function baseSize(incarnation: string, extra: number): number {
  const keys = ["incarnation", "seq", "kind", "mm_hashes", "free_blocks", "num_blocks"];
  let n = 1 + strSize(te.encode(incarnation).length) + strSize("snapshot".length) + 5 + 3 * 9;
  for (const k of keys) n += strSize(k.length);
  return n + extra;
}

/**
 * EC-CONTRACT 10.1 / 10.2: a producer's residency events. Changes are noted as they happen
 * ({@link stored}, {@link evicted}) and published by {@link flush} (the producer calls it at the end
 * of every step, and a microtask after each change) in the order they happened, split over
 * consecutive messages of at most 1,024 hashes and 65,280 bytes. Every published message is kept
 * in a ring of at least 4,096 for replay; older requests are answered with snapshot pages of the
 * resident set as of the last published message. Both sockets get the 9.1 size bound and, with
 * keys, the 9.4 CURVE server.
 */
export class ResidencyEvents {
  /** EC-CONTRACT 10.1: this producer process's UUID. */
  readonly incarnation: string;
  /** Bound PUB endpoint. */
  readonly eventsEndpoint: string;
  /** Bound replay ROUTER endpoint. */
  readonly replayEndpoint: string;
  /** The hello period, ms. */
  readonly heartbeatMs: number;
  readonly #pub: Publisher;
  readonly #router: Router;
  readonly #zapDomains: string[];
  readonly #numBlocks: number;
  readonly #freeBlocks: () => number;
  readonly #m: EventsMetrics;
  readonly #log: Logger;
  readonly #ring: (Uint8Array | undefined)[];
  readonly #resident = new Set<string>();
  readonly #pending: Change[] = [];
  readonly #peers = new Map<string, number>();
  readonly #out = new Map<string, Outgoing>();
  readonly #base: number;
  readonly #timer: NodeJS.Timeout;
  #seq = 0;
  #lastFree: number;
  #flushQueued = false;
  #pubBusy = false;
  readonly #pubQueue: Uint8Array[] = [];
  #routerBusy = false;
  #closed = false;

  private constructor(
    pub: Publisher,
    router: Router,
    zapDomains: string[],
    o: ResidencyEventsOptions,
    heartbeatMs: number,
    ringMessages: number,
  ) {
    this.#pub = pub;
    this.#router = router;
    this.#zapDomains = zapDomains;
    this.eventsEndpoint = pub.lastEndpoint ?? o.events;
    this.replayEndpoint = router.lastEndpoint ?? o.replay;
    this.heartbeatMs = heartbeatMs;
    this.#numBlocks = o.numBlocks;
    this.#freeBlocks = o.freeBlocks;
    this.#m = eventsMetrics(o.registry);
    this.#log = o.logger ?? silentLogger();
    this.#ring = new Array<Uint8Array | undefined>(ringMessages);
    this.incarnation = randomUUID();
    this.#base = baseSize(this.incarnation, 0);
    this.#lastFree = o.freeBlocks();
    // EC-CONTRACT 10.1: seq 1 is the hello, before anything (prepopulated entries) is stored.
    this.#hello();
    this.#timer = setInterval(() => {
      this.flush();
      this.#hello();
    }, heartbeatMs);
    this.#timer.unref();
    router.events.on("disconnect", () => this.#m.disconnects.inc());
    void this.#serve();
  }

  /** Validates options, binds the PUB and the replay ROUTER, and publishes the first hello (seq 1). */
  static async start(o: ResidencyEventsOptions): Promise<ResidencyEvents> {
    for (const k of ["events", "replay"] as const) {
      if (typeof o[k] !== "string" || o[k].length === 0) {
        throw new EcError("EC_BAD_OPTION", `option ${k}: expected a ZeroMQ endpoint string`);
      }
    }
    const heartbeatMs = checkIntOption("eventsHeartbeatMs", o.heartbeatMs ?? EVENTS_DEFAULTS.heartbeatMs, 1);
    const ring = checkIntOption(
      "eventsRingMessages",
      o.ringMessages ?? EVENTS_DEFAULTS.ringMessages,
      EVENTS_LIMITS.minRingMessages,
      1 << 22,
    );
    checkIntOption("numBlocks", o.numBlocks, 1);
    if (o.curve !== undefined) checkCurveServer(o.curve);
    const log = o.logger ?? silentLogger();
    const zapDomains: string[] = [];
    const curveOpts = async (): Promise<Record<string, unknown>> => {
      if (o.curve === undefined) return {};
      const d = await zap.register(o.curve.allow, o.onAuthRefused ?? (() => undefined), log);
      zapDomains.push(d);
      return {
        curveServer: true,
        curveSecretKey: o.curve.secretKey,
        curvePublicKey: o.curve.publicKey,
        zapDomain: d,
        zapEnforceDomain: true,
      };
    };
    // 9.1 on both sockets: a peer's message over 64 KiB is dropped by the socket (PUB peers send
    // only subscriptions). The ROUTER's send queue holds a whole answer (10.2): a ring replay, or
    // the snapshot pages of a full cache (each page holds at least 250 hashes of 256 bytes).
    const hwm = Math.max(ring, Math.ceil(o.numBlocks / 250)) + 2;
    const socks: (Publisher | Router)[] = [];
    try {
      const pub = new Publisher({
        linger: 0,
        maxMessageSize: MAX_CONTROL_MESSAGE_BYTES,
        ...(await curveOpts()),
      });
      socks.push(pub);
      await bindOrThrow(pub, o.events);
      const router = new Router({
        linger: 0,
        maxMessageSize: MAX_CONTROL_MESSAGE_BYTES,
        sendHighWaterMark: hwm,
        ...(await curveOpts()),
      });
      socks.push(router);
      await bindOrThrow(router, o.replay);
      return new ResidencyEvents(pub, router, zapDomains, o, heartbeatMs, ring);
    } catch (err) {
      for (const s of socks) s.close();
      for (const d of zapDomains) zap.release(d);
      throw err;
    }
  }

  /** The seq of the last published message. */
  get seq(): number {
    return this.#seq;
  }

  /** Number of ready entries as the published log says (the snapshot's size). */
  get residentCount(): number {
    return this.#resident.size;
  }

  /** Notes that `mmHash` became ready (published at the next {@link flush}). */
  stored(mmHash: string): void {
    this.#note("stored", mmHash);
  }

  /** Notes that `mmHash` left the cache (published at the next {@link flush}). */
  evicted(mmHash: string): void {
    this.#note("evicted", mmHash);
  }

  /**
   * Publishes the noted changes in order: consecutive changes of one kind share a message until
   * it holds 1,024 hashes or would pass 65,280 bytes; `free_blocks` is the count right after each
   * message's last change (EC-CONTRACT 10.1).
   */
  flush(): void {
    if (this.#closed || this.#pending.length === 0) return;
    const changes = this.#pending.splice(0);
    let i = 0;
    while (i < changes.length) {
      const kind = changes[i]!.kind;
      const hashes: string[] = [];
      let bytes = this.#base;
      let free = changes[i]!.free;
      while (i < changes.length && changes[i]!.kind === kind && hashes.length < EVENTS_LIMITS.maxHashes) {
        const c = changes[i]!;
        const add = strSize(Buffer.byteLength(c.mmHash, "utf8"));
        if (hashes.length > 0 && bytes + add > EVENTS_LIMITS.maxMessageBytes) break;
        hashes.push(c.mmHash);
        bytes += add;
        free = c.free;
        if (kind === "stored") this.#resident.add(c.mmHash);
        else this.#resident.delete(c.mmHash);
        i++;
      }
      this.#m.hashes.inc(hashes.length);
      this.#publish({ kind, mm_hashes: hashes, free_blocks: free });
    }
  }

  /** Closes both sockets and stops the hellos. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#timer);
    this.#out.clear();
    this.#pubQueue.length = 0;
    this.#pub.close();
    this.#router.close();
    for (const d of this.#zapDomains) zap.release(d);
  }

  #note(kind: "stored" | "evicted", mmHash: string): void {
    if (this.#closed) return;
    this.#pending.push({ kind, mmHash, free: this.#freeBlocks() });
    if (!this.#flushQueued) {
      this.#flushQueued = true;
      queueMicrotask(() => {
        this.#flushQueued = false;
        this.flush();
      });
    }
  }

  #hello(): void {
    if (this.#closed) return;
    this.#publish({
      kind: "hello",
      mm_hashes: [],
      free_blocks: this.#freeBlocks(),
      heartbeat_ms: this.heartbeatMs,
    });
  }

  /** Encodes, rings and sends one message (key order: the table of EC-CONTRACT 10.1). */
  #publish(m: { kind: string; mm_hashes: string[]; free_blocks: number; heartbeat_ms?: number }): void {
    const seq = ++this.#seq;
    this.#lastFree = m.free_blocks;
    const bytes = packMsg({
      incarnation: this.incarnation,
      seq,
      kind: m.kind,
      mm_hashes: m.mm_hashes,
      free_blocks: m.free_blocks,
      num_blocks: this.#numBlocks,
      ...(m.heartbeat_ms === undefined ? {} : { heartbeat_ms: m.heartbeat_ms }),
    });
    this.#ring[seq % this.#ring.length] = bytes;
    this.#m.published.inc();
    this.#m.seq.set(seq);
    this.#m.ring.set(Math.min(seq, this.#ring.length));
    this.#pubQueue.push(bytes);
    if (!this.#pubBusy) void this.#pumpPub();
  }

  async #pumpPub(): Promise<void> {
    this.#pubBusy = true;
    while (this.#pubQueue.length > 0 && !this.#closed) {
      try {
        await this.#pub.send(this.#pubQueue.shift()!);
      } catch (err) {
        if (!this.#closed) this.#log.warn({ err: (err as Error).message }, "events publish failed");
      }
    }
    this.#pubBusy = false;
  }

  async #serve(): Promise<void> {
    try {
      for await (const [identity, ...frames] of this.#router) {
        if (identity === undefined) continue;
        this.#request(identity, frames);
      }
    } catch (err) {
      if (!this.#closed) this.#log.warn({ err: (err as Error).message }, "replay receive loop ended");
    }
  }

  /** EC-CONTRACT 10.2: one request; malformed or over the peer cap: dropped unanswered, counted. */
  #request(identity: Uint8Array, frames: Uint8Array[]): void {
    let requestId: string;
    let incarnation: string;
    let since: number;
    try {
      if (frames.length !== 1) throw new EcError("EC_MALFORMED", `replay request of ${frames.length} frames`);
      const m = decodeFlatMap(frames[0]!, "replay request") as Record<string, unknown>;
      requestId = str(m, "request_id", "replay request", EVENTS_LIMITS.maxRequestIdBytes);
      incarnation = str(m, "incarnation", "replay request", MAX_STRING_BYTES);
      since = int(m, "since", "replay request", 0);
    } catch (err) {
      this.#m.malformed.inc();
      this.#log.debug({ err: (err as Error).message }, "dropped malformed replay request");
      return;
    }
    const peer = Buffer.from(identity).toString("hex");
    const now = performance.now();
    if (!this.#peers.has(peer)) {
      if (this.#peers.size >= EVENTS_LIMITS.maxReplayPeers) {
        for (const [k, at] of this.#peers) if (now - at > EVENTS_LIMITS.peerWindowMs) this.#peers.delete(k);
      }
      if (this.#peers.size >= EVENTS_LIMITS.maxReplayPeers) {
        this.#m.peersRefused.inc();
        return;
      }
    }
    this.#peers.delete(peer);
    this.#peers.set(peer, now); // insertion order = least recently active first
    this.#m.requests.inc();
    this.flush(); // the answer reflects every change made so far
    const answer = this.#answer(identity, requestId, incarnation, since);
    if (this.#out.has(peer)) this.#m.replaced.inc();
    this.#out.delete(peer);
    this.#out.set(peer, answer);
    if (!this.#routerBusy) void this.#pumpRouter();
  }

  #answer(identity: Uint8Array, requestId: string, incarnation: string, since: number): Outgoing {
    const last = this.#seq;
    const o: Outgoing = {
      identity,
      rid: packMsg(requestId),
      ringNext: 1,
      ringLast: 0,
      pages: [],
      next: 0,
      end: packMsg({
        kind: "end",
        request_id: requestId,
        incarnation: this.incarnation,
        seq: last,
        heartbeat_ms: this.heartbeatMs,
      }),
    };
    if (incarnation === this.incarnation && since <= last && since + 1 >= this.#firstInRing()) {
      this.#m.replays.inc();
      o.ringNext = since + 1;
      o.ringLast = last;
    } else {
      this.#m.snapshots.inc();
      o.pages = this.#snapshot(requestId, last);
    }
    return o;
  }

  #firstInRing(): number {
    return Math.max(1, this.#seq - this.#ring.length + 1);
  }

  /** The next message of an answer, or null when it is complete. */
  #nextOf(o: Outgoing): Uint8Array | null {
    if (o.ringNext <= o.ringLast) {
      // A message overwritten since the request (a slow reader, a big burst): the rest of the ring
      // part is skipped, the end tells the subscriber what it lacks and it asks again (10.2).
      if (o.ringNext < this.#firstInRing()) o.ringNext = o.ringLast + 1;
      else {
        const s = o.ringNext++;
        return withRequestId(this.#ring[s % this.#ring.length]!, o.rid);
      }
    }
    if (o.next < o.pages.length) return o.pages[o.next++]!;
    if (o.next === o.pages.length) {
      o.next++;
      return o.end;
    }
    return null;
  }

  /** EC-CONTRACT 10.2: the resident set as of seq `last`, in pages within the limits of 10.1. */
  #snapshot(requestId: string, last: number): Uint8Array[] {
    const pages: Uint8Array[] = [];
    const extra = strSize("request_id".length) + strSize(Buffer.byteLength(requestId)) + 2 * 9 + 16;
    const base = baseSize(this.incarnation, extra);
    let hashes: string[] = [];
    let bytes = base;
    const emit = (more: boolean) => {
      pages.push(
        packMsg({
          kind: "snapshot",
          request_id: requestId,
          incarnation: this.incarnation,
          seq: last,
          page: pages.length,
          more,
          mm_hashes: hashes,
          free_blocks: this.#lastFree,
          num_blocks: this.#numBlocks,
        }),
      );
      hashes = [];
      bytes = base;
    };
    for (const h of this.#resident) {
      const add = strSize(Buffer.byteLength(h, "utf8"));
      if (
        hashes.length >= EVENTS_LIMITS.maxHashes ||
        (hashes.length > 0 && bytes + add > EVENTS_LIMITS.maxMessageBytes)
      ) {
        emit(true);
      }
      hashes.push(h);
      bytes += add;
    }
    emit(false);
    return pages;
  }

  /** Sends the queued answers, one message per peer in turn (a slow answer does not stall others). */
  async #pumpRouter(): Promise<void> {
    this.#routerBusy = true;
    while (this.#out.size > 0 && !this.#closed) {
      for (const [peer, o] of [...this.#out]) {
        if (this.#out.get(peer) !== o) continue;
        const msg = this.#nextOf(o);
        if (msg === null) {
          this.#out.delete(peer);
          continue;
        }
        try {
          await this.#router.send([o.identity, msg]);
        } catch (err) {
          if (!this.#closed) this.#log.warn({ err: (err as Error).message }, "replay send failed");
        }
      }
    }
    this.#routerBusy = false;
  }
}

/** A ringed message as published plus `request_id` (a fixmap: one more entry, the pair appended). */
function withRequestId(published: Uint8Array, packedId: Uint8Array): Uint8Array {
  const key = packMsg("request_id");
  const out = new Uint8Array(published.length + key.length + packedId.length);
  out.set(published, 0);
  out[0] = published[0]! + 1; // 0x86/0x87 → 0x87/0x88: at most 7 keys, always a fixmap
  out.set(key, published.length);
  out.set(packedId, published.length + key.length);
  return out;
}

async function bindOrThrow(sock: Publisher | Router, endpoint: string): Promise<void> {
  try {
    await sock.bind(endpoint);
  } catch (err) {
    throw new EcError("EC_BAD_ENDPOINT", `bind ${endpoint}: ${(err as Error).message}`, { cause: err });
  }
}

/** The `events*` options of `EcProducer` (EC-CONTRACT 10). */
export interface ProducerEventsOptions {
  /** EC-CONTRACT 10.1: PUB endpoint of the residency events (off when not given; needs `replay`). */
  events?: string;
  /** EC-CONTRACT 10.2: replay ROUTER endpoint (given with `events`). */
  replay?: string;
  /** Hello period of the events (default 2,000 ms). */
  eventsHeartbeatMs?: number;
  /** Messages kept for replay (default and minimum 4,096). */
  eventsRingMessages?: number;
}

/** Starts the events of a producer when `events` and `replay` are given (internal; `EcProducer.start`). */
export async function startProducerEvents(
  o: ProducerEventsOptions & { curve?: CurveServerOptions },
  numBlocks: number,
  freeBlocks: () => number,
  registry: Registry,
  log: Logger,
  onAuthRefused: (why: string) => void,
): Promise<ResidencyEvents | null> {
  if (o.events === undefined && o.replay === undefined) {
    for (const k of ["eventsHeartbeatMs", "eventsRingMessages"] as const) {
      if (o[k] !== undefined) throw new EcError("EC_BAD_OPTION", `option ${k}: needs events and replay`);
    }
    return null;
  }
  if (o.events === undefined || o.replay === undefined) {
    throw new EcError(
      "EC_BAD_OPTION",
      `option ${o.events === undefined ? "events" : "replay"}: events and replay go together`,
    );
  }
  return ResidencyEvents.start({
    events: o.events,
    replay: o.replay,
    numBlocks,
    freeBlocks,
    registry,
    logger: log,
    onAuthRefused,
    ...(o.eventsHeartbeatMs === undefined ? {} : { heartbeatMs: o.eventsHeartbeatMs }),
    ...(o.eventsRingMessages === undefined ? {} : { ringMessages: o.eventsRingMessages }),
    ...(o.curve === undefined ? {} : { curve: o.curve }),
  });
}
