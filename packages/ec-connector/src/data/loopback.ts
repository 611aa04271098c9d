import { crc32 } from "../crc.js";
import { checkIntOption, EcError, isIntInRange } from "../errors.js";
import { recordSourceRun, type SourceRuns } from "./source-runs.js";
import type {
  AgentMetadata,
  DataTransport,
  Notif,
  ReadOptions,
  XferHandle,
  XferHandleState,
} from "./transport.js";
import {
  agentNameOf,
  checkReadShape,
  decodeAgentMetadata,
  decodeMemDescriptor,
  deliverNotifs,
  newInstanceId,
  SelfDescription,
} from "./transport.js";

/**
 * A fault the loopback data plane applies to a read (EC-CONTRACT 5.4), for unit tests:
 * - `delay`: stays PROC for `ms` of the injected clock, then completes.
 * - `stuck`: stays PROC until {@link LoopbackDataTransport.unstick}; release aborts it with the
 *   no-further-writes guarantee.
 * - `stuck_unguaranteed`: like `stuck`, but release cannot guarantee anything: the bytes land in
 *   local memory later, when unstuck (a DMA that outlives its handle, EC-CONTRACT 5.2).
 * - `error`: ERR on the first check.
 * - `lost_notification`: completes, but the notification never reaches the remote agent.
 * - `corrupt`: completes with one byte flipped (the checksum must catch it).
 * - `wrong_source`: completes with the bytes of the remote block after each granted one (a data
 *   plane that read the wrong place; the source check must catch it, docs/ec-protocol.md 3.4).
 * - `throw_on_check` / `throw_on_post`: `checkXferState` / `postRead` throw.
 */
export type LoopbackFault =
  | {
      /** Which fault. */
      kind: "delay";
      /** How long the read stays PROC, ms. */
      ms: number;
    }
  | {
      /** Which fault (see above). */
      kind:
        | "stuck"
        | "stuck_unguaranteed"
        | "error"
        | "lost_notification"
        | "corrupt"
        | "wrong_source"
        | "throw_on_check"
        | "throw_on_post";
    };

interface Grant {
  blocks: readonly number[];
  deadline: number;
}

interface Read {
  local: readonly number[];
  remote: LoopbackDataTransport;
  remoteInstance: string;
  remoteBlocks: readonly number[];
  notif: Uint8Array;
  key: string;
  nbytes: number;
  checksum: boolean;
  postedAt: number;
  fault: LoopbackFault | null;
  state: XferHandleState;
  crc: number | null;
  /** Where the bytes were copied from (the remote region's offsets), once landed. */
  src: SourceRuns | null;
  error: string | null;
  released: boolean;
}

/** The in-process "network" that loopback agents register on. */
export class LoopbackFabric {
  /** Agents by agent name (`name/instance`). */
  readonly agents = new Map<string, LoopbackDataTransport>();
  /** The clock (ms) every agent on this fabric uses for delays and grant deadlines. */
  readonly now: () => number;

  constructor(options: { now?: () => number } = {}) {
    this.now = options.now ?? (() => performance.now());
  }
}

/** Options of {@link LoopbackDataTransport}. */
export interface LoopbackDataTransportOptions {
  /** The in-process fabric the agents of one test share. */
  fabric: LoopbackFabric;
  /** Agent name. */
  name: string;
  /** The cache region (`numBlocks * blockBytes` bytes). */
  region: Uint8Array;
  /** Blocks in `region`. */
  numBlocks: number;
  /** Bytes per block. */
  blockBytes: number;
}

/**
 * EC-CONTRACT 5.4: an in-process data plane with fault injection (delays, stuck reads, errors, lost
 * notifications, corruption, throwing calls) for unit tests of the session state machines. Reads
 * are evaluated lazily when their state is checked, so a fake clock fully controls them. Grants are
 * enforced exactly like the socket transports (5.3).
 */
export class LoopbackDataTransport implements DataTransport {
  readonly kind = "loopback";
  /** This agent's metadata (name and per-instance id, EC-CONTRACT 5.3). */
  readonly meta: AgentMetadata;
  readonly #self: SelfDescription;
  onNotification: (() => void) | null = null;
  /** Reads served / refused by this agent as the remote side (5.3). */
  readonly stats: {
    /** Reads served from this agent's region. */
    served: number;
    /** Reads refused (no grant, wrong blocks, expired: EC-CONTRACT 5.3). */
    refused: number;
    /** Bytes that landed after their handle was released without the guarantee (EC-CONTRACT 5.2). */
    landedAfterRelease: number;
    /** Notifications dropped because their grant was replaced or revoked. */
    staleNotifications: number;
  } = { served: 0, refused: 0, landedAfterRelease: 0, staleNotifications: 0 };

  readonly #fabric: LoopbackFabric;
  readonly #region: Uint8Array;
  readonly #numBlocks: number;
  readonly #blockBytes: number;
  readonly #grants = new Map<string, Grant>();
  readonly #reads = new Map<XferHandle, Read>();
  readonly #late: Read[] = [];
  readonly #peers = new Map<string, LoopbackDataTransport>();
  readonly #notifs: Notif[] = [];
  readonly #faults: LoopbackFault[] = [];
  #sticky: LoopbackFault | null = null;
  #nextHandle = 1;
  #closed = false;

  constructor(options: LoopbackDataTransportOptions) {
    if (!(options.fabric instanceof LoopbackFabric)) {
      throw new EcError("EC_BAD_OPTION", "option fabric: expected a LoopbackFabric");
    }
    this.#numBlocks = checkIntOption("numBlocks", options.numBlocks, 1);
    this.#blockBytes = checkIntOption("blockBytes", options.blockBytes, 1);
    if (
      !(options.region instanceof Uint8Array) ||
      options.region.length < this.#numBlocks * this.#blockBytes
    ) {
      throw new EcError(
        "EC_BAD_OPTION",
        "option region: expected a Uint8Array of numBlocks * blockBytes bytes",
      );
    }
    if (typeof options.name !== "string" || options.name.length === 0) {
      throw new EcError("EC_BAD_OPTION", "option name: expected a non-empty string");
    }
    this.#fabric = options.fabric;
    this.#region = options.region;
    const instance = newInstanceId();
    this.meta = { name: options.name, instance, endpoint: `loopback://${options.name}` };
    this.#self = new SelfDescription(this.meta, this.#numBlocks, this.#blockBytes);
    this.#fabric.agents.set(agentNameOf(this.meta), this);
  }

  /** Applies `fault` to the next `count` reads posted by this agent. */
  injectFault(fault: LoopbackFault, count = 1): void {
    for (let i = 0; i < count; i++) this.#faults.push(fault);
  }

  /** Applies `fault` to every read posted from now on (`null` clears it). */
  setFault(fault: LoopbackFault | null): void {
    this.#sticky = fault;
  }

  /**
   * Lets stuck reads proceed: unreleased ones complete on their next check; ones released without
   * a guarantee land their bytes in local memory now (the late write 5.2 warns about).
   */
  unstick(): void {
    for (const r of this.#reads.values()) if (r.fault?.kind.startsWith("stuck")) r.fault = null;
    for (const r of this.#late.splice(0)) {
      r.fault = null;
      this.#land(r);
      this.stats.landedAfterRelease++;
    }
  }

  /** Handles still tracked (not released). */
  get openHandles(): number {
    return this.#reads.size;
  }

  /** Number of live grants held by this agent. */
  get grantCount(): number {
    return this.#grants.size;
  }

  getAgentMetadata(): Uint8Array {
    return this.#self.agentMetadata();
  }

  getMemDescriptor(): Uint8Array {
    return this.#self.memDescriptor();
  }

  addRemotePeer(metadata: Uint8Array, memDescriptor: Uint8Array): string {
    const meta = decodeAgentMetadata(metadata);
    decodeMemDescriptor(memDescriptor);
    const name = agentNameOf(meta);
    const agent = this.#fabric.agents.get(name);
    if (agent === undefined) throw new EcError("EC_DATA", `loopback agent ${name}: not on the fabric`);
    this.#peers.set(name, agent);
    return name;
  }

  removeRemotePeer(agentName: string): void {
    this.#peers.delete(agentName);
  }

  postRead(
    localBlocks: readonly number[],
    agentName: string,
    remoteBlocks: readonly number[],
    notifMsg: Uint8Array,
    options: ReadOptions = {},
  ): XferHandle {
    if (this.#closed) throw new EcError("EC_CLOSED", "loopback transport: closed");
    const fault = this.#faults.shift() ?? this.#sticky;
    if (fault?.kind === "throw_on_post") throw new Error("loopback: injected postRead failure");
    const remote = this.#peers.get(agentName);
    if (remote === undefined) throw new EcError("EC_BAD_ARGUMENT", `postRead: unknown agent ${agentName}`);
    const nbytes = checkReadShape(
      localBlocks,
      remoteBlocks,
      this.#numBlocks,
      { numBlocks: remote.#numBlocks, blockBytes: remote.#blockBytes },
      this.#blockBytes,
      options.nbytes,
    );
    const h = this.#nextHandle++;
    this.#reads.set(h, {
      local: [...localBlocks],
      remote,
      remoteInstance: remote.meta.instance,
      remoteBlocks: [...remoteBlocks],
      notif: Uint8Array.from(notifMsg),
      key: new TextDecoder().decode(notifMsg),
      nbytes,
      checksum: options.checksum === true,
      postedAt: this.#fabric.now(),
      fault,
      state: "PROC",
      crc: null,
      src: null,
      error: null,
      released: false,
    });
    return h;
  }

  checkXferState(handle: XferHandle): XferHandleState {
    const r = this.#must(handle);
    if (r.state !== "PROC") return r.state;
    const f = r.fault;
    if (f !== null) {
      if (f.kind === "throw_on_check") throw new Error("loopback: injected checkXferState failure");
      if (f.kind === "stuck" || f.kind === "stuck_unguaranteed") return "PROC";
      if (f.kind === "delay" && this.#fabric.now() < r.postedAt + f.ms) return "PROC";
      if (f.kind === "error") {
        r.state = "ERR";
        r.error = "injected error";
        return r.state;
      }
    }
    this.#land(r);
    return r.state;
  }

  getXferChecksum(handle: XferHandle): number | null {
    const r = this.#must(handle);
    return r.state === "DONE" ? r.crc : null;
  }

  /** The remote region's runs the bytes were copied from (every loopback read reads the region). */
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
    r.released = true;
    if (r.state === "PROC" && r.fault?.kind === "stuck_unguaranteed") {
      this.#late.push(r);
      return false;
    }
    return true;
  }

  getNewNotifs(): Map<string, Uint8Array[]> {
    return deliverNotifs(this.#notifs, this.#grants, {
      inc: () => {
        this.stats.staleNotifications++;
      },
    });
  }

  grant(key: string, blocks: readonly number[], deadline: number): void {
    for (const b of blocks) {
      if (!isIntInRange(b, 0, this.#numBlocks - 1)) {
        throw new EcError("EC_BAD_ARGUMENT", `grant ${key}: block ${b} outside [0, ${this.#numBlocks})`);
      }
    }
    this.#grants.set(key, { blocks: [...blocks], deadline });
  }

  revoke(key: string): void {
    this.#grants.delete(key);
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#reads.clear();
    this.#late.length = 0;
    this.#fabric.agents.delete(agentNameOf(this.meta));
  }

  /** The remote side's check of a read against its grants (EC-CONTRACT 5.3). */
  #serve(key: string, blocks: readonly number[]): string | null {
    if (this.#closed) return "remote closed";
    const g = this.#grants.get(key);
    if (g === undefined) return `no grant for ${key}`;
    if (this.#fabric.now() > g.deadline) return `grant ${key} expired`;
    if (g.blocks.length !== blocks.length || g.blocks.some((b, i) => b !== blocks[i])) {
      return `blocks differ from grant ${key}`;
    }
    return null;
  }

  #land(r: Read): void {
    const remote = r.remote;
    const refused =
      remote.#fabric.agents.get(agentNameOf(remote.meta)) !== remote ||
      remote.meta.instance !== r.remoteInstance
        ? "remote agent gone"
        : remote.#serve(r.key, r.remoteBlocks);
    if (refused !== null) {
      remote.stats.refused++;
      r.state = "ERR";
      r.error = `refused: ${refused}`;
      return;
    }
    remote.stats.served++;
    const bb = this.#blockBytes;
    let left = r.nbytes;
    let crc = 0;
    const runs: SourceRuns = { runs: [], overflow: false };
    const wrong = r.fault?.kind === "wrong_source";
    for (let i = 0; i < r.local.length && left > 0; i++) {
      const n = Math.min(bb, left);
      const b = wrong ? (r.remoteBlocks[i]! + 1) % remote.#numBlocks : r.remoteBlocks[i]!;
      recordSourceRun(runs, b * bb, n, r.local.length);
      const src = remote.#region.subarray(b * bb, b * bb + n);
      const dst = this.#region.subarray(r.local[i]! * bb, r.local[i]! * bb + n);
      dst.set(src);
      if (i === 0 && r.fault?.kind === "corrupt") dst[0] = dst[0]! ^ 0xff;
      if (r.checksum) crc = crc32(dst, crc);
      left -= n;
    }
    r.crc = r.checksum ? crc : null;
    r.src = runs;
    r.state = "DONE";
    if (r.fault?.kind !== "lost_notification") {
      const grant = remote.#grants.get(r.key) ?? null;
      remote.#notifs.push({ from: agentNameOf(this.meta), key: r.key, msg: r.notif, grant });
      remote.onNotification?.();
    }
  }

  #must(handle: XferHandle): Read {
    const r = this.#reads.get(handle);
    if (r === undefined) throw new EcError("EC_BAD_ARGUMENT", `unknown read handle ${String(handle)}`);
    return r;
  }
}
