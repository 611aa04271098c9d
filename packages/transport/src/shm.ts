// The shm transport's shared memory (issue 23): koffi, an optional peer dependency loaded on
// first use of a shm+ endpoint like zeromq for zmq+, maps per-session /dev/shm files; this file
// holds the loader, the mapping and the doorbell codec. Client and server: shm-client.ts,
// shm-server.ts; the protocol is docs/transport.md "shm". The session-file rules (naming, 0600 and
// ownership checks, dead-pid sweep, the room check) are exported: @tapwire/ec-connector's shm data
// plane maps its rings with them instead of a second copy.
import { randomBytes } from "node:crypto";
import * as fs from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { TransportError } from "./errors.js";

/** Where shm files are created and looked up by default. */
export const DEFAULT_SHM_DIR = "/dev/shm";
/** Default size of each of a session's two areas (stage and copy): 8 MiB, 16 MiB mapped. */
export const DEFAULT_SHM_BYTES = 8 * 1024 * 1024;
/** Name of a session file: `tapwire-<creator pid>-<16 hex>`. */
export const SHM_NAME = /^tapwire-([0-9]{1,10})-[0-9a-f]{16}$/;

/** What a user whose install lacks koffi reads (the client then falls back to the socket). */
export const KOFFI_MISSING_MESSAGE =
  'shm+unix:// endpoints map shared memory through the optional peer dependency "koffi" (3.x): ' +
  "install it next to @tapwire/transport with `npm i koffi` or `pnpm add koffi`";

/** The libc calls the mapping needs, bound through koffi ({@link bindLibc}). */
export interface Libc {
  /** mmap(2); koffi's pointer, or one whose address is MAP_FAILED. */
  readonly mmap: (
    addr: unknown,
    len: number,
    prot: number,
    flags: number,
    fd: number,
    off: number,
  ) => unknown;
  /** munmap(2). */
  readonly munmap: (addr: unknown, len: number) => number;
  /** posix_fallocate(3): 0, or the errno (28: ENOSPC). */
  readonly posixFallocate: (fd: number, off: number, len: number) => number;
  /** The address of a pointer mmap returned. */
  readonly address: (p: unknown) => bigint;
  /** An ArrayBuffer over `len` bytes at a pointer mmap returned (no copy). */
  readonly view: (p: unknown, len: number) => ArrayBuffer;
  /** The address of a view's first byte (`memset(v, 0, 0)` returns its first argument). */
  readonly addressOf: (v: Uint8Array) => bigint;
}

// Linux x86-64 / arm64 values.
const PROT_READ = 1;
const PROT_WRITE = 2;
const MAP_SHARED = 1;
const MAP_PRIVATE = 2;
const MAP_FIXED = 0x10;
const MAP_ANONYMOUS = 0x20;
const MAP_NORESERVE = 0x4000;
const MAP_POPULATE = 0x8000;
const MAP_FAILED = 0xffff_ffff_ffff_ffffn;

type KoffiLike = {
  load(path: string): { func(decl: string): (...args: unknown[]) => unknown };
  address(p: unknown): bigint;
  view(p: unknown, len: number): ArrayBuffer;
};

let loader: () => Promise<unknown> = () => import("koffi");
let loaded: Libc | null = null;
let loading: Promise<Libc> | null = null;

/** libc once loaded, else null. */
export function loadedLibc(): Libc | null {
  return loaded;
}

/**
 * Loads koffi and binds libc once.
 * @throws {TransportError} `TRANSPORT_SHM_UNAVAILABLE` naming the install command.
 */
export function loadLibc(): Promise<Libc> {
  if (loaded !== null) return Promise.resolve(loaded);
  if (loading === null) {
    loading = loader().then(
      (m) => bindLibc(m),
      (e: unknown) => {
        loading = null;
        throw new TransportError("TRANSPORT_SHM_UNAVAILABLE", KOFFI_MISSING_MESSAGE, { cause: e });
      },
    );
  }
  return loading;
}

/**
 * Binds libc through the koffi module `m` (as `import("koffi")` or `require("koffi")` gives it),
 * once per process: later calls return the first binding. For a package that loads koffi itself
 * (its own optional peer, its own missing-koffi error); others use the shm endpoints.
 * @throws the koffi error when libc cannot be bound (not Linux, no glibc).
 */
export function bindLibc(m: unknown): Libc {
  if (loaded !== null) return loaded;
  const k = (
    (m as { load?: unknown }).load !== undefined ? m : (m as { default: unknown }).default
  ) as KoffiLike;
  const libc = k.load("libc.so.6");
  const mmap = libc.func("void *mmap(void *addr, size_t len, int prot, int flags, int fd, int64_t off)");
  const munmap = libc.func("int munmap(void *addr, size_t len)");
  const fall = libc.func("int posix_fallocate(int fd, int64_t off, int64_t len)");
  const memset = libc.func("void *memset(void *d, int c, size_t n)");
  loaded = {
    mmap: mmap as Libc["mmap"],
    munmap: munmap as Libc["munmap"],
    posixFallocate: fall as Libc["posixFallocate"],
    address: (p) => k.address(p),
    view: (p, len) => k.view(p, len),
    addressOf: (v) => k.address(memset(v, 0, 0)),
  };
  return loaded;
}

/**
 * Loads koffi synchronously (it is CommonJS), for an arena made in a constructor.
 * @throws {TransportError} `TRANSPORT_SHM_UNAVAILABLE` naming the install command.
 */
export function loadLibcSync(): Libc {
  if (loaded !== null) return loaded;
  try {
    return bindLibc(createRequire(import.meta.url)("koffi"));
  } catch (e) {
    throw new TransportError("TRANSPORT_SHM_UNAVAILABLE", KOFFI_MISSING_MESSAGE, { cause: e });
  }
}

/** Internal, for tests: replaces how koffi is imported (and forgets a loaded one). */
export function setKoffiLoader(fn: () => Promise<unknown>): void {
  loader = fn;
  loaded = null;
  loading = null;
}

function failed(p: unknown, libc: Libc): boolean {
  return p === null || libc.address(p) === MAP_FAILED;
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

const swept = new Set<string>();

/** {@link sweepStaleShmFiles} the first time this process creates a session file in `dir`. */
function sweepOnce(dir: string): void {
  if (swept.has(dir)) return;
  swept.add(dir);
  sweepStaleShmFiles(dir);
}

/**
 * Unlinks the `tapwire-<pid>-<16 hex>` files in `dir` whose creator pid is dead: what a SIGKILL
 * between creating a shm file and unlinking it leaves, whichever package created it (transport's
 * sessions, ec-connector's rings). Returns how many went; an unreadable `dir` is 0.
 */
export function sweepStaleShmFiles(dir: string): number {
  let n = 0;
  let names: string[];
  try {
    names = fs.readdirSync(dir);
  } catch {
    return 0;
  }
  for (const name of names) {
    const m = SHM_NAME.exec(name);
    if (m === null) continue;
    const pid = Number(m[1]);
    if (pid === process.pid || pidAlive(pid)) continue;
    try {
      fs.unlinkSync(join(dir, name));
      n++;
    } catch {
      // raced with another sweeper or not ours to remove
    }
  }
  return n;
}

/** Free bytes of the file system holding `dir` (statfs), or null when unknown. */
export function freeBytes(dir: string): number | null {
  try {
    const s = fs.statfsSync(dir);
    return s.bavail * s.bsize;
  } catch {
    return null;
  }
}

/**
 * A fixed range of this process's address space that shm files are mapped into (MAP_FIXED) and,
 * once a session ends, replaced by anonymous zero pages: views of it never dangle, so a late
 * reader sees zeros, never a fault. Only {@link ShmRange.free} returns the range.
 */
export class ShmRange {
  /** The whole range as bytes (valid until {@link free}). */
  readonly bytes: Uint8Array;
  /** Bytes of the range (a file mapped over it must have at least as many). */
  readonly size: number;
  readonly #libc: Libc;
  readonly #addr: unknown;
  readonly #populate: boolean;
  #mapped = false;
  #freed = false;

  /**
   * Reserves `size` bytes (a page multiple) of private anonymous memory. `options.populate`: a
   * file mapped over the range is pre-faulted (MAP_POPULATE), so the first pass over it takes no
   * page fault per page (a 8 MiB writable mapping: about 2048 faults otherwise).
   * @throws {TransportError} `TRANSPORT_SHM_UNAVAILABLE` when mmap refuses.
   */
  constructor(libc: Libc, size: number, options: { readonly populate?: boolean } = {}) {
    const p = libc.mmap(
      null,
      size,
      PROT_READ | PROT_WRITE,
      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
      -1,
      0,
    );
    if (failed(p, libc))
      throw new TransportError("TRANSPORT_SHM_UNAVAILABLE", `mmap of ${size} bytes failed`);
    this.#libc = libc;
    this.#addr = p;
    this.#populate = options.populate === true;
    this.size = size;
    this.bytes = new Uint8Array(libc.view(p, size));
  }

  /** True while a file is mapped into the range. */
  get mapped(): boolean {
    return this.#mapped;
  }

  /** Maps `fd` (a file of at least `size` bytes) over the range, shared. */
  map(fd: number, writable: boolean): void {
    if (this.#freed) throw new TransportError("TRANSPORT_CLOSED", "shm range freed");
    const prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
    const flags = MAP_SHARED | MAP_FIXED | (this.#populate ? MAP_POPULATE : 0);
    const p = this.#libc.mmap(this.#addr, this.size, prot, flags, fd, 0);
    if (failed(p, this.#libc))
      throw new TransportError("TRANSPORT_SHM_UNAVAILABLE", `mmap of the shm file failed`);
    this.#mapped = true;
  }

  /** Like {@link unmapFile}, keeping the content of the first `keep` bytes. */
  unmapFileKeep(keep: number): void {
    if (!this.#mapped || this.#freed) return;
    const save = keep > 0 ? Buffer.from(this.bytes.subarray(0, keep)) : null;
    this.unmapFile();
    if (save !== null) this.bytes.set(save);
  }

  /** Drops the file's pages: the range becomes anonymous zero pages again. */
  unmapFile(): void {
    if (!this.#mapped || this.#freed) return;
    this.#libc.mmap(
      this.#addr,
      this.size,
      PROT_READ | PROT_WRITE,
      MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
      -1,
      0,
    );
    this.#mapped = false;
  }

  /** Returns the range (views of it must no longer be read). */
  free(): void {
    if (this.#freed) return;
    this.#freed = true;
    this.#mapped = false;
    this.#libc.munmap(this.#addr, this.size);
  }
}

/** What a {@link createSessionFile} room error calls the mapping and how its user makes it smaller. */
export interface ShmSpaceWords {
  /** The mapping, as in "a session mapping needs N". */
  readonly mapping: string;
  /** The advice to shrink it, as in "lower the shm bytes option". */
  readonly lower: string;
  /** The end of the message after {@link lower} (default ", or use unix://); falling back to the socket"). */
  readonly fallback?: string;
}

/** A transport session's words (docs/transport.md "Fallback"). */
const SESSION_WORDS: ShmSpaceWords = { mapping: "a session mapping", lower: "lower the shm bytes option" };

/**
 * Creates a session file of `range.size` bytes in `dir` named `tapwire-<pid>-<16 hex>` (0600,
 * exclusive, its pages allocated so that a full /dev/shm fails here and not with SIGBUS later),
 * after sweeping `dir` once per process ({@link sweepStaleShmFiles}), and maps it read/write over
 * `range`, keeping the range's first `keep` bytes. Returns its name; the caller unlinks it once
 * the peer holds it.
 *
 * @throws {TransportError} `TRANSPORT_SHM_SPACE` naming the size needed and the size available
 *   (in `words`, default a transport session's); `TRANSPORT_SHM_UNAVAILABLE` for any other failure.
 */
export function createSessionFile(
  libc: Libc,
  dir: string,
  range: ShmRange,
  keep = 0,
  words: ShmSpaceWords = SESSION_WORDS,
): string {
  sweepOnce(dir);
  const { fd, path, name } = openAllocated(libc, dir, range.size, words);
  try {
    // what the caller already wrote into the range (an arena's stage area) survives the remap
    if (keep > 0) fs.writeSync(fd, range.bytes, 0, keep, 0);
    range.map(fd, true);
    return name;
  } catch (e) {
    fs.rmSync(path, { force: true });
    throw e;
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * Creates a file of `range.size` bytes in `dir` by the same rules as {@link createSessionFile}
 * (room check, `tapwire-<pid>-<16 hex>`, 0600, exclusive, pages allocated) but unlinks it at once
 * and keeps it open: nothing is left in `dir` even after SIGKILL, and peers reach it only through
 * `/proc/<pid>/fd/<fd>`. Maps it read/write over `range` and returns the fd (the caller closes it).
 *
 * @throws {TransportError} `TRANSPORT_SHM_SPACE` naming the size needed and the size available
 *   (in `words`); `TRANSPORT_SHM_UNAVAILABLE` for any other failure.
 */
export function createUnlinkedShmFile(
  libc: Libc,
  dir: string,
  range: ShmRange,
  words: ShmSpaceWords,
): number {
  const { fd } = openAllocated(libc, dir, range.size, words, true);
  try {
    range.map(fd, true);
    return fd;
  } catch (e) {
    fs.closeSync(fd);
    throw e;
  }
}

/**
 * The one owner of a tapwire shm file's creation rules: the room check against `dir`'s free bytes,
 * the name, `wx+` with mode 0600, and `posix_fallocate` of every page (a full /dev/shm fails here,
 * not with SIGBUS later). With `unlinkFirst` the name is removed right after the open, before
 * anything else can fail. On failure nothing is left open or on disk.
 */
function openAllocated(
  libc: Libc,
  dir: string,
  size: number,
  words: ShmSpaceWords,
  unlinkFirst = false,
): { fd: number; path: string; name: string } {
  const free = freeBytes(dir);
  if (free !== null && free < size) throw spaceError(dir, size, free, words);
  const name = `tapwire-${process.pid}-${randomBytes(8).toString("hex")}`;
  const path = join(dir, name);
  let fd: number;
  try {
    fd = fs.openSync(path, "wx+", 0o600);
  } catch (e) {
    throw new TransportError("TRANSPORT_SHM_UNAVAILABLE", `cannot create ${path}: ${String(e)}`, {
      cause: e,
    });
  }
  try {
    if (unlinkFirst) fs.unlinkSync(path);
    const err = libc.posixFallocate(fd, 0, size);
    if (err !== 0) {
      throw err === 28 // ENOSPC
        ? spaceError(dir, size, freeBytes(dir) ?? 0, words)
        : new TransportError(
            "TRANSPORT_SHM_UNAVAILABLE",
            `posix_fallocate(${path}, ${size}) failed: errno ${err}`,
          );
    }
    return { fd, path, name };
  } catch (e) {
    if (!unlinkFirst) fs.rmSync(path, { force: true });
    fs.closeSync(fd);
    throw e;
  }
}

function spaceError(dir: string, need: number, free: number, words: ShmSpaceWords): TransportError {
  return new TransportError(
    "TRANSPORT_SHM_SPACE",
    `shm: ${dir} has ${free} bytes free, ${words.mapping} needs ${need} (raise the size of ${dir}, e.g. ` +
      `docker --shm-size, ${words.lower}${words.fallback ?? ", or use unix://); falling back to the socket"}`,
  );
}

/**
 * Opens the peer's session file `name` in `dir` read-only and maps it over `range`: it must be a
 * regular file of exactly `range.size` bytes, owned by this process's user, with no group or
 * other permission bits.
 * @throws {TransportError} `TRANSPORT_PROTOCOL` naming the refused check;
 *   `TRANSPORT_SHM_UNAVAILABLE` when mmap refuses.
 */
export function attachSessionFile(dir: string, name: string, range: ShmRange): void {
  if (!SHM_NAME.test(name))
    throw new TransportError("TRANSPORT_PROTOCOL", `shm: bad session name ${JSON.stringify(name)}`);
  const path = join(dir, name);
  let fd: number;
  try {
    fd = fs.openSync(path, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
  } catch (e) {
    throw new TransportError("TRANSPORT_PROTOCOL", `shm: cannot open ${path}: ${String(e)}`, { cause: e });
  }
  try {
    const st = fs.fstatSync(fd);
    const uid = process.getuid?.() ?? st.uid;
    if (!st.isFile()) throw new TransportError("TRANSPORT_PROTOCOL", `shm: ${path} is not a regular file`);
    if (st.uid !== uid || (st.mode & 0o077) !== 0)
      throw new TransportError("TRANSPORT_PROTOCOL", `shm: ${path} is not private to uid ${uid} (mode 0600)`);
    if (st.size !== range.size)
      throw new TransportError(
        "TRANSPORT_PROTOCOL",
        `shm: ${path} is ${st.size} bytes, announced ${range.size}`,
      );
    range.map(fd, false);
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * Shared memory for the requests of `shm+unix://` clients that outlives their connections
 * (issue 23, docs/transport.md "shm"): a stage area of {@link ShmArena.size} bytes a caller
 * writes requests (or their rows) into, then sends views of with `request`/`requestParts` over a
 * client made with `{ shmArena }`, which then leave by offset, never copied on this side; plus a
 * copy area of the same size the client uses for other large parts. Private anonymous memory
 * until a connection attaches it (its content is kept across connections). One connection at a
 * time: the client holding it detaches it when it closes.
 */
export class ShmArena {
  /** Bytes of the stage area. */
  readonly size: number;
  /** The stage area (the same view for the arena's life). */
  readonly bytes: Uint8Array;
  /** @internal The mapped range: stage area then copy area. */
  readonly range: ShmRange;
  /** @internal The libc binding. */
  readonly libc: Libc;
  /** @internal The client whose connection holds the arena, if any. */
  holder: object | null = null;

  /** @internal Use {@link createShmArena}. */
  constructor(libc: Libc, size: number) {
    this.libc = libc;
    this.size = size;
    this.range = new ShmRange(libc, 2 * size);
    this.bytes = this.range.bytes.subarray(0, size);
  }
}

/**
 * Makes a {@link ShmArena} of `size` bytes (a multiple of 4096 in [64 KiB, 1 GiB]), or returns
 * null when shared memory is unavailable here (no `koffi`, mmap refused); a client then simply
 * uses the socket.
 * @throws {TransportError} `TRANSPORT_BAD_OPTION` for a bad size.
 */
export function createShmArena(size: number): ShmArena | null {
  if (!Number.isInteger(size) || size < MIN_SHM_BYTES || size > MAX_SHM_BYTES || size % 4096 !== 0) {
    throw new TransportError(
      "TRANSPORT_BAD_OPTION",
      `shm arena size ${String(size)} is not a multiple of 4096 in [${MIN_SHM_BYTES}, ${MAX_SHM_BYTES}]`,
    );
  }
  try {
    return new ShmArena(loadLibcSync(), size);
  } catch {
    return null;
  }
}

// ---- doorbell codec (docs/transport.md "shm") ----

/** Socket message kinds of the shm transport (u32 LE at offset 0). */
export const ShmKind = { ATTACH: 1, BELL: 2 } as const;
/** ATTACH: kind, version, area bytes, name length (u32 each), then the name. */
export const ATTACH_FIXED = 16;
/** Protocol version an ATTACH carries. */
export const SHM_VERSION = 1;
/** BELL: kind, seq, total length (u32), region count, reserved (u16), then regions of (offset, length). */
export const BELL_FIXED = 16;
/** Most regions one doorbell may name. */
export const MAX_REGIONS = 64;
/** Largest doorbell header. */
export const MAX_BELL_HEADER = BELL_FIXED + 8 * MAX_REGIONS;
/** ATTACH reply statuses (u32 LE). */
export const AttachStatus = { OK: 0, REFUSED: 1 } as const;
/** Smallest and largest area size of a session (each of its two areas). */
export const MIN_SHM_BYTES = 64 * 1024;
/** Largest area size (two areas must fit the u32 offsets). */
export const MAX_SHM_BYTES = 1024 * 1024 * 1024;
