import { createRequire } from "node:module";
import * as zlib from "node:zlib";
import { requireKoffi } from "./koffi.js";

/** A CRC-32 function continuing from `value` (an unsigned 32-bit CRC; 0 to start). */
export type Crc32Fn = (data: Uint8Array, value?: number) => number;

/**
 * The CRC-32 implementations this package can use, fastest first. All compute the same value
 * (zlib's CRC-32, EC-CONTRACT 3); only the speed differs.
 */
export const CRC32_IMPLS = {
  /**
   * ISA-L's `crc32_gzip_refl` (`libisal.so.2`, Debian/Ubuntu package `libisal2`), called through
   * the optional peer dependency `koffi`, for chunks of {@link ISAL_MIN_BYTES} and more (2.5-3.5x
   * `@node-rs/crc32` on x86-64 with VPCLMULQDQ); shorter chunks go to the next implementation,
   * whose call costs less ({@link Crc32Info.smallImpl}).
   */
  isal: "libisal",
  /** `@node-rs/crc32`: prebuilt native SIMD/PCLMUL code (~3x `node:zlib` on x86-64). */
  native: "@node-rs/crc32",
  /** `node:zlib` `crc32` (Node >= 20.15). */
  zlib: "node:zlib",
  /** The portable table-driven code below (older Node without `zlib.crc32`). */
  table: "table",
} as const;
/** One of {@link CRC32_IMPLS}. */
export type Crc32Impl = (typeof CRC32_IMPLS)[keyof typeof CRC32_IMPLS];

/**
 * Chunks of at least this many bytes go to ISA-L when it is in use; shorter ones to
 * {@link Crc32Info.smallImpl}. A koffi call costs ~1 µs more than a `@node-rs/crc32` one, so
 * ISA-L's faster loop wins from ~16 KiB (measured by `EC_BENCH_ONLY=crc pnpm bench`, docs/benchmarks/ec-connector.md).
 */
export const ISAL_MIN_BYTES = 16 * 1024;

/** The CRC-32 in use: the function and which implementation it is. */
export interface Crc32Info {
  /** Which implementation (`"libisal"`, `"@node-rs/crc32"`, `"node:zlib"` or `"table"`). */
  readonly impl: Crc32Impl;
  /**
   * The implementation for chunks under {@link ISAL_MIN_BYTES}: the same as {@link impl} unless
   * that is `"libisal"`, then `"@node-rs/crc32"` (or its fallback).
   */
  readonly smallImpl: Crc32Impl;
  /** The function (always returns an unsigned 32-bit value). */
  readonly fn: Crc32Fn;
  /**
   * Why a faster implementation was not used (`null` when the fastest one loaded), e.g. that
   * `libisal.so.2` is not installed.
   */
  readonly fallbackReason: string | null;
}

let table: Uint32Array | undefined;

/** Table-driven CRC-32 (IEEE 802.3, zlib's), for runtimes without `zlib.crc32`. */
function crc32Table(data: Uint8Array, value = 0): number {
  if (table === undefined) {
    table = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      table[n] = c >>> 0;
    }
  }
  let c = ~value >>> 0;
  for (let i = 0; i < data.length; i++) c = table[(c ^ data[i]!) & 0xff]! ^ (c >>> 8);
  return ~c >>> 0;
}

/** CRC-32 of "123456789" (the standard check value) and of its two halves chained. */
const CHECK_INPUT = new TextEncoder().encode("123456789");
const CHECK_VALUE = 0xcbf43926;

/** True when `fn` computes zlib's CRC-32, one-shot and continued from an initial value. */
function selfCheck(fn: Crc32Fn): boolean {
  try {
    if (fn(CHECK_INPUT, 0) >>> 0 !== CHECK_VALUE) return false;
    const head = fn(CHECK_INPUT.subarray(0, 4), 0) >>> 0;
    if (fn(CHECK_INPUT.subarray(4), head) >>> 0 !== CHECK_VALUE) return false;
    // A view into a larger buffer at an odd offset (what a socket read hands over).
    const big = new Uint8Array(CHECK_INPUT.length + 3);
    big.set(CHECK_INPUT, 1);
    return fn(big.subarray(1, 1 + CHECK_INPUT.length)) >>> 0 === CHECK_VALUE;
  } catch {
    return false;
  }
}

/** The `node:zlib` (or, without it, the table) implementation: the fallback. */
function fallback(reason: string): Crc32Info {
  const z = (zlib as unknown as { crc32?: (data: Uint8Array, value: number) => number }).crc32;
  if (typeof z === "function") {
    const fn: Crc32Fn = (data, value = 0) => z(data, value >>> 0) >>> 0;
    if (selfCheck(fn)) return single(CRC32_IMPLS.zlib, fn, reason);
  }
  return single(CRC32_IMPLS.table, crc32Table, reason);
}

function single(impl: Crc32Impl, fn: Crc32Fn, fallbackReason: string | null): Crc32Info {
  return { impl, smallImpl: impl, fn, fallbackReason };
}

/** `@node-rs/crc32` when `load()` gives a module whose `crc32` passes the self-check, else the fallback. */
function loadNative(load: () => unknown): Crc32Info {
  let mod: unknown;
  try {
    mod = load();
  } catch (err) {
    return fallback(`${CRC32_IMPLS.native} did not load: ${(err as Error)?.message ?? String(err)}`);
  }
  const f = (mod as { crc32?: unknown } | null)?.crc32;
  if (typeof f !== "function") return fallback(`${CRC32_IMPLS.native} has no crc32 function`);
  const raw = f as (data: Uint8Array, value: number) => number;
  const fn: Crc32Fn = (data, value = 0) => raw(data, value >>> 0) >>> 0;
  if (!selfCheck(fn)) return fallback(`${CRC32_IMPLS.native} failed the CRC-32 self-check`);
  return single(CRC32_IMPLS.native, fn, null);
}

/** ISA-L's signature: `uint32_t crc32_gzip_refl(uint32_t init_crc, const unsigned char *buf, uint64_t len)`. */
export type IsalCrc32 = (init: number, buf: Uint8Array, len: number) => number;

/**
 * Loads the optional peer dependency `koffi` and binds `crc32_gzip_refl` from `libisal.so.2`
 * (throws when either is missing; the message says what to install). The bench binds through it
 * too, to time ISA-L alone below {@link ISAL_MIN_BYTES}.
 * @internal
 */
export function defaultIsalLoad(): IsalCrc32 {
  let koffi: { load(path: string): { func(decl: string): unknown } };
  try {
    koffi = requireKoffi() as typeof koffi;
  } catch {
    throw new Error('needs the optional peer dependency "koffi" (3.x) next to @tapwire/ec-connector');
  }
  let lib: { func(decl: string): unknown };
  try {
    lib = koffi.load("libisal.so.2");
  } catch (err) {
    throw new Error(
      `libisal.so.2 did not load (${(err as Error)?.message ?? String(err)}); install Debian/Ubuntu libisal2 or Fedora isa-l`,
    );
  }
  return lib.func(
    "uint32_t crc32_gzip_refl(uint32_t init_crc, const uint8_t *buf, uint64_t len)",
  ) as IsalCrc32;
}

/** A deterministic, non-repeating test pattern (so a wrong polynomial or stride shows). */
function pattern(n: number): Uint8Array {
  const out = new Uint8Array(n);
  let x = 0x9e3779b9;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[i] = x & 0xff;
  }
  return out;
}

/**
 * ISA-L for chunks of {@link ISAL_MIN_BYTES} and more over `small` for the rest, when `load()`
 * binds and both halves agree with `small` (the check value, chaining, odd offsets, and a long
 * chunk split across the threshold); else `small` with the reason.
 */
function withIsal(load: () => unknown, small: Crc32Info): Crc32Info {
  const why = (m: string): Crc32Info => ({ ...small, fallbackReason: `${CRC32_IMPLS.isal}: ${m}` });
  let raw: IsalCrc32;
  try {
    const f = load();
    if (typeof f !== "function") return why("the loader gave no function");
    raw = f as IsalCrc32;
  } catch (err) {
    return why((err as Error)?.message ?? String(err));
  }
  const isal: Crc32Fn = (data, value = 0) => raw(value >>> 0, data, data.length) >>> 0;
  const smallFn = small.fn;
  const fn: Crc32Fn = (data, value = 0) =>
    data.length >= ISAL_MIN_BYTES ? raw(value >>> 0, data, data.length) >>> 0 : smallFn(data, value);
  const failed = "failed the CRC-32 self-check";
  try {
    if (!selfCheck(isal)) return why(failed);
    const long = pattern(3 * ISAL_MIN_BYTES + 7);
    const view = long.subarray(1);
    const want = smallFn(view);
    if (isal(view) !== want || fn(view) !== want) return why(failed);
    const cut = ISAL_MIN_BYTES - 5;
    if (fn(view.subarray(cut), fn(view.subarray(0, cut))) !== want) return why(failed);
  } catch (err) {
    return why(`${failed}: ${(err as Error)?.message ?? String(err)}`);
  }
  return { impl: CRC32_IMPLS.isal, smallImpl: small.impl, fn, fallbackReason: null };
}

/**
 * Picks the CRC-32 implementation. First the small-chunk one: `@node-rs/crc32` when `load()`
 * returns a module whose `crc32` passes a self-check (same values as zlib, including continuing
 * from an initial value), else `node:zlib` `crc32`, else the table code. Then, unless `loadIsal`
 * is `null`, ISA-L on top of it for chunks of {@link ISAL_MIN_BYTES} and more, when `loadIsal()`
 * returns a working `crc32_gzip_refl` ({@link IsalCrc32}). `load` defaults to requiring
 * `@node-rs/crc32` (a missing prebuilt binary for this platform throws there), `loadIsal` to
 * binding `libisal.so.2` through `koffi`; tests pass their own to exercise each fallback.
 * Never throws: {@link Crc32Info.fallbackReason} says why a faster one was not used.
 */
export function loadCrc32(
  load: () => unknown = defaultLoad,
  loadIsal: (() => unknown) | null = defaultIsalLoad,
): Crc32Info {
  const small = loadNative(load);
  return loadIsal === null ? small : withIsal(loadIsal, small);
}

function defaultLoad(): unknown {
  return createRequire(import.meta.url)(CRC32_IMPLS.native);
}

/** The environment variable that chooses the implementation (see {@link crc32Info}). */
export const CRC32_ENV = "TAPWIRE_EC_CRC32";

/** The choice `TAPWIRE_EC_CRC32` asks for. */
function fromEnv(v: string | undefined): Crc32Info {
  switch (v) {
    case "zlib":
      return fallback(`${CRC32_ENV}=zlib`);
    case "table":
      return single(CRC32_IMPLS.table, crc32Table, `${CRC32_ENV}=table`);
    case "node-rs":
      return { ...loadCrc32(defaultLoad, null), fallbackReason: `${CRC32_ENV}=node-rs` };
    default:
      return loadCrc32();
  }
}

let chosen: Crc32Info | undefined;
const choice = (): Crc32Info => (chosen ??= fromEnv(process.env[CRC32_ENV]));

/**
 * The implementation this process uses, chosen once on first use (reading a field, or the first
 * {@link crc32} call; the producer, the consumer and their metrics read it when they start, so
 * binding ISA-L never lands on a transfer): {@link loadCrc32}, unless the environment has
 * `TAPWIRE_EC_CRC32=node-rs` (no ISA-L), `=zlib` (the `node:zlib` fallback) or `=table`; any
 * other value is the default choice.
 */
export const crc32Info: Crc32Info = Object.freeze({
  get impl() {
    return choice().impl;
  },
  get smallImpl() {
    return choice().smallImpl;
  },
  get fn() {
    return choice().fn;
  },
  get fallbackReason() {
    return choice().fallbackReason;
  },
});

let active: Crc32Fn | undefined;

/**
 * CRC-32 exactly as zlib (and `node:zlib` `crc32`) computes it, continuing from `value` so it can
 * run incrementally over chunks (EC-CONTRACT 3, 6.3). Uses ISA-L for long chunks and
 * `@node-rs/crc32` for short ones when they load, else `node:zlib` ({@link crc32Info} says which).
 */
export function crc32(data: Uint8Array, value = 0): number {
  if (active === undefined) active = choice().fn;
  return active(data, value);
}

/**
 * With `checksumThread: true`, the checksum thread is used only while the in-use CRC-32 runs below
 * this rate (GB/s, {@link crc32InlineGbps}). Above it the CRC costs a small part of the copy it
 * would overlap, and the thread's hand-offs cost more than they hide: with ISA-L's AVX-512
 * VPCLMULQDQ code (50-60 GB/s, AMD Zen 5) a 4 MiB unix read took 1.22 ms with the thread against
 * 0.87-0.94 ms inline, 16 MiB from the shm shared region 1.47-1.81 against 1.45-1.46 ms; with ISA-L on
 * AVX2 (~10 GB/s, Zen 3) the thread won (docs/benchmarks/ec-connector.md "A fast CRC stays inline").
 */
export const CHECKSUM_THREAD_MAX_INLINE_GBPS = 24;

let inlineGbps: number | undefined;

/**
 * The in-use {@link crc32}'s rate over 1 MiB of cache-hot bytes, GB/s: the best of 5 calls,
 * measured once per process on first use (under 1 ms with a native CRC) and then remembered. The best of several is
 * what the code can do: load only slows a call down.
 */
export function crc32InlineGbps(): number {
  if (inlineGbps !== undefined) return inlineGbps;
  const buf = new Uint8Array(1024 * 1024);
  for (let i = 0; i < buf.length; i += 64) buf[i] = i & 0xff;
  crc32(buf);
  let best = Number.POSITIVE_INFINITY;
  for (let k = 0; k < 5; k++) {
    const t0 = performance.now();
    crc32(buf);
    const dt = performance.now() - t0;
    if (dt < best) best = dt;
  }
  // a call under the clock's resolution: as fast as the clock can say
  inlineGbps = buf.length / 1e6 / Math.max(best, 1e-3);
  return inlineGbps;
}

/**
 * Whether the `checksumThread` option value puts reads' CRCs on the checksum thread in this
 * process: `"always"`; `true` while {@link crc32InlineGbps} is below
 * {@link CHECKSUM_THREAD_MAX_INLINE_GBPS}; else (`false`, unset, a fast CRC) inline. The one owner
 * of that rule: the reader and `ConsumerConnector.create` (which then keeps the cache region an
 * ordinary `ArrayBuffer`, whose copies are faster than a `SharedArrayBuffer`'s) both ask it.
 */
export function checksumThreadUsed(option: boolean | "always" | undefined): boolean {
  return option === "always" || (option === true && crc32InlineGbps() < CHECKSUM_THREAD_MAX_INLINE_GBPS);
}

/** The log line of `checksumThread: true` left inline (a fast CRC-32): fields and message. */
export function checksumThreadInlineNote(): [Record<string, number>, string] {
  return [
    { crc_gbps: Math.round(crc32InlineGbps() * 10) / 10, max_inline_gbps: CHECKSUM_THREAD_MAX_INLINE_GBPS },
    'checksum thread not used: the CRC-32 is fast enough inline (checksumThread: "always" forces it)',
  ];
}

/** Test hook: replaces the measured {@link crc32InlineGbps} (undefined: measure again on next use). */
export function setCrc32InlineGbpsForTest(gbps: number | undefined): void {
  inlineGbps = gbps;
}

/** The portable table implementation (exported for tests that compare it with zlib's). */
export { crc32Table };
