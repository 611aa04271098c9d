import { randomBytes } from "node:crypto";
import { EcError, isIntInRange } from "../errors.js";
import { int, packMsg, str, unpackMap } from "../protocol.js";
import type { SourceRuns } from "./source-runs.js";

/** EC-CONTRACT 5.1: the state of a posted read. */
export const XferHandleState = { DONE: "DONE", PROC: "PROC", ERR: "ERR" } as const;
/** One of {@link XferHandleState}. */
export type XferHandleState = (typeof XferHandleState)[keyof typeof XferHandleState];

/** An opaque read handle returned by {@link DataTransport.postRead}. */
export type XferHandle = number;

/** Extra, optional arguments of {@link DataTransport.postRead} (beyond the NIXL shape). */
export interface ReadOptions {
  /** Bytes to copy (default: every byte of every block). Must need exactly the given blocks. */
  nbytes?: number;
  /** Compute the CRC-32 of the received bytes incrementally as they arrive (EC-CONTRACT 6.3). */
  checksum?: boolean;
}

/**
 * EC-CONTRACT 5.1: one-sided reads of a remote agent's blocks into local blocks, with a completion
 * notification delivered to the remote agent (the NIXL shape). Both sides of a transfer hold one
 * transport over their cache region; the producer side also grants and revokes reads (5.3).
 */
export interface DataTransport {
  /** Implementation name: `"tcp"`, `"unix"` or `"loopback"`. */
  readonly kind: string;
  /** This agent's metadata (MessagePack bin: name, per-process instance id, endpoint). */
  getAgentMetadata(): Uint8Array;
  /** This agent's memory descriptor (MessagePack bin: block count and size). */
  getMemDescriptor(): Uint8Array;
  /** Registers a remote agent; returns the agent name to read from (new for a restarted agent). */
  addRemotePeer(metadata: Uint8Array, memDescriptor: Uint8Array): string;
  /** Forgets a remote agent, aborting reads still in flight from it. */
  removeRemotePeer(agentName: string): void;
  /**
   * EC-CONTRACT 5.2: starts copying `remoteBlocks` of `agentName`, in order, into `localBlocks`, then
   * delivers `notifMsg` to it. `notifMsg` (UTF-8) is also the grant key the remote checks (5.3).
   * Throws `EC_BAD_ARGUMENT` for an unknown agent or a bad block list.
   */
  postRead(
    localBlocks: readonly number[],
    agentName: string,
    remoteBlocks: readonly number[],
    notifMsg: Uint8Array,
    options?: ReadOptions,
  ): XferHandle;
  /** `DONE`: every byte is local and the notification was sent (socket transport: queued, see docs/ec-protocol.md); `PROC`: in flight; `ERR`: failed. */
  checkXferState(handle: XferHandle): XferHandleState;
  /** CRC-32 of the bytes received by a `DONE` read posted with `checksum: true`, else `null`. */
  getXferChecksum(handle: XferHandle): number | null;
  /**
   * docs/ec-protocol.md 3.4 "Shared region", optional: where in the producer's region a `DONE`
   * read's bytes were copied from (chunk runs in byte order), for the consumer to check against
   * the ack's blocks (`sourceRunsMatch`); `null` when they did not come from a shared region.
   */
  getXferSourceRuns?(handle: XferHandle): Readonly<SourceRuns> | null;
  /** Why a read is `ERR` (for logs), else `null`. */
  getXferError(handle: XferHandle): string | null;
  /**
   * EC-CONTRACT 5.2: forgets a handle; on a `PROC` handle aborts the read and returns whether it can
   * guarantee that no byte lands in local memory afterwards (finished handles return true).
   */
  releaseXferHandle(handle: XferHandle): boolean;
  /** Drains completion notifications received so far, by remote agent name. */
  getNewNotifs(): Map<string, Uint8Array[]>;
  /**
   * Producer side, EC-CONTRACT 5.3: allows reads of exactly `blocks` under `key` until `deadline`
   * (ms); `nbytes` (the ack's) is the byte count a read must ask for (omitted: any that needs
   * exactly those blocks).
   */
  grant(key: string, blocks: readonly number[], deadline: number, nbytes?: number): void;
  /**
   * Read-ahead (docs/ec-protocol.md 3.2), optional: true when this transport's server accepts
   * READ_AHEAD and its reader can post one ({@link DataTransport.postReadAhead}).
   */
  readonly readAhead?: boolean;
  /**
   * Read-ahead (docs/ec-protocol.md 3.2), optional: like `postRead`, before the ack: the remote
   * serves its grant `notifMsg`'s blocks once it exists (waiting up to `waitMs`), `nbytes` being
   * the byte count the consumer expects. Grant-scoped as a READ (EC-CONTRACT 5.3).
   */
  postReadAhead?(
    localBlocks: readonly number[],
    agentName: string,
    notifMsg: Uint8Array,
    options: ReadOptions & { nbytes: number; waitMs: number; ackFirst?: boolean },
  ): XferHandle;
  /**
   * Ack-ahead (docs/ec-protocol.md 3.3), optional: true when this transport's server sends a
   * grant's XferAck as an ACK frame to a READ_AHEAD asking for it ({@link DataTransport.grantAck})
   * and its reader can ask for and take one ({@link DataTransport.takeReadAheadAck}).
   */
  readonly ackAhead?: boolean;
  /**
   * Ack-ahead, producer side: `ack` is the XferAck (MessagePack) of the grant `key` just made;
   * READ_AHEADs of `key` that asked for it get it as an ACK frame before DATA, and those already
   * waiting are served now (before the control plane would send the same ack). Returns true when
   * one was served with it: the ack reached the consumer's data connection, and the producer then
   * sends no control-plane copy.
   */
  grantAck?(key: string, ack: Uint8Array): boolean;
  /** Ack-ahead, consumer side: the XferAck an ACK frame brought for this READ_AHEAD (once), else null. */
  takeReadAheadAck?(handle: XferHandle): Uint8Array | null;
  /**
   * Requests on the data connection (docs/ec-protocol.md 3.5), optional: true when this
   * transport's server takes XFER_REQ frames (handing them to {@link DataTransport.onXferRequest})
   * and its reader can send one ({@link DataTransport.postRequest}).
   */
  readonly dataRequests?: boolean;
  /**
   * 3.5, producer side: set by the producer session. Called synchronously for each XFER_REQ with
   * its XferReq bytes and a label of the connection (a quota peer, EC-CONTRACT 9.2). Throws
   * `EC_MALFORMED` for a malformed request (the server then closes that connection). `null`: the
   * server treats XFER_REQ as an unknown op (a 1.1 server).
   */
  onXferRequest?: XferRequestHandler | null;
  /**
   * 3.5, consumer side: like `postReadAhead` with the ack first, but the frame is an XFER_REQ
   * carrying `request` (the XferReq map): the producer grants it and answers on this connection.
   * The handle ends `ERR` without bytes when the answer is a NACK (its ACK frame then taken with
   * {@link DataTransport.takeReadAheadAck}); the connection stays pooled.
   */
  postRequest?(
    localBlocks: readonly number[],
    agentName: string,
    notifMsg: Uint8Array,
    options: ReadOptions & { nbytes: number; request: Uint8Array },
  ): XferHandle;
  /** Producer side: withdraws a grant and stops reads of it that are still streaming. */
  revoke(key: string): void;
  /** Called (if set) whenever a notification arrives, so a driver can schedule a step. */
  onNotification: (() => void) | null;
  /** Called (if set) whenever a posted read leaves PROC, so a driver can poll right away. */
  onReadDone?: (() => void) | null;
  /** Stops serving and aborts every read. */
  close(): Promise<void>;
}

/** What the producer answers an XFER_REQ (docs/ec-protocol.md 3.5). */
export interface XferRequestAnswer {
  /** The XferAck map (MessagePack), OK or NACK. */
  ack: Uint8Array;
  /** OK: the grant `key` was made and is to be served now on that connection. */
  ok: boolean;
  /** The grant key `"{session_id}:{mm_hash}"`. */
  key: string;
}

/** The producer's handler of XFER_REQ frames (docs/ec-protocol.md 3.5). */
export type XferRequestHandler = (request: Uint8Array, peer: string) => XferRequestAnswer;

/** Decoded agent metadata (EC-CONTRACT 5.3). */
export interface AgentMetadata {
  /** Agent name as configured (e.g. "encoder-0"). */
  name: string;
  /** Random id made once per process/transport: a restarted agent has a new one. */
  instance: string;
  /** Where its data server listens (`tcp://host:port`, `unix:///path`, `loopback://name`). */
  endpoint: string;
  /**
   * docs/ec-protocol.md 3.4 (tapwire 1.2, optional): its `unix://` data server also offers shm
   * rings (the metadata key `shm` = 1; a 1.1 reader ignores it and reads over the socket).
   */
  shm?: boolean;
}

/** Decoded memory descriptor. */
export interface MemDescriptor {
  /** Blocks in the remote region. */
  numBlocks: number;
  /** Bytes per remote block. */
  blockBytes: number;
}

/** A fresh per-process instance id (internal). */
export function newInstanceId(): string {
  return randomBytes(8).toString("hex");
}

/** Encodes agent metadata as a MessagePack bin. */
export function encodeAgentMetadata(m: AgentMetadata): Uint8Array {
  return packMsg(
    m.shm === true
      ? { name: m.name, instance: m.instance, endpoint: m.endpoint, shm: 1 }
      : { name: m.name, instance: m.instance, endpoint: m.endpoint },
  );
}

/** Decodes agent metadata; throws `EC_MALFORMED`. */
export function decodeAgentMetadata(bytes: Uint8Array): AgentMetadata {
  const m = unpackMap(bytes, "agent metadata");
  return {
    name: str(m, "name", "agent metadata"),
    instance: str(m, "instance", "agent metadata"),
    endpoint: str(m, "endpoint", "agent metadata", 1024),
    ...(m["shm"] === 1 ? { shm: true } : {}),
  };
}

/** Encodes a memory descriptor. */
export function encodeMemDescriptor(d: MemDescriptor): Uint8Array {
  return packMsg({ num_blocks: d.numBlocks, block_bytes: d.blockBytes });
}

/**
 * A data transport's own agent metadata and memory descriptor (EC-CONTRACT 5.1), encoded once
 * (they never change); each call returns a copy, so a caller cannot alter the cached bytes.
 */
export class SelfDescription {
  readonly #meta: AgentMetadata;
  readonly #desc: MemDescriptor;
  #metaBytes: Uint8Array | null = null;
  #descBytes: Uint8Array | null = null;

  constructor(meta: AgentMetadata, numBlocks: number, blockBytes: number) {
    this.#meta = meta;
    this.#desc = { numBlocks, blockBytes };
  }

  /** What `getAgentMetadata()` returns. */
  agentMetadata(): Uint8Array {
    this.#metaBytes ??= encodeAgentMetadata(this.#meta);
    return this.#metaBytes.slice();
  }

  /** What `getMemDescriptor()` returns. */
  memDescriptor(): Uint8Array {
    this.#descBytes ??= encodeMemDescriptor(this.#desc);
    return this.#descBytes.slice();
  }
}

/** Decodes a memory descriptor; throws `EC_MALFORMED`. */
export function decodeMemDescriptor(bytes: Uint8Array): MemDescriptor {
  const m = unpackMap(bytes, "memory descriptor");
  return {
    numBlocks: int(m, "num_blocks", "memory descriptor", 1),
    blockBytes: int(m, "block_bytes", "memory descriptor", 1),
  };
}

/** The agent name a reader uses for a peer: name plus instance, so a restart yields a new name. */
export function agentNameOf(m: AgentMetadata): string {
  return `${m.name}/${m.instance}`;
}

/** Validates a read request against both regions (internal); returns the byte count. */
export function checkReadShape(
  localBlocks: readonly number[],
  remoteBlocks: readonly number[],
  localNumBlocks: number,
  remote: MemDescriptor,
  blockBytes: number,
  nbytes: number | undefined,
): number {
  if (!Array.isArray(localBlocks) || !Array.isArray(remoteBlocks)) {
    throw new EcError("EC_BAD_ARGUMENT", "postRead: block lists must be arrays");
  }
  if (localBlocks.length === 0 || localBlocks.length !== remoteBlocks.length) {
    throw new EcError(
      "EC_BAD_ARGUMENT",
      `postRead: ${localBlocks.length} local blocks for ${remoteBlocks.length} remote blocks`,
    );
  }
  if (remote.blockBytes !== blockBytes) {
    throw new EcError(
      "EC_BAD_ARGUMENT",
      `postRead: remote block size ${remote.blockBytes} != local ${blockBytes}`,
    );
  }
  for (let i = 0; i < localBlocks.length; i++) {
    const l = localBlocks[i]!;
    const r = remoteBlocks[i]!;
    if (!isIntInRange(l, 0, localNumBlocks - 1)) {
      throw new EcError("EC_BAD_ARGUMENT", `postRead: local block ${l} outside [0, ${localNumBlocks})`);
    }
    if (!isIntInRange(r, 0, remote.numBlocks - 1)) {
      throw new EcError("EC_BAD_ARGUMENT", `postRead: remote block ${r} outside [0, ${remote.numBlocks})`);
    }
  }
  const max = localBlocks.length * blockBytes;
  const n = nbytes ?? max;
  if (!isIntInRange(n, max - blockBytes + 1, max)) {
    throw new EcError(
      "EC_BAD_ARGUMENT",
      `postRead: nbytes ${n} does not need exactly ${localBlocks.length} blocks`,
    );
  }
  return n;
}

/** A parsed data endpoint: a TCP address (plain or TLS) or a Unix socket path (`shm`: `shm+unix://`, 3.4). */
export type DataEndpoint = { host: string; port: number; tls: boolean } | { path: string; shm?: boolean };

/** Parses `tcp://host:port`, `tls://host:port` or `unix:///path` (internal). */
export function parseDataEndpoint(endpoint: string): DataEndpoint {
  if (typeof endpoint !== "string") throw new EcError("EC_BAD_ENDPOINT", "endpoint: expected a string");
  if (endpoint.startsWith("unix://")) {
    const path = endpoint.slice("unix://".length);
    if (path.length === 0) throw new EcError("EC_BAD_ENDPOINT", `endpoint ${endpoint}: empty socket path`);
    return { path };
  }
  if (endpoint.startsWith("shm+unix://")) {
    // docs/ec-protocol.md 3.4: a unix data server that also offers shm rings (listen side only).
    const path = endpoint.slice("shm+unix://".length);
    if (path.length === 0) throw new EcError("EC_BAD_ENDPOINT", `endpoint ${endpoint}: empty socket path`);
    return { path, shm: true };
  }
  const m = /^(tcp|tls):\/\/(\[[^\]]+\]|[^:/]+):(\d+)$/.exec(endpoint);
  if (m === null) {
    throw new EcError(
      "EC_BAD_ENDPOINT",
      `endpoint ${endpoint}: expected tcp://host:port, tls://host:port, unix:///path or shm+unix:///path`,
    );
  }
  const port = Number(m[3]);
  if (port > 65535) throw new EcError("EC_BAD_ENDPOINT", `endpoint ${endpoint}: port ${port} > 65535`);
  const host = m[2]!.startsWith("[") ? m[2]!.slice(1, -1) : m[2]!;
  return { host, port, tls: m[1] === "tls" };
}

/** A received notification and the grant instance whose read it completes. */
export interface Notif {
  from: string;
  key: string;
  msg: Uint8Array;
  grant: object | null;
}

/**
 * Hands out received notifications, dropping stale ones (internal, both server transports): a
 * notification completes the grant *instance* that authorised its read. If that grant has since
 * been replaced (the consumer re-requested the same key while the notification was in flight) or
 * revoked, delivering it would end the new grant and unpin blocks a read may be streaming.
 */
export function deliverNotifs(
  queue: Notif[],
  grants: ReadonlyMap<string, object>,
  stale: { inc(n?: number): void },
): Map<string, Uint8Array[]> {
  const out = new Map<string, Uint8Array[]>();
  for (const n of queue.splice(0)) {
    if (n.grant === null || grants.get(n.key) !== n.grant) {
      stale.inc();
      continue;
    }
    const list = out.get(n.from) ?? [];
    list.push(n.msg);
    out.set(n.from, list);
  }
  return out;
}
