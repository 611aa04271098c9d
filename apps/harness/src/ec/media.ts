/**
 * Media sources of the engine: {@link EcMedia} loads embeddings from the encoder process through
 * `@tapwire/ec-connector`'s ConsumerConnector (EC-CONTRACT 7), falling back to local encoding when
 * a transfer fails; {@link LocalMedia} encodes everything in-process.
 */
import { createHash } from "node:crypto";
import type { ConsumerConnector } from "@tapwire/ec-connector";
import { syntheticEmbedding } from "@tapwire/ec-connector";
import { BUCKETS, type Counter, type Histogram, type Registry } from "@tapwire/stats";
import type { MediaReady, MediaSource } from "../engine/engine.js";
import { embeddingDigest } from "../engine/sequence.js";
import type { RequestSpec } from "../engine/workload.js";

function embeddingDigestHex(s: string): string {
  return createHash("sha256").update(s).digest("hex");
}

/** The embedding of media item `mmHash` as the encoder computes it (deterministic). */
export function localEmbedding(mmHash: string, nbytes: number): Uint8Array {
  return syntheticEmbedding(mmHash, nbytes);
}

/** Every item encoded locally at once (no encoder process). */
export class LocalMedia implements MediaSource {
  private ready: MediaReady[] = [];
  constructor(private readonly nbytes: number) {}
  request(spec: RequestSpec): void {
    this.ready.push({
      spec,
      digests: spec.media.map((h) => embeddingDigest(localEmbedding(h, this.nbytes))),
    });
  }
  poll(): MediaReady[] {
    const out = this.ready;
    this.ready = [];
    return out;
  }
  get waiting(): number {
    return this.ready.length;
  }
}

/** Counters of {@link EcMedia} (in the engine's registry). */
export class EcMediaMetrics {
  /** Media items asked for by arriving requests. */
  readonly lookups: Counter;
  /** Items already ready in the local cache (no transfer). */
  readonly cacheHits: Counter;
  /** Items that joined a transfer already in flight for another request. */
  readonly joined: Counter;
  /** Transfers started by the harness. */
  readonly transfersStarted: Counter;
  /** Transfers completed (embedding promoted in the local cache). */
  readonly transfers: Counter;
  /** Bytes of completed transfers. */
  readonly bytes: Counter;
  /** Items encoded locally because a transfer failed. */
  readonly fallbacks: Counter;
  /** Requests that waited for media. */
  readonly requests: Counter;
  /** Time from arrival until every item of a request was available. */
  readonly wait: Histogram;
  /** Probe transfers completed (health checks of a restarted encoder, not used by requests). */
  readonly probes: Counter;
  /** Probe transfers that failed. */
  readonly probeFailures: Counter;

  constructor(r: Registry) {
    this.lookups = r.counter("ec_lookups", "media items asked for by arriving requests");
    this.cacheHits = r.counter("ec_cache_hits", "media items already in the local encoder cache");
    this.joined = r.counter("ec_joined", "media items that joined a transfer already in flight");
    this.transfersStarted = r.counter("ec_transfers_started", "embedding transfers started");
    this.transfers = r.counter("ec_transfers", "embedding transfers completed");
    this.bytes = r.counter("ec_transfer_bytes", "bytes of completed embedding transfers");
    this.fallbacks = r.counter("ec_fallbacks", "media items encoded locally after a failed transfer");
    this.requests = r.counter("ec_requests", "requests that waited for media");
    this.probes = r.counter("ec_probes", "probe transfers completed (encoder health checks)");
    this.probeFailures = r.counter("ec_probe_failures", "probe transfers that failed");
    this.wait = r.histogram("ec_wait_seconds", {
      help: "arrival until all media of a request are loaded",
      unit: "seconds",
      buckets: BUCKETS.EC_TRANSFER_SECONDS,
    });
  }
}

interface Waiting {
  spec: RequestSpec;
  since: number;
  missing: Set<string>;
}

/** Options of {@link EcMedia}. */
export interface EcMediaOptions {
  connector: ConsumerConnector;
  /** The producer's ZeroMQ control endpoint. */
  producer: string;
  /** Bytes of one embedding. */
  nbytes: number;
  /** Per item: give up transferring (and encode locally) after this long. */
  deadlineMs: number;
  metrics: EcMediaMetrics;
  /** Called for each local fallback (mm_hash, reason). */
  onFallback?: (mmHash: string, reason: string) => void;
  /**
   * EC-CONTRACT 10.4 (`--encoders N`): place each transfer on a trusted holder instead of asking
   * `producer`; "waiting" leaves the item missing (retried every poll), "fallback" encodes it locally.
   */
  placement?: {
    place(
      connector: ConsumerConnector,
      mmHash: string,
      nbytes: number,
      deadlineMs: number,
      now: number,
    ): "ready" | "pending" | "waiting" | "fallback";
  };
  /**
   * Test hook: flip one bit of the first embedding the engine reads (transferred, or encoded
   * locally after a failed transfer), as if memory had been corrupted after the CRC check, to
   * prove the lossless check catches it.
   */
  corruptFirstLoad?: boolean;
}

/**
 * Media through the encoder cache: an arriving request's items are looked up in the local cache
 * (hit), joined to a transfer in flight, or requested from the producer; the request becomes
 * ready once every item is loaded (or encoded locally after a failure). The SHA-256 of an item is
 * computed from the transferred bytes as soon as they are promoted, so the engine's conditioning
 * depends on exactly what crossed the data plane.
 */
export class EcMedia implements MediaSource {
  private readonly o: EcMediaOptions;
  private readonly waitingSpecs: Waiting[] = [];
  /** Digest of items available now (loaded this step or encoded locally), by mm_hash. */
  private readonly digests = new Map<string, Uint8Array>();
  /** Items with a transfer in flight. */
  private readonly inFlight = new Set<string>();
  private readonly probes = new Set<string>();
  private probeCount = 0;
  private corrupted = false;

  constructor(options: EcMediaOptions) {
    this.o = options;
  }

  get waiting(): number {
    return this.waitingSpecs.length;
  }

  /** Transfers still in flight. */
  get pending(): number {
    return this.inFlight.size;
  }

  request(spec: RequestSpec): void {
    const { connector, metrics } = this.o;
    const now = performance.now();
    metrics.requests.inc();
    const w: Waiting = { spec, since: now, missing: new Set() };
    for (const h of spec.media) {
      metrics.lookups.inc();
      if (connector.cache.isReady(h)) {
        metrics.cacheHits.inc();
        this.hit(h);
        continue;
      }
      w.missing.add(h);
      if (this.inFlight.has(h)) {
        metrics.joined.inc();
        continue;
      }
      this.start(h, now);
    }
    this.waitingSpecs.push(w);
  }

  /**
   * Transfers one fresh item that no request needs (the encoder encodes it on the miss) and frees
   * it once loaded: proves a restarted encoder serves again without waiting for traffic.
   */
  probe(): void {
    const h = embeddingDigestHex(`tapwire-harness-probe:${this.probeCount++}:${performance.now()}`);
    const now = performance.now();
    try {
      this.o.connector.request(h, this.o.producer, this.o.nbytes, now + this.o.deadlineMs, now);
    } catch {
      this.o.metrics.probeFailures.inc();
      return;
    }
    this.probes.add(h);
    this.inFlight.add(h);
  }

  private start(h: string, now: number): void {
    const { connector, metrics } = this.o;
    let r: "ready" | "pending";
    try {
      const placed = this.o.placement?.place(connector, h, this.o.nbytes, this.o.deadlineMs, now);
      if (placed === "waiting") return; // no trusted holder yet: poll asks again
      if (placed === "fallback") {
        this.fallback(h, "no trusted encoder held it by its deadline");
        return;
      }
      r = placed ?? connector.request(h, this.o.producer, this.o.nbytes, now + this.o.deadlineMs, now);
    } catch (e) {
      this.fallback(h, `request refused: ${e instanceof Error ? e.message : String(e)}`);
      return;
    }
    if (r === "ready") {
      metrics.cacheHits.inc();
      this.hit(h);
      return;
    }
    metrics.transfersStarted.inc();
    this.inFlight.add(h);
  }

  /** A cache hit: the digest of the cached bytes, unless the same read is already known this step. */
  private hit(h: string): void {
    if (!this.digests.has(h)) this.digests.set(h, embeddingDigest(this.o.connector.cache.view(h)));
  }

  private fallback(h: string, reason: string): void {
    this.o.metrics.fallbacks.inc();
    this.o.onFallback?.(h, reason);
    this.digests.set(h, embeddingDigest(this.maybeCorrupt(localEmbedding(h, this.o.nbytes))));
  }

  /** The test hook of {@link EcMediaOptions.corruptFirstLoad}: a copy with one bit flipped, once. */
  private maybeCorrupt(bytes: Uint8Array): Uint8Array {
    if (!this.o.corruptFirstLoad || this.corrupted) return bytes;
    this.corrupted = true;
    const copy = bytes.slice();
    copy[copy.length >> 1] = (copy[copy.length >> 1] as number) ^ 1;
    return copy;
  }

  poll(): MediaReady[] {
    const { connector, metrics } = this.o;
    const now = performance.now();
    const res = connector.poll(now);
    for (const h of res.loaded) {
      this.inFlight.delete(h);
      if (this.probes.delete(h)) {
        metrics.probes.inc();
        connector.free(h);
        continue;
      }
      metrics.transfers.inc();
      metrics.bytes.inc(this.o.nbytes);
      this.digests.set(h, embeddingDigest(this.maybeCorrupt(connector.cache.view(h))));
    }
    for (const f of res.failed) {
      this.inFlight.delete(f.mmHash);
      if (this.probes.delete(f.mmHash)) {
        metrics.probeFailures.inc();
        continue;
      }
      this.fallback(f.mmHash, f.reason);
    }
    const out: MediaReady[] = [];
    for (let i = 0; i < this.waitingSpecs.length; i++) {
      const w = this.waitingSpecs[i] as Waiting;
      for (const h of w.missing) if (this.digests.has(h)) w.missing.delete(h);
      for (const h of w.missing) {
        // evicted or dropped without a result (should not happen): ask again
        if (!this.inFlight.has(h)) this.start(h, now);
      }
      if (w.missing.size > 0) continue;
      out.push({ spec: w.spec, digests: w.spec.media.map((h) => this.digests.get(h) as Uint8Array) });
      metrics.wait.observe((now - w.since) / 1000);
      this.waitingSpecs.splice(i, 1);
      i--;
    }
    // digests are only kept while a request may still need them; hits re-read the cache
    if (this.waitingSpecs.length === 0) this.digests.clear();
    return out;
  }

  /** Polls until no transfer is in flight or `timeoutMs` passes (end of run). */
  async drain(timeoutMs: number): Promise<boolean> {
    const end = performance.now() + timeoutMs;
    while (performance.now() < end) {
      this.poll();
      if (this.inFlight.size === 0 && this.o.connector.pendingCount === 0) return true;
      await new Promise((r) => setTimeout(r, 5));
    }
    return false;
  }
}
