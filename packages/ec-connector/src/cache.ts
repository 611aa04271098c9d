import { crc32 } from "./crc.js";
import { checkIntOption, EcError, isIntInRange } from "./errors.js";

/** Owner value of a free block. */
const FREE = -1;
/** Owner value of a retired block (EC-CONTRACT 5.2): never reused. */
const RETIRED = -2;

/** A read-only snapshot of one cache entry. */
export interface CacheEntryInfo {
  /** The content hash the entry is keyed by. */
  readonly mmHash: string;
  /** Ordered block ids holding the entry's bytes. */
  readonly blocks: readonly number[];
  /** Number of meaningful bytes (the last block may be partly used). */
  readonly nbytes: number;
  /** True once the bytes are complete and the entry may be served/read. */
  readonly ready: boolean;
  /** Number of outstanding pins (a pinned entry is never evicted or freed). */
  readonly pins: number;
  /** CRC-32 of the `nbytes` bytes, set by `markReady`; `null` before. */
  readonly crc32: number | null;
}

interface Entry {
  id: number;
  mmHash: string;
  blocks: number[];
  nbytes: number;
  ready: boolean;
  pins: number;
  crc32: number | null;
}

// ES2024's constructors with a maximum (Node >= 20: V8 11.3), typed here while the lib is ES2023.
type WithMax<T> = new (byteLength: number, options: { maxByteLength: number }) => T;
const ResizableAb = ArrayBuffer as unknown as WithMax<ArrayBuffer>;
const GrowableSab = SharedArrayBuffer as unknown as WithMax<SharedArrayBuffer>;

/**
 * A fresh region of `total` zeroed bytes whose first byte is page-aligned
 * (docs/benchmarks/ec-connector.md "The cache region is page-aligned"). A plain `new Uint8Array(total)` of this size comes from
 * malloc and starts 16 bytes past a page (the allocator's header), while every source a read
 * copies from is page-aligned at block offsets (a shared-memory mapping, the producer's region):
 * each piece copied is then 16 bytes ahead of its source modulo 4096, and on AMD Zen glibc's
 * `rep movsb` copy (pieces of ~2 KiB up to the L2 size) runs 3-4x slower at that distance
 * (measured: 16 MiB in 256 KiB pieces from a /dev/shm mapping, 10.9 ms at +16 against 3.0 ms at
 * +0). V8 reserves a resizable ArrayBuffer in whole pages, so its first byte is page-aligned; its
 * maximum is its size, so it is never resized (the region's views never change length).
 */
function pageAlignedRegion(total: number, shared: boolean): Uint8Array {
  const o = { maxByteLength: total };
  return new Uint8Array(shared ? new GrowableSab(total, o) : new ResizableAb(total, o));
}

/** Options of {@link EmbeddingCache}. */
export interface EmbeddingCacheOptions {
  /** Number of blocks in the pool (>= 1). */
  numBlocks: number;
  /** Bytes per block (>= 1). */
  blockBytes: number;
  /** Called with the mm_hash of each entry evicted to make room (LRU, EC-CONTRACT 1). */
  onEvict?: (mmHash: string) => void;
  /** Back the region with a `SharedArrayBuffer` (lets a worker thread checksum landed bytes). */
  shared?: boolean;
  /**
   * Memory to keep the region in instead of a fresh one: at least `numBlocks * blockBytes` bytes
   * (the producer's shared region, docs/ec-protocol.md 3.4 "Shared region"; excludes `shared`).
   */
  region?: Uint8Array;
}

/**
 * A fixed pool of `numBlocks` blocks of `blockBytes` bytes in one contiguous region (EC-CONTRACT 1).
 *
 * Entries (`mm_hash` → ordered blocks, byte length, ready flag, pin count) own their blocks, and the
 * cache is the single owner of blocks: nothing else frees them. Allocation evicts unpinned ready
 * entries in least-recently-used order when it needs room, and fails with `EC_CACHE_FULL` (evicting
 * nothing) when even that is not enough; pinned and in-flight (not ready) entries are never evicted.
 * Blocks of a transfer that may still be written can be *detached* from their key (quarantine,
 * EC-CONTRACT 6.3) and later freed, or *retired* forever (EC-CONTRACT 5.2).
 */
export class EmbeddingCache {
  /** Number of blocks. */
  readonly numBlocks: number;
  /** Bytes per block. */
  readonly blockBytes: number;
  /** The contiguous region of `numBlocks * blockBytes` bytes that all blocks live in. */
  readonly region: Uint8Array;

  readonly #owner: Int32Array;
  readonly #entries = new Map<string, Entry>(); // insertion order = LRU order (oldest first)
  readonly #detached = new Map<number, Entry>();
  readonly #onEvict: ((mmHash: string) => void) | undefined;
  #free: number;
  #retired = 0;
  #nextId = 1;
  #evictions = 0;

  constructor(options: EmbeddingCacheOptions) {
    if (options === null || typeof options !== "object") {
      throw new EcError("EC_BAD_OPTION", "options: expected an object");
    }
    this.numBlocks = checkIntOption("numBlocks", options.numBlocks, 1, 1 << 24);
    this.blockBytes = checkIntOption("blockBytes", options.blockBytes, 1, 2 ** 31 - 1);
    const total = this.numBlocks * this.blockBytes;
    if (total > 2 ** 32) {
      throw new EcError("EC_BAD_OPTION", `option numBlocks: region of ${total} bytes exceeds 4 GiB`);
    }
    if (options.onEvict !== undefined && typeof options.onEvict !== "function") {
      throw new EcError("EC_BAD_OPTION", "option onEvict: expected a function");
    }
    this.#onEvict = options.onEvict;
    if (options.shared !== undefined && typeof options.shared !== "boolean") {
      throw new EcError("EC_BAD_OPTION", "option shared: expected a boolean");
    }
    if (options.region !== undefined) {
      if (!(options.region instanceof Uint8Array) || options.region.length < total || options.shared === true)
        throw new EcError("EC_BAD_OPTION", `option region: expected a Uint8Array of at least ${total} bytes`);
      this.region = options.region.subarray(0, total);
    } else this.region = pageAlignedRegion(total, options.shared === true);
    this.#owner = new Int32Array(this.numBlocks).fill(FREE);
    this.#free = this.numBlocks;
  }

  /** Number of free blocks. */
  get freeBlocks(): number {
    return this.#free;
  }

  /** Number of retired blocks (never reused). */
  get retiredBlocks(): number {
    return this.#retired;
  }

  /** Number of blocks owned by pinned entries. */
  get pinnedBlocks(): number {
    let n = 0;
    for (const e of this.#entries.values()) if (e.pins > 0) n += e.blocks.length;
    return n;
  }

  /** Number of blocks held by detached (quarantined) allocations. */
  get detachedBlocks(): number {
    let n = 0;
    for (const e of this.#detached.values()) n += e.blocks.length;
    return n;
  }

  /** Total number of entries evicted so far. */
  get evictions(): number {
    return this.#evictions;
  }

  /** Number of keyed entries. */
  get size(): number {
    return this.#entries.size;
  }

  /** Blocks needed for `nbytes` bytes. */
  blocksFor(nbytes: number): number {
    return Math.ceil(nbytes / this.blockBytes);
  }

  /** True if an entry (ready or not) exists for `mmHash`. */
  has(mmHash: string): boolean {
    return this.#entries.has(mmHash);
  }

  /** True if a ready entry exists for `mmHash`. */
  isReady(mmHash: string): boolean {
    return this.#entries.get(mmHash)?.ready === true;
  }

  /** A snapshot of the entry, or `undefined`. Does not touch LRU order. */
  get(mmHash: string): CacheEntryInfo | undefined {
    const e = this.#entries.get(mmHash);
    return e === undefined ? undefined : snapshot(e);
  }

  /** The mm_hashes of all keyed entries, least recently used first. */
  keys(): string[] {
    return [...this.#entries.keys()];
  }

  /**
   * Allocates an in-flight (not ready) entry of `nbytes` bytes (>= 1) and returns its block ids.
   * Prefers one contiguous run (so {@link view} is zero-copy); evicts unpinned ready entries in LRU
   * order only when the free blocks are not enough. Throws `EC_CACHE_EXISTS` if the key exists and
   * `EC_CACHE_FULL` (evicting nothing) if free plus evictable blocks are not enough.
   */
  allocate(mmHash: string, nbytes: number): readonly number[] {
    if (typeof mmHash !== "string") throw new EcError("EC_BAD_ARGUMENT", "mmHash: expected a string");
    if (!isIntInRange(nbytes, 1)) {
      throw new EcError("EC_BAD_ARGUMENT", `nbytes: expected a positive integer, got ${String(nbytes)}`);
    }
    if (this.#entries.has(mmHash)) {
      throw new EcError("EC_CACHE_EXISTS", `mm_hash ${mmHash}: an entry already exists`);
    }
    const need = this.blocksFor(nbytes);
    if (need > this.numBlocks) {
      throw new EcError(
        "EC_CACHE_FULL",
        `mm_hash ${mmHash}: needs ${need} blocks, the cache has only ${this.numBlocks}`,
      );
    }
    if (this.#free < need) {
      let evictable = 0;
      for (const e of this.#entries.values()) if (e.ready && e.pins === 0) evictable += e.blocks.length;
      if (this.#free + evictable < need) {
        throw new EcError(
          "EC_CACHE_FULL",
          `mm_hash ${mmHash}: needs ${need} blocks, ${this.#free} free and ${evictable} evictable`,
        );
      }
      for (const e of [...this.#entries.values()]) {
        if (this.#free >= need) break;
        if (!e.ready || e.pins > 0) continue;
        this.#release(e, FREE);
        this.#entries.delete(e.mmHash);
        this.#evictions++;
        this.#onEvict?.(e.mmHash);
      }
    }
    const id = this.#nextId++;
    const entry: Entry = {
      id,
      mmHash,
      blocks: this.#take(need, id),
      nbytes,
      ready: false,
      pins: 0,
      crc32: null,
    };
    this.#entries.set(mmHash, entry);
    return entry.blocks;
  }

  /** Copies `data` into the entry at byte `offset` (in-flight entries only). */
  write(mmHash: string, offset: number, data: Uint8Array): void {
    const e = this.#must(mmHash);
    if (e.ready) throw new EcError("EC_CACHE_STATE", `mm_hash ${mmHash}: entry is ready (read-only)`);
    if (!isIntInRange(offset, 0, e.nbytes - data.length)) {
      throw new EcError(
        "EC_BAD_ARGUMENT",
        `mm_hash ${mmHash}: write of ${data.length} bytes at ${offset} exceeds ${e.nbytes}`,
      );
    }
    let src = 0;
    let pos = offset;
    while (src < data.length) {
      const bi = Math.floor(pos / this.blockBytes);
      const inBlock = pos - bi * this.blockBytes;
      const n = Math.min(this.blockBytes - inBlock, data.length - src);
      const base = e.blocks[bi]! * this.blockBytes + inBlock;
      this.region.set(data.subarray(src, src + n), base);
      src += n;
      pos += n;
    }
  }

  /**
   * Zero-copy views of the entry's bytes, one per block in order (the last trimmed to `nbytes`).
   * Valid while the entry is neither freed nor evicted (pin it to be sure).
   */
  blockViews(mmHash: string): Uint8Array[] {
    const e = this.#must(mmHash);
    return viewsOf(this.region, this.blockBytes, e.blocks, e.nbytes);
  }

  /**
   * The bytes of a ready entry as one `Uint8Array`: a zero-copy view of the region when the blocks
   * are contiguous and ascending (the allocator's preference), otherwise a fresh copy. Marks the
   * entry most recently used.
   */
  view(mmHash: string): Uint8Array {
    const e = this.#must(mmHash);
    if (!e.ready) throw new EcError("EC_CACHE_STATE", `mm_hash ${mmHash}: entry is not ready`);
    this.#touch(e);
    const first = e.blocks[0]!;
    let contiguous = true;
    for (let i = 1; i < e.blocks.length; i++) {
      if (e.blocks[i] !== first + i) {
        contiguous = false;
        break;
      }
    }
    const start = first * this.blockBytes;
    if (contiguous) return this.region.subarray(start, start + e.nbytes);
    const out = new Uint8Array(e.nbytes);
    let off = 0;
    for (const v of viewsOf(this.region, this.blockBytes, e.blocks, e.nbytes)) {
      out.set(v, off);
      off += v.length;
    }
    return out;
  }

  /**
   * Marks an in-flight entry ready. `crc` is the CRC-32 of its bytes when the caller already knows
   * it (a verified read); otherwise it is computed here once (EC-CONTRACT 3: the producer computes
   * it when the entry becomes ready).
   */
  markReady(mmHash: string, crc?: number): CacheEntryInfo {
    const e = this.#must(mmHash);
    if (e.ready) throw new EcError("EC_CACHE_STATE", `mm_hash ${mmHash}: entry is already ready`);
    if (crc === undefined) {
      let c = 0;
      for (const v of viewsOf(this.region, this.blockBytes, e.blocks, e.nbytes)) c = crc32(v, c);
      crc = c;
    }
    e.crc32 = crc >>> 0;
    e.ready = true;
    this.#touch(e);
    return snapshot(e);
  }

  /**
   * EC-CONTRACT 4.2: returns `undefined` when there is no entry, the (unpinned) entry when it is not
   * ready, and pins and returns a ready entry (marking it most recently used).
   */
  pinIfReady(mmHash: string): CacheEntryInfo | undefined {
    const e = this.#entries.get(mmHash);
    if (e === undefined) return undefined;
    if (e.ready) {
      e.pins++;
      this.#touch(e);
    }
    return snapshot(e);
  }

  /** Releases one pin; throws `EC_CACHE_STATE` if the entry has none (a pin released twice). */
  unpin(mmHash: string): void {
    const e = this.#must(mmHash);
    if (e.pins === 0) throw new EcError("EC_CACHE_STATE", `mm_hash ${mmHash}: unpin without a pin`);
    e.pins--;
  }

  /** Frees the entry's blocks. Throws `EC_CACHE_STATE` if it is pinned. */
  free(mmHash: string): void {
    const e = this.#must(mmHash);
    if (e.pins > 0) throw new EcError("EC_CACHE_STATE", `mm_hash ${mmHash}: cannot free a pinned entry`);
    this.#release(e, FREE);
    this.#entries.delete(mmHash);
  }

  /**
   * Moves an unpinned entry's blocks out of the keyed map into an anonymous holding (a quarantined
   * read whose bytes may still land, EC-CONTRACT 6.3) and returns its id. The blocks stay owned
   * (never reallocated) until {@link releaseDetached}; the key becomes free for a new entry.
   */
  detach(mmHash: string): number {
    const e = this.#must(mmHash);
    if (e.pins > 0) throw new EcError("EC_CACHE_STATE", `mm_hash ${mmHash}: cannot detach a pinned entry`);
    this.#entries.delete(mmHash);
    this.#detached.set(e.id, e);
    return e.id;
  }

  /**
   * Ends a detached holding: `reuse` true frees its blocks (the read settled or its release
   * guaranteed no further writes), false retires them for good (EC-CONTRACT 5.2).
   */
  releaseDetached(id: number, reuse: boolean): void {
    const e = this.#detached.get(id);
    if (e === undefined) throw new EcError("EC_BAD_ARGUMENT", `detached holding ${id}: unknown`);
    this.#detached.delete(id);
    this.#release(e, reuse ? FREE : RETIRED);
  }

  /** Retires an unpinned entry's blocks for good (EC-CONTRACT 5.2) and removes the key. */
  retire(mmHash: string): void {
    const e = this.#must(mmHash);
    if (e.pins > 0) throw new EcError("EC_CACHE_STATE", `mm_hash ${mmHash}: cannot retire a pinned entry`);
    this.#release(e, RETIRED);
    this.#entries.delete(mmHash);
  }

  /**
   * Proves the bookkeeping (EC-CONTRACT 8): every block is exactly one of free, retired, or owned by
   * one entry; the free count matches; pins are non-negative and only on ready entries. Throws
   * `EC_CACHE_CORRUPT` naming the first problem.
   */
  check(): void {
    const seen = new Int32Array(this.numBlocks).fill(FREE);
    const all = [...this.#entries.values(), ...this.#detached.values()];
    for (const e of all) {
      if (e.blocks.length !== this.blocksFor(e.nbytes)) {
        throw corrupt(`entry ${e.mmHash}: ${e.blocks.length} blocks for ${e.nbytes} bytes`);
      }
      if (e.pins < 0 || (e.pins > 0 && !e.ready)) throw corrupt(`entry ${e.mmHash}: pins ${e.pins}`);
      for (const b of e.blocks) {
        if (!(b >= 0 && b < this.numBlocks)) throw corrupt(`entry ${e.mmHash}: block ${b} out of range`);
        if (seen[b] !== FREE) throw corrupt(`block ${b}: owned twice`);
        if (this.#owner[b] !== e.id) throw corrupt(`block ${b}: owner table says ${this.#owner[b]}`);
        seen[b] = e.id;
      }
    }
    let free = 0;
    let retired = 0;
    for (let b = 0; b < this.numBlocks; b++) {
      const o = this.#owner[b]!;
      if (o === FREE) free++;
      else if (o === RETIRED) retired++;
      else if (seen[b] !== o) throw corrupt(`block ${b}: owned by ${o} but no entry holds it`);
    }
    if (free !== this.#free) throw corrupt(`free count ${this.#free} but ${free} blocks are free`);
    if (retired !== this.#retired) throw corrupt(`retired count ${this.#retired} but ${retired} retired`);
  }

  #must(mmHash: string): Entry {
    const e = this.#entries.get(mmHash);
    if (e === undefined) throw new EcError("EC_CACHE_MISSING", `mm_hash ${mmHash}: no entry`);
    return e;
  }

  #touch(e: Entry): void {
    this.#entries.delete(e.mmHash);
    this.#entries.set(e.mmHash, e);
  }

  #release(e: Entry, to: number): void {
    for (const b of e.blocks) this.#owner[b] = to;
    if (to === FREE) this.#free += e.blocks.length;
    else this.#retired += e.blocks.length;
  }

  /**
   * Takes `need` free blocks (caller ensured there are enough), contiguous when possible: the
   * lowest-addressed free run that fits (first fit). First fit reuses recently freed blocks, which
   * are likely still in the CPU caches and TLB (a next-fit cursor cycling through a region larger
   * than the caches made every transfer land in cold memory: ~0.4 ms more consumer CPU per 16 MiB).
   */
  #take(need: number, id: number): number[] {
    const owner = this.#owner;
    const n = this.numBlocks;
    let run = 0;
    let start = 0;
    for (let b = 0; b < n; b++) {
      if (owner[b] === FREE) {
        if (run === 0) start = b;
        run++;
        if (run === need) {
          const blocks = new Array<number>(need);
          for (let k = 0; k < need; k++) {
            blocks[k] = start + k;
            owner[start + k] = id;
          }
          this.#free -= need;
          return blocks;
        }
      } else {
        run = 0;
      }
    }
    const blocks: number[] = [];
    for (let b = 0; b < n && blocks.length < need; b++) {
      if (owner[b] === FREE) {
        owner[b] = id;
        blocks.push(b);
      }
    }
    this.#free -= need;
    return blocks;
  }
}

function corrupt(msg: string): EcError {
  return new EcError("EC_CACHE_CORRUPT", msg);
}

function snapshot(e: Entry): CacheEntryInfo {
  return {
    mmHash: e.mmHash,
    blocks: e.blocks,
    nbytes: e.nbytes,
    ready: e.ready,
    pins: e.pins,
    crc32: e.crc32,
  };
}

/** Views of `nbytes` bytes spread over `blocks` of `region` (internal; also used by the data plane). */
export function viewsOf(
  region: Uint8Array,
  blockBytes: number,
  blocks: readonly number[],
  nbytes: number,
): Uint8Array[] {
  const out: Uint8Array[] = [];
  let left = nbytes;
  for (const b of blocks) {
    if (left <= 0) break;
    const n = Math.min(blockBytes, left);
    const s = b * blockBytes;
    out.push(region.subarray(s, s + n));
    left -= n;
  }
  return out;
}
