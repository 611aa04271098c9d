// Shared memory of the EC shm data plane (issue 23, docs/ec-protocol.md 3.4): the producer's
// read/write ring file and the consumer's read-only mapping of it.
//
// One owner of mmap: the libc binding, the file naming (`tapwire-<pid>-<16 hex>`), the 0600 and
// ownership checks, the dead-pid sweep and the /dev/shm room check are @tapwire/transport's
// (src/shm.ts, docs/transport.md "shm"). What stays here is the data plane's own: koffi loaded from
// this package (an optional peer, on first use), its missing-koffi text, its room-error words and
// its error codes (EcError).

import * as fs from "node:fs";
import { join } from "node:path";
import {
  attachSessionFile,
  bindLibc,
  createSessionFile,
  createUnlinkedShmFile,
  type Libc,
  ShmRange,
  type ShmSpaceWords,
  TransportError,
  type TransportErrorCode,
} from "@tapwire/transport";
import { EcError, type EcErrorCode } from "../errors.js";
import { requireKoffi as defaultRequire } from "../koffi.js";

export { DEFAULT_SHM_DIR, sweepStaleShmFiles } from "@tapwire/transport";

/** What a user whose install lacks koffi reads (the data plane then uses the socket). */
export const KOFFI_MISSING_MESSAGE =
  'shm+unix:// data endpoints map shared memory through the optional peer dependency "koffi" (3.x): ' +
  "install it next to @tapwire/ec-connector with `npm i koffi` or `pnpm add koffi`";

// docs/ec-protocol.md 3.4: "shm: /dev/shm has N bytes free, a data-plane ring needs M ..."
const RING_WORDS: ShmSpaceWords = { mapping: "a data-plane ring", lower: "lower shmSlotBytes" };
// The transport's shm failures as this package's codes (any other: EC_SHM_UNAVAILABLE).
const EC_CODE: Partial<Record<TransportErrorCode, EcErrorCode>> = {
  TRANSPORT_SHM_SPACE: "EC_SHM_SPACE",
  TRANSPORT_PROTOCOL: "EC_MALFORMED",
};

let loaded: Libc | null = null;
let failure: unknown = null;
let requireKoffi: () => unknown = defaultRequire;

/**
 * libc through koffi, loaded once (koffi is CommonJS: a synchronous require).
 * @throws {EcError} `EC_SHM_UNAVAILABLE` naming the install command.
 */
export function loadLibc(): Libc {
  if (loaded !== null) return loaded;
  if (failure === null) {
    try {
      loaded = bindLibc(requireKoffi());
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

function ecError(e: unknown): EcError {
  if (e instanceof EcError) return e;
  const code = (e instanceof TransportError ? EC_CODE[e.code] : undefined) ?? "EC_SHM_UNAVAILABLE";
  return new EcError(code, e instanceof Error ? e.message : String(e), { cause: e });
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
  readonly #range: ShmRange;

  private constructor(range: ShmRange, dir: string, name: string) {
    this.#range = range;
    this.#path = join(dir, name);
    this.name = name;
    this.bytes = range.bytes;
  }

  /** Maps a new range of `size` bytes with `map` (which names the file); freed if it throws. */
  static #mapped(dir: string, size: number, map: (libc: Libc, range: ShmRange) => string): ShmMapping {
    let range: ShmRange | null = null;
    try {
      const libc = loadLibc();
      // Pre-faulted (MAP_POPULATE): a ring lives as long as its connection, and its first READ
      // would otherwise take a page fault per 4 KiB page on the producer's write side
      // (docs/benchmarks/ec-connector.md "shm: where the time goes").
      range = new ShmRange(libc, size, { populate: true });
      return new ShmMapping(range, dir, map(libc, range));
    } catch (e) {
      range?.free();
      throw ecError(e);
    }
  }

  /**
   * Creates and maps (read/write) a new file of `size` bytes in `dir`.
   * @throws {EcError} `EC_SHM_SPACE` naming the size needed and the size free; `EC_SHM_UNAVAILABLE` otherwise.
   */
  static create(dir: string, size: number): ShmMapping {
    return ShmMapping.#mapped(dir, size, (libc, range) => createSessionFile(libc, dir, range, 0, RING_WORDS));
  }

  /**
   * Maps the peer's file `name` in `dir` read-only: a regular file of exactly `size` bytes, owned
   * by this user, no group/other bits (not followed through a symlink).
   * @throws {EcError} `EC_MALFORMED` naming the failed check; `EC_SHM_UNAVAILABLE` without koffi.
   */
  static open(dir: string, name: string, size: number): ShmMapping {
    return ShmMapping.#mapped(dir, size, (_libc, range) => {
      attachSessionFile(dir, name, range);
      return name;
    });
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
    this.#range.free();
  }
}

// docs/ec-protocol.md 3.4 "Shared region": the room error's words.
const REGION_WORDS: ShmSpaceWords = {
  mapping: "the shared cache region (--shm-share-region)",
  lower: "or drop --shm-share-region",
  fallback: "); using the ordinary region and the ring",
};

/**
 * The producer's cache region as a MAP_SHARED mapping of a /dev/shm file (docs/ec-protocol.md 3.4
 * "Shared region", opt-in `shareRegion`): the file is created 0600 and exclusive, its pages
 * allocated, and unlinked at once; only this process's fd keeps it, so nothing is ever left in the
 * directory, even after SIGKILL. A reader of the same user maps it read-only through
 * `/proc/<pid>/fd/<fd>` ({@link ShmPeerRegion.open}).
 */
export class ShmSharedRegion {
  /** The region's bytes (the cache's region; valid until {@link close}). */
  readonly bytes: Uint8Array;
  /** This process's pid and the fd that keeps the unlinked file. */
  readonly pid: number;
  readonly fd: number;
  readonly #range: ShmRange;
  #closed = false;

  private constructor(range: ShmRange, fd: number) {
    this.#range = range;
    this.bytes = range.bytes;
    this.fd = fd;
    this.pid = process.pid;
  }

  /**
   * Creates the region of `size` bytes (rounded up to a page) in `dir`.
   * @throws {EcError} `EC_SHM_SPACE` naming the size needed and the size free; `EC_SHM_UNAVAILABLE` otherwise.
   */
  static create(dir: string, size: number): ShmSharedRegion {
    const pages = Math.max(4096, Math.ceil(size / 4096) * 4096);
    let range: ShmRange | null = null;
    try {
      const libc = loadLibc();
      range = new ShmRange(libc, pages, { populate: true });
      // @tapwire/transport owns the file rules (room check, name, 0600, fallocate); unlinked at once.
      const fd = createUnlinkedShmFile(libc, dir, range, REGION_WORDS);
      return new ShmSharedRegion(range, fd);
    } catch (e) {
      range?.free();
      throw ecError(e);
    }
  }

  /** Bytes of the mapping (a page multiple, at least the cache region). */
  get size(): number {
    return this.#range.size;
  }

  /**
   * Drops the file (the pages go with the readers' last mapping) and closes the fd; views of
   * {@link bytes} then read zeros, never fault. Idempotent.
   */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#range.unmapFile();
    fs.closeSync(this.fd);
  }
}

/** A reader's read-only (PROT_READ) mapping of a producer's {@link ShmSharedRegion}. */
export class ShmPeerRegion {
  /** The mapped bytes (read-only: a write would fault). */
  readonly bytes: Uint8Array;
  readonly #range: ShmRange;

  private constructor(range: ShmRange) {
    this.#range = range;
    this.bytes = range.bytes;
  }

  /**
   * Opens `/proc/<pid>/fd/<fd>` O_RDONLY and maps it PROT_READ: a regular file owned by this user,
   * no group/other bits, a page multiple of at most 4 GiB + 1 page.
   * @throws {EcError} `EC_MALFORMED` naming the failed check; `EC_SHM_UNAVAILABLE` without koffi.
   */
  static open(pid: number, fd: number): ShmPeerRegion {
    const path = `/proc/${pid}/fd/${fd}`;
    let range: ShmRange | null = null;
    let f = -1;
    try {
      const libc = loadLibc();
      try {
        f = fs.openSync(path, fs.constants.O_RDONLY);
      } catch (e) {
        throw new EcError("EC_MALFORMED", `shm: cannot open ${path}: ${String(e)}`, { cause: e });
      }
      const st = fs.fstatSync(f);
      const uid = process.getuid?.() ?? st.uid;
      if (!st.isFile()) throw new EcError("EC_MALFORMED", `shm: ${path} is not a regular file`);
      if (st.uid !== uid || (st.mode & 0o077) !== 0)
        throw new EcError("EC_MALFORMED", `shm: ${path} is not private to uid ${uid} (mode 0600)`);
      if (st.size < 4096 || st.size % 4096 !== 0 || st.size > 2 ** 32 + 4096)
        throw new EcError("EC_MALFORMED", `shm: ${path} is ${st.size} bytes, not a region`);
      // Pre-faulted up to POPULATE_PEER_REGION_MAX only: every reader connection maps the whole
      // region, and populating a multi-GiB one per connection would cost its page tables and
      // a long attach up front; past the cap, first reads take fault-around faults instead.
      range = new ShmRange(libc, st.size, { populate: st.size <= POPULATE_PEER_REGION_MAX });
      range.map(f, false);
      return new ShmPeerRegion(range);
    } catch (e) {
      range?.free();
      throw ecError(e);
    } finally {
      if (f >= 0) fs.closeSync(f);
    }
  }

  /** Unmaps; idempotent. */
  close(): void {
    this.#range.free();
  }
}

/** The largest shared region a reader pre-faults when it maps it (256 MiB). */
const POPULATE_PEER_REGION_MAX = 256 * 1024 * 1024;
