import { createRequire } from "node:module";
import * as zlib from "node:zlib";

/** A CRC-32 function continuing from `value` (an unsigned 32-bit CRC; 0 to start). */
export type Crc32Fn = (data: Uint8Array, value?: number) => number;

/**
 * The CRC-32 implementations this package can use, fastest first. All compute the same value
 * (zlib's CRC-32, EC-CONTRACT 3); only the speed differs.
 */
export const CRC32_IMPLS = {
  /** `@node-rs/crc32`: prebuilt native SIMD/PCLMUL code (~3x `node:zlib` on x86-64). */
  native: "@node-rs/crc32",
  /** `node:zlib` `crc32` (Node >= 20.15). */
  zlib: "node:zlib",
  /** The portable table-driven code below (older Node without `zlib.crc32`). */
  table: "table",
} as const;
/** One of {@link CRC32_IMPLS}. */
export type Crc32Impl = (typeof CRC32_IMPLS)[keyof typeof CRC32_IMPLS];

/** The CRC-32 in use: the function and which implementation it is. */
export interface Crc32Info {
  /** Which implementation (`"@node-rs/crc32"`, `"node:zlib"` or `"table"`). */
  readonly impl: Crc32Impl;
  /** The function (always returns an unsigned 32-bit value). */
  readonly fn: Crc32Fn;
  /** Why a faster implementation was not used (`null` when the native one loaded). */
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
    if (selfCheck(fn)) return { impl: CRC32_IMPLS.zlib, fn, fallbackReason: reason };
  }
  return { impl: CRC32_IMPLS.table, fn: crc32Table, fallbackReason: reason };
}

/**
 * Picks the CRC-32 implementation: `@node-rs/crc32` when `load()` returns a module whose `crc32`
 * passes a self-check (same values as zlib, including continuing from an initial value), else
 * `node:zlib` `crc32`, else the table code. `load` defaults to requiring `@node-rs/crc32` (a
 * missing prebuilt binary for this platform throws there); tests pass their own to exercise the
 * fallback. Never throws.
 */
export function loadCrc32(load: () => unknown = defaultLoad): Crc32Info {
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
  return { impl: CRC32_IMPLS.native, fn, fallbackReason: null };
}

function defaultLoad(): unknown {
  return createRequire(import.meta.url)(CRC32_IMPLS.native);
}

/**
 * Where the native module resolves from this package (for the checksum thread, which loads it
 * itself), or `null` when it cannot be resolved.
 */
export function nativeCrc32Path(): string | null {
  try {
    return createRequire(import.meta.url).resolve(CRC32_IMPLS.native);
  } catch {
    return null;
  }
}

/** The environment variable that forces the `node:zlib` fallback when set to `zlib`. */
export const CRC32_ENV = "TAPWIRE_EC_CRC32";

/**
 * The implementation this process uses, chosen once at module load: {@link loadCrc32}, unless
 * the environment has `TAPWIRE_EC_CRC32=zlib` (forces the `node:zlib` fallback; any other value
 * is the default choice).
 */
export const crc32Info: Crc32Info =
  process.env[CRC32_ENV] === "zlib" ? fallback(`${CRC32_ENV}=zlib`) : loadCrc32();

const active = crc32Info.fn;

/**
 * CRC-32 exactly as zlib (and `node:zlib` `crc32`) computes it, continuing from `value` so it can
 * run incrementally over chunks (EC-CONTRACT 3, 6.3). Uses `@node-rs/crc32` when it loads, else
 * `node:zlib` ({@link crc32Info} says which).
 */
export function crc32(data: Uint8Array, value = 0): number {
  return active(data, value);
}

/** The portable table implementation (exported for tests that compare it with zlib's). */
export { crc32Table };
