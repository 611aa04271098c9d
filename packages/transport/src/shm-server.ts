// The shm+unix server (issue 23, docs/transport.md "shm"): a unix-socket StreamServer whose
// handler reads doorbells, maps each connection's session file, and hands the user's handler
// the request exactly as the unix path would: one view, or its head plus the rest copied once
// from the mapping into the segments a receiveInto hook chose.
import { Registry } from "@tapwire/stats";
import { isIntIn } from "./check.js";
import { type ServerConfig, serverConfig } from "./config.js";
import { TransportError } from "./errors.js";
import type { ConnInfo, Handler, ReceivePlan, Reply, RpcServer, ServerOptions } from "./options.js";
import {
  ATTACH_FIXED,
  AttachStatus,
  attachSessionFile,
  BELL_FIXED,
  DEFAULT_SHM_DIR,
  type Libc,
  loadLibc,
  MAX_BELL_HEADER,
  MAX_REGIONS,
  MAX_SHM_BYTES,
  MIN_SHM_BYTES,
  SHM_VERSION,
  ShmKind,
  ShmRange,
} from "./shm.js";
import { StreamServer } from "./stream-server.js";

// The first bytes of a request shown to a receiveInto hook (as much as one unix read gives).
const HEAD_BYTES = 64 * 1024;
const FRAME_HEADER_BYTES = 24;

/** Per connection: its mapping, the next doorbell seq, handlers in flight. */
class ConnShm {
  range: ShmRange | null = null;
  seq = 0;
  inFlight = 0;
  closed = false;
  /** Offsets and lengths of this doorbell's regions, and a scratch buffer for gathered bytes. */
  readonly offs = new Float64Array(MAX_REGIONS);
  readonly lens = new Float64Array(MAX_REGIONS);
  scratch: Buffer | null = null;

  /** Unmaps once no handler runs: a handler still reading a request view keeps its pages. */
  free(): void {
    if (this.inFlight === 0) {
      this.range?.free();
      this.range = null;
    }
  }
}

function protocol(why: string): TransportError {
  return new TransportError("TRANSPORT_PROTOCOL", `shm doorbell: ${why}`);
}

// The doorbell framing for the inner stream connection's oversize read (its `oversizeHead`): an
// inline BELL past the unbound limit is read as the bell's fixed part, then its regions and the
// request's own 24-byte frame header (16 + 8n + 24), which #innerOversize hands to onOversize.
function bellOversizeHead(head: Uint8Array): number {
  if (head.length < BELL_FIXED) return BELL_FIXED;
  const n = head[12]! | (head[13]! << 8);
  return n > MAX_REGIONS ? head.length : BELL_FIXED + 8 * n + FRAME_HEADER_BYTES;
}

/**
 * A server on `shm+unix:///path`: the doorbell socket is a unix socket at `path`; every CONTRACT
 * 11 limit applies to the request a doorbell describes (inline bytes plus regions), not to the
 * doorbell. A doorbell that breaks the protocol (unknown kind, regions outside the mapping or
 * overlapping, a seq replayed or out of order, lengths that do not add up) closes its connection
 * with a `TRANSPORT_PROTOCOL` error reported to `onError` and counted in `transport_server_errors`.
 */
export class ShmServer implements RpcServer {
  readonly #inner: StreamServer;
  readonly #cfg: ServerConfig;
  readonly #user: Handler;
  readonly #dir: string;
  readonly #conns = new WeakMap<ConnInfo, ConnShm>();
  #libc: Libc | null = null;

  constructor(path: string, handler: Handler, options: ServerOptions) {
    const ep = { scheme: "unix" as const, path };
    this.#cfg = serverConfig(ep, options);
    const dir = options.shmDir ?? DEFAULT_SHM_DIR;
    if (typeof dir !== "string" || !dir.startsWith("/"))
      throw new TransportError(
        "TRANSPORT_BAD_OPTION",
        `option shmDir: ${String(dir)} is not an absolute path`,
      );
    this.#dir = dir;
    this.#user = handler;
    const cfg = this.#cfg;
    const user = options;
    const inner: ServerOptions = {
      ...options,
      maxMessageBytes: cfg.maxMessageBytes + MAX_BELL_HEADER,
      unboundMaxMessageBytes: cfg.unboundMaxMessageBytes + MAX_BELL_HEADER,
      ...(cfg.maxBufferedBytes > 0 ? { maxBufferedBytes: cfg.maxBufferedBytes + MAX_BELL_HEADER } : {}),
      onClose: (c: ConnInfo) => {
        const s = this.#conns.get(c);
        if (s !== undefined) {
          s.closed = true;
          s.free();
        }
        user.onClose?.(c);
      },
      // CONTRACT 11: an inline request above the unbound limit gets the user's onOversize answer
      // built from its own 24-byte frame header, which sits behind the doorbell header (16 + 8n).
      onOversize: (head, _declared, conn) => this.#innerOversize(head, conn),
      // the inner config's own counters go to a throwaway registry; the real ones are cfg's
      registry: new Registry(),
    };
    delete inner.receiveInto;
    delete inner.shmDir;
    this.#inner = new StreamServer(ep, (req, conn) => this.#handle(req, conn), {
      ...serverConfig(ep, inner),
      registry: cfg.registry,
      metrics: cfg.metrics,
      oversizeHead: bellOversizeHead,
    });
    this.registry = cfg.registry;
  }

  readonly registry: Registry;

  get endpoint(): string {
    return this.#inner.endpoint.replace(/^unix:/, "shm+unix:");
  }

  get connections(): number {
    return this.#inner.connections;
  }

  /** Binds the doorbell socket. */
  async start(): Promise<void> {
    await this.#inner.start();
  }

  close(): Promise<void> {
    return this.#inner.close();
  }

  #state(conn: ConnInfo): ConnShm {
    let s = this.#conns.get(conn);
    if (s === undefined) {
      s = new ConnShm();
      this.#conns.set(conn, s);
    }
    return s;
  }

  #handle(req: Uint8Array, conn: ConnInfo): Reply | Promise<Reply> {
    if (req.length < 4) throw protocol(`${req.length}-byte message`);
    const dv = Buffer.from(req.buffer, req.byteOffset, req.length);
    const kind = dv.readUInt32LE(0);
    if (kind === ShmKind.ATTACH) return this.#attach(dv, conn);
    if (kind !== ShmKind.BELL) throw protocol(`unknown kind ${kind}`);
    return this.#bell(dv, conn);
  }

  async #attach(req: Buffer, conn: ConnInfo): Promise<Reply> {
    const s = this.#state(conn);
    if (req.length < ATTACH_FIXED) throw protocol("ATTACH shorter than 16 bytes");
    if (s.range !== null) throw protocol("a second ATTACH on one connection");
    const version = req.readUInt32LE(4);
    const size = req.readUInt32LE(8);
    const nameLen = req.readUInt32LE(12);
    if (version !== SHM_VERSION) throw protocol(`ATTACH version ${version}, expected ${SHM_VERSION}`);
    if (nameLen !== req.length - ATTACH_FIXED || nameLen > 64)
      throw protocol(`ATTACH name length ${nameLen}`);
    if (size < 2 * MIN_SHM_BYTES || size > 2 * MAX_SHM_BYTES || size % 4096 !== 0)
      throw protocol(
        `ATTACH size ${size} outside [${2 * MIN_SHM_BYTES}, ${2 * MAX_SHM_BYTES}] or not page-aligned`,
      );
    const name = req.toString("latin1", ATTACH_FIXED);
    const reply = Buffer.alloc(4);
    let range: ShmRange | null = null;
    try {
      if (this.#libc === null) this.#libc = await loadLibc();
      range = new ShmRange(this.#libc, size);
      attachSessionFile(this.#dir, name, range);
    } catch (e) {
      range?.free();
      this.#cfg.options.onError?.(e, conn);
      reply.writeUInt32LE(AttachStatus.REFUSED, 0);
      return reply;
    }
    if (s.closed) {
      range.free();
      return null;
    }
    s.range = range;
    reply.writeUInt32LE(AttachStatus.OK, 0);
    return reply;
  }

  #bell(req: Buffer, conn: ConnInfo): Reply | Promise<Reply> {
    const s = this.#state(conn);
    if (req.length < BELL_FIXED) throw protocol("BELL shorter than 16 bytes");
    const seq = req.readUInt32LE(4);
    const expect = (s.seq + 1) >>> 0;
    if (seq !== expect) throw protocol(`seq ${seq} replayed or out of order (expected ${expect})`);
    s.seq = seq;
    const total = req.readUInt32LE(8);
    const n = req.readUInt16LE(12);
    if (n > MAX_REGIONS) throw protocol(`${n} regions, limit ${MAX_REGIONS}`);
    const hdr = BELL_FIXED + 8 * n;
    if (req.length < hdr)
      throw protocol(`${n} regions announced, ${req.length - BELL_FIXED} header bytes sent`);
    const inline = req.subarray(hdr);
    const range = s.range;
    if (n > 0 && range === null) throw protocol("regions before an ATTACH");
    let sum = inline.length;
    // Regions in ascending order (how a client lays out its rows) are disjoint when each starts at
    // or after the end of all before it: one comparison each; the pairwise check is for the rest.
    let end = 0;
    for (let i = 0; i < n; i++) {
      const off = req.readUInt32LE(BELL_FIXED + 8 * i);
      const len = req.readUInt32LE(BELL_FIXED + 8 * i + 4);
      if (len === 0) throw protocol(`region ${i} is empty`);
      if (off + len > (range as ShmRange).size)
        throw protocol(
          `region ${i} [${off}, ${off + len}) outside the ${(range as ShmRange).size}-byte mapping`,
        );
      if (off < end) {
        for (let j = 0; j < i; j++) {
          const o2 = s.offs[j] as number;
          if (off < o2 + (s.lens[j] as number) && o2 < off + len)
            throw protocol(`region ${i} [${off}, ${off + len}) overlaps region ${j}`);
        }
      }
      if (off + len > end) end = off + len;
      s.offs[i] = off;
      s.lens[i] = len;
      sum += len;
    }
    if (sum !== total) throw protocol(`total ${total}, regions and inline bytes add up to ${sum}`);
    const cfg = this.#cfg;
    const limit = conn.bound ? cfg.maxMessageBytes : cfg.unboundMaxMessageBytes;
    if (total > limit) return this.#oversize(s, inline, n, total, conn);
    if (n === 0) return this.#run(s, inline, conn, undefined);
    const bytes = (range as ShmRange).bytes;
    const whole =
      inline.length === 0 && n === 1 ? bytes.subarray(s.offs[0], (s.offs[0] as number) + total) : null;
    const hook = cfg.options.receiveInto;
    if (hook !== undefined) {
      let head =
        whole !== null
          ? whole.subarray(0, Math.min(total, HEAD_BYTES))
          : this.#gather(s, inline, n, Math.min(total, HEAD_BYTES));
      for (;;) {
        const r = hook(head, total, conn);
        if (r === null) break;
        if (typeof r === "number") {
          if (!Number.isInteger(r) || r <= head.length)
            throw new TransportError(
              "TRANSPORT_BAD_OPTION",
              `receiveInto returned ${r}, not above ${head.length}`,
            );
          if (r >= total) break;
          head = whole !== null ? whole.subarray(0, r) : this.#gather(s, inline, n, r);
          continue;
        }
        return this.#placed(s, inline, n, total, head, r, conn);
      }
    }
    return this.#run(s, whole ?? this.#gather(s, inline, n, total), conn, undefined);
  }

  /** Bytes [0, upTo) of the described request, gathered into the connection's scratch buffer. */
  #gather(s: ConnShm, inline: Uint8Array, n: number, upTo: number): Uint8Array {
    if (s.scratch === null || s.scratch.length < upTo)
      s.scratch = Buffer.allocUnsafe(Math.max(upTo, HEAD_BYTES));
    const dst = s.scratch;
    this.#copy(s, inline, n, 0, upTo, [dst.subarray(0, upTo)]);
    return dst.subarray(0, upTo);
  }

  /** Copies bytes [from, to) of the described request into `segs`, in order. */
  #copy(
    s: ConnShm,
    inline: Uint8Array,
    n: number,
    from: number,
    to: number,
    segs: readonly Uint8Array[],
  ): void {
    const bytes = (s.range as ShmRange | null)?.bytes;
    let si = 0;
    let so = 0;
    let pos = 0; // position of the current source in the request
    const put = (src: Uint8Array): void => {
      const a = Math.max(from, pos);
      const b = Math.min(to, pos + src.length);
      let i = a;
      while (i < b) {
        const seg = segs[si] as Uint8Array;
        const k = Math.min(b - i, seg.length - so);
        seg.set(src.subarray(i - pos, i - pos + k), so);
        i += k;
        so += k;
        if (so === seg.length) {
          si++;
          so = 0;
        }
      }
      pos += src.length;
    };
    put(inline);
    for (let r = 0; r < n && pos < to; r++) {
      const off = s.offs[r] as number;
      put((bytes as Uint8Array).subarray(off, off + (s.lens[r] as number)));
    }
  }

  #placed(
    s: ConnShm,
    inline: Uint8Array,
    n: number,
    total: number,
    head: Uint8Array,
    plan: ReceivePlan,
    conn: ConnInfo,
  ): Reply | Promise<Reply> {
    const hb = (plan as { headBytes?: unknown }).headBytes;
    const segs = (plan as { segments?: unknown }).segments;
    if (!isIntIn(hb, 0, head.length) || !Array.isArray(segs))
      throw new TransportError("TRANSPORT_BAD_OPTION", "receiveInto plan: bad headBytes or segments");
    let sum = 0;
    for (const g of segs) {
      if (!(g instanceof Uint8Array))
        throw new TransportError("TRANSPORT_BAD_OPTION", "receiveInto plan: a segment is not a Uint8Array");
      sum += g.length;
    }
    if (sum !== total - (hb as number))
      throw new TransportError(
        "TRANSPORT_BAD_OPTION",
        `receiveInto plan: segments hold ${sum} bytes, ${total - (hb as number)} left`,
      );
    // The head may be a view of the scratch buffer: the copy below reads the mapping and inline bytes only.
    this.#copy(s, inline, n, hb as number, total, segs as Uint8Array[]);
    const m = this.#cfg.metrics;
    m.placedMessages.inc();
    m.placedBytes.inc(sum);
    m.placedCopiedBytes.inc(sum);
    return this.#run(s, head.subarray(0, hb as number), conn, plan);
  }

  /**
   * The inner socket's oversize unbound message (an inline doorbell past the limit): `head` holds
   * its first 16 + 8n + 24 bytes (or fewer when the bell is malformed). Answers with the user's onOversize for the request's own
   * header when that header is inline; anything else (not a BELL, a header in the mapping) closes.
   */
  #innerOversize(head: Uint8Array, conn: ConnInfo): Uint8Array | null {
    const hook = this.#cfg.options.onOversize;
    if (hook === undefined || head.length < BELL_FIXED) return null;
    const b = Buffer.from(head.buffer, head.byteOffset, head.length);
    if (b.readUInt32LE(0) !== ShmKind.BELL) return null;
    const n = b.readUInt16LE(12);
    if (n > MAX_REGIONS) return null;
    const at = BELL_FIXED + 8 * n;
    if (head.length < at + FRAME_HEADER_BYTES) return null;
    // (tooLarge was counted by the inner connection, which shares these metrics)
    return hook(head.subarray(at, at + FRAME_HEADER_BYTES), b.readUInt32LE(8), conn);
  }

  #oversize(s: ConnShm, inline: Uint8Array, n: number, total: number, conn: ConnInfo): Reply {
    const cfg = this.#cfg;
    cfg.metrics.tooLarge.inc();
    const hook = cfg.options.onOversize;
    if (conn.bound || hook === undefined) return null;
    const head = Buffer.from(this.#gather(s, inline, n, Math.min(FRAME_HEADER_BYTES, total)));
    const reply = hook(head, total, conn);
    if (reply === null) return null;
    cfg.metrics.oversizeReplies.inc();
    // Close once the reply has been written (the stream connection's graceful close).
    (conn as { closeAfterReply?: boolean }).closeAfterReply = true;
    return reply;
  }

  #run(s: ConnShm, req: Uint8Array, conn: ConnInfo, plan: ReceivePlan | undefined): Reply | Promise<Reply> {
    const r = plan === undefined ? this.#user(req, conn) : this.#user(req, conn, plan);
    if (!(r instanceof Promise)) return r;
    s.inFlight++;
    const done = (): void => {
      s.inFlight--;
      if (s.closed) s.free();
    };
    return r.finally(done);
  }
}
