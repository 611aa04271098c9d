import type { Registry } from "@tapwire/stats";
import type { Logger } from "pino";
import { EmbeddingCache, viewsOf } from "./cache.js";
import { SocketDataTransport } from "./data/socket.js";
import { checkIntOption, checkNumberOption, EcError } from "./errors.js";
import { defaultRegistry, silentLogger } from "./metrics.js";
import { ProducerSession } from "./producer-session.js";
import { compatibilityHash, int, MAX_STRING_BYTES, str } from "./protocol.js";
import { writeSyntheticEmbedding } from "./synthetic.js";
import type { HeartbeatOptions } from "./zmq.js";
import { ZmqRouterServer } from "./zmq.js";

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

/** Options of {@link EcProducer}. */
export interface EcProducerOptions {
  /** ZeroMQ ROUTER endpoint (default `tcp://127.0.0.1:0`). */
  control?: string;
  /** Data server endpoint, `tcp://…` or `unix://…` (default `tcp://127.0.0.1:0`). */
  data?: string;
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
  /** ZeroMQ heartbeats of the ROUTER (default interval 2 s, timeout 4 s, TTL 8 s). */
  heartbeat?: HeartbeatOptions;
  /** Period of the lease sweep when idle (default 50 ms). */
  stepIntervalMs?: number;
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
  /** Bound data endpoint. */
  readonly dataEndpoint: string;
  readonly #log: Logger;
  readonly #missNbytes: number;
  readonly #encodeDelay: number;
  readonly #timers = new Set<NodeJS.Timeout>();
  readonly #interval: NodeJS.Timeout;
  #scheduled = false;
  #closed = false;
  #encodes = 0;

  private constructor(
    cache: EmbeddingCache,
    data: SocketDataTransport,
    router: ZmqRouterServer,
    options: EcProducerOptions,
    registry: Registry,
    compat: string,
  ) {
    this.cache = cache;
    this.data = data;
    this.registry = registry;
    this.compatibilityHash = compat;
    this.#log = options.logger ?? silentLogger();
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
      onAdmin: (op, msg) => this.#admin(op, msg),
      ...(options.pinLeaseMs === undefined ? {} : { pinLeaseMs: options.pinLeaseMs }),
      ...(onMiss === undefined ? {} : { onMiss }),
    });
    this.controlEndpoint = router.endpoint;
    this.dataEndpoint = data.endpoint;
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
    const compat = compatibilityHash({ modelId, dtype, hiddenSize, blockBytes });
    const cache = new EmbeddingCache({ numBlocks, blockBytes });
    const data = await SocketDataTransport.create({
      name: options.name ?? EC_PRODUCER_DEFAULTS.name,
      region: cache.region,
      numBlocks,
      blockBytes,
      listen: options.data ?? EC_PRODUCER_DEFAULTS.data,
      registry,
      logger: log,
      ...(options.throttleBytesPerSec === undefined
        ? {}
        : { throttleBytesPerSec: options.throttleBytesPerSec }),
    });
    let router: ZmqRouterServer;
    try {
      router = await ZmqRouterServer.bind(options.control ?? EC_PRODUCER_DEFAULTS.control, {
        logger: log,
        ...(options.heartbeat === undefined ? {} : { heartbeat: options.heartbeat }),
      });
    } catch (err) {
      await data.close();
      throw err;
    }
    const p = new EcProducer(cache, data, router, options, registry, compat);
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
      if (!this.#closed && this.cache.has(mmHash)) this.#fill(mmHash);
    }, this.#encodeDelay);
    this.#timers.add(t);
    return "encoding";
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
    await this.data.close();
  }

  #fill(mmHash: string): void {
    const e = this.cache.get(mmHash)!;
    let off = 0;
    for (const v of viewsOf(this.cache.region, this.cache.blockBytes, e.blocks, e.nbytes)) {
      writeSyntheticEmbedding(mmHash, v, off);
      off += v.length;
    }
    this.cache.markReady(mmHash);
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
    } catch (err) {
      this.#log.error({ err }, "producer step failed");
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
      default:
        throw new EcError("EC_MALFORMED", `unknown admin op ${op}`);
    }
  }
}
