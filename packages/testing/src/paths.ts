import { randomBytes } from "node:crypto";
import type { AddressInfo } from "node:net";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { TestingError, TestingErrorCode } from "./errors.js";

/** sockaddr_un.sun_path holds 108 bytes on Linux including the terminating NUL. */
export const MAX_UNIX_PATH_BYTES = 107;

let socketCounter = 0;

/**
 * A fresh unix socket path `<tmpdir>/tw-<tag>-<pid>-<n>-<random>.sock` that no other test (or
 * process) uses. Falls back to /tmp when `os.tmpdir()` is too long for the 107-byte limit; the tag
 * is reduced to `[A-Za-z0-9_-]` and shortened as needed. The file is not created.
 */
export function uniqueSocketPath(tag = "s"): string {
  const safeTag =
    String(tag)
      .replace(/[^A-Za-z0-9_-]/g, "_")
      .slice(0, 24) || "s";
  const name = (t: string) =>
    `tw-${t}-${process.pid}-${++socketCounter}-${randomBytes(3).toString("hex")}.sock`;
  for (const dir of [tmpdir(), "/tmp"]) {
    let t = safeTag;
    for (;;) {
      const p = join(dir, name(t));
      if (Buffer.byteLength(p) <= MAX_UNIX_PATH_BYTES) return p;
      if (t.length <= 1) break;
      t = t.slice(0, Math.max(1, t.length >> 1));
    }
  }
  throw new TestingError(
    TestingErrorCode.BAD_OPTION,
    `no directory gives a unix socket path within ${MAX_UNIX_PATH_BYTES} bytes`,
  );
}

/**
 * A TCP port that was free on 127.0.0.1 a moment ago. Racy by nature: prefer port 0 and the
 * bound address whenever the code under test supports it.
 */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address() as AddressInfo;
      s.close(() => resolve(port));
    });
  });
}

/** Every transport endpoint scheme (CONTRACT 3), in documentation order. */
export const transportSchemes = ["tcp", "unix", "tls", "zmq+tcp", "zmq+ipc", "shm+unix"] as const;

/** One of {@link transportSchemes}. */
export type TransportScheme = (typeof transportSchemes)[number];

/**
 * A listen endpoint for `scheme` that cannot collide with another test: `tcp://127.0.0.1:0`,
 * `unix://<unique path>` (so `unix:///tmp/…`), `tls://127.0.0.1:0`, `zmq+tcp://127.0.0.1:0`,
 * `zmq+ipc://<unique path>`, `shm+unix://<unique path>` (issue 23).
 */
export function endpointFor(scheme: TransportScheme, tag: string = scheme.replace("+", "")): string {
  switch (scheme) {
    case "tcp":
    case "tls":
    case "zmq+tcp":
      return `${scheme}://127.0.0.1:0`;
    case "unix":
    case "zmq+ipc":
    case "shm+unix":
      return `${scheme}://${uniqueSocketPath(tag)}`;
    default:
      throw new TestingError(TestingErrorCode.BAD_OPTION, `unknown scheme ${JSON.stringify(scheme)}`);
  }
}

/** {@link endpointFor} of every scheme: fresh endpoints for a `describe.each` over transports. */
export function transportMatrix(): string[] {
  return transportSchemes.map((s) => endpointFor(s));
}
