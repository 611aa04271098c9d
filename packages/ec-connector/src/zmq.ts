import type { Logger } from "pino";
import { context, Dealer, Router } from "zeromq";
import type { CurveKeyPair, CurveServerOptions } from "./curve.js";
import { checkCurveKey, checkCurveServer, zap } from "./curve.js";
import { checkIntOption, EcError } from "./errors.js";
import { silentLogger } from "./metrics.js";
import type { ControlMessage, ControlServer } from "./producer-session.js";
import { MAX_CONTROL_MESSAGE_BYTES } from "./protocol.js";

/** ZeroMQ heartbeat settings (ZMTP PING/PONG), ms. EC-CONTRACT 7 defaults: 2 s / 4 s / 8 s. */
export interface HeartbeatOptions {
  /** ZMQ_HEARTBEAT_IVL (default 2000 ms; 0 disables heartbeats). */
  intervalMs?: number;
  /** ZMQ_HEARTBEAT_TIMEOUT: no traffic for this long after a PING closes the connection (default 4000 ms). */
  timeoutMs?: number;
  /** ZMQ_HEARTBEAT_TTL announced to the peer (default 8000 ms). */
  ttlMs?: number;
}

/** EC-CONTRACT 7: heartbeat defaults (vLLM's connector uses the same). */
export const HEARTBEAT_DEFAULTS = { intervalMs: 2_000, timeoutMs: 4_000, ttlMs: 8_000 } as const;

/** Validates heartbeat options (throws `EC_BAD_OPTION` naming the bad one). */
export function validateHeartbeat(hb: HeartbeatOptions | undefined): void {
  socketOptions(hb);
}

function socketOptions(hb: HeartbeatOptions | undefined) {
  const intervalMs = checkIntOption(
    "heartbeat.intervalMs",
    hb?.intervalMs ?? HEARTBEAT_DEFAULTS.intervalMs,
    0,
  );
  const timeoutMs = checkIntOption("heartbeat.timeoutMs", hb?.timeoutMs ?? HEARTBEAT_DEFAULTS.timeoutMs, 0);
  const ttlMs = checkIntOption("heartbeat.ttlMs", hb?.ttlMs ?? HEARTBEAT_DEFAULTS.ttlMs, 0, 6_553_500);
  return {
    linger: 0,
    maxMessageSize: MAX_CONTROL_MESSAGE_BYTES,
    heartbeatInterval: intervalMs,
    heartbeatTimeout: timeoutMs,
    heartbeatTimeToLive: ttlMs,
  };
}

/** ZMQ_ZERO_COPY_RECV, a context option (libzmq 4.3 draft, bundled by zeromq.js). */
const ZMQ_ZERO_COPY_RECV = 10;

/**
 * Issue 19: a ROUTER whose received messages are copied out of libzmq's 8 KiB decode buffers.
 * With zero-copy receive (libzmq's default) every message over 128 bytes reaches JS as a Buffer
 * over that shared buffer (zeromq.js) and keeps the whole buffer alive until V8 collects the
 * Buffer, while V8 is told of only the message's own size: under a flood of 200-byte requests the
 * producer held ~90 MiB of decode buffers waiting for a GC. The option is read when a socket is
 * created, so it is switched off for this socket only and restored.
 */
function copyingRouter(make: () => Router): Router {
  const ctx = context as unknown as {
    getBoolOption(o: number): boolean;
    setBoolOption(o: number, v: boolean): void;
  };
  let before: boolean;
  try {
    before = ctx.getBoolOption(ZMQ_ZERO_COPY_RECV);
    ctx.setBoolOption(ZMQ_ZERO_COPY_RECV, false);
  } catch {
    return make(); // a libzmq without the draft option: zero-copy as before
  }
  try {
    return make();
  } finally {
    ctx.setBoolOption(ZMQ_ZERO_COPY_RECV, before);
  }
}

/** Options of {@link ZmqRouterServer.bind}. */
export interface RouterOptions {
  /** ZeroMQ heartbeats (default 2/4/8 s). */
  heartbeat?: HeartbeatOptions;
  /** pino logger (default: silent). */
  logger?: Logger;
  /** EC-CONTRACT 9.4: be a CURVE server accepting only `curve.allow` (a ZAP handler). */
  curve?: CurveServerOptions;
  /** Called when the socket drops a connection (an over-size message, EC-CONTRACT 9.1, or a peer gone). */
  onDisconnect?: () => void;
  /** Called for each CURVE handshake the ZAP handler refuses. */
  onAuthRefused?: (why: string) => void;
  /** Issue 19: ZMQ_RCVHWM, messages queued per peer (default libzmq's 1000). */
  receiveHighWaterMark?: number;
  /** Issue 19: ZMQ_SNDHWM, replies queued per peer; beyond it a ROUTER drops them (default 1000). */
  sendHighWaterMark?: number;
  /** Issue 19: called per received message with the number already queued; false drops it. */
  admit?: (identity: Uint8Array, queued: number) => boolean;
  /** Issue 19: replies waiting in JS for the socket at most; more are dropped (default unbounded). */
  maxQueuedReplies?: number;
  /** Called for each reply dropped at `maxQueuedReplies`. */
  onReplyDropped?: () => void;
}

/** Default of `DealerOptions.holdMs`: the consumer's default ack timeout. */
export const DEALER_HOLD_MS = 2_000;

/** Options of {@link ZmqDealerClient}. */
export interface DealerOptions {
  /** ZeroMQ heartbeats (default 2/4/8 s). */
  heartbeat?: HeartbeatOptions;
  /** pino logger (default: silent). */
  logger?: Logger;
  /**
   * Issue 19 (docs/ec-protocol.md "A restarted producer"): how long a message waits for the first
   * handshake before it is dropped (default 2000 ms, the consumer's ack timeout: by then the
   * session has asked again).
   */
  holdMs?: number;
  /** EC-CONTRACT 9.4: authenticate with this key pair to the producer whose public key is `serverKey`. */
  curve?: CurveKeyPair & {
    /** Z85 public key of the producer. */
    serverKey: string;
  };
}

/** Serialises sends (a zeromq 6 socket allows one send in flight) without blocking the caller. */
class SendQueue {
  readonly #sock: Router | Dealer;
  readonly #log: Logger;
  readonly #queue: Uint8Array[][] = [];
  readonly #max: number;
  readonly #onDrop: (() => void) | null;
  #busy = false;
  #closed = false;
  /** When set: a send refused with EAGAIN is retried while this returns true. */
  retryWhile: (() => boolean) | null = null;

  /** `max`: messages waiting in JS at most; more are dropped (`onDrop`). Default unbounded. */
  constructor(sock: Router | Dealer, log: Logger, max = Number.POSITIVE_INFINITY, onDrop?: () => void) {
    this.#sock = sock;
    this.#log = log;
    this.#max = max;
    this.#onDrop = onDrop ?? null;
  }

  push(frames: Uint8Array[]): void {
    if (this.#closed) return;
    if (this.#queue.length >= this.#max) {
      this.#onDrop?.();
      return;
    }
    this.#queue.push(frames);
    if (!this.#busy) void this.#pump();
  }

  close(): void {
    this.#closed = true;
    this.#queue.length = 0;
  }

  /** Drops every message not yet handed to the socket; returns how many. */
  clear(): number {
    const n = this.#queue.length;
    this.#queue.length = 0;
    return n;
  }

  async #pump(): Promise<void> {
    this.#busy = true;
    while (this.#queue.length > 0 && !this.#closed) {
      const frames = this.#queue.shift()!;
      try {
        await this.#sock.send(frames);
      } catch (err) {
        // Issue 19: a DEALER that never waits (sendTimeout 0) is full for a moment in a burst: try
        // again while its connection is up (never once it went down: that is the successor's).
        if ((err as { code?: unknown }).code === "EAGAIN" && this.retryWhile?.() === true) {
          this.#queue.unshift(frames);
          await new Promise((r) => setTimeout(r, 1));
          continue;
        }
        if (!this.#closed) this.#log.warn({ err: (err as Error).message }, "zmq send failed");
      }
    }
    this.#busy = false;
  }
}

/**
 * The producer's ROUTER (EC-CONTRACT 1, 4): a receive loop queues messages so `poll()` never blocks;
 * sends are queued. `onMessage` fires on arrival so a driver can schedule a step.
 */
export class ZmqRouterServer implements ControlServer {
  /** The bound endpoint (with the real port when bound to port 0). */
  readonly endpoint: string;
  /** Called when a message arrives (schedule a `pollStep()`). */
  onMessage: (() => void) | null = null;
  readonly #sock: Router;
  readonly #inbox: ControlMessage[] = [];
  readonly #out: SendQueue;
  readonly #log: Logger;
  readonly #zapDomain: string | null;
  readonly #admit: ((identity: Uint8Array, queued: number) => boolean) | null;
  #closed = false;

  private constructor(
    sock: Router,
    endpoint: string,
    log: Logger,
    zapDomain: string | null,
    onDisconnect?: () => void,
    admit?: (identity: Uint8Array, queued: number) => boolean,
    out?: { max?: number; onDrop?: () => void },
  ) {
    this.#sock = sock;
    this.#admit = admit ?? null;
    this.endpoint = endpoint;
    this.#log = log;
    this.#zapDomain = zapDomain;
    this.#out = new SendQueue(sock, log, out?.max, out?.onDrop);
    if (onDisconnect !== undefined) sock.events.on("disconnect", () => onDisconnect());
    void this.#loop();
  }

  /** Binds a ROUTER on `endpoint` (e.g. `tcp://127.0.0.1:0`) and resolves with the bound endpoint known. */
  static async bind(endpoint: string, options: RouterOptions = {}): Promise<ZmqRouterServer> {
    if (typeof endpoint !== "string" || endpoint.length === 0) {
      throw new EcError("EC_BAD_ENDPOINT", "control endpoint: expected a ZeroMQ endpoint string");
    }
    const log = options.logger ?? silentLogger();
    const base = {
      ...socketOptions(options.heartbeat),
      ...(options.receiveHighWaterMark === undefined
        ? {}
        : { receiveHighWaterMark: options.receiveHighWaterMark }),
      ...(options.sendHighWaterMark === undefined ? {} : { sendHighWaterMark: options.sendHighWaterMark }),
    };
    let zapDomain: string | null = null;
    let sock: Router;
    const curve = options.curve;
    if (curve !== undefined) {
      checkCurveServer(curve);
      const refused = options.onAuthRefused ?? (() => undefined);
      zapDomain = await zap.register(curve.allow, refused, log);
      const domain = zapDomain;
      sock = copyingRouter(
        () =>
          new Router({
            ...base,
            curveServer: true,
            curveSecretKey: curve.secretKey,
            curvePublicKey: curve.publicKey,
            zapDomain: domain,
            zapEnforceDomain: true,
          }),
      );
    } else {
      sock = copyingRouter(() => new Router(base));
    }
    try {
      await sock.bind(endpoint);
    } catch (err) {
      sock.close();
      if (zapDomain !== null) zap.release(zapDomain);
      throw new EcError("EC_BAD_ENDPOINT", `bind ${endpoint}: ${(err as Error).message}`, { cause: err });
    }
    return new ZmqRouterServer(
      sock,
      sock.lastEndpoint ?? endpoint,
      log,
      zapDomain,
      options.onDisconnect,
      options.admit,
      {
        ...(options.maxQueuedReplies === undefined ? {} : { max: options.maxQueuedReplies }),
        ...(options.onReplyDropped === undefined ? {} : { onDrop: options.onReplyDropped }),
      },
    );
  }

  poll(): ControlMessage[] {
    return this.#inbox.splice(0);
  }

  send(identity: Uint8Array, payload: Uint8Array): void {
    this.#out.push([identity, payload]);
  }

  /** Closes the ROUTER. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#out.close();
    this.#sock.close();
    if (this.#zapDomain !== null) zap.release(this.#zapDomain);
  }

  async #loop(): Promise<void> {
    try {
      for await (const [identity, ...frames] of this.#sock) {
        if (identity === undefined) continue;
        if (this.#admit !== null && !this.#admit(identity, this.#inbox.length)) continue;
        this.#inbox.push({ identity, frames });
        this.onMessage?.();
      }
    } catch (err) {
      if (!this.#closed) this.#log.warn({ err: (err as Error).message }, "zmq router receive loop ended");
    }
  }
}

/**
 * One DEALER connected to one producer (EC-CONTRACT 1, 6, 7) with heartbeats and socket monitor
 * events: `onPeerDown` fires on each `disconnect` (a closed connection or a heartbeat timeout),
 * `onPeerUp` on each completed handshake.
 */
export class ZmqDealerClient {
  /** The producer's control endpoint. */
  readonly endpoint: string;
  /** Called when a message arrives. */
  onMessage: (() => void) | null = null;
  /** Called on each `disconnect` (closed connection or heartbeat timeout). */
  onPeerDown: ((why: string) => void) | null = null;
  /** Called on each completed handshake. */
  onPeerUp: (() => void) | null = null;
  readonly #sock: Dealer;
  readonly #inbox: Uint8Array[] = [];
  readonly #out: SendQueue;
  readonly #log: Logger;
  readonly #holdMs: number;
  /** Messages sent before the first handshake, with when (performance.now) they were sent. */
  readonly #held: { payload: Uint8Array; at: number }[] = [];
  /** "connecting": before the first handshake; "up"; "down": after a disconnect. */
  #link: "connecting" | "up" | "down" = "connecting";
  #up = false;
  #closed = false;
  #malformed = 0;
  #dropped = 0;

  constructor(endpoint: string, options: DealerOptions = {}) {
    if (typeof endpoint !== "string" || endpoint.length === 0) {
      throw new EcError("EC_BAD_ENDPOINT", "producer address: expected a ZeroMQ endpoint string");
    }
    this.endpoint = endpoint;
    this.#log = options.logger ?? silentLogger();
    const c = options.curve;
    if (c !== undefined) {
      checkCurveKey("curve.publicKey", c.publicKey);
      checkCurveKey("curve.secretKey", c.secretKey);
      checkCurveKey("curve.serverKey", c.serverKey);
    }
    this.#holdMs = checkIntOption("holdMs", options.holdMs ?? DEALER_HOLD_MS, 0);
    this.#sock = new Dealer({
      ...socketOptions(options.heartbeat),
      // Issue 19: libzmq queues only on a completed connection and drops what it held when that
      // connection goes, and a send never waits: nothing sent while the producer is down reaches
      // its successor on the same address.
      immediate: true,
      sendTimeout: 0,
      ...(c === undefined
        ? {}
        : { curveServerKey: c.serverKey, curvePublicKey: c.publicKey, curveSecretKey: c.secretKey }),
    });
    this.#out = new SendQueue(this.#sock, this.#log);
    this.#out.retryWhile = () => this.#link === "up" && !this.#closed;
    this.#sock.events.on("handshake", () => {
      this.#up = true;
      this.#link = "up";
      this.#flushHeld();
      this.onPeerUp?.();
    });
    this.#sock.events.on("disconnect", () => {
      const was = this.#up;
      this.#up = false;
      // Issue 19: what waits for this peer was meant for it; its successor must never see it.
      if (was) {
        this.#link = "down";
        this.#dropped += this.#out.clear();
      }
      if (!this.#closed) this.onPeerDown?.(was ? "disconnect" : "disconnect before handshake");
    });
    try {
      this.#sock.connect(endpoint);
    } catch (err) {
      this.#sock.close();
      throw new EcError("EC_BAD_ENDPOINT", `connect ${endpoint}: ${(err as Error).message}`, { cause: err });
    }
    void this.#loop();
  }

  /** True between a handshake and the next disconnect. */
  get peerUp(): boolean {
    return this.#up;
  }

  /** Multi-frame messages dropped (a producer only sends single frames). */
  get malformedFrames(): number {
    return this.#malformed;
  }

  /**
   * Queues one message; never blocks or throws. Issue 19 (docs/ec-protocol.md "A restarted
   * producer"): before the first handshake a message waits up to `holdMs`; after the connection
   * went down it is dropped (the session learns of the peer down and asks again elsewhere).
   */
  send(payload: Uint8Array): void {
    if (this.#link === "up") this.#out.push([payload]);
    else if (this.#link === "connecting") this.#held.push({ payload, at: performance.now() });
    else this.#dropped++;
  }

  /** Messages dropped unsent: held past `holdMs`, or queued when the connection went down. */
  get droppedSends(): number {
    return this.#dropped;
  }

  #flushHeld(): void {
    const now = performance.now();
    for (const h of this.#held.splice(0)) {
      if (now - h.at > this.#holdMs) this.#dropped++;
      else this.#out.push([h.payload]);
    }
  }

  /** Drains received messages without blocking. */
  poll(): Uint8Array[] {
    return this.#inbox.splice(0);
  }

  /** Closes the DEALER; no callback fires afterwards. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#out.close();
    this.#sock.close();
  }

  async #loop(): Promise<void> {
    try {
      for await (const frames of this.#sock) {
        if (frames.length !== 1) {
          this.#malformed++;
          // Keep it for the session, which counts and drops it as malformed.
          this.#inbox.push(new Uint8Array(0));
        } else {
          this.#inbox.push(frames[0]!);
        }
        this.onMessage?.();
      }
    } catch (err) {
      if (!this.#closed) this.#log.warn({ err: (err as Error).message }, "zmq dealer receive loop ended");
    }
  }
}
