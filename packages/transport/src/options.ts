import type { ConnectionOptions, SecureContextOptions } from "node:tls";
import type { Registry } from "@tapwire/stats";
import type { ShmArena } from "./shm.js";

/** Default `maxMessageBytes`: 64 MiB (CONTRACT 3). */
export const DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
/** Default connect timeout used when `connect()` is called without one. */
export const DEFAULT_CONNECT_TIMEOUT_MS = 5_000;
/** Default time `RpcServer.close()` waits for in-flight handlers before destroying connections. */
export const DEFAULT_CLOSE_TIMEOUT_MS = 5_000;
/** Largest value a u32 length prefix can hold. */
export const MAX_U32 = 0xffff_ffff;
/** Longest timer Node supports: timers overflow (and fire immediately) above 2^31-1 ms. */
export const MAX_TIMER_MS = 0x7fff_ffff;

/** TLS material for clients (PEM strings or buffers). */
export interface ClientTlsOptions {
  /** Trusted CA certificate(s); default: Node's root store. */
  ca?: SecureContextOptions["ca"];
  /** Client certificate, for servers that request one. */
  cert?: SecureContextOptions["cert"];
  /** Key of `cert`. */
  key?: SecureContextOptions["key"];
  /** SNI / certificate host name; default the endpoint host. */
  servername?: ConnectionOptions["servername"];
  /** Verify the server certificate (default true). Turning this off is for tests only. */
  rejectUnauthorized?: boolean;
}

/** Options of {@link makeClient}. */
export interface ClientOptions {
  /** Largest reply accepted, checked from the length prefix before reading it. Default 64 MiB. */
  maxMessageBytes?: number;
  /** TLS material for `tls://` endpoints. */
  tls?: ClientTlsOptions;
  /** Timeout used by `connect()` when called without one. Default 5000 ms. */
  connectTimeoutMs?: number;
  /** Where to count requests, bytes, errors (`transport_client_*`). Default: a private registry. */
  registry?: Registry;
  /**
   * `shm+unix://` only (issue 23): bytes of each of a session's two shared areas (the stage area
   * a caller may write requests into, and the copy area for other large parts), so a session maps
   * twice this in `shmDir`. A multiple of 4096 in [64 KiB, 1 GiB]. Default 8 MiB.
   */
  shmBytes?: number;
  /**
   * `shm+unix://` only: shared memory that outlives the client's connections (see
   * {@link ShmArena}); its size replaces `shmBytes`. Requests written into `shmArena.bytes` leave
   * by offset. Default: the client maps its own.
   */
  shmArena?: ShmArena;
  /** `shm+unix://` only: where session files are created; the server must look in the same place. Default `/dev/shm`. */
  shmDir?: string;
  /**
   * `shm+unix://` only: called when a connection cannot use shared memory (no `koffi`, mmap
   * refused, `shmDir` too small: a `TRANSPORT_SHM_SPACE` error naming the size needed and the
   * size available, the server refused the mapping); the connection then sends every byte on the
   * socket. Default: one process warning.
   */
  onShmFallback?(err: Error & { readonly code: string }): void;
}

/** TLS material for servers (PEM strings or buffers). */
export interface ServerTlsOptions {
  /** Server certificate chain. */
  cert: SecureContextOptions["cert"];
  /** Key of `cert`. */
  key: SecureContextOptions["key"];
  /** CA(s) that sign acceptable client certificates. */
  ca?: SecureContextOptions["ca"];
  /** Ask clients for a certificate (default false). */
  requestCert?: boolean;
  /** With `requestCert`, refuse clients without a valid certificate (default true). */
  rejectUnauthorized?: boolean;
}

/** Options of {@link listen}. */
export interface ServerOptions {
  /** Largest request accepted, checked from the length prefix before buffering; also caps replies. Default 64 MiB. */
  maxMessageBytes?: number;
  /** Close a connection idle (no request in flight) for this long. 0 = never (default). */
  idleTimeoutMs?: number;
  /** TLS material, required for `tls://`. */
  tls?: ServerTlsOptions;
  /** Where to count connections, requests, bytes, errors (`transport_server_*`). Default: a private registry. */
  registry?: Registry;
  /** Called once per accepted connection (for ZeroMQ: per new peer routing id). */
  onConnection?(c: ConnInfo): void;
  /** Called once when a connection closes. */
  onClose?(c: ConnInfo): void;
  /** Called when a handler throws/rejects or returns an invalid reply (the connection is then closed). */
  onError?(err: unknown, c: ConnInfo): void;
  /** How long `close()` lets in-flight handlers finish before destroying connections. Default 5000 ms. */
  closeTimeoutMs?: number;
  /**
   * Receive placement (tcp, unix, tls; ignored by ZeroMQ, which delivers whole messages): lets the
   * handler choose where the rest of a large request lands, so that it needs no copy afterwards.
   * See {@link ReceiveInto}. Default: none (every request is reassembled by the transport).
   */
  receiveInto?: ReceiveInto;
  /**
   * Largest message accepted on a connection that is not bound ({@link ConnInfo.bind}), checked
   * from the length prefix like `maxMessageBytes` (CONTRACT 11 "Before HELLO"). An integer in
   * `[0, maxMessageBytes]`. Default `maxMessageBytes`: no lower limit (a server that never calls
   * `bind()` behaves as before). The worker passes 4096.
   */
  unboundMaxMessageBytes?: number;
  /**
   * Called when a length prefix on an unbound connection is above its limit
   * (`unboundMaxMessageBytes`): the transport reads only the first `min(24, declaredLength)` body
   * bytes (a CONTRACT 4 frame header), calls the hook with them, writes the returned reply
   * (length-prefixed; ZeroMQ: one message) when it is not null, then closes the connection. When
   * those bytes do not arrive within {@link OVERSIZE_HEAD_WAIT_MS} (or the unbound idle timeout,
   * when shorter) the connection is just closed. Without the hook, or on a bound connection, an
   * oversize prefix just closes the connection. Counted in `transport_server_too_large` either
   * way, replies in `transport_server_oversize_replies`. A hook that throws is reported to
   * `onError` and the connection closed. `head` is valid during the call only.
   */
  onOversize?: OnOversize;
  /**
   * Budget of received bytes buffered for all connections together (reassembly buffers, kept
   * ones included; ZeroMQ: messages received and not yet answered). A bound connection whose next
   * message does not fit is not read until it does (backpressure); an unbound one is closed
   * (`transport_server_budget_refused`). Must be `>= maxMessageBytes` so that one message always
   * fits an idle server. 0 = no budget (default); the worker passes 4 x its largest STEP.
   * Not counted: each tcp/unix connection's fixed 64 KiB read buffer (bounded by
   * `maxConnections`), and what libzmq buffers itself.
   */
  maxBufferedBytes?: number;
  /**
   * Most connections held at once (ZeroMQ: peers with state), of which at most
   * `max(1, floor(maxConnections / 2))` unbound. A new connection that would pass either limit
   * closes the unbound connection idle longest (`transport_server_connections_evicted`); with
   * none to close the new one is refused (`transport_server_connections_refused`). TLS
   * connections count from their TCP accept (handshakes included). 0 = no limit (default).
   * ZeroMQ only: a ROUTER never hears that a peer went away, so with no unbound peer to close
   * the bound peer whose last whole message is oldest (and that has no request in progress) is
   * forgotten instead of refusing (`transport_server_bound_evicted`; its `onClose` runs and its
   * `bound` turns false). A live peer forgotten so loses only its binding: its next message
   * makes a new, unbound peer (the worker answers its STEP NO_SESSION, and it says HELLO again).
   */
  maxConnections?: number;
  /**
   * Close an unbound connection that has completed no whole message for this long (a
   * connection's accept counts as its first); counted in `transport_server_unbound_idle_closed`.
   * It also bounds the TLS handshake time. 0 = off (default, so servers that never bind are
   * unaffected); the worker passes 10000. Independent of `idleTimeoutMs`.
   */
  unboundIdleMs?: number;
  /**
   * A TLS handshake refused by this server (bad or missing client certificate with
   * `requestCert`, protocol error, timeout): `reason` is one of {@link TlsFailureReason}, `remote`
   * the peer address, `error` Node's error. Counted in `transport_server_tls_failures` and
   * `transport_server_tls_failures_<reason>`.
   */
  onTlsError?(reason: TlsFailureReason, remote: string, error: Error): void;
  /** `shm+unix://` only (issue 23): where the clients' session files are looked up. Default `/dev/shm`. */
  shmDir?: string;
}

/** How long an unbound connection with an oversize prefix has to send its 24-byte frame header. */
export const OVERSIZE_HEAD_WAIT_MS = 1_000;

/**
 * {@link ServerOptions.onOversize}: `head` is the first `min(24, declaredLength)` bytes of the
 * refused message, `declaredLength` its length prefix. Returns the reply to write before closing,
 * or null to just close.
 */
export type OnOversize = (head: Uint8Array, declaredLength: number, conn: ConnInfo) => Uint8Array | null;

/** Why a TLS handshake was refused ({@link ServerOptions.onTlsError}), also the counter suffix. */
export const TlsFailureReason = {
  /** `requestCert` with `rejectUnauthorized`: the client sent no certificate. */
  NO_CERTIFICATE: "no_certificate",
  /** The client certificate did not verify against `tls.ca` (unknown CA, expired, bad usage). */
  BAD_CERTIFICATE: "bad_certificate",
  /** Not TLS 1.3, not TLS at all, or another protocol failure. */
  PROTOCOL: "protocol",
  /** The handshake did not finish in time (`unboundIdleMs`, else Node's 120 s). */
  TIMEOUT: "timeout",
  /** The peer reset or closed the connection during the handshake, or anything else. */
  OTHER: "other",
} as const;

/** Union of the {@link TlsFailureReason} strings. */
export type TlsFailureReason = (typeof TlsFailureReason)[keyof typeof TlsFailureReason];

/**
 * Where the rest of a request goes, as returned by a {@link ReceiveInto} hook: bytes
 * `[0, headBytes)` of the message stay in the transport's reassembly buffer (the handler gets
 * them as `req`), bytes `[headBytes, length)` are written into `segments`, in order, each filled
 * before the next. On tcp/unix sockets read with `onread` the kernel writes straight into the
 * segments; bytes that arrived in the read that completed the head, and every byte on tls or the
 * 'data' events fallback, are copied into them.
 *
 * The segments must not overlap each other and must stay writable until the handler has been
 * called with this plan or the connection has closed (a connection that closes mid-message
 * leaves them partly written, and the handler is never called). The transport keeps no
 * reference to the plan after that.
 */
export interface ReceivePlan {
  /** Bytes of the head kept as `req`: an integer in `[0, head.length]` of the hook's call. */
  readonly headBytes: number;
  /** Destinations of the rest; their lengths MUST sum to `length - headBytes`. */
  readonly segments: readonly Uint8Array[];
}

/**
 * A receive-placement hook ({@link ServerOptions.receiveInto}). It is consulted for a request
 * that did not arrive whole in the read that carried its start, once per read while it returns a
 * number: `head` is a view of the message's first bytes received so far (at least one; valid only
 * during the call), `length` the message length from the prefix (already checked against
 * `maxMessageBytes`). It returns:
 *
 * - `null`: reassemble the message as usual (the hook is not called again for it);
 * - a number `n > head.length`: call again once `n` bytes of the message are in (when `n >=
 *   length`, the message simply completes as usual);
 * - a {@link ReceivePlan}: the rest of the message goes into its segments, then the handler is
 *   called with `req` = the first `headBytes` bytes and the plan itself as third argument.
 *
 * A hook that throws, returns anything else, a number `<= head.length`, or a plan that does not
 * add up (`headBytes` not an integer in `[0, head.length]`, a segment that is not a Uint8Array,
 * lengths not summing to `length - headBytes`) closes that connection: counted in
 * `transport_server_errors` and reported to `onError` with a `TRANSPORT_BAD_OPTION` error (or
 * the hook's own), exactly like a handler that throws.
 */
export type ReceiveInto = (head: Uint8Array, length: number, conn: ConnInfo) => ReceivePlan | number | null;

/** The connection a request arrived on. */
export interface ConnInfo {
  /** Server-unique connection number, from 1. */
  readonly id: number;
  /** Peer address: `ip:port`, `unix`, or `zmq:<routing id hex>`. */
  readonly remote: string;
  /** Closes this connection (after nothing: any reply in progress is dropped). */
  close(): void;
  /**
   * True once {@link ConnInfo.bind} was called (and not undone by `unbind()`): the connection
   * then accepts messages up to `maxMessageBytes` and is exempt from the unbound limits
   * (CONTRACT 6.2, 11). Every connection starts unbound.
   */
  readonly bound: boolean;
  /**
   * Binds this connection (the worker: after an OK HELLO, CONTRACT 6.2): its limit becomes
   * `maxMessageBytes`, its unbound idle timer stops, it no longer counts as unbound for
   * `maxConnections`. Idempotent.
   */
  bind(): void;
  /**
   * Undoes {@link ConnInfo.bind} (the worker: its session was replaced): the limit is
   * `unboundMaxMessageBytes` again from the next message on, the unbound idle timer restarts.
   * Idempotent.
   */
  unbind(): void;
}

/** A reply: one buffer, or parts sent back to back without copying, or `null` to close the connection. */
export type Reply = Uint8Array | readonly Uint8Array[] | null;

/**
 * Request handler. `req` is a view that stays valid until the handler returns or its promise
 * settles; copy what must outlive that. Requests of one connection are handled one at a time, in
 * order. Throwing (or rejecting) closes that connection and is counted; the server keeps running.
 *
 * `placed` is given only for a request whose rest a {@link ServerOptions.receiveInto} hook
 * placed: it is the very plan object the hook returned, `req` is then only the message's first
 * `placed.headBytes` bytes and the other bytes are in `placed.segments`. Without a hook it is
 * always undefined, so handlers that ignore it are unaffected.
 */
export type Handler = (req: Uint8Array, conn: ConnInfo, placed?: ReceivePlan) => Reply | Promise<Reply>;

/** A request/response client over one connection (CONTRACT 3). */
export interface RpcClient {
  /** The endpoint string given to {@link makeClient}. */
  readonly endpoint: string;
  /** Where this client counts (`transport_client_*`): `options.registry` or its own. */
  readonly registry: Registry;
  /** True between a successful `connect()` and the connection closing for any reason. */
  readonly connected: boolean;
  /**
   * Opens the connection (no-op when connected; the same promise while connecting).
   * @throws {TransportError} `TRANSPORT_CONNECT` (refused, TLS refused, timed out), `TRANSPORT_CLOSED` if `close()` interrupts it.
   */
  connect(timeoutMs?: number): Promise<void>;
  /**
   * Sends `msg` and writes the reply into `replyBuf`, resolving to the reply length.
   * @throws {TransportError} `TRANSPORT_TIMEOUT`, `TRANSPORT_CLOSED`, `TRANSPORT_BUSY`,
   *   `TRANSPORT_TOO_LARGE`, `TRANSPORT_REPLY_TOO_LARGE`, `TRANSPORT_PROTOCOL`. All but `BUSY`
   *   (and `TOO_LARGE` for an oversized request, refused before sending) close the connection.
   */
  request(msg: Uint8Array, replyBuf: Uint8Array, timeoutMs: number): Promise<number>;
  /** Like {@link RpcClient.request}, sending the concatenation of `parts` without copying them (scatter/gather). */
  requestParts(parts: readonly Uint8Array[], replyBuf: Uint8Array, timeoutMs: number): Promise<number>;
  /** Closes the connection; an outstanding request rejects with `TRANSPORT_CLOSED`. `connect()` may be called again. */
  close(): void;
}

/** A listening server. */
export interface RpcServer {
  /** The bound endpoint, with port 0 resolved to the real port. */
  readonly endpoint: string;
  /** Where this server counts (`transport_server_*`): `options.registry` or its own. */
  readonly registry: Registry;
  /** Number of open connections (ZeroMQ: known peers). */
  readonly connections: number;
  /** Stops accepting, lets in-flight handlers finish (up to `closeTimeoutMs`), then closes every connection. */
  close(): Promise<void>;
}
