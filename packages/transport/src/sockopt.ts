// Socket buffer sizes of unix-domain stream sockets (issue 23): Node has no setsockopt for
// net.Socket, so SO_SNDBUF / SO_RCVBUF are set through koffi, the optional peer dependency the
// shm transport loads too. Without koffi (or off Linux/glibc) everything here is a no-op and the
// socket keeps the kernel's default (net.core.wmem_default, 208 KiB on most Linux systems).
//
// Why: a unix stream socket's sender may have at most SO_SNDBUF bytes queued towards the peer. A
// 1.5 MiB STEP (64 slots x 1 row of 24 KiB) then leaves in 5 or more writev calls, each after an
// event-loop turn waiting for the worker to read (measured: 4.9 writev and 5.5 epoll_wait per
// round on unix against 1 and 1.6 on tcp, whose loopback buffers autotune to 4 MiB), so both
// processes ping-pong through the scheduler for every STEP. With a send buffer that holds the
// whole frame, the writev is one call, as on tcp.
import type * as net from "node:net";
import { nativeLibc } from "./native.js";

// Linux <asm-generic/socket.h> (x86_64 and arm64 alike).
const SOL_SOCKET = 1;
const SO_SNDBUF = 7;
const SO_RCVBUF = 8;

/** The file descriptor of a connected unix/tcp socket, or -1 (no handle, not POSIX). */
export function fdOf(sock: net.Socket): number {
  const fd = (sock as unknown as { _handle?: { fd?: unknown } | null })._handle?.fd;
  return typeof fd === "number" && Number.isInteger(fd) && fd >= 0 ? fd : -1;
}

const one = new Int32Array(1);
const lenOut = new Uint32Array(1);

/**
 * Asks the kernel for a send (`which` "send") or receive buffer of at least `bytes` on `sock`;
 * Linux doubles the value it stores and caps the request at net.core.wmem_max / rmem_max.
 * Returns the buffer size the kernel then reports, or -1 when it could not be set here (no koffi,
 * not Linux, no descriptor). Never throws: the socket works either way, only slower.
 */
export function setSocketBuffer(sock: net.Socket, which: "send" | "recv", bytes: number): number {
  const c = nativeLibc();
  const fd = fdOf(sock);
  if (c === null || fd < 0) return -1;
  const name = which === "send" ? SO_SNDBUF : SO_RCVBUF;
  one[0] = Math.min(bytes, 0x3fffffff);
  if (c.setsockopt(fd, SOL_SOCKET, name, one, 4) !== 0) return -1;
  return socketBuffer(sock, which);
}

/** The send or receive buffer size the kernel reports for `sock`, or -1 when it cannot be read. */
export function socketBuffer(sock: net.Socket, which: "send" | "recv"): number {
  const c = nativeLibc();
  const fd = fdOf(sock);
  if (c === null || fd < 0) return -1;
  lenOut[0] = 4;
  one[0] = 0;
  if (c.getsockopt(fd, SOL_SOCKET, which === "send" ? SO_SNDBUF : SO_RCVBUF, one, lenOut) !== 0) return -1;
  return one[0] as number;
}
