// libc calls the stream transports use when koffi (the optional peer dependency the shm transport
// loads too) is installed: socket buffer sizes (sockopt.ts) and scatter reads (scatter.ts). Loaded
// synchronously on first use; without koffi, off Linux or without glibc, nativeLibc() is null and
// every caller keeps Node's own path. Kept apart from shm.ts, whose loader throws for the shm
// transport's users; here absence is silent.
import { createRequire } from "node:module";

/** The libc calls bound through koffi (typed arrays and ArrayBuffers pass as pointers). */
export interface NativeLibc {
  setsockopt(fd: number, level: number, name: number, val: Int32Array, len: number): number;
  getsockopt(fd: number, level: number, name: number, val: Int32Array, len: Uint32Array): number;
  /** readv(2): -1 on error (EAGAIN when nothing is queued), 0 at EOF, else the bytes read. */
  readv(fd: number, iov: Uint32Array, iovcnt: number): number;
  /** writev(2): -1 on error (EAGAIN when the send buffer is full), else the bytes written. */
  writev(fd: number, iov: Uint32Array, iovcnt: number): number;
  /** memmove(2) with n = 0 returns `dst`: the address of an ArrayBuffer's backing store. */
  memmove(dst: ArrayBuffer, src: ArrayBuffer, n: number): number;
}

interface KoffiLike {
  load(path: string): { func(decl: string): (...args: unknown[]) => unknown };
}

/** undefined: not tried yet; null: unavailable here. */
let libc: NativeLibc | null | undefined;
let requireKoffi: () => unknown = () => createRequire(import.meta.url)("koffi");

/** libc through koffi, loaded once; null when unavailable here (no koffi, not Linux, no glibc). */
export function nativeLibc(): NativeLibc | null {
  if (libc !== undefined) return libc;
  libc = null;
  if (process.platform !== "linux") return null;
  try {
    const m = requireKoffi() as KoffiLike | { default: KoffiLike };
    const k = ("load" in m ? m : m.default) as KoffiLike;
    const c = k.load("libc.so.6");
    libc = {
      setsockopt: c.func(
        "int setsockopt(int fd, int level, int name, const void *val, uint32_t len)",
      ) as NativeLibc["setsockopt"],
      getsockopt: c.func(
        "int getsockopt(int fd, int level, int name, void *val, uint32_t *len)",
      ) as NativeLibc["getsockopt"],
      readv: c.func("intptr_t readv(int fd, const void *iov, int iovcnt)") as NativeLibc["readv"],
      writev: c.func("intptr_t writev(int fd, const void *iov, int iovcnt)") as NativeLibc["writev"],
      memmove: c.func("uintptr_t memmove(void *dst, const void *src, size_t n)") as NativeLibc["memmove"],
    };
  } catch {
    libc = null;
  }
  return libc;
}

/** Internal, for tests: replaces how koffi is required (null: the real one) and forgets a loaded one. */
export function setNativeKoffiForTest(fn: (() => unknown) | null): void {
  requireKoffi = fn ?? (() => createRequire(import.meta.url)("koffi"));
  libc = undefined;
}
