/**
 * The tester's own `shm+unix://` client, written from docs/transport.md "shm: requests through
 * shared memory on one host" alone (issue 23), never from `@tapwire/transport`: the session file
 * in `/dev/shm` (name, 0600, `O_EXCL`, size), the ATTACH and BELL messages of the doc's tables,
 * and the request bytes written into the mapped file. `koffi` is not a dependency of this
 * package (it cannot be added without changing the lockfile), so the tester writes the
 * mapping's pages with `node:fs` positional writes on the open file: the server's `MAP_SHARED`
 * mapping of the same tmpfs file sees them. That is still an independent implementation of the
 * doorbell protocol; only `posix_fallocate` is replaced by a `statfs` room check and writing
 * the file's pages once.
 */
import { randomBytes } from "node:crypto";
import * as fs from "node:fs";
import { join } from "node:path";
import type { Endpoint, RawConn, Received } from "./conn.js";
import { connectStream } from "./conn.js";
import { ConformanceError } from "./errors.js";
import { lePrefix, u32, w16, w32 } from "./frames.js";

/** Socket message kinds of docs/transport.md "shm" (the first u32 of every message). */
export const ShmKind = {
  /** Names the session file; answered by a u32 status. */
  ATTACH: 1,
  /** Wraps one request: inline bytes followed by regions of the mapping. */
  BELL: 2,
} as const;

/** ATTACH answers of docs/transport.md "shm". */
export const ShmAttachStatus = {
  /** The server maps the file. */
  OK: 0,
  /** The server refused it: the client falls back to inline BELLs. */
  REFUSED: 1,
} as const;

/** The ATTACH `version` of the doc. */
export const SHM_VERSION = 1;
/** Fixed bytes of an ATTACH before the name, and of a BELL before its regions. */
export const SHM_FIXED_BYTES = 16;
/** Most regions one BELL may name. */
export const SHM_MAX_REGIONS = 64;
/** Longest session name of an ATTACH. */
export const SHM_MAX_NAME = 64;
/** Page size the mapping is a multiple of. */
export const SHM_PAGE = 4096;
/** The default `shmDir`. */
export const DEFAULT_SHM_DIR = "/dev/shm";
/** Session file names: `tapwire-<pid>-<16 hex>`. */
export const SHM_NAME_RE = /^tapwire-([0-9]+)-[0-9a-f]{16}$/;

/** Options of the tester's shm client. */
export interface ShmClientOptions {
  /** Bytes of each of the two areas (default 1 MiB, so a 2 MiB mapping per connection). */
  shmBytes?: number;
  /** Directory of session files (default `/dev/shm`; the worker's `shmDir` must be the same). */
  shmDir?: string;
}

/** A region of a BELL. */
export interface Region {
  /** Byte offset in the mapping. */
  offset: number;
  /** Byte length. */
  length: number;
}

/** The ATTACH message of the doc's table (without the socket's length prefix). */
export function attachMsg(name: string, mappingBytes: number, version = SHM_VERSION): Uint8Array {
  const nb = Buffer.from(name, "latin1");
  const m = new Uint8Array(SHM_FIXED_BYTES + nb.length);
  w32(m, 0, ShmKind.ATTACH);
  w32(m, 4, version);
  w32(m, 8, mappingBytes);
  w32(m, 12, nb.length);
  m.set(nb, SHM_FIXED_BYTES);
  return m;
}

/** The BELL message of the doc's table: header, `regions`, then `inline` (`total` defaults to their sum). */
export function bellMsg(
  seq: number,
  regions: readonly Region[],
  inline: Uint8Array,
  total?: number,
): Uint8Array {
  const m = new Uint8Array(SHM_FIXED_BYTES + 8 * regions.length + inline.length);
  let sum = inline.length;
  for (const r of regions) sum += r.length;
  w32(m, 0, ShmKind.BELL);
  w32(m, 4, seq);
  w32(m, 8, total ?? sum);
  w16(m, 12, regions.length);
  w16(m, 14, 0);
  regions.forEach((r, i) => {
    w32(m, SHM_FIXED_BYTES + 8 * i, r.offset);
    w32(m, SHM_FIXED_BYTES + 8 * i + 4, r.length);
  });
  m.set(inline, SHM_FIXED_BYTES + 8 * regions.length);
  return m;
}

const swept = new Set<string>();

/** True when process `pid` exists (EPERM: it exists under another user). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

/**
 * Removes `tapwire-<dead pid>-*` files from `dir` (the doc: every process sweeps them the first
 * time it creates a session file). Returns the names removed.
 */
export function sweepDeadSessionFiles(dir: string): string[] {
  const gone: string[] = [];
  let names: string[];
  try {
    names = fs.readdirSync(dir);
  } catch {
    return gone;
  }
  for (const n of names) {
    const m = SHM_NAME_RE.exec(n);
    if (m === null || alive(Number(m[1]))) continue;
    try {
      fs.unlinkSync(join(dir, n));
      gone.push(n);
    } catch {
      // Raced with its owner or another sweeper: gone either way.
    }
  }
  return gone;
}

/** A session file created as the doc says: `tapwire-<pid>-<16 hex>`, 0600, `O_EXCL`, its pages allocated. */
export class SessionFile {
  /** Absolute path while it exists. */
  readonly path: string;
  /** Open read-write descriptor (kept after the unlink: the pages live on). */
  readonly fd: number;
  private unlinked = false;
  private closed = false;

  /**
   * Creates the file of `bytes` bytes in `dir` with file mode `mode` (default 0600; cases use
   * others on purpose).
   * @throws ConformanceError `CONFORMANCE_SHM` when `dir` lacks room or the file cannot be made.
   */
  constructor(
    readonly dir: string,
    readonly bytes: number,
    readonly name = `tapwire-${process.pid}-${randomBytes(8).toString("hex")}`,
    mode = 0o600,
  ) {
    if (!swept.has(dir)) {
      swept.add(dir);
      sweepDeadSessionFiles(dir);
    }
    try {
      const s = fs.statfsSync(dir);
      const free = s.bavail * s.bsize;
      if (free < bytes)
        throw new ConformanceError(
          "CONFORMANCE_SHM",
          `shm: ${dir} has ${free} bytes free, a session mapping needs ${bytes}`,
        );
    } catch (e) {
      if (e instanceof ConformanceError) throw e;
    }
    this.path = join(dir, name);
    const c = fs.constants;
    try {
      this.fd = fs.openSync(this.path, c.O_RDWR | c.O_CREAT | c.O_EXCL | c.O_NOFOLLOW, mode);
    } catch (e) {
      throw new ConformanceError("CONFORMANCE_SHM", `shm: cannot create ${this.path}: ${String(e)}`, {
        cause: e,
      });
    }
    try {
      fs.fchmodSync(this.fd, mode); // the umask must not decide the mode
      // posix_fallocate stand-in: write every page once, so a full tmpfs fails here, not later.
      const zeros = Buffer.alloc(Math.min(bytes, 1 << 20));
      for (let o = 0; o < bytes; o += zeros.length)
        fs.writeSync(this.fd, zeros, 0, Math.min(zeros.length, bytes - o), o);
    } catch (e) {
      this.close();
      throw new ConformanceError("CONFORMANCE_SHM", `shm: cannot allocate ${this.path}: ${String(e)}`, {
        cause: e,
      });
    }
  }

  /** Writes `bytes` at `offset` of the mapping (a positional write through the shared file). */
  write(offset: number, bytes: Uint8Array): void {
    let done = 0;
    while (done < bytes.length)
      done += fs.writeSync(this.fd, bytes, done, bytes.length - done, offset + done);
  }

  /** Removes the name (the doc: once both ends hold the file). */
  unlink(): void {
    if (this.unlinked) return;
    this.unlinked = true;
    try {
      fs.unlinkSync(this.path);
    } catch {
      // Already gone.
    }
  }

  /** Unlinks (if not yet) and closes the descriptor. */
  close(): void {
    this.unlink();
    if (this.closed) return;
    this.closed = true;
    fs.closeSync(this.fd);
  }
}

/**
 * A `shm+unix://` connection: the unix socket of the endpoint with ATTACH done (when
 * `attach` is true), every request wrapped in a BELL. A request goes into the mapping as one
 * region (a multipart send: one region per part), at the next free place of a ring over the
 * mapping that skips regions still unanswered; what does not fit travels inline. Replies are
 * read from the socket unchanged.
 */
export class ShmConn implements RawConn {
  /** Not a stream of CONTRACT 3 prefixes: every message is a BELL. */
  readonly stream = false;
  /** True once the worker answered the ATTACH OK. */
  attached = false;
  /** The ATTACH answer (null: not sent, or no answer). */
  attachStatus: number | null = null;
  /** Seq of the next BELL (the first is 1). */
  nextSeq = 1;
  private ring = 0;
  private readonly inFlight: Region[][] = [];

  constructor(
    /** The unix socket (a length-prefixed stream). */
    readonly sock: RawConn,
    /** The session file (null: never attached, inline BELLs only). */
    readonly file: SessionFile | null,
  ) {}

  /** Sends the ATTACH of the file and reads its status; unlinks the file whatever the answer. */
  async attach(timeoutMs: number): Promise<Received> {
    const f = this.file as SessionFile;
    this.sock.send(attachMsg(f.name, f.bytes));
    const r = await this.sock.recv(timeoutMs);
    f.unlink();
    if (r.kind === "msg" && r.bytes.length === 4) {
      this.attachStatus = u32(r.bytes, 0);
      this.attached = this.attachStatus === ShmAttachStatus.OK;
    }
    return r;
  }

  /** Places `n` bytes in the ring avoiding `busy`, or null when no free place fits them. */
  private place(n: number, busy: readonly Region[]): number | null {
    const size = this.file?.bytes ?? 0;
    if (!this.attached || n === 0 || n > size) return null;
    const fits = (o: number) =>
      o + n <= size && busy.every((b) => o + n <= b.offset || b.offset + b.length <= o);
    const at = fits(this.ring) ? this.ring : fits(0) ? 0 : null;
    if (at === null) return null;
    // 64-byte aligned, and never at the same place twice running: a stale offset shows.
    this.ring = (at + n + 64 + 63) & ~63;
    if (this.ring >= size) this.ring = 0;
    return at;
  }

  /** True when a request of `n` bytes would travel inline (no ATTACH, or larger than the mapping). */
  inline(n: number): boolean {
    return !this.attached || n > (this.file?.bytes ?? 0);
  }

  /**
   * CONTRACT 11 over shm: an inline BELL announcing a `total`-byte request of which only the first
   * bytes `head` are sent (socket prefix 16 + total, the BELL header, then `head`): the worker must
   * answer from the request's own header before the body arrives, as on a byte stream.
   */
  sendInlineHead(head: Uint8Array, total: number): void {
    if (this.sock.isClosed) return;
    const bell = bellMsg(this.nextSeq, [], new Uint8Array(0), total);
    this.sock.sendRaw(lePrefix(bell.length + total));
    this.sock.sendRaw(bell);
    this.sock.sendRaw(head);
    this.inFlight.push([]);
    this.nextSeq = (this.nextSeq + 1) >>> 0;
  }

  /** Sends `parts` (their concatenation is the request) as one BELL: one region per part, or all inline. */
  bell(parts: readonly Uint8Array[]): void {
    if (this.sock.isClosed) return;
    const nonEmpty = parts.filter((p) => p.length > 0);
    const busy = this.inFlight.flat();
    let regions: Region[] = [];
    for (const p of nonEmpty) {
      const at = nonEmpty.length <= SHM_MAX_REGIONS ? this.place(p.length, busy) : null;
      if (at === null) {
        regions = []; // the doc's fallback shape: the whole request inline
        break;
      }
      const r = { offset: at, length: p.length };
      regions.push(r);
      busy.push(r);
    }
    let inline: Uint8Array = new Uint8Array(0);
    if (regions.length === nonEmpty.length && regions.length > 0)
      regions.forEach((r, i) => {
        this.file!.write(r.offset, nonEmpty[i]!);
      });
    else {
      regions = [];
      inline = nonEmpty.length === 1 ? nonEmpty[0]! : new Uint8Array(Buffer.concat(nonEmpty));
    }
    this.inFlight.push(regions);
    this.sock.send(bellMsg(this.nextSeq, regions, inline));
    this.nextSeq = (this.nextSeq + 1) >>> 0;
  }

  /** Sends a doorbell exactly as given (hostile cases), without touching seq or the ring. */
  sendBell(msg: Uint8Array): void {
    this.sock.send(msg);
  }

  get isClosed(): boolean {
    return this.sock.isClosed;
  }
  send(msg: Uint8Array): void {
    this.bell([msg]);
  }
  sendRaw(bytes: Uint8Array): void {
    this.bell([bytes]);
  }
  sendParts(parts: Uint8Array[]): void {
    this.bell(parts);
  }
  async recv(timeoutMs: number): Promise<Received> {
    const r = await this.sock.recv(timeoutMs);
    if (r.kind === "msg") this.inFlight.shift();
    return r;
  }
  waitClosed(ms: number): Promise<boolean> {
    return this.sock.waitClosed(ms);
  }
  close(): void {
    this.sock.close();
    this.file?.close();
  }
}

/** What {@link connectShm} does beyond the socket. */
export interface ShmConnectOptions extends ShmClientOptions {
  /** Create the file and ATTACH it (default true); false: inline BELLs only (the fallback). */
  attach?: boolean;
}

/**
 * Connects to a `shm+unix://` endpoint: creates the session file, connects the socket, sends
 * the ATTACH and unlinks the file. A REFUSED ATTACH leaves a working connection whose BELLs
 * carry their requests inline (`conn.attached` false).
 * @throws ConformanceError `CONFORMANCE_CONNECT` (the socket), `CONFORMANCE_SHM` (the file).
 */
export async function connectShm(
  ep: Endpoint,
  timeoutMs: number,
  opts: ShmConnectOptions = {},
): Promise<ShmConn> {
  const half = opts.shmBytes ?? 1 << 20;
  if (!Number.isInteger(half) || half < 65536 || half > 1 << 30 || half % SHM_PAGE !== 0)
    throw new ConformanceError(
      "CONFORMANCE_BAD_OPTION",
      `shmBytes ${half} must be a multiple of ${SHM_PAGE} in [65536, 2^30]`,
    );
  const sock = await connectStream(ep.path, timeoutMs);
  if (opts.attach === false) return new ShmConn(sock, null);
  let file: SessionFile;
  try {
    file = new SessionFile(opts.shmDir ?? DEFAULT_SHM_DIR, 2 * half);
  } catch (e) {
    sock.close();
    throw e;
  }
  const c = new ShmConn(sock, file);
  await c.attach(timeoutMs);
  return c;
}
