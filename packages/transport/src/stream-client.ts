import * as net from "node:net";
import * as tls from "node:tls";
import type { Registry } from "@tapwire/stats";
import type { ClientConfig } from "./config.js";
import type { Endpoint } from "./endpoint.js";
import { type CallSite, type Failure, TransportError, type TransportErrorCode } from "./errors.js";
import type { ClientMetrics } from "./metrics.js";
import { nativeLibc } from "./native.js";
import type { ClientTlsOptions, RpcClient } from "./options.js";
import { HEADER_BYTES, LengthPrefix } from "./prefix.js";
import { RequestCore, replyOrThrow, State } from "./request.js";
import { GatherWriter } from "./scatter.js";
import { fdOf, setSocketBuffer, socketBuffer } from "./sockopt.js";

// A unix socket's send buffer is asked to hold a whole request up to this size (see sockopt.ts).
const UNIX_SEND_BUFFER_MAX = 4 * 1024 * 1024;
// Requests of at least this many parts go out through one writev(2) when koffi is installed.
const GATHER_MIN_PARTS = 8;
// Size of the reused receive buffer handed to the kernel (onread): one read takes at most this much.
const RECV_CHUNK = 64 * 1024;

const EMPTY: readonly Uint8Array[] = [];
// TLS 1.3: a server checks the client certificate after the client's handshake is done; its
// verdict is a session ticket (accepted) or an alert. connect() waits this long for either.
const TLS_VERDICT_WAIT_MS = 500;

/** A TLS failure in words: which side refused what (the client's TRANSPORT_CONNECT message). */
export function tlsRefusal(e: Error): string {
  const code = String((e as NodeJS.ErrnoException).code ?? "");
  if (code.includes("CERTIFICATE_REQUIRED")) return "the server requires a client certificate";
  if (/ALERT_(BAD_CERTIFICATE|UNKNOWN_CA|CERTIFICATE_UNKNOWN|DECRYPT_ERROR|ACCESS_DENIED)/.test(code)) {
    return "the server refused the client certificate";
  }
  if (code.includes("ALERT")) return "the server refused the TLS handshake";
  return "";
}

/**
 * Client for the length-prefixed stream schemes (tcp, unix, tls), CONTRACT 3.
 *
 * Receive path: `onread` into one reused 64 KiB buffer (no allocation per read), the length prefix
 * parsed incrementally, the body copied straight into the caller's reply buffer; once a reply's
 * length is known, the rest of it is read by the kernel directly into the reply buffer (no copy,
 * large reads). Send path: cork/uncork so the header and every part go out in one writev.
 */
export class StreamClient implements RpcClient {
  readonly endpoint: string;
  readonly registry: Registry;
  readonly #ep: Endpoint;
  readonly #maxMessageBytes: number;
  readonly #tlsOptions: ClientTlsOptions | undefined;
  readonly #m: ClientMetrics;

  #state: State = State.CLOSED;
  #sock: net.Socket | null = null;
  #connectPromise: Promise<void> | null = null;
  #connectAbort: ((code: TransportErrorCode, why: string) => void) | null = null;
  #closeReason = "not connected (call connect() first)";
  readonly #recvBuf = Buffer.allocUnsafe(RECV_CHUNK);
  /** writev of many parts in one syscall (tcp/unix with koffi); undefined until first needed. */
  #gather: GatherWriter | null | undefined;
  #gatherSock: net.Socket | null = null;
  readonly #header = Buffer.allocUnsafe(HEADER_BYTES);

  // The outstanding request, if any, and how much of its reply arrived.
  readonly #req: RequestCore;
  readonly #pfx = new LengthPrefix();
  #got = 0;
  /** The reply-buffer view handed out for the next read, if any (see nextBuffer). */
  #direct: Uint8Array | null = null;

  constructor(endpoint: string, ep: Endpoint, opts: ClientConfig, metrics: ClientMetrics) {
    this.endpoint = endpoint;
    this.#ep = ep;
    this.registry = opts.registry;
    this.#maxMessageBytes = opts.maxMessageBytes;
    this.#tlsOptions = opts.tls;
    this.#m = metrics;
    this.#req = new RequestCore(endpoint, opts, metrics, this.#onTimeout);
  }

  get connected(): boolean {
    return this.#state === State.OPEN;
  }

  /** @internal Why requests are refused while not {@link connected} (never connected, closed, dropped by the peer). */
  get closeReason(): string {
    return this.#closeReason;
  }

  /**
   * Diagnostic: the connection's send buffer (SO_SNDBUF) as the kernel reports it, or -1 when it
   * cannot be read here (not connected, no `koffi`, not Linux). A unix connection asks for one
   * that holds a whole request of up to 4 MiB (issue 23, see sockopt.ts).
   */
  get sendBufferBytes(): number {
    const s = this.#sock;
    return s === null || this.#state !== State.OPEN ? -1 : socketBuffer(s, "send");
  }

  connect(timeoutMs?: number): Promise<void> {
    return this.#req.connect(this.#state, this.#connectPromise, timeoutMs, this.connect, this.#start);
  }

  /** Starts a connection attempt (none under way) of at most `ms`, failing with `site`'s stack. */
  readonly #start = (ms: number, site: CallSite): Promise<void> => {
    this.#state = State.CONNECTING;
    const p = new Promise<void>((resolve, reject) => {
      const sock = this.#openSocket();
      const secure = this.#ep.scheme === "tls";
      let verdict: NodeJS.Timeout | undefined;
      let done = false;
      const finish = (err: Error | null): void => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        clearTimeout(verdict);
        sock.removeListener("error", onError);
        sock.removeListener(secure ? "secureConnect" : "connect", onConnect);
        sock.removeListener("session", onSession);
        sock.removeListener("close", onEarlyClose);
        this.#connectPromise = null;
        this.#connectAbort = null;
        if (err !== null) {
          sock.destroy();
          this.#state = State.CLOSED;
          reject(err);
          return;
        }
        this.#attach(sock);
        resolve();
      };
      let handshaken = false;
      let ticket = false;
      const onConnect = (): void => {
        if (!secure || ticket) {
          finish(null);
          return;
        }
        // CONTRACT 11: a refused client certificate must fail connect(), naming why.
        handshaken = true;
        verdict = setTimeout(() => finish(null), TLS_VERDICT_WAIT_MS);
      };
      const onSession = (): void => {
        ticket = true;
        // Not from inside OpenSSL's ticket callback: a write made there (by the caller resuming
        // on connect()) would never be sent.
        if (handshaken) setImmediate(() => finish(null));
      };
      const onEarlyClose = (): void => {
        // A Node server refusing a client certificate closes right after the handshake, no alert.
        const why = !handshaken
          ? "closed by the server during the TLS handshake"
          : this.#tlsOptions?.cert !== undefined
            ? "the server refused the client certificate (it closed the connection right after the TLS handshake)"
            : "closed by the server right after the TLS handshake (does it require a client certificate?)";
        finish(site.error("TRANSPORT_CONNECT", `connect to ${this.endpoint} failed: ${why}`));
      };
      const onError = (e: Error): void => {
        const why = secure ? tlsRefusal(e) : "";
        finish(
          site.error(
            "TRANSPORT_CONNECT",
            `connect to ${this.endpoint} failed: ${why === "" ? "" : `${why} (`}${e.message.trim()}${why === "" ? "" : ")"}`,
            e,
          ),
        );
      };
      const timer = setTimeout(
        () => finish(site.error("TRANSPORT_CONNECT", `connect to ${this.endpoint} timed out after ${ms} ms`)),
        ms,
      );
      this.#connectAbort = (code, why) => finish(site.error(code, why));
      sock.once(secure ? "secureConnect" : "connect", onConnect);
      sock.once("error", onError);
      if (secure) {
        sock.on("session", onSession);
        sock.once("close", onEarlyClose);
      }
    });
    this.#connectPromise = p;
    return p;
  };

  #openSocket(): net.Socket {
    const ep = this.#ep;
    const onread = {
      buffer: (): Uint8Array => this.#nextBuffer(),
      callback: (n: number, buf: Uint8Array): boolean => this.#onRead(n, buf),
    };
    if (ep.scheme === "unix") return net.connect({ path: ep.path, onread });
    if (ep.scheme === "tcp") return net.connect({ host: ep.host, port: ep.port, noDelay: true, onread });
    if (ep.scheme === "tls") {
      const t = this.#tlsOptions ?? {};
      const o: tls.ConnectionOptions = {
        host: ep.host,
        port: ep.port,
        minVersion: "TLSv1.3",
        rejectUnauthorized: t.rejectUnauthorized !== false,
        servername: t.servername ?? (net.isIP(ep.host) === 0 ? ep.host : ""),
      };
      if (t.ca !== undefined) o.ca = t.ca;
      if (t.cert !== undefined) o.cert = t.cert;
      if (t.key !== undefined) o.key = t.key;
      const s = tls.connect(o);
      s.setNoDelay(true);
      // TLS sockets deliver decrypted records through 'data' (onread does not apply to TLSWrap).
      s.on("data", (chunk: Buffer) => {
        if (this.#sock === s) this.#feed(chunk, 0, chunk.length);
      });
      return s;
    }
    throw new Error(`unreachable: scheme ${ep.scheme}`);
  }

  #attach(sock: net.Socket): void {
    this.#sock = sock;
    this.#state = State.OPEN;
    this.#m.connects.inc();
    // Issue 23: a whole request leaves in one writev, not one per 208 KiB the peer has read.
    if (this.#ep.scheme === "unix") {
      setSocketBuffer(sock, "send", Math.min(this.#maxMessageBytes + HEADER_BYTES, UNIX_SEND_BUFFER_MAX));
    }
    sock.on("error", (e: Error) => {
      if (this.#sock === sock)
        this.#drop("TRANSPORT_CLOSED", `connection to ${this.endpoint} failed: ${e.message}`, e);
    });
    sock.on("close", () => {
      if (this.#sock === sock)
        this.#drop("TRANSPORT_CLOSED", `connection to ${this.endpoint} closed by peer`);
    });
  }

  /**
   * Buffer for the next read: mid-reply, exactly the unfilled rest of the caller's reply buffer
   * (a read never goes past the reply's end, and after a failure the socket is destroyed, so no
   * read can land there later); otherwise the reused receive buffer.
   */
  #nextBuffer(): Uint8Array {
    if (this.#req.pending && this.#pfx.got === HEADER_BYTES && this.#got < this.#pfx.len) {
      this.#direct = this.#req.replyBuf.subarray(this.#got, this.#pfx.len);
      return this.#direct;
    }
    this.#direct = null;
    return this.#recvBuf;
  }

  #onRead(nread: number, buf: Uint8Array): boolean {
    if (buf === this.#direct) {
      this.#direct = null;
      if (!this.#req.pending) return false; // unreachable: failures destroy the socket
      this.#got += nread;
      if (this.#got === this.#pfx.len) this.#complete();
      return true;
    }
    this.#feed(buf as Buffer, 0, nread);
    return true;
  }

  async request(msg: Uint8Array, replyBuf: Uint8Array, timeoutMs: number): Promise<number> {
    return replyOrThrow(await this.#send(msg, EMPTY, replyBuf, timeoutMs));
  }

  async requestParts(parts: readonly Uint8Array[], replyBuf: Uint8Array, timeoutMs: number): Promise<number> {
    return replyOrThrow(await this.#send(null, parts, replyBuf, timeoutMs));
  }

  #send(
    msg: Uint8Array | null,
    parts: readonly Uint8Array[],
    replyBuf: Uint8Array,
    timeoutMs: number,
  ): Promise<number | Failure> {
    // Runs inside the caller's async frame: errors thrown here already name the caller.
    const sock = this.#sock;
    const open = this.#state === State.OPEN && sock !== null;
    const total = this.#req.admit(msg, parts, replyBuf, timeoutMs, open, this.#closeReason);
    if (sock === null) throw new TransportError("TRANSPORT_CLOSED", `${this.endpoint}: ${this.#closeReason}`);
    this.#pfx.got = 0;
    this.#pfx.len = 0;
    this.#got = 0;
    const reply = this.#req.begin(replyBuf);
    // A still-queued previous write may reference the shared header; never overwrite it then.
    const header = sock.writableLength === 0 ? this.#header : Buffer.allocUnsafe(HEADER_BYTES);
    header.writeUInt32LE(total, 0);
    let sent = -1;
    if (msg === null && parts.length >= GATHER_MIN_PARTS && sock.writableLength === 0) {
      const g = this.#gatherFor(sock);
      if (g !== null) sent = g.write(header, parts);
      if (sent >= 0) this.#m.gatheredWrites.inc();
    }
    sock.cork();
    if (sent >= 0) {
      // Issue 23: the kernel took `sent` bytes in one writev; the rest goes as usual, in order.
      this.#writeFrom(sock, header, parts, sent);
    } else {
      sock.write(header);
      if (msg !== null) {
        if (msg.length > 0) sock.write(msg);
      } else {
        for (let i = 0; i < parts.length; i++) {
          const p = parts[i] as Uint8Array;
          if (p.length > 0) sock.write(p);
        }
      }
    }
    sock.uncork();
    this.#m.bytesOut.inc(total + HEADER_BYTES);
    return reply;
  }

  /** The gather writer of `sock` (tcp/unix with koffi), or null. */
  #gatherFor(sock: net.Socket): GatherWriter | null {
    if (this.#gatherSock !== sock) {
      this.#gatherSock = sock;
      const libc = this.#ep.scheme === "tls" ? null : nativeLibc();
      const fd = libc === null ? -1 : fdOf(sock);
      this.#gather = libc === null || fd < 0 ? null : new GatherWriter(libc, fd);
    }
    return this.#gather ?? null;
  }

  /** Writes what a gathered writev left: `header` then `parts` from byte `skip` on. */
  #writeFrom(sock: net.Socket, header: Uint8Array, parts: readonly Uint8Array[], skip: number): void {
    let left = skip;
    for (let i = -1; i < parts.length; i++) {
      const p = i < 0 ? header : (parts[i] as Uint8Array);
      if (left >= p.length) {
        left -= p.length;
        continue;
      }
      // A copy of the unsent header (the shared one may be rewritten by the next request).
      sock.write(i < 0 ? Buffer.from(p.subarray(left)) : p.subarray(left));
      left = 0;
    }
  }

  readonly #onTimeout = (): void => {
    const why =
      `no complete reply from ${this.endpoint} within ${this.#req.timeoutMs} ms` +
      (this.#pfx.got === HEADER_BYTES ? ` (${this.#got} of ${this.#pfx.len} bytes received)` : "");
    this.#fail("TRANSPORT_TIMEOUT", why, undefined, "closed after a request timed out");
  };

  #feed(buf: Buffer, off: number, end: number): void {
    if (!this.#req.pending) {
      // CONTRACT 3: one reply per request. Bytes now are a duplicate or late reply: the stream
      // position can no longer be trusted, so the connection goes.
      this.#drop(
        "TRANSPORT_CLOSED",
        `closed: ${this.endpoint} sent ${end - off} bytes with no request outstanding`,
      );
      return;
    }
    while (off < end) {
      if (this.#pfx.got < HEADER_BYTES) {
        off = this.#pfx.read(buf, off, end);
        if (this.#pfx.got < HEADER_BYTES) continue;
        // CONTRACT 3: refuse from the prefix, before buffering anything.
        if (this.#pfx.len > this.#maxMessageBytes) {
          this.#fail(
            "TRANSPORT_TOO_LARGE",
            `reply length ${this.#pfx.len} above maxMessageBytes ${this.#maxMessageBytes}`,
            undefined,
            "closed after an oversized reply",
          );
          return;
        }
        if (this.#pfx.len > this.#req.replyBuf.length) {
          this.#fail(
            "TRANSPORT_REPLY_TOO_LARGE",
            `reply of ${this.#pfx.len} bytes does not fit replyBuf of ${this.#req.replyBuf.length} bytes`,
            undefined,
            "closed after a reply larger than replyBuf",
          );
          return;
        }
      } else {
        let n = end - off;
        const want = this.#pfx.len - this.#got;
        if (n > want) n = want;
        buf.copy(this.#req.replyBuf, this.#got, off, off + n);
        this.#got += n;
        off += n;
      }
      if (this.#pfx.got === HEADER_BYTES && this.#got === this.#pfx.len) {
        this.#complete();
        if (off < end) {
          this.#drop(
            "TRANSPORT_PROTOCOL",
            `closed: ${this.endpoint} sent ${end - off} bytes after its reply`,
          );
        }
        return;
      }
    }
  }

  #complete(): void {
    const n = this.#pfx.len;
    const settle = this.#req.take();
    if (settle !== null) this.#req.reply(settle, n, n + HEADER_BYTES);
  }

  /** Rejects the outstanding request (if any) and closes the connection. */
  #fail(code: TransportErrorCode, why: string, cause: unknown, closeReason: string): void {
    const settle = this.#req.take();
    this.#closeSocket(closeReason);
    this.#req.failure(settle, code, why, cause);
  }

  /** The connection is gone (peer, error, protocol): fail what is outstanding. */
  #drop(code: TransportErrorCode, why: string, cause?: unknown): void {
    this.#fail(this.#req.pending ? "TRANSPORT_CLOSED" : code, why, cause, why);
  }

  #closeSocket(reason: string): void {
    const sock = this.#sock;
    this.#sock = null;
    this.#closeReason = reason;
    if (this.#state !== State.CONNECTING) this.#state = State.CLOSED;
    if (sock !== null) sock.destroy();
  }

  close(): void {
    if (this.#connectAbort !== null)
      this.#connectAbort("TRANSPORT_CLOSED", `connect to ${this.endpoint} interrupted by close()`);
    this.#fail(
      "TRANSPORT_CLOSED",
      `request to ${this.endpoint} interrupted by close()`,
      undefined,
      "closed by close() (call connect() again)",
    );
  }
}
