import { EcError, isIntInRange } from "./errors.js";
import { EVENTS_LIMITS } from "./events.js";
import { decodeFlatMap } from "./flat-msgpack.js";

/** A decoded residency message (EC-CONTRACT 10.1 event, 10.2 snapshot page or end). */
export interface ResidencyMessage {
  /** `incarnation`. */
  incarnation: string;
  /** `seq`. */
  seq: number;
  /** `kind`: "stored", "evicted", "hello", "snapshot", "end" or one this version does not know. */
  kind: string;
  /** `mm_hashes` (empty when absent, as on `end`). */
  mmHashes: string[];
  /** `free_blocks` (-1 when absent). */
  freeBlocks: number;
  /** `num_blocks` (-1 when absent). */
  numBlocks: number;
  /** `heartbeat_ms` of a hello or an end (-1 when absent). */
  heartbeatMs: number;
  /** `request_id` of a reply (null on a live message). */
  requestId: string | null;
  /** `page` of a snapshot page (-1 otherwise). */
  page: number;
  /** `more` of a snapshot page (false otherwise). */
  more: boolean;
}

const HASH_ARRAYS: ReadonlySet<string> = new Set(["mm_hashes"]);
const EVENT_KINDS: ReadonlySet<string> = new Set(["stored", "evicted", "hello"]);

type Kind = "string" | "int" | "bool" | "hashes";

function field(m: Record<string, unknown>, k: string, kind: Kind, need: boolean): unknown {
  if (!Object.hasOwn(m, k)) {
    if (need) throw new EcError("EC_MALFORMED", `residency message: missing ${k}`);
    return undefined;
  }
  const v = m[k];
  const ok =
    kind === "string"
      ? typeof v === "string"
      : kind === "bool"
        ? typeof v === "boolean"
        : kind === "hashes"
          ? Array.isArray(v)
          : isIntInRange(v, 0);
  if (!ok) throw new EcError("EC_MALFORMED", `residency message: ${k} is not of type ${kind}`);
  return v;
}

/**
 * Decodes one residency message strictly (EC-CONTRACT 10.1, 10.2, 9.1): one flat map whose only
 * array is `mm_hashes` of at most 1,024 strings; throws `EC_MALFORMED` naming the first problem.
 * Unknown keys are ignored; a kind this version does not know keeps only the common keys.
 */
export function decodeResidencyMessage(bytes: Uint8Array): ResidencyMessage {
  const m = decodeFlatMap(bytes, "residency message", {
    stringArrays: HASH_ARRAYS,
    maxArray: EVENTS_LIMITS.maxHashes,
  }) as Record<string, unknown>;
  const kind = field(m, "kind", "string", true) as string;
  const isEnd = kind === "end";
  const isPage = kind === "snapshot";
  const known = isEnd || isPage || EVENT_KINDS.has(kind);
  const hashes = field(m, "mm_hashes", "hashes", known && !isEnd) as string[] | undefined;
  return {
    incarnation: field(m, "incarnation", "string", true) as string,
    seq: field(m, "seq", "int", true) as number,
    kind,
    mmHashes: hashes ?? [],
    freeBlocks: (field(m, "free_blocks", "int", known && !isEnd) as number | undefined) ?? -1,
    numBlocks: (field(m, "num_blocks", "int", known && !isEnd) as number | undefined) ?? -1,
    heartbeatMs: (field(m, "heartbeat_ms", "int", kind === "hello" || isEnd) as number | undefined) ?? -1,
    requestId: (field(m, "request_id", "string", isEnd || isPage) as string | undefined) ?? null,
    page: (field(m, "page", "int", isPage) as number | undefined) ?? -1,
    more: (field(m, "more", "bool", isPage) as boolean | undefined) ?? false,
  };
}

/** A replay request to send (EC-CONTRACT 10.2). */
export interface ReplayRequest {
  /** `request_id`. */
  requestId: string;
  /** `incarnation` ("" with no view). */
  incarnation: string;
  /** `since`: the last applied seq (0 with no view). */
  since: number;
}

/** What a view tells its owner (the directory's index and change stream). */
export interface ViewSink {
  /** `mmHash` entered the view's set. */
  add(mmHash: string): void;
  /** `mmHash` left the view's set. */
  remove(mmHash: string): void;
  /** The view's trust changed (EC-CONTRACT 10.3). */
  trust(trusted: boolean, why: string): void;
  /** Send this replay request to the producer's replay endpoint. */
  ask(req: ReplayRequest): void;
}

/** Most live messages held while a gap is being closed (beyond it the buffer is dropped and asked again). */
export const VIEW_BUFFER_MESSAGES = 8192;
/** EC-CONTRACT 10.2: the re-ask period until a heartbeat_ms is known. */
export const DEFAULT_HEARTBEAT_MS = 2_000;

interface SnapshotAcc {
  seq: number;
  next: number;
  free: number;
  hashes: Set<string>;
  done: boolean;
}

/**
 * EC-CONTRACT 10.3: one subscriber's view of one producer: the incarnation, the resident set, the
 * last `free_blocks` and the seq it reflects. Messages apply in seq order only; a gap or a new
 * incarnation makes the view untrusted until a replay or a snapshot closed it (a new incarnation
 * replaces the set); a producer silent for three of its `heartbeat_ms` is gone (set dropped).
 * A pure state machine: the clock comes in, requests go out through the sink.
 */
export class ResidencyView {
  /** The producer's incarnation as this view knows it ("" for none). */
  incarnation = "";
  /** The seq the set reflects. */
  seq = 0;
  /** `free_blocks` as of {@link seq}. */
  freeBlocks = 0;
  /** `num_blocks` of the producer. */
  numBlocks = 0;
  /** The producer's hello period (2,000 ms until one was seen). */
  heartbeatMs = DEFAULT_HEARTBEAT_MS;
  /** True while the set is the producer's (in order, no gap). */
  trusted = false;
  /** True after three missed heartbeats, until the producer is heard again. */
  gone = false;
  /** Gaps seen (counted for metrics). */
  gaps = 0;
  /** Snapshots applied. */
  snapshots = 0;
  /** Replay requests sent. */
  asks = 0;

  readonly #set = new Set<string>();
  readonly #sink: ViewSink;
  readonly #buffer = new Map<number, ResidencyMessage>();
  #lastHeard: number;
  #outstanding: { id: string; at: number; broken: boolean; snap: SnapshotAcc | null } | null = null;
  #lastAsk = Number.NEGATIVE_INFINITY;
  #needAsk = false;
  #nextId = 1;
  readonly #idPrefix: string;

  constructor(sink: ViewSink, now: number, idPrefix = "r") {
    this.#sink = sink;
    this.#lastHeard = now;
    this.#idPrefix = idPrefix;
    this.#ask(now); // a late start: snapshot (or replay of a young producer)
  }

  /** The resident set (read-only view; trust it only when {@link trusted}). */
  get set(): ReadonlySet<string> {
    return this.#set;
  }

  /** A live message from the PUB stream (EC-CONTRACT 10.1). */
  onLive(m: ResidencyMessage, now: number): void {
    if (m.requestId !== null || m.kind === "snapshot" || m.kind === "end") return;
    this.#heard(now);
    if (m.incarnation !== this.incarnation) {
      const first = this.incarnation === "";
      this.#newIncarnation(m.incarnation, "new incarnation");
      if (m.seq === 1) {
        this.#apply(m);
        this.#setTrust(true, "incarnation seen from its first message");
        return;
      }
      this.#hold(m);
      // The first ask (no view) is answered by this incarnation already; any other one is stale.
      if (!(first && this.#outstanding !== null)) this.#ask(now);
      return;
    }
    if (m.seq <= this.seq) return; // a duplicate (already applied from a replay)
    if (this.trusted && m.seq === this.seq + 1) {
      this.#apply(m);
      return;
    }
    if (this.trusted) {
      this.gaps++;
      this.#setTrust(false, `gap: seq ${m.seq} after ${this.seq}`);
      this.#hold(m);
      this.#ask(now);
      return;
    }
    this.#hold(m);
    if (this.#outstanding === null) this.#askSoon(now);
  }

  /** A message of a replay answer (EC-CONTRACT 10.2). */
  onReply(m: ResidencyMessage, now: number): void {
    const o = this.#outstanding;
    if (o === null || m.requestId !== o.id) return; // an older answer, or not ours
    this.#heard(now);
    if (m.incarnation !== this.incarnation) {
      this.#newIncarnation(m.incarnation, "answer from a new incarnation");
    }
    if (m.kind === "snapshot") {
      const s = o.snap;
      if (m.page === 0 && s === null) {
        o.snap = { seq: m.seq, next: 1, free: m.freeBlocks, hashes: new Set(m.mmHashes), done: !m.more };
        this.numBlocks = m.numBlocks;
      } else if (s !== null && !s.done && m.page === s.next && m.seq === s.seq) {
        s.next++;
        for (const h of m.mmHashes) s.hashes.add(h);
        s.done = !m.more;
      } else {
        o.broken = true;
      }
      return;
    }
    if (m.kind !== "end") {
      if (o.snap !== null || m.seq > this.seq + 1) o.broken = true;
      else if (m.seq === this.seq + 1) this.#apply(m);
      return;
    }
    if (m.heartbeatMs > 0) this.heartbeatMs = m.heartbeatMs;
    this.#outstanding = null;
    if (o.snap !== null) {
      if (o.snap.done && !o.broken && o.snap.seq === m.seq) this.#replace(o.snap);
      else o.broken = true;
    }
    this.#drain();
    if (!o.broken && this.seq >= m.seq && this.#buffer.size === 0) {
      this.#setTrust(true, o.snap !== null ? "snapshot applied" : "replay applied");
      return;
    }
    // Something is missing (a page, a message, the live stream past the end): ask again, at most once
    // per heartbeat_ms (EC-CONTRACT 10.2).
    this.#needAsk = true;
  }

  /** Timers: the re-ask of 10.2 and the three missed heartbeats of 10.3. */
  tick(now: number): void {
    if (!this.gone && this.incarnation !== "" && now - this.#lastHeard > 3 * this.heartbeatMs) {
      this.#goneNow();
      return;
    }
    if (this.gone) return;
    const o = this.#outstanding;
    if (o !== null && now - o.at >= this.heartbeatMs) this.#needAsk = true; // no (whole) answer
    if (this.#needAsk && !this.trusted && now - this.#lastAsk >= this.heartbeatMs) this.#ask(now);
    if (this.trusted) this.#needAsk = false;
  }

  /** The record source says the producer has another incarnation: stop trusting until it is seen. */
  hintIncarnation(incarnation: string, now: number): void {
    if (incarnation === "" || incarnation === this.incarnation) return;
    this.#newIncarnation(incarnation, "the registry names a new incarnation");
    this.#ask(now);
  }

  /** Drops the set (the producer left the source, or the directory closes). */
  clear(): void {
    this.#dropSet();
    this.#setTrust(false, "removed");
  }

  #heard(now: number): void {
    this.#lastHeard = now;
    if (this.gone) this.gone = false;
  }

  #goneNow(): void {
    this.gone = true;
    this.#setTrust(false, `silent for three heartbeats (${3 * this.heartbeatMs} ms)`);
    this.#dropSet();
    this.incarnation = "";
    this.seq = 0;
    this.#buffer.clear();
    this.#outstanding = null;
    this.#needAsk = false;
  }

  #newIncarnation(incarnation: string, why: string): void {
    this.#setTrust(false, why);
    this.#dropSet();
    this.incarnation = incarnation;
    this.seq = 0;
    for (const [s, b] of this.#buffer) if (b.incarnation !== incarnation) this.#buffer.delete(s);
  }

  #hold(m: ResidencyMessage): void {
    if (this.#buffer.size >= VIEW_BUFFER_MESSAGES) this.#buffer.clear();
    this.#buffer.set(m.seq, m);
  }

  /** Applies buffered live messages that now follow in order; drops the ones already covered. */
  #drain(): void {
    for (const s of [...this.#buffer.keys()]) if (s <= this.seq) this.#buffer.delete(s);
    for (;;) {
      const m = this.#buffer.get(this.seq + 1);
      if (m === undefined) break;
      this.#buffer.delete(m.seq);
      this.#apply(m);
    }
  }

  #apply(m: ResidencyMessage): void {
    this.seq = m.seq;
    if (m.freeBlocks >= 0) this.freeBlocks = m.freeBlocks;
    if (m.numBlocks >= 0) this.numBlocks = m.numBlocks;
    if (m.kind === "hello") {
      if (m.heartbeatMs > 0) this.heartbeatMs = m.heartbeatMs;
    } else if (m.kind === "stored") {
      for (const h of m.mmHashes) {
        if (this.#set.has(h)) continue;
        this.#set.add(h);
        this.#sink.add(h);
      }
    } else if (m.kind === "evicted") {
      for (const h of m.mmHashes) if (this.#set.delete(h)) this.#sink.remove(h);
    }
    // any other kind: skipped, but it counted for the seq (EC-CONTRACT 10.1)
  }

  #replace(s: SnapshotAcc): void {
    for (const h of [...this.#set]) {
      if (!s.hashes.has(h)) {
        this.#set.delete(h);
        this.#sink.remove(h);
      }
    }
    for (const h of s.hashes) {
      if (this.#set.has(h)) continue;
      this.#set.add(h);
      this.#sink.add(h);
    }
    this.seq = s.seq;
    this.freeBlocks = s.free;
    this.snapshots++;
  }

  #dropSet(): void {
    for (const h of this.#set) this.#sink.remove(h);
    this.#set.clear();
  }

  #setTrust(t: boolean, why: string): void {
    if (this.trusted === t) return;
    this.trusted = t;
    this.#sink.trust(t, why);
  }

  #askSoon(now: number): void {
    this.#needAsk = true;
    if (now - this.#lastAsk >= this.heartbeatMs) this.#ask(now);
  }

  #ask(now: number): void {
    const id = `${this.#idPrefix}${this.#nextId++}`;
    this.#outstanding = { id, at: now, broken: false, snap: null };
    this.#lastAsk = now;
    this.#needAsk = false;
    this.asks++;
    this.#sink.ask({ requestId: id, incarnation: this.incarnation, since: this.seq });
  }
}
