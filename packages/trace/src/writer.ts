import { close as fsClose, open as fsOpen, write as fsWrite } from "node:fs";
import { APP_HEADER_SIZE, HELLO_BODY_SIZE, HelloFlag, Op, rowsOffsetFor, SampleMode } from "@tapwire/wire";
import { TraceError, TraceErrorCode } from "./errors.js";
import {
  TraceHeaderOffset as H,
  RecordOffset as R,
  RECORD_HEAD_SIZE,
  RecordFlag,
  RecordKind,
  RowsPolicy,
  recordPad,
  TRACE_FORMAT_VERSION,
  TRACE_HEADER_SIZE,
  TRACE_MAGIC,
  TraceSource,
} from "./format.js";

/**
 * What a link endpoint calls to capture its frames (CONTRACT 4: whole frames, header first).
 * {@link TraceWriter} implements it; every method copies what it needs and returns at once.
 */
export interface LinkTap {
  /**
   * A request frame as it goes out (or came in): one buffer, or the parts sent back to back
   * (scatter/gather). Only `frameLen` bytes are read.
   */
  request(frame: Uint8Array | readonly Uint8Array[], frameLen: number): void;
  /** The reply frame `frame[0, length)` of the last request; `rttUs` as the caller measured it. */
  reply(frame: Uint8Array, length: number, rttUs: number): void;
}

/** Options of {@link TraceWriter}. */
export interface TraceWriterOptions {
  /** File to write (created or truncated). */
  path: string;
  /**
   * Bytes of the ring between the tap and the background writer (default 64 MiB, at least
   * 64 KiB). A record that does not fit is dropped and counted; the tap never waits.
   */
  ringBytes?: number;
  /**
   * Which STEPs keep their rows: `"all"` (default, needed for a replay with parity), `"none"`
   * (drafts, statuses and timing only), or a number `k`: one STEP in `k` keeps its rows.
   */
  rows?: "all" | "none" | number;
  /** How often the background writer flushes the ring, ms (default 20). */
  flushIntervalMs?: number;
  /** Who writes the trace (default `"client"`). */
  source?: "client" | "worker";
  /** Writer name stored in the header (UTF-8, at most 32 bytes; default the source). */
  name?: string;
}

/** Counters of a {@link TraceWriter}. */
export interface TraceWriterStats {
  /** Records placed in the ring. */
  records: number;
  /** Records dropped because the ring was full (or the file failed). */
  dropped: number;
  /** STEP requests stored without their rows. */
  rowsOmitted: number;
  /** Frames seen before the first HELLO request (not recorded: the header needs the HELLO). */
  beforeHello: number;
  /** Bytes written to the file so far. */
  bytesWritten: number;
  /** Most bytes the ring held at once. */
  ringHighWater: number;
  /** Nanoseconds spent in the tap (copying into the ring), for the cost of capture. */
  tapNs: number;
}

/** Defaults of {@link TraceWriterOptions}. */
export const TRACE_WRITER_DEFAULTS = {
  ringBytes: 64 * 1024 * 1024,
  minRingBytes: 64 * 1024,
  flushIntervalMs: 20,
} as const;

const TWO32 = 2 ** 32;

function bad(message: string): TraceError {
  return new TraceError(TraceErrorCode.BAD_OPTION, message);
}

/**
 * Writes a trace file (docs/trace.md) off the hot path: the tap methods copy each frame into a
 * ring sized once, and a background writer flushes the ring to the file with asynchronous
 * writes. When the ring is full a record is dropped and counted (a GAP record marks the place),
 * never waited for. The file header is written at the first HELLO request, whose body it holds.
 */
export class TraceWriter implements LinkTap {
  /** The file being written. */
  readonly path: string;
  readonly #ring: Uint8Array;
  readonly #dv: DataView;
  readonly #cap: number;
  readonly #policy: RowsPolicy;
  readonly #every: number;
  readonly #source: number;
  readonly #name: string;
  readonly #interval: number;
  readonly #t0 = performance.now();
  readonly #startUnixMs = Date.now();
  // data in [tail, head) when !wrapped, else in [tail, end) then [0, head)
  #head = 0;
  #tail = 0;
  #end = 0;
  #wrapped = false;
  #writing = false;
  #fd: number | null = null;
  #opening: Promise<void>;
  #pos = 0;
  #timer: ReturnType<typeof setTimeout> | null = null;
  #closed = false;
  #ioError: Error | null = null;
  #sampled = false;
  #steps = 0;
  #pendingDrops = 0;
  #idleWaiters: (() => void)[] = [];
  readonly #st: TraceWriterStats = {
    records: 0,
    dropped: 0,
    rowsOmitted: 0,
    beforeHello: 0,
    bytesWritten: 0,
    ringHighWater: 0,
    tapNs: 0,
  };
  #hasHeader = false;

  /** @throws TraceError `TRACE_BAD_OPTION` naming the bad option. */
  constructor(options: TraceWriterOptions) {
    if (typeof options !== "object" || options === null) throw bad("options must be an object");
    if (typeof options.path !== "string" || options.path === "")
      throw bad("option path must be a non-empty string");
    this.path = options.path;
    const cap = options.ringBytes ?? TRACE_WRITER_DEFAULTS.ringBytes;
    if (!Number.isInteger(cap) || cap < TRACE_WRITER_DEFAULTS.minRingBytes || cap > 2 ** 31) {
      throw bad(`option ringBytes ${String(cap)} is not an integer in [65536, 2^31]`);
    }
    const rows = options.rows ?? "all";
    if (rows === "all") {
      this.#policy = RowsPolicy.ALL;
      this.#every = 0;
    } else if (rows === "none") {
      this.#policy = RowsPolicy.NONE;
      this.#every = 0;
    } else if (Number.isInteger(rows) && (rows as number) >= 1 && (rows as number) <= 0xffff) {
      this.#policy = rows === 1 ? RowsPolicy.ALL : RowsPolicy.SAMPLED;
      this.#every = rows === 1 ? 0 : (rows as number);
    } else {
      throw bad(`option rows ${String(rows)} is not "all", "none" or an integer in 1..65535`);
    }
    const interval = options.flushIntervalMs ?? TRACE_WRITER_DEFAULTS.flushIntervalMs;
    if (!Number.isInteger(interval) || interval < 1 || interval > 60_000) {
      throw bad(`option flushIntervalMs ${String(interval)} is not an integer in 1..60000`);
    }
    this.#interval = interval;
    const source = options.source ?? "client";
    if (source !== "client" && source !== "worker")
      throw bad(`option source ${String(source)} is not client or worker`);
    this.#source = source === "client" ? TraceSource.CLIENT : TraceSource.WORKER;
    const name = options.name ?? source;
    if (typeof name !== "string" || Buffer.byteLength(name, "utf8") > 32) {
      throw bad("option name must be a string of at most 32 UTF-8 bytes");
    }
    this.#name = name;
    this.#cap = cap;
    this.#ring = new Uint8Array(cap);
    this.#dv = new DataView(this.#ring.buffer);
    this.#opening = new Promise((resolve) => {
      fsOpen(this.path, "w", (err, fd) => {
        if (err !== null) this.#ioError = err;
        else this.#fd = fd;
        resolve();
      });
    });
  }

  /** A copy of the counters. */
  stats(): TraceWriterStats {
    return { ...this.#st };
  }

  /** True once the file header (the first HELLO) is in the ring. */
  get started(): boolean {
    return this.#hasHeader;
  }

  /** {@inheritDoc LinkTap.request} */
  request(frame: Uint8Array | readonly Uint8Array[], frameLen: number): void {
    if (this.#closed) return;
    const t = performance.now();
    const first = frame instanceof Uint8Array ? frame : frame[0];
    if (first === undefined || first.length < APP_HEADER_SIZE || frameLen < APP_HEADER_SIZE) return;
    const op = first[6]!;
    let flags = 0;
    let stored = frameLen;
    if (op === Op.HELLO) {
      if (frameLen !== APP_HEADER_SIZE + HELLO_BODY_SIZE) return;
      if (!this.#hasHeader && !this.#writeHeader(frame)) return;
      flags |= RecordFlag.AUTH_ZEROED;
    } else if (!this.#hasHeader) {
      this.#st.beforeHello++;
      return;
    } else if (op === Op.STEP && this.#policy !== RowsPolicy.ALL && first.length >= APP_HEADER_SIZE + 16) {
      const nReq = first[32]! | (first[33]! << 8) | (first[34]! << 16) | (first[35]! << 24);
      const rowsAt = APP_HEADER_SIZE + rowsOffsetFor(Math.min(nReq >>> 0, 1 << 20), this.#sampled);
      const keep = this.#policy === RowsPolicy.SAMPLED && this.#steps % this.#every === 0;
      this.#steps++;
      if (!keep && rowsAt < frameLen) {
        stored = rowsAt;
        flags |= RecordFlag.ROWS_OMITTED;
        this.#st.rowsOmitted++;
      }
    }
    const at = this.#record(RecordKind.REQUEST, flags, frameLen, stored, 0, t);
    if (at >= 0) {
      this.#copy(frame, at + R.FRAME, stored);
      // the header's seq, and HELLO auth zeroed (docs/trace.md: no secret material in a trace)
      this.#dv.setUint32(at + R.SEQ, this.#dv.getUint32(at + R.FRAME + 8, true), true);
      if (op === Op.HELLO)
        this.#ring.fill(0, at + R.FRAME + APP_HEADER_SIZE + 96, at + R.FRAME + APP_HEADER_SIZE + 128);
    }
    this.#st.tapNs += (performance.now() - t) * 1e6;
  }

  /** {@inheritDoc LinkTap.reply} */
  reply(frame: Uint8Array, length: number, rttUs: number): void {
    if (this.#closed || !this.#hasHeader || length < APP_HEADER_SIZE || length > frame.length) return;
    const t = performance.now();
    const at = this.#record(
      RecordKind.REPLY,
      0,
      length,
      length,
      Math.min(Math.max(0, Math.round(rttUs)), 0xffffffff),
      t,
    );
    if (at >= 0) {
      this.#ring.set(frame.subarray(0, length), at + R.FRAME);
      this.#dv.setUint32(at + R.SEQ, this.#dv.getUint32(at + R.FRAME + 8, true), true);
    }
    this.#st.tapNs += (performance.now() - t) * 1e6;
  }

  /** Resolves once everything in the ring so far is in the file. */
  async flush(): Promise<void> {
    await this.#opening;
    if (this.#ioError !== null) {
      throw new TraceError(TraceErrorCode.IO, `trace ${this.path}: ${this.#ioError.message}`, {
        cause: this.#ioError,
      });
    }
    if (!this.#empty() || this.#writing) {
      await new Promise<void>((resolve) => {
        this.#idleWaiters.push(resolve);
        this.#kick();
      });
    }
    const late = this.#ioError as Error | null;
    if (late !== null) {
      throw new TraceError(TraceErrorCode.IO, `trace ${this.path}: ${late.message}`, { cause: late });
    }
  }

  /**
   * Writes the END record, flushes and closes the file; resolves the final counters. Later tap
   * calls are ignored. A trace that never saw a HELLO is an empty file.
   * @throws TraceError `TRACE_IO` when the file could not be written.
   */
  async close(): Promise<TraceWriterStats> {
    if (this.#closed) return this.stats();
    if (this.#hasHeader) {
      this.#flushGap(performance.now());
      const at = this.#reserve(RECORD_HEAD_SIZE);
      if (at >= 0)
        this.#fill(at, RECORD_HEAD_SIZE, RecordKind.END, 0, 0, 0, this.#st.dropped, performance.now());
    }
    this.#closed = true;
    try {
      await this.flush();
    } finally {
      if (this.#timer !== null) clearTimeout(this.#timer);
      this.#timer = null;
      const fd = this.#fd;
      this.#fd = null;
      if (fd !== null) await new Promise<void>((resolve) => fsClose(fd, () => resolve()));
    }
    return this.stats();
  }

  // ------------------------------------------------------------------ ring

  #writeHeader(frame: Uint8Array | readonly Uint8Array[]): boolean {
    const at = this.#reserve(TRACE_HEADER_SIZE);
    if (at !== 0) return false;
    const b = this.#ring;
    const dv = this.#dv;
    b.fill(0, 0, TRACE_HEADER_SIZE);
    this.#copy(frame, TRACE_HEADER_SIZE, APP_HEADER_SIZE + HELLO_BODY_SIZE);
    // the HELLO body, read back from the scratch space right after the header
    b.copyWithin(
      H.HELLO,
      TRACE_HEADER_SIZE + APP_HEADER_SIZE,
      TRACE_HEADER_SIZE + APP_HEADER_SIZE + HELLO_BODY_SIZE,
    );
    b.fill(0, H.HELLO + 96, H.HELLO + 128);
    b.set(TRACE_MAGIC, H.MAGIC);
    dv.setUint16(H.VERSION, TRACE_FORMAT_VERSION, true);
    dv.setUint16(H.HEADER_LEN, TRACE_HEADER_SIZE, true);
    b[H.SOURCE] = this.#source;
    b[H.ROWS_POLICY] = this.#policy;
    dv.setUint16(H.ROWS_EVERY, this.#every, true);
    dv.setUint32(H.START_UNIX_MS, this.#startUnixMs % TWO32, true);
    dv.setUint32(H.START_UNIX_MS + 4, Math.floor(this.#startUnixMs / TWO32), true);
    const hello = H.HELLO;
    dv.setUint32(H.ROW_BYTES, dv.getUint32(hello + 76, true), true);
    dv.setUint16(H.NUM_SPEC, dv.getUint16(hello + 66, true), true);
    dv.setUint16(H.WINDOW, dv.getUint16(hello + 64, true), true);
    b[H.SAMPLE_MODE] = b[hello + 68]!;
    b[H.MARGIN] = (dv.getUint32(hello + 92, true) & HelloFlag.WANT_MARGIN) !== 0 ? 1 : 0;
    dv.setUint32(H.MAX_SLOTS, dv.getUint32(hello + 84, true), true);
    dv.setUint32(H.VOCAB_SIZE, dv.getUint32(hello + 80, true), true);
    dv.setUint32(H.HELLO_LEN, HELLO_BODY_SIZE, true);
    b.fill(0, TRACE_HEADER_SIZE, TRACE_HEADER_SIZE + APP_HEADER_SIZE + HELLO_BODY_SIZE);
    b.set(Buffer.from(this.#name, "utf8"), H.WRITER_NAME);
    this.#sampled = b[H.SAMPLE_MODE] === SampleMode.TOP32;
    this.#hasHeader = true;
    this.#committed();
    return true;
  }

  // places a record's fixed part; returns its ring offset or -1 (dropped and counted)
  #record(kind: number, flags: number, frameLen: number, stored: number, aux: number, t: number): number {
    const len = recordPad(RECORD_HEAD_SIZE + stored);
    // the GAP goes in only together with the record after it (one GAP per run of drops)
    if (this.#pendingDrops === 0 || this.#canReserve(RECORD_HEAD_SIZE + len)) this.#flushGap(t);
    const at = this.#pendingDrops === 0 ? this.#reserve(len) : -1;
    if (at < 0) {
      this.#st.dropped++;
      this.#pendingDrops++;
      return -1;
    }
    this.#fill(at, len, kind, flags, frameLen, stored, aux, t);
    this.#st.records++;
    return at;
  }

  #flushGap(t: number): void {
    if (this.#pendingDrops === 0) return;
    const at = this.#reserve(RECORD_HEAD_SIZE);
    if (at < 0) return;
    this.#fill(at, RECORD_HEAD_SIZE, RecordKind.GAP, 0, 0, 0, this.#pendingDrops, t);
    this.#pendingDrops = 0;
  }

  #fill(
    at: number,
    len: number,
    kind: number,
    flags: number,
    frameLen: number,
    stored: number,
    aux: number,
    t: number,
  ): void {
    const dv = this.#dv;
    const us = Math.max(0, Math.round((t - this.#t0) * 1000));
    dv.setUint32(at + R.RECORD_LEN, len, true);
    this.#ring[at + R.KIND] = kind;
    this.#ring[at + R.FLAGS] = flags;
    dv.setUint16(at + R.RESERVED, 0, true);
    dv.setUint32(at + R.T_US, us % TWO32, true);
    dv.setUint32(at + R.T_US + 4, Math.floor(us / TWO32), true);
    dv.setUint32(at + R.SEQ, 0, true);
    dv.setUint32(at + R.FRAME_LEN, frameLen, true);
    dv.setUint32(at + R.STORED_LEN, stored, true);
    dv.setUint32(at + R.AUX, aux, true);
    const pad = RECORD_HEAD_SIZE + stored;
    if (pad < len) this.#ring.fill(0, at + pad, at + len);
    this.#committed();
  }

  #copy(frame: Uint8Array | readonly Uint8Array[], at: number, n: number): void {
    const b = this.#ring;
    if (frame instanceof Uint8Array) {
      b.set(n === frame.length ? frame : frame.subarray(0, n), at);
      return;
    }
    let left = n;
    for (const p of frame) {
      if (left <= 0) break;
      const k = Math.min(left, p.length);
      b.set(k === p.length ? p : p.subarray(0, k), at);
      at += k;
      left -= k;
    }
  }

  #empty(): boolean {
    return !this.#wrapped && this.#head === this.#tail;
  }

  #used(): number {
    return this.#wrapped ? this.#end - this.#tail + this.#head : this.#head - this.#tail;
  }

  // whether #reserve(len) would succeed now (no state change)
  #canReserve(len: number): boolean {
    if (this.#ioError !== null || len > this.#cap) return false;
    if (!this.#wrapped) {
      if (this.#head === this.#tail && !this.#writing) return true;
      return this.#head + len <= this.#cap || len < this.#tail;
    }
    return this.#head + len < this.#tail;
  }

  // contiguous space of `len` bytes, or -1; never waits
  #reserve(len: number): number {
    if (this.#ioError !== null || len > this.#cap) return -1;
    if (!this.#wrapped) {
      if (this.#head === this.#tail && !this.#writing) {
        this.#head = 0;
        this.#tail = 0;
      }
      if (this.#head + len <= this.#cap) {
        const at = this.#head;
        this.#head += len;
        return at;
      }
      // strictly below tail, so that head === tail keeps meaning empty
      if (len < this.#tail) {
        this.#end = this.#head;
        this.#wrapped = true;
        this.#head = len;
        return 0;
      }
      return -1;
    }
    if (this.#head + len < this.#tail) {
      const at = this.#head;
      this.#head += len;
      return at;
    }
    return -1;
  }

  #committed(): void {
    const used = this.#used();
    if (used > this.#st.ringHighWater) this.#st.ringHighWater = used;
    if (this.#timer === null && !this.#writing) {
      // large backlog: flush on the next turn, else on the interval
      const delay = used > this.#cap / 4 ? 0 : this.#interval;
      this.#timer = setTimeout(() => {
        this.#timer = null;
        this.#kick();
      }, delay);
      this.#timer.unref?.();
    }
  }

  #kick(): void {
    if (this.#writing) return;
    if (this.#fd === null) {
      if (this.#ioError !== null) {
        this.#drain();
        return;
      }
      this.#writing = true;
      void this.#opening.then(() => {
        this.#writing = false;
        this.#kick();
      });
      return;
    }
    if (this.#empty()) {
      this.#drain();
      return;
    }
    const from = this.#tail;
    const to = this.#wrapped ? this.#end : this.#head;
    const wrapAfter = this.#wrapped;
    this.#writing = true;
    fsWrite(this.#fd, this.#ring, from, to - from, this.#pos, (err, n) => {
      this.#writing = false;
      if (err !== null) {
        this.#ioError = err;
        this.#drain();
        return;
      }
      this.#pos += n;
      this.#st.bytesWritten += n;
      if (n < to - from) this.#tail = from + n;
      else if (wrapAfter) {
        this.#tail = 0;
        this.#wrapped = false;
      } else this.#tail = to;
      if (this.#empty()) this.#drain();
      else this.#kick();
    });
  }

  #drain(): void {
    const w = this.#idleWaiters;
    this.#idleWaiters = [];
    for (const f of w) f();
  }
}
