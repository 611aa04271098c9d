import type { Registry } from "@tapwire/stats";
import type { Logger } from "pino";
import type { EmbeddingCache } from "./cache.js";
import type { DataTransport, XferRequestAnswer } from "./data/transport.js";
import { checkFunctionOption, checkIntOption, checkNumberOption, EcError } from "./errors.js";
import type { ProducerMetrics } from "./metrics.js";
import { defaultRegistry, producerMetrics, silentLogger } from "./metrics.js";
import type { XferAck, XferReq } from "./protocol.js";
import {
  EC_CONNECTOR_VERSION,
  EXPECTED_NACKS,
  encodeXferAck,
  int,
  MAX_CONTROL_MESSAGE_BYTES,
  nackAck,
  optionalXferId,
  str,
  unpackMap,
  XFER_STATUS_NAMES,
  XferStatus,
} from "./protocol.js";
import { fastDecodeXferReq } from "./xfer-codec.js";

/**
 * Defaults of {@link ProducerSession}: EC-CONTRACT 4.2 `pin_lease_s` = 30 s; EC-CONTRACT 9.2
 * `max_pinned_blocks_per_peer` = a quarter of the cache (per ZeroMQ peer and per `session_id`),
 * `max_pinned_fraction` = 3/4.
 */
export const PRODUCER_DEFAULTS = {
  pinLeaseMs: 30_000,
  pinnedPerPeerFraction: 0.25,
  maxPinnedFraction: 0.75,
} as const;

/** One message received on the producer's ROUTER: the peer identity and the frames after it. */
export interface ControlMessage {
  /** The ROUTER identity frame of the sender. */
  identity: Uint8Array;
  /** The message frames after the identity (a valid request has exactly one). */
  frames: Uint8Array[];
}

/** The producer's control socket as the session sees it (a ZeroMQ ROUTER, or a fake in tests). */
export interface ControlServer {
  /** The bound endpoint. */
  readonly endpoint: string;
  /** Drains received messages without blocking. */
  poll(): ControlMessage[];
  /** Queues one single-frame message to `identity`. Never blocks or throws. */
  send(identity: Uint8Array, payload: Uint8Array): void;
  /** Closes the socket. */
  close(): Promise<void>;
}

/**
 * An admin request (a map whose `op` key is a string, served on the producer's admin socket, never
 * on the control ROUTER: EC-CONTRACT 9.3; see docs/ec-protocol.md). Return the reply map, or
 * `null` to answer nothing.
 */
export type AdminHandler = (op: string, msg: Record<string, unknown>) => Record<string, unknown> | null;

/** One grant (EC-CONTRACT 4.2). */
interface Grant {
  mmHash: string;
  blocks: readonly number[];
  deadline: number;
  /** The ZeroMQ peer (routing id, hex) and session that hold it (EC-CONTRACT 9.2 quotas). */
  peer: string;
  sessionId: string;
  /** When it was granted (this session's clock, ms). */
  at: number;
}

/** Options of {@link ProducerSession}. */
export interface ProducerSessionOptions {
  /** The ROUTER (or a fake in tests). */
  control: ControlServer;
  /** The data plane that serves and enforces grants (EC-CONTRACT 5.3). */
  data: DataTransport;
  /** The producer's cache; grants pin its entries. */
  cache: EmbeddingCache;
  /** This producer's compatibility hash (EC-CONTRACT 2). */
  compatibilityHash: string;
  /** Grant lease (default 30 000 ms, EC-CONTRACT 4.2). */
  pinLeaseMs?: number;
  /** Monotonic clock in ms (default `performance.now`). */
  now?: () => number;
  /**
   * Called for a request whose mm_hash has no entry. Return true if the entry now exists (an encode
   * started): the request is answered NACK_NOT_READY (retryable) instead of NACK_MISSING.
   */
  onMiss?: (mmHash: string) => boolean;
  /**
   * EC-CONTRACT 9.2 `max_pinned_blocks_per_peer`: blocks pinned for one ZeroMQ peer, and for one
   * `session_id`, at most (default a quarter of the cache, at least 1).
   */
  maxPinnedBlocksPerPeer?: number;
  /** EC-CONTRACT 9.2 `max_pinned_fraction`: grants never pin more than this share of the cache (default 0.75). */
  maxPinnedFraction?: number;
  /**
   * docs/ec-protocol.md 3.5: take XferReqs as XFER_REQ frames on the data connections when the data
   * transport can (default true; the session sets the transport's `onXferRequest`). `false`: the
   * producer neither offers nor accepts them (a 1.1 data server).
   */
  dataRequests?: boolean;
  /** Where the `producer_*` metrics go (default: a fresh Registry). */
  registry?: Registry;
  /** pino logger (default: silent). */
  logger?: Logger;
}

/**
 * EC-CONTRACT 4: the producer's session. `pollStep()` (once per engine step, never blocking)
 * drains the ROUTER and grants or NACKs each request, drains data-plane notifications, and sweeps
 * leases. Every pin it takes is released exactly once (4.5).
 */
export class ProducerSession {
  readonly #control: ControlServer;
  readonly #data: DataTransport;
  readonly #cache: EmbeddingCache;
  readonly #compat: string;
  readonly #lease: number;
  readonly #now: () => number;
  readonly #onMiss: ((mmHash: string) => boolean) | undefined;
  readonly #maxPerPeer: number;
  readonly #maxPinned: number;
  readonly #peerBlocks = new Map<string, number>();
  readonly #sessionBlocks = new Map<string, number>();
  readonly #m: ProducerMetrics;
  readonly #log: Logger;
  readonly #grants = new Map<string, Grant>();
  readonly #decoder = new TextDecoder("utf-8", { fatal: true });
  #closed = false;
  #lastEvictions: number;
  /** docs/ec-protocol.md 3.5: XFER_REQ frames are taken (and `data_req` offered). */
  readonly #dataReq: boolean;
  /** A microtask will update the gauges (after a data request's answer left). */
  #gaugesQueued = false;

  constructor(options: ProducerSessionOptions) {
    for (const k of ["control", "data", "cache"] as const) {
      if (options[k] === null || typeof options[k] !== "object") {
        throw new EcError("EC_BAD_OPTION", `option ${k}: expected an object`);
      }
    }
    if (typeof options.compatibilityHash !== "string") {
      throw new EcError("EC_BAD_OPTION", "option compatibilityHash: expected a string");
    }
    this.#control = options.control;
    this.#data = options.data;
    this.#cache = options.cache;
    this.#compat = options.compatibilityHash;
    this.#lease = checkNumberOption("pinLeaseMs", options.pinLeaseMs ?? PRODUCER_DEFAULTS.pinLeaseMs, 0);
    checkFunctionOption("now", options.now);
    checkFunctionOption("onMiss", options.onMiss);
    const n = this.#cache.numBlocks;
    this.#maxPerPeer = checkIntOption(
      "maxPinnedBlocksPerPeer",
      options.maxPinnedBlocksPerPeer ?? Math.max(1, Math.floor(n * PRODUCER_DEFAULTS.pinnedPerPeerFraction)),
      1,
    );
    const fraction = checkNumberOption(
      "maxPinnedFraction",
      options.maxPinnedFraction ?? PRODUCER_DEFAULTS.maxPinnedFraction,
      0,
      1,
    );
    this.#maxPinned = Math.floor(n * fraction);
    this.#now = options.now ?? (() => performance.now());
    this.#onMiss = options.onMiss;
    this.#m = producerMetrics(options.registry ?? defaultRegistry());
    this.#log = options.logger ?? silentLogger();
    this.#m.freeBlocks.set(this.#cache.freeBlocks);
    this.#lastEvictions = this.#cache.evictions;
    if (options.dataRequests !== undefined && typeof options.dataRequests !== "boolean") {
      throw new EcError("EC_BAD_OPTION", "option dataRequests: expected a boolean");
    }
    this.#dataReq =
      options.dataRequests !== false &&
      this.#data.dataRequests === true &&
      this.#data.readAhead === true &&
      this.#data.ackAhead === true &&
      "onXferRequest" in this.#data;
    if (this.#dataReq) this.#data.onXferRequest = (req, peer) => this.handleDataRequest(req, peer);
  }

  /**
   * docs/ec-protocol.md 3.5: one XFER_REQ from a data connection (`peer` labels the connection for
   * the 9.2 quotas), handled when it arrives: the notifications that came before it are drained
   * first (the previous read of the key, usually in the same segment, completes its grant), then
   * the request is decoded, validated, pinned and granted exactly as a control-plane XferReq
   * (EC-CONTRACT 3, 4.2, 9.1, 9.2). Returns the ack for the data server to send on that connection;
   * throws `EC_MALFORMED` (counted) for a malformed request or an admin map (9.3).
   */
  handleDataRequest(raw: Uint8Array, peer: string): XferRequestAnswer {
    if (this.#closed) throw new EcError("EC_CLOSED", "producer session: closed");
    const now = this.#now();
    this.#drainNotifs();
    let req: XferReq;
    try {
      // Issue 23: the canonical request on the fast path (xfer-codec.ts: only the contract's keys,
      // so never an admin map); anything else through the strict decoder, as before.
      const fast = fastDecodeXferReq(raw);
      if (fast !== null) req = fast;
      else {
        const m = unpackMap(raw, "XferReq");
        if (typeof m["op"] === "string") {
          this.#m.adminRefused.inc();
          throw new EcError("EC_MALFORMED", "admin request on a data connection");
        }
        req = parseXferReq(m);
      }
    } catch (err) {
      this.#m.malformed.inc();
      this.#log.warn({ err: (err as Error).message }, "dropped malformed XFER_REQ; closing its connection");
      throw err;
    }
    this.#m.dataRequests.inc();
    const { ack, bytes } = this.#answer(req, peer, now);
    if (ack.status === XferStatus.OK) {
      this.#m.grants.inc();
      this.#m.dataAcks.inc();
    } else this.#m.nacks[ack.status]?.inc();
    // Issue 23 item 1: the gauges (pinned blocks walks the cache) after the data server's first
    // write of this answer, not before it: a microtask runs once the data callback has returned.
    if (!this.#gaugesQueued) {
      this.#gaugesQueued = true;
      queueMicrotask(() => {
        this.#gaugesQueued = false;
        if (!this.#closed) this.#gauges();
      });
    }
    return { ack: bytes, ok: ack.status === XferStatus.OK, key: `${req.sessionId}:${req.mmHash}` };
  }

  /** The bound control endpoint. */
  get endpoint(): string {
    return this.#control.endpoint;
  }

  /** Number of live grants. */
  get grantCount(): number {
    return this.#grants.size;
  }

  /** EC-CONTRACT 4.1: drains the control socket and processes what arrived. Never blocks or throws. */
  pollStep(): void {
    if (this.#closed) return;
    this.poll(this.#control.poll());
  }

  /** Processes `messages` (from the ROUTER), drains notifications (4.3) and sweeps leases (4.4). */
  poll(messages: readonly ControlMessage[]): void {
    if (this.#closed) return;
    const now = this.#now();
    for (const msg of messages) {
      let reply: Uint8Array | null;
      try {
        reply = this.#handle(msg, now);
      } catch (err) {
        // EC-CONTRACT 3: malformed → dropped, counted, logged; nothing is sent back.
        this.#m.malformed.inc();
        this.#log.warn({ err: (err as Error).message }, "dropped malformed control message");
        continue;
      }
      if (reply !== null) this.#control.send(msg.identity, reply);
    }
    this.#drainNotifs();
    this.#sweep(now);
    this.#gauges();
  }

  /** EC-CONTRACT 4.5: unpins every grant and closes the ROUTER. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#dataReq) this.#data.onXferRequest = null;
    for (const [key, g] of this.#grants) this.#end(key, g);
    this.#grants.clear();
    this.#gauges();
    await this.#control.close();
  }

  #handle(msg: ControlMessage, now: number): Uint8Array | null {
    if (msg.frames.length !== 1)
      throw new EcError("EC_MALFORMED", `control message with ${msg.frames.length} frames`);
    let req = fastDecodeXferReq(msg.frames[0]!);
    if (req === null) {
      const m = unpackMap(msg.frames[0]!, "XferReq");
      if (typeof m["op"] === "string") {
        // EC-CONTRACT 9.3: admin is served on its own socket, never here. Dropped, answered nothing.
        this.#m.adminRefused.inc();
        this.#log.warn({ op: m["op"] }, "admin request on the control socket refused");
        return null;
      }
      req = parseXferReq(m);
    }
    const { ack, bytes } = this.#answer(req, Buffer.from(msg.identity).toString("hex"), now);
    // 3.3: READ_AHEADs of this grant that asked for the ACK frame get these bytes (those waiting
    // are served now). When one was, the ack is on its way on the data plane: no control-plane
    // copy (one ZeroMQ send, and two I/O-thread wakeups, fewer on the transfer's path).
    if (ack.status === XferStatus.OK && ack.ackAhead === true) {
      const delivered = this.#data.grantAck?.(`${req.sessionId}:${req.mmHash}`, bytes) === true;
      if (delivered) {
        this.#m.grants.inc();
        this.#m.dataAcks.inc();
        return null;
      }
    }
    if (ack.status === XferStatus.OK) this.#m.grants.inc();
    else this.#m.nacks[ack.status]?.inc();
    return bytes;
  }

  /**
   * The ack of one request (either plane): EC-CONTRACT 4.2's grant or NACK, with `xfer_id` echoed
   * (3.3), turned into NACK_INTERNAL when it would pass the 64 KiB control limit (9.1).
   */
  #answer(req: XferReq, peer: string, now: number): { ack: XferAck; bytes: Uint8Array } {
    this.#m.requests.inc();
    // 3.3: a producer that offers ack-ahead echoes xfer_id in every ack (OK or NACK).
    const echo = this.#data.ackAhead === true && req.xferId !== undefined ? { xferId: req.xferId } : {};
    let ack: XferAck = { ...this.#grantOrNack(req, peer, now), ...echo };
    let bytes = encodeXferAck(ack);
    if (ack.status === XferStatus.OK && bytes.length > MAX_CONTROL_MESSAGE_BYTES) {
      // EC-CONTRACT 9.1: the consumer's socket would drop an ack over 64 KiB (an entry of more
      // than ~13 000 blocks): end the grant and answer a terminal NACK instead of retrying forever.
      const key = `${req.sessionId}:${req.mmHash}`;
      const g = this.#grants.get(key);
      if (g !== undefined) {
        this.#grants.delete(key);
        this.#end(key, g);
      }
      this.#log.warn(
        { mmHash: req.mmHash, blocks: ack.srcBlockIndices.length, bytes: bytes.length },
        "ack over the 64 KiB control-message limit; NACK_INTERNAL",
      );
      ack = { ...nackAck(req.mmHash, XferStatus.NACK_INTERNAL), ...echo };
      bytes = encodeXferAck(ack);
    }
    return { ack, bytes };
  }

  /** EC-CONTRACT 4.2, in order: version → hash → session id → pin_if_ready. */
  #grantOrNack(req: XferReq, peer: string, now: number): XferAck {
    const h = req.mmHash;
    if (req.connectorVersion !== EC_CONNECTOR_VERSION) {
      this.#log.warn({ mmHash: h, version: req.connectorVersion }, "incompatible connector version");
      return nackAck(h, XferStatus.NACK_VERSION);
    }
    if (req.compatibilityHash !== this.#compat) {
      this.#log.warn({ mmHash: h }, "incompatible compatibility hash");
      return nackAck(h, XferStatus.NACK_INCOMPAT);
    }
    // Grants are keyed "session_id:mm_hash": an empty id would alias two consumers, and a ':' in the
    // id would let "a:b"+"c" alias "a"+"b:c".
    if (req.sessionId.length === 0 || req.sessionId.includes(":")) {
      this.#log.warn({ mmHash: h }, "XferReq without a usable session_id");
      return nackAck(h, XferStatus.NACK_INTERNAL);
    }
    let entry = this.#cache.pinIfReady(h);
    if (entry === undefined && this.#onMiss !== undefined) {
      let started = false;
      try {
        started = this.#onMiss(h) === true;
      } catch (err) {
        this.#log.warn({ err, mmHash: h }, "onMiss failed");
      }
      if (started) entry = this.#cache.pinIfReady(h);
    }
    if (entry === undefined || !entry.ready) {
      const status = entry === undefined ? XferStatus.NACK_MISSING : XferStatus.NACK_NOT_READY;
      this.#log[EXPECTED_NACKS.has(status) ? "info" : "warn"](
        { mmHash: h },
        `not serveable: ${XFER_STATUS_NAMES[status]}`,
      );
      return nackAck(h, status);
    }
    const key = `${req.sessionId}:${h}`;
    const old = this.#grants.get(key);
    if (old !== undefined) {
      // The consumer timed out waiting and asked again: release the old pin first (the seed's fix).
      this.#m.regrants.inc();
      this.#grants.delete(key);
      this.#end(key, old);
    }
    const quota = this.#quotaProblem(
      peer,
      req.sessionId,
      entry.blocks.length,
      (this.#cache.get(h)?.pins ?? 0) > 1,
    );
    if (quota !== null) {
      // EC-CONTRACT 9.2: retryable, so the consumer tries again within its deadline.
      this.#cache.unpin(h);
      this.#m.grantsRefusedQuota.inc();
      this.#log.info({ mmHash: h, peer, quota }, "grant refused: pin quota");
      return nackAck(h, XferStatus.NACK_NOT_READY);
    }
    const grant: Grant = {
      mmHash: h,
      blocks: entry.blocks,
      deadline: now + this.#lease,
      peer,
      sessionId: req.sessionId,
      at: now,
    };
    try {
      this.#data.grant(key, grant.blocks, grant.deadline, entry.nbytes);
    } catch (err) {
      this.#cache.unpin(h);
      this.#log.warn({ err, mmHash: h }, "data-plane grant failed");
      return nackAck(h, XferStatus.NACK_INTERNAL);
    }
    this.#grants.set(key, grant);
    this.#charge(grant, 1);
    this.#log.debug({ mmHash: h, key, blocks: grant.blocks.length }, "granted");
    return {
      mmHash: h,
      status: XferStatus.OK,
      sessionId: req.sessionId,
      srcBlockIndices: [...grant.blocks],
      agentMetadata: this.#data.getAgentMetadata(),
      memDescriptor: this.#data.getMemDescriptor(),
      nbytes: entry.nbytes,
      crc32: entry.crc32 ?? 0,
      // docs/ec-protocol.md 3.2: offered only to a consumer that asked (a 1.1 one never sees it).
      ...(req.readAhead === true && this.#data.readAhead === true ? { readAhead: true } : {}),
      // 3.3: offered only to a consumer that asked for both (a 1.1 one never sees it).
      ...(req.readAhead === true &&
      req.ackAhead === true &&
      this.#data.readAhead === true &&
      this.#data.ackAhead === true &&
      typeof this.#data.grantAck === "function"
        ? { ackAhead: true }
        : {}),
      // 3.5: offered only to a consumer that asked for it with ack-ahead (a 1.1 one never sees it).
      ...(req.readAhead === true && req.ackAhead === true && req.dataReq === true && this.#dataReq
        ? { dataReq: true }
        : {}),
    };
  }

  /** EC-CONTRACT 4.3: a notification "{session_id}:{mm_hash}" completes that grant. */
  #drainNotifs(): void {
    let notifs: Map<string, Uint8Array[]>;
    try {
      notifs = this.#data.getNewNotifs();
    } catch (err) {
      this.#log.warn({ err }, "getNewNotifs failed");
      return;
    }
    for (const msgs of notifs.values()) {
      for (const msg of msgs) {
        let key: string;
        try {
          key = this.#decoder.decode(msg);
        } catch {
          this.#m.unknownNotifs.inc();
          continue;
        }
        const g = this.#grants.get(key);
        if (g === undefined) {
          this.#m.unknownNotifs.inc();
          this.#log.debug({ key }, "notification for no live grant");
          continue;
        }
        this.#grants.delete(key);
        this.#end(key, g);
        this.#m.completions.inc();
        this.#m.grantSeconds.observe(Math.max(0, this.#now() - g.at) / 1000);
      }
    }
  }

  /** EC-CONTRACT 4.4: grants past their lease are revoked and unpinned. */
  #sweep(now: number): void {
    for (const [key, g] of this.#grants) {
      if (now > g.deadline) {
        this.#grants.delete(key);
        this.#end(key, g);
        this.#m.leaseExpiries.inc();
        this.#log.warn(
          { mmHash: g.mmHash, key },
          "consumer did not complete the read within the pin lease; unpinned",
        );
      }
    }
  }

  /**
   * EC-CONTRACT 9.2: which quota a grant of `blocks` more for this peer and session would break,
   * or `null`. `shared`: the entry was pinned already (by another grant), so the cache-wide
   * pinned count does not grow.
   */
  #quotaProblem(peer: string, sessionId: string, blocks: number, shared: boolean): string | null {
    // A peer (or session) holding nothing may always take one grant: an entry larger than the
    // quota could otherwise never be served. Beyond that one, the quota holds.
    const byPeer = this.#peerBlocks.get(peer) ?? 0;
    if (byPeer > 0 && byPeer + blocks > this.#maxPerPeer) return "max_pinned_blocks_per_peer (peer)";
    const bySession = this.#sessionBlocks.get(sessionId) ?? 0;
    if (bySession > 0 && bySession + blocks > this.#maxPerPeer) return "max_pinned_blocks_per_peer (session)";
    // pinIfReady has pinned the entry already: its blocks are in pinnedBlocks unless shared.
    if (!shared && this.#cache.pinnedBlocks > this.#maxPinned) return "max_pinned_fraction";
    return null;
  }

  #charge(g: Grant, sign: 1 | -1): void {
    for (const [map, k] of [
      [this.#peerBlocks, g.peer],
      [this.#sessionBlocks, g.sessionId],
    ] as const) {
      const v = (map.get(k) ?? 0) + sign * g.blocks.length;
      if (v > 0) map.set(k, v);
      else map.delete(k);
    }
  }

  /** Revokes on the data plane (stopping any stream) before the pin goes: nothing reads unpinned blocks. */
  #end(key: string, g: Grant): void {
    this.#charge(g, -1);
    try {
      this.#data.revoke(key);
    } catch (err) {
      this.#log.warn({ err, key }, "revoke failed");
    }
    this.#cache.unpin(g.mmHash);
  }

  #gauges(): void {
    const ev = this.#cache.evictions;
    if (ev > this.#lastEvictions) this.#m.evictions.inc(ev - this.#lastEvictions);
    this.#lastEvictions = ev;
    this.#m.activeGrants.set(this.#grants.size);
    this.#m.pinnedBlocks.set(this.#cache.pinnedBlocks);
    this.#m.freeBlocks.set(this.#cache.freeBlocks);
    this.#m.cacheEntries.set(this.#cache.size);
  }
}

/** EC-CONTRACT 3: the XferReq fields of a decoded flat map (strict; throws `EC_MALFORMED`). */
function parseXferReq(m: Record<string, unknown>): XferReq {
  return {
    mmHash: str(m, "mm_hash", "XferReq"),
    compatibilityHash: str(m, "compatibility_hash", "XferReq"),
    sessionId: str(m, "session_id", "XferReq"),
    connectorVersion: int(m, "connector_version", "XferReq", Number.MIN_SAFE_INTEGER),
    // docs/ec-protocol.md 3.2: the optional capability key (only the integer 1 means yes).
    ...(m["read_ahead"] === 1 ? { readAhead: true } : {}),
    // docs/ec-protocol.md 3.3: the ack on the data plane, and the request's id.
    ...(m["ack_ahead"] === 1 ? { ackAhead: true } : {}),
    ...optionalXferId(m),
    // docs/ec-protocol.md 3.5: requests on the data connection.
    ...(m["data_req"] === 1 ? { dataReq: true } : {}),
  };
}
