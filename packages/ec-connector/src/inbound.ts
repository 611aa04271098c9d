import type { Registry } from "@tapwire/stats";
import { checkIntOption } from "./errors.js";

/**
 * Issue 19: global bounds on what the producer's control ROUTER takes in, whatever the number of
 * peers (EC-CONTRACT 9: what one peer, or many, can make the producer hold is bounded).
 *
 * - libzmq queues per peer: `receiveHighWaterMark` messages in, `sendHighWaterMark` replies out
 *   (a ROUTER drops replies to a peer at its mark: a peer that never reads costs at most that).
 * - `maxPeers` peers (ROUTER routing ids) are served at once; a request from a peer beyond it is
 *   dropped, unanswered, and counted. A peer is forgotten after `peerIdleMs` without a message.
 * - `maxQueued` messages wait for a producer step at most, and `maxQueued` replies for the socket;
 *   more are dropped and counted.
 */
export const INBOUND_DEFAULTS = {
  receiveHighWaterMark: 64,
  sendHighWaterMark: 64,
  maxPeers: 1024,
  maxQueued: 4096,
  peerIdleMs: 10_000,
} as const;

/** Options of {@link InboundGate} (and `EcProducerOptions.inbound`). */
export interface InboundLimits {
  /** ZMQ_RCVHWM of the control ROUTER: messages queued per peer (default 64). */
  receiveHighWaterMark?: number;
  /** ZMQ_SNDHWM of the control ROUTER: replies queued per peer (default 64). */
  sendHighWaterMark?: number;
  /** Peers served at once (default 1024). */
  maxPeers?: number;
  /** Messages waiting for a step (default 4096). */
  maxQueued?: number;
  /** A peer without a message this long no longer counts against `maxPeers` (default 10 000 ms). */
  peerIdleMs?: number;
}

/** Validated {@link InboundLimits} (throws `EC_BAD_OPTION` naming the bad one). */
export function inboundLimits(o: InboundLimits = {}): Required<InboundLimits> {
  const d = INBOUND_DEFAULTS;
  return {
    receiveHighWaterMark: checkIntOption(
      "inbound.receiveHighWaterMark",
      o.receiveHighWaterMark ?? d.receiveHighWaterMark,
      1,
      1_000_000,
    ),
    sendHighWaterMark: checkIntOption(
      "inbound.sendHighWaterMark",
      o.sendHighWaterMark ?? d.sendHighWaterMark,
      1,
      1_000_000,
    ),
    maxPeers: checkIntOption("inbound.maxPeers", o.maxPeers ?? d.maxPeers, 1),
    maxQueued: checkIntOption("inbound.maxQueued", o.maxQueued ?? d.maxQueued, 1),
    peerIdleMs: checkIntOption("inbound.peerIdleMs", o.peerIdleMs ?? d.peerIdleMs, 1),
  };
}

/** Why {@link InboundGate.admit} refused a message. */
export type InboundDrop = "peers" | "queue";

/**
 * Admits or drops each message the ROUTER received, before it is queued for a step: the peer cap
 * and the queue cap of {@link INBOUND_DEFAULTS}. Drops are counted in
 * `producer_control_dropped_peers` and `producer_control_dropped_queue`.
 */
export class InboundGate {
  readonly #limits: Required<InboundLimits>;
  readonly #now: () => number;
  readonly #peers = new Map<string, number>();
  readonly #dropped: Record<InboundDrop, { inc(): void }>;
  readonly #replies: { inc(): void };
  #nextSweep = 0;

  constructor(
    limits: Required<InboundLimits>,
    registry: Registry,
    now: () => number = () => performance.now(),
  ) {
    this.#limits = limits;
    this.#now = now;
    this.#dropped = {
      peers: registry.counter(
        "producer_control_dropped_peers",
        "control messages dropped unanswered: from a peer beyond inbound.maxPeers (issue 19)",
      ),
      queue: registry.counter(
        "producer_control_dropped_queue",
        "control messages dropped unanswered: inbound.maxQueued already waiting for a step (issue 19)",
      ),
    };
    this.#replies = registry.counter(
      "producer_control_replies_dropped",
      "replies dropped: inbound.maxQueued already waiting for the control socket (issue 19)",
    );
  }

  /** Counts a reply dropped because `maxQueued` replies already wait for the socket. */
  replyDropped(): void {
    this.#replies.inc();
  }

  /** Peers currently counted against `maxPeers`. */
  get peers(): number {
    return this.#peers.size;
  }

  /** True to queue a message from `identity` with `queued` already waiting; false: dropped, counted. */
  admit(identity: Uint8Array, queued: number): boolean {
    if (queued >= this.#limits.maxQueued) return this.#drop("queue");
    const key = Buffer.from(identity.buffer, identity.byteOffset, identity.byteLength).toString("latin1");
    const now = this.#now();
    if (this.#peers.has(key)) {
      // re-insert: the Map stays in last-seen order, so the sweep stops at the first live peer
      this.#peers.delete(key);
      this.#peers.set(key, now);
      return true;
    }
    if (this.#peers.size >= this.#limits.maxPeers) {
      if (now >= this.#nextSweep) this.#sweep(now);
      if (this.#peers.size >= this.#limits.maxPeers) return this.#drop("peers");
    }
    this.#peers.set(key, now);
    return true;
  }

  #sweep(now: number): void {
    this.#nextSweep = now + Math.min(1000, this.#limits.peerIdleMs / 4);
    for (const [key, at] of this.#peers) {
      if (now - at < this.#limits.peerIdleMs) break;
      this.#peers.delete(key);
    }
  }

  #drop(why: InboundDrop): false {
    this.#dropped[why].inc();
    return false;
  }
}
