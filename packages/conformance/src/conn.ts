/**
 * Raw connections of the tester: node:net / node:tls streams with a hand-written little-endian
 * length prefix (CONTRACT 3), and ZeroMQ DEALER sockets from `zeromq` directly. Nothing goes
 * through `@tapwire/transport`, so a framing mistake it shares with tapwire's peers shows.
 */
import { readFileSync } from "node:fs";
import * as net from "node:net";
import * as tls from "node:tls";
import * as zmq from "zeromq";
import { ConformanceError } from "./errors.js";
import { lePrefix, u32 } from "./frames.js";
import type { ShmClientOptions } from "./shm.js";
import { connectShm } from "./shm.js";

/** An endpoint of CONTRACT 3. */
export interface Endpoint {
  /** The transport. */
  scheme: "tcp" | "unix" | "tls" | "zmq+tcp" | "zmq+ipc" | "shm+unix";
  /** The URL as given. */
  url: string;
  /** Host of tcp, tls and zmq+tcp ("" otherwise). */
  host: string;
  /** Port of tcp, tls and zmq+tcp (0 otherwise). */
  port: number;
  /** Path of unix, zmq+ipc and shm+unix ("" otherwise). */
  path: string;
}

/** TLS options of the tester's client side. */
export interface TlsClientOptions {
  /** PEM CA file: verify the worker's certificate (else it is not verified). */
  caFile?: string;
  /** PEM client certificate and key files. */
  certFile?: string;
  /** PEM key file of `certFile`. */
  keyFile?: string;
  /** SNI / name to verify (default the host). */
  servername?: string;
}

/** Parses an endpoint URL (CONTRACT 3). */
export function parseEndpoint(url: string): Endpoint {
  const m = /^(tcp|tls|zmq\+tcp):\/\/(\[[^\]]+\]|[^:/]+):(\d+)$/.exec(url);
  if (m !== null) {
    const host = m[2]!.replace(/^\[|\]$/g, "");
    return { scheme: m[1] as Endpoint["scheme"], url, host, port: Number(m[3]), path: "" };
  }
  const u = /^(unix|zmq\+ipc|shm\+unix):\/\/(\/.+)$/.exec(url);
  if (u !== null) return { scheme: u[1] as Endpoint["scheme"], url, host: "", port: 0, path: u[2]! };
  throw new ConformanceError(
    "CONFORMANCE_BAD_ENDPOINT",
    `endpoint ${url} is not tcp://host:port, unix:///path, tls://host:port, zmq+tcp://host:port, zmq+ipc:///path or shm+unix:///path`,
  );
}

/** What a receive produced. */
export type Received =
  | {
      /** A whole message. */
      kind: "msg";
      /** The message (without its prefix). */
      bytes: Uint8Array;
      /** Its stream length prefix as received (null on ZeroMQ). */
      prefix: Uint8Array | null;
    }
  | {
      /** The peer closed the connection. */
      kind: "closed";
      /** Bytes of an incomplete message left unread. */
      pending: number;
    }
  | {
      /** Nothing whole arrived in time. */
      kind: "timeout";
      /** Bytes of an incomplete message received so far. */
      pending: number;
    }
  | {
      /** A length prefix above {@link MAX_REPLY_BYTES} (a big-endian writer, or garbage). */
      kind: "bad-prefix";
      /** The four prefix bytes. */
      prefix: Uint8Array;
      /** Their value read little-endian. */
      length: number;
    };

/** Largest reply length the tester accepts from a prefix (above: reported as a bad prefix). */
export const MAX_REPLY_BYTES = 64 * 1024 * 1024;

/** A connection to a worker (or, in the client mode, from a client). */
export interface RawConn {
  /** True for tcp, unix and tls (a length-prefixed stream); false for ZeroMQ. */
  readonly stream: boolean;
  /** Sends one message (stream: LE prefix + bytes in one write; zmq: one single-part message). */
  send(msg: Uint8Array): void;
  /** Stream: writes bytes as they are. ZeroMQ: sends them as one message. */
  sendRaw(bytes: Uint8Array): void;
  /** Stream: writes each part separately (a split write). ZeroMQ: one multipart message. */
  sendParts(parts: Uint8Array[]): void;
  /** Next message, or closed / timeout / a length prefix above {@link MAX_REPLY_BYTES}. */
  recv(timeoutMs: number): Promise<Received>;
  /** Resolves true when the peer closes within `ms` (ZeroMQ: always false, it has no close). */
  waitClosed(ms: number): Promise<boolean>;
  /** True once the peer or the tester closed it. */
  readonly isClosed: boolean;
  /** Closes the connection (ZeroMQ: the DEALER). */
  close(): void;
}

class StreamConn implements RawConn {
  readonly stream = true;
  private buf: Buffer = Buffer.alloc(0);
  private closed = false;
  private waiters: (() => void)[] = [];
  constructor(private readonly sock: net.Socket) {
    sock.on("data", (d: Buffer) => {
      this.buf = this.buf.length === 0 ? d : Buffer.concat([this.buf, d]);
      this.wake();
    });
    const end = () => {
      this.closed = true;
      this.wake();
    };
    sock.on("close", end);
    sock.on("end", end);
    sock.on("error", end);
  }
  private wake(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }
  get isClosed(): boolean {
    return this.closed;
  }
  send(msg: Uint8Array): void {
    if (this.closed) return;
    this.sock.write(Buffer.concat([lePrefix(msg.length), msg]));
  }
  sendRaw(bytes: Uint8Array): void {
    if (this.closed) return;
    this.sock.write(bytes);
  }
  sendParts(parts: Uint8Array[]): void {
    for (const p of parts) this.sendRaw(p);
  }
  private tryTake(): Received | null {
    if (this.buf.length >= 4) {
      const len = u32(this.buf, 0);
      if (len > MAX_REPLY_BYTES) {
        return { kind: "bad-prefix", prefix: new Uint8Array(this.buf.subarray(0, 4)), length: len };
      }
      if (this.buf.length >= 4 + len) {
        const prefix = new Uint8Array(this.buf.subarray(0, 4));
        const bytes = new Uint8Array(this.buf.subarray(4, 4 + len));
        this.buf = this.buf.subarray(4 + len);
        return { kind: "msg", bytes, prefix };
      }
    }
    if (this.closed) return { kind: "closed", pending: this.buf.length };
    return null;
  }
  recv(timeoutMs: number): Promise<Received> {
    const now = this.tryTake();
    if (now !== null) return Promise.resolve(now);
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== check);
        resolve({ kind: "timeout", pending: this.buf.length });
      }, timeoutMs);
      const check = (): void => {
        const r = this.tryTake();
        if (r === null) {
          this.waiters.push(check);
          return;
        }
        clearTimeout(timer);
        resolve(r);
      };
      this.waiters.push(check);
    });
  }
  waitClosed(ms: number): Promise<boolean> {
    if (this.closed) return Promise.resolve(true);
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== check);
        resolve(false);
      }, ms);
      const check = (): void => {
        if (!this.closed) {
          this.waiters.push(check);
          return;
        }
        clearTimeout(timer);
        resolve(true);
      };
      this.waiters.push(check);
    });
  }
  close(): void {
    this.closed = true;
    this.sock.destroy();
    this.wake();
  }
}

class ZmqConn implements RawConn {
  readonly stream = false;
  private q: Uint8Array[] = [];
  private closed = false;
  private waiters: (() => void)[] = [];
  constructor(private readonly d: zmq.Dealer) {
    void this.loop();
  }
  private async loop(): Promise<void> {
    for (;;) {
      let parts: Buffer[];
      try {
        parts = await this.d.receive();
      } catch {
        return;
      }
      this.q.push(parts.length === 1 ? new Uint8Array(parts[0]!) : new Uint8Array(Buffer.concat(parts)));
      const w = this.waiters;
      this.waiters = [];
      for (const f of w) f();
    }
  }
  get isClosed(): boolean {
    return this.closed;
  }
  send(msg: Uint8Array): void {
    if (!this.closed) void this.d.send(msg).catch(() => undefined);
  }
  sendRaw(bytes: Uint8Array): void {
    this.send(bytes);
  }
  sendParts(parts: Uint8Array[]): void {
    if (!this.closed) void this.d.send(parts).catch(() => undefined);
  }
  recv(timeoutMs: number): Promise<Received> {
    const m = this.q.shift();
    if (m !== undefined) return Promise.resolve({ kind: "msg", bytes: m, prefix: null });
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== check);
        resolve({ kind: "timeout", pending: 0 });
      }, timeoutMs);
      const check = (): void => {
        const x = this.q.shift();
        if (x === undefined) {
          this.waiters.push(check);
          return;
        }
        clearTimeout(timer);
        resolve({ kind: "msg", bytes: x, prefix: null });
      };
      this.waiters.push(check);
    });
  }
  waitClosed(ms: number): Promise<boolean> {
    return new Promise((resolve) => setTimeout(() => resolve(false), Math.min(ms, 50)));
  }
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.d.close();
  }
}

/** A plain unix stream connection to `path` (the socket of a `shm+unix://` endpoint). */
export function connectStream(path: string, timeoutMs: number): Promise<RawConn> {
  return connect({ scheme: "unix", url: `unix://${path}`, host: "", port: 0, path }, timeoutMs);
}

/**
 * Opens a raw connection to `ep` (ZeroMQ: a new DEALER, i.e. a new peer identity; shm+unix: a
 * session file ATTACHed, see `shm.ts`).
 */
export async function connect(
  ep: Endpoint,
  timeoutMs: number,
  tlsOpts: TlsClientOptions = {},
  shmOpts: ShmClientOptions = {},
): Promise<RawConn> {
  if (ep.scheme === "shm+unix") return connectShm(ep, timeoutMs, shmOpts);
  if (ep.scheme === "zmq+tcp" || ep.scheme === "zmq+ipc") {
    const d = new zmq.Dealer({ linger: 0 });
    const addr =
      ep.scheme === "zmq+tcp"
        ? `tcp://${ep.host.includes(":") ? `[${ep.host}]` : ep.host}:${ep.port}`
        : `ipc://${ep.path}`;
    if (ep.host.includes(":")) d.ipv6 = true;
    const hs = new Promise<boolean>((resolve) => {
      const t = setTimeout(() => resolve(false), timeoutMs);
      d.events.on("handshake", () => {
        clearTimeout(t);
        resolve(true);
      });
    });
    d.connect(addr);
    if (!(await hs)) {
      d.close();
      throw new ConformanceError(
        "CONFORMANCE_CONNECT",
        `no ZeroMQ handshake with ${ep.url} within ${timeoutMs} ms`,
      );
    }
    return new ZmqConn(d);
  }
  return new Promise<RawConn>((resolve, reject) => {
    let sock: net.Socket;
    const fail = (e: Error) => {
      clearTimeout(t);
      sock.destroy();
      reject(
        new ConformanceError("CONFORMANCE_CONNECT", `connect to ${ep.url} failed: ${e.message}`, {
          cause: e,
        }),
      );
    };
    const ok = () => {
      clearTimeout(t);
      sock.off("error", fail);
      if (ep.scheme !== "unix") sock.setNoDelay(true);
      resolve(new StreamConn(sock));
    };
    if (ep.scheme === "tls") {
      const opts: tls.ConnectionOptions = {
        host: ep.host,
        port: ep.port,
        minVersion: "TLSv1.3",
        rejectUnauthorized: tlsOpts.caFile !== undefined,
        servername: tlsOpts.servername ?? (net.isIP(ep.host) ? undefined : ep.host),
      } as tls.ConnectionOptions;
      if (tlsOpts.caFile !== undefined) opts.ca = readFileSync(tlsOpts.caFile);
      if (tlsOpts.certFile !== undefined) opts.cert = readFileSync(tlsOpts.certFile);
      if (tlsOpts.keyFile !== undefined) opts.key = readFileSync(tlsOpts.keyFile);
      sock = tls.connect(opts, ok);
    } else if (ep.scheme === "unix") {
      sock = net.connect({ path: ep.path }, ok);
    } else {
      sock = net.connect({ host: ep.host, port: ep.port }, ok);
    }
    sock.once("error", fail);
    const t = setTimeout(() => fail(new Error(`timed out after ${timeoutMs} ms`)), timeoutMs);
  });
}
