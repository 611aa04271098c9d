// The data server's socket send buffer on the same host (issue 23, per-byte cost). Node has no
// setsockopt for a net.Socket, so SO_SNDBUF is set through koffi, the optional peer dependency the
// shm data plane loads too, by @tapwire/transport's binding (sockopt.ts over native.ts: one owner).
// Without koffi, off Linux or without glibc this is a no-op and the socket keeps the kernel's
// choice.
//
// Why (docs/benchmarks/ec-connector.md, "Per-byte cost"): on unix sockets the kernel default
// (net.core.wmem_default, 208 KiB) makes a 16 MiB READ a ping-pong of ~200 KiB rounds in which the
// producer waits while the reader checksums; on loopback tcp autotuning grows the buffer to
// tcp_wmem's maximum (4 MiB), so the bytes are out of cache by the time the reader copies them. A
// fixed 512 KiB request (the kernel doubles it: ~1 MiB queued, within a core's L2) measured faster
// on both, for the raw stream too. Only same-host peers get it: across hosts a fixed buffer would
// cap tcp at buffer / RTT, so remote tcp keeps autotuning.
import type * as net from "node:net";
import { setNativeKoffiForTest, setSocketBuffer, socketBuffer } from "@tapwire/transport";

/** What {@link setSendBuffer} asks for by default on unix and loopback tcp data connections. */
export const DEFAULT_SEND_BUFFER_BYTES = 512 * 1024;

/**
 * What {@link setSendBuffer} adds on loopback tcp (not unix) to the size it is given. tcp counts
 * each queued segment's overhead against SO_SNDBUF, so with exactly 2 x 512 KiB a corked ACK + DATA
 * header + 1 MiB writev left its last ~1 KiB behind (EAGAIN), and that tail waited for tcp's
 * writable wakeup (a third of the buffer acked) before the reader could finish: ~0.1-0.2 ms per
 * 1 MiB transfer that the raw stream (no header) never paid (issue 23, 2026-12-02). Unix sockets
 * keep the exact size (the tail fit there, and 512 KiB is tuned for them).
 */
export const TCP_SEND_BUFFER_HEADROOM_BYTES = 64 * 1024;

/** Internal, for tests: replaces how koffi is required (`null`: the real one) and forgets a loaded one. */
export function setSockbufKoffiForTest(fn: (() => unknown) | null): void {
  setNativeKoffiForTest(fn);
}

/** The send buffer the kernel reports for `sock` (Linux: twice what was asked), or -1 when unknown. */
export function sendBuffer(sock: net.Socket): number {
  return socketBuffer(sock, "send");
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
 * Asks for a send buffer of `bytes` on a same-host `sock` (see the file comment; loopback tcp gets
 * {@link TCP_SEND_BUFFER_HEADROOM_BYTES} more, for the frame headers). Returns the size
 * the kernel then reports, or -1 when nothing was set (`bytes` 0, a remote peer, no koffi, no
 * descriptor). Never throws: the socket works either way, only slower.
 */
export function setSendBuffer(sock: net.Socket, bytes: number): number {
  if (bytes <= 0 || !sameHost(sock)) return -1;
  const tcp = sock.remoteAddress !== undefined;
  return setSocketBuffer(sock, "send", tcp ? bytes + TCP_SEND_BUFFER_HEADROOM_BYTES : bytes);
}
