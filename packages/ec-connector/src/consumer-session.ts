// One file over ~500 lines on purpose: the ConsumerXfer state machine of EC-CONTRACT 6.3 (its
// transition table) and the session that drives it; apart, each transition would be read in two places.

import { randomUUID } from "node:crypto";
import type { Registry } from "@tapwire/stats";
import type { Logger } from "pino";
import { sourceRunsMatch } from "./data/source-runs.js";
import type { DataTransport, XferHandle } from "./data/transport.js";
import { checkIntOption, checkNumberOption, EcError } from "./errors.js";
import type { ConsumerMetrics } from "./metrics.js";
import { consumerMetrics, defaultRegistry, silentLogger } from "./metrics.js";
import type { XferAck } from "./protocol.js";
import {
  decodeXferAck,
  EC_CONNECTOR_VERSION,
  EXPECTED_NACKS,
  encodeXferReq,
  RETRYABLE_NACKS,
  XFER_STATUS_NAMES,
  XferStatus,
} from "./protocol.js";

/** EC-CONTRACT 6.3 defaults (ms; the contract's `*_s` values times 1000, vLLM's defaults). */
export const CONSUMER_DEFAULTS = {
  /** `ack_timeout_s` = 2 s. */
  ackTimeoutMs: 2_000,
  /** `read_timeout_s` = 20 s. */
  readTimeoutMs: 20_000,
  /** `quarantine_timeout_s` = 60 s. */
  quarantineTimeoutMs: 60_000,
} as const;

/** How long a READ_AHEAD may wait at the producer for its grant (docs/ec-protocol.md 3.2), ms. */
export const READ_AHEAD_WAIT_MS = 10_000;

/** EC-CONTRACT 6.3: the states of one consumer transfer. */
export const XferState = {
  WAITING_ACK: "WAITING_ACK",
  READING: "READING",
  DONE: "DONE",
  ACK_TIMEOUT: "ACK_TIMEOUT",
  NACKED: "NACKED",
  CANCELLED: "CANCELLED",
  READ_FAILED: "READ_FAILED",
  QUARANTINED: "QUARANTINED",
  SETTLED: "SETTLED",
} as const;
/** One of {@link XferState}. */
export type XferState = (typeof XferState)[keyof typeof XferState];

/** The guarded transitions of EC-CONTRACT 6.3/6.4 (`from` → allowed `to`). */
export const XFER_TRANSITIONS: Readonly<Record<XferState, readonly XferState[]>> = {
  WAITING_ACK: ["READING", "ACK_TIMEOUT", "NACKED", "READ_FAILED", "CANCELLED"],
  READING: ["DONE", "READ_FAILED", "QUARANTINED"],
  QUARANTINED: ["SETTLED", "READ_FAILED"],
  DONE: [],
  ACK_TIMEOUT: [],
  NACKED: [],
  CANCELLED: [],
  READ_FAILED: [],
  SETTLED: [],
};

/** A finished read: promote these blocks (EC-CONTRACT 6.5). */
export interface CompletedXfer {
  /** The embedding's content hash. */
  mmHash: string;
  /** The local blocks holding the bytes, in order. */
  blocks: readonly number[];
  /** Bytes of the embedding (the ack's `nbytes`). */
  nbytes: number;
  /** The ack's CRC-32 (verified unless the check was turned off). */
  crc32: number;
}

/** Blocks the caller takes back, with why. */
export interface XferBlocks {
  /** The embedding's content hash. */
  mmHash: string;
  /** The local blocks of the transfer. */
  blocks: readonly number[];
  /** Why the transfer ended as it did (NACK name, `ack_timeout`, `peer_down`, ...). */
  reason: string;
}

/**
 * EC-CONTRACT 6.5: what happened since the last `takeResults()`. Free the blocks of `tombstoned`,
 * `retryable` and `settled`; promote `completed`; never free `quarantined` (they are reported
 * again in `settled`, `tombstoned` or `retired`); never reuse `retired` blocks (5.2).
 */
export interface ConsumerSessionResults {
  /** Reads DONE with a valid CRC-32: promote their blocks. */
  completed: CompletedXfer[];
  /** Failed for good (non-retryable NACK, read failure, checksum): free their blocks. */
  tombstoned: XferBlocks[];
  /** Newly quarantined reads (mm_hash): never free their blocks until they are reported again. */
  quarantined: string[];
  /** NOT_READY, ack timeout, peer down before the ack: free the blocks or ask again. */
  retryable: XferBlocks[];
  /** Quarantined reads whose handle left PROC: their blocks may now be freed. */
  settled: XferBlocks[];
  /** Released without the no-further-writes guarantee (EC-CONTRACT 5.2): never reuse these blocks. */
  retired: XferBlocks[];
}

/**
 * One transfer's state machine (EC-CONTRACT 6.3). Transitions are guarded: an edge not in
 * {@link XFER_TRANSITIONS} throws (a bug, never a peer's doing).
 */
export class ConsumerXfer {
  /** The embedding's content hash. */
  readonly mmHash: string;
  /** The local blocks the read writes into. */
  readonly localBlocks: readonly number[];
  /** When given, the ack's `nbytes` must equal it (else tombstoned). */
  readonly expectedNbytes: number | undefined;
  /** Current state. */
  state: XferState = XferState.WAITING_ACK;
  /** Deadline (ms) of the current state: ack, read or quarantine. */
  deadline: number;
  /** The data-plane handle while READING or QUARANTINED. */
  handle: XferHandle | null = null;
  /** The OK ack that started the read. */
  ack: XferAck | null = null;
  /** When the read was posted (ms). */
  postedAt = 0;
  /** `handle` is a READ_AHEAD posted with the XferReq (docs/ec-protocol.md 3.2). */
  readAhead = false;
  /** docs/ec-protocol.md 3.3: the `xfer_id` its XferReq carried (undefined: none). */
  xferId: number | undefined = undefined;
  /** docs/ec-protocol.md 3.5: its XferReq went as an XFER_REQ on `handle`'s connection (no ZeroMQ copy). */
  viaData = false;
  /** Why the xfer ended as it did. */
  reason = "";
  readonly #log: Logger;

  constructor(
    mmHash: string,
    localBlocks: readonly number[],
    deadline: number,
    expectedNbytes: number | undefined,
    log: Logger,
  ) {
    this.mmHash = mmHash;
    this.localBlocks = localBlocks;
    this.deadline = deadline;
    this.expectedNbytes = expectedNbytes;
    this.#log = log;
  }

  /** Moves to `to` if the current state is one of `from` and the edge is allowed. */
  transition(from: readonly XferState[], to: XferState, reason = ""): void {
    if (!from.includes(this.state) || !XFER_TRANSITIONS[this.state].includes(to)) {
      throw new EcError("EC_BAD_ARGUMENT", `xfer ${this.mmHash}: illegal transition ${this.state} -> ${to}`);
    }
    this.#log.debug({ mmHash: this.mmHash, reason }, `xfer ${this.state} -> ${to}`);
    this.state = to;
    if (reason !== "") this.reason = reason;
  }
}

/** Options of {@link ConsumerSession}. */
export interface ConsumerSessionOptions {
  /** The producer's control address (for logs and pooling). */
  addr: string;
  /** Sends one control message to the producer (the session's DEALER). Must not throw or block. */
  send: (payload: Uint8Array) => void;
  /** The consumer's data plane over its cache region. */
  data: DataTransport;
  /** This consumer's compatibility hash (EC-CONTRACT 2). */
  compatibilityHash: string;
  /** The local cache's block count (acks with more block indices are malformed) and size. */
  numBlocks: number;
  /** Bytes per local block (an ack's `nbytes` must fill exactly its block count). */
  blockBytes: number;
  /** Read deadline after the post (default 20 000 ms). */
  readTimeoutMs?: number;
  /** Quarantine deadline (default 60 000 ms). */
  quarantineTimeoutMs?: number;
  /** Verify the CRC-32 of every read (default true; EC-CONTRACT 6.3). */
  verifyChecksum?: boolean;
  /** Read-ahead when the producer offers it (default false; docs/ec-protocol.md 3.2). */
  readAhead?: boolean;
  /** With read-ahead: requests on the data connection when the producer offers them (default true; 3.5). */
  dataRequests?: boolean;
  /** Session id (default: a fresh UUID, made once per session). */
  sessionId?: string;
  /** Where the `consumer_*` metrics go (default: a fresh Registry). */
  registry?: Registry;
  /** pino logger (default: silent). */
  logger?: Logger;
}

/**
 * EC-CONTRACT 6: the consumer's long-lived session with one producer. `startXfer` sends XferReqs;
 * `poll(messages, now)` decodes acks, posts reads, advances every transfer and drains the
 * quarantine; `takeResults()` hands back what happened. Nothing raises out of `poll`.
 */
export class ConsumerSession {
  /** The producer address. */
  readonly addr: string;
  /** This session's id (EC-CONTRACT 6.1). */
  readonly sessionId: string;
  readonly #send: (payload: Uint8Array) => void;
  readonly #data: DataTransport;
  readonly #compat: string;
  readonly #numBlocks: number;
  readonly #blockBytes: number;
  readonly #readTimeout: number;
  readonly #quarantineTimeout: number;
  readonly #verify: boolean;
  readonly #aheadWanted: boolean;
  readonly #dataReqWanted: boolean;
  readonly #m: ConsumerMetrics;
  readonly #log: Logger;
  #agentName: string | null = null;
  #agentMeta: Uint8Array | null = null;
  /** The producer's last OK ack offered read-ahead (docs/ec-protocol.md 3.2). */
  #peerAhead = false;
  /** docs/ec-protocol.md 3.3: the last OK ack offered `ack_ahead`. */
  #peerAckAhead = false;
  /** docs/ec-protocol.md 3.3: the next XferReq's `xfer_id` (u32, wraps). */
  #nextXferId = 1;
  /** docs/ec-protocol.md 3.5: the last OK ack offered `data_req`. */
  #peerDataReq = false;
  readonly #xfers = new Map<string, ConsumerXfer>();
  #quarantined: ConsumerXfer[] = [];
  #results: ConsumerSessionResults = emptyResults();
  #closed = false;

  constructor(options: ConsumerSessionOptions) {
    if (typeof options.addr !== "string")
      throw new EcError("EC_BAD_OPTION", "option addr: expected a string");
    if (typeof options.send !== "function")
      throw new EcError("EC_BAD_OPTION", "option send: expected a function");
    if (options.data === null || typeof options.data !== "object") {
      throw new EcError("EC_BAD_OPTION", "option data: expected a DataTransport");
    }
    if (typeof options.compatibilityHash !== "string") {
      throw new EcError("EC_BAD_OPTION", "option compatibilityHash: expected a string");
    }
    this.addr = options.addr;
    this.#send = options.send;
    this.#data = options.data;
    this.#compat = options.compatibilityHash;
    this.#numBlocks = checkIntOption("numBlocks", options.numBlocks, 1);
    this.#blockBytes = checkIntOption("blockBytes", options.blockBytes, 1);
    this.#readTimeout = checkNumberOption(
      "readTimeoutMs",
      options.readTimeoutMs ?? CONSUMER_DEFAULTS.readTimeoutMs,
      0,
    );
    this.#quarantineTimeout = checkNumberOption(
      "quarantineTimeoutMs",
      options.quarantineTimeoutMs ?? CONSUMER_DEFAULTS.quarantineTimeoutMs,
      0,
    );
    if (options.verifyChecksum !== undefined && typeof options.verifyChecksum !== "boolean") {
      throw new EcError("EC_BAD_OPTION", "option verifyChecksum: expected a boolean");
    }
    this.#verify = options.verifyChecksum ?? true;
    if (options.readAhead !== undefined && typeof options.readAhead !== "boolean") {
      throw new EcError("EC_BAD_OPTION", "option readAhead: expected a boolean");
    }
    this.#aheadWanted = options.readAhead ?? false;
    if (options.dataRequests !== undefined && typeof options.dataRequests !== "boolean") {
      throw new EcError("EC_BAD_OPTION", "option dataRequests: expected a boolean");
    }
    this.#dataReqWanted = options.dataRequests ?? true;
    this.sessionId = options.sessionId ?? randomUUID();
    if (typeof this.sessionId !== "string" || this.sessionId.length === 0 || this.sessionId.includes(":")) {
      throw new EcError("EC_BAD_OPTION", "option sessionId: expected a non-empty string without ':'");
    }
    this.#m = consumerMetrics(options.registry ?? defaultRegistry());
    this.#log = (options.logger ?? silentLogger()).child({ producer: this.addr });
  }

  /** The data-plane agent name of the producer, once registered. */
  get agentName(): string | null {
    return this.#agentName;
  }

  /** Number of transfers waiting for an ack or reading. */
  get activeCount(): number {
    return this.#xfers.size;
  }

  /** Number of quarantined transfers. */
  get quarantinedCount(): number {
    return this.#quarantined.length;
  }

  /** The state of the transfer for `mmHash` (active or quarantined), if any. */
  stateOf(mmHash: string): XferState | undefined {
    return this.#xfers.get(mmHash)?.state ?? this.#quarantined.find((x) => x.mmHash === mmHash)?.state;
  }

  /**
   * EC-CONTRACT 6.1: sends an XferReq and tracks a transfer in WAITING_ACK until `ackDeadline` (ms).
   * `expectedNbytes`, when given, must equal the ack's `nbytes`. Throws `EC_BAD_ARGUMENT` if a
   * transfer for `mmHash` is already active or quarantined in this session.
   */
  startXfer(
    mmHash: string,
    localBlocks: readonly number[],
    ackDeadline: number,
    expectedNbytes?: number,
  ): ConsumerXfer {
    if (this.#closed) throw new EcError("EC_CLOSED", `session ${this.addr}: closed`);
    if (this.#xfers.has(mmHash) || this.#quarantined.some((x) => x.mmHash === mmHash)) {
      throw new EcError("EC_BAD_ARGUMENT", `startXfer ${mmHash}: a transfer is already in flight`);
    }
    if (localBlocks.length === 0)
      throw new EcError("EC_BAD_ARGUMENT", `startXfer ${mmHash}: no local blocks`);
    const xfer = new ConsumerXfer(mmHash, [...localBlocks], ackDeadline, expectedNbytes, this.#log);
    this.#xfers.set(mmHash, xfer);
    this.#m.requests.inc();
    const canAhead =
      this.#aheadWanted && this.#data.readAhead === true && typeof this.#data.postReadAhead === "function";
    // docs/ec-protocol.md 3.3: with read-ahead, ask for the ack on the data plane too, naming the
    // request so that a late ack of an earlier request for the same mm_hash is not taken for it.
    const canAck =
      canAhead && this.#data.ackAhead === true && typeof this.#data.takeReadAheadAck === "function";
    if (canAck) {
      xfer.xferId = this.#nextXferId;
      this.#nextXferId = this.#nextXferId >= 0xffff_ffff ? 0 : this.#nextXferId + 1;
    }
    // docs/ec-protocol.md 3.3 (issue 23): with the ack on the data plane the READ_AHEAD goes out
    // first. It waits at the producer for the grant, and the XferReq's ZeroMQ send (which wakes
    // the ZeroMQ I/O thread, and on a busy 2-core host often gives it this thread's core for
    // 100-300 us) no longer delays it. Without 3.3 the read follows the XferReq, as in 3.2.
    const aheadFirst = canAck && this.#peerAckAhead;
    const ahead = canAhead && this.#peerAhead && this.#agentName !== null && expectedNbytes !== undefined;
    // docs/ec-protocol.md 3.5: requests on the data connection, asked for with ack-ahead.
    const canReq =
      canAck &&
      this.#dataReqWanted &&
      this.#data.dataRequests === true &&
      typeof this.#data.postRequest === "function";
    const reqBytes = encodeXferReq({
      mmHash,
      compatibilityHash: this.#compat,
      sessionId: this.sessionId,
      connectorVersion: EC_CONNECTOR_VERSION,
      ...(canAhead ? { readAhead: true } : {}),
      ...(canAck ? { ackAhead: true, xferId: xfer.xferId! } : {}),
      ...(canReq ? { dataReq: true } : {}),
    });
    // 3.5: once the producer offered it, the request itself travels on a data connection (one
    // round trip, no ZeroMQ hop); the control plane stays the fallback (a failed post).
    if (ahead && canReq && this.#peerDataReq && this.#postRequest(xfer, expectedNbytes, reqBytes))
      return xfer;
    if (ahead && aheadFirst) this.#postAhead(xfer, expectedNbytes);
    try {
      this.#send(reqBytes);
    } catch (err) {
      // A failed send is an ack that will never come: the ack deadline retries it.
      this.#log.warn({ err, mmHash }, "XferReq send failed");
    }
    // After the XferReq (the control round trip is the longer leg): the read follows it.
    if (ahead && !aheadFirst) this.#postAhead(xfer, expectedNbytes);
    return xfer;
  }

  /**
   * docs/ec-protocol.md 3.2: the read opened with the XferReq, served by the producer once its grant
   * exists (grant-scoped, EC-CONTRACT 5.3). A failure to post only means the classic read later.
   */
  #postAhead(xfer: ConsumerXfer, nbytes: number): void {
    try {
      xfer.handle = this.#data.postReadAhead!(
        xfer.localBlocks,
        this.#agentName!,
        Buffer.from(`${this.sessionId}:${xfer.mmHash}`),
        {
          nbytes,
          checksum: this.#verify,
          waitMs: READ_AHEAD_WAIT_MS,
          // 3.3: the ACK frame before DATA, once this producer offered it.
          ...(this.#peerAckAhead && xfer.xferId !== undefined ? { ackFirst: true } : {}),
        },
      );
      xfer.readAhead = true;
      this.#m.readAheads.inc();
    } catch (err) {
      this.#log.debug({ err: (err as Error).message, mmHash: xfer.mmHash }, "read-ahead not posted");
      xfer.handle = null;
    }
  }

  /**
   * docs/ec-protocol.md 3.5: the request as an XFER_REQ on a data connection; the producer grants it
   * and answers there (ACK, then DATA). False when it could not be posted (the caller then sends it
   * on the control plane).
   */
  #postRequest(xfer: ConsumerXfer, nbytes: number, request: Uint8Array): boolean {
    try {
      xfer.handle = this.#data.postRequest!(
        xfer.localBlocks,
        this.#agentName!,
        Buffer.from(`${this.sessionId}:${xfer.mmHash}`),
        { nbytes, checksum: this.#verify, request },
      );
    } catch (err) {
      this.#log.debug({ err: (err as Error).message, mmHash: xfer.mmHash }, "XFER_REQ not posted");
      xfer.handle = null;
      return false;
    }
    xfer.readAhead = true;
    xfer.viaData = true;
    this.#m.dataRequests.inc();
    return true;
  }

  /**
   * 3.5: an XFER_REQ whose connection failed before any answer was taken (ERR, no ACK): nothing
   * else will answer it, so it is retryable at once, and the session's next requests go on the
   * control plane until an ack offers `data_req` again. True when it ended the transfer.
   */
  #dataRequestFailed(xfer: ConsumerXfer): boolean {
    let state: string;
    try {
      state = this.#data.checkXferState(xfer.handle!);
    } catch {
      state = "ERR";
    }
    if (state !== "ERR") return false;
    this.#peerDataReq = false;
    this.#m.dataRequestFailures.inc();
    this.#log.info({ mmHash: xfer.mmHash, why: this.#safeError(xfer.handle!) }, "XFER_REQ failed; retrying");
    if (!this.#endAhead(xfer)) return true;
    xfer.transition([XferState.WAITING_ACK], XferState.CANCELLED, "data_request_failed");
    this.#results.retryable.push(blocksOf(xfer));
    return true;
  }

  /**
   * A WAITING_ACK transfer that ends without its read: a read-ahead is released first. When the
   * release cannot promise that no byte lands afterwards (EC-CONTRACT 5.2) the transfer ends
   * READ_FAILED with its blocks retired, and false is returned (the caller then does nothing more).
   */
  #endAhead(xfer: ConsumerXfer): boolean {
    if (xfer.handle === null) return true;
    xfer.readAhead = false;
    if (this.#release(xfer)) return true;
    xfer.transition([XferState.WAITING_ACK], XferState.READ_FAILED, "read_ahead_unreleasable");
    this.#m.blocksRetired.inc(xfer.localBlocks.length);
    this.#results.retired.push(blocksOf(xfer));
    return false;
  }

  /**
   * EC-CONTRACT 6.2: decodes acks (malformed: dropped and counted), dispatches them, advances every
   * transfer (6.3) and drains the quarantine. Never throws.
   */
  poll(messages: readonly Uint8Array[], now: number): void {
    for (const raw of messages) {
      let ack: XferAck;
      try {
        ack = decodeXferAck(raw, this.#numBlocks);
      } catch (err) {
        this.#m.malformed.inc();
        this.#log.warn({ err: (err as Error).message }, "dropped malformed XferAck");
        continue;
      }
      this.#dispatch(ack, now);
    }
    for (const [mmHash, xfer] of this.#xfers) {
      if (xfer.state === XferState.WAITING_ACK && xfer.readAhead) this.#takeDataAck(xfer, now);
      if (xfer.state === XferState.WAITING_ACK && xfer.viaData && xfer.handle !== null) {
        if (this.#dataRequestFailed(xfer)) {
          this.#xfers.delete(mmHash);
          continue;
        }
      }
      if (xfer.state === XferState.WAITING_ACK) {
        if (now > xfer.deadline) {
          if (!this.#endAhead(xfer)) {
            this.#xfers.delete(mmHash);
            continue;
          }
          xfer.transition([XferState.WAITING_ACK], XferState.ACK_TIMEOUT, "ack_timeout");
          this.#m.ackTimeouts.inc();
          this.#log.warn({ mmHash }, "no XferAck in time; will re-request");
          this.#xfers.delete(mmHash);
          this.#results.retryable.push(blocksOf(xfer));
        }
      } else if (xfer.state === XferState.READING) {
        this.#pollReading(xfer, now);
        if (xfer.state !== XferState.READING) this.#xfers.delete(mmHash);
      }
    }
    this.#drainQuarantine(now);
  }

  /**
   * EC-CONTRACT 6.4: WAITING_ACK transfers become retryable; READING transfers are quarantined
   * (with a quarantine deadline, so they settle when their handle leaves PROC).
   */
  onPeerDown(now: number): void {
    this.#m.peerDown.inc();
    for (const [mmHash, xfer] of this.#xfers) {
      if (xfer.state === XferState.WAITING_ACK) {
        if (this.#endAhead(xfer)) {
          xfer.transition([XferState.WAITING_ACK], XferState.CANCELLED, "peer_down");
          this.#results.retryable.push(blocksOf(xfer));
        }
      } else {
        this.#quarantine(xfer, now, "peer_down");
      }
      this.#xfers.delete(mmHash);
    }
  }

  /** EC-CONTRACT 6.5: returns and clears the accumulated results. */
  takeResults(): ConsumerSessionResults {
    const r = this.#results;
    this.#results = emptyResults();
    return r;
  }

  /** True while any transfer is active or quarantined. */
  hasInFlight(): boolean {
    return this.#xfers.size > 0 || this.#quarantined.length > 0;
  }

  /**
   * Ends the session: WAITING_ACK transfers become retryable, reads and quarantined reads are
   * released (tombstoned when the release guarantees no further writes, else retired), and the
   * peer is removed from the data plane. Collect the outcome with `takeResults()`.
   */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const xfer of this.#xfers.values()) {
      if (xfer.state === XferState.WAITING_ACK) {
        if (this.#endAhead(xfer)) {
          xfer.transition([XferState.WAITING_ACK], XferState.CANCELLED, "session_closed");
          this.#results.retryable.push(blocksOf(xfer));
        }
      } else {
        this.#fail(xfer, "session_closed", this.#release(xfer));
      }
    }
    this.#xfers.clear();
    for (const xfer of this.#quarantined) this.#fail(xfer, "session_closed", this.#release(xfer));
    this.#quarantined = [];
    if (this.#agentName !== null) {
      try {
        this.#data.removeRemotePeer(this.#agentName);
      } catch (err) {
        this.#log.warn({ err }, "removeRemotePeer failed");
      }
      this.#agentName = null;
    }
  }

  /**
   * docs/ec-protocol.md 3.3: an ACK frame that came with the read-ahead is this request's XferAck,
   * handled exactly as one from the control plane (6.2); the control plane's copy is then a
   * duplicate. A malformed one is dropped and counted (the control plane's copy still comes).
   */
  #takeDataAck(xfer: ConsumerXfer, now: number): void {
    let raw: Uint8Array | null = null;
    try {
      raw = this.#data.takeReadAheadAck?.(xfer.handle!) ?? null;
    } catch {
      raw = null;
    }
    if (raw === null) return;
    let ack: XferAck;
    try {
      ack = decodeXferAck(raw, this.#numBlocks);
    } catch (err) {
      this.#m.malformed.inc();
      this.#log.warn({ err: (err as Error).message }, "dropped malformed XferAck (data plane)");
      return;
    }
    // Only this request's own ack (its xfer_id, its mm_hash) counts as one.
    if (ack.xferId !== xfer.xferId || ack.mmHash !== xfer.mmHash) {
      this.#m.staleAcks.inc();
      return;
    }
    this.#m.dataAcks.inc();
    this.#dispatch(ack, now);
  }

  #dispatch(ack: XferAck, now: number): void {
    const xfer = this.#xfers.get(ack.mmHash);
    if (
      xfer !== undefined &&
      xfer.xferId !== undefined &&
      ack.xferId !== undefined &&
      ack.xferId !== xfer.xferId
    ) {
      // 3.3: the ack of an earlier request for this mm_hash (e.g. its control-plane copy after
      // the data-plane ACK completed it): never this request's.
      this.#m.staleAcks.inc();
      return;
    }
    const foreign =
      ack.status === XferStatus.OK
        ? ack.sessionId !== this.sessionId
        : ack.sessionId !== "" && ack.sessionId !== this.sessionId;
    if (xfer === undefined || xfer.state !== XferState.WAITING_ACK || foreign) {
      this.#m.ignoredAcks.inc();
      this.#log.debug(
        { mmHash: ack.mmHash, status: ack.status },
        "ignored unknown, duplicate or foreign ack",
      );
      return;
    }
    if (ack.status !== XferStatus.OK) {
      this.#m.nacks[ack.status]?.inc();
      if (!this.#endAhead(xfer)) {
        this.#xfers.delete(ack.mmHash);
        return;
      }
      const name = XFER_STATUS_NAMES[ack.status];
      this.#log[EXPECTED_NACKS.has(ack.status) ? "info" : "warn"]({ mmHash: ack.mmHash }, `NACK ${name}`);
      xfer.transition([XferState.WAITING_ACK], XferState.NACKED, name);
      this.#xfers.delete(ack.mmHash);
      if (RETRYABLE_NACKS.has(ack.status)) this.#results.retryable.push(blocksOf(xfer));
      else this.#results.tombstoned.push(blocksOf(xfer));
      return;
    }
    this.#m.acksOk.inc();
    const n = xfer.localBlocks.length;
    const bad =
      ack.srcBlockIndices.length !== n
        ? `ack has ${ack.srcBlockIndices.length} blocks for ${n} local blocks`
        : ack.nbytes > n * this.#blockBytes || ack.nbytes <= (n - 1) * this.#blockBytes
          ? `ack nbytes ${ack.nbytes} does not fill exactly ${n} blocks`
          : xfer.expectedNbytes !== undefined && ack.nbytes !== xfer.expectedNbytes
            ? `ack nbytes ${ack.nbytes} != expected ${xfer.expectedNbytes}`
            : null;
    if (bad !== null) {
      this.#log.warn({ mmHash: xfer.mmHash }, bad);
      if (!this.#endAhead(xfer)) {
        this.#xfers.delete(xfer.mmHash);
        return;
      }
      xfer.transition([XferState.WAITING_ACK], XferState.READ_FAILED, bad);
      this.#xfers.delete(xfer.mmHash);
      this.#results.tombstoned.push(blocksOf(xfer));
      return;
    }
    this.#peerAhead = ack.readAhead === true;
    this.#peerAckAhead = ack.ackAhead === true;
    this.#peerDataReq = ack.dataReq === true;
    if (xfer.handle !== null) {
      // A read-ahead is already reading this grant: keep it if it went to the agent that granted.
      const sameAgent = this.#agentMeta !== null && Buffer.compare(this.#agentMeta, ack.agentMetadata) === 0;
      if (sameAgent) {
        this.#reading(xfer, ack, now);
        return;
      }
      if (!this.#endAhead(xfer)) {
        this.#xfers.delete(xfer.mmHash);
        return;
      }
    }
    this.#postClassic(xfer, ack, now);
  }

  /** The READ after the ack (EC-CONTRACT 6.3), also the fallback of a read-ahead that failed. */
  #postClassic(xfer: ConsumerXfer, ack: XferAck, now: number): void {
    const from = xfer.state === XferState.WAITING_ACK ? XferState.WAITING_ACK : XferState.READING;
    try {
      const agent = this.#ensureRegistered(ack.agentMetadata, ack.memDescriptor);
      const notif = Buffer.from(`${this.sessionId}:${xfer.mmHash}`);
      xfer.handle = this.#data.postRead(xfer.localBlocks, agent, ack.srcBlockIndices, notif, {
        nbytes: ack.nbytes,
        checksum: this.#verify,
      });
    } catch (err) {
      // EC-CONTRACT 6.3: an exception from postRead (or registering the peer) tombstones the xfer.
      this.#log.warn({ err: (err as Error).message, mmHash: xfer.mmHash }, "posting the read failed");
      xfer.transition([from], XferState.READ_FAILED, "post_failed");
      this.#xfers.delete(xfer.mmHash);
      this.#results.tombstoned.push(blocksOf(xfer));
      return;
    }
    if (from === XferState.READING) return; // the fallback keeps the first post's deadline
    this.#reading(xfer, ack, now);
  }

  #reading(xfer: ConsumerXfer, ack: XferAck, now: number): void {
    this.#m.reads.inc();
    xfer.ack = ack;
    xfer.postedAt = now;
    xfer.deadline = now + this.#readTimeout;
    xfer.transition([XferState.WAITING_ACK], XferState.READING);
  }

  #ensureRegistered(meta: Uint8Array, desc: Uint8Array): string {
    if (this.#agentName !== null && this.#agentMeta !== null && Buffer.compare(this.#agentMeta, meta) === 0) {
      return this.#agentName;
    }
    // A new metadata blob means the producer restarted (new instance id): re-register.
    if (this.#agentName !== null) {
      this.#log.info({ old: this.#agentName }, "producer metadata changed; re-registering");
      this.#data.removeRemotePeer(this.#agentName);
      this.#agentName = null;
      this.#agentMeta = null;
    }
    const name = this.#data.addRemotePeer(meta, desc);
    this.#agentName = name;
    this.#agentMeta = Uint8Array.from(meta);
    return name;
  }

  #pollReading(xfer: ConsumerXfer, now: number): void {
    const h = xfer.handle!;
    let state: string;
    try {
      state = this.#data.checkXferState(h);
    } catch (err) {
      this.#log.warn({ err: (err as Error).message, mmHash: xfer.mmHash }, "checkXferState failed");
      this.#fail(xfer, "check_failed", this.#release(xfer));
      return;
    }
    if (state === "DONE") {
      const crc = this.#data.getXferChecksum(h);
      const src = this.#data.getXferSourceRuns?.(h) ?? null;
      this.#release(xfer);
      const ack = xfer.ack!;
      // docs/ec-protocol.md 3.4 "Shared region": the chunks named region offsets; they must be the
      // ack's blocks, in order (checked with the CRC off too: bytes from elsewhere are never promoted).
      if (src !== null && !sourceRunsMatch(src, ack.srcBlockIndices, this.#blockBytes, ack.nbytes)) {
        this.#m.sourceMismatches.inc();
        this.#log.warn(
          {
            mmHash: xfer.mmHash,
            runs: src.overflow ? "overflow" : src.runs.slice(0, 8),
            blocks: ack.srcBlockIndices.slice(0, 8),
          },
          "shared-region read copied from other than the ack's blocks; dropping the read",
        );
        this.#fail(xfer, "source_mismatch", true);
        return;
      }
      if (this.#verify && crc !== ack.crc32) {
        this.#m.checksumFailures.inc();
        this.#log.warn(
          { mmHash: xfer.mmHash, got: crc, want: ack.crc32 },
          "checksum mismatch; dropping the read",
        );
        this.#fail(xfer, "checksum_mismatch", true);
        return;
      }
      xfer.transition([XferState.READING], XferState.DONE);
      this.#m.readsCompleted.inc();
      this.#m.readBytes.inc(ack.nbytes);
      this.#m.readSeconds.observe(Math.max(0, now - xfer.postedAt) / 1000);
      this.#results.completed.push({
        mmHash: xfer.mmHash,
        blocks: xfer.localBlocks,
        nbytes: ack.nbytes,
        crc32: ack.crc32,
      });
      return;
    }
    if (state === "PROC") {
      if (now > xfer.deadline) this.#quarantine(xfer, now, "read_timeout");
      return;
    }
    const why = this.#safeError(h);
    if (xfer.readAhead) {
      // docs/ec-protocol.md 3.2: a refused or broken read-ahead falls back to the READ, once.
      xfer.readAhead = false;
      this.#m.readAheadFallbacks.inc();
      this.#log.info({ mmHash: xfer.mmHash, why }, "read-ahead failed; reading after the ack");
      if (!this.#release(xfer)) {
        this.#fail(xfer, `read_error: ${why}`, false);
        return;
      }
      this.#postClassic(xfer, xfer.ack!, now);
      return;
    }
    this.#log.warn({ mmHash: xfer.mmHash, state, why }, "read failed");
    this.#fail(xfer, `read_error: ${why}`, this.#release(xfer));
  }

  #quarantine(xfer: ConsumerXfer, now: number, reason: string): void {
    xfer.transition([XferState.READING], XferState.QUARANTINED, reason);
    xfer.deadline = now + this.#quarantineTimeout;
    this.#quarantined.push(xfer);
    this.#results.quarantined.push(xfer.mmHash);
    this.#m.quarantines.inc();
    this.#log.warn(
      { mmHash: xfer.mmHash, reason },
      "read quarantined; its blocks stay owned until it settles",
    );
  }

  #drainQuarantine(now: number): void {
    if (this.#quarantined.length === 0) return;
    const still: ConsumerXfer[] = [];
    for (const xfer of this.#quarantined) {
      if (now > xfer.deadline) {
        this.#m.quarantineTimeouts.inc();
        this.#log.warn({ mmHash: xfer.mmHash }, "quarantined read still PROC after the timeout; releasing");
        this.#fail(xfer, "quarantine_timeout", this.#release(xfer));
        continue;
      }
      let state: string | null;
      try {
        state = this.#data.checkXferState(xfer.handle!);
      } catch (err) {
        // EC-CONTRACT 6.3: the DMA state is unknown, so the read stays quarantined.
        this.#log.warn(
          { err: (err as Error).message, mmHash: xfer.mmHash },
          "checkXferState failed in quarantine",
        );
        still.push(xfer);
        continue;
      }
      if (state === "PROC") {
        still.push(xfer);
        continue;
      }
      this.#release(xfer);
      xfer.transition([XferState.QUARANTINED], XferState.SETTLED, `settled_${state}`);
      this.#m.settles.inc();
      this.#results.settled.push(blocksOf(xfer));
    }
    this.#quarantined = still;
  }

  /** Releases the handle; returns whether no byte can land afterwards (EC-CONTRACT 5.2). */
  #release(xfer: ConsumerXfer): boolean {
    const h = xfer.handle;
    if (h === null) return true;
    xfer.handle = null;
    try {
      return this.#data.releaseXferHandle(h) === true;
    } catch (err) {
      this.#log.warn({ err: (err as Error).message, mmHash: xfer.mmHash }, "releaseXferHandle failed");
      return false;
    }
  }

  /** READ_FAILED: tombstoned when the blocks are safe to free, else retired (EC-CONTRACT 5.2). */
  #fail(xfer: ConsumerXfer, reason: string, reusable: boolean): void {
    xfer.transition([XferState.READING, XferState.QUARANTINED], XferState.READ_FAILED, reason);
    this.#m.readFailures.inc();
    if (reusable) {
      this.#results.tombstoned.push(blocksOf(xfer));
    } else {
      this.#m.blocksRetired.inc(xfer.localBlocks.length);
      this.#log.warn({ mmHash: xfer.mmHash, blocks: xfer.localBlocks.length }, "blocks retired");
      this.#results.retired.push(blocksOf(xfer));
    }
  }

  #safeError(h: XferHandle): string {
    try {
      return this.#data.getXferError(h) ?? "ERR";
    } catch {
      return "ERR";
    }
  }
}

function blocksOf(x: ConsumerXfer): XferBlocks {
  return { mmHash: x.mmHash, blocks: x.localBlocks, reason: x.reason };
}

function emptyResults(): ConsumerSessionResults {
  return { completed: [], tombstoned: [], quarantined: [], retryable: [], settled: [], retired: [] };
}
