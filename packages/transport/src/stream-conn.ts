// One accepted stream connection (tcp, unix, tls): the CONTRACT 3 receive state machine (length
// prefix, reassembly, receive placement) with the CONTRACT 11 per-connection limits (bound and
// unbound limits, onOversize, the receive budget, the unbound idle timer). Over 500 lines because
// it is one byte-level state machine whose states share every field; its server is stream-server.ts.
import type * as net from "node:net";
import { isIntIn, isThenable, replyBytes } from "./check.js";
import type { ServerConfig } from "./config.js";
import { TransportError } from "./errors.js";
import type { Limited, ServerLimits } from "./limits.js";
import { nativeLibc } from "./native.js";
import {
  type ConnInfo,
  type Handler,
  OVERSIZE_HEAD_WAIT_MS,
  type ReceiveInto,
  type ReceivePlan,
  type Reply,
} from "./options.js";
import { HEADER_BYTES, LengthPrefix } from "./prefix.js";
import { ScatterReader, type SegmentCursor } from "./scatter.js";
import { fdOf } from "./sockopt.js";

// First size of a connection's reassembly buffer; it grows by doubling as bytes arrive (up to the
// largest message seen) and is reused.
const MIN_ASSEMBLY = 64 * 1024;
// Receive placement of the message being received (ServerOptions.receiveInto).
/** No hook, declined, or a message that arrived whole: reassembled as usual. */
const PLACE_NONE = 0;
/** The hook is to be consulted: once `headWant` bytes are in (0: at the end of the current read). */
const PLACE_HEAD = 1;
/** A plan was accepted: the rest of the message goes into its segments. */
const PLACE_SEGMENTS = 2;
const NO_SEGMENTS: readonly Uint8Array[] = [];
const NO_HEAD = new Uint8Array(0);
// CONTRACT 4: the frame header an oversize prefix's onOversize hook gets (CONTRACT 11).
const FRAME_HEADER_BYTES = 24;

export interface StreamServerConfig extends ServerConfig {
  /**
   * Internal, for tests: read tcp/unix connections through 'data' events, as when Node does not
   * honour the handle move of adoptWithOnread.
   */
  dataEvents?: boolean;
  /** Internal, for tests: allocates receive buffers (default Buffer.allocUnsafe). */
  allocate?: (size: number) => Buffer;
  /**
   * Internal, for tests and benches: false reads placed segments one libuv read each, as without
   * koffi (default true: readv into many segments at once when koffi is installed, scatter.ts).
   */
  scatterReads?: boolean;
  /**
   * The framing inside the length prefix, for an oversize unbound message (CONTRACT 11): given
   * the bytes of its head read so far (none at first), how many onOversize needs in all (at most
   * 4096; a count not above those read means enough). The server's onOversize gets them. Default:
   * the CONTRACT 4 frame header (24 bytes); a server whose messages wrap the request in a header
   * of their own (a doorbell) brings its codec's.
   */
  oversizeHead?: (head: Uint8Array) => number;
}

/** What a connection needs of its server. */
export interface ConnServer {
  readonly handler: Handler;
  readonly limits: ServerLimits<Limited>;
  removeConn(c: Conn): void;
}

/**
 * One accepted connection. A message that arrives in one read is handed to the handler as a view
 * of that read, without copying; a larger one is assembled in a per-connection buffer that grows
 * once and is reused. With `rbuf` (the socket was adopted with `onread`) reads go into `rbuf`, and
 * the rest of a message whose start has been parsed is read by the kernel straight into the
 * reassembly buffer; without it (tls, or the fallback) 'data' chunks are copied there.
 */
export class Conn implements ConnInfo, Limited {
  readonly id: number;
  readonly remote: string;
  /** Date.now() of the accept or of the last whole message (maxConnections evicts the oldest). */
  lastActive = Date.now();
  #bound = false;
  /** Message limit now: unboundMaxMessageBytes, or maxMessageBytes once bound. */
  #limit: number;
  /** Bytes charged to the server's receive budget (the reassembly buffer, present or planned). */
  #charge = 0;
  /** Paused until the next message fits the receive budget. */
  #budgetWait = false;
  /** Closes an unbound connection with no whole message for unboundIdleMs. */
  #unboundTimer: NodeJS.Timeout | null = null;
  /** An oversize prefix on an unbound connection: the frame header being read for onOversize. */
  #ovHead: Buffer | null = null;
  #ovGot = 0;
  #ovTimer: NodeJS.Timeout | null = null;
  /** A receive buffer could not be allocated in the buffer callback: close at the next callback. */
  #allocFailed = false;
  #released = false;
  readonly #sock: net.Socket;
  readonly #srv: ConnServer;
  readonly #cfg: StreamServerConfig;
  readonly #header = Buffer.allocUnsafe(HEADER_BYTES);
  #asm: Buffer | null = null;
  readonly #pfx = new LengthPrefix();
  #got = 0;
  /** A handler is running, or a reply is still being flushed: receive nothing meanwhile. */
  #busy = false;
  /** The last reply is still queued in the socket: wait for its write callback. */
  #waitingWrite = false;
  readonly #backlog: Buffer[] = [];
  /** Reused read buffer of an `onread` socket, or null when reading through 'data' events. */
  readonly #rbuf: Buffer | null;
  /** The reassembly-buffer view handed out for the next read (`onread` sockets only). */
  #direct: Uint8Array | null = null;
  #closed = false;
  /** Receive placement state of the current message (PLACE_*). */
  #place = PLACE_NONE;
  /** PLACE_HEAD: consult the hook once this many bytes are in (0: at the end of the read). */
  #headWant = 0;
  /** PLACE_SEGMENTS: the accepted plan, its head size, and the fill position in its segments. */
  #plan: ReceivePlan | null = null;
  #headBytes = 0;
  #segs: readonly Uint8Array[] = NO_SEGMENTS;
  #segIdx = 0;
  #segOff = 0;
  /** readv into the plan's segments (onread sockets with koffi); undefined until first needed. */
  #scatter: ScatterReader | null | undefined;
  readonly #cursor: SegmentCursor = { idx: 0, off: 0 };
  readonly #want = { want: 0 };
  /** A socket error was seen (and counted). */
  #errored = false;
  closeAfterReply = false;

  constructor(id: number, sock: net.Socket, srv: ConnServer, cfg: StreamServerConfig, rbuf: Buffer | null) {
    this.id = id;
    this.#sock = sock;
    this.#srv = srv;
    this.#cfg = cfg;
    this.#rbuf = rbuf;
    this.remote = sock.remoteAddress !== undefined ? `${sock.remoteAddress}:${sock.remotePort}` : "unix";
    this.#limit = cfg.unboundMaxMessageBytes;
    this.#armUnboundTimer();
    if (rbuf === null) sock.on("data", this.#onData);
    sock.on("error", this.#onError);
    sock.on("close", this.#onClose);
    if (cfg.idleTimeoutMs > 0) {
      // A persistent listener: setTimeout's callback argument is a one-time listener, and a
      // timeout that fires while a handler runs (and is ignored) must not disarm later ones.
      sock.setTimeout(cfg.idleTimeoutMs);
      sock.on("timeout", () => {
        if (!this.#busy) this.close();
      });
    }
  }

  get isBusy(): boolean {
    return this.#busy && !this.#budgetWait;
  }

  get bound(): boolean {
    return this.#bound;
  }

  bind(): void {
    if (this.#bound || this.#closed) return;
    this.#bound = true;
    this.#limit = this.#cfg.maxMessageBytes;
    if (this.#unboundTimer !== null) {
      clearTimeout(this.#unboundTimer);
      this.#unboundTimer = null;
    }
    this.#srv.limits.setBound(this, true);
  }

  unbind(): void {
    if (!this.#bound || this.#closed) return;
    this.#bound = false;
    this.#limit = this.#cfg.unboundMaxMessageBytes;
    // A kept reassembly buffer above the unbound limit is not needed any more.
    if (this.#pfx.got === 0 && this.#asm !== null && this.#asm.length > this.#limit) this.#dropAsm();
    this.#armUnboundTimer();
    this.#srv.limits.setBound(this, false);
  }

  /** maxConnections: closed to make room for a new connection. */
  evict(): void {
    this.close();
  }

  #armUnboundTimer(): void {
    const ms = this.#cfg.unboundIdleMs;
    if (ms === 0 || this.#unboundTimer !== null) return;
    this.#unboundTimer = setTimeout(this.#onUnboundIdle, ms);
    this.#unboundTimer.unref();
  }

  readonly #onUnboundIdle = (): void => {
    if (this.#closed || this.#bound) return;
    if (this.#busy && !this.#budgetWait) {
      // A handler runs: its message was whole. Look again once it is done.
      this.#unboundTimer?.refresh();
      return;
    }
    this.#cfg.metrics.unboundIdleClosed.inc();
    this.close();
  };

  /** Frees the kept reassembly buffer and its budget (only between messages). */
  #dropAsm(): void {
    this.#asm = null;
    const c = this.#charge;
    this.#charge = 0;
    if (c > 0) this.#srv.limits.release(c);
  }

  /** Budget reclaim: a kept reassembly buffer of an idle connection goes. */
  reclaimIdle(): void {
    if (!this.#busy && !this.#closed && this.#pfx.got === 0 && this.#charge > 0) {
      this.#asm = null;
      this.#srv.limits.uncharge(this.#charge);
      this.#charge = 0;
    }
  }

  /** The capacity `reserve` reaches for a message of `len` bytes (see reserve). */
  #capacityFor(len: number): number {
    const cur = this.#asm === null ? 0 : this.#asm.length;
    if (cur >= len) return cur;
    let size = cur === 0 ? MIN_ASSEMBLY : Math.max(MIN_ASSEMBLY, cur * 2);
    while (size < len) size *= 2;
    return Math.min(size, Math.max(len, this.#limit));
  }

  /**
   * CONTRACT 11: charges the budget for a message of `len` bytes that does not arrive whole in
   * one read. Returns false when it does not fit: a bound connection is then paused (and retried
   * when budget is released), an unbound one closed.
   */
  #admitMessage(len: number): boolean {
    const limits = this.#srv.limits;
    const need = this.#capacityFor(len) - this.#charge;
    if (need <= 0 || limits.tryCharge(need)) {
      if (need > 0) this.#charge += need;
      return true;
    }
    if (!this.#bound) {
      this.#cfg.metrics.budgetRefused.inc();
      this.close();
      return false;
    }
    this.#budgetWait = true;
    this.#busy = true;
    limits.wait(this.#budgetRetry);
    return false;
  }

  readonly #budgetRetry = (): boolean => {
    if (this.#closed) return true;
    const limits = this.#srv.limits;
    // The prefix was pushed back onto the backlog: peek its length.
    const head = this.#backlog[0] as Buffer;
    const len = head.readUInt32LE(0);
    const need = this.#capacityFor(len) - this.#charge;
    if (need > 0 && !limits.tryCharge(need)) return false;
    if (need > 0) this.#charge += need;
    this.#budgetWait = false;
    // Charged: the prefix is parsed again without a second charge (need <= 0 then).
    setImmediate(() => {
      if (!this.#closed) this.#resume();
    });
    return true;
  };

  readonly #onData = (chunk: Buffer): void => {
    if (this.#busy || this.#backlog.length > 0) {
      // Only a client breaking "one request outstanding" gets here; TCP backpressure bounds it.
      this.#backlog.push(chunk);
      this.#sock.pause();
      return;
    }
    this.#feed(chunk, 0, chunk.length);
  };

  /**
   * Buffer for the next read of an `onread` socket. Mid-message: the unfilled rest of the
   * reassembly buffer, exactly (a read never crosses the message's end). Otherwise `rbuf`. While
   * busy nothing is read (the callback stopped reading), so views of `rbuf` held by the handler,
   * a queued reply or the backlog are never overwritten.
   */
  nextBuffer(): Uint8Array {
    const rbuf = this.#rbuf as Buffer;
    if (
      this.#busy ||
      this.#closed ||
      this.#pfx.got < HEADER_BYTES ||
      this.#asm === null ||
      this.#ovHead !== null ||
      this.#allocFailed
    ) {
      this.#direct = null;
      return rbuf;
    }
    if (this.#place === PLACE_SEGMENTS) {
      // Straight into the plan's current segment (the message's end is the segments' end).
      let seg = this.#segs[this.#segIdx] as Uint8Array;
      while (this.#segOff >= seg.length) {
        this.#segIdx++;
        this.#segOff = 0;
        seg = this.#segs[this.#segIdx] as Uint8Array;
      }
      // A fresh segment is handed over as is (no view to create per read).
      this.#direct = this.#segOff === 0 ? seg : seg.subarray(this.#segOff);
      return this.#direct;
    }
    if (this.#place === PLACE_HEAD) {
      if (this.#headWant === 0) {
        this.#direct = null;
        return rbuf;
      }
      // Exactly up to the head the hook asked for, growing with what arrived (as below).
      if (this.#got >= this.#asm.length && !this.#reserve(Math.min(this.#headWant, this.#got * 2))) {
        return this.#allocFailedInCallback();
      }
      const asm = this.#asm as Buffer;
      this.#direct = asm.subarray(this.#got, Math.min(this.#headWant, asm.length));
      return this.#direct;
    }
    // Full but the message goes on: double it (bytes that arrived, not the prefix, size it).
    if (this.#got >= this.#asm.length && !this.#reserve(Math.min(this.#pfx.len, this.#got * 2))) {
      return this.#allocFailedInCallback();
    }
    const asm = this.#asm as Buffer;
    this.#direct = asm.subarray(this.#got, Math.min(this.#pfx.len, asm.length));
    return this.#direct;
  }

  /**
   * Makes the reassembly buffer hold at least `need` bytes, keeping the `got` bytes received so
   * far. It grows by doubling with what has actually arrived, never straight to the announced
   * length: a peer that announces a large (allowed) message and sends little of it costs little
   * memory (CONTRACT 11: no length from the wire is trusted). Once grown it is reused, so only
   * the first large message of a connection pays for the copies.
   */
  #reserve(need: number): boolean {
    const cur = this.#asm;
    if (cur !== null && cur.length >= need) return true;
    let size = cur === null ? MIN_ASSEMBLY : Math.max(MIN_ASSEMBLY, cur.length * 2);
    while (size < need) size *= 2;
    // Capped at the connection's limit (unbound: 4 KiB for the worker), as #capacityFor assumes.
    if (size > this.#limit) size = Math.max(need, this.#limit);
    let next: Buffer;
    try {
      next = this.#cfg.allocate === undefined ? Buffer.allocUnsafe(size) : this.#cfg.allocate(size);
    } catch (e) {
      // CONTRACT 11: failing to allocate a receive buffer closes this connection, never the process.
      if (!(e instanceof RangeError)) throw e;
      this.#cfg.metrics.allocFailures.inc();
      this.#cfg.options.onError?.(
        new TransportError("TRANSPORT_TOO_LARGE", `receive buffer of ${size} bytes: ${e.message}`, {
          cause: e,
        }),
        this,
      );
      return false;
    }
    if (cur !== null && this.#got > 0) cur.copy(next, 0, 0, this.#got);
    this.#asm = next;
    return true;
  }

  /** Allocation failed in the buffer callback: read into rbuf, then close in onRead. */
  #allocFailedInCallback(): Uint8Array {
    this.#allocFailed = true;
    this.#direct = null;
    return this.#rbuf as Buffer;
  }

  /** `onread` callback: returns false to stop reading (busy). */
  onRead(n: number, buf: Uint8Array): boolean {
    if (this.#closed) return false;
    if (this.#allocFailed) {
      this.close();
      return false;
    }
    if (buf === this.#direct) {
      // The kernel wrote into the reassembly buffer at `got`, or into a segment of the plan.
      this.#direct = null;
      this.#got += n;
      if (this.#place === PLACE_SEGMENTS) {
        this.#segOff += n;
        if (this.#got === this.#pfx.len) this.#dispatchPlaced();
        else this.#scatterRest();
      } else if (this.#got === this.#pfx.len) {
        this.#pfx.got = 0;
        this.#dispatch((this.#asm as Buffer).subarray(0, this.#pfx.len));
      } else if (this.#place === PLACE_HEAD && this.#got >= this.#headWant && this.#consult()) {
        if ((this.#place as number) === PLACE_SEGMENTS) this.#scatterRest();
      }
    } else {
      this.#feed(buf as Buffer, 0, n);
      if (this.#place === PLACE_SEGMENTS && !this.#busy && !this.#closed) this.#scatterRest();
    }
    return !this.#busy && !this.#closed;
  }

  /**
   * PLACE_SEGMENTS on an `onread` socket: reads what the socket holds into the plan's remaining
   * segments with readv(2), many per call (scatter.ts), until the message is complete or the
   * socket is drained; then libuv's own reads go on from the advanced position. Only called from
   * the onread callback, and never reads past the message's end.
   */
  #scatterRest(): void {
    let r = this.#scatter;
    if (r === undefined) {
      const libc = this.#rbuf !== null && this.#cfg.scatterReads !== false ? nativeLibc() : null;
      const fd = libc === null ? -1 : fdOf(this.#sock);
      r = libc === null || fd < 0 ? null : new ScatterReader(libc, fd);
      this.#scatter = r;
    }
    if (r === null) return;
    const cur = this.#cursor;
    const m = this.#cfg.metrics;
    while (this.#place === PLACE_SEGMENTS && !this.#closed) {
      cur.idx = this.#segIdx;
      cur.off = this.#segOff;
      const n = r.read(this.#segs, cur, this.#want);
      if (n === 0) return;
      m.placedScatterReads.inc();
      this.#segIdx = cur.idx;
      this.#segOff = cur.off;
      this.#got += n;
      if (this.#got === this.#pfx.len) {
        this.#dispatchPlaced();
        return;
      }
      if (n < this.#want.want) return; // drained: wait for the next readable
    }
  }

  #feed(chunk: Buffer, off: number, end: number): void {
    while (off < end && !this.#closed) {
      if (this.#ovHead !== null) {
        this.#feedOversizeHead(chunk, off, end);
        return;
      }
      if (this.#pfx.got < HEADER_BYTES) {
        off = this.#pfx.read(chunk, off, end);
        if (this.#pfx.got < HEADER_BYTES) continue;
        // CONTRACT 3 / 11: refuse from the prefix, before buffering or allocating.
        if (this.#pfx.len > this.#limit) {
          this.#cfg.metrics.tooLarge.inc();
          if (this.#bound || this.#cfg.options.onOversize === undefined) {
            this.close();
            return;
          }
          this.#startOversize(this.#pfx.len);
          continue;
        }
        this.#got = 0;
        this.#place = PLACE_NONE;
        if (end - off < this.#pfx.len && this.#srv.limits.budgeted && !this.#admitMessage(this.#pfx.len)) {
          if (this.#budgetWait) {
            // Parsed again (and charged then) once budget is released.
            const prefix = Buffer.allocUnsafe(HEADER_BYTES);
            prefix.writeUInt32LE(this.#pfx.len, 0);
            if (off < end) this.#backlog.unshift(chunk.subarray(off, end));
            this.#backlog.unshift(prefix);
            this.#pfx.got = 0;
          }
          return;
        }
        if (end - off >= this.#pfx.len) {
          const len = this.#pfx.len;
          this.#pfx.got = 0;
          // Zero-copy: the chunk is ours and nobody else writes into it.
          const view = chunk.subarray(off, off + len);
          off += len;
          if (!this.#dispatch(view)) {
            if (off < end) this.#backlog.unshift(chunk.subarray(off, end));
            return;
          }
          continue;
        }
        // Not whole in this read: a receiveInto hook may place its rest.
        if (this.#cfg.options.receiveInto !== undefined) {
          this.#place = PLACE_HEAD;
          this.#headWant = 0;
        }
        if (!this.#reserve(Math.min(this.#pfx.len, Math.max(MIN_ASSEMBLY, end - off)))) {
          this.close();
          return;
        }
        continue;
      }
      if (this.#place === PLACE_SEGMENTS) {
        const n = Math.min(end - off, this.#pfx.len - this.#got);
        this.#copyIn(chunk, off, off + n);
        this.#got += n;
        off += n;
        if (this.#got === this.#pfx.len && !this.#dispatchPlaced()) {
          if (off < end) this.#backlog.unshift(chunk.subarray(off, end));
          return;
        }
        continue;
      }
      let n = end - off;
      const want = this.#pfx.len - this.#got;
      if (n > want) n = want;
      // Consulting the hook: no byte past the head it asked for goes to the reassembly buffer.
      if (this.#place === PLACE_HEAD && this.#headWant > 0 && this.#got + n > this.#headWant) {
        n = this.#headWant - this.#got;
      }
      if (!this.#reserve(this.#got + n)) {
        this.close();
        return;
      }
      const asm = this.#asm as Buffer;
      chunk.copy(asm, this.#got, off, off + n);
      this.#got += n;
      off += n;
      if (this.#got === this.#pfx.len) {
        this.#pfx.got = 0;
        this.#place = PLACE_NONE;
        if (!this.#dispatch(asm.subarray(0, this.#pfx.len))) {
          if (off < end) this.#backlog.unshift(chunk.subarray(off, end));
          return;
        }
      } else if (
        this.#place === PLACE_HEAD &&
        (this.#headWant > 0 ? this.#got >= this.#headWant : off === end) &&
        !this.#consult()
      ) {
        return;
      }
    }
  }

  /** CONTRACT 11: an unbound connection's oversize prefix; read its frame header for onOversize. */
  #startOversize(declared: number): void {
    const first = this.#cfg.oversizeHead?.(NO_HEAD) ?? FRAME_HEADER_BYTES;
    this.#ovHead = Buffer.allocUnsafe(Math.min(first, declared));
    this.#ovGot = 0;
    const idle = this.#cfg.unboundIdleMs;
    this.#ovTimer = setTimeout(
      () => this.close(),
      idle > 0 ? Math.min(idle, OVERSIZE_HEAD_WAIT_MS) : OVERSIZE_HEAD_WAIT_MS,
    );
    this.#ovTimer.unref();
  }

  #feedOversizeHead(chunk: Buffer, off: number, end: number): void {
    const head = this.#ovHead as Buffer;
    const n = Math.min(end - off, head.length - this.#ovGot);
    chunk.copy(head, this.#ovGot, off, off + n);
    this.#ovGot += n;
    if (this.#ovGot < head.length) return;
    const more = this.#cfg.oversizeHead?.(head);
    if (more !== undefined && more > head.length && more <= Math.min(4096, this.#pfx.len)) {
      const grown = Buffer.allocUnsafe(more);
      head.copy(grown, 0, 0, head.length);
      this.#ovHead = grown;
      this.#feedOversizeHead(chunk, off + n, end);
      return;
    }
    if (this.#ovTimer !== null) clearTimeout(this.#ovTimer);
    this.#ovTimer = null;
    const hook = this.#cfg.options.onOversize;
    let r: Uint8Array | null;
    try {
      r = (hook as NonNullable<typeof hook>)(head, this.#pfx.len, this);
    } catch (e) {
      this.#handlerFailed(e);
      return;
    }
    if (r === null || this.#closed) {
      this.close();
      return;
    }
    const bad = r instanceof Uint8Array ? replyBytes(r, this.#cfg.maxMessageBytes) : null;
    if (typeof bad !== "number") {
      this.#handlerFailed(
        bad ??
          new TransportError("TRANSPORT_BAD_OPTION", "onOversize returned neither a Uint8Array nor null"),
      );
      return;
    }
    this.#cfg.metrics.oversizeReplies.inc();
    // Written, then closed: nothing more is read (busy), bounded by the head wait if it never drains.
    this.closeAfterReply = true;
    this.#ovHead = null;
    this.#ovTimer = setTimeout(() => this.close(), OVERSIZE_HEAD_WAIT_MS);
    this.#ovTimer.unref();
    this.#reply(r);
  }

  /**
   * Asks the receiveInto hook about the message being received (PLACE_HEAD, `got` bytes in,
   * fewer than `len`). Returns false when the connection was closed for a bad answer.
   */
  #consult(): boolean {
    const hook = this.#cfg.options.receiveInto as ReceiveInto;
    const asm = this.#asm as Buffer;
    const got = this.#got;
    const len = this.#pfx.len;
    let r: unknown;
    try {
      r = hook(asm.subarray(0, got), len, this);
    } catch (e) {
      this.#handlerFailed(e);
      return false;
    }
    if (r === null) {
      this.#place = PLACE_NONE;
      return true;
    }
    if (typeof r === "number") {
      if (!isIntIn(r, got + 1, Number.MAX_SAFE_INTEGER)) {
        return this.#badPlan(`returned ${r}: not a head size above the ${got} bytes in`);
      }
      if (r >= len) this.#place = PLACE_NONE;
      else this.#headWant = r;
      return true;
    }
    if (typeof r !== "object" || r === null) {
      return this.#badPlan(`returned ${String(r)}: not a plan, a number or null`);
    }
    const plan = r as ReceivePlan;
    const headBytes = plan.headBytes;
    if (!isIntIn(headBytes, 0, got)) {
      return this.#badPlan(`plan headBytes ${String(headBytes)} is not an integer in [0, ${got}]`);
    }
    const segs = plan.segments;
    if (!Array.isArray(segs)) return this.#badPlan("plan segments is not an array");
    let total = 0;
    for (let i = 0; i < segs.length; i++) {
      const seg: unknown = segs[i];
      if (!(seg instanceof Uint8Array)) return this.#badPlan(`plan segments[${i}] is not a Uint8Array`);
      total += seg.length;
    }
    if (total !== len - headBytes) {
      return this.#badPlan(
        `plan segments hold ${total} bytes, the message has ${len - headBytes} after headBytes ${headBytes}`,
      );
    }
    this.#place = PLACE_SEGMENTS;
    this.#plan = plan;
    this.#headBytes = headBytes;
    this.#segs = segs as readonly Uint8Array[];
    this.#segIdx = 0;
    this.#segOff = 0;
    // Bytes that arrived with the head and belong to the segments.
    if (got > headBytes) this.#copyIn(asm, headBytes, got);
    // The rest goes into the plan's segments, not into transport memory: uncharge what was planned.
    if (this.#charge > asm.length) {
      const c = this.#charge - asm.length;
      this.#charge = asm.length;
      this.#srv.limits.release(c);
    }
    return true;
  }

  #badPlan(why: string): false {
    this.#handlerFailed(new TransportError("TRANSPORT_BAD_OPTION", `receiveInto ${why}`));
    return false;
  }

  /** Copies `src[from, to)` into the plan's segments at the fill position (PLACE_SEGMENTS). */
  #copyIn(src: Uint8Array, from: number, to: number): void {
    this.#cfg.metrics.placedCopiedBytes.inc(to - from);
    while (from < to) {
      const seg = this.#segs[this.#segIdx] as Uint8Array;
      const room = seg.length - this.#segOff;
      if (room === 0) {
        this.#segIdx++;
        this.#segOff = 0;
        continue;
      }
      const n = Math.min(room, to - from);
      seg.set(src.subarray(from, from + n), this.#segOff);
      this.#segOff += n;
      from += n;
    }
  }

  /** The placed message is complete: hand its head and plan to the handler (see dispatch). */
  #dispatchPlaced(): boolean {
    const plan = this.#plan as ReceivePlan;
    const head = (this.#asm as Buffer).subarray(0, this.#headBytes);
    this.#pfx.got = 0;
    this.#place = PLACE_NONE;
    this.#plan = null;
    this.#segs = NO_SEGMENTS;
    const m = this.#cfg.metrics;
    m.placedMessages.inc();
    m.placedBytes.inc(this.#pfx.len - this.#headBytes);
    return this.#dispatch(head, plan);
  }

  /** Runs the handler; returns true when the connection can go on parsing right away. */
  #dispatch(req: Buffer, plan?: ReceivePlan): boolean {
    const m = this.#cfg.metrics;
    if (this.#unboundTimer !== null) this.#unboundTimer.refresh();
    if (this.#srv.limits.tracksIdle) this.lastActive = Date.now();
    m.requests.inc();
    m.bytesIn.inc((plan === undefined ? req.length : this.#pfx.len) + HEADER_BYTES);
    let result: Reply | PromiseLike<Reply>;
    try {
      result = plan === undefined ? this.#srv.handler(req, this) : this.#srv.handler(req, this, plan);
    } catch (e) {
      this.#handlerFailed(e);
      return false;
    }
    if (isThenable(result)) {
      this.#busy = true;
      result.then(this.#onReply, this.#onReject);
      return false;
    }
    return this.#reply(result);
  }

  readonly #onReply = (r: Reply): void => {
    if (this.#closed) return;
    if (this.#reply(r)) this.#resume();
  };

  readonly #onReject = (e: unknown): void => {
    if (!this.#closed) this.#handlerFailed(e);
  };

  #handlerFailed(e: unknown): void {
    this.#cfg.metrics.errors.inc();
    this.#cfg.options.onError?.(e, this);
    this.close();
  }

  /** Writes the reply; returns true when parsing may continue now. */
  #reply(r: Reply): boolean {
    if (r === null) {
      this.close();
      return false;
    }
    const total = replyBytes(r, this.#cfg.maxMessageBytes);
    if (typeof total !== "number") {
      this.#handlerFailed(total);
      return false;
    }
    const sock = this.#sock;
    const header = sock.writableLength === 0 ? this.#header : Buffer.allocUnsafe(HEADER_BYTES);
    header.writeUInt32LE(total, 0);
    sock.cork();
    if (total === 0) {
      sock.write(header, this.#onWritten);
    } else {
      sock.write(header);
      if (r instanceof Uint8Array) {
        sock.write(r, this.#onWritten);
      } else {
        // The callback goes on the last non-empty part: it fires once everything before it is out.
        const parts = r as readonly Uint8Array[];
        let last = parts.length - 1;
        while ((parts[last] as Uint8Array).length === 0) last--;
        for (let i = 0; i <= last; i++) {
          const p = parts[i] as Uint8Array;
          if (p.length > 0) sock.write(p, i === last ? this.#onWritten : undefined);
        }
      }
    }
    sock.uncork();
    this.#cfg.metrics.bytesOut.inc(total + HEADER_BYTES);
    if (this.closeAfterReply) {
      // Graceful close: destroy once the reply has been handed to the kernel (which still
      // delivers it), not on the peer's EOF: reading is stopped here, so EOF would never be seen.
      this.#busy = true;
      sock.end(() => this.close());
      return false;
    }
    if (sock.writableLength > 0) {
      // The handler may reuse its reply buffers for the next request: read nothing more until
      // this reply has left them (also bounds memory against clients that never read).
      this.#busy = true;
      this.#waitingWrite = true;
      return false;
    }
    this.#busy = false;
    if (this.#charge > 0 && this.#srv.limits.hasWaiters) this.#dropAsm();
    return true;
  }

  readonly #onWritten = (): void => {
    // Callbacks of earlier replies may arrive late: only the one that empties the queue counts.
    if (this.#waitingWrite && !this.#closed && this.#sock.writableLength === 0) {
      this.#waitingWrite = false;
      this.#resume();
    }
  };

  #resume(): void {
    this.#busy = false;
    // Someone waits for budget: between messages, a kept reassembly buffer goes back.
    if (this.#charge > 0 && this.#pfx.got === 0 && this.#srv.limits.hasWaiters) this.#dropAsm();
    while (!this.#busy && !this.#closed && this.#backlog.length > 0) {
      const b = this.#backlog.shift() as Buffer;
      this.#feed(b, 0, b.length);
    }
    if (!this.#busy && !this.#closed) {
      if (this.closeAfterReply) this.close();
      // An `onread` callback returning false stops reading without pausing the stream: resume()
      // restarts it either way.
      else this.#sock.resume();
    }
  }

  readonly #onError = (): void => {
    if (!this.#closed) this.#cfg.metrics.errors.inc();
    this.#errored = true;
  };

  readonly #onClose = (): void => {
    // CONTRACT 3: the peer went away in the middle of a frame: a truncated request, dropped
    // (never handed to the handler) and counted, unless the socket error was counted already.
    if (!this.#closed && !this.#errored && this.#pfx.got > 0) this.#cfg.metrics.errors.inc();
    this.#closed = true;
    this.#release();
    this.#backlog.length = 0;
    this.#srv.removeConn(this);
  };

  /** Stops the timers and returns the budget and the connection slot (once). */
  #release(): void {
    if (this.#unboundTimer !== null) clearTimeout(this.#unboundTimer);
    if (this.#ovTimer !== null) clearTimeout(this.#ovTimer);
    this.#unboundTimer = null;
    this.#ovTimer = null;
    if (this.#released) return;
    this.#released = true;
    this.#asm = null;
    const c = this.#charge;
    this.#charge = 0;
    this.#srv.limits.untrack(this);
    this.#srv.limits.release(c);
  }

  /** Graceful: close now when idle, else after the in-flight reply is written. */
  shutdown(): void {
    if (this.#busy && !this.#budgetWait) this.closeAfterReply = true;
    else this.close();
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#release();
    this.#sock.destroy();
  }

  destroy(): void {
    this.close();
  }
}
