import { lstatSync, unlinkSync } from "node:fs";
import * as net from "node:net";
import { Worker } from "node:worker_threads";
import type { Counter, Gauge } from "@tapwire/stats";
import { Registry } from "@tapwire/stats";
import type { Logger } from "pino";
import type { Crc32Impl } from "../crc.js";
import { CRC32_IMPLS, crc32, crc32Info, nativeCrc32Path } from "../crc.js";
import { checkFunctionOption, checkIntOption, checkNumberOption, EcError } from "../errors.js";
import { EC_METRICS_PREFIX, silentLogger } from "../metrics.js";
import { bin, int, packMsg, str, unpackMap } from "../protocol.js";
import type {
  AgentMetadata,
  DataTransport,
  MemDescriptor,
  Notif,
  ReadOptions,
  XferHandle,
  XferHandleState,
} from "./transport.js";
import {
  agentNameOf,
  checkReadShape,
  decodeAgentMetadata,
  decodeMemDescriptor,
  deliverNotifs,
  encodeAgentMetadata,
  encodeMemDescriptor,
  newInstanceId,
  parseDataEndpoint,
} from "./transport.js";

/** Data-plane frame header: a 4-byte big-endian length of the MessagePack map that follows. */
const LEN_BYTES = 4;
const UTF8_FATAL = new TextDecoder("utf-8", { fatal: true });
/** Largest data-plane control frame (a READ with many block ids fits easily). */
export const MAX_DATA_FRAME_BYTES = 1 << 20;
/** Longest grant key / notification message in bytes. */
const MAX_KEY_BYTES = 1024;
/**
 * Largest receive while a read checksums inline (EC-CONTRACT 6.3: CRC per chunk as it lands). A
 * larger recv (tcp on loopback can hand over several MiB in one call) leaves the bytes out of L2
 * by the time the CRC reads them and leaves the sender idle while the CRC runs; 256 KiB chunks keep
 * the CRC on cache-hot bytes and the sender refilling the socket meanwhile (measured ~0.5 ms less
 * per 16 MiB read on tcp, ~0.15 ms on unix; no change with the check off, where reads stay uncapped).
 */
const INLINE_CRC_RECV_BYTES = 256 * 1024;
/** Landed bytes handed to the checksum thread per message. */
const CRC_BATCH = 512 * 1024;

/**
 * The checksum thread: CRC-32 of region ranges, in order, per read id; [-1, id] drops a read. It
 * uses `@node-rs/crc32` (`workerData.nativePath`) when the main thread does and it loads and
 * checks out here too, else `node:zlib`.
 */
const CRC_WORKER = `
const { parentPort, workerData } = require("node:worker_threads");
const zlib = require("node:zlib");
let crc = (b, c) => zlib.crc32(b, c);
let impl = "node:zlib";
if (workerData.nativePath !== null) {
  try {
    const f = require(workerData.nativePath).crc32;
    if (f(Buffer.from("123456789"), 0) >>> 0 === 0xcbf43926) { crc = f; impl = "@node-rs/crc32"; }
  } catch {}
}
parentPort.postMessage([-2, impl]);
const region = new Uint8Array(workerData.buffer, workerData.byteOffset, workerData.length);
const crcs = new Map();
parentPort.on("message", (m) => {
  if (m[0] === -1) { crcs.delete(m[1]); return; }
  let c = crcs.get(m[0]) ?? 0;
  if (m[2] > 0) c = crc(region.subarray(m[1], m[1] + m[2]), c) >>> 0;
  if (m[3]) { crcs.delete(m[0]); parentPort.postMessage([m[0], c >>> 0]); } else crcs.set(m[0], c);
});
`;

/** Test/demo faults the socket reader can apply to its next reads (EC-CONTRACT 5.4 for real sockets). */
export type SocketFault =
  | { kind: "lost_notification" }
  | { kind: "stall"; ms: number }
  | { kind: "abort" }
  | { kind: "corrupt" };

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
  /** Endpoint to advertise in the metadata (default: the bound endpoint). */
  advertise?: string;
  /** Monotonic clock (ms) for grant deadlines (default `performance.now`). */
  now?: () => number;
  /** Server write chunk (default 1 MiB). */
  chunkBytes?: number;
  /** Server pacing in bytes/s (default unlimited; for demos and tests of slow reads). */
  throttleBytesPerSec?: number;
  /** Idle reader connections kept per peer (default 4). */
  maxIdlePerPeer?: number;
  /**
   * Compute read checksums on a worker thread as ranges land, so the CRC overlaps the receive
   * instead of running between `recv`s (default false). Needs a region on a `SharedArrayBuffer`
   * (`EmbeddingCache({ shared: true })`). A read is DONE once its last range is checksummed.
   */
  checksumThread?: boolean;
  /** Where the `data_*` metrics go (default: a fresh Registry). */
  registry?: Registry;
  /** pino logger (default: silent). */
  logger?: Logger;
}

interface Grant {
  blocks: readonly number[];
  deadline: number;
}

interface Peer {
  meta: AgentMetadata;
  desc: MemDescriptor;
  idle: ReaderConn[];
  all: Set<ReaderConn>;
}

interface Read {
  handle: XferHandle;
  local: readonly number[];
  /** Destination as runs of contiguous blocks: region byte offsets and lengths (trimmed to nbytes). */
  segStart: number[];
  segLen: number[];
  seg: number;
  segOff: number;
  /** Landed bytes not yet handed to the checksum thread (region offsets). */
  pendStart: number;
  pendLen: number;
  /** Waiting for the checksum thread's final CRC. */
  crcPending: boolean;
  nbytes: number;
  received: number;
  checksum: boolean;
  crc: number;
  state: XferHandleState;
  error: string | null;
  notif: Uint8Array;
  conn: ReaderConn | null;
  fault: SocketFault | null;
}

type Phase = "len" | "hdr" | "body";

interface ReaderConn {
  socket: net.Socket;
  peer: Peer;
  phase: Phase;
  filled: number;
  hdrLen: number;
  scratch: Buffer;
  read: Read | null;
  dead: boolean;
  /** A finished read's notification not yet written (sent right after the completion is reported). */
  notif: Uint8Array | null;
}

interface ServerConn {
  socket: net.Socket;
  /** The grant that authorised the current/last stream (its notification completes only that grant). */
  grant: Grant | null;
  buf: Buffer;
  /** Key being streamed, or awaiting its notification. */
  key: Uint8Array | null;
  keyStr: string;
  streaming: boolean;
  reader: string;
}

interface DataMetrics {
  served: Counter;
  refused: Counter;
  bytesSent: Counter;
  malformed: Counter;
  notifications: Counter;
  connections: Gauge;
  readErrors: Counter;
  bytesReceived: Counter;
  staleNotifications: Counter;
}

function dataMetrics(r: Registry): DataMetrics {
  return {
    served: r.counter("data_reads_served", "data-plane reads served (EC-CONTRACT 5.3)"),
    refused: r.counter("data_reads_refused", "data-plane reads refused: no grant, wrong blocks, expired"),
    bytesSent: r.counter("data_bytes_sent", "block bytes streamed by the data server"),
    malformed: r.counter("data_malformed_frames", "data-plane frames dropped as malformed"),
    notifications: r.counter("data_notifications", "completion notifications received"),
    connections: r.gauge("data_server_connections", "open data-server connections"),
    readErrors: r.counter("data_read_errors", "reads that ended ERR at this reader"),
    bytesReceived: r.counter("data_bytes_received", "block bytes received by this reader"),
    staleNotifications: r.counter(
      "data_stale_notifications",
      "notifications dropped because their grant was replaced or revoked meanwhile",
    ),
  };
}

function frame(map: Record<string, unknown>): Buffer {
  const body = packMsg(map);
  const out = Buffer.allocUnsafe(LEN_BYTES + body.length);
  out.writeUInt32BE(body.length, 0);
  out.set(body, LEN_BYTES);
  return out;
}

/**
 * EC-CONTRACT 5.4: the `tcp` and `unix` data planes. Each agent may run a data server over its
 * cache region; a READ streams the granted blocks straight from the server's region (socket writes
 * of region views, no staging copy) into the reader's blocks (the kernel reads straight into the
 * destination block via `net.connect({ onread })`, no intermediate buffer), the CRC-32 runs over
 * each chunk as it lands, and the reader then sends the notification on the same connection.
 * Grants are enforced per key and exact block list (5.3); releasing a PROC read destroys its
 * socket, so no byte lands afterwards (5.2: always the guarantee).
 */
export class SocketDataTransport implements DataTransport {
  readonly kind: string;
  /** This agent's metadata (name, per-process instance id, data endpoint; EC-CONTRACT 5.3). */
  readonly meta: AgentMetadata;
  onNotification: (() => void) | null = null;
  onReadDone: (() => void) | null = null;

  readonly #region: Uint8Array;
  readonly #numBlocks: number;
  readonly #bb: number;
  readonly #now: () => number;
  readonly #chunk: number;
  #metaBytes: Uint8Array | null = null;
  #descBytes: Uint8Array | null = null;
  readonly #throttle: number;
  readonly #maxIdle: number;
  readonly #m: DataMetrics;
  readonly #log: Logger;
  readonly #server: net.Server | null;
  readonly #unixPath: string | null;
  readonly #grants = new Map<string, Grant>();
  readonly #streams = new Map<string, Set<ServerConn>>();
  readonly #serverConns = new Set<ServerConn>();
  readonly #peers = new Map<string, Peer>();
  readonly #reads = new Map<XferHandle, Read>();
  readonly #notifs: Notif[] = [];
  readonly #faults: SocketFault[] = [];
  #nextHandle = 1;
  #closed = false;
  readonly #crcThread: boolean;
  #worker: Worker | null = null;
  #threadImpl: Crc32Impl | null = null;

  private constructor(
    options: SocketDataTransportOptions,
    server: net.Server | null,
    endpoint: string,
    unixPath: string | null,
  ) {
    this.#region = options.region;
    this.#numBlocks = options.numBlocks;
    this.#bb = options.blockBytes;
    this.#now = options.now ?? (() => performance.now());
    this.#chunk = options.chunkBytes ?? 1 << 20;
    this.#throttle = options.throttleBytesPerSec ?? 0;
    this.#maxIdle = options.maxIdlePerPeer ?? 4;
    this.#crcThread = options.checksumThread === true;
    this.#m = dataMetrics(options.registry ?? new Registry({ prefix: EC_METRICS_PREFIX }));
    this.#log = options.logger ?? silentLogger();
    this.#server = server;
    this.#unixPath = unixPath;
    this.kind = endpoint.startsWith("unix://") ? "unix" : endpoint.startsWith("tcp://") ? "tcp" : "reader";
    this.meta = { name: options.name, instance: newInstanceId(), endpoint };
    if (server !== null) server.on("connection", (s) => this.#accept(s));
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
    if (options.throttleBytesPerSec !== undefined)
      checkNumberOption("throttleBytesPerSec", options.throttleBytesPerSec, 0);
    if (options.maxIdlePerPeer !== undefined) checkIntOption("maxIdlePerPeer", options.maxIdlePerPeer, 0);
    if (options.checksumThread !== undefined && typeof options.checksumThread !== "boolean") {
      throw new EcError("EC_BAD_OPTION", "option checksumThread: expected a boolean");
    }
    if (options.checksumThread === true && !(options.region.buffer instanceof SharedArrayBuffer)) {
      throw new EcError("EC_BAD_OPTION", "option checksumThread: the region must be on a SharedArrayBuffer");
    }
    if (options.listen === undefined) return new SocketDataTransport(options, null, "", null);
    const target = parseDataEndpoint(options.listen);
    const server = net.createServer({ noDelay: true });
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
    let endpoint = options.listen;
    const addr = server.address();
    if (addr !== null && typeof addr === "object") {
      const host = addr.address.includes(":") ? `[${addr.address}]` : addr.address;
      endpoint = `tcp://${host}:${addr.port}`;
    }
    if (options.advertise !== undefined) {
      parseDataEndpoint(options.advertise);
      endpoint = options.advertise;
    }
    return new SocketDataTransport(options, server, endpoint, unixPath);
  }

  /** The endpoint advertised in the metadata (`""` for a reader-only agent). */
  get endpoint(): string {
    return this.meta.endpoint;
  }

  /** Applies `fault` to the next `count` reads posted by this agent (tests and demos). */
  injectFault(fault: SocketFault, count = 1): void {
    for (let i = 0; i < count; i++) this.#faults.push(fault);
  }

  /**
   * The CRC-32 implementation the checksum thread uses (`"@node-rs/crc32"` or `"node:zlib"`), once
   * the thread has started (on the first checksummed read); `null` before or without the thread.
   */
  get checksumThreadCrcImpl(): Crc32Impl | null {
    return this.#threadImpl;
  }

  /** Number of live grants. */
  get grantCount(): number {
    return this.#grants.size;
  }

  /** Handles not yet released. */
  get openHandles(): number {
    return this.#reads.size;
  }

  getAgentMetadata(): Uint8Array {
    // Encoded once (it never changes); a copy per call so a caller cannot alter the cached bytes.
    this.#metaBytes ??= encodeAgentMetadata(this.meta);
    return this.#metaBytes.slice();
  }

  getMemDescriptor(): Uint8Array {
    this.#descBytes ??= encodeMemDescriptor({ numBlocks: this.#numBlocks, blockBytes: this.#bb });
    return this.#descBytes.slice();
  }

  addRemotePeer(metadata: Uint8Array, memDescriptor: Uint8Array): string {
    const meta = decodeAgentMetadata(metadata);
    const desc = decodeMemDescriptor(memDescriptor);
    parseDataEndpoint(meta.endpoint);
    const name = agentNameOf(meta);
    if (!this.#peers.has(name)) this.#peers.set(name, { meta, desc, idle: [], all: new Set() });
    return name;
  }

  removeRemotePeer(agentName: string): void {
    const peer = this.#peers.get(agentName);
    if (peer === undefined) return;
    this.#peers.delete(agentName);
    for (const c of peer.all) this.#killConn(c, "peer removed");
  }

  postRead(
    localBlocks: readonly number[],
    agentName: string,
    remoteBlocks: readonly number[],
    notifMsg: Uint8Array,
    options: ReadOptions = {},
  ): XferHandle {
    if (this.#closed) throw new EcError("EC_CLOSED", "data transport: closed");
    const peer = this.#peers.get(agentName);
    if (peer === undefined) throw new EcError("EC_BAD_ARGUMENT", `postRead: unknown agent ${agentName}`);
    const nbytes = checkReadShape(
      localBlocks,
      remoteBlocks,
      this.#numBlocks,
      peer.desc,
      this.#bb,
      options.nbytes,
    );
    if (notifMsg.length > MAX_KEY_BYTES) throw new EcError("EC_BAD_ARGUMENT", "postRead: notifMsg too long");
    let conn = peer.idle.pop();
    while (conn !== undefined && (conn.dead || conn.socket.destroyed)) conn = peer.idle.pop();
    conn ??= this.#connect(peer);
    // A notification still queued on this connection goes first: the server expects it before the next READ.
    this.#flushNotif(conn);
    const read: Read = {
      handle: this.#nextHandle++,
      local: [...localBlocks],
      ...segments(localBlocks, this.#bb, nbytes),
      seg: 0,
      segOff: 0,
      pendStart: 0,
      pendLen: 0,
      crcPending: false,
      nbytes,
      received: 0,
      checksum: options.checksum === true,
      crc: 0,
      state: "PROC",
      error: null,
      notif: Uint8Array.from(notifMsg),
      conn,
      fault: this.#faults.shift() ?? null,
    };
    this.#reads.set(read.handle, read);
    conn.read = read;
    conn.phase = "len";
    conn.filled = 0;
    conn.socket.write(
      frame({
        op: "read",
        key: read.notif,
        blocks: remoteBlocks,
        nbytes,
        reader: agentNameOf(this.meta),
        instance: peer.meta.instance,
      }),
    );
    return read.handle;
  }

  checkXferState(handle: XferHandle): XferHandleState {
    return this.#must(handle).state;
  }

  getXferChecksum(handle: XferHandle): number | null {
    const r = this.#must(handle);
    return r.state === "DONE" && r.checksum ? r.crc >>> 0 : null;
  }

  getXferError(handle: XferHandle): string | null {
    return this.#must(handle).error;
  }

  releaseXferHandle(handle: XferHandle): boolean {
    const r = this.#must(handle);
    this.#reads.delete(handle);
    if (r.state === "PROC" && r.checksum && this.#crcThread) this.#worker?.postMessage([-1, r.handle]);
    if (r.state === "PROC" && r.conn !== null) {
      // Destroying the socket stops its reads synchronously: nothing lands after this returns.
      this.#killConn(r.conn, "released");
    }
    r.conn = null;
    return true;
  }

  getNewNotifs(): Map<string, Uint8Array[]> {
    return deliverNotifs(this.#notifs, this.#grants, this.#m.staleNotifications);
  }

  grant(key: string, blocks: readonly number[], deadline: number): void {
    for (const b of blocks) {
      if (!Number.isInteger(b) || b < 0 || b >= this.#numBlocks) {
        throw new EcError("EC_BAD_ARGUMENT", `grant ${key}: block ${b} outside [0, ${this.#numBlocks})`);
      }
    }
    this.#grants.set(key, { blocks: [...blocks], deadline });
  }

  revoke(key: string): void {
    this.#grants.delete(key);
    const live = this.#streams.get(key);
    if (live === undefined) return;
    this.#streams.delete(key);
    for (const c of live) if (c.streaming) c.socket.destroy();
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#worker !== null) {
      const w = this.#worker;
      this.#worker = null;
      await w.terminate();
    }
    for (const peer of this.#peers.values()) for (const c of peer.all) this.#killConn(c, "transport closed");
    this.#peers.clear();
    for (const c of this.#serverConns) c.socket.destroy();
    this.#serverConns.clear();
    this.#grants.clear();
    this.#streams.clear();
    if (this.#server !== null) {
      await new Promise<void>((resolve) => this.#server!.close(() => resolve()));
      if (this.#unixPath !== null) {
        try {
          unlinkSync(this.#unixPath);
        } catch {
          // already gone
        }
      }
    }
  }

  // ---- reader side ----

  #connect(peer: Peer): ReaderConn {
    const target = parseDataEndpoint(peer.meta.endpoint);
    const conn = {
      peer,
      phase: "len",
      filled: 0,
      hdrLen: 0,
      scratch: Buffer.allocUnsafe(LEN_BYTES + MAX_DATA_FRAME_BYTES),
      read: null,
      dead: false,
      notif: null,
    } as unknown as ReaderConn;
    const onread = {
      buffer: () => this.#nextBuffer(conn),
      callback: (n: number, buf: Uint8Array) => this.#onBytes(conn, n, buf),
    };
    conn.socket =
      "path" in target
        ? net.connect({ path: target.path, onread })
        : net.connect({ host: target.host, port: target.port, onread, noDelay: true });
    conn.socket.on("error", (err) => this.#connDown(conn, err.message));
    conn.socket.on("close", () => this.#connDown(conn, "connection closed"));
    peer.all.add(conn);
    return conn;
  }

  /** Where the kernel writes the next bytes: the header scratch, or straight into the destination block. */
  #nextBuffer(conn: ReaderConn): Uint8Array {
    const r = conn.read;
    if (conn.phase === "body" && r !== null && r.seg < r.segStart.length) {
      // The rest of the current run of contiguous destination blocks (one recv can fill it), at
      // most INLINE_CRC_RECV_BYTES when the CRC runs inline on each chunk.
      const start = r.segStart[r.seg]! + r.segOff;
      const left = r.segLen[r.seg]! - r.segOff;
      const n = r.checksum && !this.#crcThread && left > INLINE_CRC_RECV_BYTES ? INLINE_CRC_RECV_BYTES : left;
      return this.#region.subarray(start, start + n);
    }
    if (conn.phase === "hdr") return conn.scratch.subarray(LEN_BYTES + conn.filled, LEN_BYTES + conn.hdrLen);
    return conn.scratch.subarray(conn.filled, LEN_BYTES);
  }

  #onBytes(conn: ReaderConn, n: number, buf: Uint8Array): boolean {
    if (conn.dead) return false;
    const r = conn.read;
    if (conn.phase === "body" && r !== null) {
      if (r.fault?.kind === "corrupt") {
        // Wire corruption as the bytes land (before the CRC sees them).
        buf[0] = buf[0]! ^ 0xff;
        r.fault = null;
      }
      if (r.checksum) {
        if (this.#crcThread) this.#crcRange(r, buf.byteOffset - this.#region.byteOffset, n);
        else r.crc = crc32(buf.subarray(0, n), r.crc);
      }
      r.received += n;
      r.segOff += n;
      if (r.segOff === r.segLen[r.seg]) {
        r.seg++;
        r.segOff = 0;
      }
      this.#m.bytesReceived.inc(n);
      if (r.received === r.nbytes) this.#finish(conn, r);
      return true;
    }
    conn.filled += n;
    if (conn.phase === "len") {
      if (conn.filled < LEN_BYTES) return true;
      const len = conn.scratch.readUInt32BE(0);
      if (r === null || len === 0 || len > MAX_DATA_FRAME_BYTES) {
        this.#protocolError(conn, r === null ? "unsolicited bytes" : `bad frame length ${len}`);
        return false;
      }
      conn.hdrLen = len;
      conn.filled = 0;
      conn.phase = "hdr";
      return true;
    }
    if (conn.filled < conn.hdrLen || r === null) return true;
    let m: Record<string, unknown>;
    try {
      m = unpackMap(conn.scratch.subarray(LEN_BYTES, LEN_BYTES + conn.hdrLen), "data frame");
    } catch (err) {
      this.#protocolError(conn, (err as Error).message);
      return false;
    }
    if (m["op"] === "data" && m["nbytes"] === r.nbytes) {
      conn.phase = "body";
      conn.filled = 0;
      // Injected faults strike before the first body byte, so they hit reads of any size.
      if (r.fault?.kind === "abort") {
        this.#killConn(conn, "injected abort");
        return false;
      }
      if (r.fault?.kind === "stall") {
        conn.socket.pause();
        setTimeout(() => {
          if (!conn.dead) conn.socket.resume();
        }, r.fault.ms).unref();
      }
      return true;
    }
    const why =
      m["op"] === "error"
        ? `refused: ${String(m["code"])}: ${String(m["message"])}`
        : "unexpected data-plane answer";
    this.#protocolError(conn, why);
    return false;
  }

  #finish(conn: ReaderConn, r: Read): void {
    if (r.fault?.kind !== "lost_notification") {
      // The notification is written after the completion is reported (a socket write is tens of
      // microseconds of syscall): see the end of this method.
      conn.notif = frame({ op: "notif", msg: r.notif });
    }
    if (r.checksum && this.#crcThread) {
      // Every byte landed; the read is DONE when the thread's CRC of the last range comes back.
      this.#crcPost(r, true);
      r.crcPending = true;
    } else {
      r.state = "DONE";
    }
    r.conn = null;
    conn.read = null;
    conn.phase = "len";
    conn.filled = 0;
    const peer = conn.peer;
    if (this.#peers.get(agentNameOf(peer.meta)) === peer && peer.idle.length < this.#maxIdle)
      peer.idle.push(conn);
    else this.#killConn(conn, "not pooled");
    this.onReadDone?.();
    // Queued after onReadDone: a consumer that polls from onActivity (a promise it resolves there)
    // promotes first, then this microtask sends the notification, before any later READ or request.
    // A READ posted on this connection before then sends it first (same bytes, same order).
    if (conn.notif !== null) queueMicrotask(() => this.#flushNotif(conn));
  }

  #flushNotif(conn: ReaderConn): void {
    const n = conn.notif;
    if (n === null) return;
    conn.notif = null;
    if (!conn.dead && !conn.socket.destroyed) conn.socket.write(n);
  }

  #protocolError(conn: ReaderConn, why: string): void {
    this.#log.warn({ peer: conn.peer.meta.endpoint, why }, "data-plane read failed");
    this.#killConn(conn, why);
  }

  #killConn(conn: ReaderConn, why: string): void {
    if (!conn.dead) {
      this.#flushNotif(conn); // the previous read's notification is still owed
      conn.dead = true;
      conn.socket.destroy();
    }
    this.#connDown(conn, why);
  }

  #connDown(conn: ReaderConn, why: string): void {
    conn.dead = true;
    const r = conn.read;
    conn.read = null;
    conn.peer.all.delete(conn);
    const i = conn.peer.idle.indexOf(conn);
    if (i >= 0) conn.peer.idle.splice(i, 1);
    if (r !== null && r.state === "PROC") {
      if (r.checksum && this.#crcThread) this.#worker?.postMessage([-1, r.handle]);
      r.state = "ERR";
      r.error = why;
      r.conn = null;
      this.#m.readErrors.inc();
      this.onReadDone?.();
    }
  }

  #crcRange(r: Read, start: number, n: number): void {
    if (r.pendLen > 0 && r.pendStart + r.pendLen === start) r.pendLen += n;
    else {
      if (r.pendLen > 0) this.#crcPost(r, false);
      r.pendStart = start;
      r.pendLen = n;
    }
    if (r.pendLen >= CRC_BATCH) this.#crcPost(r, false);
  }

  #crcPost(r: Read, final: boolean): void {
    if (this.#worker === null) {
      const region = this.#region;
      this.#worker = new Worker(CRC_WORKER, {
        eval: true,
        workerData: {
          buffer: region.buffer,
          byteOffset: region.byteOffset,
          length: region.length,
          nativePath: crc32Info.impl === CRC32_IMPLS.native ? nativeCrc32Path() : null,
        },
      });
      this.#worker.unref();
      this.#worker.on("message", (m: [number, number | string]) => {
        if (m[0] === -2) this.#threadImpl = m[1] as Crc32Impl;
        else this.#crcDone(m[0], m[1] as number);
      });
      this.#worker.on("error", (err) => {
        this.#log.error({ err }, "checksum thread failed");
        this.#worker = null;
        for (const rd of this.#reads.values()) {
          if (rd.state === "PROC" && rd.checksum) {
            rd.state = "ERR";
            rd.error = "checksum thread failed";
          }
        }
        this.onReadDone?.();
      });
    }
    this.#worker.postMessage([r.handle, r.pendStart, r.pendLen, final]);
    r.pendLen = 0;
  }

  #crcDone(handle: XferHandle, crc: number): void {
    const r = this.#reads.get(handle);
    if (r === undefined || r.state !== "PROC" || !r.crcPending) return;
    r.crc = crc;
    r.crcPending = false;
    r.state = "DONE";
    this.onReadDone?.();
  }

  #must(handle: XferHandle): Read {
    const r = this.#reads.get(handle);
    if (r === undefined) throw new EcError("EC_BAD_ARGUMENT", `unknown read handle ${String(handle)}`);
    return r;
  }

  // ---- server side ----

  #accept(socket: net.Socket): void {
    if (this.#closed) {
      socket.destroy();
      return;
    }
    socket.setNoDelay(true);
    const c: ServerConn = {
      socket,
      grant: null,
      buf: Buffer.alloc(0),
      key: null,
      keyStr: "",
      streaming: false,
      reader: "",
    };
    this.#serverConns.add(c);
    this.#m.connections.set(this.#serverConns.size);
    socket.on("data", (chunk: Buffer) => this.#onServerData(c, chunk));
    socket.on("error", () => socket.destroy());
    socket.on("close", () => {
      this.#serverConns.delete(c);
      this.#m.connections.set(this.#serverConns.size);
      if (c.key !== null) this.#streams.get(c.keyStr)?.delete(c);
    });
  }

  #onServerData(c: ServerConn, chunk: Buffer): void {
    c.buf = c.buf.length === 0 ? chunk : Buffer.concat([c.buf, chunk]);
    while (c.buf.length >= LEN_BYTES && !c.socket.destroyed) {
      const len = c.buf.readUInt32BE(0);
      if (len === 0 || len > MAX_DATA_FRAME_BYTES) {
        this.#badFrame(c, `frame length ${len}`);
        return;
      }
      if (c.buf.length < LEN_BYTES + len) return;
      const body = c.buf.subarray(LEN_BYTES, LEN_BYTES + len);
      c.buf = c.buf.subarray(LEN_BYTES + len);
      if (c.streaming) {
        this.#badFrame(c, "frame while streaming");
        return;
      }
      try {
        this.#serverFrame(c, unpackMap(body, "data frame"));
      } catch (err) {
        this.#badFrame(c, (err as Error).message);
        return;
      }
    }
  }

  #serverFrame(c: ServerConn, m: Record<string, unknown>): void {
    const op = str(m, "op", "data frame");
    if (op === "notif") {
      const msg = bin(m, "msg", "notif");
      // A notification is only accepted for the read this connection just finished streaming.
      if (c.key === null || Buffer.compare(c.key, msg) !== 0) {
        throw new EcError("EC_MALFORMED", "notif: no finished read of that key on this connection");
      }
      this.#streams.get(c.keyStr)?.delete(c);
      c.key = null;
      this.#notifs.push({ from: c.reader, key: c.keyStr, msg: Uint8Array.from(msg), grant: c.grant });
      c.grant = null;
      this.#m.notifications.inc();
      this.onNotification?.();
      return;
    }
    if (op !== "read") throw new EcError("EC_MALFORMED", `unknown op ${op}`);
    const key = bin(m, "key", "read");
    if (key.length > MAX_KEY_BYTES) throw new EcError("EC_MALFORMED", "read: key too long");
    const blocks = m["blocks"];
    if (!Array.isArray(blocks) || blocks.length === 0 || blocks.length > this.#numBlocks) {
      throw new EcError("EC_MALFORMED", "read: blocks is not a non-empty array within the cache size");
    }
    for (const b of blocks) {
      if (typeof b !== "number" || !Number.isSafeInteger(b) || b < 0) {
        throw new EcError("EC_MALFORMED", "read: a block index is not a non-negative integer");
      }
    }
    const nbytes = int(m, "nbytes", "read", 1);
    const reader = str(m, "reader", "read", 512);
    const instance = str(m, "instance", "read");
    if (c.key !== null) this.#streams.get(c.keyStr)?.delete(c); // the previous notification was lost
    c.key = null;
    let keyStr: string;
    try {
      keyStr = UTF8_FATAL.decode(key);
    } catch {
      keyStr = "";
    }
    const g = this.#grants.get(keyStr);
    const refusal =
      instance !== this.meta.instance
        ? ["instance_mismatch", `this agent is instance ${this.meta.instance}`]
        : g === undefined
          ? ["no_grant", `no grant for key ${keyStr}`]
          : this.#now() > g.deadline
            ? ["expired", `grant ${keyStr} expired`]
            : g.blocks.length !== blocks.length || g.blocks.some((b, i) => b !== blocks[i])
              ? ["blocks_mismatch", `blocks differ from grant ${keyStr}`]
              : nbytes > blocks.length * this.#bb || nbytes <= (blocks.length - 1) * this.#bb
                ? ["bad_nbytes", `nbytes ${nbytes} does not fill exactly ${blocks.length} blocks`]
                : null;
    if (refusal !== null) {
      this.#m.refused.inc();
      this.#log.warn({ key: keyStr, code: refusal[0] }, "data-plane read refused");
      c.socket.end(frame({ op: "error", code: refusal[0], message: refusal[1] }));
      return;
    }
    c.key = Uint8Array.from(key);
    c.keyStr = keyStr;
    c.grant = g!;
    c.reader = reader;
    c.streaming = true;
    let set = this.#streams.get(keyStr);
    if (set === undefined) {
      set = new Set();
      this.#streams.set(keyStr, set);
    }
    set.add(c);
    this.#m.served.inc();
    void this.#stream(c, blocks as number[], nbytes);
  }

  async #stream(c: ServerConn, blocks: readonly number[], nbytes: number): Promise<void> {
    const s = c.socket;
    // The header and the first chunk leave in one writev (one syscall instead of two).
    s.cork();
    s.write(frame({ op: "data", nbytes }));
    let corked = true;
    const { segStart, segLen } = segments(blocks, this.#bb, nbytes);
    let sent = 0;
    for (let i = 0; i < segStart.length; i++) {
      const base = segStart[i]!;
      const n = segLen[i]!;
      for (let off = 0; off < n; off += this.#chunk) {
        if (s.destroyed) return;
        const len = Math.min(this.#chunk, n - off);
        // A view of the pinned region: the socket sends from it without a staging copy.
        const ok = s.write(this.#region.subarray(base + off, base + off + len));
        if (corked) {
          corked = false;
          s.uncork();
        }
        this.#m.bytesSent.inc(len);
        sent += len;
        // The reader may answer (notification, next READ) as soon as the last byte is out.
        if (sent === nbytes) break;
        if (this.#throttle > 0) await sleep((len / this.#throttle) * 1000);
        // writableNeedDrain, not the write's return value: a 'drain' during the throttle sleep (or
        // right after the uncork) has already happened and would never fire again.
        if (!ok && s.writableNeedDrain && !s.destroyed) await drained(s);
      }
    }
    c.streaming = false;
  }

  #badFrame(c: ServerConn, why: string): void {
    this.#m.malformed.inc();
    this.#log.warn({ why }, "malformed data-plane frame; closing the connection");
    c.socket.destroy();
  }
}

/** Runs of consecutive block ids as region byte ranges covering the first `nbytes` bytes. */
function segments(
  blocks: readonly number[],
  bb: number,
  nbytes: number,
): { segStart: number[]; segLen: number[] } {
  const segStart: number[] = [];
  const segLen: number[] = [];
  let left = nbytes;
  for (let i = 0; i < blocks.length && left > 0; i++) {
    const n = Math.min(bb, left);
    const start = blocks[i]! * bb;
    const last = segStart.length - 1;
    if (last >= 0 && segStart[last]! + segLen[last]! === start) segLen[last]! += n;
    else {
      segStart.push(start);
      segLen.push(n);
    }
    left -= n;
  }
  return { segStart, segLen };
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function drained(s: net.Socket): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      s.off("drain", done);
      s.off("close", done);
      resolve();
    };
    s.on("drain", done);
    s.on("close", done);
  });
}
