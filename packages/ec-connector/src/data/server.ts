import type * as net from "node:net";
import type { Logger } from "pino";
import { EcError, isIntInRange } from "../errors.js";
import type { DataMetrics } from "../metrics.js";
import type { ReadAheadFrame, ReadFrame, RefusalCode } from "./frame.js";
import {
  decodeToServer,
  encodeAckHead,
  encodeFrame,
  frameLength,
  LEN_BYTES,
  maxReadFrameBytes,
  segments,
} from "./frame.js";
import { decodeXferReqFrame, MAX_XFER_REQ_FRAME_BYTES, XFER_REQ_OP } from "./request-frame.js";
import { isShmOp } from "./shm-frame.js";
import type { ShmDataServer, ShmServerConn } from "./shm-server.js";
import { setSendBuffer } from "./sockbuf.js";
import type { Notif, XferRequestHandler } from "./transport.js";
import { deliverNotifs } from "./transport.js";

const UTF8_FATAL = new TextDecoder("utf-8", { fatal: true });

/** A grant as the data server enforces it (EC-CONTRACT 5.3). */
export interface DataGrant {
  readonly blocks: readonly number[];
  readonly deadline: number;
  /** The entry's bytes (the ack's `nbytes`): a READ must ask for exactly these; -1 when unknown. */
  readonly nbytes: number;
  /** docs/ec-protocol.md 3.3: the grant's XferAck, for READ_AHEADs that ask for an ACK frame. */
  ack?: Uint8Array;
  /**
   * docs/ec-protocol.md 3.2 (issue 23): the server received this grant's notification. A
   * READ_AHEAD is never served under such a grant (it waits for the key's next grant), even while
   * the producer's step has not yet ended it.
   */
  notified?: boolean;
}

/** A READ_AHEAD waiting for its grant (docs/ec-protocol.md 3.2). */
interface Parked {
  readonly frame: ReadAheadFrame;
  readonly timer: NodeJS.Timeout;
}

interface ServerConn {
  socket: net.Socket;
  /** The grant that authorised the current/last stream (its notification completes only that grant). */
  grant: DataGrant | null;
  buf: Buffer;
  /** Key being streamed, or awaiting its notification. */
  key: Uint8Array | null;
  keyStr: string;
  streaming: boolean;
  reader: string;
  /** A READ_AHEAD waiting for its grant on this connection (no other frame is accepted meanwhile). */
  parked: Parked | null;
  /** The shm ring of this connection (docs/ec-protocol.md 3.4), null on the plain socket path. */
  shm: ShmServerConn | null;
  /** Frames received so far (SHM_ATTACH must be the first). */
  frames: number;
}

/** Options of {@link DataServer}. */
export interface DataServerOptions {
  region: Uint8Array;
  numBlocks: number;
  blockBytes: number;
  /** This agent's instance id: a READ naming another instance is refused. */
  instance: string;
  now: () => number;
  chunkBytes: number;
  throttleBytesPerSec: number;
  /** EC-CONTRACT 9.5: a connection without traffic this long is closed (0: never). */
  idleTimeoutMs: number;
  /** EC-CONTRACT 9.5: the connection cap (the listener enforces it; half of it may be unproven). */
  maxConnections: number;
  metrics: DataMetrics;
  logger: Logger;
  /** Called when a notification arrives. */
  onNotification: () => void;
  /** The shm data plane of an `shm+unix://` listener (docs/ec-protocol.md 3.4). */
  shm?: ShmDataServer;
  /** SO_SNDBUF asked for on same-host connections (sockbuf.ts; 0: the kernel's default). */
  sendBufferBytes?: number;
}

/** A refused READ: the wire code and a message for the reader's log. */
interface Refusal {
  code: RefusalCode;
  message: string;
}

/**
 * The server side of the tcp/unix data plane (EC-CONTRACT 5.3, 5.4): serves a READ only for a key
 * with a live grant and exactly that grant's blocks, streaming straight from the pinned region
 * (socket writes of region views, no staging copy); a notification completes the grant instance
 * that authorised the stream it follows.
 */
export class DataServer {
  readonly #o: DataServerOptions;
  readonly #m: DataMetrics;
  readonly #grants = new Map<string, DataGrant>();
  readonly #streams = new Map<string, Set<ServerConn>>();
  /** READ_AHEADs waiting for a grant, by key. */
  readonly #parked = new Map<string, Set<ServerConn>>();
  readonly #conns = new Set<ServerConn>();
  /** Connections that have not had a READ served yet, oldest first. */
  readonly #unproven = new Set<ServerConn>();
  readonly #notifs: Notif[] = [];
  /** The largest frame a reader may send here, from this server's own cache size (EC-CONTRACT 9.5). */
  #maxFrame: number;
  #closed = false;
  /** docs/ec-protocol.md 3.5: the producer's XFER_REQ handler (null: XFER_REQ is an unknown op). */
  #xferReq: XferRequestHandler | null = null;
  /** 3.5: a quota label per connection (EC-CONTRACT 9.2 "peer"). */
  readonly #connIds = new WeakMap<ServerConn, string>();
  #nextConnId = 1;
  #sendBuffer = -1;

  constructor(options: DataServerOptions) {
    this.#o = options;
    this.#m = options.metrics;
    this.#maxFrame = maxReadFrameBytes(options.numBlocks);
  }

  /** Number of live grants. */
  get grantCount(): number {
    return this.#grants.size;
  }

  /**
   * docs/ec-protocol.md 3.5: takes XFER_REQ frames from now on (`null`: no more; a 1.1 server). The
   * receive limit grows to hold the largest XFER_REQ (2 832 bytes) on a small cache.
   */
  setXferRequests(handler: XferRequestHandler | null): void {
    this.#xferReq = handler;
    const base = maxReadFrameBytes(this.#o.numBlocks);
    this.#maxFrame = handler === null ? base : Math.max(base, MAX_XFER_REQ_FRAME_BYTES);
  }

  /** The send buffer the kernel reported for the last accepted connection (-1: none was set). */
  get sendBufferBytes(): number {
    return this.#sendBuffer;
  }

  /** READ_AHEADs currently waiting for their grant. */
  get parkedCount(): number {
    let n = 0;
    for (const set of this.#parked.values()) n += set.size;
    return n;
  }

  grant(key: string, blocks: readonly number[], deadline: number, nbytes = -1): void {
    for (const b of blocks) {
      if (!isIntInRange(b, 0, this.#o.numBlocks - 1)) {
        throw new EcError("EC_BAD_ARGUMENT", `grant ${key}: block ${b} outside [0, ${this.#o.numBlocks})`);
      }
    }
    this.#grants.set(key, { blocks: [...blocks], deadline, nbytes });
    // docs/ec-protocol.md 3.2: a READ_AHEAD that waited for this grant is served now, under it.
    if (!this.#parked.has(key)) return;
    // In a microtask: the producer's step that made the grant sends its ack first (the ack and
    // the bytes then travel together), and the checks below see the grant as the step left it.
    // (3.3: those that asked for the ACK frame are served earlier, by grantAck.)
    queueMicrotask(() => {
      const waiting = this.#parked.get(key);
      if (waiting === undefined) return;
      this.#parked.delete(key);
      for (const c of waiting) this.#serveParked(c, key);
    });
  }

  /**
   * docs/ec-protocol.md 3.3: `ack` is the XferAck of the grant `key` just made. READ_AHEADs of
   * `key` asking for it (`ack_first`) get it as an ACK frame before DATA; those already waiting
   * are served now, synchronously, so their bytes leave before the control plane's copy of the ack.
   * Returns true when at least one of them was served (its ACK frame written): the producer then
   * sends no control-plane copy.
   */
  grantAck(key: string, ack: Uint8Array): boolean {
    const g = this.#grants.get(key);
    if (g === undefined) return false;
    g.ack = ack;
    const waiting = this.#parked.get(key);
    if (waiting === undefined) return false;
    let delivered = false;
    for (const c of waiting) {
      if (c.parked?.frame.ackFirst !== true) continue;
      waiting.delete(c);
      if (this.#serveParked(c, key)) delivered = true;
    }
    if (waiting.size === 0) this.#parked.delete(key);
    return delivered;
  }

  /** Serves a parked READ_AHEAD; true when it was served with an ACK frame. */
  #serveParked(c: ServerConn, key: string): boolean {
    const p = c.parked;
    if (p === null) return false;
    clearTimeout(p.timer);
    c.parked = null;
    return !c.socket.destroyed && !this.#closed && this.#readAhead(c, p.frame, key, false);
  }

  revoke(key: string): void {
    this.#grants.delete(key);
    const live = this.#streams.get(key);
    if (live === undefined) return;
    this.#streams.delete(key);
    for (const c of live) if (c.streaming) c.socket.destroy();
  }

  getNewNotifs(): Map<string, Uint8Array[]> {
    return deliverNotifs(this.#notifs, this.#grants, this.#m.staleNotifications);
  }

  /** Closes every connection and forgets every grant. */
  close(): void {
    this.#closed = true;
    for (const c of this.#conns) c.socket.destroy();
    this.#conns.clear();
    this.#grants.clear();
    this.#streams.clear();
    for (const set of this.#parked.values()) for (const c of set) if (c.parked) clearTimeout(c.parked.timer);
    this.#parked.clear();
  }

  /** Serves one accepted connection. */
  accept(socket: net.Socket): void {
    if (this.#closed) {
      socket.destroy();
      return;
    }
    socket.setNoDelay(true);
    // Issue 23 (per-byte cost): a cache-sized send buffer on same-host peers (sockbuf.ts).
    this.#sendBuffer = setSendBuffer(socket, this.#o.sendBufferBytes ?? 0);
    const c: ServerConn = {
      socket,
      grant: null,
      buf: Buffer.alloc(0),
      key: null,
      keyStr: "",
      streaming: false,
      reader: "",
      parked: null,
      shm: null,
      frames: 0,
    };
    // At most half the cap may be connections that never had a READ served: beyond, the oldest of
    // them goes, so an idle flood cannot keep readers with grants out until the idle timeout.
    if (this.#unproven.size >= Math.max(1, Math.floor(this.#o.maxConnections / 2))) {
      const oldest = this.#unproven.values().next().value as ServerConn;
      this.#unproven.delete(oldest);
      this.#m.connectionsRefused.inc();
      oldest.socket.destroy();
    }
    this.#conns.add(c);
    this.#unproven.add(c);
    this.#m.connections.set(this.#conns.size);
    if (this.#o.idleTimeoutMs > 0) {
      socket.setTimeout(this.#o.idleTimeoutMs, () => {
        this.#m.idleClosed.inc();
        this.#o.logger.info({ idleMs: this.#o.idleTimeoutMs }, "idle data connection closed");
        socket.destroy();
      });
    }
    socket.on("data", (chunk: Buffer) => this.#onData(c, chunk));
    socket.on("error", () => socket.destroy());
    socket.on("close", () => {
      this.#conns.delete(c);
      this.#unproven.delete(c);
      this.#m.connections.set(this.#conns.size);
      if (c.key !== null) this.#streams.get(c.keyStr)?.delete(c);
      this.#unpark(c);
      this.#o.shm?.closed(c.shm);
    });
  }

  #onData(c: ServerConn, chunk: Buffer): void {
    try {
      c.buf = c.buf.length === 0 ? chunk : Buffer.concat([c.buf, chunk]);
    } catch (err) {
      // EC-CONTRACT 9.5: failing to allocate closes this connection, never the process.
      this.#m.allocFailures.inc();
      this.#o.logger.warn({ err: (err as Error).message }, "data connection closed: allocation failed");
      c.socket.destroy();
      return;
    }
    while (c.buf.length >= LEN_BYTES && !c.socket.destroyed) {
      const len = frameLength(c.buf);
      if (len === 0 || len > this.#maxFrame) {
        this.#badFrame(c, `frame length ${len}`);
        return;
      }
      if (c.buf.length < LEN_BYTES + len) return;
      const body = c.buf.subarray(LEN_BYTES, LEN_BYTES + len);
      c.buf = c.buf.subarray(LEN_BYTES + len);
      const shm = this.#o.shm;
      if (shm !== undefined && (isShmOp(body[0]) || shm.awaiting(c.shm))) {
        // docs/ec-protocol.md 3.4 (SHM_RELEASE also arrives while streaming).
        try {
          if (!isShmOp(body[0])) throw new EcError("EC_MALFORMED", "a frame before SHM_ATTACHED");
          c.shm = shm.onFrame(c.shm, c.socket, body, c.frames++ === 0);
        } catch (err) {
          this.#badFrame(c, (err as Error).message);
          return;
        }
        continue;
      }
      c.frames++;
      if (c.streaming || c.parked !== null) {
        this.#badFrame(c, c.streaming ? "frame while streaming" : "frame while a READ_AHEAD waits");
        return;
      }
      try {
        this.#onFrame(c, body);
      } catch (err) {
        this.#badFrame(c, (err as Error).message);
        return;
      }
    }
  }

  #onFrame(c: ServerConn, body: Uint8Array): void {
    if (body[0] === XFER_REQ_OP && this.#xferReq !== null) {
      this.#xferRequest(c, body, this.#xferReq);
      return;
    }
    const f = decodeToServer(body, this.#o.numBlocks);
    if (f.op === "notif") {
      // A notification is only accepted for the read this connection just finished streaming.
      if (c.key === null || Buffer.compare(c.key, f.msg) !== 0) {
        throw new EcError("EC_MALFORMED", "notif: no finished read of that key on this connection");
      }
      this.#streams.get(c.keyStr)?.delete(c);
      c.key = null;
      this.#notifs.push({ from: c.reader, key: c.keyStr, msg: Uint8Array.from(f.msg), grant: c.grant });
      if (c.grant !== null) c.grant.notified = true;
      c.grant = null;
      this.#m.notifications.inc();
      this.#o.onNotification();
      return;
    }
    if (c.key !== null) this.#streams.get(c.keyStr)?.delete(c); // the previous notification was lost
    c.key = null;
    let keyStr: string;
    try {
      keyStr = UTF8_FATAL.decode(f.key);
    } catch {
      keyStr = "";
    }
    if (f.op === "read_ahead") {
      this.#readAhead(c, f, keyStr, true);
      return;
    }
    const g = this.#grants.get(keyStr);
    const refusal = this.#refusal(f, keyStr, g);
    if (refusal !== null) {
      this.#refuse(c, keyStr, refusal);
      return;
    }
    this.#serve(c, f.key, keyStr, g!, f.reader, f.blocks, f.nbytes);
  }

  /**
   * docs/ec-protocol.md 3.5: an XFER_REQ. The instance is checked first (ERROR 1, as for READ); the
   * producer then validates, pins and grants it exactly as a control-plane XferReq (EC-CONTRACT
   * 4.2, 5.3, 9.2; a malformed request throws and closes the connection). A NACK is answered with
   * an ACK frame flagged `final` (the connection stays open); an OK ack is served at once on this
   * connection, checked as a READ_AHEAD (5 when `nbytes` is not the grant's): ACK, DATA, bytes.
   */
  #xferRequest(c: ServerConn, body: Uint8Array, handler: XferRequestHandler): void {
    const f = decodeXferReqFrame(body);
    this.#m.xferRequests.inc();
    if (c.key !== null) this.#streams.get(c.keyStr)?.delete(c); // the previous notification was lost
    c.key = null;
    if (f.instance !== this.#o.instance) {
      this.#refuse(c, "", {
        code: "instance_mismatch",
        message: `this agent is instance ${this.#o.instance}`,
      });
      return;
    }
    let peer = this.#connIds.get(c);
    if (peer === undefined) {
      peer = `data:${this.#nextConnId++}`;
      this.#connIds.set(c, peer);
    }
    const a = handler(f.req, peer);
    if (c.socket.destroyed || this.#closed) return;
    if (!a.ok) {
      c.socket.write(encodeFrame({ op: "ack", ack: a.ack, final: true }));
      this.#m.ackFrames.inc();
      return;
    }
    const g = this.#grants.get(a.key);
    if (g === undefined) {
      this.#refuse(c, a.key, { code: "no_grant", message: `no grant for key ${a.key}` });
      return;
    }
    const bb = this.#o.blockBytes;
    const n = g.blocks.length;
    const want = g.nbytes >= 0 ? g.nbytes : n * bb;
    if (f.nbytes !== want || f.nbytes > n * bb || f.nbytes <= (n - 1) * bb) {
      this.#refuse(c, a.key, {
        code: "bad_nbytes",
        message: `nbytes ${f.nbytes} is not grant ${a.key}'s ${want}`,
      });
      return;
    }
    this.#serve(c, Buffer.from(a.key), a.key, g, f.reader, g.blocks, f.nbytes, a.ack);
  }

  #refuse(c: ServerConn, keyStr: string, refusal: Refusal): void {
    this.#m.refused.inc();
    this.#o.logger.warn({ key: keyStr, code: refusal.code }, "data-plane read refused");
    c.socket.end(encodeFrame({ op: "error", code: refusal.code, message: refusal.message }));
  }

  #serve(
    c: ServerConn,
    key: Uint8Array,
    keyStr: string,
    g: DataGrant,
    reader: string,
    blocks: readonly number[],
    nbytes: number,
    ack: Uint8Array | null = null,
  ): void {
    this.#unproven.delete(c);
    c.key = Uint8Array.from(key);
    c.keyStr = keyStr;
    c.grant = g;
    c.reader = reader;
    c.streaming = true;
    let set = this.#streams.get(keyStr);
    if (set === undefined) {
      set = new Set();
      this.#streams.set(keyStr, set);
    }
    set.add(c);
    this.#m.served.inc();
    void this.#stream(c, blocks, nbytes, ack);
  }

  /**
   * docs/ec-protocol.md 3.2: a READ_AHEAD is checked like a READ whose blocks are the grant's
   * (instance first, then the grant, its deadline and its byte count); without a grant yet it
   * waits on the connection (at most `waitMs`, then ERROR 2) and is served when the grant is made.
   * A waiting connection is still unproven (EC-CONTRACT 9.5: it counts against the idle cap).
   * Returns true when it was served with an ACK frame (3.3).
   */
  #readAhead(c: ServerConn, f: ReadAheadFrame, keyStr: string, mayPark: boolean): boolean {
    if (f.instance !== this.#o.instance) {
      this.#refuse(c, keyStr, {
        code: "instance_mismatch",
        message: `this agent is instance ${this.#o.instance}`,
      });
      return false;
    }
    // 3.2: a grant whose notification arrived is done: a READ_AHEAD (often in the same segment
    // as that notification, for the next request of the key) waits for the key's next grant.
    const live = this.#grants.get(keyStr);
    const g = live?.notified === true ? undefined : live;
    if (g === undefined) {
      if (!mayPark || keyStr === "") {
        this.#refuse(c, keyStr, { code: "no_grant", message: `no grant for key ${keyStr}` });
        return false;
      }
      const timer = setTimeout(() => {
        if (c.parked === null) return;
        this.#unpark(c);
        this.#refuse(c, keyStr, {
          code: "no_grant",
          message: `no grant for key ${keyStr} within ${f.waitMs} ms`,
        });
      }, f.waitMs);
      timer.unref();
      c.parked = { frame: f, timer };
      let set = this.#parked.get(keyStr);
      if (set === undefined) {
        set = new Set();
        this.#parked.set(keyStr, set);
      }
      set.add(c);
      this.#m.readAheadParked.inc();
      return false;
    }
    if (this.#o.now() > g.deadline) {
      this.#refuse(c, keyStr, { code: "expired", message: `grant ${keyStr} expired` });
      return false;
    }
    const bb = this.#o.blockBytes;
    const n = g.blocks.length;
    const want = g.nbytes >= 0 ? g.nbytes : n * bb;
    if (f.nbytes !== want || f.nbytes > n * bb || f.nbytes <= (n - 1) * bb) {
      this.#refuse(c, keyStr, {
        code: "bad_nbytes",
        message: `nbytes ${f.nbytes} is not grant ${keyStr}'s ${want}`,
      });
      return false;
    }
    this.#m.readAheadServed.inc();
    // 3.3: the ACK frame first when asked for and the producer gave the grant's ack.
    const ack = f.ackFirst === true ? (g.ack ?? null) : null;
    this.#serve(c, f.key, keyStr, g, f.reader, g.blocks, f.nbytes, ack);
    return ack !== null;
  }

  #unpark(c: ServerConn): void {
    const p = c.parked;
    if (p === null) return;
    clearTimeout(p.timer);
    c.parked = null;
    for (const [k, set] of this.#parked) {
      if (set.delete(c) && set.size === 0) this.#parked.delete(k);
    }
  }

  /** EC-CONTRACT 5.3: why a READ may not be served (`null`: serve it), first reason wins. */
  #refusal(f: ReadFrame, keyStr: string, g: DataGrant | undefined): Refusal | null {
    if (f.instance !== this.#o.instance) {
      return { code: "instance_mismatch", message: `this agent is instance ${this.#o.instance}` };
    }
    if (g === undefined) return { code: "no_grant", message: `no grant for key ${keyStr}` };
    if (this.#o.now() > g.deadline) return { code: "expired", message: `grant ${keyStr} expired` };
    if (g.blocks.length !== f.blocks.length || g.blocks.some((b, i) => b !== f.blocks[i])) {
      return { code: "blocks_mismatch", message: `blocks differ from grant ${keyStr}` };
    }
    const bb = this.#o.blockBytes;
    if (f.nbytes > f.blocks.length * bb || f.nbytes <= (f.blocks.length - 1) * bb) {
      return {
        code: "bad_nbytes",
        message: `nbytes ${f.nbytes} does not fill exactly ${f.blocks.length} blocks`,
      };
    }
    // 3.1: nbytes is the ack's nbytes (the grant's), not the blocks' whole size.
    if (g.nbytes >= 0 && f.nbytes !== g.nbytes) {
      return { code: "bad_nbytes", message: `nbytes ${f.nbytes} is not grant ${keyStr}'s ${g.nbytes}` };
    }
    return null;
  }

  async #stream(
    c: ServerConn,
    blocks: readonly number[],
    nbytes: number,
    ack: Uint8Array | null = null,
  ): Promise<void> {
    const shm = this.#o.shm;
    if (shm?.active(c.shm)) {
      // docs/ec-protocol.md 3.4: the same READ (and 3.3's ACK first), its bytes through the ring.
      if (ack !== null) {
        c.socket.write(encodeFrame({ op: "ack", ack }));
        this.#m.ackFrames.inc();
      }
      const bb = this.#o.blockBytes;
      const m = this.#m;
      const ok = await shm.stream(
        c.shm,
        c.socket,
        this.#o.region,
        blocks,
        bb,
        nbytes,
        { bytesPerSec: this.#o.throttleBytesPerSec, chunkBytes: this.#o.chunkBytes },
        (n) => m.bytesSent.inc(n),
      );
      if (ok) c.streaming = false;
      return;
    }
    const s = c.socket;
    const region = this.#o.region;
    const chunk = this.#o.chunkBytes;
    const throttle = this.#o.throttleBytesPerSec;
    // The header and the first chunk leave in one writev (one syscall instead of two).
    s.cork();
    if (ack !== null) {
      s.write(encodeAckHead(ack.length));
      s.write(ack);
      this.#m.ackFrames.inc();
    }
    s.write(encodeFrame({ op: "data", nbytes }));
    let corked = true;
    const { segStart, segLen } = segments(blocks, this.#o.blockBytes, nbytes);
    let sent = 0;
    for (let i = 0; i < segStart.length; i++) {
      const base = segStart[i]!;
      const n = segLen[i]!;
      for (let off = 0; off < n; off += chunk) {
        if (s.destroyed) return;
        const len = Math.min(chunk, n - off);
        // A view of the pinned region: the socket sends from it without a staging copy.
        const ok = s.write(region.subarray(base + off, base + off + len));
        if (corked) {
          corked = false;
          s.uncork();
        }
        this.#m.bytesSent.inc(len);
        sent += len;
        // The reader may answer (notification, next READ) as soon as the last byte is out.
        if (sent === nbytes) break;
        if (throttle > 0) await sleep((len / throttle) * 1000);
        // writableNeedDrain, not the write's return value: a 'drain' during the throttle sleep (or
        // right after the uncork) has already happened and would never fire again.
        if (!ok && s.writableNeedDrain && !s.destroyed) await drained(s);
      }
    }
    c.streaming = false;
  }

  #badFrame(c: ServerConn, why: string): void {
    this.#m.malformed.inc();
    this.#o.logger.warn({ why }, "malformed data-plane frame; closing the connection");
    c.socket.destroy();
  }
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
