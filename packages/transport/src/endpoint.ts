import { TransportError } from "./errors.js";

/** Endpoint URL schemes (CONTRACT 3). */
export const Scheme = {
  TCP: "tcp",
  UNIX: "unix",
  TLS: "tls",
  ZMQ_TCP: "zmq+tcp",
  ZMQ_IPC: "zmq+ipc",
  /** Same host only (issue 23): a unix socket doorbell, request bytes through shared memory. */
  SHM_UNIX: "shm+unix",
} as const;

/** Union of the endpoint scheme strings. */
export type Scheme = (typeof Scheme)[keyof typeof Scheme];

/** All schemes, in documentation order. */
export const SCHEMES: readonly Scheme[] = Object.values(Scheme);

/** A parsed endpoint: `host`/`port` for tcp-like schemes, `path` for unix-like ones. */
export type Endpoint =
  | {
      /** A tcp-like scheme: plain TCP, TLS over TCP, or ZeroMQ over TCP. */
      readonly scheme: "tcp" | "tls" | "zmq+tcp";
      /** Host name or IP address, IPv6 without its brackets; `*` (any interface) only for zmq+tcp. */
      readonly host: string;
      /** TCP port, 0..65535; 0 asks a server for any free port. */
      readonly port: number;
    }
  | {
      /** A unix-like scheme: a Unix domain socket, or ZeroMQ over IPC. */
      readonly scheme: "unix" | "zmq+ipc" | "shm+unix";
      /** Absolute socket path, percent-decoded, at most 107 bytes (sockaddr_un limit). */
      readonly path: string;
    };

// sockaddr_un.sun_path is 108 bytes on Linux including the terminating NUL.
const MAX_UNIX_PATH_BYTES = 107;
const HOST_PORT = /^(\[[0-9A-Fa-f:.%A-Za-z]+\]|[A-Za-z0-9._*-]+):([0-9]{1,5})$/;

function bad(endpoint: string, why: string): TransportError {
  return new TransportError("TRANSPORT_BAD_ENDPOINT", `bad endpoint ${JSON.stringify(endpoint)}: ${why}`);
}

/**
 * Parses `tcp://host:port`, `tls://host:port`, `zmq+tcp://host:port`, `unix:///abs/path` or
 * `zmq+ipc:///abs/path` (CONTRACT 3), or `shm+unix:///abs/path` (issue 23, docs/transport.md "shm"). IPv6 hosts go in brackets (`tcp://[::1]:5555`); port 0 asks
 * the server for any free port.
 *
 * @throws {TransportError} `TRANSPORT_BAD_ENDPOINT` naming the first problem.
 */
export function parseEndpoint(endpoint: string): Endpoint {
  if (typeof endpoint !== "string") throw bad(String(endpoint), "not a string");
  const sep = endpoint.indexOf("://");
  if (sep < 0) throw bad(endpoint, 'missing "://"');
  const scheme = endpoint.slice(0, sep);
  const rest = endpoint.slice(sep + 3);
  switch (scheme) {
    case "tcp":
    case "tls":
    case "zmq+tcp": {
      const m = HOST_PORT.exec(rest);
      if (m === null) throw bad(endpoint, "expected host:port");
      let host = m[1] as string;
      const port = Number(m[2]);
      if (port > 65535) throw bad(endpoint, `port ${port} outside [0, 65535]`);
      if (host.startsWith("[")) host = host.slice(1, -1);
      if (host === "*" && scheme !== "zmq+tcp") throw bad(endpoint, 'host "*" is only valid for zmq+tcp');
      return { scheme, host, port };
    }
    case "unix":
    case "zmq+ipc":
    case "shm+unix": {
      if (!rest.startsWith("/")) throw bad(endpoint, "expected an absolute path (unix:///abs/path)");
      let path: string;
      try {
        path = decodeURIComponent(rest);
      } catch {
        throw bad(endpoint, "invalid percent-encoding in path");
      }
      if (path.includes("\0")) throw bad(endpoint, "path contains NUL");
      if (path.endsWith("/")) throw bad(endpoint, "path names a directory");
      const bytes = Buffer.byteLength(path);
      if (bytes > MAX_UNIX_PATH_BYTES)
        throw bad(endpoint, `path is ${bytes} bytes, limit ${MAX_UNIX_PATH_BYTES}`);
      return { scheme, path };
    }
    default:
      throw bad(endpoint, `unknown scheme ${JSON.stringify(scheme)} (expected one of ${SCHEMES.join(", ")})`);
  }
}

/** Formats an {@link Endpoint} back into its URL form (IPv6 hosts bracketed). */
export function formatEndpoint(ep: Endpoint): string {
  if ("path" in ep) return `${ep.scheme}://${ep.path}`;
  const host = ep.host.includes(":") ? `[${ep.host}]` : ep.host;
  return `${ep.scheme}://${host}:${ep.port}`;
}
