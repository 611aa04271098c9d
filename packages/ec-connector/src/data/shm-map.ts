// Shared memory of the EC shm data plane (issue 23, docs/ec-protocol.md 3.4): koffi, an optional
// peer dependency loaded on first use, maps per-connection /dev/shm files.
//
// One owner of mmap: this is the same libc binding, file naming (`tapwire-<pid>-<16 hex>`), stale
// sweep and space check as @tapwire/transport's src/shm.ts, kept to what the data plane needs (a
// producer-created read/write mapping, a consumer's read-only one). ec-connector does not depend
// on @tapwire/transport (adding the workspace dependency changes the lockfile, which this round
// may not); once it does, this file becomes re-exports of that one. Both sweeps recognise each
// other's files (same name pattern), so either cleans what a killed process of the other left.
import { randomBytes } from "node:crypto";
import * as fs from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { EcError } from "../errors.js";

/** Where shm files are created and looked up by default. */
export const DEFAULT_SHM_DIR = "/dev/shm";
/** Name of a session file: `tapwire-<creator pid>-<16 hex>` (as @tapwire/transport's). */
export const SHM_NAME = /^tapwire-([0-9]{1,10})-[0-9a-f]{16}$/;

/** What a user whose install lacks koffi reads (the data plane then uses the socket). */
export const KOFFI_MISSING_MESSAGE =
  'shm+unix:// data endpoints map shared memory through the optional peer dependency "koffi" (3.x): ' +
  "install it next to @tapwire/ec-connector with `npm i koffi` or `pnpm add koffi`";

interface Libc {
  readonly mmap: (
    addr: unknown,
    len: number,
    prot: number,
    flags: number,
    fd: number,
    off: number,
  ) => unknown;
  readonly munmap: (addr: unknown, len: number) => number;
  readonly posixFallocate: (fd: number, off: number, len: number) => number;
  readonly address: (p: unknown) => bigint;
  readonly view: (p: unknown, len: number) => ArrayBuffer;
}

type KoffiLike = {
  load(path: string): { func(decl: string): (...args: unknown[]) => unknown };
  address(p: unknown): bigint;
  view(p: unknown, len: number): ArrayBuffer;
};

const PROT_READ = 1;
const PROT_WRITE = 2;
const MAP_SHARED = 1;
const MAP_FAILED = 0xffff_ffff_ffff_ffffn;

let loaded: Libc | null = null;
let failure: unknown = null;
const defaultRequire = (): unknown => createRequire(import.meta.url)("koffi");
let requireKoffi: () => unknown = defaultRequire;

/**
 * libc through koffi, loaded once (koffi is CommonJS: a synchronous require).
 * @throws {EcError} `EC_SHM_UNAVAILABLE` naming the install command.
 */
export function loadLibc(): Libc {
  if (loaded !== null) return loaded;
  if (failure === null) {
    try {
      const m = requireKoffi();
      const k = (
        (m as { load?: unknown }).load !== undefined ? m : (m as { default: unknown }).default
      ) as KoffiLike;
      const libc = k.load("libc.so.6");
      loaded = {
        mmap: libc.func(
          "void *mmap(void *addr, size_t len, int prot, int flags, int fd, int64_t off)",
        ) as Libc["mmap"],
        munmap: libc.func("int munmap(void *addr, size_t len)") as Libc["munmap"],
        posixFallocate: libc.func(
          "int posix_fallocate(int fd, int64_t off, int64_t len)",
        ) as Libc["posixFallocate"],
        address: (p) => k.address(p),
        view: (p, len) => k.view(p, len),
      };
      return loaded;
    } catch (e) {
      failure = e;
    }
  }
  throw new EcError("EC_SHM_UNAVAILABLE", KOFFI_MISSING_MESSAGE, { cause: failure });
}

/** True when koffi loads and binds libc here (the shm data plane is possible). */
export function shmAvailable(): boolean {
  try {
    loadLibc();
    return true;
  } catch {
    return false;
  }
}

/** Internal, for tests: replaces how koffi is required (none: the real one) and forgets a loaded one. */
export function setKoffiRequire(fn?: () => unknown): void {
  requireKoffi = fn ?? defaultRequire;
  loaded = null;
  failure = null;
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

/**
 * Unlinks `tapwire-<pid>-*` files in `dir` whose creator pid is dead (what a SIGKILL between
 * creating a session file and unlinking it leaves). Returns how many went.
 */
export function sweepStale(dir: string): number {
  let names: string[];
  try {
    names = fs.readdirSync(dir);
  } catch {
    return 0;
  }
  let n = 0;
  for (const name of names) {
    const m = SHM_NAME.exec(name);
    if (m === null) continue;
    const pid = Number(m[1]);
    if (pid === process.pid || pidAlive(pid)) continue;
    try {
      fs.unlinkSync(join(dir, name));
      n++;
    } catch {
      // raced with another sweeper
    }
  }
  return n;
}

function freeBytes(dir: string): number | null {
  try {
    const s = fs.statfsSync(dir);
    return s.bavail * s.bsize;
  } catch {
    return null;
  }
}

function spaceError(dir: string, need: number, free: number): EcError {
  return new EcError(
    "EC_SHM_SPACE",
    `shm: ${dir} has ${free} bytes free, a data-plane ring needs ${need} (raise the size of ${dir}, ` +
      "e.g. docker --shm-size, lower shmSlotBytes, or use unix://); falling back to the socket",
  );
}

/**
 * One mapped shm file (a connection's ring). The producer creates it ({@link ShmMapping.create}:
 * 0600, exclusive, pages allocated so a full /dev/shm fails here and not with SIGBUS later) and
 * unlinks it once the consumer holds it; the consumer maps it read-only ({@link ShmMapping.open}).
 * {@link ShmMapping.bytes} must not be read after {@link ShmMapping.close}.
 */
export class ShmMapping {
  /** The mapped bytes. */
  readonly bytes: Uint8Array;
  /** The file's name in its directory (`tapwire-<pid>-<16 hex>`). */
  readonly name: string;
  readonly #path: string;
  readonly #libc: Libc;
  readonly #addr: unknown;
  readonly #size: number;
  #closed = false;

  private constructor(libc: Libc, addr: unknown, size: number, path: string, name: string) {
    this.#libc = libc;
    this.#addr = addr;
    this.#size = size;
    this.#path = path;
    this.name = name;
    this.bytes = new Uint8Array(libc.view(addr, size));
  }

  /**
   * Creates and maps (read/write) a new file of `size` bytes in `dir`.
   * @throws {EcError} `EC_SHM_SPACE` naming the size needed and the size free; `EC_SHM_UNAVAILABLE` otherwise.
   */
  static create(dir: string, size: number): ShmMapping {
    const libc = loadLibc();
    const free = freeBytes(dir);
    if (free !== null && free < size) throw spaceError(dir, size, free);
    const name = `tapwire-${process.pid}-${randomBytes(8).toString("hex")}`;
    const path = join(dir, name);
    let fd: number;
    try {
      fd = fs.openSync(path, "wx+", 0o600);
    } catch (e) {
      throw new EcError("EC_SHM_UNAVAILABLE", `shm: cannot create ${path}: ${String(e)}`, { cause: e });
    }
    try {
      const err = libc.posixFallocate(fd, 0, size);
      if (err === 28) throw spaceError(dir, size, freeBytes(dir) ?? 0); // ENOSPC
      if (err !== 0)
        throw new EcError(
          "EC_SHM_UNAVAILABLE",
          `shm: posix_fallocate(${path}, ${size}) failed: errno ${err}`,
        );
      const p = libc.mmap(null, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p === null || libc.address(p) === MAP_FAILED)
        throw new EcError("EC_SHM_UNAVAILABLE", `shm: mmap of ${size} bytes failed`);
      return new ShmMapping(libc, p, size, path, name);
    } catch (e) {
      fs.rmSync(path, { force: true });
      throw e;
    } finally {
      fs.closeSync(fd);
    }
  }

  /**
   * Maps the peer's file `name` in `dir` read-only: a regular file of exactly `size` bytes, owned
   * by this user, no group/other bits (not followed through a symlink).
   * @throws {EcError} `EC_MALFORMED` naming the failed check; `EC_SHM_UNAVAILABLE` without koffi.
   */
  static open(dir: string, name: string, size: number): ShmMapping {
    const libc = loadLibc();
    if (!SHM_NAME.test(name)) throw new EcError("EC_MALFORMED", `shm: bad file name ${JSON.stringify(name)}`);
    const path = join(dir, name);
    let fd: number;
    try {
      fd = fs.openSync(path, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
    } catch (e) {
      throw new EcError("EC_MALFORMED", `shm: cannot open ${path}: ${String(e)}`, { cause: e });
    }
    try {
      const st = fs.fstatSync(fd);
      const uid = process.getuid?.() ?? st.uid;
      if (!st.isFile()) throw new EcError("EC_MALFORMED", `shm: ${path} is not a regular file`);
      if (st.uid !== uid || (st.mode & 0o077) !== 0)
        throw new EcError("EC_MALFORMED", `shm: ${path} is not private to uid ${uid} (mode 0600)`);
      if (st.size !== size)
        throw new EcError("EC_MALFORMED", `shm: ${path} is ${st.size} bytes, announced ${size}`);
      const p = libc.mmap(null, size, PROT_READ, MAP_SHARED, fd, 0);
      if (p === null || libc.address(p) === MAP_FAILED)
        throw new EcError("EC_SHM_UNAVAILABLE", `shm: mmap of ${path} failed`);
      return new ShmMapping(libc, p, size, path, name);
    } finally {
      fs.closeSync(fd);
    }
  }

  /** Removes the file's name (the mappings keep its pages); idempotent. */
  unlink(): void {
    try {
      fs.unlinkSync(this.#path);
    } catch {
      // already gone
    }
  }

  /** Unmaps (the caller no longer reads {@link bytes}); idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#libc.munmap(this.#addr, this.#size);
  }
}
