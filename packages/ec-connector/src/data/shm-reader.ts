// The consumer side of the shm data plane (issue 23, docs/ec-protocol.md 3.4): a new connection to
// a producer whose metadata offers shm sends SHM_ATTACH, maps the ring the SHM_OFFER names
// read-only, and from then on each SHM_CHUNK is copied once into the destination blocks, CRC'd there
// as it landed, then released. From a producer with a shared region (3.4 "Shared region") it maps
// that region read-only instead and each SHM_CHUNK names granted bytes in it.
import type * as net from "node:net";
import type { Logger } from "pino";
import { crc32 } from "../crc.js";
import { EcError } from "../errors.js";
import {
  AttachedStatus,
  AttachFlags,
  encodeAttach,
  encodeAttached,
  encodeRelease,
  OfferStatus,
  type ShmToReader,
} from "./shm-frame.js";
import { ShmMapping, ShmPeerRegion, shmAvailable } from "./shm-map.js";
import type { ShmMetrics } from "./shm-server.js";
import { recordSourceRun, type SourceRuns } from "./source-runs.js";

/**
 * Copy then CRC in pieces of at most this size, so the CRC reads the piece from this core's L2
 * (2 MiB on the dev VM) right after the copy wrote it. Measured on the 2-core dev VM (16 MiB,
 * 2 x 4 MiB ring): whole 4 MiB pieces were no slower than 256 KiB ones within the noise of a
 * loaded machine; the CRC (~14 GB/s) dominates the copy (~24 GB/s).
 */
const PIECE = 1024 * 1024;
/**
 * The piece of a shared-region read (3.4 "Shared region"): there the copy + CRC is the whole
 * transfer, and 256 KiB pieces measured 1.72-1.75x the unix socket against 1.39-1.42x for 1 MiB
 * ones (16 MiB, bench shm_data_plane, alternating runs, 1-minute load 7.5-8 on the 2-core dev VM):
 * the landed piece is still in L1/L2 for its CRC when other processes share the caches.
 */
const REGION_PIECE = 256 * 1024;

const ReaderState = { ATTACHING: "attaching", ACTIVE: "active", OFF: "off" } as const;
type ReaderState = (typeof ReaderState)[keyof typeof ReaderState];

/** One reader connection's shm state. */
export class ShmReaderConn {
  state: ReaderState = ReaderState.ATTACHING;
  map: ShmMapping | ShmPeerRegion | null = null;
  /** The producer's shared region is mapped (3.4 "Shared region"): chunks point into it. */
  region = false;
  slots = 0;
  slotBytes = 0;
  /** The seq the next SHM_CHUNK must carry. */
  seq = 1;
  /** True between a DATA and its last chunk. */
  body = false;
  /** Frames posted before the offer was answered (the READ), sent after SHM_ATTACHED. */
  pending: Buffer[] = [];
}

/** The fields of a posted read a chunk advances (reader.ts's read record). */
export interface ShmReadTarget {
  segStart: number[];
  segLen: number[];
  seg: number;
  segOff: number;
  nbytes: number;
  received: number;
  checksum: boolean;
  crc: number;
  /** 3.4 "Shared region": where its chunks came from (null: not recorded, a ring). */
  src: SourceRuns | null;
  /** The most source runs the item can have (its blocks). */
  srcMaxRuns: number;
}

/** Options of {@link ShmDataReader}. */
export interface ShmReaderOptions {
  /** Directory the producers' ring files are looked up in (default /dev/shm). */
  readonly dir: string;
  readonly metrics: ShmMetrics;
  readonly logger: Logger;
}

function malformed(why: string): EcError {
  return new EcError("EC_MALFORMED", `shm data frame: ${why}`);
}

/** The shm half of a data reader. */
export class ShmDataReader {
  readonly #o: ShmReaderOptions;
  #warned = false;

  constructor(o: ShmReaderOptions) {
    this.#o = o;
  }

  /**
   * A new connection to a producer that offers shm: sends SHM_ATTACH and returns its state, or
   * null when this process cannot map (no koffi; reported once) and the socket carries the bytes.
   */
  begin(socket: net.Socket): ShmReaderConn | null {
    if (!shmAvailable()) {
      this.#fallback("koffi is not installed: the shm data plane falls back to the unix socket");
      return null;
    }
    // 3.4 "Shared region": this reader can map a producer's shared region (a producer without
    // one answers with a ring, as without the flag).
    socket.write(encodeAttach(undefined, AttachFlags.REGION));
    return new ShmReaderConn();
  }

  /** Writes `frame` now, or after the offer is answered while the connection attaches. */
  send(st: ShmReaderConn, socket: net.Socket, frame: Buffer): void {
    if (st.state === ReaderState.ATTACHING) st.pending.push(frame);
    else socket.write(frame);
  }

  /** True when DATA's bytes come as chunks on this connection (and marks the body started). */
  bodyStarts(st: ShmReaderConn): boolean {
    if (st.state !== ReaderState.ACTIVE) return false;
    st.body = true;
    return true;
  }

  #fallback(why: string): void {
    this.#o.metrics.fallbacks.inc();
    if (this.#warned) return;
    this.#warned = true;
    this.#o.logger.warn({ why }, "shm data plane unavailable; reading over the socket");
  }

  /** SHM_OFFER: maps the ring (or declines it), then sends what waited. Throws `EC_MALFORMED`. */
  onOffer(st: ShmReaderConn, socket: net.Socket, f: Extract<ShmToReader, { op: "offer" }>): void {
    if (st.state !== ReaderState.ATTACHING) throw malformed("SHM_OFFER not asked for");
    if (f.status === OfferStatus.REFUSED) {
      this.#fallback(`the producer refused a ring: ${f.text}`);
      st.state = ReaderState.OFF;
    } else {
      try {
        if (f.status === OfferStatus.REGION) {
          const m = /^([1-9][0-9]{0,9})\/([0-9]{1,9})$/.exec(f.text);
          if (m === null) throw malformed(`SHM_OFFER region ${JSON.stringify(f.text)}`);
          st.map = ShmPeerRegion.open(Number(m[1]), Number(m[2]));
          st.region = true;
        } else st.map = ShmMapping.open(this.#o.dir, f.text, f.slots * f.slotBytes);
        st.slots = f.slots;
        st.slotBytes = f.slotBytes;
        st.state = ReaderState.ACTIVE;
      } catch (err) {
        this.#fallback((err as Error).message);
        st.state = ReaderState.OFF;
      }
      socket.write(
        encodeAttached(st.state === ReaderState.ACTIVE ? AttachedStatus.MAPPED : AttachedStatus.DECLINED),
      );
    }
    for (const b of st.pending.splice(0)) socket.write(b);
  }

  /**
   * SHM_CHUNK of the current read: checks it names the next slot exactly and fits what is left,
   * copies the bytes once into the destination and CRCs them there, releases the slot. With
   * `landed` (the reader's checksum thread) each landed piece is handed to it instead of CRC'd
   * here, so the next piece's copy overlaps the thread's CRC of this one. Throws `EC_MALFORMED` for a chunk the protocol does not allow (the reader closes).
   */
  chunk(
    st: ShmReaderConn,
    socket: net.Socket,
    f: Extract<ShmToReader, { op: "chunk" }>,
    r: ShmReadTarget,
    region: Uint8Array,
    corrupt: boolean,
    landed: ((r: ShmReadTarget, start: number, n: number) => void) | null = null,
  ): void {
    const ring = st.map?.bytes;
    if (st.state !== ReaderState.ACTIVE || !st.body || ring === undefined)
      throw malformed("SHM_CHUNK outside a DATA");
    const slot = (st.seq - 1) % st.slots;
    if (f.seq !== st.seq) throw malformed(`SHM_CHUNK seq ${f.seq}, expected ${st.seq}`);
    if (st.region) {
      // 3.4 "Shared region": the granted bytes where they lie, inside the mapping.
      if (f.slot !== slot || f.offset + f.length > ring.length)
        throw malformed(
          `SHM_CHUNK of ${f.length} bytes at ${f.offset} in window slot ${f.slot}: outside the ${ring.length}-byte region or not slot ${slot}`,
        );
    } else if (f.slot !== slot || f.offset !== slot * st.slotBytes)
      throw malformed(
        `SHM_CHUNK in slot ${f.slot} at ${f.offset}, expected slot ${slot} at ${slot * st.slotBytes}`,
      );
    const left = r.nbytes - r.received;
    if (f.length === 0 || f.length > st.slotBytes || f.length > left)
      throw malformed(`SHM_CHUNK of ${f.length} bytes (slot ${st.slotBytes}, ${left} left)`);
    if (st.region && r.src !== null) recordSourceRun(r.src, f.offset, f.length, r.srcMaxRuns);
    let src = f.offset;
    const end = f.offset + f.length;
    const piece = st.region ? REGION_PIECE : PIECE;
    while (src < end) {
      const dst = (r.segStart[r.seg] as number) + r.segOff;
      const n = Math.min(end - src, (r.segLen[r.seg] as number) - r.segOff, piece);
      // The one copy, then (EC-CONTRACT 6.3) the CRC over the bytes as they landed in the
      // destination, still in this core's cache: what is checked is what gets promoted, even if
      // the producer rewrote the slot meanwhile (CRC'ing the ring first left that window open).
      region.set(ring.subarray(src, src + n), dst);
      if (corrupt) {
        // Test fault: the landed bytes differ from what was sent.
        region[dst] = (region[dst] as number) ^ 0xff;
        corrupt = false;
      }
      if (r.checksum) {
        if (landed !== null) landed(r, dst, n);
        else r.crc = crc32(region.subarray(dst, dst + n), r.crc);
      }
      src += n;
      r.received += n;
      r.segOff += n;
      if (r.segOff === r.segLen[r.seg]) {
        r.seg++;
        r.segOff = 0;
      }
    }
    socket.write(encodeRelease(f.slot, f.seq));
    st.seq = st.seq === 0xffff_ffff ? 1 : st.seq + 1;
    if (r.received === r.nbytes) st.body = false;
    this.#o.metrics.chunks.inc();
  }

  /** The connection is gone: unmaps its ring (no view of it is read afterwards). */
  closed(st: ShmReaderConn | null): void {
    if (st === null) return;
    st.state = ReaderState.OFF;
    st.body = false;
    st.pending.length = 0;
    st.map?.close();
    st.map = null;
  }
}
