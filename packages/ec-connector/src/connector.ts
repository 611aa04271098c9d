import type { Registry } from "@tapwire/stats";
import type { Logger } from "pino";
import type { BackoffPolicy } from "./backoff.js";
import { Backoff } from "./backoff.js";
import { EmbeddingCache } from "./cache.js";
import type {
  ConnectorStepResults,
  ConsumerConnectorOptions,
  ControlClient,
  CreateConsumerConnectorOptions,
  FailedRequest,
  Placement,
} from "./connector-options.js";
import { dealerFactory, RETRY_DEFAULTS } from "./connector-options.js";
import type { ConsumerSessionResults } from "./consumer-session.js";
import { CONSUMER_DEFAULTS, ConsumerSession } from "./consumer-session.js";
import { checksumThreadInlineNote, checksumThreadUsed } from "./crc.js";
import { SocketDataTransport } from "./data/socket.js";
import type { DataTransport } from "./data/transport.js";
import { checkFunctionOption, checkNumberOption, EcError, isIntInRange } from "./errors.js";
import type { ConnectorMetrics } from "./metrics.js";
import { connectorMetrics, defaultRegistry, silentLogger } from "./metrics.js";
import { compatibilityHash } from "./protocol.js";
import { validateHeartbeat } from "./zmq.js";

export type {
  ConnectorStepResults,
  ConsumerConnectorOptions,
  ControlClient,
  CreateConsumerConnectorOptions,
  FailedRequest,
  Placement,
  RetryPolicy,
} from "./connector-options.js";
export { RETRY_DEFAULTS } from "./connector-options.js";

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
  readonly #readAhead: boolean;
  readonly #dataRequests: boolean;
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
  readonly #placement: Placement | null;
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
    if (options.readAhead !== undefined && typeof options.readAhead !== "boolean") {
      throw new EcError("EC_BAD_OPTION", "option readAhead: expected a boolean");
    }
    this.#readAhead = options.readAhead ?? true;
    if (options.dataRequests !== undefined && typeof options.dataRequests !== "boolean") {
      throw new EcError("EC_BAD_OPTION", "option dataRequests: expected a boolean");
    }
    this.#dataRequests = options.dataRequests ?? true;
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
    // issue 19: a request waits for the first handshake at most one ack timeout
    this.#connect =
      options.connect ?? dealerFactory(hb, options.curve, this.#log, Math.ceil(this.#ackTimeout));
    if (hb !== undefined) validateHeartbeat(hb);
    this.registry = options.registry ?? defaultRegistry();
    this.#m = connectorMetrics(this.registry);
    this.#lastEvictions = this.cache.evictions;
    if (options.placement !== undefined && typeof options.placement?.holders !== "function") {
      throw new EcError("EC_BAD_OPTION", "option placement: expected an object with holders()");
    }
    this.#placement = options.placement ?? null;
    const wake = () => this.onActivity?.();
    this.data.onReadDone = wake;
  }

  /**
   * Builds an {@link EmbeddingCache} and a socket data plane (`SocketDataTransport`) and returns a
   * connector over them; `close()` closes the data plane too.
   */
  static async create(options: CreateConsumerConnectorOptions): Promise<ConsumerConnector> {
    // A region the checksum thread will not read stays an ordinary ArrayBuffer (faster copies).
    const thread = checksumThreadUsed(options.checksumThread);
    if (options.checksumThread === true && !thread) options.logger?.info(...checksumThreadInlineNote());
    const cache = new EmbeddingCache({
      numBlocks: options.numBlocks,
      blockBytes: options.blockBytes,
      shared: thread,
    });
    const registry = options.registry ?? defaultRegistry();
    const data = await SocketDataTransport.create({
      name: options.name ?? "ec-consumer",
      region: cache.region,
      numBlocks: cache.numBlocks,
      blockBytes: cache.blockBytes,
      registry,
      ...(options.dataListen === undefined ? {} : { listen: options.dataListen }),
      ...(thread ? { checksumThread: options.checksumThread } : {}),
      ...(options.tls === undefined ? {} : { tls: options.tls }),
      ...(options.logger === undefined ? {} : { logger: options.logger }),
      ...(options.dataShm === undefined ? {} : { shm: options.dataShm }),
    });
    const {
      numBlocks: _n,
      blockBytes: _b,
      name: _name,
      dataListen: _l,
      checksumThread: _t,
      tls: _tls,
      dataShm: _shm,
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
   * EC-CONTRACT 10.4: asks for `mmHash` without naming a producer: the first of the placement's
   * trusted holders (most free blocks first). With no holder it reports `"not-resident"` at once and
   * sends nothing (the caller computes the item or asks an encoder to). The view is advice: a NACK
   * from the chosen producer fails the request as in 6.2.
   */
  requestPlaced(
    mmHash: string,
    nbytes: number,
    deadline: number,
    now: number = this.#now(),
  ): "ready" | "pending" | "not-resident" {
    if (this.#placement === null) {
      throw new EcError("EC_BAD_ARGUMENT", "requestPlaced: the connector has no placement option");
    }
    if (this.#requests.has(mmHash)) return "pending";
    if (typeof mmHash === "string" && this.cache.isReady(mmHash)) return "ready";
    const holders = this.#placement.holders(mmHash);
    if (holders.length === 0) {
      this.registry
        .counter("connector_not_resident", "placed requests with no trusted holder (EC-CONTRACT 10.4)")
        .inc();
      return "not-resident";
    }
    this.registry.counter("connector_placed", "requests placed on a trusted holder (EC-CONTRACT 10.4)").inc();
    return this.request(mmHash, holders[0]!, nbytes, deadline, now);
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
        readAhead: this.#readAhead,
        dataRequests: this.#dataRequests,
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
