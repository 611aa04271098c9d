import type { Socket } from "node:net";
import { connect as netConnect } from "node:net";
import { connect as tlsConnect } from "node:tls";
import { TestingError, TestingErrorCode } from "./errors.js";

/** Most connections one {@link openMany} or {@link slowloris} call may open. */
export const MAX_ATTACK_CONNECTIONS = 100_000;
/** Longest an attack helper may run, ms. */
export const MAX_ATTACK_MS = 300_000;

/** Where an attack connects: TCP host/port or a unix socket path; `tls` wraps the TCP socket. */
export type AttackTarget = { host: string; port: number; tls?: boolean } | { path: string };

/**
 * Parses a tapwire endpoint into a raw-socket target: `tcp://h:p` and `zmq+tcp://h:p` (a raw TCP
 * peer, which is what an attacker is), `tls://h:p` (TLS, certificate not checked), `unix://path`
 * and `zmq+ipc://path`.
 */
export function attackTarget(endpoint: string | AttackTarget): AttackTarget {
  if (typeof endpoint !== "string") return endpoint;
  const m = /^(tcp|zmq\+tcp|tls):\/\/(\[[^\]]+\]|[^:/]+):(\d{1,5})$/.exec(endpoint);
  if (m !== null) {
    const host = m[2]!.replace(/^\[|\]$/g, "");
    return m[1] === "tls" ? { host, port: Number(m[3]), tls: true } : { host, port: Number(m[3]) };
  }
  const u = /^(unix|zmq\+ipc):\/\/(.+)$/.exec(endpoint);
  if (u !== null) return { path: u[2]! };
  throw new TestingError(
    TestingErrorCode.BAD_OPTION,
    `endpoint ${JSON.stringify(endpoint)} is not tcp|tls|unix|zmq+tcp|zmq+ipc`,
  );
}

/**
 * A 4-byte little-endian u32 length prefix (CONTRACT 3 stream framing) announcing `bytes` of
 * message body: what a peer sends to make a stream server reserve a buffer before HELLO.
 */
export function announce(bytes: number): Buffer {
  if (!Number.isInteger(bytes) || bytes < 0 || bytes > 0xffffffff) {
    throw new TestingError(TestingErrorCode.BAD_OPTION, `announce: ${bytes} is not a u32`);
  }
  const b = Buffer.alloc(4);
  b.writeUInt32LE(bytes, 0);
  return b;
}

function dial(target: AttackTarget, connectTimeoutMs: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    let s: Socket;
    if ("path" in target) s = netConnect({ path: target.path });
    else if (target.tls === true)
      s = tlsConnect({ host: target.host, port: target.port, rejectUnauthorized: false });
    else s = netConnect({ host: target.host, port: target.port });
    const ready = "path" in target || target.tls !== true ? "connect" : "secureConnect";
    const timer = setTimeout(() => {
      s.destroy();
      reject(Object.assign(new Error("connect timeout"), { code: "ETIMEDOUT" }));
    }, connectTimeoutMs);
    s.once(ready, () => {
      clearTimeout(timer);
      s.off("error", onError);
      resolve(s);
    });
    const onError = (err: Error) => {
      clearTimeout(timer);
      s.destroy();
      reject(err);
    };
    s.once("error", onError);
  });
}

function bounded(name: string, value: number | undefined, def: number, max: number, min = 1): number {
  const v = value ?? def;
  if (!Number.isInteger(v) || v < min || v > max) {
    throw new TestingError(
      TestingErrorCode.BAD_OPTION,
      `option ${name} ${v} must be an integer in [${min}, ${max}]`,
    );
  }
  return v;
}

/** Options of {@link openMany}. */
export interface OpenManyOptions {
  /** Bytes written once on every connection right after it opens (e.g. `announce(96 << 20)`). */
  send?: Uint8Array;
  /** Connects in flight at once (default 64). */
  concurrency?: number;
  /** Per-connection connect timeout, ms (default 5000). */
  connectTimeoutMs?: number;
  /** Bound on the whole opening phase, ms (default 60000, at most {@link MAX_ATTACK_MS}). */
  timeoutMs?: number;
}

/** Connections opened by {@link openMany}; they stay open (idle) until `close()`. */
export interface Flood {
  /** Connections that opened. */
  readonly opened: number;
  /** Connections that failed to open, by error code (`ECONNREFUSED`, `ECONNRESET`, `ETIMEDOUT`, `EMFILE`, …). */
  readonly failed: Record<string, number>;
  /** Opened connections that the server has since closed or reset. */
  readonly closedByPeer: number;
  /** Opened connections still open. */
  readonly open: number;
  /** Bytes the server sent on all connections (a server may answer an error before closing). */
  readonly bytesReceived: number;
  /** The open sockets (data is read and counted, never answered). */
  readonly sockets: readonly Socket[];
  /** Resolves once `closedByPeer >= count`; rejects with `TESTING_TIMEOUT` after `timeoutMs`. */
  waitClosedByPeer(count: number, timeoutMs?: number): Promise<void>;
  /** Destroys every connection. */
  close(): Promise<void>;
}

class FloodImpl implements Flood {
  opened = 0;
  closedByPeer = 0;
  bytesReceived = 0;
  readonly failed: Record<string, number> = {};
  readonly live = new Set<Socket>();
  closing = false;
  private readonly waiters = new Set<() => void>();

  get open(): number {
    return this.live.size;
  }

  get sockets(): readonly Socket[] {
    return [...this.live];
  }

  adopt(s: Socket): void {
    this.opened++;
    this.live.add(s);
    s.on("data", (d: Buffer) => {
      this.bytesReceived += d.length;
    });
    s.on("error", () => {});
    s.once("close", () => {
      this.live.delete(s);
      if (!this.closing) {
        this.closedByPeer++;
        for (const w of [...this.waiters]) w();
      }
    });
  }

  fail(err: unknown): void {
    const code = (err as { code?: unknown }).code;
    const key = typeof code === "string" ? code : "EOTHER";
    this.failed[key] = (this.failed[key] ?? 0) + 1;
  }

  waitClosedByPeer(count: number, timeoutMs = 10_000): Promise<void> {
    if (this.closedByPeer >= count) return Promise.resolve();
    const err = new TestingError(
      TestingErrorCode.TIMEOUT,
      `fewer than ${count} connections closed by the peer within ${timeoutMs} ms`,
    );
    return new Promise((resolve, reject) => {
      const check = () => {
        if (this.closedByPeer < count) return;
        this.waiters.delete(check);
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(() => {
        this.waiters.delete(check);
        err.message += ` (closed ${this.closedByPeer}, open ${this.open})`;
        reject(err);
      }, timeoutMs);
      this.waiters.add(check);
    });
  }

  async close(): Promise<void> {
    this.closing = true;
    const all = [...this.live];
    await Promise.all(
      all.map(
        (s) =>
          new Promise<void>((r) => {
            if (s.destroyed && s.closed) r();
            else {
              s.once("close", () => r());
              s.destroy();
            }
          }),
      ),
    );
    this.live.clear();
  }
}

/**
 * Opens `n` connections to `endpoint` (`concurrency` at a time) and keeps them open: an idle
 * flood, or, with `send`, a flood of partial messages (e.g. `announce(96 << 20)`: a length prefix
 * announcing 96 MiB that never comes). Failures are counted by code, not thrown, so a server that
 * refuses past its connection cap shows as `failed.ECONNRESET` or `closedByPeer`. Bounded:
 * `n <= MAX_ATTACK_CONNECTIONS`, the opening phase ends after `timeoutMs` (the rest count as
 * `ETIMEDOUT`). The caller's own descriptor limit applies (`ulimit -n`).
 */
export async function openMany(
  endpoint: string | AttackTarget,
  n: number,
  opts: OpenManyOptions = {},
): Promise<Flood> {
  const target = attackTarget(endpoint);
  bounded("n", n, 0, MAX_ATTACK_CONNECTIONS, 0);
  const concurrency = bounded("concurrency", opts.concurrency, 64, 4096);
  const connectTimeoutMs = bounded("connectTimeoutMs", opts.connectTimeoutMs, 5000, MAX_ATTACK_MS);
  const timeoutMs = bounded("timeoutMs", opts.timeoutMs, 60_000, MAX_ATTACK_MS);
  const flood = new FloodImpl();
  const deadline = Date.now() + timeoutMs;
  let next = 0;
  const lane = async () => {
    while (next < n) {
      next++;
      const left = deadline - Date.now();
      if (left <= 0) {
        flood.fail({ code: "ETIMEDOUT" });
        continue;
      }
      try {
        const s = await dial(target, Math.min(connectTimeoutMs, left));
        flood.adopt(s);
        if (opts.send !== undefined && opts.send.length > 0) s.write(opts.send);
      } catch (err) {
        flood.fail(err);
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, n) }, lane));
  return flood;
}

/** Options of {@link slowloris}. */
export interface SlowlorisOptions {
  /** Connections (default 50). */
  connections?: number;
  /**
   * Bytes dripped on each connection, in order, `bytesPerTick` per tick; zeros follow when they
   * run out. Default `announce(1 << 20)`: a length prefix whose body never finishes.
   */
  payload?: Uint8Array;
  /** Bytes per connection per tick (default 1). */
  bytesPerTick?: number;
  /** Tick period, ms (default 200). */
  intervalMs?: number;
  /** How long to keep dripping, ms (required, at most {@link MAX_ATTACK_MS}). */
  durationMs: number;
  /** Passed to {@link openMany}. */
  connectTimeoutMs?: number;
}

/** What {@link slowloris} saw. */
export interface SlowlorisResult {
  /** Connections that opened. */
  opened: number;
  /** Connections that failed to open, by error code. */
  failed: Record<string, number>;
  /** Bytes written over all connections. */
  bytesSent: number;
  /** Connections the server closed before the end. */
  closedByPeer: number;
  /** ms from the first drip to each close by the server, ascending. */
  closeAfterMs: number[];
  /** Connections still open at the end (then closed by the helper). */
  stillOpen: number;
}

/**
 * Opens `connections` connections and drips `payload` on each, `bytesPerTick` every `intervalMs`,
 * for `durationMs` or until the server has closed them all; then closes the rest. A server with a
 * header deadline closes them (`closedByPeer`, `closeAfterMs`); one that resets its idle timer on
 * every byte keeps them (`stillOpen`).
 */
export async function slowloris(
  endpoint: string | AttackTarget,
  opts: SlowlorisOptions,
): Promise<SlowlorisResult> {
  const connections = bounded("connections", opts.connections, 50, MAX_ATTACK_CONNECTIONS);
  const durationMs = bounded("durationMs", opts.durationMs, 0, MAX_ATTACK_MS);
  const intervalMs = bounded("intervalMs", opts.intervalMs, 200, MAX_ATTACK_MS);
  const perTick = bounded("bytesPerTick", opts.bytesPerTick, 1, 1 << 20);
  const payload = opts.payload ?? announce(1 << 20);
  const flood = (await openMany(endpoint, connections, {
    ...(opts.connectTimeoutMs === undefined ? {} : { connectTimeoutMs: opts.connectTimeoutMs }),
  })) as FloodImpl;
  const start = Date.now();
  const closeAfterMs: number[] = [];
  const offset = new Map<Socket, number>();
  for (const s of flood.live) {
    offset.set(s, 0);
    s.once("close", () => {
      if (!flood.closing) closeAfterMs.push(Date.now() - start);
    });
  }
  const src = Buffer.from(payload.buffer, payload.byteOffset, payload.length);
  let bytesSent = 0;
  await new Promise<void>((resolve) => {
    const tick = () => {
      const now = Date.now();
      if (flood.open === 0 || now - start >= durationMs) {
        clearInterval(timer);
        resolve();
        return;
      }
      for (const s of flood.live) {
        const at = offset.get(s) ?? 0;
        const chunk = Buffer.alloc(perTick);
        if (at < src.length) src.copy(chunk, 0, at, Math.min(src.length, at + perTick));
        offset.set(s, at + perTick);
        if (!s.destroyed && s.writable) {
          s.write(chunk);
          bytesSent += perTick;
        }
      }
    };
    const timer = setInterval(tick, intervalMs);
    tick();
  });
  const stillOpen = flood.open;
  const result: SlowlorisResult = {
    opened: flood.opened,
    failed: { ...flood.failed },
    bytesSent,
    closedByPeer: flood.closedByPeer,
    closeAfterMs,
    stillOpen,
  };
  await flood.close();
  return result;
}
