import type { Registry } from "@tapwire/stats";
import type { LinkTap } from "@tapwire/trace";
import type { ConnInfo, RpcServer, ServerOptions, ServerTlsOptions } from "@tapwire/transport";
import { listen } from "@tapwire/transport";
import type { FrameConn, WorkerCoreOptions } from "./core.js";
import { WorkerCore } from "./core.js";
import { WorkerError } from "./errors.js";
import { intOption } from "./int-option.js";
import type { WindowSnapshot } from "./window-store.js";

/** Default endpoint: loopback only (CONTRACT 11). */
export const DEFAULT_LISTEN = "tcp://127.0.0.1:7878";

/**
 * Connection limits of {@link createWorker} (CONTRACT 11 "Before HELLO", "Memory and
 * connections"); `maxBufferedBytes` defaults to 4 x the largest STEP ({@link WorkerCore.maxMessageBytes}).
 */
export const WORKER_DEFAULTS = {
  /** Largest message on a connection not bound by an OK HELLO (every HELLO, PING, STATS, RESET fits). */
  unboundMaxMessageBytes: 4096,
  /** Connections held at once, at most half of them unbound. */
  maxConnections: 64,
  /** An unbound connection with no whole message this long is closed. */
  unboundIdleMs: 10_000,
  /** `maxBufferedBytes` = this many times the largest STEP. */
  bufferedSteps: 4,
} as const;

/** Options of {@link createWorker}: those of {@link WorkerCore} plus where and how to listen. */
export interface WorkerOptions extends WorkerCoreOptions {
  /** Endpoints to listen on (tcp, unix, tls, zmq through `@tapwire/transport`); default `tcp://127.0.0.1:7878`. */
  listen?: readonly string[];
  /** TLS material for `tls://` endpoints. */
  tls?: ServerTlsOptions;
  /** Close connections idle this long (ms; 0 = never, the default). */
  idleTimeoutMs?: number;
  /**
   * Receive the tap rows of large STEPs straight into the slot windows' buffers (the transport's
   * `receiveInto` hook; tcp, unix, tls) instead of copying them there after reassembly. Default
   * true; ZeroMQ endpoints always copy. See docs/worker.md "Rows received in place".
   */
  receiveInPlace?: boolean;
  /**
   * Connections held at once, of which at most half before HELLO; a new one beyond either limit
   * closes the unbound connection idle longest (CONTRACT 11). Default 64; 0 = no limit.
   */
  maxConnections?: number;
  /**
   * Bytes buffered for all connections together: a bound connection whose next message does not
   * fit waits (backpressure), an unbound one is closed (CONTRACT 11). Default 4 x the largest
   * STEP; 0 = no budget; else at least the largest STEP.
   */
  maxBufferedBytes?: number;
  /** Close a connection that has not said HELLO and completed no message this long (ms). Default 10 000; 0 = never. */
  unboundIdleMs?: number;
  /**
   * Link capture (issue 24, docs/trace.md): every request and its reply are handed to this tap
   * (a `TraceWriter` of `@tapwire/trace`). Rows are then never received in place, so that the
   * tap sees whole frames.
   */
  frameTap?: LinkTap;
}

/** A running worker. */
export interface Worker {
  /** The bound endpoints (port 0 resolved), in the order of `listen`. */
  readonly endpoints: string[];
  /** The stats registry (worker and transport counters). */
  readonly registry: Registry;
  /** The frame handler shared by every connection. */
  readonly core: WorkerCore;
  /** The stats snapshot STATS answers (CONTRACT 10). */
  stats(): Record<string, unknown>;
  /** Test hook: a copy of a slot's generation and window. */
  debugWindow(slot: number): WindowSnapshot;
  /** Stops listening and closes every connection. */
  close(): Promise<void>;
}

/**
 * Asks the transport to close `conn` once the reply being returned is written (CONTRACT 4:
 * unreadable header). The stream transport honours a `closeAfterReply` flag on its connection
 * object; other transports get a close on the next turn of the event loop, after the reply has
 * been handed to the socket.
 */
function closeAfterReply(conn: ConnInfo): void {
  const c = conn as ConnInfo & { closeAfterReply?: unknown };
  if (typeof c.closeAfterReply === "boolean") {
    c.closeAfterReply = true;
  } else {
    setImmediate(() => conn.close());
  }
}

/**
 * The core's view of a transport connection (CONTRACT 6.2): one object per connection (over
 * ZeroMQ, per peer routing id), whose binding raises the transport's per-connection limit.
 */
function frameConnOf(conns: WeakMap<ConnInfo, FrameConn>, conn: ConnInfo): FrameConn {
  let fc = conns.get(conn);
  if (fc === undefined) {
    const t = conn as ConnInfo & { bind?: () => void; unbind?: () => void };
    fc = {
      closeAfterReply: () => closeAfterReply(conn),
      bind: () => t.bind?.(),
      unbind: () => t.unbind?.(),
    };
    conns.set(conn, fc);
  }
  return fc;
}

/**
 * Starts a worker: one {@link WorkerCore} (one session, one slot store) behind a transport
 * server per endpoint. Resolves once every endpoint is bound.
 *
 * @throws {WorkerError} `WORKER_BAD_OPTION` naming the bad option; transport errors when an
 *   endpoint cannot be bound (the others are closed again).
 */
export async function createWorker(options: WorkerOptions): Promise<Worker> {
  const core = new WorkerCore(options);
  const eps = options.listen ?? [DEFAULT_LISTEN];
  if (!Array.isArray(eps) || eps.length === 0 || eps.some((e) => typeof e !== "string")) {
    throw new WorkerError("WORKER_BAD_OPTION", "option listen must be a non-empty array of endpoint strings");
  }
  const log = options.logger ?? null;
  const tap = options.frameTap;
  if (
    tap !== undefined &&
    (tap === null || typeof tap.request !== "function" || typeof tap.reply !== "function")
  ) {
    throw new WorkerError(
      "WORKER_BAD_OPTION",
      "option frameTap must be a LinkTap (request and reply functions)",
    );
  }
  const inPlace = tap === undefined && (options.receiveInPlace ?? true);
  if (typeof inPlace !== "boolean") {
    throw new WorkerError("WORKER_BAD_OPTION", `option receiveInPlace ${String(inPlace)} is not a boolean`);
  }
  const limits = connectionLimits(options, core.maxMessageBytes);
  const conns = new WeakMap<ConnInfo, FrameConn>();
  // Compaction between STEPs: once per event-loop turn that answered a frame, after the reply
  // was written (setImmediate runs after this turn's I/O callbacks).
  let prepareQueued = false;
  const prepare = () => {
    prepareQueued = false;
    core.prepareWindows();
  };
  const plain = (req: Uint8Array, conn: ConnInfo, placed?: unknown) => {
    if (!prepareQueued) {
      prepareQueued = true;
      setImmediate(prepare);
    }
    return core.handle(req, frameConnOf(conns, conn), placed);
  };
  const handler = tap === undefined ? plain : tapped(plain, tap);
  // Inferred, not annotated: the limit hooks are of @tapwire/transport's CONTRACT 11 options.
  const serverOptions = {
    maxMessageBytes: core.maxMessageBytes,
    ...limits,
    ...(options.idleTimeoutMs !== undefined ? { idleTimeoutMs: options.idleTimeoutMs } : {}),
    ...(options.tls !== undefined ? { tls: options.tls } : {}),
    registry: core.registry,
    ...(inPlace
      ? {
          receiveInto: (head: Uint8Array, length: number, conn: ConnInfo) =>
            core.placeStep(head, length, frameConnOf(conns, conn)),
        }
      : {}),
    // CONTRACT 11: a length prefix above 4 KiB before HELLO; the transport hands over the header.
    onOversize: (head: Uint8Array, declared: number) => core.oversizeReply(head, declared),
    onTlsError: (reason: string, remote: string, error: Error) =>
      log?.warn({ reason, remote, err: error.message }, "TLS handshake refused"),
    onClose: (c: ConnInfo) => {
      const fc = conns.get(c);
      if (fc !== undefined) core.connectionClosed(fc);
    },
    onError: (err: unknown, c: ConnInfo) =>
      log?.warn({ err: String(err), conn: c.id, remote: c.remote }, "connection error"),
  };
  const servers: RpcServer[] = [];
  try {
    for (const ep of eps) servers.push(await listen(ep, handler, serverOptions satisfies ServerOptions));
  } catch (e) {
    await Promise.allSettled(servers.map((s) => s.close()));
    throw e;
  }
  // CONTRACT 12.1 "Idle sessions": a shared worker drops sessions idle for sessionIdleMs (and
  // returns their memory) even when no frame arrives.
  const sweep =
    core.maxSessions > 1
      ? setInterval(
          () => core.sweepIdle(),
          Math.max(10, Math.min(1000, Math.floor((options.sessionIdleMs ?? 60_000) / 4))),
        )
      : null;
  sweep?.unref();
  let closing: Promise<void> | null = null;
  return {
    endpoints: servers.map((s) => s.endpoint),
    registry: core.registry,
    core,
    stats: () => core.stats(),
    debugWindow: (slot: number) => core.debugWindow(slot),
    close(): Promise<void> {
      if (closing === null) {
        if (sweep !== null) clearInterval(sweep);
        closing = Promise.allSettled(servers.map((s) => s.close())).then(() => undefined);
      }
      return closing;
    },
  };
}

/** `handler` with every request and reply handed to `tap` (issue 24); the reply's aux is the handling time. */
function tapped(
  handler: (req: Uint8Array, conn: ConnInfo, placed?: unknown) => Uint8Array | Promise<Uint8Array>,
  tap: LinkTap,
): (req: Uint8Array, conn: ConnInfo, placed?: unknown) => Uint8Array | Promise<Uint8Array> {
  return (req, conn, placed) => {
    const t0 = performance.now();
    tap.request(req, req.length);
    const r = handler(req, conn, placed);
    if (r instanceof Promise) {
      return r.then((rep) => {
        tap.reply(rep, rep.length, (performance.now() - t0) * 1000);
        return rep;
      });
    }
    tap.reply(r, r.length, (performance.now() - t0) * 1000);
    return r;
  };
}

/** The transport limits of CONTRACT 11 from the options, checked and with their defaults. */
function connectionLimits(
  o: WorkerOptions,
  maxMessage: number,
): {
  unboundMaxMessageBytes: number;
  maxConnections: number;
  maxBufferedBytes: number;
  unboundIdleMs: number;
} {
  const budget = intOption(
    "maxBufferedBytes",
    o.maxBufferedBytes,
    WORKER_DEFAULTS.bufferedSteps * maxMessage,
    0,
    Number.MAX_SAFE_INTEGER,
  );
  if (budget !== 0 && budget < maxMessage) {
    throw new WorkerError(
      "WORKER_BAD_OPTION",
      `option maxBufferedBytes ${budget} is below the largest STEP (${maxMessage} bytes): no STEP could ever be read`,
    );
  }
  return {
    unboundMaxMessageBytes: Math.min(WORKER_DEFAULTS.unboundMaxMessageBytes, maxMessage),
    maxConnections: intOption("maxConnections", o.maxConnections, WORKER_DEFAULTS.maxConnections, 0, 1 << 20),
    maxBufferedBytes: budget,
    unboundIdleMs: intOption("unboundIdleMs", o.unboundIdleMs, WORKER_DEFAULTS.unboundIdleMs, 0, 2 ** 31 - 1),
  };
}
