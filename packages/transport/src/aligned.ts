import { loadedLibc } from "./shm.js";

/** A page on x86-64 and arm64 Linux (4 KiB pages; aligning to it aligns to any smaller unit). */
const PAGE = 4096;
/** Below this a buffer is allocated as is: its copies are too short for the case below. */
const MIN_ALIGNED_BYTES = 16 * 1024;

/**
 * A zeroed `Uint8Array` of `n` bytes for large copies to land in (the worker's window slot
 * buffers, which the shm transport copies rows into from the mapping): a view into an ordinary
 * `ArrayBuffer` (full-speed element access in JavaScript, unlike a resizable one) that starts on
 * a page when this process has loaded koffi (the shm transport has, docs/transport.md "shm"), else
 * a plain `new Uint8Array(n)`; never loads koffi itself.
 *
 * Why: a plain array of this size comes from malloc and starts 16 bytes past a page, while the
 * rows it receives over shm sit at page-aligned offsets of the mapping. Each copy then lands 16
 * bytes ahead of its source modulo 4096, where glibc's `rep movsb` copy (sizes from ~2 KiB up to
 * the L2 size) runs 3-4x slower on AMD Zen: 64 rows of 24 KiB over shm took 2.0-2.6x the unix
 * round trip into such buffers, 0.43-0.45x into aligned ones (docs/benchmarks/transport.md).
 * Costs at most 4 KiB more per buffer.
 */
export function copyTargetBytes(n: number): Uint8Array {
  const libc = n >= MIN_ALIGNED_BYTES ? loadedLibc() : null;
  if (libc === null) return new Uint8Array(n);
  const b = new Uint8Array(n + PAGE);
  const off = (PAGE - Number(libc.addressOf(b) % BigInt(PAGE))) % PAGE;
  return b.subarray(off, off + n);
}
