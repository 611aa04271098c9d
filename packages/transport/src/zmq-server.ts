// The ZeroMQ server (CONTRACT 3, 11): a ROUTER, with per-peer (routing id) state and limits.
import { unlinkSync } from "node:fs";
import type { Registry } from "@tapwire/stats";
import type * as zmq from "zeromq";
import { isThenable, replyBytes } from "./check.js";
import type { ServerConfig } from "./config.js";
import { type Endpoint, formatEndpoint } from "./endpoint.js";
import { TransportError } from "./errors.js";
import { ServerLimits } from "./limits.js";
import type { ServerMetrics } from "./metrics.js";
import type { Handler, Reply, RpcServer, ServerOptions } from "./options.js";
import { isIpv6, loadZmq, zmqAddress } from "./zmq-loader.js";
import { type Held, Peer } from "./zmq-peer.js";

const EMPTY_PART = new Uint8Array(0);
// Peers of a ROUTER are never announced as gone; forget idle ones after this long.
const DEFAULT_PEER_IDLE_MS = 60_000;
// A peer that pipelines requests (not allowed: CONTRACT 3) gets at most this many queued.
const MAX_PEER_QUEUE = 64;
// CONTRACT 4: the frame header an oversize message's onOversize hook gets (CONTRACT 11).
const FRAME_HEADER_BYTES = 24;

/** Server over a ZeroMQ ROUTER (CONTRACT 3): per peer one request at a time, in order. */
export class ZmqServer implements RpcServer {
  endpoint = "";
  readonly registry: Registry;
  readonly #ep: Endpoint;
  readonly #handler: Handler;
  readonly #maxMessageBytes: number;
  readonly #unboundMax: number;
  readonly #unboundIdleMs: number;
  /** Receive budget and peer cap (CONTRACT 11). */
  readonly limits: ServerLimits<Peer>;
  /** A bound peer's message waiting for budget: the receive loop pauses until it fits. */
  #gate: Promise<void> | null = null;
  #openGate: (() => void) | null = null;
  readonly #closeTimeoutMs: number;
  readonly #peerIdleMs: number;
  readonly #options: ServerOptions;
  readonly #m: ServerMetrics;
  // Made in start(), once zeromq is loaded (an optional peer dependency).
  #router!: zmq.Router;
  readonly #peers = new Map<string, Peer>();
  #nextId = 1;
  #closing = false;
  #closePromise: Promise<void> | null = null;
  readonly #sendQueue: (zmq.MessageLike | readonly Uint8Array[])[][] = [];
  #sending = false;
  #inFlight = 0;
  #idle: (() => void) | null = null;
  #sweepTimer: NodeJS.Timeout | null = null;

  constructor(ep: Endpoint, handler: Handler, cfg: ServerConfig) {
    this.#ep = ep;
    this.#handler = handler;
    this.registry = cfg.registry;
    this.#maxMessageBytes = cfg.maxMessageBytes;
    this.#unboundMax = cfg.unboundMaxMessageBytes;
    this.#unboundIdleMs = cfg.unboundIdleMs;
    this.limits = new ServerLimits<Peer>(cfg.maxBufferedBytes, cfg.maxConnections, cfg.metrics);
    this.limits.reclaim = () => {
      for (const p of this.#peers.values()) if (!p.busy) this.dropAsm(p, false);
    };
    // CONTRACT 11 refuses when no unbound connection can be closed, which presumes that a dead
    // connection closes. A ROUTER cannot tell a vanished peer from a quiet one, so the bound
    // peer idle longest is forgotten instead (a live one re-HELLOs after its NO_SESSION).
    this.limits.boundVictim = () => {
      let victim: Peer | null = null;
      for (const p of this.#peers.values()) {
        if (p.bound && !p.busy && (victim === null || p.lastActive < victim.lastActive)) victim = p;
      }
      return victim;
    };
    this.#closeTimeoutMs = cfg.closeTimeoutMs;
    this.#peerIdleMs = cfg.idleTimeoutMs > 0 ? cfg.idleTimeoutMs : DEFAULT_PEER_IDLE_MS;
    this.#options = cfg.options;
    this.#m = cfg.metrics;
  }

  get connections(): number {
    return this.#peers.size;
  }

  async start(): Promise<void> {
    const z = await loadZmq();
    // ZMQ_MAXMSGSIZE: libzmq drops a peer announcing a larger frame before reading it. It is one
    // value per socket, so it is the bound limit; unbound peers are held to theirs in dispatch.
    this.#router = new z.Router({ linger: 0, maxMessageSize: this.#maxMessageBytes, ipv6: isIpv6(this.#ep) });
    try {
      await this.#router.bind(zmqAddress(this.#ep));
    } catch (e) {
      this.#router.close();
      throw new TransportError(
        "TRANSPORT_LISTEN",
        `listen on ${formatEndpoint(this.#ep)} failed: ${(e as Error).message}`,
        {
          cause: e,
        },
      );
    }
    const last = this.#router.lastEndpoint ?? "";
    if ("path" in this.#ep) {
      this.endpoint = formatEndpoint(this.#ep);
    } else {
      const m = /^tcp:\/\/(?:\[([^\]]+)\]|([^:]+)):(\d+)$/.exec(last);
      const host = m?.[1] ?? m?.[2] ?? this.#ep.host;
      this.endpoint = formatEndpoint({ scheme: "zmq+tcp", host, port: Number(m?.[3] ?? this.#ep.port) });
    }
    this.#router.events.on("accept", () => this.#m.connections.inc());
    let sweepMs = Math.max(1000, Math.min(this.#peerIdleMs, 30_000));
    if (this.#unboundIdleMs > 0) sweepMs = Math.min(sweepMs, Math.max(50, this.#unboundIdleMs / 4));
    this.#sweepTimer = setInterval(() => this.#sweep(), sweepMs);
    this.#sweepTimer.unref();
    void this.#receiveLoop();
  }

  async #receiveLoop(): Promise<void> {
    for (;;) {
      let msg: Buffer[];
      try {
        msg = await this.#router.receive();
      } catch {
        return; // closed
      }
      if (this.#closing) continue;
      this.#onMessage(msg);
      if (this.#gate !== null) await this.#gate;
    }
  }

  #onMessage(msg: Buffer[]): void {
    const rid = msg[0];
    if (rid === undefined) return;
    const key = rid.toString("latin1");
    let peer = this.#peers.get(key);
    if (peer === undefined) {
      // CONTRACT 11: a new routing id is a new connection (maxConnections, at most half unbound).
      if (!this.limits.admit()) return;
      peer = new Peer(this.#nextId++, rid, key, this);
      peer.lastActive = Date.now();
      this.#peers.set(key, peer);
      this.limits.track(peer);
      this.#m.open.inc();
      this.#options.onConnection?.(peer);
    }
    let total = 0;
    for (let i = 1; i < msg.length; i++) total += (msg[i] as Buffer).length;
    const held: Held = { msg, total };
    if (!this.limits.tryCharge(total)) {
      if (!peer.bound) {
        this.#m.budgetRefused.inc();
        this.forget(peer);
        return;
      }
      // Backpressure: receive nothing more until this message fits (libzmq holds the rest).
      const p = peer;
      let open: () => void = () => {};
      this.#gate = new Promise<void>((resolve) => {
        open = resolve;
      });
      this.#openGate = () => open();
      this.limits.wait(() => {
        if (!p.forgotten && !this.#closing) {
          if (!this.limits.tryCharge(total)) return false;
          this.#accept(p, held);
        }
        this.#gate = null;
        open();
        return true;
      });
      return;
    }
    this.#accept(peer, held);
  }

  /** A charged message: handled now, or queued behind the peer's request in progress. */
  #accept(peer: Peer, held: Held): void {
    if (peer.busy) {
      if (peer.queue.length >= MAX_PEER_QUEUE) {
        this.#m.errors.inc();
        this.limits.release(held.total);
        return;
      }
      peer.queue.push(held);
      return;
    }
    this.#dispatch(peer, held);
  }

  #dispatch(peer: Peer, held: Held): void {
    const { msg, total } = held;
    // CONTRACT 3: a multipart message is the concatenation of its parts; enforce the limit on the sum.
    // CONTRACT 11: an unbound peer's limit is unboundMaxMessageBytes.
    if (total > (peer.bound ? this.#maxMessageBytes : this.#unboundMax)) {
      this.#m.tooLarge.inc();
      this.limits.release(total);
      if (!peer.bound) this.#oversize(peer, msg, total);
      else this.forget(peer);
      return;
    }
    peer.lastActive = Date.now();
    let req: Buffer;
    let charged = total;
    if (msg.length === 2) {
      req = msg[1] as Buffer;
    } else if (msg.length < 2) {
      req = Buffer.alloc(0);
    } else {
      let asm = peer.asm;
      if (asm === null || asm.length < total) {
        const size = Math.max(total, 4096);
        const extra = size - peer.asmCharge;
        if (!this.limits.tryCharge(extra)) {
          if (!peer.bound) {
            this.limits.release(total);
            this.#m.budgetRefused.inc();
            this.forget(peer);
            return;
          }
          // A bound peer's frames are in already; their copy goes over the budget for as long
          // as this one request (the frames are released right below).
          this.limits.force(extra);
        }
        try {
          asm = Buffer.allocUnsafeSlow(size);
        } catch (e) {
          this.limits.release(total + extra);
          if (!(e instanceof RangeError)) throw e;
          this.#m.allocFailures.inc();
          this.forget(peer);
          return;
        }
        peer.asmCharge += extra;
        peer.asm = asm;
      }
      let off = 0;
      for (let i = 1; i < msg.length; i++) {
        const f = msg[i] as Buffer;
        f.copy(asm, off);
        off += f.length;
      }
      req = asm.subarray(0, total);
      // The frames are garbage now; the copy stays charged (peer.asmCharge).
      this.limits.release(total);
      charged = 0;
    }
    this.#m.requests.inc();
    this.#m.bytesIn.inc(total);
    peer.busy = true;
    this.#inFlight++;
    let result: Reply | PromiseLike<Reply>;
    try {
      result = this.#handler(req, peer);
    } catch (e) {
      this.#handlerDone(peer, undefined, e, charged);
      return;
    }
    if (isThenable(result)) {
      result.then(
        (r) => this.#handlerDone(peer, r, undefined, charged),
        (e: unknown) => this.#handlerDone(peer, undefined, e ?? new Error("handler rejected"), charged),
      );
    } else {
      this.#handlerDone(peer, result, undefined, charged);
    }
  }

  /** CONTRACT 11: an unbound peer's oversize message: onOversize gets its frame header, then the peer goes. */
  #oversize(peer: Peer, msg: Buffer[], total: number): void {
    const hook = this.#options.onOversize;
    if (hook === undefined) {
      this.forget(peer);
      return;
    }
    const head = Buffer.allocUnsafe(Math.min(FRAME_HEADER_BYTES, total));
    let off = 0;
    for (let i = 1; i < msg.length && off < head.length; i++) {
      off += (msg[i] as Buffer).copy(head, off, 0, Math.min((msg[i] as Buffer).length, head.length - off));
    }
    let r: Uint8Array | null;
    try {
      r = hook(head, total, peer);
    } catch (e) {
      this.#handlerFailed(peer, e);
      return;
    }
    if (r !== null && !peer.forgotten) {
      const bad = r instanceof Uint8Array ? replyBytes(r, this.#maxMessageBytes) : null;
      if (typeof bad !== "number") {
        this.#handlerFailed(
          peer,
          bad ??
            new TransportError("TRANSPORT_BAD_OPTION", "onOversize returned neither a Uint8Array nor null"),
        );
        return;
      }
      this.#m.oversizeReplies.inc();
      this.#enqueueSend(peer, r);
    }
    this.forget(peer);
  }

  /** Frees a peer's kept reassembly buffer and its budget (`wake`: waiters may go on). */
  dropAsm(peer: Peer, wake = true): void {
    peer.asm = null;
    const c = peer.asmCharge;
    peer.asmCharge = 0;
    if (wake) this.limits.release(c);
    else this.limits.uncharge(c);
  }

  #handlerDone(peer: Peer, r: Reply | undefined, err: unknown, charged: number): void {
    this.#inFlight--;
    peer.busy = false;
    this.limits.release(charged);
    // Only a bound peer keeps its reassembly buffer (the buffers of unbound ones are small and
    // short-lived, and no buffer outlives its peer).
    if ((!peer.bound || this.limits.hasWaiters) && peer.asm !== null && !peer.forgotten) this.dropAsm(peer);
    if (err !== undefined) {
      this.#handlerFailed(peer, err);
    } else if (!peer.forgotten) {
      if (r === null) {
        this.forget(peer);
      } else {
        const total = replyBytes(r, this.#maxMessageBytes);
        if (typeof total !== "number") this.#handlerFailed(peer, total);
        else this.#enqueueSend(peer, r as Uint8Array | readonly Uint8Array[]);
      }
    }
    if (!peer.forgotten) {
      const next = peer.queue.shift();
      if (next !== undefined) this.#dispatch(peer, next);
    }
    if (this.#inFlight === 0 && this.#idle !== null) this.#idle();
  }

  #handlerFailed(peer: Peer, e: unknown): void {
    this.#m.errors.inc();
    this.#options.onError?.(e, peer);
    this.forget(peer);
  }

  #enqueueSend(peer: Peer, r: Uint8Array | readonly Uint8Array[]): void {
    // zeromq.js sends buffers above 128 bytes zero-copy: libzmq reads them on its I/O thread,
    // possibly after send() resolved. A reply that is (a view of) this peer's reassembly buffer
    // keeps it: the next multipart request from that peer gets a fresh one.
    const asm = peer.asm;
    if (asm !== null) {
      if (r instanceof Uint8Array ? r.buffer === asm.buffer : r.some((p) => p.buffer === asm.buffer)) {
        peer.asm = null;
      }
    }
    let total = 0;
    const msg: (zmq.MessageLike | readonly Uint8Array[])[] = [peer.routingId];
    if (r instanceof Uint8Array) {
      msg.push(r);
      total = r.length;
    } else if (r.length === 0) {
      msg.push(EMPTY_PART);
    } else {
      for (const p of r) {
        msg.push(p);
        total += p.length;
      }
    }
    this.#m.bytesOut.inc(total);
    this.#sendQueue.push(msg);
    if (!this.#sending) this.#pumpSends();
  }

  // zeromq.js allows one send in progress per socket: replies of concurrent peers go through a queue.
  #pumpSends(): void {
    const msg = this.#sendQueue.shift();
    if (msg === undefined) {
      this.#sending = false;
      if (this.#idle !== null && this.#inFlight === 0) this.#idle();
      return;
    }
    this.#sending = true;
    this.#router.send(msg as zmq.MessageLike[]).then(
      () => this.#pumpSends(),
      () => {
        this.#m.errors.inc();
        this.#pumpSends();
      },
    );
  }

  /** Drops a peer's state (ZeroMQ cannot close a single ROUTER peer). */
  forget(peer: Peer): void {
    if (peer.forgotten) return;
    peer.forgotten = true;
    let queued = 0;
    for (const h of peer.queue) queued += h.total;
    peer.queue.length = 0;
    this.limits.untrack(peer);
    // A buffer still referenced by an in-flight reply stays alive through it; ours goes now.
    peer.asm = null;
    this.limits.release(queued + peer.asmCharge);
    peer.asmCharge = 0;
    if (this.#peers.get(peer.key) === peer) this.#peers.delete(peer.key);
    this.#m.open.dec();
    this.#options.onClose?.(peer);
  }

  #sweep(): void {
    const now = Date.now();
    const cutoff = now - this.#peerIdleMs;
    const unboundCutoff = this.#unboundIdleMs > 0 ? now - this.#unboundIdleMs : -1;
    for (const p of this.#peers.values()) {
      if (p.busy) continue;
      if (!p.bound && p.lastActive < unboundCutoff) {
        // CONTRACT 11: an unbound peer with no whole message for unboundIdleMs.
        this.#m.unboundIdleClosed.inc();
        this.forget(p);
      } else if (p.lastActive < cutoff) {
        this.forget(p);
      }
    }
  }

  close(): Promise<void> {
    if (this.#closePromise !== null) return this.#closePromise;
    this.#closing = true;
    this.#openGate?.();
    this.#closePromise = (async () => {
      if (this.#sweepTimer !== null) clearInterval(this.#sweepTimer);
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        new Promise<void>((resolve) => {
          this.#idle = () => {
            if (this.#inFlight === 0 && !this.#sending) resolve();
          };
          this.#idle();
        }),
        new Promise<void>((resolve) => {
          timer = setTimeout(resolve, this.#closeTimeoutMs);
        }),
      ]);
      clearTimeout(timer);
      // send() resolves once libzmq holds a reply, not once it is on the wire: linger so the
      // last replies still go out (graceful), bounded by closeTimeoutMs.
      this.#router.linger = Math.min(this.#closeTimeoutMs, 2000);
      this.#router.close();
      for (const p of [...this.#peers.values()]) this.forget(p);
      if ("path" in this.#ep) {
        try {
          unlinkSync(this.#ep.path);
        } catch {
          // libzmq removed it
        }
      }
    })();
    return this.#closePromise;
  }
}
