// Scatter reads for receive placement (issue 23): once a receiveInto plan is accepted, the rest of
// the message is read with readv(2) straight into the plan's segments, many segments per syscall,
// instead of one libuv read per segment (Node's onread takes one buffer per read). A STEP of 64
// slots x 1 row of 24 KiB was 64 reads of ~2 µs each; with readv it is one per wake-up.
//
// The descriptor is read behind libuv's back, but only from inside the socket's own onread callback
// (stream-conn.ts), where libuv is reading it anyway: when readv drains the socket, libuv's next
// read(2) sees EAGAIN and goes back to waiting, exactly as after a short read of its own. readv
// never reads past the last segment (the message's end), so the stream position stays where the
// CONTRACT 3 framing expects it. Errors and EOF are left to libuv (readv <= 0: nothing is consumed;
// libuv's next read reports them as usual).
import type { NativeLibc } from "./native.js";

/** iovecs per readv (Linux IOV_MAX is 1024; one STEP's rows are far fewer segments than this). */
const MAX_IOV = 256;
/**
 * Only ArrayBuffers at least this large are read into: V8 keeps typed arrays of up to 64 bytes
 * inside the JS heap, where the garbage collector may move them; larger backing stores never move.
 */
const MIN_STABLE_BYTES = 4096;

/** Where the next byte of a placed message goes, and how far a scatter read moved it. */
export interface SegmentCursor {
  /** Index of the current segment. */
  idx: number;
  /** Offset in the current segment. */
  off: number;
}

/** readv(2) into receive-placement segments of one socket. */
export class ScatterReader {
  readonly #libc: NativeLibc;
  readonly #fd: number;
  /** struct iovec[MAX_IOV] as u32 words: base lo, base hi, len lo, len hi. */
  readonly #iov = new Uint32Array(MAX_IOV * 4);
  /** Backing-store address by ArrayBuffer (window buffers are reused STEP after STEP). */
  readonly #addr = new WeakMap<ArrayBufferLike, number>();

  constructor(libc: NativeLibc, fd: number) {
    this.#libc = libc;
    this.#fd = fd;
  }

  /**
   * Reads what the socket holds, up to the segments' end, into `segs` from `cur`; advances `cur`.
   * Returns the bytes read (0 when nothing was queued, at EOF, on an error, or when a segment is
   * not a plain ArrayBuffer view this reader can address: libuv's own read then takes over).
   * `want` is set to how many bytes were asked for (fewer read means the socket is drained).
   */
  read(segs: readonly Uint8Array[], cur: SegmentCursor, out: { want: number }): number {
    const iov = this.#iov;
    let n = 0;
    let want = 0;
    for (let i = cur.idx; i < segs.length && n < MAX_IOV; i++) {
      const seg = segs[i] as Uint8Array;
      const off = i === cur.idx ? cur.off : 0;
      const len = seg.length - off;
      if (len <= 0) continue;
      const base = addressOf(this.#libc, this.#addr, seg.buffer);
      if (base < 0) {
        if (n === 0) return 0;
        break;
      }
      const a = base + seg.byteOffset + off;
      const w = n * 4;
      iov[w] = a % 0x100000000;
      iov[w + 1] = Math.floor(a / 0x100000000);
      iov[w + 2] = len;
      iov[w + 3] = 0;
      want += len;
      n++;
    }
    out.want = want;
    if (n === 0) return 0;
    const got = this.#libc.readv(this.#fd, iov, n);
    if (!(got > 0)) return 0;
    // Advance the cursor over `got` bytes.
    let left = got;
    let i = cur.idx;
    let off = cur.off;
    while (left > 0) {
      const room = (segs[i] as Uint8Array).length - off;
      if (left < room) {
        off += left;
        left = 0;
      } else {
        left -= room;
        i++;
        off = 0;
      }
    }
    cur.idx = i;
    cur.off = off;
    return got;
  }
}

/**
 * writev(2) of a request's parts straight from the caller's buffers (issue 23, client side): one
 * syscall for the prefix and every part, without a Node stream write (and its bookkeeping) per
 * part. Used only while nothing is queued in the socket, so the bytes keep their order; whatever
 * the kernel did not take goes through the socket's ordinary writes.
 */
export class GatherWriter {
  readonly #libc: NativeLibc;
  readonly #fd: number;
  readonly #iov = new Uint32Array(MAX_IOV * 4);
  readonly #addr = new WeakMap<ArrayBufferLike, number>();

  constructor(libc: NativeLibc, fd: number) {
    this.#libc = libc;
    this.#fd = fd;
  }

  /**
   * Writes `head` then `parts` (empty ones skipped) in one writev. Returns the bytes the kernel
   * took (0 on EAGAIN or an error, which the socket's own write then reports), or -1 when nothing
   * was tried (too many parts, or a part this writer cannot address: the caller writes as usual).
   */
  write(head: Uint8Array, parts: readonly Uint8Array[]): number {
    if (parts.length + 1 > MAX_IOV) return -1;
    const iov = this.#iov;
    let n = 0;
    for (let i = -1; i < parts.length; i++) {
      const p = i < 0 ? head : (parts[i] as Uint8Array);
      if (p.length === 0) continue;
      const base = addressOf(this.#libc, this.#addr, p.buffer);
      if (base < 0) return -1;
      const a = base + p.byteOffset;
      const w = n * 4;
      iov[w] = a % 0x100000000;
      iov[w + 1] = Math.floor(a / 0x100000000);
      iov[w + 2] = p.length;
      iov[w + 3] = 0;
      n++;
    }
    const got = this.#libc.writev(this.#fd, iov, n);
    return Math.max(got, 0);
  }
}

/** A stable backing store's address (cached), or -1 (small in-heap, detached, shared). */
function addressOf(libc: NativeLibc, cache: WeakMap<ArrayBufferLike, number>, ab: ArrayBufferLike): number {
  let a = cache.get(ab);
  if (a !== undefined) return ab.byteLength === 0 ? -1 : a;
  if (ab.byteLength < MIN_STABLE_BYTES || !(ab instanceof ArrayBuffer)) return -1;
  a = libc.memmove(ab, ab, 0);
  if (!(typeof a === "number" && a > 0)) return -1;
  cache.set(ab, a);
  return a;
}
