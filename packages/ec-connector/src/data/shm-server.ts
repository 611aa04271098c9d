// The producer side of the shm data plane (issue 23, docs/ec-protocol.md 3.4): per connection a
// ring in a /dev/shm file the producer creates; a served READ's granted bytes are copied from
// the pinned cache region into the ring's slots (one copy) and announced by SHM_CHUNK doorbells on
// the unix socket; a slot is written again only after the reader's SHM_RELEASE of it. With a shared
// region (3.4 "Shared region", opt-in `shareRegion`) a reader that asks maps the cache region itself
// and the SHM_CHUNKs name the granted bytes where they lie: nothing is copied on this side.
import type * as net from "node:net";
import type { Counter, Gauge, Registry } from "@tapwire/stats";
import type { Logger } from "pino";
import { EcError } from "../errors.js";
import { encodeFrame, segments } from "./frame.js";
import {
  AttachedStatus,
  AttachFlags,
  decodeShmToServer,
  encodeChunk,
  encodeOffer,
  OfferStatus,
  SHM_DATA_VERSION,
  SHM_LIMITS,
} from "./shm-frame.js";
import { ShmMapping, sweepStaleShmFiles } from "./shm-map.js";

/** Metrics of the shm data plane (both sides). */
export interface ShmMetrics {
  /** Rings mapped by this data server now. */
  sessions: Gauge;
  /** Rings refused or declined: the connection uses the socket. */
  fallbacks: Counter;
  /** SHM_CHUNKs posted (server) or consumed (reader). */
  chunks: Counter;
}

/** Registers (idempotently) and returns the shm data-plane metrics. */
export function shmMetrics(r: Registry): ShmMetrics {
  return {
    sessions: r.gauge("data_shm_sessions", "shm data-plane rings mapped by this data server"),
    fallbacks: r.counter(
      "data_shm_fallbacks",
      "shm data-plane rings refused or declined (the connection streams on the socket)",
    ),
    chunks: r.counter("data_shm_chunks", "shm data-plane chunks posted (server) or consumed (reader)"),
  };
}

/** Ring geometry and limits of an shm data server. */
export interface ShmServerOptions {
  /** Directory of the ring files (default /dev/shm). */
  readonly dir: string;
  /** Slots per ring. */
  readonly slots: number;
  /** Bytes per slot (a page multiple). */
  readonly slotBytes: number;
  /** Most rings mapped at once; further SHM_ATTACHes are refused (the socket serves them). */
  readonly maxSessions: number;
  /**
   * The producer's cache region when it is shared (docs/ec-protocol.md 3.4 "Shared region",
   * `--shm-share-region`): a reader that can map it is offered it instead of a ring, and a served
   * READ's chunks then name the granted bytes where they lie (no copy on this side).
   */
  readonly region?: { readonly bytes: Uint8Array; readonly pid: number; readonly fd: number };
  readonly metrics: ShmMetrics;
  readonly logger: Logger;
}

const ConnState = { OFFERED: "offered", ACTIVE: "active", OFF: "off", DEAD: "dead" } as const;
type ConnState = (typeof ConnState)[keyof typeof ConnState];

/** One connection's shm state (held by the data server's connection record). */
export class ShmServerConn {
  state: ConnState;
  map: ShmMapping | null;
  /** Per slot, the seq of the chunk it holds, 0 when free. */
  readonly held: Uint32Array;
  /** Next seq to post; oldest seq not yet released. */
  nextSeq = 1;
  oldest = 1;
  /** Wakes the stream waiting for a free slot. */
  waiter: (() => void) | null = null;
  /** The reader maps the shared region (3.4 "Shared region"): chunks point into it, no ring. */
  readonly region: boolean;
  /** The region connection's session was counted off. */
  regionDropped = false;

  constructor(state: ConnState, map: ShmMapping | null, slots: number, region = false) {
    this.state = state;
    this.map = map;
    this.held = new Uint32Array(slots);
    this.region = region;
  }

  wake(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
  }
}

function malformed(why: string): EcError {
  return new EcError("EC_MALFORMED", `shm data frame: ${why}`);
}

/**
 * The shm half of a data server (one per `shm+unix://` listener). Every READ check of
 * EC-CONTRACT 5.3 stays the data server's: this only changes where a served READ's bytes travel.
 */
export class ShmDataServer {
  readonly #o: ShmServerOptions;
  #sessions = 0;

  constructor(o: ShmServerOptions) {
    this.#o = o;
    // What a killed predecessor left between creating a ring file and the reader's SHM_ATTACHED.
    const n = sweepStaleShmFiles(o.dir);
    if (n > 0) o.logger.info({ files: n, dir: o.dir }, "removed stale shm files of dead processes");
  }

  /** Bytes of one ring. */
  get ringBytes(): number {
    return this.#o.slots * this.#o.slotBytes;
  }

  /**
   * An shm frame on a connection (`fresh`: no READ seen yet on it). Returns the connection's new
   * shm state. Throws `EC_MALFORMED` for a frame the protocol does not allow here (the data server
   * then closes the connection).
   */
  onFrame(st: ShmServerConn | null, socket: net.Socket, body: Uint8Array, fresh: boolean): ShmServerConn {
    const f = decodeShmToServer(body);
    if (f.op === "attach") {
      if (st !== null || !fresh) throw malformed("SHM_ATTACH after the connection's first frame");
      return this.#attach(socket, f.version, f.flags);
    }
    if (f.op === "attached") {
      if (st === null || st.state !== ConnState.OFFERED) throw malformed("SHM_ATTACHED without an offer");
      // The reader holds the ring (or will not): its name goes, only the two mappings remain.
      st.map?.unlink();
      if (f.status === AttachedStatus.MAPPED) {
        st.state = ConnState.ACTIVE;
        return st;
      }
      this.#o.metrics.fallbacks.inc();
      this.#drop(st, ConnState.OFF);
      return st;
    }
    // release: only of the oldest chunk still held, in its slot (a replay or a release of a
    // region not held closes the connection).
    if (st === null || st.state !== ConnState.ACTIVE) throw malformed("SHM_RELEASE without a ring");
    const slot = (st.oldest - 1) % st.held.length;
    if (st.oldest === st.nextSeq || f.seq !== st.oldest || f.slot !== slot || st.held[slot] !== f.seq) {
      throw malformed(
        `SHM_RELEASE of chunk ${f.seq} in slot ${f.slot}, not held (oldest held: ${st.oldest})`,
      );
    }
    st.held[slot] = 0;
    st.oldest = next(st.oldest);
    st.wake();
    return st;
  }

  /** True when the connection's READs are served through its ring. */
  active(st: ShmServerConn | null): st is ShmServerConn {
    return st !== null && st.state === ConnState.ACTIVE;
  }

  /** True while an SHM_OFFER waits for its SHM_ATTACHED (no other frame is allowed then). */
  awaiting(st: ShmServerConn | null): boolean {
    return st !== null && st.state === ConnState.OFFERED;
  }

  #attach(socket: net.Socket, version: number, flags: number): ShmServerConn {
    const o = this.#o;
    const refuse = (why: string): ShmServerConn => {
      o.metrics.fallbacks.inc();
      o.logger.warn({ why }, "shm data-plane ring refused; the connection streams on the socket");
      socket.write(encodeOffer(OfferStatus.REFUSED, 0, 0, why));
      return new ShmServerConn(ConnState.OFF, null, 0);
    };
    if (version !== SHM_DATA_VERSION)
      return refuse(`SHM_ATTACH version ${version}, this server speaks ${SHM_DATA_VERSION}`);
    if (this.#sessions >= o.maxSessions)
      return refuse(`shm: ${this.#sessions} rings mapped, limit ${o.maxSessions}`);
    const shared = o.region;
    if (shared !== undefined && (flags & AttachFlags.REGION) !== 0) {
      // 3.4 "Shared region": no file to create; the reader opens /proc/<pid>/fd/<fd> read-only.
      this.#sessions++;
      o.metrics.sessions.set(this.#sessions);
      // No ring memory behind the window: the widest one, so a READ of up to 16 slots' bytes is
      // posted whole with its DATA (no release round trip through this event loop on the way).
      socket.write(
        encodeOffer(OfferStatus.REGION, SHM_LIMITS.maxSlots, o.slotBytes, `${shared.pid}/${shared.fd}`),
      );
      return new ShmServerConn(ConnState.OFFERED, null, SHM_LIMITS.maxSlots, true);
    }
    let map: ShmMapping;
    try {
      map = ShmMapping.create(o.dir, this.ringBytes);
    } catch (err) {
      return refuse((err as Error).message);
    }
    this.#sessions++;
    o.metrics.sessions.set(this.#sessions);
    socket.write(encodeOffer(OfferStatus.OFFERED, o.slots, o.slotBytes, map.name));
    return new ShmServerConn(ConnState.OFFERED, map, o.slots);
  }

  #drop(st: ShmServerConn, state: ConnState): void {
    const m = st.map;
    st.state = state;
    st.map = null;
    st.wake();
    if (st.region) {
      if (!st.regionDropped) {
        st.regionDropped = true;
        this.#sessions--;
        this.#o.metrics.sessions.set(this.#sessions);
      }
      return;
    }
    if (m === null) return;
    m.unlink();
    m.close();
    this.#sessions--;
    this.#o.metrics.sessions.set(this.#sessions);
  }

  /** The connection closed: its ring file is unlinked (if the reader never said) and unmapped. */
  closed(st: ShmServerConn | null): void {
    if (st !== null && st.state !== ConnState.DEAD) this.#drop(st, ConnState.DEAD);
  }

  /**
   * Serves a checked READ through the ring: DATA, then per slot-sized piece a copy from the
   * region into the next slot (once the reader released it) and an SHM_CHUNK. Resolves true when
   * every piece was posted, false when the connection went away first. `throttle` paces it like
   * the socket path (`bytesPerSec` 0: unpaced, one chunk per slot).
   */
  async stream(
    st: ShmServerConn,
    socket: net.Socket,
    region: Uint8Array,
    blocks: readonly number[],
    blockBytes: number,
    nbytes: number,
    throttle: { bytesPerSec: number; chunkBytes: number },
    onSent: (n: number) => void,
  ): Promise<boolean> {
    const o = this.#o;
    if (st.region)
      return this.#streamRegion(st, socket, region, blocks, blockBytes, nbytes, throttle, onSent);
    // Paced (demos, slow-read tests): chunks of the server's write chunk, a sleep after each.
    const pieceBytes = throttle.bytesPerSec > 0 ? Math.min(o.slotBytes, throttle.chunkBytes) : o.slotBytes;
    const { segStart, segLen } = segments(blocks, blockBytes, nbytes);
    socket.cork();
    socket.write(encodeFrame({ op: "data", nbytes }));
    let corked = true;
    let si = 0;
    let so = 0;
    let sent = 0;
    while (sent < nbytes) {
      const seq = st.nextSeq;
      const slot = (seq - 1) % o.slots;
      while (st.held[slot] !== 0 && st.state === ConnState.ACTIVE && !socket.destroyed) {
        if (corked) {
          corked = false;
          socket.uncork();
        }
        await new Promise<void>((resolve) => {
          st.waiter = resolve;
        });
      }
      const ring = st.map?.bytes;
      if (st.state !== ConnState.ACTIVE || socket.destroyed || ring === undefined) return false;
      const base = slot * o.slotBytes;
      // The first piece is a quarter slot (at least 256 KiB): the reader starts on it sooner.
      const cap = sent === 0 ? Math.min(pieceBytes, Math.max(FIRST_PIECE_MIN, pieceBytes >> 2)) : pieceBytes;
      const want = Math.min(cap, nbytes - sent);
      // The only copy on this side: granted bytes of the pinned region into the slot.
      for (let fill = 0; fill < want; ) {
        const n = Math.min(want - fill, (segLen[si] as number) - so);
        const from = (segStart[si] as number) + so;
        ring.set(region.subarray(from, from + n), base + fill);
        fill += n;
        so += n;
        if (so === segLen[si]) {
          si++;
          so = 0;
        }
      }
      st.held[slot] = seq;
      st.nextSeq = next(seq);
      socket.write(encodeChunk(slot, seq, base, want));
      if (corked) {
        corked = false;
        socket.uncork();
      }
      o.metrics.chunks.inc();
      onSent(want);
      sent += want;
      if (throttle.bytesPerSec > 0 && sent < nbytes) await sleep((want / throttle.bytesPerSec) * 1000);
    }
    return true;
  }

  /**
   * 3.4 "Shared region": DATA, then per granted segment piece (at most a slot's bytes) an SHM_CHUNK
   * naming where the bytes lie in the region, at most `slots` unreleased at once; resolves once
   * every chunk is posted. The pins hold until the NOTIF (or the lease, EC-CONTRACT 4.4, 5.3),
   * which the reader sends after it copied the last chunk out and released it.
   */
  async #streamRegion(
    st: ShmServerConn,
    socket: net.Socket,
    region: Uint8Array,
    blocks: readonly number[],
    blockBytes: number,
    nbytes: number,
    throttle: { bytesPerSec: number; chunkBytes: number },
    onSent: (n: number) => void,
  ): Promise<boolean> {
    const o = this.#o;
    const window = st.held.length;
    if (o.region === undefined || region.buffer !== o.region.bytes.buffer || region.byteOffset !== 0)
      throw new EcError("EC_BAD_OPTION", "shm: the served region is not the shared region");
    const pieceBytes = throttle.bytesPerSec > 0 ? Math.min(o.slotBytes, throttle.chunkBytes) : o.slotBytes;
    const { segStart, segLen } = segments(blocks, blockBytes, nbytes);
    const live = (): boolean => st.state === ConnState.ACTIVE && !socket.destroyed;
    socket.cork();
    socket.write(encodeFrame({ op: "data", nbytes }));
    let corked = true;
    const uncork = (): void => {
      if (corked) {
        corked = false;
        socket.uncork();
      }
    };
    let sent = 0;
    for (let si = 0; si < segStart.length; si++) {
      const len = segLen[si] as number;
      for (let so = 0; so < len; ) {
        const seq = st.nextSeq;
        const slot = (seq - 1) % window;
        while (st.held[slot] !== 0 && live()) {
          uncork();
          await new Promise<void>((resolve) => {
            st.waiter = resolve;
          });
        }
        if (!live()) return false;
        const n = Math.min(pieceBytes, len - so);
        st.held[slot] = seq;
        st.nextSeq = next(seq);
        // No copy: the granted bytes stay in the pinned region, the chunk says where.
        socket.write(encodeChunk(slot, seq, (segStart[si] as number) + so, n));
        o.metrics.chunks.inc();
        onSent(n);
        so += n;
        sent += n;
        if (throttle.bytesPerSec > 0 && sent < nbytes) {
          uncork();
          await sleep((n / throttle.bytesPerSec) * 1000);
        }
      }
    }
    uncork();
    // Resolved once every chunk is posted (as the ring's): the pins hold until the reader's NOTIF
    // (or the lease), and the reader sends it after releasing the last chunk it copied out.
    return live();
  }
}

/** Smallest first piece of a READ (a quarter slot above it): latency of the reader's first byte. */
const FIRST_PIECE_MIN = 256 * 1024;

/** The seq after `s` (u32, 0 skipped: 0 marks a free slot). */
function next(s: number): number {
  return s === 0xffff_ffff ? 1 : s + 1;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
