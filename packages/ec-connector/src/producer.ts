import type { Advertised, Registry } from "@tapwire/stats";
import { parseAdvertise } from "@tapwire/stats";
import type { Logger } from "pino";
import { advertiseControl, advertiseData, advertisedData } from "./advertise.js";
import { EmbeddingCache, viewsOf } from "./cache.js";
import type { CurveServerOptions } from "./curve.js";
import { checkCurveServer } from "./curve.js";
import { DEFAULT_SHM_DIR, ShmSharedRegion } from "./data/shm-map.js";
import type { DataTlsOptions } from "./data/socket.js";
import { SocketDataTransport } from "./data/socket.js";
import { checkIntOption, checkNumberOption, EcError } from "./errors.js";
import type { ProducerEventsOptions, ResidencyEvents } from "./events.js";
import { startProducerEvents } from "./events.js";
import type { InboundLimits } from "./inbound.js";
import { InboundGate, inboundLimits } from "./inbound.js";
import type { ProducerMetrics } from "./metrics.js";
import { defaultRegistry, producerMetrics, silentLogger } from "./metrics.js";
import { ProducerSession } from "./producer-session.js";
import { compatibilityHash, int, MAX_STRING_BYTES, packMsg, str, unpackMap } from "./protocol.js";
import { writeSyntheticEmbedding } from "./synthetic.js";
import type { HeartbeatOptions } from "./zmq.js";
import { HEARTBEAT_DEFAULTS, ZmqRouterServer } from "./zmq.js";

/**
 * Heartbeats of the producer's control ROUTER (issue 19): no PINGs of its own (interval 0), see
 * `EcProducerOptions.heartbeat`; the timeout and TTL stay EC-CONTRACT 7's.
 */
export const PRODUCER_HEARTBEAT = { ...HEARTBEAT_DEFAULTS, intervalMs: 0 } as const;

/** Bytes per element of the dtypes the synthetic producer knows (for the default miss size). */
export const DTYPE_BYTES: Readonly<Record<string, number>> = {
  float32: 4,
  float16: 2,
  bfloat16: 2,
  float8_e4m3fn: 1,
  uint8: 1,
};

/** Defaults of {@link EcProducer} and the `tapwire-ec-producer` bin. */
export const EC_PRODUCER_DEFAULTS = {
  control: "tcp://127.0.0.1:0",
  data: "tcp://127.0.0.1:0",
  admin: "tcp://127.0.0.1:0",
  numBlocks: 1024,
  blockBytes: 65_536,
  modelId: "synthetic-encoder",
  dtype: "bfloat16",
  hiddenSize: 4096,
  name: "ec-producer",
  /** Tokens per embedding encoded on a miss (`--miss-nbytes` overrides the byte size). */
  missTokens: 256,
  stepIntervalMs: 50,
} as const;

/** Options of {@link EcProducer} (with `events` and `replay`, EC-CONTRACT 10). */
export interface EcProducerOptions extends ProducerEventsOptions {
  /** ZeroMQ ROUTER endpoint (default `tcp://127.0.0.1:0`). */
  control?: string;
  /** Data server endpoint, `tcp://…` or `unix://…` (default `tcp://127.0.0.1:0`). */
  data?: string;
  /**
   * Issue 19: `HOST[:PORT]` peers reach this producer at. The data endpoint in every grant's agent
   * metadata and `EcProducer.advertised.control` carry HOST (the data endpoint PORT, when
   * given). Default by the rule of `@tapwire/stats` `advertiseEndpoint`: the bind address unless it
   * is a wildcard (`0.0.0.0`, `::`, `*`), then the first non-loopback interface that is up, else
   * `STATS_NO_ADVERTISE`.
   */
  advertise?: string;
  /** Cache blocks (default 1024). */
  numBlocks?: number;
  /** Bytes per block (default 65 536). */
  blockBytes?: number;
  /** Model id in the compatibility hash (default "synthetic-encoder", EC-CONTRACT 2). */
  modelId?: string;
  /** Embedding dtype in the compatibility hash (default "bfloat16"). */
  dtype?: string;
  /** Hidden size in the compatibility hash (default 4096). */
  hiddenSize?: number;
  /** Agent name (default "ec-producer"). */
  name?: string;
  /**
   * Take transfer requests as XFER_REQ frames on the data connections (docs/ec-protocol.md 3.5;
   * default true; offered only to consumers that ask, with ack-ahead). `false`: a 1.1 data server.
   */
  dataRequests?: boolean;
  /** Grant lease (default 30 000 ms). */
  pinLeaseMs?: number;
  /** Start encoding a requested-but-missing mm_hash (answering NOT_READY until it is ready). */
  encodeOnMiss?: boolean;
  /** Size of an embedding encoded on a miss (default hiddenSize × dtype bytes × 256 tokens). */
  missNbytes?: number;
  /** Simulated encode time (default 0: encodes synchronously). */
  encodeDelayMs?: number;
  /** Entries encoded at start: `[mmHash, nbytes]`. */
  prepopulate?: readonly (readonly [string, number])[];
  /** Data server pacing in bytes/s (demos and slow-read tests; default unlimited). */
  throttleBytesPerSec?: number;
  /**
   * ZeroMQ heartbeats of the ROUTER (default interval 0: the producer sends no PINGs and answers
   * the consumers' PINGs, whose TTL of 8 s ends a silent peer; issue 19: libzmq 4.3.5 aborts
   * with `!_io_error (stream_engine_base.cpp:310)` when a PING timer fires on a connection whose
   * input was stopped at its receive high-water mark and then reset, i.e. when a flood ends).
   */
  heartbeat?: HeartbeatOptions;
  /** Issue 19: global bounds on the control ROUTER's inbound queues (see {@link INBOUND_DEFAULTS}). */
  inbound?: InboundLimits;
  /** Period of the lease sweep when idle (default 50 ms). */
  stepIntervalMs?: number;
  /**
   * EC-CONTRACT 9.3: the admin socket (a ZeroMQ ROUTER serving `stats`, `encode`, `check`, `ping`),
   * never the control ROUTER (default `tcp://127.0.0.1:0`). Must be loopback (`127.0.0.0/8`,
   * `[::1]`, `localhost`, `ipc://`, `inproc://`) unless `adminAllowRemote` is true.
   */
  admin?: string;
  /** Allow a non-loopback `admin` endpoint (default false). */
  adminAllowRemote?: boolean;
  /** EC-CONTRACT 9.2: most blocks pinned per ZeroMQ peer and per session (default numBlocks / 4). */
  maxPinnedBlocksPerPeer?: number;
  /** EC-CONTRACT 9.2: most of the cache grants may pin (default 0.75). */
  maxPinnedFraction?: number;
  /** EC-CONTRACT 9.5: most data-server connections (default 256). */
  maxDataConnections?: number;
  /** EC-CONTRACT 9.5: idle data-server connections are closed after this long (default 30 000 ms). */
  dataIdleTimeoutMs?: number;
  /**
   * docs/ec-protocol.md 3.4 "Shared region" (`--shm-share-region`, default off): with an
   * `shm+unix://` data endpoint, keep the cache region in an unlinked 0600 /dev/shm file that
   * same-user shm readers map read-only, so a served READ is copied once (by the reader) instead
   * of through a ring. ONE TRUST DOMAIN ONLY: such a reader could read blocks it was not granted
   * (docs/security.md). If the region cannot be made (too small /dev/shm, no koffi) an error is
   * logged and the ordinary region and ring serve.
   */
  shareRegion?: boolean;
  /**
   * EC-CONTRACT 9.4: CURVE keys of the control ROUTER and the consumer public keys it accepts.
   * With keys the data plane must be `tls://` (and `tls` given).
   */
  curve?: CurveServerOptions;
  /** EC-CONTRACT 9.4: the data server's certificate and key, and the allowed client certificates (`ca`). */
  tls?: DataTlsOptions;
  /** Where the `producer_*` and `data_*` metrics go (default: a fresh Registry). */
  registry?: Registry;
  /** pino logger (default: silent). */
  logger?: Logger;
}

/** What {@link EcProducer.encode} did. */
export type EncodeResult = "ready" | "encoding" | "exists" | "full";

/**
 * A complete encoder-side agent: an {@link EmbeddingCache} filled by the deterministic synthetic
 * encoder ({@link syntheticEmbedding}), a socket data server over it, and a {@link ProducerSession}
 * on a ZeroMQ ROUTER, driven by arrivals (a step is scheduled per message / notification) plus a
 * periodic lease sweep. Serves admin requests (`stats`, `encode`, `check`, `ping`, see
 * docs/ec-protocol.md). This is what `tapwire-ec-producer` runs.
 */
export class EcProducer {
  /** The producer's cache (the single owner of its blocks). */
  readonly cache: EmbeddingCache;
  /** The data plane serving `cache.region`. */
  readonly data: SocketDataTransport;
  /** The control-plane session (EC-CONTRACT 4). */
  readonly session: ProducerSession;
  /** The metrics registry. */
  readonly registry: Registry;
  /** This producer's compatibility hash (EC-CONTRACT 2). */
  readonly compatibilityHash: string;
  /** Bound control endpoint. */
  readonly controlEndpoint: string;
  /** The data endpoint peers are told (in every grant's agent metadata): the advertised one. */
  readonly dataEndpoint: string;
  /** Issue 19: how the control and data endpoints were advertised (bound, advertised, source). */
  readonly advertised: {
    /** The control endpoint: bound, advertised (HOST of `advertise`, the bound port). */
    control: Advertised;
    /** The data endpoint: bound, advertised (the one in every grant's agent metadata). */
    data: Advertised;
  };
  /** Bound admin endpoint (EC-CONTRACT 9.3). */
  readonly adminEndpoint: string;
  /** EC-CONTRACT 10: the residency events (PUB + replay ROUTER), `null` when not configured. */
  readonly events: ResidencyEvents | null;
  readonly #adminRouter: ZmqRouterServer;
  readonly #log: Logger;
  readonly #pm: ProducerMetrics;
  readonly #missNbytes: number;
  readonly #encodeDelay: number;
  readonly #timers = new Set<NodeJS.Timeout>();
  readonly #interval: NodeJS.Timeout;
  #scheduled = false;
  #closed = false;
  /** The shared cache region (3.4 "Shared region"), null without `shareRegion`. */
  #shared: ShmSharedRegion | null = null;
  #encodes = 0;

  private constructor(
    cache: EmbeddingCache,
    data: SocketDataTransport,
    router: ZmqRouterServer,
    adminRouter: ZmqRouterServer,
    options: EcProducerOptions,
    registry: Registry,
    compat: string,
    events: ResidencyEvents | null,
    advertised: { control: Advertised; data: Advertised },
  ) {
    this.cache = cache;
    this.events = events;
    this.data = data;
    this.registry = registry;
    this.compatibilityHash = compat;
    this.#log = options.logger ?? silentLogger();
    this.#pm = producerMetrics(registry);
    const dtypeBytes = DTYPE_BYTES[options.dtype ?? EC_PRODUCER_DEFAULTS.dtype] ?? 2;
    this.#missNbytes =
      options.missNbytes ??
      (options.hiddenSize ?? EC_PRODUCER_DEFAULTS.hiddenSize) * dtypeBytes * EC_PRODUCER_DEFAULTS.missTokens;
    this.#encodeDelay = options.encodeDelayMs ?? 0;
    const onMiss =
      options.encodeOnMiss === true ? (h: string) => this.encode(h, this.#missNbytes) !== "full" : undefined;
    this.session = new ProducerSession({
      control: router,
      data,
      cache,
      compatibilityHash: compat,
      registry,
      logger: this.#log,
      ...(options.maxPinnedBlocksPerPeer === undefined
        ? {}
        : { maxPinnedBlocksPerPeer: options.maxPinnedBlocksPerPeer }),
      ...(options.maxPinnedFraction === undefined ? {} : { maxPinnedFraction: options.maxPinnedFraction }),
      ...(options.pinLeaseMs === undefined ? {} : { pinLeaseMs: options.pinLeaseMs }),
      ...(onMiss === undefined ? {} : { onMiss }),
      ...(options.dataRequests === undefined ? {} : { dataRequests: options.dataRequests }),
    });
    this.controlEndpoint = router.endpoint;
    this.dataEndpoint = data.endpoint;
    this.advertised = advertised;
    this.adminEndpoint = adminRouter.endpoint;
    this.#adminRouter = adminRouter;
    adminRouter.onMessage = () => this.#serveAdmin();
    router.onMessage = () => this.#schedule();
    data.onNotification = () => this.#schedule();
    this.#interval = setInterval(
      () => this.#step(),
      options.stepIntervalMs ?? EC_PRODUCER_DEFAULTS.stepIntervalMs,
    );
    this.#interval.unref();
  }

  /** Validates options, binds both planes, encodes `prepopulate`, and starts serving. */
  static async start(options: EcProducerOptions = {}): Promise<EcProducer> {
    const numBlocks = checkIntOption("numBlocks", options.numBlocks ?? EC_PRODUCER_DEFAULTS.numBlocks, 1);
    const blockBytes = checkIntOption("blockBytes", options.blockBytes ?? EC_PRODUCER_DEFAULTS.blockBytes, 1);
    const hiddenSize = checkIntOption("hiddenSize", options.hiddenSize ?? EC_PRODUCER_DEFAULTS.hiddenSize, 1);
    const modelId = options.modelId ?? EC_PRODUCER_DEFAULTS.modelId;
    const dtype = options.dtype ?? EC_PRODUCER_DEFAULTS.dtype;
    if (typeof modelId !== "string" || modelId.length === 0)
      throw new EcError("EC_BAD_OPTION", "option modelId: expected a string");
    if (typeof dtype !== "string" || dtype.length === 0)
      throw new EcError("EC_BAD_OPTION", "option dtype: expected a string");
    if (options.missNbytes !== undefined) checkIntOption("missNbytes", options.missNbytes, 1);
    if (options.encodeDelayMs !== undefined) checkNumberOption("encodeDelayMs", options.encodeDelayMs, 0);
    if (options.stepIntervalMs !== undefined) checkNumberOption("stepIntervalMs", options.stepIntervalMs, 1);
    if (options.pinLeaseMs !== undefined) checkNumberOption("pinLeaseMs", options.pinLeaseMs, 0);
    const registry = options.registry ?? defaultRegistry();
    const log = options.logger ?? silentLogger();
    if (options.maxPinnedBlocksPerPeer !== undefined) {
      checkIntOption("maxPinnedBlocksPerPeer", options.maxPinnedBlocksPerPeer, 1);
    }
    if (options.maxPinnedFraction !== undefined)
      checkNumberOption("maxPinnedFraction", options.maxPinnedFraction, 0, 1);
    const adminAt = options.admin ?? EC_PRODUCER_DEFAULTS.admin;
    if (options.adminAllowRemote !== true && !isLoopbackEndpoint(adminAt)) {
      throw new EcError(
        "EC_BAD_OPTION",
        `option admin: ${adminAt} is not loopback (EC-CONTRACT 9.3; set adminAllowRemote to allow it)`,
      );
    }
    const dataAt = options.data ?? EC_PRODUCER_DEFAULTS.data;
    if (options.curve !== undefined) {
      checkCurveServer(options.curve);
      if (!dataAt.startsWith("tls://") || options.tls === undefined) {
        throw new EcError(
          "EC_BAD_OPTION",
          "option data: with CURVE keys the data plane must be tls:// with tls options (EC-CONTRACT 9.4)",
        );
      }
    }
    const inbound = inboundLimits(options.inbound);
    const compat = compatibilityHash({ modelId, dtype, hiddenSize, blockBytes });
    // EC-CONTRACT 10.1: an LRU eviction is an "evicted" event (the events start after the cache).
    let events: ResidencyEvents | null = null;
    let shared: ShmSharedRegion | null = null;
    if (options.shareRegion !== undefined && typeof options.shareRegion !== "boolean")
      throw new EcError("EC_BAD_OPTION", "option shareRegion: expected a boolean");
    if (options.shareRegion === true) {
      if (!dataAt.startsWith("shm+unix://"))
        throw new EcError(
          "EC_BAD_OPTION",
          `option shareRegion: needs an shm+unix:// data endpoint, not ${dataAt}`,
        );
      try {
        shared = ShmSharedRegion.create(DEFAULT_SHM_DIR, numBlocks * blockBytes);
      } catch (err) {
        log.error(
          { bytes: numBlocks * blockBytes, why: (err as Error).message },
          `shm: cannot share the cache region of ${numBlocks * blockBytes} bytes; serving through rings`,
        );
      }
    }
    const cache = new EmbeddingCache({
      numBlocks,
      blockBytes,
      onEvict: (h) => events?.evicted(h),
      ...(shared === null ? {} : { region: shared.bytes }),
    });
    const pm = producerMetrics(registry);
    const gate = new InboundGate(inbound, registry);
    if (options.advertise !== undefined) parseAdvertise(options.advertise);
    let dataBound = dataAt;
    const data = await SocketDataTransport.create({
      name: options.name ?? EC_PRODUCER_DEFAULTS.name,
      region: cache.region,
      numBlocks,
      blockBytes,
      listen: dataAt,
      advertise: (bound: string) => {
        dataBound = bound;
        return advertiseData(bound, options.advertise);
      },
      registry,
      logger: log,
      ...(options.throttleBytesPerSec === undefined
        ? {}
        : { throttleBytesPerSec: options.throttleBytesPerSec }),
      ...(options.maxDataConnections === undefined ? {} : { maxConnections: options.maxDataConnections }),
      ...(options.dataIdleTimeoutMs === undefined ? {} : { idleTimeoutMs: options.dataIdleTimeoutMs }),
      ...(options.tls === undefined ? {} : { tls: options.tls }),
      ...(shared === null ? {} : { shmRegion: shared }),
    }).catch((err: unknown) => {
      shared?.close();
      throw err;
    });
    const routers: ZmqRouterServer[] = [];
    let advertised: { control: Advertised; data: Advertised };
    try {
      routers.push(
        await ZmqRouterServer.bind(options.control ?? EC_PRODUCER_DEFAULTS.control, {
          logger: log,
          receiveHighWaterMark: inbound.receiveHighWaterMark,
          sendHighWaterMark: inbound.sendHighWaterMark,
          admit: (id, queued) => gate.admit(id, queued),
          maxQueuedReplies: inbound.maxQueued,
          onReplyDropped: () => gate.replyDropped(),
          onDisconnect: () => pm.controlDisconnects.inc(),
          onAuthRefused: (why) => {
            pm.curveRefused.inc();
            log.warn({ why }, "CURVE handshake refused");
          },
          heartbeat: { ...PRODUCER_HEARTBEAT, ...options.heartbeat },
          ...(options.curve === undefined ? {} : { curve: options.curve }),
        }),
      );
      routers.push(await ZmqRouterServer.bind(adminAt, { logger: log, heartbeat: { intervalMs: 0 } }));
      events = await startProducerEvents(
        options,
        numBlocks,
        () => cache.freeBlocks,
        registry,
        log,
        (why) => {
          pm.curveRefused.inc();
          log.warn({ why }, "CURVE handshake refused (events)");
        },
      );
      advertised = {
        control: advertiseControl(routers[0]!.endpoint, options.advertise),
        data: advertisedData(dataBound, options.advertise),
      };
    } catch (err) {
      await events?.close();
      for (const r of routers) await r.close();
      await data.close();
      shared?.close();
      throw err;
    }
    const [router, adminRouter] = routers as [ZmqRouterServer, ZmqRouterServer];
    const p = new EcProducer(cache, data, router, adminRouter, options, registry, compat, events, advertised);
    p.#shared = shared;
    for (const [h, n] of options.prepopulate ?? []) {
      const r = p.encode(h, n);
      if (r === "full") log.warn({ mmHash: h, nbytes: n }, "prepopulate: cache full");
    }
    return p;
  }

  /** Number of encodes started so far. */
  get encodes(): number {
    return this.#encodes;
  }

  /**
   * Encodes `mmHash` (`nbytes` bytes of {@link syntheticEmbedding}) into the cache, evicting LRU
   * unpinned entries if needed. With an encode delay the entry exists (not ready) until it is done.
   */
  encode(mmHash: string, nbytes: number): EncodeResult {
    if (this.#closed) throw new EcError("EC_CLOSED", "producer: closed");
    if (this.cache.has(mmHash)) return "exists";
    try {
      this.cache.allocate(mmHash, nbytes);
    } catch (err) {
      if (err instanceof EcError && err.code === "EC_CACHE_FULL") return "full";
      throw err;
    }
    this.#encodes++;
    if (this.#encodeDelay <= 0) {
      this.#fill(mmHash);
      return "ready";
    }
    const t = setTimeout(() => {
      this.#timers.delete(t);
      if (!this.#closed && this.cache.has(mmHash) && !this.cache.isReady(mmHash)) this.#fill(mmHash);
    }, this.#encodeDelay);
    this.#timers.add(t);
    return "encoding";
  }

  /**
   * EC-CONTRACT 10.5: evicts an unpinned entry ("evicted", published as an event when it was ready),
   * leaves a pinned one ("pinned"), or finds none ("missing").
   */
  evict(mmHash: string): "evicted" | "missing" | "pinned" {
    const e = this.cache.get(mmHash);
    if (e === undefined) return "missing";
    if (e.pins > 0) return "pinned";
    this.cache.free(mmHash);
    if (e.ready) this.events?.evicted(mmHash);
    return "evicted";
  }

  /** A JSON snapshot: registry metrics plus cache and grant state. */
  stats(): Record<string, unknown> {
    return {
      metrics: this.registry.snapshot(),
      cache: {
        numBlocks: this.cache.numBlocks,
        blockBytes: this.cache.blockBytes,
        freeBlocks: this.cache.freeBlocks,
        pinnedBlocks: this.cache.pinnedBlocks,
        retiredBlocks: this.cache.retiredBlocks,
        entries: this.cache.size,
        evictions: this.cache.evictions,
      },
      grants: this.session.grantCount,
      dataGrants: this.data.grantCount,
      encodes: this.#encodes,
      ...(this.events === null
        ? {}
        : {
            events: {
              incarnation: this.events.incarnation,
              seq: this.events.seq,
              resident: this.events.residentCount,
            },
          }),
    };
  }

  /** Runs one step now (normally driven by arrivals and the sweep timer). */
  step(): void {
    this.#step();
  }

  /** Unpins every grant, closes both planes and stops encoding timers. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#interval);
    for (const t of this.#timers) clearTimeout(t);
    this.#timers.clear();
    await this.session.close();
    await this.events?.close();
    await this.#adminRouter.close();
    await this.data.close();
    this.#shared?.close();
  }

  #fill(mmHash: string): void {
    const e = this.cache.get(mmHash)!;
    let off = 0;
    for (const v of viewsOf(this.cache.region, this.cache.blockBytes, e.blocks, e.nbytes)) {
      writeSyntheticEmbedding(mmHash, v, off);
      off += v.length;
    }
    this.cache.markReady(mmHash);
    this.events?.stored(mmHash);
  }

  #schedule(): void {
    if (this.#scheduled || this.#closed) return;
    this.#scheduled = true;
    // A microtask, not a timer or setImmediate: the step runs as soon as the current callback (the
    // ROUTER receive loop, a data-plane notification) returns, with whatever else arrived with it.
    queueMicrotask(() => {
      this.#scheduled = false;
      this.#step();
    });
  }

  #step(): void {
    if (this.#closed) return;
    try {
      this.session.pollStep();
      this.events?.flush(); // EC-CONTRACT 10.1: changes published within the step
    } catch (err) {
      this.#log.error({ err }, "producer step failed");
    }
  }

  /** EC-CONTRACT 9.3: serves the admin socket (flat maps with a string `op`; malformed: dropped, counted). */
  #serveAdmin(): void {
    for (const msg of this.#adminRouter.poll()) {
      let reply: Record<string, unknown> | null;
      try {
        if (msg.frames.length !== 1)
          throw new EcError("EC_MALFORMED", `admin message with ${msg.frames.length} frames`);
        const m = unpackMap(msg.frames[0]!, "admin request");
        reply = this.#admin(str(m, "op", "admin request"), m);
        this.#pm.adminRequests.inc();
      } catch (err) {
        this.#pm.malformed.inc();
        this.#log.warn({ err: (err as Error).message }, "dropped malformed admin request");
        continue;
      }
      if (reply !== null) this.#adminRouter.send(msg.identity, packMsg(reply));
    }
  }

  #admin(op: string, msg: Record<string, unknown>): Record<string, unknown> | null {
    switch (op) {
      case "ping":
        return { op: "pong" };
      case "stats":
        return { op: "stats", stats: this.stats() };
      case "check":
        try {
          this.cache.check();
          return { op: "check", ok: true };
        } catch (err) {
          return { op: "check", ok: false, error: (err as Error).message };
        }
      case "encode": {
        const h = str(msg, "mm_hash", "encode", MAX_STRING_BYTES);
        const n = int(msg, "nbytes", "encode", 1, this.cache.numBlocks * this.cache.blockBytes);
        return { op: "encode", mm_hash: h, result: this.encode(h, n) };
      }
      case "residents": {
        // A tapwire extension for tests and operators: the ready entries and the last published seq
        // (flushed first, so the two agree). Bounded to what fits a 64 KiB reply.
        this.events?.flush();
        const hashes: string[] = [];
        let bytes = 64;
        for (const h of this.cache.keys()) {
          if (!this.cache.isReady(h)) continue;
          bytes += Buffer.byteLength(h) + 3;
          if (bytes > 60_000)
            return { op: "residents", mm_hashes: hashes, seq: this.events?.seq ?? 0, truncated: true };
          hashes.push(h);
        }
        return { op: "residents", mm_hashes: hashes, seq: this.events?.seq ?? 0, truncated: false };
      }
      case "evict": {
        const h = str(msg, "mm_hash", "evict", MAX_STRING_BYTES);
        return { op: "evict", mm_hash: h, result: this.evict(h) };
      }
      default:
        throw new EcError("EC_MALFORMED", `unknown admin op ${op}`);
    }
  }
}

/** True for an endpoint only this host can reach: 127.0.0.0/8, [::1], localhost, ipc://, inproc://. */
export function isLoopbackEndpoint(endpoint: string): boolean {
  if (endpoint.startsWith("ipc://") || endpoint.startsWith("inproc://")) return true;
  const m = /^tcp:\/\/(\[[^\]]+\]|[^:/]+):\d+$/.exec(endpoint);
  if (m === null) return false;
  const host = m[1]!;
  return host === "localhost" || host === "[::1]" || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}
