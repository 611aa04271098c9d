import type * as net from "node:net";
import type { Logger } from "pino";
import type { Crc32Impl } from "../crc.js";
import { checksumThreadInlineNote, checksumThreadUsed, crc32 } from "../crc.js";
import { EcError, isIntInRange } from "../errors.js";
import type { DataMetrics } from "../metrics.js";
import { ChecksumThread } from "./checksum.js";
import type { DataConnect } from "./connect.js";
import {
  decodeToReader,
  encodeFrame,
  frameLength,
  LEN_BYTES,
  MAX_ACK_FRAME_BYTES,
  MAX_KEY_BYTES,
  MAX_READ_AHEAD_WAIT_MS,
  MAX_READER_FRAME_BYTES,
  segments,
} from "./frame.js";
import { encodeXferReqFrame } from "./request-frame.js";
import { decodeShmToReader, isShmOp } from "./shm-frame.js";
import type { ShmDataReader, ShmReaderConn, ShmReadTarget } from "./shm-reader.js";
import type { SourceRuns } from "./source-runs.js";
import type { AgentMetadata, MemDescriptor, ReadOptions, XferHandle, XferHandleState } from "./transport.js";
import {
  agentNameOf,
  checkReadShape,
  decodeAgentMetadata,
  decodeMemDescriptor,
  parseDataEndpoint,
} from "./transport.js";

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
 * The smallest shm read whose CRC goes to the checksum thread (with `checksumThread`): there the
 * copy and the CRC are the whole read, so the thread's CRC of one piece overlaps the copy of the
 * next. Below it the thread's messages cost more than they overlap: measured (shared region,
 * idle 2-core VM, docs/benchmarks/ec-connector.md "The cache region is page-aligned") 16 MiB 3.3-3.9
 * ms against 4.3-4.7 ms inline, 4 MiB even, 1 MiB 0.83-0.89 against 0.62 ms.
 */
const SHM_CRC_THREAD_MIN_BYTES = 8 * 1024 * 1024;

/** Test/demo faults the socket reader can apply to its next reads (EC-CONTRACT 5.4 for real sockets). */
export type SocketFault =
  | {
      /** `lost_notification`: the read completes, its notification is never sent; `abort`: the
       * connection dies before the first body byte; `corrupt`: one landed byte is flipped. */
      kind: "lost_notification" | "abort" | "corrupt";
    }
  | {
      /** The reader stops receiving before the first body byte... */
      kind: "stall";
      /** ...for this long, ms. */
      ms: number;
    };

interface Peer {
  meta: AgentMetadata;
  desc: MemDescriptor;
  idle: ReaderConn[];
  all: Set<ReaderConn>;
  /** Removed (removeRemotePeer): its connections are not pooled any more. */
  removed: boolean;
  /** The peer's instance id as UTF-8 (for XFER_REQ frames, encoded once). */
  instanceBytes: Uint8Array;
}

interface Read {
  handle: XferHandle;
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
  /** Its NOTIF frame, built when the read is posted (off the path from the last byte to DONE). */
  notifFrame: Buffer;
  conn: ReaderConn | null;
  fault: SocketFault | null;
  /** Its bytes came through an shm ring or the shared region (docs/ec-protocol.md 3.4). */
  shm: boolean;
  /** Its CRC-32 runs on the checksum thread (`checksumThread`; shm reads from SHM_CRC_THREAD_MIN_BYTES). */
  crcThread: boolean;
  /** 3.4 "Shared region": where its bytes were copied from (null: not from a shared region). */
  src: SourceRuns | null;
  /** Its item's blocks: the most source runs it can have. */
  srcMaxRuns: number;
  /** docs/ec-protocol.md 3.3: this READ_AHEAD asked for the ACK frame before DATA. */
  ackFirst: boolean;
  /** The ACK frame's XferAck bytes, until taken. */
  ack: Uint8Array | null;
  /** An ACK frame arrived for this read (at most one is accepted). */
  acked: boolean;
  /** docs/ec-protocol.md 3.5: an XFER_REQ (its answer may be an ACK flagged `final`, no DATA). */
  requested: boolean;
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
  /** The shm ring of this connection (docs/ec-protocol.md 3.4), null on the plain socket path. */
  shm: ShmReaderConn | null;
}

/** Options of {@link DataReader}. */
export interface DataReaderOptions {
  region: Uint8Array;
  numBlocks: number;
  blockBytes: number;
  maxIdlePerPeer: number;
  /** `true`: the checksum thread where it pays (crc.ts `checksumThreadUsed`); `"always"`: always. */
  checksumThread: boolean | "always";
  /** This agent's name as it introduces itself in a READ. */
  self: string;
  connect: DataConnect;
  metrics: DataMetrics;
  logger: Logger;
  /** Called when a read leaves PROC. */
  onReadDone: () => void;
  /** The shm data plane (docs/ec-protocol.md 3.4): used with producers whose metadata offers it. */
  shm?: ShmDataReader;
}

/**
 * The reader side of the tcp/unix data plane (EC-CONTRACT 5.2, 5.4): pooled connections per peer,
 * each read landing straight in the destination blocks (`net.connect({ onread })`: the kernel
 * writes into the block, no intermediate buffer), the CRC-32 over each chunk as it lands (here or
 * on the checksum thread), then the notification on the same connection.
 */
export class DataReader {
  readonly #o: DataReaderOptions;
  readonly #region: Uint8Array;
  readonly #bb: number;
  readonly #m: DataMetrics;
  readonly #peers = new Map<string, Peer>();
  readonly #reads = new Map<XferHandle, Read>();
  readonly #faults: SocketFault[] = [];
  #nextHandle = 1;
  #thread: ChecksumThread | null = null;
  /** Reads' CRCs go to the checksum thread (`checksumThread`, decided once at construction). */
  readonly #useThread: boolean;
  /** `self` as UTF-8 (for XFER_REQ frames, encoded once). */
  readonly #selfBytes: Uint8Array;
  /** With the checksum thread, an shm read's landed pieces go to it (shm-reader.ts `chunk`). */
  readonly #shmLanded: (r: ShmReadTarget, start: number, n: number) => void;

  constructor(options: DataReaderOptions) {
    this.#o = options;
    this.#region = options.region;
    this.#bb = options.blockBytes;
    this.#m = options.metrics;
    this.#selfBytes = Buffer.from(options.self, "utf8");
    this.#useThread = checksumThreadUsed(options.checksumThread);
    if (options.checksumThread === true && !this.#useThread)
      options.logger.info(...checksumThreadInlineNote());
    // Every shm read's target is one of this reader's Read records (#onShmFrame).
    this.#shmLanded = (r, start, n) => this.#crcRange(r as Read, start, n);
  }

  /**
   * True when reads' CRCs go to the checksum thread: `checksumThread: "always"`, or `true` on a
   * process whose CRC-32 runs below `CHECKSUM_THREAD_MAX_INLINE_GBPS` (crc.ts `checksumThreadUsed`).
   */
  get checksumThreadInUse(): boolean {
    return this.#useThread;
  }

  /** The checksum thread's CRC-32 implementation once it has said (`null` before or without it). */
  get checksumThreadCrcImpl(): Crc32Impl | null {
    return this.#thread?.impl ?? null;
  }

  /** Handles not yet released. */
  get openHandles(): number {
    return this.#reads.size;
  }

  injectFault(fault: SocketFault, count: number): void {
    for (let i = 0; i < count; i++) this.#faults.push(fault);
  }

  addRemotePeer(metadata: Uint8Array, memDescriptor: Uint8Array): string {
    const meta = decodeAgentMetadata(metadata);
    const desc = decodeMemDescriptor(memDescriptor);
    parseDataEndpoint(meta.endpoint);
    const name = agentNameOf(meta);
    if (!this.#peers.has(name)) {
      this.#peers.set(name, {
        meta,
        desc,
        idle: [],
        all: new Set(),
        removed: false,
        instanceBytes: Buffer.from(meta.instance, "utf8"),
      });
    }
    return name;
  }

  removeRemotePeer(agentName: string): void {
    const peer = this.#peers.get(agentName);
    if (peer === undefined) return;
    this.#peers.delete(agentName);
    peer.removed = true;
    for (const c of peer.all) this.#killConn(c, "peer removed");
  }

  postRead(
    localBlocks: readonly number[],
    agentName: string,
    remoteBlocks: readonly number[],
    notifMsg: Uint8Array,
    options: ReadOptions,
  ): XferHandle {
    const peer = this.#peers.get(agentName);
    if (peer === undefined) throw new EcError("EC_BAD_ARGUMENT", `postRead: unknown agent ${agentName}`);
    const nbytes = checkReadShape(
      localBlocks,
      remoteBlocks,
      this.#o.numBlocks,
      peer.desc,
      this.#bb,
      options.nbytes,
    );
    return this.#post(peer, localBlocks, nbytes, notifMsg, options.checksum === true, (notif) =>
      encodeFrame({
        op: "read",
        key: notif,
        blocks: remoteBlocks,
        nbytes,
        reader: this.#o.self,
        instance: peer.meta.instance,
      }),
    );
  }

  #post(
    peer: Peer,
    localBlocks: readonly number[],
    nbytes: number,
    notifMsg: Uint8Array,
    checksum: boolean,
    frame: (notif: Uint8Array) => Buffer,
    ackFirst = false,
    requested = false,
  ): XferHandle {
    if (notifMsg.length > MAX_KEY_BYTES) throw new EcError("EC_BAD_ARGUMENT", "postRead: notifMsg too long");
    let conn = peer.idle.pop();
    while (conn !== undefined && (conn.dead || conn.socket.destroyed)) conn = peer.idle.pop();
    conn ??= this.#connect(peer);
    // A notification still queued on this connection goes first: the server expects it before the
    // next READ. Issue 23: in the same write (one syscall, ~30-80 µs on the dev VM, not two).
    const owed = conn.dead || conn.socket.destroyed ? null : conn.notif;
    conn.notif = null;
    // Issue 23 item 1: the frame leaves before the read's bookkeeping is built (the producer works
    // on it meanwhile). No byte can land before this call returns to the event loop, and by then
    // `conn.read` is set below.
    const f = frame(notifMsg);
    const out = owed === null ? f : Buffer.concat([owed, f]);
    if (conn.shm !== null) this.#o.shm?.send(conn.shm, conn.socket, out);
    else conn.socket.write(out);
    const notif = Uint8Array.from(notifMsg);
    const read: Read = {
      handle: this.#nextHandle++,
      ...segments(localBlocks, this.#bb, nbytes),
      seg: 0,
      segOff: 0,
      pendStart: 0,
      pendLen: 0,
      crcPending: false,
      nbytes,
      received: 0,
      checksum,
      crcThread: checksum && this.#useThread,
      src: null,
      srcMaxRuns: Math.ceil(nbytes / this.#bb),
      crc: 0,
      state: "PROC",
      error: null,
      notif,
      notifFrame: encodeFrame({ op: "notif", msg: notif }),
      conn,
      fault: this.#faults.shift() ?? null,
      shm: false,
      ackFirst,
      ack: null,
      acked: false,
      requested,
    };
    this.#reads.set(read.handle, read);
    conn.read = read;
    conn.phase = "len";
    conn.filled = 0;
    return read.handle;
  }

  /**
   * Read-ahead (docs/ec-protocol.md 3.2): a READ_AHEAD for the grant `notifMsg` of `agentName`,
   * before its ack; the bytes land in `localBlocks` exactly as a READ's.
   */
  postReadAhead(
    localBlocks: readonly number[],
    agentName: string,
    notifMsg: Uint8Array,
    options: ReadOptions & { nbytes: number; waitMs: number; ackFirst?: boolean },
  ): XferHandle {
    const peer = this.#peers.get(agentName);
    if (peer === undefined) throw new EcError("EC_BAD_ARGUMENT", `postReadAhead: unknown agent ${agentName}`);
    const nb = options.nbytes;
    const bb = this.#bb;
    if (!isIntInRange(nb, 1) || nb > localBlocks.length * bb || nb <= (localBlocks.length - 1) * bb) {
      throw new EcError(
        "EC_BAD_ARGUMENT",
        `postReadAhead: nbytes ${nb} does not fill the ${localBlocks.length} local blocks`,
      );
    }
    if (!isIntInRange(options.waitMs, 1, MAX_READ_AHEAD_WAIT_MS)) {
      throw new EcError(
        "EC_BAD_ARGUMENT",
        `postReadAhead: waitMs ${options.waitMs} outside [1, ${MAX_READ_AHEAD_WAIT_MS}]`,
      );
    }
    for (const b of localBlocks) {
      if (!isIntInRange(b, 0, this.#o.numBlocks - 1)) {
        throw new EcError(
          "EC_BAD_ARGUMENT",
          `postReadAhead: local block ${b} outside [0, ${this.#o.numBlocks})`,
        );
      }
    }
    const ackFirst = options.ackFirst === true;
    return this.#post(
      peer,
      localBlocks,
      nb,
      notifMsg,
      options.checksum === true,
      (notif) =>
        encodeFrame({
          op: "read_ahead",
          key: notif,
          nbytes: nb,
          waitMs: options.waitMs,
          reader: this.#o.self,
          instance: peer.meta.instance,
          ...(ackFirst ? { ackFirst: true } : {}),
        }),
      ackFirst,
    );
  }

  /**
   * docs/ec-protocol.md 3.5: an XFER_REQ carrying `options.request` (the XferReq map) for the grant
   * `notifMsg` of `agentName`: the producer grants and answers on this connection, ACK first; the
   * bytes land in `localBlocks` exactly as a READ's. A NACK ends the handle ERR without bytes.
   */
  postRequest(
    localBlocks: readonly number[],
    agentName: string,
    notifMsg: Uint8Array,
    options: ReadOptions & { nbytes: number; request: Uint8Array },
  ): XferHandle {
    const peer = this.#peers.get(agentName);
    if (peer === undefined) throw new EcError("EC_BAD_ARGUMENT", `postRequest: unknown agent ${agentName}`);
    const nb = options.nbytes;
    const bb = this.#bb;
    if (!isIntInRange(nb, 1) || nb > localBlocks.length * bb || nb <= (localBlocks.length - 1) * bb) {
      throw new EcError(
        "EC_BAD_ARGUMENT",
        `postRequest: nbytes ${nb} does not fill the ${localBlocks.length} local blocks`,
      );
    }
    for (const b of localBlocks) {
      if (!isIntInRange(b, 0, this.#o.numBlocks - 1)) {
        throw new EcError(
          "EC_BAD_ARGUMENT",
          `postRequest: local block ${b} outside [0, ${this.#o.numBlocks})`,
        );
      }
    }
    // Built before the post: a request the frame cannot carry throws here, with nothing posted.
    const f = encodeXferReqFrame({
      reader: this.#selfBytes,
      instance: peer.instanceBytes,
      nbytes: nb,
      req: options.request,
    });
    return this.#post(peer, localBlocks, nb, notifMsg, options.checksum === true, () => f, true, true);
  }

  /**
   * docs/ec-protocol.md 3.3: the XferAck bytes an ACK frame brought for this READ_AHEAD (once;
   * `null` before it arrived, after it was taken, or when none came).
   */
  takeReadAheadAck(handle: XferHandle): Uint8Array | null {
    const r = this.#must(handle);
    const a = r.ack;
    r.ack = null;
    return a;
  }

  checkXferState(handle: XferHandle): XferHandleState {
    return this.#must(handle).state;
  }

  getXferChecksum(handle: XferHandle): number | null {
    const r = this.#must(handle);
    return r.state === "DONE" && r.checksum ? r.crc >>> 0 : null;
  }

  /** docs/ec-protocol.md 3.4 "Shared region": where a DONE read's bytes came from, else null. */
  getXferSourceRuns(handle: XferHandle): Readonly<SourceRuns> | null {
    const r = this.#must(handle);
    return r.state === "DONE" ? r.src : null;
  }

  getXferError(handle: XferHandle): string | null {
    return this.#must(handle).error;
  }

  releaseXferHandle(handle: XferHandle): boolean {
    const r = this.#must(handle);
    this.#reads.delete(handle);
    if (r.state === "PROC" && r.checksum) this.#thread?.drop(r.handle);
    if (r.state === "PROC" && r.conn !== null) {
      // Destroying the socket stops its reads synchronously: nothing lands after this returns.
      this.#killConn(r.conn, "released");
    }
    r.conn = null;
    return true;
  }

  async close(): Promise<void> {
    if (this.#thread !== null) {
      const t = this.#thread;
      this.#thread = null;
      await t.terminate();
    }
    for (const peer of this.#peers.values()) for (const c of peer.all) this.#killConn(c, "transport closed");
    this.#peers.clear();
  }

  #connect(peer: Peer): ReaderConn {
    const target = parseDataEndpoint(peer.meta.endpoint);
    const conn = {
      peer,
      phase: "len",
      filled: 0,
      hdrLen: 0,
      // Only DATA and ERROR headers land here (block bytes go straight to the destination).
      scratch: Buffer.allocUnsafe(LEN_BYTES + MAX_READER_FRAME_BYTES),
      read: null,
      dead: false,
      notif: null,
      shm: null,
    } as unknown as ReaderConn;
    conn.socket = this.#o.connect(target, {
      buffer: () => this.#nextBuffer(conn),
      callback: (n: number, buf: Uint8Array) => this.#onBytes(conn, n, buf),
    });
    if (this.#o.shm !== undefined && peer.meta.shm === true) conn.shm = this.#o.shm.begin(conn.socket);
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
      const n = r.checksum && !r.crcThread && left > INLINE_CRC_RECV_BYTES ? INLINE_CRC_RECV_BYTES : left;
      return this.#region.subarray(start, start + n);
    }
    if (conn.phase === "hdr") return conn.scratch.subarray(LEN_BYTES + conn.filled, LEN_BYTES + conn.hdrLen);
    return conn.scratch.subarray(conn.filled, LEN_BYTES);
  }

  #onBytes(conn: ReaderConn, n: number, buf: Uint8Array): boolean {
    if (conn.dead) return false;
    const r = conn.read;
    if (conn.phase === "body" && r !== null) {
      this.#onBody(conn, r, n, buf);
      return true;
    }
    conn.filled += n;
    if (conn.phase === "len") {
      if (conn.filled < LEN_BYTES) return true;
      const len = frameLength(conn.scratch);
      // 3.3: a longer frame (an ACK) only where this read asked for one and none came yet.
      const max = r?.ackFirst && !r.acked ? MAX_ACK_FRAME_BYTES : MAX_READER_FRAME_BYTES;
      if (r === null || len === 0 || len > max) {
        this.#protocolError(conn, r === null ? "unsolicited bytes" : `bad frame length ${len}`);
        return false;
      }
      if (LEN_BYTES + len > conn.scratch.length) {
        // Sized once per connection to the largest ACK it met (bounded by MAX_ACK_FRAME_BYTES).
        const big = Buffer.allocUnsafe(LEN_BYTES + len);
        conn.scratch.copy(big, 0, 0, LEN_BYTES);
        conn.scratch = big;
      }
      conn.hdrLen = len;
      conn.filled = 0;
      conn.phase = "hdr";
      return true;
    }
    if (conn.filled < conn.hdrLen || r === null) return true;
    return this.#onHeader(conn, r);
  }

  #onBody(conn: ReaderConn, r: Read, n: number, buf: Uint8Array): void {
    if (r.fault?.kind === "corrupt") {
      // Wire corruption as the bytes land (before the CRC sees them).
      buf[0] = buf[0]! ^ 0xff;
      r.fault = null;
    }
    if (r.checksum) {
      if (r.crcThread) this.#crcRange(r, buf.byteOffset - this.#region.byteOffset, n);
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
  }

  #onHeader(conn: ReaderConn, r: Read): boolean {
    if (conn.shm !== null && isShmOp(conn.scratch[LEN_BYTES])) return this.#onShmFrame(conn, conn.shm, r);
    let f: ReturnType<typeof decodeToReader>;
    try {
      f = decodeToReader(conn.scratch.subarray(LEN_BYTES, LEN_BYTES + conn.hdrLen));
    } catch (err) {
      this.#protocolError(conn, (err as Error).message);
      return false;
    }
    if (f.op === "error") {
      this.#protocolError(conn, `refused: ${f.code}: ${f.message}`);
      return false;
    }
    if (f.op === "ack") {
      // 3.3: one ACK, before DATA, and only on a READ_AHEAD that asked for it.
      if (!r.ackFirst || r.acked) {
        this.#protocolError(conn, "unexpected ACK frame");
        return false;
      }
      r.acked = true;
      r.ack = f.ack;
      conn.phase = "len";
      conn.filled = 0;
      if (f.final === true) {
        // 3.5: a NACK to an XFER_REQ; anywhere else `final` is a protocol error.
        if (!r.requested) {
          this.#protocolError(conn, "unexpected final ACK frame");
          return false;
        }
        this.#answered(conn, r);
      }
      return true;
    }
    // 3.5: an XFER_REQ is always answered ACK first.
    if (f.nbytes !== r.nbytes || (r.requested && !r.acked)) {
      this.#protocolError(conn, "unexpected data-plane answer");
      return false;
    }
    conn.phase = "body";
    conn.filled = 0;
    // docs/ec-protocol.md 3.4: on an shm connection the bytes come as SHM_CHUNK frames.
    if (conn.shm !== null && this.#o.shm?.bodyStarts(conn.shm) === true) {
      conn.phase = "len";
      r.shm = true;
      if (r.nbytes < SHM_CRC_THREAD_MIN_BYTES) r.crcThread = false;
      if (conn.shm.region) r.src = { runs: [], overflow: false };
    }
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

  /** docs/ec-protocol.md 3.4: an SHM_OFFER or SHM_CHUNK on an shm connection. */
  #onShmFrame(conn: ReaderConn, st: ShmReaderConn, r: Read): boolean {
    const shm = this.#o.shm as ShmDataReader;
    conn.phase = "len";
    conn.filled = 0;
    try {
      const f = decodeShmToReader(conn.scratch.subarray(LEN_BYTES, LEN_BYTES + conn.hdrLen));
      if (f.op === "offer") {
        shm.onOffer(st, conn.socket, f);
        return true;
      }
      const before = r.received;
      const landed = r.crcThread ? this.#shmLanded : null;
      shm.chunk(st, conn.socket, f, r, this.#region, r.fault?.kind === "corrupt", landed);
      if (r.fault?.kind === "corrupt") r.fault = null;
      this.#m.bytesReceived.inc(r.received - before);
    } catch (err) {
      this.#protocolError(conn, (err as Error).message);
      return false;
    }
    if (r.received === r.nbytes) this.#finish(conn, r);
    return true;
  }

  #finish(conn: ReaderConn, r: Read): void {
    if (r.fault?.kind !== "lost_notification") {
      // The notification is written after the completion is reported (a socket write is tens of
      // microseconds of syscall): see the end of this method.
      conn.notif = r.notifFrame;
    }
    if (r.crcThread) {
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
    if (!peer.removed && peer.idle.length < this.#o.maxIdlePerPeer) peer.idle.push(conn);
    else this.#killConn(conn, "not pooled");
    this.#o.onReadDone();
    // Queued after onReadDone: a consumer that polls from onActivity (a promise it resolves there)
    // promotes first, then the notification is sent, in this turn of the event loop (an immediate
    // runs before the loop waits for I/O again). Issue 23: an immediate, not a microtask, so that a
    // consumer that asks for its next transfer from that promise (an engine step) sends the
    // notification and the next READ / READ_AHEAD on this connection in one write (#post).
    if (conn.notif !== null) setImmediate(() => this.#flushNotif(conn));
  }

  /**
   * docs/ec-protocol.md 3.5: the XFER_REQ was answered by a NACK (its ACK frame is kept for the
   * consumer): the handle ends ERR without a byte landed, the connection goes back to the pool.
   */
  #answered(conn: ReaderConn, r: Read): void {
    r.state = "ERR";
    r.error = "answered without data (NACK)";
    r.conn = null;
    conn.read = null;
    const peer = conn.peer;
    if (!peer.removed && peer.idle.length < this.#o.maxIdlePerPeer) peer.idle.push(conn);
    else this.#killConn(conn, "not pooled");
    this.#o.onReadDone();
  }

  #flushNotif(conn: ReaderConn): void {
    const n = conn.notif;
    if (n === null) return;
    conn.notif = null;
    if (!conn.dead && !conn.socket.destroyed) conn.socket.write(n);
  }

  #protocolError(conn: ReaderConn, why: string): void {
    this.#o.logger.warn({ peer: conn.peer.meta.endpoint, why }, "data-plane read failed");
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
    this.#o.shm?.closed(conn.shm);
    const r = conn.read;
    conn.read = null;
    conn.peer.all.delete(conn);
    const i = conn.peer.idle.indexOf(conn);
    if (i >= 0) conn.peer.idle.splice(i, 1);
    if (r !== null && r.state === "PROC") {
      if (r.checksum) this.#thread?.drop(r.handle);
      r.state = "ERR";
      r.error = why;
      r.conn = null;
      this.#m.readErrors.inc();
      this.#o.onReadDone();
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
    this.#thread ??= new ChecksumThread(this.#region, {
      done: (id, crc) => this.#crcDone(id, crc),
      failed: (err) => this.#crcFailed(err),
    });
    this.#thread.range(r.handle, r.pendStart, r.pendLen, final);
    r.pendLen = 0;
  }

  #crcFailed(err: Error): void {
    this.#o.logger.error({ err }, "checksum thread failed");
    this.#thread = null;
    for (const rd of this.#reads.values()) {
      if (rd.state === "PROC" && rd.checksum) {
        rd.state = "ERR";
        rd.error = "checksum thread failed";
      }
    }
    this.#o.onReadDone();
  }

  #crcDone(handle: XferHandle, crc: number): void {
    const r = this.#reads.get(handle);
    if (r === undefined || r.state !== "PROC" || !r.crcPending) return;
    r.crc = crc;
    r.crcPending = false;
    r.state = "DONE";
    this.#o.onReadDone();
  }

  #must(handle: XferHandle): Read {
    const r = this.#reads.get(handle);
    if (r === undefined) throw new EcError("EC_BAD_ARGUMENT", `unknown read handle ${String(handle)}`);
    return r;
  }
}
