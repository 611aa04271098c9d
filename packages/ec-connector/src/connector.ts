import type { Counter, Gauge, Registry } from "@tapwire/stats";
import type { Logger } from "pino";
import type { BackoffPolicy } from "./backoff.js";
import { Backoff } from "./backoff.js";
import { EmbeddingCache } from "./cache.js";
import type { ConsumerSessionResults } from "./consumer-session.js";
import { CONSUMER_DEFAULTS, ConsumerSession } from "./consumer-session.js";
import type { CurveClientOptions } from "./curve.js";
import { checkCurveKey } from "./curve.js";
import type { DataTlsOptions } from "./data/socket.js";
import { SocketDataTransport } from "./data/socket.js";
import type { DataTransport } from "./data/transport.js";
import { checkFunctionOption, checkNumberOption, EcError, isIntInRange } from "./errors.js";
import { defaultRegistry, silentLogger } from "./metrics.js";
import type { CompatibilityInfo } from "./protocol.js";
import { compatibilityHash } from "./protocol.js";
import type { HeartbeatOptions } from "./zmq.js";
import { validateHeartbeat, ZmqDealerClient } from "./zmq.js";

/** The consumer's control connection to one producer (a ZeroMQ DEALER, or a fake in tests). */
export interface ControlClient {
  /** Queues one message; never blocks or throws. */
  send(payload: Uint8Array): void;
  /** Drains received messages without blocking. */
  poll(): Uint8Array[];
  /** Closes the connection; no callback fires afterwards. */
  close(): void;
  /** Set by the connector: called when the peer is seen down (heartbeat timeout, disconnect). */
  onPeerDown: ((why: string) => void) | null;
  /** Set by the connector: called when a message arrives. */
  onMessage: (() => void) | null;
}

/** Retry policy for retryable outcomes (NOT_READY, ack timeout, peer down), bounded by each request's deadline. */
export interface RetryPolicy {
  /** First delay (default 10 ms). */
  initialMs?: number;
  /** Largest delay (default 200 ms). */
  maxMs?: number;
  /** Growth per attempt (default 2). */
  multiplier?: number;
}

/** Default {@link RetryPolicy}. */
export const RETRY_DEFAULTS = { initialMs: 10, maxMs: 200, multiplier: 2 } as const;

/** Options of {@link ConsumerConnector}. */
export interface ConsumerConnectorOptions {
  /** The local cache (the single owner of the blocks reads land in). */
  cache: EmbeddingCache;
  /** The local data plane over `cache.region`. */
  data: DataTransport;
  /** Compatibility inputs (EC-CONTRACT 2) or a precomputed hash. `blockBytes` must equal the cache's. */
  compatibility: CompatibilityInfo | string;
  /** `ack_timeout_s` in ms: an XferReq without an ack by then is retried (default 2 000, EC-CONTRACT 6.3). */
  ackTimeoutMs?: number;
  /** `read_timeout_s` in ms: a read still PROC after it is quarantined (default 20 000, EC-CONTRACT 6.3). */
  readTimeoutMs?: number;
  /** `quarantine_timeout_s` in ms: a quarantined read still PROC after it is released (default 60 000, EC-CONTRACT 6.3). */
  quarantineTimeoutMs?: number;
  /** Verify each read's CRC-32 (default true). */
  verifyChecksum?: boolean;
  /** Delays between re-requests of retryable outcomes (default {@link RETRY_DEFAULTS}). */
  retry?: RetryPolicy;
  /** Close a producer's session after this long without requests (default 60 000 ms). */
  idleCloseMs?: number;
  /** ZeroMQ heartbeats of the DEALERs (default 2/4/8 s). */
  heartbeat?: HeartbeatOptions;
  /**
   * EC-CONTRACT 9.4: authenticate every DEALER with this CURVE key pair; `serverKey` is the
   * producer's public key (a function of the producer address for several producers).
   */
  curve?: CurveClientOptions;
  /** Monotonic clock (ms) used when `poll()` is called without `now` (default `performance.now`). */
  now?: () => number;
  /** Builds the control connection to a producer (default: a ZeroMQ DEALER). */
  connect?: (producer: string) => ControlClient;
  /** Where the `connector_*`, `consumer_*` and `data_*` metrics go (default: a fresh `@tapwire/stats` Registry). */
  registry?: Registry;
  /** pino logger (default: silent). */
  logger?: Logger;
}

/** Options of {@link ConsumerConnector.create}: the cache and a socket data plane are built for you. */
export interface CreateConsumerConnectorOptions extends Omit<ConsumerConnectorOptions, "cache" | "data"> {
  /** Blocks of the local cache (integer >= 1). */
  numBlocks: number;
  /** Bytes per block (integer >= 1); must equal the producer's (it is part of the compatibility hash). */
  blockBytes: number;
  /** Agent name (default "ec-consumer"). */
  name?: string;
  /** Run a data server too (`tcp://…` or `unix://…`); a consumer only reads, so it is optional. */
  dataListen?: string;
  /**
   * Checksum on a worker thread (a `SharedArrayBuffer` cache region) so the CRC-32 overlaps the
   * receive; worth it with a spare core (default false).
   */
  checksumThread?: boolean;
  /** EC-CONTRACT 9.4: the client certificate, key and trusted producer certificates for `tls://` data planes. */
  tls?: DataTlsOptions;
}

/** A request that will not complete: compute the embedding locally. */
export interface FailedRequest {
  /** The embedding's content hash. */
  mmHash: string;
  /** Why it failed, in words (the NACK name, a read failure, a checksum mismatch, the deadline, an allocation failure...). */
  reason: string;
}

/** EC-CONTRACT 7: what a scheduler needs per step. */
export interface ConnectorStepResults {
  /** Promoted to ready local entries this step: read them with `cache.view(mmHash)`. */
  loaded: string[];
  /** Given up this step (NACK, read failure, checksum, deadline, cache full...). */
  failed: FailedRequest[];
  /** Still in progress after this step. */
  pending: string[];
}

interface Request {
  mmHash: string;
  producer: string;
  nbytes: number;
  deadline: number;
  /** Delays between this request's re-requests (EC-CONTRACT 7: bounded by its deadline). */
  backoff: Backoff;
  /** The session holding the transfer, or null while waiting to retry. */
  session: Pooled | null;
  retryAt: number;
  lastReason: string;
}

interface Pooled {
  addr: string;
  client: ControlClient;
  session: ConsumerSession;
  down: string | null;
  lastUsed: number;
}

interface ConnectorMetrics {
  requests: Counter;
  loaded: Counter;
  failed: Counter;
  retries: Counter;
  evictions: Counter;
  pending: Gauge;
  sessions: Gauge;
  freeBlocks: Gauge;
  pinnedBlocks: Gauge;
  retiredBlocks: Gauge;
}

/**
 * EC-CONTRACT 7: one object per consumer instance. Pools sessions by producer address (created on
 * first use, closed on peer down once drained, or when idle), allocates blocks from the local cache,
 * bounds retries by each request's deadline, promotes completed reads to ready entries, and reports
 * loaded / failed / pending per `poll()`. Peer liveness comes from ZeroMQ heartbeats and socket
 * monitor events. `poll()` never blocks: call it once per engine step and let the event loop run
 * between steps.
 */
export class ConsumerConnector {
  /** The local cache: read loaded embeddings with `cache.view(mmHash)`. */
  readonly cache: EmbeddingCache;
  /** The local data plane. */
  readonly data: DataTransport;
  /** The metrics registry. */
  readonly registry: Registry;
  /** Called whenever something arrived that a `poll()` would act on (message, completed read). */
  onActivity: (() => void) | null = null;

  readonly #compat: string;
  readonly #ackTimeout: number;
  readonly #readTimeout: number;
  readonly #quarantineTimeout: number;
  readonly #verify: boolean;
  readonly #retry: BackoffPolicy;
  readonly #idleClose: number;
  readonly #now: () => number;
  readonly #connect: (producer: string) => ControlClient;
  readonly #log: Logger;
  readonly #m: ConnectorMetrics;
  readonly #pool = new Map<string, Pooled>();
  readonly #draining = new Set<Pooled>();
  readonly #requests = new Map<string, Request>();
  /** Quarantined blocks detached from their key: `${sessionId}:${mmHash}` → holding id. */
  readonly #held = new Map<string, number>();
  #failedNow: FailedRequest[] = [];
  #lastEvictions: number;
  #ownsData = false;
  #closed = false;

  constructor(options: ConsumerConnectorOptions) {
    if (!(options.cache instanceof EmbeddingCache)) {
      throw new EcError("EC_BAD_OPTION", "option cache: expected an EmbeddingCache");
    }
    if (options.data === null || typeof options.data !== "object") {
      throw new EcError("EC_BAD_OPTION", "option data: expected a DataTransport");
    }
    this.cache = options.cache;
    this.data = options.data;
    if (typeof options.compatibility === "string") {
      if (!/^[0-9a-f]{64}$/.test(options.compatibility)) {
        throw new EcError("EC_BAD_OPTION", "option compatibility: expected 64 lowercase hex digits");
      }
      this.#compat = options.compatibility;
    } else {
      if (options.compatibility?.blockBytes !== this.cache.blockBytes) {
        throw new EcError(
          "EC_BAD_OPTION",
          `option compatibility.blockBytes: ${String(options.compatibility?.blockBytes)} != cache block size ${this.cache.blockBytes}`,
        );
      }
      this.#compat = compatibilityHash(options.compatibility);
    }
    this.#ackTimeout = checkNumberOption(
      "ackTimeoutMs",
      options.ackTimeoutMs ?? CONSUMER_DEFAULTS.ackTimeoutMs,
      0,
    );
    this.#readTimeout = checkNumberOption(
      "readTimeoutMs",
      options.readTimeoutMs ?? CONSUMER_DEFAULTS.readTimeoutMs,
      0,
    );
    this.#quarantineTimeout = checkNumberOption(
      "quarantineTimeoutMs",
      options.quarantineTimeoutMs ?? CONSUMER_DEFAULTS.quarantineTimeoutMs,
      0,
    );
    if (options.verifyChecksum !== undefined && typeof options.verifyChecksum !== "boolean") {
      throw new EcError("EC_BAD_OPTION", "option verifyChecksum: expected a boolean");
    }
    this.#verify = options.verifyChecksum ?? true;
    this.#retry = {
      initialMs: checkNumberOption(
        "retry.initialMs",
        options.retry?.initialMs ?? RETRY_DEFAULTS.initialMs,
        0,
      ),
      maxMs: checkNumberOption("retry.maxMs", options.retry?.maxMs ?? RETRY_DEFAULTS.maxMs, 0),
      multiplier: checkNumberOption(
        "retry.multiplier",
        options.retry?.multiplier ?? RETRY_DEFAULTS.multiplier,
        1,
      ),
    };
    this.#idleClose = checkNumberOption("idleCloseMs", options.idleCloseMs ?? 60_000, 0);
    checkFunctionOption("now", options.now);
    this.#now = options.now ?? (() => performance.now());
    if (options.connect !== undefined && typeof options.connect !== "function") {
      throw new EcError("EC_BAD_OPTION", "option connect: expected a function");
    }
    this.#log = options.logger ?? silentLogger();
    const hb = options.heartbeat;
    const curve = options.curve;
    if (curve !== undefined) {
      if (curve === null || typeof curve !== "object")
        throw new EcError("EC_BAD_OPTION", "option curve: expected an object");
      checkCurveKey("curve.publicKey", curve.publicKey);
      checkCurveKey("curve.secretKey", curve.secretKey);
      if (typeof curve.serverKey !== "function") checkCurveKey("curve.serverKey", curve.serverKey);
    }
    this.#connect =
      options.connect ??
      ((addr) =>
        new ZmqDealerClient(addr, {
          logger: this.#log,
          ...(hb === undefined ? {} : { heartbeat: hb }),
          ...(curve === undefined
            ? {}
            : {
                curve: {
                  publicKey: curve.publicKey,
                  secretKey: curve.secretKey,
                  serverKey: typeof curve.serverKey === "function" ? curve.serverKey(addr) : curve.serverKey,
                },
              }),
        }));
    if (hb !== undefined) validateHeartbeat(hb);
    this.registry = options.registry ?? defaultRegistry();
    const r = this.registry;
    this.#m = {
      requests: r.counter("connector_requests", "requests accepted by the connector (EC-CONTRACT 7)"),
      loaded: r.counter("connector_loaded", "embeddings promoted to ready local entries"),
      failed: r.counter("connector_failed", "requests given up (compute locally)"),
      retries: r.counter("connector_retries", "re-requests after NOT_READY, ack timeout or peer down"),
      evictions: r.counter("consumer_evictions", "local cache entries evicted (LRU)"),
      pending: r.gauge("connector_pending", "requests in progress"),
      sessions: r.gauge("connector_sessions", "producer sessions open"),
      freeBlocks: r.gauge("consumer_free_blocks", "free local cache blocks"),
      pinnedBlocks: r.gauge("consumer_pinned_blocks", "pinned local cache blocks"),
      retiredBlocks: r.gauge("consumer_retired_blocks", "retired local cache blocks (never reused)"),
    };
    this.#lastEvictions = this.cache.evictions;
    const wake = () => this.onActivity?.();
    this.data.onReadDone = wake;
  }

  /**
   * Builds an {@link EmbeddingCache} and a socket data plane (`SocketDataTransport`) and returns a
   * connector over them; `close()` closes the data plane too.
   */
  static async create(options: CreateConsumerConnectorOptions): Promise<ConsumerConnector> {
    const cache = new EmbeddingCache({
      numBlocks: options.numBlocks,
      blockBytes: options.blockBytes,
      shared: options.checksumThread === true,
    });
    const registry = options.registry ?? defaultRegistry();
    const data = await SocketDataTransport.create({
      name: options.name ?? "ec-consumer",
      region: cache.region,
      numBlocks: cache.numBlocks,
      blockBytes: cache.blockBytes,
      registry,
      ...(options.dataListen === undefined ? {} : { listen: options.dataListen }),
      ...(options.checksumThread === undefined ? {} : { checksumThread: options.checksumThread }),
      ...(options.tls === undefined ? {} : { tls: options.tls }),
      ...(options.logger === undefined ? {} : { logger: options.logger }),
    });
    const {
      numBlocks: _n,
      blockBytes: _b,
      name: _name,
      dataListen: _l,
      checksumThread: _t,
      tls: _tls,
      ...rest
    } = options;
    let c: ConsumerConnector;
    try {
      c = new ConsumerConnector({ ...rest, registry, cache, data });
    } catch (err) {
      // a bad option: do not leave the data plane (server, checksum thread) running
      await data.close();
      throw err;
    }
    c.#ownsData = true;
    return c;
  }

  /** Number of requests in progress. */
  get pendingCount(): number {
    return this.#requests.size;
  }

  /**
   * Asks `producer` (its ZeroMQ control endpoint) for the `nbytes`-byte embedding of `mmHash`,
   * retrying retryable outcomes until `deadline` (ms, on the connector's clock). Returns `"ready"`
   * when the local cache already holds it, else `"pending"`; the outcome comes from `poll()`
   * (`loaded` or `failed`). A second request for a pending hash joins the first.
   */
  request(
    mmHash: string,
    producer: string,
    nbytes: number,
    deadline: number,
    now: number = this.#now(),
  ): "ready" | "pending" {
    if (this.#closed) throw new EcError("EC_CLOSED", "connector: closed");
    if (typeof mmHash !== "string" || Buffer.byteLength(mmHash) > 256) {
      throw new EcError("EC_BAD_ARGUMENT", "mmHash: expected a string of at most 256 bytes");
    }
    if (typeof producer !== "string" || producer.length === 0) {
      throw new EcError("EC_BAD_ARGUMENT", "producer: expected a ZeroMQ endpoint");
    }
    if (!isIntInRange(nbytes, 1)) {
      throw new EcError("EC_BAD_ARGUMENT", `nbytes: expected a positive integer, got ${String(nbytes)}`);
    }
    if (typeof deadline !== "number" || Number.isNaN(deadline)) {
      throw new EcError("EC_BAD_ARGUMENT", "deadline: expected a number (ms)");
    }
    if (this.#requests.has(mmHash)) return "pending";
    if (this.cache.isReady(mmHash)) return "ready";
    this.#m.requests.inc();
    if (this.cache.has(mmHash)) {
      this.#fail(mmHash, "cache entry busy (allocated outside the connector)");
      return "pending";
    }
    try {
      this.cache.allocate(mmHash, nbytes);
    } catch (err) {
      this.#fail(mmHash, `allocation failed: ${(err as Error).message}`);
      return "pending";
    }
    const req: Request = {
      mmHash,
      producer,
      nbytes,
      deadline,
      backoff: new Backoff(this.#retry),
      session: null,
      retryAt: now,
      lastReason: "",
    };
    this.#requests.set(mmHash, req);
    this.#start(req, now);
    return "pending";
  }

  /**
   * One step (EC-CONTRACT 7): polls every session with what its DEALER received, frees, detaches,
   * promotes and retries per the session results (6.5), and reports loaded / failed / pending.
   * Never blocks or throws.
   */
  poll(now: number = this.#now()): ConnectorStepResults {
    const loaded: string[] = [];
    for (const p of [...this.#pool.values(), ...this.#draining]) {
      let msgs: Uint8Array[] = [];
      try {
        msgs = p.client.poll();
      } catch (err) {
        this.#log.warn({ err }, "control poll failed");
      }
      p.session.poll(msgs, now);
      if (p.down !== null && this.#pool.get(p.addr) === p) {
        // EC-CONTRACT 6.4 + 7: the session leaves the pool (new requests get a fresh one) and drains.
        this.#log.warn({ producer: p.addr, why: p.down }, "producer down");
        p.session.onPeerDown(now);
        this.#pool.delete(p.addr);
        this.#draining.add(p);
      }
      this.#apply(p, p.session.takeResults(), now, loaded);
      if (this.#draining.has(p) && !p.session.hasInFlight()) this.#closeSession(p, now, loaded);
    }
    for (const req of this.#requests.values()) {
      if (req.session !== null || now < req.retryAt) continue;
      if (now >= req.deadline) {
        this.#drop(req, `deadline passed (last: ${req.lastReason})`);
        continue;
      }
      this.#m.retries.inc();
      this.#start(req, now);
    }
    for (const p of [...this.#pool.values()]) {
      if (!p.session.hasInFlight() && now - p.lastUsed > this.#idleClose) {
        this.#pool.delete(p.addr);
        this.#closeSession(p, now, loaded);
      }
    }
    const failed = this.#failedNow;
    this.#failedNow = [];
    this.#gauges();
    return { loaded, failed, pending: [...this.#requests.keys()] };
  }

  /** Frees a loaded entry (the engine is done with it); it may also simply be left to LRU eviction. */
  free(mmHash: string): void {
    this.cache.free(mmHash);
  }

  /**
   * Closes every session (releasing reads: blocks freed when the release guarantees no further
   * writes, else retired), fails pending requests, and closes the data plane if `create()` built it.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const now = this.#now();
    const sink: string[] = [];
    for (const p of [...this.#pool.values(), ...this.#draining]) this.#closeSession(p, now, sink);
    this.#pool.clear();
    this.#draining.clear();
    for (const req of [...this.#requests.values()]) this.#drop(req, "connector closed");
    for (const id of this.#held.values()) this.cache.releaseDetached(id, true);
    this.#held.clear();
    if (this.#ownsData) await this.data.close();
  }

  #session(addr: string, now: number): Pooled {
    let p = this.#pool.get(addr);
    if (p === undefined) {
      const client = this.#connect(addr);
      const session = new ConsumerSession({
        addr,
        send: (payload) => client.send(payload),
        data: this.data,
        compatibilityHash: this.#compat,
        numBlocks: this.cache.numBlocks,
        blockBytes: this.cache.blockBytes,
        readTimeoutMs: this.#readTimeout,
        quarantineTimeoutMs: this.#quarantineTimeout,
        verifyChecksum: this.#verify,
        registry: this.registry,
        logger: this.#log,
      });
      const pooled: Pooled = { addr, client, session, down: null, lastUsed: now };
      client.onPeerDown = (why) => {
        pooled.down = why;
        this.onActivity?.();
      };
      client.onMessage = () => this.onActivity?.();
      p = pooled;
      this.#pool.set(addr, p);
      this.#m.sessions.set(this.#pool.size + this.#draining.size);
    }
    p.lastUsed = now;
    return p;
  }

  #start(req: Request, now: number): void {
    const entry = this.cache.get(req.mmHash);
    if (entry === undefined || entry.ready) {
      this.#drop(req, "local entry changed outside the connector");
      return;
    }
    const blocks = entry.blocks;
    let p: Pooled;
    try {
      // A malformed producer address throws here (EC_BAD_ENDPOINT): fail the request, keep no blocks.
      p = this.#session(req.producer, now);
      p.session.startXfer(req.mmHash, blocks, Math.min(now + this.#ackTimeout, req.deadline), req.nbytes);
    } catch (err) {
      this.#drop(req, `could not start: ${(err as Error).message}`);
      return;
    }
    req.session = p;
  }

  #apply(p: Pooled, r: ConsumerSessionResults, now: number, loaded: string[]): void {
    const sid = p.session.sessionId;
    // Quarantined first: a read may be quarantined and settle within one poll.
    for (const h of r.quarantined) {
      const req = this.#mine(p, h);
      if (req === undefined) continue;
      this.#requests.delete(h);
      // The read may still land: the blocks leave the key (so the engine may recompute and cache
      // it) but stay owned until the read settles (EC-CONTRACT 6.3, 8).
      this.#guard(h, () => this.#held.set(`${sid}:${h}`, this.cache.detach(h)));
      this.#fail(h, "read timed out or producer went down mid-read (quarantined)");
    }
    for (const c of r.completed) {
      const req = this.#mine(p, c.mmHash);
      if (req === undefined) continue;
      this.#requests.delete(c.mmHash);
      if (this.#guard(c.mmHash, () => this.cache.markReady(c.mmHash, c.crc32))) {
        this.#m.loaded.inc();
        loaded.push(c.mmHash);
      } else {
        this.#fail(c.mmHash, "local entry vanished while the read was in flight");
      }
    }
    for (const x of r.settled) this.#guard(x.mmHash, () => this.#endHold(sid, x.mmHash, true));
    for (const x of r.tombstoned) {
      if (this.#guard(x.mmHash, () => this.#endHold(sid, x.mmHash, true)) === true) continue;
      const req = this.#mine(p, x.mmHash);
      if (req !== undefined) this.#drop(req, x.reason);
    }
    for (const x of r.retired) {
      if (this.#guard(x.mmHash, () => this.#endHold(sid, x.mmHash, false)) === true) continue;
      const req = this.#mine(p, x.mmHash);
      if (req === undefined) continue;
      this.#requests.delete(x.mmHash);
      this.#guard(x.mmHash, () => this.cache.retire(x.mmHash));
      this.#fail(x.mmHash, `${x.reason} (blocks retired)`);
    }
    for (const x of r.retryable) {
      const req = this.#mine(p, x.mmHash);
      if (req === undefined) continue;
      req.session = null;
      req.lastReason = x.reason;
      req.retryAt = now + req.backoff.next();
      if (req.retryAt >= req.deadline) this.#drop(req, `deadline passed (last: ${x.reason})`);
    }
  }

  /**
   * Runs one cache update; a throw (the engine freed an entry the connector still owns) is logged
   * instead of escaping `poll()`. Returns `fn`'s result, or `undefined` after a throw.
   */
  #guard<T>(mmHash: string, fn: () => T): T | undefined {
    try {
      return fn();
    } catch (err) {
      this.#log.error({ err, mmHash }, "cache update failed (entry changed outside the connector?)");
      return undefined;
    }
  }

  /** The request `mmHash` if its transfer lives in this session. */
  #mine(p: Pooled, mmHash: string): Request | undefined {
    const req = this.#requests.get(mmHash);
    return req !== undefined && req.session === p ? req : undefined;
  }

  #endHold(sid: string, mmHash: string, reuse: boolean): boolean {
    const key = `${sid}:${mmHash}`;
    const id = this.#held.get(key);
    if (id === undefined) return false;
    this.#held.delete(key);
    this.cache.releaseDetached(id, reuse);
    return true;
  }

  /** Gives up a request and frees its blocks. */
  #drop(req: Request, reason: string): void {
    this.#requests.delete(req.mmHash);
    this.#guard(req.mmHash, () => {
      if (this.cache.has(req.mmHash) && !this.cache.isReady(req.mmHash)) this.cache.free(req.mmHash);
    });
    this.#fail(req.mmHash, reason);
  }

  #fail(mmHash: string, reason: string): void {
    this.#m.failed.inc();
    this.#log.info({ mmHash, reason }, "encoder-cache request failed; compute locally");
    this.#failedNow.push({ mmHash, reason });
  }

  #closeSession(p: Pooled, now: number, loaded: string[]): void {
    this.#draining.delete(p);
    if (this.#pool.get(p.addr) === p) this.#pool.delete(p.addr);
    p.session.close();
    this.#apply(p, p.session.takeResults(), now, loaded);
    // Requests still pointing at this session (WAITING_ACK at close) were made retryable above.
    try {
      p.client.close();
    } catch (err) {
      this.#log.warn({ err }, "control close failed");
    }
    this.#m.sessions.set(this.#pool.size + this.#draining.size);
  }

  #gauges(): void {
    const ev = this.cache.evictions;
    if (ev > this.#lastEvictions) this.#m.evictions.inc(ev - this.#lastEvictions);
    this.#lastEvictions = ev;
    this.#m.pending.set(this.#requests.size);
    this.#m.freeBlocks.set(this.cache.freeBlocks);
    this.#m.pinnedBlocks.set(this.cache.pinnedBlocks);
    this.#m.retiredBlocks.set(this.cache.retiredBlocks);
  }
}
