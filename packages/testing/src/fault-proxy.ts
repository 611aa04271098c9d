import type { AddressInfo, Server, Socket } from "node:net";
import { connect, createServer } from "node:net";
import { TestingError, TestingErrorCode } from "./errors.js";
import type { LinkSpec } from "./link-spec.js";

/**
 * Direction of a byte stream through the proxy: `up` is client → target, `down` is target →
 * client. `both` (the default of every fault) applies a fault to each direction independently.
 */
export type FaultDirection = "up" | "down" | "both";

/**
 * A fault the proxy injects, switchable at runtime with {@link FaultProxy.setFault}.
 *
 * - `latency`: every chunk is forwarded `ms` later (order kept).
 * - `stall`: nothing is forwarded; bytes are held (in order) until the fault is cleared or changed.
 * - `drop_after`: once `bytes` bytes of a direction's stream have been forwarded on a connection,
 *   that connection is destroyed (both sockets). Counted from the start of each connection.
 * - `corrupt`: the byte at absolute `offset` of a direction's stream (per connection) is XORed with
 *   `mask` (default 0xff) as it passes. Each connection is corrupted at most once per direction.
 * - `refuse`: new connections are accepted and reset at once; existing connections keep working.
 *
 * With `relative: true`, `bytes`/`offset` count from where each open connection's stream was when
 * the fault was set (new connections: from their start), e.g. "corrupt byte 12 of the next reply".
 */
export type Fault =
  | { kind: "latency"; ms: number; direction?: FaultDirection }
  | { kind: "stall"; direction?: FaultDirection }
  | { kind: "drop_after"; bytes: number; direction?: FaultDirection; relative?: boolean }
  | { kind: "corrupt"; offset: number; direction?: FaultDirection; mask?: number; relative?: boolean }
  | { kind: "refuse" };

/** Where the proxy forwards to: a TCP host/port or a unix socket path. */
export type ProxyTarget = { host: string; port: number } | { path: string };

/**
 * The part of a {@link LinkSpec} a proxy applies to every chunk, in both directions, on top of
 * any {@link Fault}: one-way delay, jitter, stalls (rates are the kernel's: tbf on the veths).
 */
export type LinkImpairment = Pick<LinkSpec, "delayMs" | "jitterMs" | "stallProbability" | "stallMs" | "seed">;

/** Options of {@link startFaultProxy}. */
export interface FaultProxyOptions {
  /** Fault active from the start (default none). */
  fault?: Fault | null;
  /** Listen port (default 0: any free port). */
  port?: number;
  /**
   * Listen address (default `127.0.0.1`). Anything else is for a relay inside a network namespace
   * a test created ({@link startRelay}): only such addresses are ever targets.
   */
  host?: string;
  /** Source address of the connections to the target (default: the kernel's choice). */
  localAddress?: string;
  /** Delay, jitter and stalls applied to every chunk (default none). */
  impairment?: LinkImpairment | null;
}

/** Counters of a {@link FaultProxy}. */
export interface FaultProxyStats {
  /** Connections accepted (refused ones included). */
  connections: number;
  /** Connections open now. */
  active: number;
  /** Bytes forwarded client → target. */
  bytesUp: number;
  /** Bytes forwarded target → client. */
  bytesDown: number;
  /** Faults applied, per kind: delayed chunks, held chunks, dropped connections, flipped bytes, refused connections. */
  faults: { latency: number; stall: number; drop_after: number; corrupt: number; refuse: number };
  /** Link impairment applied: chunks delayed by `delay`/`jitter`, stalls started. */
  link: { delayed: number; stalls: number };
}

/** A running fault-injecting TCP proxy. */
export interface FaultProxy {
  /** The port the proxy listens on. */
  readonly port: number;
  /** The address the proxy listens on (`127.0.0.1` unless `host` was given). */
  readonly host: string;
  /** `tcp://<host>:<port>`. */
  readonly endpoint: string;
  /** The active fault, or null. */
  readonly fault: Fault | null;
  /** Live counters. */
  readonly stats: FaultProxyStats;
  /** Replaces the active fault (null clears it); held bytes are released when a stall is cleared. */
  setFault(f: Fault | null): void;
  /** Destroys every open connection (both sockets). */
  dropAll(): void;
  /** Stops listening, destroys every connection and clears every timer. */
  close(): Promise<void>;
}

const DROP = Symbol("drop");
const END = Symbol("end");
type QueueItem = { buf: Buffer; due: number } | typeof DROP | typeof END;

function appliesTo(f: Fault | null, dir: "up" | "down"): boolean {
  if (f === null || f.kind === "refuse") return false;
  const d = f.direction ?? "both";
  return d === "both" || d === dir;
}

function checkFault(f: Fault | null): void {
  if (f === null) return;
  const bad = (why: string) =>
    new TestingError(TestingErrorCode.BAD_OPTION, `fault ${JSON.stringify(f)}: ${why}`);
  if (typeof f !== "object") throw bad("not an object");
  if ("direction" in f && f.direction !== undefined && !["up", "down", "both"].includes(f.direction)) {
    throw bad("direction must be up, down or both");
  }
  switch (f.kind) {
    case "latency":
      if (!(Number.isFinite(f.ms) && f.ms >= 0)) throw bad("ms must be a finite number >= 0");
      return;
    case "stall":
    case "refuse":
      return;
    case "drop_after":
      if (!(Number.isSafeInteger(f.bytes) && f.bytes >= 0)) throw bad("bytes must be an integer >= 0");
      return;
    case "corrupt":
      if (!(Number.isSafeInteger(f.offset) && f.offset >= 0)) throw bad("offset must be an integer >= 0");
      if (f.mask !== undefined && !(Number.isInteger(f.mask) && f.mask >= 1 && f.mask <= 255)) {
        throw bad("mask must be an integer in [1, 255]");
      }
      return;
    default:
      throw bad("unknown kind");
  }
}

/** One direction of one proxied connection. */
class Pipe {
  /** Bytes of this direction's stream seen so far (absolute offset of the next chunk). */
  offset = 0;
  /** `offset` when the current fault was set (0 for connections opened after): origin of `relative`. */
  base = 0;
  private readonly queue: QueueItem[] = [];
  private lastDue = 0;
  private timer: NodeJS.Timeout | null = null;
  private immediate: NodeJS.Immediate | null = null;
  private dropping = false;
  private waitingDrain = false;

  constructor(
    private readonly proxy: FaultProxyImpl,
    private readonly conn: Conn,
    readonly dir: "up" | "down",
    private readonly src: Socket,
    private readonly dst: Socket,
  ) {
    src.on("data", (chunk: Buffer) => this.ingress(chunk));
    src.on("end", () => {
      this.queue.push(END);
      this.pump();
    });
    dst.on("drain", () => {
      this.waitingDrain = false;
      if (!this.conn.closed) src.resume();
      this.pump();
    });
  }

  private ingress(chunk: Buffer): void {
    if (this.dropping || this.conn.closed) return;
    const f = this.proxy.fault;
    const start = this.offset;
    this.offset += chunk.length;
    if (f !== null && appliesTo(f, this.dir)) {
      const origin = (f.kind === "corrupt" || f.kind === "drop_after") && f.relative === true ? this.base : 0;
      if (f.kind === "corrupt" && origin + f.offset >= start && origin + f.offset < this.offset) {
        // 'data' chunks are fresh buffers owned by us, so flipping in place is safe.
        chunk[origin + f.offset - start]! ^= f.mask ?? 0xff;
        this.proxy.stats.faults.corrupt++;
      }
      if (f.kind === "drop_after" && this.offset >= origin + f.bytes) {
        if (origin + f.bytes > start) this.enqueue(chunk.subarray(0, origin + f.bytes - start), f);
        this.dropping = true;
        this.queue.push(DROP);
        this.pump();
        return;
      }
    }
    if (f !== null && f.kind === "stall" && appliesTo(f, this.dir)) this.proxy.stats.faults.stall++;
    this.enqueue(chunk, f);
    this.pump();
  }

  private enqueue(buf: Buffer, f: Fault | null): void {
    let due = 0;
    let extra = this.proxy.linkDelay();
    if (f !== null && f.kind === "latency" && appliesTo(f, this.dir)) {
      extra += f.ms;
      this.proxy.stats.faults.latency++;
    }
    if (extra > 0) {
      // Never before an earlier chunk: latency and jitter must not reorder the stream.
      due = Math.max(performance.now() + extra, this.lastDue);
      this.lastDue = due;
    }
    this.queue.push({ buf, due });
  }

  /** Forwards queued items that are due, unless stalled; re-arms one timer for the next due item. */
  pump(): void {
    if (this.timer !== null) {
      clearTimeout(this.timer);
      this.timer = null;
    }
    if (this.immediate !== null) {
      clearImmediate(this.immediate);
      this.immediate = null;
    }
    const f = this.proxy.fault;
    while (this.queue.length > 0 && !this.conn.closed) {
      if (f !== null && f.kind === "stall" && appliesTo(f, this.dir)) return;
      if (this.waitingDrain) return;
      const head = this.queue[0]!;
      if (head === DROP) {
        this.queue.length = 0;
        this.proxy.stats.faults.drop_after++;
        this.conn.drop(this.dst);
        return;
      }
      if (head === END) {
        this.queue.shift();
        this.dst.end();
        continue;
      }
      const wait = head.due - performance.now();
      if (wait > 0) {
        // Timers have a 1 ms granularity: whole milliseconds on a timer, the rest polled on the
        // event loop, so a 0.25 ms link delay is 0.25 ms and not 1 ms (never earlier than due).
        if (wait >= 1) {
          this.timer = setTimeout(() => {
            this.timer = null;
            this.pump();
          }, Math.floor(wait));
        } else {
          this.immediate = setImmediate(() => {
            this.immediate = null;
            this.pump();
          });
        }
        return;
      }
      this.queue.shift();
      if (this.dir === "up") this.proxy.stats.bytesUp += head.buf.length;
      else this.proxy.stats.bytesDown += head.buf.length;
      if (!this.dst.write(head.buf)) {
        this.waitingDrain = true;
        this.src.pause();
      }
    }
  }

  /** Counts chunks held by a stall (called when a stall starts). */
  held(): number {
    return this.queue.length;
  }

  stop(): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    if (this.immediate !== null) clearImmediate(this.immediate);
    this.immediate = null;
    this.queue.length = 0;
  }
}

class Conn {
  closed = false;
  readonly up: Pipe;
  readonly down: Pipe;

  constructor(
    private readonly proxy: FaultProxyImpl,
    readonly client: Socket,
    readonly target: Socket,
  ) {
    this.up = new Pipe(proxy, this, "up", client, target);
    this.down = new Pipe(proxy, this, "down", target, client);
    const onGone = () => this.destroy();
    client.on("close", onGone);
    target.on("close", onGone);
    // Errors (ECONNRESET, ECONNREFUSED on the target) end the connection; they are not test failures.
    client.on("error", onGone);
    target.on("error", onGone);
  }

  /**
   * Ends the connection at a drop point: the bytes already written to `dst` still reach its peer
   * (end, then destroy), the other socket is destroyed at once.
   */
  drop(dst: Socket): void {
    if (this.closed) return;
    this.closed = true;
    this.up.stop();
    this.down.stop();
    (dst === this.client ? this.target : this.client).destroy();
    this.proxy.draining.add(dst);
    dst.once("close", () => this.proxy.draining.delete(dst));
    dst.end(() => dst.destroy());
    this.proxy.forget(this);
  }

  destroy(): void {
    if (this.closed) return;
    this.closed = true;
    this.up.stop();
    this.down.stop();
    this.client.destroy();
    this.target.destroy();
    this.proxy.forget(this);
  }
}

class FaultProxyImpl implements FaultProxy {
  port = 0;
  fault: Fault | null;
  readonly stats: FaultProxyStats = {
    connections: 0,
    active: 0,
    bytesUp: 0,
    bytesDown: 0,
    faults: { latency: 0, stall: 0, drop_after: 0, corrupt: 0, refuse: 0 },
    link: { delayed: 0, stalls: 0 },
  };
  host = "127.0.0.1";
  private rng: () => number;
  private readonly conns = new Set<Conn>();
  /** Sockets flushing the bytes before a drop point (see Conn.drop). */
  readonly draining = new Set<Socket>();
  readonly server: Server;
  private closing: Promise<void> | null = null;

  constructor(
    private readonly target: ProxyTarget,
    fault: Fault | null,
    private readonly link: LinkImpairment | null,
    private readonly localAddress: string | undefined,
  ) {
    this.fault = fault;
    this.rng = mulberry32(link?.seed ?? 1);
    this.server = createServer({ allowHalfOpen: true, noDelay: true }, (client) => this.accept(client));
  }

  get endpoint(): string {
    return `tcp://${this.host.includes(":") ? `[${this.host}]` : this.host}:${this.port}`;
  }

  /** This chunk's link delay, ms: `delay ± jitter`, plus a stall with its probability. */
  linkDelay(): number {
    const l = this.link;
    if (l === null) return 0;
    let d = l.delayMs;
    if (l.jitterMs > 0) d += l.jitterMs * (2 * this.rng() - 1);
    if (l.stallProbability > 0 && this.rng() < l.stallProbability) {
      d += l.stallMs;
      this.stats.link.stalls++;
    }
    if (d > 0) this.stats.link.delayed++;
    return d;
  }

  private accept(client: Socket): void {
    this.stats.connections++;
    if (this.closing !== null) {
      client.destroy();
      return;
    }
    if (this.fault !== null && this.fault.kind === "refuse") {
      this.stats.faults.refuse++;
      client.on("error", () => {});
      client.resetAndDestroy();
      return;
    }
    const target =
      "path" in this.target
        ? connect({ path: this.target.path, allowHalfOpen: true })
        : connect({
            host: this.target.host,
            port: this.target.port,
            allowHalfOpen: true,
            noDelay: true,
            ...(this.localAddress === undefined ? {} : { localAddress: this.localAddress }),
          });
    client.setNoDelay(true);
    this.stats.active++;
    this.conns.add(new Conn(this, client, target));
  }

  forget(c: Conn): void {
    if (this.conns.delete(c)) this.stats.active--;
  }

  setFault(f: Fault | null): void {
    checkFault(f);
    this.fault = f;
    for (const c of this.conns) {
      for (const p of [c.up, c.down]) {
        p.base = p.offset;
        if (f !== null && f.kind === "stall" && appliesTo(f, p.dir)) this.stats.faults.stall += p.held();
        p.pump();
      }
    }
  }

  dropAll(): void {
    for (const c of [...this.conns]) c.destroy();
    for (const s of this.draining) s.destroy();
    this.draining.clear();
  }

  close(): Promise<void> {
    if (this.closing === null) {
      this.closing = new Promise<void>((resolve) => {
        this.server.close(() => resolve());
        this.dropAll();
      });
    }
    return this.closing;
  }
}

/** A small seeded PRNG (mulberry32): repeatable jitter and stall draws. */
function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function checkImpairment(l: LinkImpairment | null): void {
  if (l === null) return;
  const bad = (why: string) => new TestingError(TestingErrorCode.BAD_OPTION, `option impairment: ${why}`);
  if (typeof l !== "object") throw bad("not an object");
  for (const k of ["delayMs", "jitterMs", "stallMs"] as const) {
    if (!(Number.isFinite(l[k]) && l[k] >= 0)) throw bad(`${k} ${l[k]} must be a finite number >= 0`);
  }
  if (l.jitterMs > l.delayMs) throw bad(`jitterMs ${l.jitterMs} is above delayMs ${l.delayMs}`);
  if (!(l.stallProbability >= 0 && l.stallProbability <= 1)) {
    throw bad(`stallProbability ${l.stallProbability} is not in [0, 1]`);
  }
  if (!Number.isSafeInteger(l.seed)) throw bad(`seed ${l.seed} is not an integer`);
}

/**
 * Starts a real TCP proxy on 127.0.0.1 (port 0 by default; `host` for a relay inside a test's
 * network namespace) that forwards bytes both ways to `target` (TCP or unix socket), injects
 * {@link Fault}s switchable at runtime, and applies a link's delay, jitter and stalls
 * (`impairment`) to every chunk. Latency uses timers that are cleared when connections close;
 * after `close()` nothing is left running. The proxy is transparent to TLS (bytes pass through).
 */
export async function startFaultProxy(
  target: ProxyTarget,
  opts: FaultProxyOptions = {},
): Promise<FaultProxy> {
  if (typeof target !== "object" || target === null) {
    throw new TestingError(TestingErrorCode.BAD_OPTION, "target must be { host, port } or { path }");
  }
  if ("path" in target) {
    if (typeof target.path !== "string" || target.path === "") {
      throw new TestingError(TestingErrorCode.BAD_OPTION, "target.path must be a non-empty string");
    }
  } else if (!(Number.isInteger(target.port) && target.port > 0 && target.port <= 65535)) {
    throw new TestingError(TestingErrorCode.BAD_OPTION, `target.port ${target.port} is not in [1, 65535]`);
  }
  const fault = opts.fault ?? null;
  checkFault(fault);
  const port = opts.port ?? 0;
  if (!(Number.isInteger(port) && port >= 0 && port <= 65535)) {
    throw new TestingError(TestingErrorCode.BAD_OPTION, `option port ${port} is not in [0, 65535]`);
  }
  const host = opts.host ?? "127.0.0.1";
  if (typeof host !== "string" || host === "") {
    throw new TestingError(TestingErrorCode.BAD_OPTION, "option host must be a non-empty string");
  }
  if (
    opts.localAddress !== undefined &&
    (typeof opts.localAddress !== "string" || opts.localAddress === "")
  ) {
    throw new TestingError(TestingErrorCode.BAD_OPTION, "option localAddress must be a non-empty string");
  }
  const impairment = opts.impairment ?? null;
  checkImpairment(impairment);
  const proxy = new FaultProxyImpl(target, fault, impairment, opts.localAddress);
  proxy.host = host;
  await new Promise<void>((resolve, reject) => {
    proxy.server.once("error", reject);
    proxy.server.listen(port, host, () => {
      proxy.server.off("error", reject);
      resolve();
    });
  });
  proxy.port = (proxy.server.address() as AddressInfo).port;
  return proxy;
}
