import type { Counter, Gauge, Registry } from "@tapwire/stats";
import type { Logger } from "pino";
import { Dealer, Subscriber } from "zeromq";
import type { CurveKeyPair } from "./curve.js";
import { checkCurveKey } from "./curve.js";
import { checkFunctionOption, checkIntOption, EcError } from "./errors.js";
import { defaultRegistry, silentLogger } from "./metrics.js";
import { MAX_CONTROL_MESSAGE_BYTES, packMsg } from "./protocol.js";
import type { ReplayRequest, ViewSink } from "./residency-view.js";
import { decodeResidencyMessage, ResidencyView } from "./residency-view.js";

/**
 * One producer as a directory source names it: its control endpoint (the key, and where a consumer
 * sends its XferReqs), its events and replay endpoints (EC-CONTRACT 10.1, 10.2), and, when the
 * source knows it (an etcd record of the pool), the incarnation it registered.
 */
export interface ProducerRecord {
  /** The producer's control ROUTER endpoint (what `holders()` returns). */
  control: string;
  /** Its events PUB endpoint. */
  events: string;
  /** Its replay ROUTER endpoint. */
  replay: string;
  /** The incarnation the source saw registered (a hint: a change stops trust until the stream shows it). */
  incarnation?: string;
}

/**
 * Where a directory learns its producers: `watch` calls `onRecords` with the whole current list at
 * once and again on each change, and returns a function that stops watching. {@link staticSource}
 * is a fixed list; a discovery registry (etcd records) implements the same shape.
 */
export interface DirectorySource {
  /** Starts delivering the full list of records; the returned function stops. */
  watch(onRecords: (records: readonly ProducerRecord[]) => void): () => void;
}

/** A {@link DirectorySource} of a fixed list. */
export function staticSource(records: readonly ProducerRecord[]): DirectorySource {
  const list = records.map((r) => ({ ...r }));
  return {
    watch(onRecords) {
      onRecords(list);
      return () => undefined;
    },
  };
}

/** A change a router may act on (EC-CONTRACT 10.3). */
export interface DirectoryChange {
  /** The producer's control endpoint. */
  producer: string;
  /**
   * `stored` / `evicted`: hashes entered or left the producer's view (as applied, in order);
   * `trusted` / `untrusted`: the view's trust changed; `gone`: three heartbeats missed.
   */
  kind: "stored" | "evicted" | "trusted" | "untrusted" | "gone";
  /** The hashes of a stored/evicted change (empty otherwise). */
  mmHashes: readonly string[];
  /** Why the trust changed (empty for stored/evicted). */
  why: string;
}

/** A read-only summary of one producer's view. */
export interface ProducerViewInfo {
  /** Control endpoint. */
  producer: string;
  /** Incarnation ("" for none yet). */
  incarnation: string;
  /** Seq the set reflects. */
  seq: number;
  /** Whether holders() may name it. */
  trusted: boolean;
  /** True after three missed heartbeats. */
  gone: boolean;
  /** Resident hashes in the view. */
  size: number;
  /** Last `free_blocks`. */
  freeBlocks: number;
  /** Gaps seen. */
  gaps: number;
  /** Snapshots applied. */
  snapshots: number;
  /** Replay requests sent. */
  asks: number;
}

/** Options of {@link EcDirectory}. */
export interface EcDirectoryOptions {
  /** The producers (a fixed list); or give `source`. */
  producers?: readonly ProducerRecord[];
  /** Where the producers come from (e.g. a discovery registry); exclusive with `producers`. */
  source?: DirectorySource;
  /** EC-CONTRACT 9.4: this subscriber's key pair and the producers' public key (or one per control endpoint). */
  curve?: CurveKeyPair & {
    /** Z85 public key of the producers, or one per control endpoint. */
    serverKey: string | ((producer: string) => string);
  };
  /** Timer period of the re-ask and gone checks (default 100 ms). */
  tickMs?: number;
  /** Clock in ms (default `performance.now`). */
  now?: () => number;
  /** Where the `directory_*` metrics go (default: a fresh Registry). */
  registry?: Registry;
  /** pino logger (default: silent). */
  logger?: Logger;
}

interface DirectoryMetrics {
  malformed: Counter;
  gaps: Counter;
  asks: Counter;
  snapshots: Counter;
  trusted: Gauge;
}

interface Feed {
  record: ProducerRecord;
  view: ResidencyView;
  sub: Subscriber;
  dealer: Dealer;
  /** The latest request not yet handed to the socket (an older one is replaced, never queued). */
  wanted: Uint8Array | null;
  sending: boolean;
  closed: boolean;
}

/**
 * EC-CONTRACT 10.3: a subscriber's view of many producers. For each producer record it holds a SUB
 * on the events endpoint and a DEALER on the replay endpoint, and a {@link ResidencyView}; it
 * answers {@link holders} from an index of hash → producers, and reports every applied change
 * and trust change through {@link onChange} (what a router in front of the consumers needs).
 */
export class EcDirectory {
  /** Called for every change applied to a view and every trust change. */
  onChange: ((c: DirectoryChange) => void) | null = null;
  readonly #feeds = new Map<string, Feed>();
  readonly #index = new Map<string, Set<Feed>>();
  readonly #now: () => number;
  readonly #curve: EcDirectoryOptions["curve"];
  readonly #log: Logger;
  readonly #m: DirectoryMetrics;
  readonly #timer: NodeJS.Timeout;
  readonly #stop: () => void;
  #closed = false;

  constructor(options: EcDirectoryOptions = {}) {
    if (options === null || typeof options !== "object") {
      throw new EcError("EC_BAD_OPTION", "options: expected an object");
    }
    if (options.producers !== undefined && options.source !== undefined) {
      throw new EcError("EC_BAD_OPTION", "option source: give producers or source, not both");
    }
    if (options.producers !== undefined && !Array.isArray(options.producers)) {
      throw new EcError("EC_BAD_OPTION", "option producers: expected an array of records");
    }
    if (options.source !== undefined && typeof options.source?.watch !== "function") {
      throw new EcError("EC_BAD_OPTION", "option source: expected an object with watch()");
    }
    const tickMs = checkIntOption("tickMs", options.tickMs ?? 100, 1);
    checkFunctionOption("now", options.now);
    if (options.curve !== undefined) {
      checkCurveKey("curve.publicKey", options.curve.publicKey);
      checkCurveKey("curve.secretKey", options.curve.secretKey);
      if (typeof options.curve.serverKey === "string")
        checkCurveKey("curve.serverKey", options.curve.serverKey);
    }
    this.#curve = options.curve;
    this.#now = options.now ?? (() => performance.now());
    this.#log = options.logger ?? silentLogger();
    const r = options.registry ?? defaultRegistry();
    this.#m = {
      malformed: r.counter(
        "directory_malformed_messages",
        "residency messages dropped as malformed (EC-CONTRACT 10.1)",
      ),
      gaps: r.counter("directory_gaps", "seq gaps that made a producer's view untrusted (EC-CONTRACT 10.3)"),
      asks: r.counter("directory_replay_requests", "replay requests sent (EC-CONTRACT 10.2)"),
      snapshots: r.counter("directory_snapshots", "snapshots applied"),
      trusted: r.gauge("directory_trusted_producers", "producers whose view is trusted"),
    };
    for (const [i, rec] of (options.producers ?? []).entries()) checkRecord(rec, `producers[${i}]`);
    this.#timer = setInterval(() => this.tick(), tickMs);
    this.#timer.unref();
    const source = options.source ?? staticSource(options.producers ?? []);
    this.#stop = source.watch((records) => this.#records(records));
  }

  /**
   * EC-CONTRACT 10.4: the producers whose *trusted* view holds `mmHash`, most free blocks first
   * (empty when none does). One map lookup plus the holders themselves.
   */
  holders(mmHash: string): string[] {
    const s = this.#index.get(mmHash);
    if (s === undefined) return [];
    const out: Feed[] = [];
    for (const f of s) if (f.view.trusted) out.push(f);
    if (out.length > 1) out.sort((a, b) => b.view.freeBlocks - a.view.freeBlocks);
    return out.map((f) => f.record.control);
  }

  /** True when some trusted view holds `mmHash`. */
  isResident(mmHash: string): boolean {
    const s = this.#index.get(mmHash);
    if (s === undefined) return false;
    for (const f of s) if (f.view.trusted) return true;
    return false;
  }

  /** A summary of every producer's view. */
  views(): ProducerViewInfo[] {
    return [...this.#feeds.values()].map((f) => info(f));
  }

  /** One producer's view (by control endpoint), or undefined. */
  view(producer: string): ProducerViewInfo | undefined {
    const f = this.#feeds.get(producer);
    return f === undefined ? undefined : info(f);
  }

  /** The resident set of one producer's view (a copy; trust it only when its view is trusted). */
  residentSet(producer: string): Set<string> {
    return new Set(this.#feeds.get(producer)?.view.set ?? []);
  }

  /** Runs the timers now (normally every `tickMs`). */
  tick(): void {
    if (this.#closed) return;
    const now = this.#now();
    for (const f of this.#feeds.values()) f.view.tick(now);
  }

  /** Stops watching the source and closes every socket. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#timer);
    this.#stop();
    for (const f of [...this.#feeds.values()]) this.#remove(f);
  }

  #records(records: readonly ProducerRecord[]): void {
    if (this.#closed) return;
    const keep = new Set<string>();
    for (const [i, r] of records.entries()) {
      try {
        checkRecord(r, `record ${i}`);
      } catch (err) {
        this.#log.warn({ err: (err as Error).message }, "directory: record ignored");
        continue;
      }
      keep.add(r.control);
      const f = this.#feeds.get(r.control);
      if (f !== undefined && f.record.events === r.events && f.record.replay === r.replay) {
        if (r.incarnation !== undefined) f.view.hintIncarnation(r.incarnation, this.#now());
        continue;
      }
      if (f !== undefined) this.#remove(f);
      this.#add(r);
    }
    for (const f of [...this.#feeds.values()]) if (!keep.has(f.record.control)) this.#remove(f);
  }

  #add(record: ProducerRecord): void {
    const c = this.#curve;
    const curve =
      c === undefined
        ? {}
        : {
            curveServerKey: typeof c.serverKey === "string" ? c.serverKey : c.serverKey(record.control),
            curvePublicKey: c.publicKey,
            curveSecretKey: c.secretKey,
          };
    const sub = new Subscriber({ linger: 0, maxMessageSize: MAX_CONTROL_MESSAGE_BYTES, ...curve });
    const dealer = new Dealer({ linger: 0, maxMessageSize: MAX_CONTROL_MESSAGE_BYTES, ...curve });
    const feed = { record: { ...record }, sub, dealer, wanted: null, sending: false, closed: false } as Omit<
      Feed,
      "view"
    > as Feed;
    const sink: ViewSink = {
      add: (h) => {
        let s = this.#index.get(h);
        if (s === undefined) {
          s = new Set();
          this.#index.set(h, s);
        }
        s.add(feed);
        this.#emit(feed, "stored", h);
      },
      remove: (h) => {
        const s = this.#index.get(h);
        if (s?.delete(feed) === true && s.size === 0) this.#index.delete(h);
        this.#emit(feed, "evicted", h);
      },
      trust: (t, why) => {
        this.#trustGauge();
        if (!t && why.startsWith("gap")) this.#m.gaps.inc();
        if (t && why.startsWith("snapshot")) this.#m.snapshots.inc();
        const kind = t ? "trusted" : why.startsWith("silent") ? "gone" : "untrusted";
        this.onChange?.({ producer: feed.record.control, kind, mmHashes: [], why });
      },
      ask: (req) => this.#ask(feed, req),
    };
    this.#feeds.set(record.control, feed);
    try {
      sub.subscribe();
      sub.connect(record.events);
      dealer.connect(record.replay);
    } catch (err) {
      this.#feeds.delete(record.control);
      sub.close();
      dealer.close();
      this.#log.warn({ err: (err as Error).message, producer: record.control }, "directory: cannot connect");
      return;
    }
    feed.view = new ResidencyView(sink, this.#now());
    void this.#loop(feed, sub, false);
    void this.#loop(feed, dealer, true);
  }

  #remove(f: Feed): void {
    f.closed = true;
    this.#feeds.delete(f.record.control);
    f.view.clear();
    f.sub.close();
    f.dealer.close();
    this.#trustGauge();
  }

  #ask(f: Feed, req: ReplayRequest): void {
    this.#m.asks.inc();
    f.wanted = packMsg({ request_id: req.requestId, incarnation: req.incarnation, since: req.since });
    if (!f.sending) void this.#pumpAsk(f);
  }

  async #pumpAsk(f: Feed): Promise<void> {
    f.sending = true;
    while (f.wanted !== null && !f.closed) {
      const msg = f.wanted;
      f.wanted = null;
      try {
        await f.dealer.send(msg);
      } catch (err) {
        if (!f.closed) this.#log.debug({ err: (err as Error).message }, "directory: replay request not sent");
      }
    }
    f.sending = false;
  }

  async #loop(f: Feed, sock: Subscriber | Dealer, reply: boolean): Promise<void> {
    try {
      for await (const frames of sock) {
        if (f.closed) break;
        let m: ReturnType<typeof decodeResidencyMessage>;
        try {
          if (frames.length !== 1) throw new EcError("EC_MALFORMED", `${frames.length} frames`);
          m = decodeResidencyMessage(frames[0]!);
        } catch (err) {
          this.#m.malformed.inc();
          this.#log.debug({ err: (err as Error).message }, "directory: dropped malformed message");
          continue;
        }
        if (reply) f.view.onReply(m, this.#now());
        else f.view.onLive(m, this.#now());
      }
    } catch (err) {
      if (!f.closed) this.#log.warn({ err: (err as Error).message }, "directory: receive loop ended");
    }
  }

  #emit(f: Feed, kind: "stored" | "evicted", h: string): void {
    this.onChange?.({ producer: f.record.control, kind, mmHashes: [h], why: "" });
  }

  #trustGauge(): void {
    let n = 0;
    for (const f of this.#feeds.values()) if (f.view?.trusted === true) n++;
    this.#m.trusted.set(n);
  }
}

function checkRecord(r: ProducerRecord, what: string): void {
  if (r === null || typeof r !== "object")
    throw new EcError("EC_BAD_OPTION", `option ${what}: expected a record`);
  for (const k of ["control", "events", "replay"] as const) {
    if (typeof r[k] !== "string" || r[k].length === 0) {
      throw new EcError("EC_BAD_OPTION", `option ${what}.${k}: expected a ZeroMQ endpoint string`);
    }
  }
  if (r.incarnation !== undefined && typeof r.incarnation !== "string") {
    throw new EcError("EC_BAD_OPTION", `option ${what}.incarnation: expected a string`);
  }
}

function info(f: Feed): ProducerViewInfo {
  const v = f.view;
  return {
    producer: f.record.control,
    incarnation: v.incarnation,
    seq: v.seq,
    trusted: v.trusted,
    gone: v.gone,
    size: v.set.size,
    freeBlocks: v.freeBlocks,
    gaps: v.gaps,
    snapshots: v.snapshots,
    asks: v.asks,
  };
}
