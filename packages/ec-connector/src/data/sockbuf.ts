// The data server's socket send buffer on the same host (issue 23, per-byte cost). Node has no
// setsockopt for a net.Socket, so SO_SNDBUF is set through koffi, the optional peer dependency the
// shm data plane loads too (the same binding as @tapwire/transport's sockopt.ts; ec-connector does
// not depend on that package). Without koffi, off Linux or without glibc this is a no-op and the
// socket keeps the kernel's choice.
//
// Why (docs/benchmarks/ec-connector.md, "Per-byte cost"): on unix sockets the kernel default
// (net.core.wmem_default, 208 KiB) makes a 16 MiB READ a ping-pong of ~200 KiB rounds in which the
// producer waits while the reader checksums; on loopback tcp autotuning grows the buffer to
// tcp_wmem's maximum (4 MiB), so the bytes are out of cache by the time the reader copies them. A
// fixed 512 KiB request (the kernel doubles it: ~1 MiB queued, within a core's L2) measured faster
// on both, for the raw stream too. Only same-host peers get it: across hosts a fixed buffer would
// cap tcp at buffer / RTT, so remote tcp keeps autotuning.
import { createRequire } from "node:module";
import type * as net from "node:net";

/** What {@link setSendBuffer} asks for by default on unix and loopback tcp data connections. */
export const DEFAULT_SEND_BUFFER_BYTES = 512 * 1024;

// Linux <asm-generic/socket.h> (x86_64 and arm64 alike).
const SOL_SOCKET = 1;
const SO_SNDBUF = 7;

interface SockoptLibc {
  setsockopt(fd: number, level: number, name: number, val: Int32Array, len: number): number;
  getsockopt(fd: number, level: number, name: number, val: Int32Array, len: Uint32Array): number;
}

/** undefined: not tried yet; null: unavailable here. */
let libc: SockoptLibc | null | undefined;
let requireKoffi: () => unknown = () => createRequire(import.meta.url)("koffi");

function loadLibc(): SockoptLibc | null {
  if (libc !== undefined) return libc;
  libc = null;
  if (process.platform !== "linux") return null;
  try {
    const m = requireKoffi() as { load?: unknown; default?: unknown };
    const k = (m.load !== undefined ? m : m.default) as {
      load(path: string): { func(decl: string): (...args: unknown[]) => unknown };
    };
    const c = k.load("libc.so.6");
    libc = {
      setsockopt: c.func(
        "int setsockopt(int fd, int level, int name, const void *val, uint32_t len)",
      ) as SockoptLibc["setsockopt"],
      getsockopt: c.func(
        "int getsockopt(int fd, int level, int name, void *val, uint32_t *len)",
      ) as SockoptLibc["getsockopt"],
    };
  } catch {
    libc = null;
  }
  return libc;
}

/** Internal, for tests: replaces how koffi is required (`null`: the real one) and forgets a loaded one. */
export function setSockbufKoffiForTest(fn: (() => unknown) | null): void {
  requireKoffi = fn ?? (() => createRequire(import.meta.url)("koffi"));
  libc = undefined;
}

function fdOf(sock: net.Socket): number {
  const fd = (sock as unknown as { _handle?: { fd?: unknown } | null })._handle?.fd;
  return typeof fd === "number" && Number.isInteger(fd) && fd >= 0 ? fd : -1;
}

const val = new Int32Array(1);
const len = new Uint32Array(1);

/** The send buffer the kernel reports for `sock` (Linux: twice what was asked), or -1 when unknown. */
export function sendBuffer(sock: net.Socket): number {
  const c = loadLibc();
  const fd = fdOf(sock);
  if (c === null || fd < 0) return -1;
  val[0] = 0;
  len[0] = 4;
  return c.getsockopt(fd, SOL_SOCKET, SO_SNDBUF, val, len) === 0 ? (val[0] as number) : -1;
}

/**
 * True when `sock` talks to this host: a unix socket, or tcp to a loopback address (where a fixed
 * send buffer cannot limit throughput by the round trip).
 */
export function sameHost(sock: net.Socket): boolean {
  const a = sock.remoteAddress;
  if (a === undefined) return sock.remoteFamily === undefined; // unix sockets have no address
  return a.startsWith("127.") || a === "::1" || a.startsWith("::ffff:127.");
}

/**
 * Asks for a send buffer of `bytes` on a same-host `sock` (see the file comment). Returns the size
 * the kernel then reports, or -1 when nothing was set (`bytes` 0, a remote peer, no koffi, no
 * descriptor). Never throws: the socket works either way, only slower.
 */
export function setSendBuffer(sock: net.Socket, bytes: number): number {
  if (bytes <= 0 || !sameHost(sock)) return -1;
  const c = loadLibc();
  const fd = fdOf(sock);
  if (c === null || fd < 0) return -1;
  val[0] = Math.min(bytes, 0x3fffffff);
  if (c.setsockopt(fd, SOL_SOCKET, SO_SNDBUF, val, 4) !== 0) return -1;
  return sendBuffer(sock);
}
