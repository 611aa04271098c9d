import { lstatSync, unlinkSync } from "node:fs";
import * as net from "node:net";
import * as tls from "node:tls";
import type { Registry } from "@tapwire/stats";
import { type Endpoint, formatEndpoint } from "./endpoint.js";
import { TransportError } from "./errors.js";
import { type Limited, ServerLimits } from "./limits.js";
import type { Handler, RpcServer, TlsFailureReason } from "./options.js";
import { Conn, type StreamServerConfig } from "./stream-conn.js";

export type { StreamServerConfig } from "./stream-conn.js";

// Per-connection read buffer of sockets read with `onread` (see adoptWithOnread).
const READ_CHUNK = 64 * 1024;

/** Classifies a refused TLS handshake (Node/OpenSSL error codes) for onTlsError and the counters. */
export function tlsFailureReason(e: unknown): TlsFailureReason {
  const code = String((e as { code?: unknown } | null)?.code ?? "");
  const msg = String((e as { message?: unknown } | null)?.message ?? "");
  if (code === "ERR_SSL_PEER_DID_NOT_RETURN_A_CERTIFICATE" || /did not return a certificate/i.test(msg)) {
    return "no_certificate";
  }
  if (/CERT|VERIFY|ISSUER|SIGNATURE/i.test(code) || /certificate/i.test(msg)) return "bad_certificate";
  if (code === "ERR_TLS_HANDSHAKE_TIMEOUT" || /timed? ?out/i.test(msg)) return "timeout";
  if (code.startsWith("ERR_SSL_") || /wrong version|unsupported protocol|http request/i.test(msg)) {
    return "protocol";
  }
  return "other";
}

/** The parts of a libuv stream handle that {@link adoptWithOnread} relies on. */
interface StreamHandle {
  readStart(): number;
  readStop(): number;
  useUserBuffer(buf: Uint8Array): void;
}

function isStreamHandle(h: unknown): h is StreamHandle {
  if (typeof h !== "object" || h === null) return false;
  const o = h as Record<string, unknown>;
  return (
    typeof o.readStart === "function" &&
    typeof o.readStop === "function" &&
    typeof o.useUserBuffer === "function"
  );
}

/**
 * `net.Server` has no `onread` option in Node 20, so an accepted socket is read through 'data'
 * events: a fresh 64 KiB buffer per read and, for a message spanning many reads, a copy of each.
 * Here the accepted (still paused) socket's handle is handed to a new `net.Socket` created with
 * `onread`, which lets the receive path pick the buffer of every read: a reused per-connection
 * buffer, or straight into the reassembly buffer for the rest of a large message (one read
 * syscall can then take megabytes: 2-4x faster for 4 MiB requests over tcp, see
 * docs/benchmarks/transport.md). This uses Node's internal `handle` constructor option (the one
 * `net.Server` itself uses): when it is not honoured, null is returned and the caller falls back
 * to 'data' events on the original socket.
 */
function adoptWithOnread(orig: net.Socket, onread: net.OnReadOpts): net.Socket | null {
  const holder = orig as unknown as { _handle: unknown };
  const handle = holder._handle;
  if (!isStreamHandle(handle)) return null;
  let sock: net.Socket;
  try {
    sock = new net.Socket({ handle, onread, readable: true, writable: true } as net.SocketConstructorOpts);
  } catch {
    return null;
  }
  if ((sock as unknown as { _handle: unknown })._handle !== handle) {
    sock.destroy();
    return null;
  }
  // The original socket no longer owns the handle: destroying it only releases the server's
  // connection count (net.Server.close() waits for it), it does not close the connection.
  holder._handle = null;
  orig.destroy();
  return sock;
}

/** A TLS connection in its handshake, as maxConnections sees it: unbound, evictable. */
class Handshake implements Limited {
  readonly bound = false;
  readonly isBusy = false;
  readonly lastActive = Date.now();
  readonly #raw: net.Socket;
  readonly #refused: WeakSet<net.Socket>;
  readonly #gone: () => void;

  constructor(raw: net.Socket, refused: WeakSet<net.Socket>, gone: () => void) {
    this.#raw = raw;
    this.#refused = refused;
    this.#gone = gone;
  }

  evict(): void {
    this.#refused.add(this.#raw);
    this.#gone();
    this.#raw.destroy();
  }
}

/** Server for the length-prefixed stream schemes (tcp, unix, tls), CONTRACT 3. */
export class StreamServer implements RpcServer {
  endpoint = "";
  readonly registry: Registry;
  readonly handler: Handler;
  readonly #ep: Endpoint;
  readonly #cfg: StreamServerConfig;
  readonly #server: net.Server;
  readonly #conns = new Set<Conn>();
  /** Receive budget and connection cap (CONTRACT 11), shared by every connection. */
  readonly limits: ServerLimits<Limited>;
  #nextId = 1;
  #closePromise: Promise<void> | null = null;
  #drained: (() => void) | null = null;

  constructor(ep: Endpoint, handler: Handler, cfg: StreamServerConfig) {
    this.#ep = ep;
    this.handler = handler;
    this.#cfg = cfg;
    this.registry = cfg.registry;
    this.limits = new ServerLimits<Limited>(cfg.maxBufferedBytes, cfg.maxConnections, cfg.metrics);
    this.limits.reclaim = () => {
      for (const c of this.#conns) c.reclaimIdle();
    };
    if (ep.scheme === "tls") {
      const t = cfg.options.tls;
      if (t === undefined) {
        throw new TransportError(
          "TRANSPORT_BAD_OPTION",
          "option tls: required (cert and key) for tls:// endpoints",
        );
      }
      const o: tls.TlsOptions = {
        cert: t.cert,
        key: t.key,
        minVersion: "TLSv1.3",
        requestCert: t.requestCert === true,
        rejectUnauthorized: t.rejectUnauthorized !== false,
        noDelay: true,
      };
      // An unbound connection's time limit covers its handshake too (Node's default is 120 s).
      if (cfg.unboundIdleMs > 0) o.handshakeTimeout = cfg.unboundIdleMs;
      if (t.ca !== undefined) o.ca = t.ca;
      const s = tls.createServer(o, (sock) => this.#acceptTls(sock));
      s.on("connection", (raw: net.Socket) => this.#onTlsConnection(raw));
      s.on("tlsClientError", (e: Error, sock: tls.TLSSocket) => this.#onTlsClientError(e, sock));
      this.#server = s;
    } else {
      // Paused until adopted (adoptWithOnread): no read may happen on the original socket.
      this.#server = net.createServer({ noDelay: true, pauseOnConnect: true }, (sock) =>
        this.#acceptStream(sock),
      );
    }
  }

  get connections(): number {
    return this.#conns.size;
  }

  /** TLS connections still in their handshake, by TCP socket (admitted, unbound, evictable). */
  readonly #handshaking = new Map<net.Socket, Handshake>();
  /** TCP sockets we closed (refused, evicted): their failed handshake is not a TLS failure. */
  readonly #refusedRaw = new WeakSet<net.Socket>();

  /** TLS: maxConnections applies from the TCP accept, so handshakes that never end count. */
  #onTlsConnection(raw: net.Socket): void {
    raw.setNoDelay(true);
    if (this.#closePromise !== null || !this.limits.admit()) {
      this.#refusedRaw.add(raw);
      raw.destroy();
      return;
    }
    const gone = (): void => {
      if (this.#handshaking.delete(raw)) this.limits.untrack(h);
    };
    const h = new Handshake(raw, this.#refusedRaw, gone);
    this.#handshaking.set(raw, h);
    this.limits.track(h);
    raw.once("close", gone);
  }

  #acceptTls(sock: tls.TLSSocket): void {
    const raw = (sock as unknown as { _parent?: net.Socket })._parent;
    const h = raw === undefined ? undefined : this.#handshaking.get(raw);
    if (raw !== undefined && h !== undefined) {
      this.#handshaking.delete(raw);
      this.#accept(sock, null, h);
    } else if (raw === undefined && this.limits.admit()) {
      // Node did not expose the TCP socket: admitted here instead.
      this.#accept(sock, null);
    } else {
      sock.destroy();
    }
  }

  #onTlsClientError(e: Error, sock: tls.TLSSocket): void {
    const raw = (sock as unknown as { _parent?: net.Socket })._parent;
    if ((e as NodeJS.ErrnoException).code === "ERR_TLS_HANDSHAKE_TIMEOUT") {
      // Node leaves the socket open after a handshake timeout (others close after their alert).
      sock.destroy();
      raw?.destroy();
    }
    if (raw !== undefined && this.#refusedRaw.has(raw)) return;
    const m = this.#cfg.metrics;
    m.errors.inc();
    // Node verifies a client certificate after the handshake and then just destroys the socket
    // (reported here as a hang-up); the verification error is on the socket.
    const authErr = (sock as { authorizationError?: unknown }).authorizationError;
    let err = e;
    if (authErr !== undefined && authErr !== null) {
      err = new Error(`client certificate refused: ${String(authErr)}`, { cause: e });
      (err as NodeJS.ErrnoException).code = String(authErr);
    }
    const reason = authErr !== undefined && authErr !== null ? "bad_certificate" : tlsFailureReason(e);
    m.tlsFailures.inc();
    m.tlsFailuresBy[reason].inc();
    const remote =
      raw?.remoteAddress !== undefined
        ? `${raw.remoteAddress}:${raw.remotePort}`
        : (sock.remoteAddress ?? "");
    this.#cfg.options.onTlsError?.(reason, remote, err);
  }

  /** tcp/unix: read the connection with `onread` when Node lets us (see adoptWithOnread). */
  #acceptStream(orig: net.Socket): void {
    if (this.#closePromise !== null || !this.limits.admit()) {
      orig.destroy();
      return;
    }
    let rbuf: Buffer;
    try {
      rbuf =
        this.#cfg.allocate === undefined ? Buffer.allocUnsafe(READ_CHUNK) : this.#cfg.allocate(READ_CHUNK);
    } catch (e) {
      if (!(e instanceof RangeError)) throw e;
      this.limits.untrack(null);
      this.#cfg.metrics.allocFailures.inc();
      orig.destroy();
      return;
    }
    let conn: Conn | null = null;
    const sock =
      this.#cfg.dataEvents === true
        ? null
        : adoptWithOnread(orig, {
            buffer: () => (conn === null ? rbuf : conn.nextBuffer()),
            callback: (n, buf) => conn?.onRead(n, buf) === true,
          });
    if (sock === null) {
      this.#accept(orig, null);
      orig.resume();
      return;
    }
    sock.setNoDelay(true);
    conn = this.#accept(sock, rbuf);
  }

  /**
   * Creates the connection of an admitted socket (`limits.admit()` was true); `handshake`: the
   * admitted TLS handshake it replaces.
   */
  #accept(sock: net.Socket, rbuf: Buffer | null, handshake?: Handshake): Conn | null {
    const h = handshake;
    if (this.#closePromise !== null) {
      this.limits.untrack(h ?? null);
      sock.destroy();
      return null;
    }
    const c = new Conn(this.#nextId++, sock, this, this.#cfg, rbuf);
    if (h === undefined) this.limits.track(c);
    else this.limits.replace(h, c);
    this.#conns.add(c);
    this.#cfg.metrics.connections.inc();
    this.#cfg.metrics.open.inc();
    this.#cfg.options.onConnection?.(c);
    return c;
  }

  removeConn(c: Conn): void {
    if (!this.#conns.delete(c)) return;
    this.#cfg.metrics.open.dec();
    this.#cfg.options.onClose?.(c);
    if (this.#conns.size === 0 && this.#drained !== null) this.#drained();
  }

  async start(): Promise<void> {
    const ep = this.#ep;
    if ("path" in ep) await removeStaleSocket(ep.path);
    await new Promise<void>((resolve, reject) => {
      const onError = (e: NodeJS.ErrnoException): void => {
        reject(
          new TransportError(
            "TRANSPORT_LISTEN",
            `listen on ${formatEndpoint(ep)} failed: ${e.code ?? e.message}`,
            {
              cause: e,
            },
          ),
        );
      };
      this.#server.once("error", onError);
      const done = (): void => {
        this.#server.removeListener("error", onError);
        resolve();
      };
      if ("path" in ep) this.#server.listen({ path: ep.path }, done);
      else this.#server.listen({ host: ep.host, port: ep.port }, done);
    });
    this.#server.on("error", () => this.#cfg.metrics.errors.inc());
    if (ep.scheme === "unix") {
      this.endpoint = formatEndpoint(ep);
    } else {
      const a = this.#server.address() as net.AddressInfo;
      this.endpoint = formatEndpoint({ scheme: ep.scheme as "tcp" | "tls", host: a.address, port: a.port });
    }
  }

  close(): Promise<void> {
    if (this.#closePromise !== null) return this.#closePromise;
    this.#closePromise = (async () => {
      const stopped = new Promise<void>((resolve) => this.#server.close(() => resolve()));
      const drained = new Promise<void>((resolve) => {
        this.#drained = resolve;
        if (this.#conns.size === 0) resolve();
      });
      for (const c of this.#conns) c.shutdown();
      let timer: NodeJS.Timeout | undefined;
      const deadline = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, this.#cfg.closeTimeoutMs);
      });
      await Promise.race([drained, deadline]);
      clearTimeout(timer);
      for (const c of this.#conns) c.destroy();
      await stopped;
      if ("path" in this.#ep) unlinkQuiet(this.#ep.path);
    })();
    return this.#closePromise;
  }
}

function unlinkQuiet(path: string): void {
  try {
    unlinkSync(path);
  } catch {
    // already gone
  }
}

/**
 * A socket file left by a dead server blocks bind(): remove it, but never a non-socket file and
 * never the socket of a live server (probed by connecting).
 */
async function removeStaleSocket(path: string): Promise<void> {
  let st: ReturnType<typeof lstatSync>;
  try {
    st = lstatSync(path);
  } catch {
    return;
  }
  if (!st.isSocket()) {
    throw new TransportError(
      "TRANSPORT_LISTEN",
      `listen on unix://${path} failed: path exists and is not a socket`,
    );
  }
  const live = await new Promise<boolean>((resolve) => {
    const s = net.connect({ path });
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
  });
  if (live) {
    throw new TransportError(
      "TRANSPORT_LISTEN",
      `listen on unix://${path} failed: a live server is listening there`,
    );
  }
  unlinkQuiet(path);
}
