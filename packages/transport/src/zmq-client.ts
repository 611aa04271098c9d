// The ZeroMQ client (CONTRACT 3): a DEALER per connection.
import type { Registry } from "@tapwire/stats";
import type * as zmq from "zeromq";
import type { ClientConfig } from "./config.js";
import type { Endpoint } from "./endpoint.js";
import { type CallSite, type Failure, TransportError, type TransportErrorCode } from "./errors.js";
import type { ClientMetrics } from "./metrics.js";
import type { RpcClient } from "./options.js";
import { RequestCore, replyOrThrow, State } from "./request.js";
import { isIpv6, loadedZmq, loadZmq, zmqAddress } from "./zmq-loader.js";

const EMPTY_PART = new Uint8Array(0);
const EMPTY: readonly Uint8Array[] = [];

/**
 * Client over a ZeroMQ DEALER (CONTRACT 3). One DEALER per connection: after a timeout or error
 * the DEALER is closed, so a late reply (addressed to its routing id) can never reach a later
 * request; `connect()` makes a new one.
 */
export class ZmqClient implements RpcClient {
  readonly endpoint: string;
  readonly registry: Registry;
  readonly #ep: Endpoint;
  readonly #maxMessageBytes: number;
  readonly #m: ClientMetrics;
  #dealer: zmq.Dealer | null = null;
  #state: State = State.CLOSED;
  #connectPromise: Promise<void> | null = null;
  #connectAbort: ((why: string) => void) | null = null;
  #closeReason = "not connected (call connect() first)";
  /** The peer disconnected while a reply may still be queued; close after delivering it. */
  #lostReason: string | null = null;

  readonly #req: RequestCore;

  constructor(endpoint: string, ep: Endpoint, opts: ClientConfig, metrics: ClientMetrics) {
    this.endpoint = endpoint;
    this.#ep = ep;
    this.registry = opts.registry;
    this.#maxMessageBytes = opts.maxMessageBytes;
    this.#m = metrics;
    this.#req = new RequestCore(endpoint, opts, metrics, this.#onTimeout);
  }

  get connected(): boolean {
    return this.#state === State.OPEN;
  }

  connect(timeoutMs?: number): Promise<void> {
    return this.#req.connect(this.#state, this.#connectPromise, timeoutMs, this.connect, this.#start);
  }

  /** Starts a connection attempt (none under way) of at most `ms`, failing with `site`'s stack. */
  readonly #start = (ms: number, site: CallSite): Promise<void> => {
    const z = loadedZmq();
    if (z === null) return this.#loadThenConnect(ms, site);
    this.#state = State.CONNECTING;
    const p = new Promise<void>((resolve, reject) => {
      const d = new z.Dealer({
        linger: 0,
        // ZMQ_MAXMSGSIZE: libzmq drops a connection announcing a bigger frame before reading it.
        maxMessageSize: this.#maxMessageBytes,
        ipv6: isIpv6(this.#ep),
        // Not ZMQ_IMMEDIATE: with it libzmq drops a reply still queued when the peer disconnects
        // right after answering (a server closing gracefully). connect() waits for the handshake instead.
      });
      let done = false;
      const finish = (err: Error | null): void => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        this.#connectPromise = null;
        this.#connectAbort = null;
        if (err !== null) {
          d.close();
          this.#state = State.CLOSED;
          reject(err);
          return;
        }
        this.#dealer = d;
        this.#state = State.OPEN;
        this.#lostReason = null;
        this.#m.connects.inc();
        this.#armReceive(d);
        resolve();
      };
      const timer = setTimeout(
        () => finish(site.error("TRANSPORT_CONNECT", `connect to ${this.endpoint} timed out after ${ms} ms`)),
        ms,
      );
      this.#connectAbort = (why) => finish(site.error("TRANSPORT_CLOSED", why));
      d.events.on("handshake", () => finish(null));
      const lost = (why: string) => (): void => {
        if (!done || this.#dealer !== d) return;
        const reason = `connection to ${this.endpoint} ${why}`;
        if (!this.#req.pending) {
          this.#drop(reason);
          return;
        }
        // The monitor event can overtake a reply already queued in the DEALER (a server that
        // answers and then closes): let that reply through, then close.
        this.#lostReason = reason;
        setImmediate(() => {
          if (this.#dealer === d && this.#req.pending && !d.readable) this.#drop(reason);
        });
      };
      d.events.on("disconnect", lost("closed by peer"));
      d.events.on("handshake:error:protocol", lost("failed: ZMTP protocol error"));
      d.events.on("handshake:error:other", lost("failed: handshake error"));
      try {
        d.connect(zmqAddress(this.#ep));
      } catch (e) {
        finish(
          site.error("TRANSPORT_CONNECT", `connect to ${this.endpoint} failed: ${(e as Error).message}`, e),
        );
      }
    });
    this.#connectPromise = p;
    return p;
  };

  /**
   * The first connect of a process loads zeromq (an optional peer dependency, issue 15) and
   * then connects; `close()` meanwhile rejects it with TRANSPORT_CLOSED.
   */
  #loadThenConnect(ms: number, site: CallSite): Promise<void> {
    const p = new Promise<void>((resolve, reject) => {
      let aborted = false;
      this.#connectAbort = (why) => {
        aborted = true;
        this.#connectPromise = null;
        this.#connectAbort = null;
        reject(site.error("TRANSPORT_CLOSED", why));
      };
      loadZmq().then(
        () => {
          if (aborted) return;
          this.#connectPromise = null;
          this.#connectAbort = null;
          this.connect(ms).then(resolve, reject);
        },
        (e: unknown) => {
          if (aborted) return;
          this.#connectPromise = null;
          this.#connectAbort = null;
          reject(e);
        },
      );
    });
    this.#connectPromise = p;
    return p;
  }

  /** Keeps one receive outstanding for the DEALER's lifetime, so unsolicited replies are seen. */
  #armReceive(d: zmq.Dealer): void {
    d.receive().then(
      (frames) => {
        if (this.#dealer !== d) return;
        this.#onMessage(frames);
        if (this.#dealer === d) this.#armReceive(d);
      },
      () => {
        if (this.#dealer === d) this.#drop(`connection to ${this.endpoint} failed while receiving`);
      },
    );
  }

  #onMessage(frames: Buffer[]): void {
    if (!this.#req.pending) {
      // CONTRACT 3: one reply per request; this is a duplicate or late one.
      this.#drop(`closed: ${this.endpoint} sent a message with no request outstanding`);
      return;
    }
    let total = 0;
    for (const f of frames) total += f.length;
    if (total > this.#maxMessageBytes) {
      this.#fail(
        "TRANSPORT_TOO_LARGE",
        `reply length ${total} above maxMessageBytes ${this.#maxMessageBytes}`,
        "closed after an oversized reply",
      );
      return;
    }
    const out = this.#req.replyBuf;
    if (total > out.length) {
      this.#fail(
        "TRANSPORT_REPLY_TOO_LARGE",
        `reply of ${total} bytes does not fit replyBuf of ${out.length} bytes`,
        "closed after a reply larger than replyBuf",
      );
      return;
    }
    let off = 0;
    for (const f of frames) {
      out.set(f, off);
      off += f.length;
    }
    const settle = this.#req.take();
    if (this.#lostReason !== null) this.#drop(this.#lostReason);
    if (settle !== null) this.#req.reply(settle, total, total);
  }

  async request(msg: Uint8Array, replyBuf: Uint8Array, timeoutMs: number): Promise<number> {
    return replyOrThrow(await this.#send(msg, EMPTY, replyBuf, timeoutMs));
  }

  async requestParts(parts: readonly Uint8Array[], replyBuf: Uint8Array, timeoutMs: number): Promise<number> {
    return replyOrThrow(await this.#send(null, parts, replyBuf, timeoutMs));
  }

  #send(
    msg: Uint8Array | null,
    parts: readonly Uint8Array[],
    replyBuf: Uint8Array,
    timeoutMs: number,
  ): Promise<number | Failure> {
    // Runs inside the caller's async frame: errors thrown here already name the caller.
    const d = this.#dealer;
    const total = this.#req.admit(
      msg,
      parts,
      replyBuf,
      timeoutMs,
      this.#state === State.OPEN && d !== null,
      this.#closeReason,
    );
    if (d === null) throw new TransportError("TRANSPORT_CLOSED", `${this.endpoint}: ${this.#closeReason}`);
    const reply = this.#req.begin(replyBuf);
    // CONTRACT 3: a multipart message is the concatenation of its parts.
    const out = msg !== null ? msg : parts.length === 0 ? EMPTY_PART : parts.length === 1 ? parts[0] : parts;
    d.send(out as zmq.MessageLike | zmq.MessageLike[]).then(
      () => this.#m.bytesOut.inc(total),
      (e: unknown) => {
        if (this.#dealer === d) this.#drop(`send to ${this.endpoint} failed: ${(e as Error).message}`);
      },
    );
    return reply;
  }

  readonly #onTimeout = (): void => {
    this.#fail(
      "TRANSPORT_TIMEOUT",
      `no reply from ${this.endpoint} within ${this.#req.timeoutMs} ms`,
      "closed after a request timed out",
    );
  };

  #fail(code: TransportErrorCode, why: string, closeReason: string): void {
    const settle = this.#req.take();
    const d = this.#dealer;
    this.#dealer = null;
    if (this.#state !== State.CONNECTING) this.#state = State.CLOSED;
    this.#closeReason = closeReason;
    // The pending receive rejects on close; armReceive ignores it (dealer no longer current).
    if (d !== null) d.close();
    this.#req.failure(settle, code, why, undefined);
  }

  #drop(why: string): void {
    this.#fail("TRANSPORT_CLOSED", why, why);
  }

  close(): void {
    if (this.#connectAbort !== null) this.#connectAbort(`connect to ${this.endpoint} interrupted by close()`);
    this.#fail(
      "TRANSPORT_CLOSED",
      `request to ${this.endpoint} interrupted by close()`,
      "closed by close() (call connect() again)",
    );
  }
}
