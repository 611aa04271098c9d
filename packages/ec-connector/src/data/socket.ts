import { lstatSync, unlinkSync } from "node:fs";
import * as net from "node:net";
import * as tls from "node:tls";
import { Registry } from "@tapwire/stats";
import type { Logger } from "pino";
import type { Crc32Impl } from "../crc.js";
import { checkFunctionOption, checkIntOption, checkNumberOption, EcError } from "../errors.js";
import { dataMetrics, EC_METRICS_PREFIX, silentLogger } from "../metrics.js";
import type { DataTlsOptions } from "./connect.js";
import { socketConnect } from "./connect.js";
import type { SocketFault } from "./reader.js";
import { DataReader } from "./reader.js";
import { DataServer } from "./server.js";
import { SHM_LIMITS } from "./shm-frame.js";
import { DEFAULT_SHM_DIR, KOFFI_MISSING_MESSAGE, shmAvailable } from "./shm-map.js";
import { ShmDataReader } from "./shm-reader.js";
import { ShmDataServer, shmMetrics } from "./shm-server.js";
import { DEFAULT_SEND_BUFFER_BYTES } from "./sockbuf.js";
import type { SourceRuns } from "./source-runs.js";
import type {
  AgentMetadata,
  DataTransport,
  ReadOptions,
  XferHandle,
  XferHandleState,
  XferRequestHandler,
} from "./transport.js";
import { agentNameOf, newInstanceId, parseDataEndpoint, SelfDescription } from "./transport.js";

export { MAX_DATA_FRAME_BYTES } from "./frame.js";

/** EC-CONTRACT 9.5 defaults of the data server. */
export const DATA_SERVER_DEFAULTS = { maxConnections: 256, idleTimeoutMs: 30_000 } as const;

export type { DataTlsOptions } from "./connect.js";

function checkTls(t: DataTlsOptions): void {
  if (t === null || typeof t !== "object")
    throw new EcError("EC_BAD_OPTION", "option tls: expected an object");
  for (const k of ["cert", "key", "ca"] as const) {
    const v = t[k];
    const ok = (x: unknown) => typeof x === "string" || Buffer.isBuffer(x);
    if (!(ok(v) || (Array.isArray(v) && v.length > 0 && v.every(ok)))) {
      throw new EcError("EC_BAD_OPTION", `option tls.${k}: expected PEM text`);
    }
  }
}

export type { SocketFault } from "./reader.js";

/**
 * The environment variable that sets {@link SocketDataTransportOptions.sendBufferBytes} where the
 * option is not given (bytes; `0`: the kernel's default), e.g. for a producer bin in a benchmark.
 */
export const SEND_BUFFER_ENV = "TAPWIRE_EC_SEND_BUFFER";

function defaultSendBuffer(): number {
  const v = process.env[SEND_BUFFER_ENV];
  if (v === undefined || v === "") return DEFAULT_SEND_BUFFER_BYTES;
  const n = Number(v);
  return Number.isInteger(n) && n >= 0 ? n : DEFAULT_SEND_BUFFER_BYTES;
}

/** Defaults of the shm data plane (docs/ec-protocol.md 3.4): a ring of 2 x 4 MiB per connection. */
export const SHM_DATA_DEFAULTS = {
  dir: DEFAULT_SHM_DIR,
  slots: 2,
  slotBytes: 4 * 1024 * 1024,
  maxSessions: 32,
} as const;

/** Options of the shm data plane (docs/ec-protocol.md 3.4). */
export interface ShmDataOptions {
  /** Directory of the ring files (default /dev/shm; an absolute path). */
  dir?: string;
  /** Server: slots per ring, 1 … 16 (default 2). */
  slots?: number;
  /** Server: bytes per slot, a 4 KiB multiple in [64 KiB, 64 MiB] (default 4 MiB). */
  slotBytes?: number;
  /** Server: most rings mapped at once; more connections stream on the socket (default 32). */
  maxSessions?: number;
}

function checkShm(v: boolean | ShmDataOptions | undefined): Required<ShmDataOptions> | null {
  if (v === undefined || v === false) return null;
  if (v === true) return { ...SHM_DATA_DEFAULTS };
  if (v === null || typeof v !== "object")
    throw new EcError("EC_BAD_OPTION", "option shm: expected a boolean or an object");
  const dir = v.dir ?? SHM_DATA_DEFAULTS.dir;
  if (typeof dir !== "string" || !dir.startsWith("/"))
    throw new EcError("EC_BAD_OPTION", `option shm.dir: ${String(dir)} is not an absolute path`);
  const slots = v.slots === undefined ? SHM_DATA_DEFAULTS.slots : checkIntOption("shm.slots", v.slots, 1);
  if (slots > SHM_LIMITS.maxSlots)
    throw new EcError("EC_BAD_OPTION", `option shm.slots: ${slots} > ${SHM_LIMITS.maxSlots}`);
  const slotBytes =
    v.slotBytes === undefined ? SHM_DATA_DEFAULTS.slotBytes : checkIntOption("shm.slotBytes", v.slotBytes, 1);
  if (slotBytes < SHM_LIMITS.minSlotBytes || slotBytes > SHM_LIMITS.maxSlotBytes || slotBytes % 4096 !== 0)
    throw new EcError(
      "EC_BAD_OPTION",
      `option shm.slotBytes: ${slotBytes} is not a multiple of 4096 in [${SHM_LIMITS.minSlotBytes}, ${SHM_LIMITS.maxSlotBytes}]`,
    );
  const maxSessions =
    v.maxSessions === undefined
      ? SHM_DATA_DEFAULTS.maxSessions
      : checkIntOption("shm.maxSessions", v.maxSessions, 0);
  return { dir, slots, slotBytes, maxSessions };
}

/** Options of {@link SocketDataTransport}. */
export interface SocketDataTransportOptions {
  /** Agent name (the instance id is added automatically). */
  name: string;
  /** The cache region this agent serves from / reads into. */
  region: Uint8Array;
  /** Blocks in `region` (integer >= 1). */
  numBlocks: number;
  /** Bytes per block (integer >= 1); `region` must hold `numBlocks * blockBytes` bytes. */
  blockBytes: number;
  /** Where to run the data server: `tcp://host:port` (port 0 picks one) or `unix:///path`. Omit for a reader only. */
  listen?: string;
  /**
   * Endpoint to advertise in the metadata (default: the bound endpoint), or a function of the
   * bound endpoint (port 0 resolved) returning it (issue 19: `EcProducer`'s `advertise`).
   */
  advertise?: string | ((bound: string) => string);
  /** Monotonic clock (ms) for grant deadlines (default `performance.now`). */
  now?: () => number;
  /** Server write chunk (default 1 MiB). */
  chunkBytes?: number;
  /**
   * Server: SO_SNDBUF asked for on each data connection from this host (unix, loopback tcp), in
   * bytes; 0 keeps the kernel's default (default 512 KiB, or `TAPWIRE_EC_SEND_BUFFER`). Needs the
   * optional peer `koffi` (without it: the kernel's default). Loopback tcp asks 64 KiB more, for
   * the frame headers next to a 1 MiB DATA. Remote tcp peers keep autotuning.
   */
  sendBufferBytes?: number;
  /** Server pacing in bytes/s (default unlimited; for demos and tests of slow reads). */
  throttleBytesPerSec?: number;
  /** Idle reader connections kept per peer (default 4). */
  maxIdlePerPeer?: number;
  /**
   * Compute read checksums on a worker thread as ranges land, so the CRC overlaps the receive
   * instead of running between `recv`s (default false). Needs a region on a `SharedArrayBuffer`
   * (`EmbeddingCache({ shared: true })`). A read is DONE once its last range is checksummed.
   * `true` uses the thread where it pays: only while this process's CRC-32 runs below
   * `CHECKSUM_THREAD_MAX_INLINE_GBPS` (24 GB/s, measured once, `crc32InlineGbps`); a faster CRC
   * (ISA-L with AVX-512) stays inline, which is then cheaper. `"always"` uses it regardless.
   * {@link SocketDataTransport.checksumThreadInUse} says which.
   */
  checksumThread?: boolean | "always";
  /** EC-CONTRACT 9.5: most open data-server connections; more are closed at accept, counted (default 256). */
  maxConnections?: number;
  /** EC-CONTRACT 9.5: a data-server connection without traffic this long is closed, counted (default 30 000 ms; 0: never). */
  idleTimeoutMs?: number;
  /**
   * EC-CONTRACT 9.4: TLS material. As a `tls://` server: this agent's certificate and key, and in
   * `ca` the client certificates (or CA) allowed to read. As a reader of `tls://` peers: its client
   * certificate and key, and in `ca` the producers' certificates (or CA) it trusts.
   */
  tls?: DataTlsOptions;
  /**
   * docs/ec-protocol.md 3.4, the shm data plane (needs the optional peer `koffi`). As a reader:
   * `true` (or options) maps the rings of producers whose metadata offers shm (default off). As a
   * server it is on for a `shm+unix:///path` listen (advertised as `unix:///path` plus the
   * metadata key `shm`); these options size its rings. Without koffi both sides use the socket.
   */
  shm?: boolean | ShmDataOptions;
  /**
   * Server: the region (`region`) is this shared mapping (docs/ec-protocol.md 3.4 "Shared region",
   * the producer's `shareRegion`): shm readers that can map it read granted bytes from it directly.
   */
  shmRegion?: {
    /** The mapping's bytes (`region` is a view of them from offset 0). */
    readonly bytes: Uint8Array;
    /** This process's pid. */
    readonly pid: number;
    /** The fd of the unlinked file (readers open `/proc/<pid>/fd/<fd>` read-only). */
    readonly fd: number;
  };
  /** Where the `data_*` metrics go (default: a fresh Registry). */
  registry?: Registry;
  /** pino logger (default: silent). */
  logger?: Logger;
}

/**
 * EC-CONTRACT 5.4: the `tcp` and `unix` data planes. Each agent may run a data server over its
 * cache region (`server.ts`) and reads from its peers' (`reader.ts`); a READ streams the granted
 * blocks straight from the server's region into the reader's blocks, the CRC-32 runs over each
 * chunk as it lands, and the reader then sends the notification on the same connection. Grants
 * are enforced per key and exact block list (5.3); releasing a PROC read destroys its socket, so
 * no byte lands afterwards (5.2: always the guarantee). The byte format is docs/ec-protocol.md.
 */
export class SocketDataTransport implements DataTransport {
  readonly kind: string;
  /** This agent's metadata (name, per-process instance id, data endpoint; EC-CONTRACT 5.3). */
  readonly meta: AgentMetadata;
  onNotification: (() => void) | null = null;
  onReadDone: (() => void) | null = null;

  readonly #self: SelfDescription;
  readonly #listener: net.Server | null;
  readonly #unixPath: string | null;
  readonly #reader: DataReader;
  readonly #server: DataServer;
  #closed = false;

  private constructor(
    options: SocketDataTransportOptions,
    listener: net.Server | null,
    endpoint: string,
    unixPath: string | null,
    shm: { server: boolean; options: Required<ShmDataOptions> | null },
  ) {
    const registry = options.registry ?? new Registry({ prefix: EC_METRICS_PREFIX });
    const metrics = dataMetrics(registry);
    const logger = options.logger ?? silentLogger();
    this.#listener = listener;
    this.#unixPath = unixPath;
    this.kind = shm.server ? "shm" : (/^(unix|tcp|tls):\/\//.exec(endpoint)?.[1] ?? "reader");
    // docs/ec-protocol.md 3.4: the shm half of each side, when asked for and koffi loads.
    const so = shm.options ?? SHM_DATA_DEFAULTS;
    const sm = shm.options === null ? null : shmMetrics(registry);
    let shmServer: ShmDataServer | undefined;
    if (shm.server && sm !== null) {
      if (shmAvailable()) {
        shmServer = new ShmDataServer({
          ...so,
          metrics: sm,
          logger,
          ...(options.shmRegion === undefined ? {} : { region: options.shmRegion }),
        });
      } else {
        sm.fallbacks.inc();
        logger.warn(
          { why: KOFFI_MISSING_MESSAGE },
          "shm data plane unavailable; serving over the unix socket",
        );
      }
    }
    const shmReader = sm === null ? undefined : new ShmDataReader({ dir: so.dir, metrics: sm, logger });
    this.meta = {
      name: options.name,
      instance: newInstanceId(),
      endpoint,
      ...(shmServer === undefined ? {} : { shm: true }),
    };
    this.#self = new SelfDescription(this.meta, options.numBlocks, options.blockBytes);
    this.#reader = new DataReader({
      region: options.region,
      numBlocks: options.numBlocks,
      blockBytes: options.blockBytes,
      maxIdlePerPeer: options.maxIdlePerPeer ?? 4,
      checksumThread: options.checksumThread ?? false,
      self: agentNameOf(this.meta),
      connect: socketConnect(options.tls),
      metrics,
      logger,
      onReadDone: () => this.onReadDone?.(),
      ...(shmReader === undefined ? {} : { shm: shmReader }),
    });
    this.#server = new DataServer({
      region: options.region,
      numBlocks: options.numBlocks,
      blockBytes: options.blockBytes,
      instance: this.meta.instance,
      now: options.now ?? (() => performance.now()),
      chunkBytes: options.chunkBytes ?? 1 << 20,
      throttleBytesPerSec: options.throttleBytesPerSec ?? 0,
      idleTimeoutMs: options.idleTimeoutMs ?? DATA_SERVER_DEFAULTS.idleTimeoutMs,
      maxConnections: options.maxConnections ?? DATA_SERVER_DEFAULTS.maxConnections,
      metrics,
      logger,
      onNotification: () => this.onNotification?.(),
      ...(shmServer === undefined ? {} : { shm: shmServer }),
      sendBufferBytes: options.sendBufferBytes ?? defaultSendBuffer(),
    });
    if (listener === null) return;
    // EC-CONTRACT 9.5: net.Server drops connections beyond maxConnections at accept ('drop').
    listener.maxConnections = options.maxConnections ?? DATA_SERVER_DEFAULTS.maxConnections;
    listener.on("drop", () => metrics.connectionsRefused.inc());
    if (listener instanceof tls.Server) {
      listener.on("secureConnection", (s: tls.TLSSocket) => this.#server.accept(s));
      listener.on("tlsClientError", (err: Error, s: tls.TLSSocket) => {
        metrics.tlsRefused.inc();
        logger.warn({ err: err.message, remote: s.remoteAddress }, "data-plane TLS handshake refused");
        s.destroy();
      });
    } else {
      listener.on("connection", (s) => this.#server.accept(s));
    }
  }

  /** Validates options, starts the data server when `listen` is given, and resolves once bound. */
  static async create(options: SocketDataTransportOptions): Promise<SocketDataTransport> {
    if (options === null || typeof options !== "object")
      throw new EcError("EC_BAD_OPTION", "options: expected an object");
    if (
      typeof options.name !== "string" ||
      options.name.length === 0 ||
      Buffer.byteLength(options.name) > 128
    ) {
      throw new EcError("EC_BAD_OPTION", "option name: expected a non-empty string of at most 128 bytes");
    }
    const numBlocks = checkIntOption("numBlocks", options.numBlocks, 1);
    const blockBytes = checkIntOption("blockBytes", options.blockBytes, 1);
    if (!(options.region instanceof Uint8Array) || options.region.length < numBlocks * blockBytes) {
      throw new EcError(
        "EC_BAD_OPTION",
        "option region: expected a Uint8Array of numBlocks * blockBytes bytes",
      );
    }
    checkFunctionOption("now", options.now);
    if (options.chunkBytes !== undefined) checkIntOption("chunkBytes", options.chunkBytes, 1);
    if (options.sendBufferBytes !== undefined) checkIntOption("sendBufferBytes", options.sendBufferBytes, 0);
    if (options.throttleBytesPerSec !== undefined)
      checkNumberOption("throttleBytesPerSec", options.throttleBytesPerSec, 0);
    if (options.maxIdlePerPeer !== undefined) checkIntOption("maxIdlePerPeer", options.maxIdlePerPeer, 0);
    if (
      options.checksumThread !== undefined &&
      typeof options.checksumThread !== "boolean" &&
      options.checksumThread !== "always"
    ) {
      throw new EcError("EC_BAD_OPTION", 'option checksumThread: expected a boolean or "always"');
    }
    if (
      (options.checksumThread === true || options.checksumThread === "always") &&
      !(options.region.buffer instanceof SharedArrayBuffer)
    ) {
      throw new EcError("EC_BAD_OPTION", "option checksumThread: the region must be on a SharedArrayBuffer");
    }
    if (options.maxConnections !== undefined) checkIntOption("maxConnections", options.maxConnections, 1);
    if (options.idleTimeoutMs !== undefined) checkIntOption("idleTimeoutMs", options.idleTimeoutMs, 0);
    if (options.tls !== undefined) checkTls(options.tls);
    const shmOptions = checkShm(options.shm);
    if (options.listen === undefined)
      return new SocketDataTransport(options, null, "", null, { server: false, options: shmOptions });
    const target = parseDataEndpoint(options.listen);
    const shmServer = "path" in target && target.shm === true;
    let server: net.Server;
    if ("tls" in target && target.tls) {
      if (options.tls === undefined) {
        throw new EcError(
          "EC_BAD_OPTION",
          "option tls: a tls:// data server needs its certificate, key and ca",
        );
      }
      server = tls.createServer({
        cert: options.tls.cert,
        key: options.tls.key,
        // EC-CONTRACT 9.4: only clients with a certificate from the allow list (ca) get in.
        ca: options.tls.ca,
        requestCert: true,
        rejectUnauthorized: true,
        noDelay: true,
        handshakeTimeout: options.idleTimeoutMs || DATA_SERVER_DEFAULTS.idleTimeoutMs,
      });
    } else {
      server = net.createServer({ noDelay: true });
    }
    let unixPath: string | null = null;
    if ("path" in target) {
      unixPath = target.path;
      try {
        // A socket file left by a killed process would make listen fail with EADDRINUSE.
        if (lstatSync(unixPath).isSocket()) unlinkSync(unixPath);
      } catch {
        // no stale file
      }
    }
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      if ("path" in target) server.listen(target.path, resolve);
      else server.listen(target.port, target.host, resolve);
    }).catch((err: unknown) => {
      throw new EcError("EC_BAD_ENDPOINT", `listen ${options.listen}: ${(err as Error).message}`, {
        cause: err,
      });
    });
    // docs/ec-protocol.md 3.4: advertised as the unix endpoint it also is (a 1.1 reader uses it so).
    let endpoint = shmServer ? `unix://${(target as { path: string }).path}` : options.listen;
    const addr = server.address();
    if (addr !== null && typeof addr === "object") {
      const host = addr.address.includes(":") ? `[${addr.address}]` : addr.address;
      endpoint = `${"tls" in target && target.tls ? "tls" : "tcp"}://${host}:${addr.port}`;
    }
    if (options.advertise !== undefined) {
      let adv: string;
      try {
        adv = typeof options.advertise === "function" ? options.advertise(endpoint) : options.advertise;
        parseDataEndpoint(adv);
      } catch (err) {
        server.close();
        throw err;
      }
      endpoint = adv;
    }
    return new SocketDataTransport(options, server, endpoint, unixPath, {
      server: shmServer,
      options: shmServer ? (shmOptions ?? checkShm(true)) : shmOptions,
    });
  }

  /** The endpoint advertised in the metadata (`""` for a reader-only agent). */
  get endpoint(): string {
    return this.meta.endpoint;
  }

  /** Applies `fault` to the next `count` reads posted by this agent (tests and demos). */
  injectFault(fault: SocketFault, count = 1): void {
    this.#reader.injectFault(fault, count);
  }

  /**
   * The CRC-32 implementation the checksum thread uses (`"@node-rs/crc32"`, `"node:zlib"` or
   * `"table"`, by the same chain as this thread), once the thread has started (on the first
   * checksummed read); `null` before or without the thread.
   */
  get checksumThreadCrcImpl(): Crc32Impl | null {
    return this.#reader.checksumThreadCrcImpl;
  }

  /**
   * True when reads' CRCs go to the checksum thread: `checksumThread: "always"`, or `true` where
   * this process's CRC-32 runs below `CHECKSUM_THREAD_MAX_INLINE_GBPS` (else they stay inline).
   */
  get checksumThreadInUse(): boolean {
    return this.#reader.checksumThreadInUse;
  }

  /**
   * The send buffer the kernel reported for the data server's last accepted connection after
   * {@link SocketDataTransportOptions.sendBufferBytes} was applied; -1 when none was set (option 0,
   * a remote peer, no koffi, no connection yet).
   */
  get sendBufferBytes(): number {
    return this.#server.sendBufferBytes;
  }

  /** Number of live grants. */
  get grantCount(): number {
    return this.#server.grantCount;
  }

  /** Handles not yet released. */
  get openHandles(): number {
    return this.#reader.openHandles;
  }

  getAgentMetadata(): Uint8Array {
    return this.#self.agentMetadata();
  }

  getMemDescriptor(): Uint8Array {
    return this.#self.memDescriptor();
  }

  addRemotePeer(metadata: Uint8Array, memDescriptor: Uint8Array): string {
    return this.#reader.addRemotePeer(metadata, memDescriptor);
  }

  removeRemotePeer(agentName: string): void {
    this.#reader.removeRemotePeer(agentName);
  }

  postRead(
    localBlocks: readonly number[],
    agentName: string,
    remoteBlocks: readonly number[],
    notifMsg: Uint8Array,
    options: ReadOptions = {},
  ): XferHandle {
    if (this.#closed) throw new EcError("EC_CLOSED", "data transport: closed");
    return this.#reader.postRead(localBlocks, agentName, remoteBlocks, notifMsg, options);
  }

  checkXferState(handle: XferHandle): XferHandleState {
    return this.#reader.checkXferState(handle);
  }

  getXferChecksum(handle: XferHandle): number | null {
    return this.#reader.getXferChecksum(handle);
  }

  getXferSourceRuns(handle: XferHandle): Readonly<SourceRuns> | null {
    return this.#reader.getXferSourceRuns(handle);
  }

  getXferError(handle: XferHandle): string | null {
    return this.#reader.getXferError(handle);
  }

  releaseXferHandle(handle: XferHandle): boolean {
    return this.#reader.releaseXferHandle(handle);
  }

  getNewNotifs(): Map<string, Uint8Array[]> {
    return this.#server.getNewNotifs();
  }

  grant(key: string, blocks: readonly number[], deadline: number, nbytes?: number): void {
    this.#server.grant(key, blocks, deadline, nbytes);
  }

  /** Read-ahead (docs/ec-protocol.md 3.2): this transport serves and posts READ_AHEAD. */
  readonly readAhead = true;

  /** Read-ahead (docs/ec-protocol.md 3.2): see {@link DataTransport.postReadAhead}. */
  postReadAhead(
    localBlocks: readonly number[],
    agentName: string,
    notifMsg: Uint8Array,
    options: ReadOptions & { nbytes: number; waitMs: number; ackFirst?: boolean },
  ): XferHandle {
    if (this.#closed) throw new EcError("EC_CLOSED", "data transport: closed");
    return this.#reader.postReadAhead(localBlocks, agentName, notifMsg, options);
  }

  /** Ack-ahead (docs/ec-protocol.md 3.4): this transport sends and takes ACK frames. */
  readonly ackAhead = true;

  /** Ack-ahead (docs/ec-protocol.md 3.4): see {@link DataTransport.grantAck}. */
  grantAck(key: string, ack: Uint8Array): boolean {
    return this.#server.grantAck(key, ack);
  }

  /** Ack-ahead (docs/ec-protocol.md 3.4): see {@link DataTransport.takeReadAheadAck}. */
  takeReadAheadAck(handle: XferHandle): Uint8Array | null {
    return this.#reader.takeReadAheadAck(handle);
  }

  /** Requests on the data connection (docs/ec-protocol.md 3.5): this transport serves and sends XFER_REQ. */
  readonly dataRequests = true;

  #xferReq: XferRequestHandler | null = null;

  /** 3.5: see {@link DataTransport.onXferRequest} (`null`, the default: XFER_REQ is refused as in 1.1). */
  get onXferRequest(): XferRequestHandler | null {
    return this.#xferReq;
  }

  set onXferRequest(handler: XferRequestHandler | null) {
    this.#xferReq = handler;
    this.#server.setXferRequests(handler);
  }

  /** 3.5: see {@link DataTransport.postRequest}. */
  postRequest(
    localBlocks: readonly number[],
    agentName: string,
    notifMsg: Uint8Array,
    options: ReadOptions & { nbytes: number; request: Uint8Array },
  ): XferHandle {
    if (this.#closed) throw new EcError("EC_CLOSED", "data transport: closed");
    return this.#reader.postRequest(localBlocks, agentName, notifMsg, options);
  }

  revoke(key: string): void {
    this.#server.revoke(key);
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#reader.close();
    this.#server.close();
    if (this.#listener !== null) {
      const l = this.#listener;
      await new Promise<void>((resolve) => l.close(() => resolve()));
      if (this.#unixPath !== null) {
        try {
          unlinkSync(this.#unixPath);
        } catch {
          // already gone
        }
      }
    }
  }
}
