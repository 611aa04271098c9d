// RemoteDraftClient owns one connection state machine (CONN_STATES) and the buffers of the STEP
// exchange; its parts (state transitions, connect + HELLO, STEP, PING / STATS / RESET) all read
// and move that one state and share the preallocated send / reply buffers, so they stay in one
// class (about 900 lines). The loop, the HELLO exchange and the 9.2 table live in
// connect-loop.ts and outcomes.ts.
import type { Counter, Gauge, Histogram, InfoValue } from "@tapwire/stats";
import { BUCKETS, Registry } from "@tapwire/stats";
import type { LinkTap } from "@tapwire/trace";
import type { RpcClient } from "@tapwire/transport";
import { createShmArena, makeClient, type ShmArena, TransportError } from "@tapwire/transport";
import type { Hello, HelloReply, ReqEntry, SampleMeta, StepReplyViews } from "@tapwire/wire";
import {
  APP_HEADER_SIZE,
  checkReplyValues,
  decodeStepReply,
  FrameStatus,
  frame,
  HelloFlag,
  maxStepBodySize,
  OP_NAMES,
  Op,
  PING_MAX_BODY,
  RowDtype,
  rowsOffsetFor,
  SampleMode,
  splitFrame,
  stepReplyBodySize,
  validateSampled,
  WireError,
  writeStepPrefix,
} from "@tapwire/wire";
import type { Logger } from "pino";
import { pino } from "pino";
import { Backoff } from "./backoff.js";
import type { Clock } from "./clock.js";
import { clampDelay, systemClock } from "./clock.js";
import { ConnectLoop, helloExchange } from "./connect-loop.js";
import { ClientError } from "./errors.js";
import type { RemoteDraftClientOptions, ResolvedClientOptions, TransportFactory } from "./options.js";
import { resolveOptions } from "./options.js";
import type { OutcomeReaction, StepOutcome, StepOutcomeReason } from "./outcomes.js";
import {
  DISABLED,
  echoProblem,
  errText,
  frameStatusRow,
  NOT_READY,
  RECONNECTED,
  STEP_OUTCOMES,
  statusName,
} from "./outcomes.js";
import { tapHello } from "./trace-tap.js";

/**
 * The connection states of {@link RemoteDraftClient} (CONTRACT 9.1, 9.3). `IDLE`: no connection
 * (waiting for the next attempt); `CONNECTING`: a connect + HELLO attempt runs; `READY`: a
 * connection is installed; `DISABLED`: a fatal status or a HELLO mismatch ended the link for the
 * run; `CLOSED`: `close()` was called. Each state lists the states it may move to.
 */
export const CONN_STATES = {
  IDLE: ["CONNECTING", "DISABLED", "CLOSED"],
  CONNECTING: ["READY", "IDLE", "DISABLED", "CLOSED"],
  READY: ["IDLE", "DISABLED", "CLOSED"],
  DISABLED: ["CLOSED"],
  CLOSED: [],
} as const satisfies Record<string, readonly string[]>;

/** One of the {@link CONN_STATES}. */
export type ConnState = keyof typeof CONN_STATES;

/** Arguments of {@link RemoteDraftClient.step}. */
export interface StepCall {
  /** Round id echoed by the reply. */
  stepId: number;
  /** The STEP's entries; only `entries[0..nEntries)` are sent. */
  entries: readonly ReqEntry[];
  /** Entries used (default `entries.length`); lets callers reuse preallocated entry arrays. */
  nEntries?: number;
  /** Rows carried in total (`sum(entry.nRows)`). */
  nRows: number;
  /** Per-entry sample meta; required in top32 sessions, refused otherwise. */
  sampleMeta?: readonly SampleMeta[] | null;
  /** The connection epoch the entries were built for; a newer connection gives `reconnected` (CONTRACT 7.5). */
  epoch?: number;
  /**
   * Rows as parts sent after the prefix (scatter/gather), instead of rows staged in
   * {@link RemoteDraftClient.sendBuffer} at {@link RemoteDraftClient.rowsOffset}. Their total
   * length must be `nRows * rowBytes`.
   */
  rows?: readonly Uint8Array[];
}

/** What the client knows about the worker after a successful HELLO. */
export interface WorkerInfo {
  /** The worker's `worker_name` (CONTRACT 6.1). */
  readonly name: string;
  /** Capability bits: TAPS_BF16, TOP32, MARGIN (CONTRACT 6.1). */
  readonly capabilities: number;
  /** The worker's `max_slots` (at least what the client asked). */
  readonly maxSlots: number;
  /** The worker's `max_rows_per_step` (at least what the client asked). */
  readonly maxRowsPerStep: number;
  /** Slot windows kept from before this HELLO (0 for a new session, CONTRACT 6.2). */
  readonly windowsKept: number;
}

const SEQ_MAX = 0xffffffff;

function failed(reason: StepOutcomeReason, unknownApply: boolean, rttUs: number, error: string): StepOutcome {
  return { ok: false, reason, unknownApply, rttUs, reply: null, error };
}

/**
 * The rank-0 client of a remote drafter worker (CONTRACT 6, 9): session and sequence numbers, a
 * background connect + HELLO loop with exponential backoff, and the STEP exchange.
 *
 * The engine path ({@link step}) never waits for a connect: without a ready connection it returns
 * `not_ready` at once (a target-only round). One request is outstanding at a time; PING, STATS and
 * RESET share the engine's connection and queue behind a STEP.
 */
export class RemoteDraftClient {
  /** The validated options. */
  readonly options: ResolvedClientOptions;
  /** The stats registry (counters of the seed, RTT histogram). */
  readonly registry: Registry;
  /**
   * The send buffer, sized once for the largest STEP of the HELLO's limits. Stage rows at
   * `rowsOffset(nEntries)` then call {@link step}: the header, prefix and entries are written in
   * front of them and the frame goes out without a copy.
   */
  readonly sendBuffer: Uint8Array;

  readonly #factory: TransportFactory;
  /** shm+unix: the arena holding sendBuffer and the slot rings, and how much of it is handed out. */
  readonly #arena: ShmArena | null;
  #arenaUsed: number;
  readonly #transportOptions: Record<string, unknown>;
  readonly #clock: Clock;
  readonly #log: Logger;
  readonly #hello: Hello;
  readonly #backoff: Backoff;
  readonly #replyBuf: Uint8Array;
  readonly #helloBuf = new Uint8Array(4096);
  /** Views `sendBuffer[0, rowsOffset(n))` by entry count n (parts mode). */
  readonly #heads: Uint8Array[] = [];
  readonly #partsOut: Uint8Array[] = [];
  /** The reply context of the STEP being checked, refilled per STEP. */
  readonly #ctx: {
    stepId: number;
    vocabSize: number;
    window: number;
    numSpec: number;
    entries: readonly ReqEntry[];
    nEntries: number;
    sampleMeta: readonly SampleMeta[] | null;
  };
  #ctrlBuf: Uint8Array | null = null;
  /** The link capture (issue 24), or null. */
  readonly #trace: LinkTap | null;

  #session: number;
  #seq: number;
  #state: ConnState = "IDLE";
  /** The installed connection (READY) or the attempt's (CONNECTING); null otherwise. */
  #conn: RpcClient | null = null;
  #attempt: Promise<boolean> | null = null;
  #epoch = 0;
  #disabledReason: string | null = null;
  #workerInfo: WorkerInfo | null = null;
  #lastError: string | null = null;
  #nextAttempt = 0;
  #failRun = 0;
  #failLogged = 0;
  readonly #loop: ConnectLoop;
  #loopRun: Promise<void> | null = null;
  #readyWaiters = new Set<() => void>();
  #busy = false;
  #lockQueue: (() => void)[] = [];

  readonly #c: {
    hellos: Counter;
    connectFailures: Counter;
    disconnects: Counter;
    disabled: Counter;
    newSessions: Counter;
    newSessionsStaleSeq: Counter;
    bytesSent: Counter;
    bytesReceived: Counter;
    steps: Counter;
    badReplies: Counter;
    epoch: Gauge;
    ready: Gauge;
    disabledReason: InfoValue;
    lastBadReply: InfoValue;
    lastError: InfoValue;
    worker: InfoValue;
    rtt: Histogram;
  };
  readonly #outcomeCounters = new Map<string, Counter>();

  /** @throws ClientError `CLIENT_BAD_OPTION` naming the first bad option. */
  constructor(options: RemoteDraftClientOptions) {
    const o = resolveOptions(options);
    this.options = o;
    this.#factory = options.transportFactory ?? makeClient;
    this.#trace = options.trace ?? null;
    this.#clock = options.clock ?? systemClock;
    // silent unless the caller passes a logger, like every package of the project (issue 15)
    this.#log = options.logger ?? pino({ level: "silent" });
    this.registry = options.registry ?? new Registry({ prefix: "tapwire_client_" });
    this.#backoff = new Backoff({ initialMs: o.backoffMs, maxMs: o.backoffMaxMs });
    this.#loop = new ConnectLoop(this.#clock);
    this.#session = o.sessionId;
    this.#seq = o.initialSeq;
    this.#hello = {
      drafterIdentity: o.drafterIdentity,
      markovIdentity: o.markovIdentity,
      window: o.window,
      numSpec: o.numSpec,
      sampleMode: o.sampled ? SampleMode.TOP32 : SampleMode.GREEDY,
      rowDtype: RowDtype.BF16,
      numTaps: o.numTaps,
      hidden: o.hidden,
      rowBytes: o.rowBytes,
      vocabSize: o.vocabSize,
      maxSlots: o.maxSlots,
      maxRowsPerStep: o.maxRowsPerStep,
      helloFlags: o.wantMargin ? HelloFlag.WANT_MARGIN : 0,
      auth: new Uint8Array(32),
      clientName: o.clientName,
    };
    const sendSize =
      APP_HEADER_SIZE +
      maxStepBodySize({
        sampled: o.sampled,
        rowBytes: o.rowBytes,
        maxSlots: o.maxSlots,
        maxRowsPerStep: o.maxRowsPerStep,
        numSpec: o.numSpec,
      });
    const replySize =
      APP_HEADER_SIZE +
      stepReplyBodySize({ nReq: o.maxSlots, numSpec: o.numSpec, margin: o.wantMargin, sampled: o.sampled });
    // shm+unix (issue 23): the send buffer and the slot rings live in one shared-memory arena that
    // outlives connections, so staged rows and rowsTarget rows leave by offset, never copied here
    const topts = { ...(options.transportOptions ?? {}) } as Record<string, unknown>;
    let arena: ShmArena | null = null;
    if (o.endpoint.startsWith("shm+unix://") && topts.shmArena === undefined) {
      const want = sendSize + o.maxSlots * o.window * o.rowBytes;
      arena = createShmArena(Math.max(64 * 1024, Math.ceil(want / 4096) * 4096));
      if (arena !== null) topts.shmArena = arena;
    }
    this.#arena = arena;
    this.#arenaUsed = Math.ceil(sendSize / 64) * 64;
    // a Buffer: written to the socket without a wrapper per write
    this.sendBuffer =
      arena !== null
        ? Buffer.from(arena.bytes.buffer, arena.bytes.byteOffset, sendSize)
        : Buffer.alloc(sendSize);
    this.#ctx = {
      stepId: 0,
      vocabSize: o.vocabSize,
      window: o.window,
      numSpec: o.numSpec,
      entries: [],
      nEntries: 0,
      sampleMeta: null,
    };
    this.#replyBuf = new Uint8Array(replySize);
    topts.connectTimeoutMs = o.connectTimeoutMs;
    if (topts.maxMessageBytes === undefined) {
      topts.maxMessageBytes = Math.max(64 * 1024 * 1024, sendSize, replySize);
    }
    if (topts.registry === undefined) topts.registry = this.registry;
    this.#transportOptions = topts;
    const r = this.registry;
    this.#c = {
      hellos: r.counter("hellos", "successful HELLOs (epochs)"),
      connectFailures: r.counter("connect_failures", "failed connect + HELLO attempts"),
      disconnects: r.counter("disconnects", "connections dropped"),
      disabled: r.counter("remote_disabled", "times the client was disabled"),
      newSessions: r.counter("new_sessions", "new session ids taken"),
      newSessionsStaleSeq: r.counter(
        "new_sessions_stale_seq",
        "new sessions taken because a HELLO of the session was answered STALE_SEQ (CONTRACT 6.2)",
      ),
      bytesSent: r.counter("bytes_sent", "STEP bytes sent"),
      bytesReceived: r.counter("bytes_received", "STEP reply bytes received"),
      steps: r.counter("steps", "STEP calls"),
      badReplies: r.counter("bad_replies", "STEP replies refused"),
      epoch: r.gauge("epoch", "connection epoch (successful HELLOs)"),
      ready: r.gauge("ready", "1 when a connection is ready"),
      disabledReason: r.info("disabled_reason", "why the client is disabled"),
      lastBadReply: r.info("last_bad_reply", "first violation of the last refused reply"),
      lastError: r.info("last_error", "the last connection error"),
      worker: r.info("worker", "the worker of the current connection (JSON)"),
      rtt: r.histogram("step_rtt_seconds", {
        help: "STEP round-trip time",
        unit: "seconds",
        buckets: BUCKETS.STEP_RTT_SECONDS,
      }),
    };
    for (const reason of Object.keys(STEP_OUTCOMES)) this.#outcomeCounter(reason);
    if (options.autoStart !== false) this.start();
  }

  // ------------------------------------------------------------------ state

  /** The current session id (CONTRACT 6.2). */
  get sessionId(): number {
    return this.#session;
  }

  /** The seq of the last frame sent. */
  get lastSeq(): number {
    return this.#seq;
  }

  /** Successful HELLOs so far (CONTRACT 7.5). */
  get epoch(): number {
    return this.#epoch;
  }

  /** The connection state (CONTRACT 9.1, 9.3). */
  get state(): ConnState {
    return this.#state;
  }

  /** True when a connection is ready and the client is neither disabled nor closed. */
  get ready(): boolean {
    return this.#state === "READY";
  }

  /** True once disabled (CONTRACT 9.3). */
  get disabled(): boolean {
    return this.#disabledReason !== null;
  }

  /** Why the client is disabled, or null. */
  get disabledReason(): string | null {
    return this.#disabledReason;
  }

  /** The last connection / STEP error, or null. */
  get lastError(): string | null {
    return this.#lastError;
  }

  /** The worker of the last successful HELLO, or null. */
  get workerInfo(): WorkerInfo | null {
    return this.#workerInfo;
  }

  /** Row size in bytes (`numTaps * hidden * 2`). */
  get rowBytes(): number {
    return this.options.rowBytes;
  }

  /**
   * Memory for a RoundCore slot ring (issue 23): on `shm+unix://`, `bytes` of the shared-memory
   * arena after {@link sendBuffer}, so rows written there leave by offset; null when there is no
   * arena or it is full (the ring is then an ordinary buffer).
   */
  allocRows(bytes: number): Uint8Array | null {
    const a = this.#arena;
    if (a === null || !Number.isInteger(bytes) || bytes <= 0 || this.#arenaUsed + bytes > a.size) return null;
    const v = a.bytes.subarray(this.#arenaUsed, this.#arenaUsed + bytes);
    this.#arenaUsed += Math.ceil(bytes / 64) * 64;
    return v;
  }

  /** Offset in {@link sendBuffer} where the rows of a STEP with `nEntries` entries start (`24 + rows_offset_for(n)`, CONTRACT 7.3). */
  rowsOffset(nEntries: number): number {
    return APP_HEADER_SIZE + rowsOffsetFor(nEntries, this.options.sampled);
  }

  /** The epoch of the ready connection, or null when there is none. */
  connectionEpoch(): number | null {
    return this.ready ? this.#epoch : null;
  }

  /**
   * Resolves true once a connection is ready, false when `timeoutMs` passes or the client is
   * disabled or closed first. Its timer keeps the process alive while it waits (every other
   * timer of the client is unref'd). For tools and tests; the engine path never waits.
   */
  waitReady(timeoutMs: number): Promise<boolean> {
    if (this.ready) return Promise.resolve(true);
    if (!this.#live()) return Promise.resolve(false);
    return new Promise((resolve) => {
      const done = (): void => {
        this.#clock.clearTimeout(timer);
        this.#readyWaiters.delete(done);
        resolve(this.ready);
      };
      const timer = this.#clock.setTimeout(done, clampDelay(timeoutMs));
      // The clock unrefs its timers so that the client never keeps a process alive; a caller
      // awaiting waitReady is waiting on purpose, so this one timer holds the event loop until it
      // fires: a script with nothing else to do gets its `false` instead of exiting unsettled.
      (timer as { ref?: () => unknown } | null)?.ref?.();
      this.#readyWaiters.add(done);
    });
  }

  #notify(): void {
    for (const w of [...this.#readyWaiters]) w();
    this.#c.ready.set(this.ready ? 1 : 0);
  }

  #outcomeCounter(reason: string): Counter {
    let c = this.#outcomeCounters.get(reason);
    if (c === undefined) {
      c = this.registry.counter(`step_${reason}`, `STEP outcomes ${reason} (CONTRACT 9.2)`);
      this.#outcomeCounters.set(reason, c);
    }
    return c;
  }

  #count(o: StepOutcome): StepOutcome {
    this.#outcomeCounter(o.reason).inc();
    return o;
  }

  // ------------------------------------------------------------------ state machine

  #live(): boolean {
    return this.#state !== "DISABLED" && this.#state !== "CLOSED";
  }

  /**
   * Moves to `to` when the state is one of `from` (else false, nothing happens); every side
   * effect of entering a state lives in this one switch (grpc-js `Subchannel.transitionToState`).
   * `cli` is the connection that enters CONNECTING or READY; `reason` explains IDLE and DISABLED.
   *
   * @throws ClientError `CLIENT_INTERNAL` for a move {@link CONN_STATES} does not allow (a bug).
   */
  #transition(
    from: readonly ConnState[],
    to: ConnState,
    args: { cli?: RpcClient; reason?: string; reply?: HelloReply } = {},
  ): boolean {
    const prev = this.#state;
    if (!from.includes(prev)) return false;
    if (!(CONN_STATES[prev] as readonly ConnState[]).includes(to)) {
      throw new ClientError("CLIENT_INTERNAL", `impossible connection transition ${prev} -> ${to}`);
    }
    this.#state = to;
    const old = this.#conn;
    switch (to) {
      case "CONNECTING":
        this.#conn = args.cli ?? null;
        return true;
      case "READY":
        this.#conn = args.cli ?? null;
        this.#installed(args.reply!);
        break;
      case "IDLE":
        this.#conn = null;
        old?.close();
        if (prev === "READY") {
          this.#c.disconnects.inc();
          this.#c.ready.set(0);
        }
        // nobody waits for IDLE: waitReady resolves on READY, DISABLED and CLOSED only
        this.#loop.wake();
        return true;
      case "DISABLED": {
        const reason = args.reason ?? "disabled";
        this.#conn = null;
        this.#disabledReason = reason;
        this.#c.disabled.inc();
        this.#c.disabledReason.set(reason);
        this.#log.error({ reason }, `tapwire client disabled for this engine run: ${reason}`);
        old?.close();
        if (prev === "READY") this.#c.disconnects.inc();
        break;
      }
      case "CLOSED":
        this.#conn = null;
        old?.close();
        break;
    }
    this.#loop.wake();
    this.#notify();
    return true;
  }

  /** Starts the background connect loop (one at a time; a no-op when it runs). */
  start(): void {
    if (this.#loopRun !== null || !this.#live()) return;
    this.#loopRun = this.#loop
      .run({
        live: () => this.#live(),
        connected: () => this.#state === "READY",
        nextAttempt: () => this.#nextAttempt,
        attempt: () => this.connectNow(),
        attemptFailed: () => {
          this.#nextAttempt = this.#clock.now() + this.#backoff.next();
        },
        crashed: (e) => {
          this.#log.error({ err: e }, "tapwire client connect loop failed");
          this.#disable(`connect loop failed: ${errText(e)}`);
        },
      })
      .finally(() => {
        this.#loopRun = null;
      });
  }

  /**
   * Stops the loop, closes the connection and resolves once the loop has ended. A pending STEP
   * resolves with `transport_error`; later STEPs return `not_ready`; later PING / STATS / RESET
   * reject with `CLIENT_CLOSED`.
   */
  async close(): Promise<void> {
    this.#transition(["IDLE", "CONNECTING", "READY", "DISABLED"], "CLOSED");
    await this.#loopRun;
  }

  /**
   * Drops the connection; the loop reconnects after the backoff (or at once with
   * `backoff: false`). Slots resync on the next epoch.
   */
  markFailed(reason: string, options: { backoff?: boolean } = {}): void {
    this.#drop(null, reason, options.backoff ?? true);
  }

  /**
   * Takes a new random session id and reconnects at once (CONTRACT 6.2): the HELLO with the new
   * id makes the worker drop every window; the epoch change then resyncs every live slot. For
   * STALE_GENERATION (7.1) and before the seq would wrap. A {@link WorkerPool} passes
   * `sessionId`, the process's new id, so that every member uses the same one (CONTRACT 12.2).
   *
   * @throws ClientError `CLIENT_BAD_ARGUMENT` for a `sessionId` that is not a non-zero u32.
   */
  newSession(reason: string, sessionId?: number): void {
    if (sessionId !== undefined && (!Number.isInteger(sessionId) || sessionId < 1 || sessionId > SEQ_MAX)) {
      throw new ClientError("CLIENT_BAD_ARGUMENT", `sessionId ${sessionId} is not a non-zero u32`);
    }
    if (!this.#live()) return;
    const old = this.#session;
    if (sessionId !== undefined && sessionId !== old) {
      this.#session = sessionId;
      this.#seq = 0;
      this.#c.newSessions.inc();
    } else this.#takeSession();
    this.#log.error(
      { session: this.#session, previous: old, reason },
      `tapwire client: new session 0x${this.#session.toString(16).padStart(8, "0")}: ${reason}`,
    );
    this.#drop(null, `new session: ${reason}`, false);
  }

  #takeSession(): void {
    const old = this.#session;
    let s = old;
    while (s === old) s = 1 + Math.floor(Math.random() * SEQ_MAX);
    this.#session = s;
    this.#seq = 0;
    this.#c.newSessions.inc();
  }

  // cli === null: whatever is installed; else only if that connection is still the installed one
  #drop(cli: RpcClient | null, reason: string, backoff: boolean): void {
    if (cli !== null && (this.#state !== "READY" || this.#conn !== cli)) return;
    this.#lastError = reason;
    this.#c.lastError.set(reason);
    if (!this.#live()) return;
    const now = this.#clock.now();
    this.#nextAttempt = backoff ? now + this.#backoff.next() : now;
    // not READY (an attempt runs, or none): the loop only re-reads when the next attempt is due
    if (!this.#transition(["READY"], "IDLE", { reason })) this.#loop.wake();
  }

  #disable(reason: string): void {
    this.#transition(["IDLE", "CONNECTING", "READY"], "DISABLED", { reason });
  }

  // ------------------------------------------------------------------ connect + HELLO (CONTRACT 6.1, 9.1)

  /**
   * One connect + HELLO attempt (CONTRACT 6.1, 9.1); true when a ready connection was installed.
   * The background loop calls it; exposed for tools that want to connect synchronously. While an
   * attempt runs, resolves with that attempt.
   */
  connectNow(): Promise<boolean> {
    if (this.#state === "READY") return Promise.resolve(true);
    if (this.#state === "CONNECTING" && this.#attempt !== null) return this.#attempt;
    if (!this.#live()) return Promise.resolve(false);
    const attempt = this.#connectOnce().finally(() => {
      if (this.#attempt === attempt) this.#attempt = null;
    });
    this.#attempt = attempt;
    return attempt;
  }

  // staleRetry: this attempt already left a session for STALE_SEQ (at most once per attempt)
  async #connectOnce(staleRetry = false): Promise<boolean> {
    if (this.#seq >= SEQ_MAX) {
      // no connection to drop: just take a fresh session before the seq wraps (CONTRACT 6.2)
      this.#takeSession();
    }
    const session = this.#session;
    const o = this.options;
    let cli: RpcClient;
    try {
      cli = this.#factory(o.endpoint, this.#transportOptions);
    } catch (e) {
      this.#connectFailed(e);
      return false;
    }
    this.#transition(["IDLE"], "CONNECTING", { cli });
    try {
      await cli.connect(o.connectTimeoutMs);
      if (this.#state !== "CONNECTING") throw new ClientError("CLIENT_CLOSED", "client closed");
      const res = await helloExchange(cli, {
        hello: this.#hello,
        session,
        seq: ++this.#seq,
        token: o.token,
        timeoutMs: o.connectTimeoutMs,
        replyBuf: this.#helloBuf,
      });
      if (res.kind === "fatal") {
        this.#disable(res.reason);
        return false;
      }
      if (res.kind === "stale_seq") {
        // The worker holds a newer seq for this session than we do (another peer advanced it):
        // retrying the session can never succeed, so leave it at once (CONTRACT 6.2, 1.1). A
        // fresh session answered STALE_SEQ again is a plain failure (backoff), so a hostile
        // worker cannot spin the loop.
        if (staleRetry || this.#state !== "CONNECTING") {
          throw new ClientError("CLIENT_REFUSED", "HELLO refused: STALE_SEQ", {
            status: FrameStatus.STALE_SEQ,
          });
        }
        const old = this.#session;
        this.#takeSession();
        this.#c.newSessionsStaleSeq.inc();
        this.#log.warn(
          { session: this.#session, previous: old, reason: "stale_seq" },
          `tapwire client: HELLO of session 0x${old.toString(16).padStart(8, "0")} answered STALE_SEQ; new session 0x${this.#session.toString(16).padStart(8, "0")} (CONTRACT 6.2)`,
        );
        this.#transition(["CONNECTING"], "IDLE");
        return this.#connectOnce(true);
      }
      if (this.#state !== "CONNECTING") {
        cli.close();
        return false;
      }
      if (session !== this.#session) {
        // newSession() ran meanwhile: HELLO again at once under the new id
        this.#transition(["CONNECTING"], "IDLE");
        return this.#connectOnce();
      }
      this.#transition(["CONNECTING"], "READY", { cli, reply: res.reply });
      return true;
    } catch (e) {
      cli.close();
      if (!this.#transition(["CONNECTING"], "IDLE")) return false;
      this.#connectFailed(e);
      return false;
    }
  }

  // the effects of READY: a new epoch (CONTRACT 7.5), backoff reset, the worker's info, one log line
  #installed(rep: HelloReply): void {
    this.#epoch++;
    this.#backoff.reset();
    this.#workerInfo = {
      name: rep.workerName,
      capabilities: rep.capabilities,
      maxSlots: rep.maxSlots,
      maxRowsPerStep: rep.maxRowsPerStep,
      windowsKept: rep.windowsKept,
    };
    this.#c.hellos.inc();
    this.#c.epoch.set(this.#epoch);
    this.#c.worker.set(JSON.stringify(this.#workerInfo));
    if (this.#trace !== null) tapHello(this.#trace, this.#hello, this.#session, this.#seq, rep);
    const failedBefore = this.#failRun;
    this.#failRun = 0;
    this.#log.info(
      {
        worker: rep.workerName,
        endpoint: this.options.endpoint,
        session: this.#session,
        epoch: this.#epoch,
        failedBefore,
      },
      `tapwire worker ${JSON.stringify(rep.workerName)} ready at ${this.options.endpoint} (epoch ${this.#epoch})${
        failedBefore > 0 ? ` after ${failedBefore} failed connect attempts` : ""
      }`,
    );
  }

  #connectFailed(e: unknown): void {
    const msg = errText(e);
    this.#lastError = `connect: ${msg}`;
    this.#c.lastError.set(this.#lastError);
    this.#c.connectFailures.inc();
    this.#failRun++;
    const now = this.#clock.now();
    if (this.#failRun === 1) {
      this.#failLogged = now;
      this.#log.warn(
        { endpoint: this.options.endpoint, err: msg },
        `tapwire connect/HELLO to ${this.options.endpoint} failed: ${msg} (target-only rounds; retrying, further failures logged once per ${Math.round(this.options.connectFailLogMs / 1000)} s)`,
      );
    } else if (now - this.#failLogged >= this.options.connectFailLogMs) {
      this.#failLogged = now;
      this.#log.warn(
        { endpoint: this.options.endpoint, err: msg, attempts: this.#failRun },
        `tapwire connect/HELLO to ${this.options.endpoint} still failing after ${this.#failRun} attempts: ${msg}`,
      );
    }
  }

  // ------------------------------------------------------------------ one request at a time

  #lock(): Promise<void> | null {
    if (!this.#busy) {
      this.#busy = true;
      return null;
    }
    return new Promise((resolve) => this.#lockQueue.push(resolve));
  }

  #unlock(): void {
    const next = this.#lockQueue.shift();
    if (next !== undefined) next();
    else this.#busy = false;
  }

  // ------------------------------------------------------------------ STEP (CONTRACT 7, 9.2)

  /**
   * Sends one STEP and returns its 9.2 outcome; never waits for a connect and never rejects for
   * a connection problem. Rows are either staged in {@link sendBuffer} at
   * `rowsOffset(nEntries)` (default) or passed as `call.rows` parts.
   *
   * @throws ClientError `CLIENT_BAD_ARGUMENT` when the call itself is malformed (nothing sent).
   */
  async step(call: StepCall): Promise<StepOutcome> {
    this.#c.steps.inc();
    const early = this.#unsendable(call);
    if (early !== null) return this.#count(early);
    const wait = this.#lock();
    if (wait !== null) await wait;
    try {
      // state may have moved while a PING / STATS / RESET ran
      const late = this.#unsendable(call);
      if (late !== null) return this.#count(late);
      return this.#count(await this.#stepLocked(call, this.#conn!));
    } finally {
      this.#unlock();
    }
  }

  // the 9.2 rows of a STEP that is not sent, or null when it can go out
  #unsendable(call: StepCall): StepOutcome | null {
    if (this.disabled) return DISABLED;
    if (this.#state !== "READY") return NOT_READY;
    if (call.epoch !== undefined && call.epoch !== this.#epoch) return RECONNECTED;
    return null;
  }

  async #stepLocked(call: StepCall, cli: RpcClient): Promise<StepOutcome> {
    const o = this.options;
    if (this.#seq >= SEQ_MAX) {
      this.newSession("sequence number would wrap");
      return NOT_READY;
    }
    const nEntries = call.nEntries ?? call.entries.length;
    const sampleMeta = call.sampleMeta ?? null;
    if (o.sampled !== (sampleMeta !== null)) {
      throw new ClientError(
        "CLIENT_BAD_ARGUMENT",
        o.sampled ? "top32 session: sampleMeta is required" : "greedy session: sampleMeta must be null",
      );
    }
    const session = this.#session;
    const seq = this.#seq + 1;
    let frameLen: number;
    try {
      frameLen = writeStepPrefix(this.sendBuffer, {
        seq,
        session,
        stepId: call.stepId,
        entries: call.entries,
        nEntries,
        sampleMeta,
        nRows: call.nRows,
        rowBytes: o.rowBytes,
      });
    } catch (e) {
      throw new ClientError("CLIENT_BAD_ARGUMENT", `STEP not sent: ${errText(e)}`, { cause: e });
    }
    let parts: Uint8Array[] | null = null;
    if (call.rows !== undefined) {
      // the prefix view (one per entry count, made once) then the caller's parts, in a reused array
      let headView = this.#heads[nEntries];
      if (headView === undefined) {
        headView = this.sendBuffer.subarray(0, this.rowsOffset(nEntries));
        this.#heads[nEntries] = headView;
      }
      const rows = call.rows;
      parts = this.#partsOut;
      parts.length = rows.length + 1;
      parts[0] = headView;
      let total = 0;
      for (let i = 0; i < rows.length; i++) {
        const r = rows[i]!;
        total += r.length;
        parts[i + 1] = r;
      }
      if (total !== call.nRows * o.rowBytes) {
        parts.length = 0;
        throw new ClientError(
          "CLIENT_BAD_ARGUMENT",
          `rows hold ${total} bytes, ${call.nRows} rows need ${call.nRows * o.rowBytes}`,
        );
      }
    }
    this.#seq = seq;
    const t0 = performance.now();
    let n: number;
    const tap = this.#trace;
    try {
      const pending =
        parts === null
          ? cli.request(this.sendBuffer.subarray(0, frameLen), this.#replyBuf, o.requestTimeoutMs)
          : cli.requestParts(parts, this.#replyBuf, o.requestTimeoutMs);
      // the capture copies the request while the worker drafts (issue 24)
      if (tap !== null) tap.request(parts ?? this.sendBuffer, frameLen);
      n = await pending;
    } catch (e) {
      const rttUs = (performance.now() - t0) * 1000;
      const text = errText(e);
      if (e instanceof TransportError && e.code === "TRANSPORT_TIMEOUT") {
        this.#drop(cli, `STEP timeout: ${text}`, true);
        return failed("timeout", true, rttUs, text);
      }
      if (e instanceof TransportError && e.code === "TRANSPORT_REPLY_TOO_LARGE") {
        return this.#badReply(cli, rttUs, `reply larger than the largest valid STEP reply: ${text}`);
      }
      this.#drop(cli, `STEP transport error: ${text}`, true);
      return failed("transport_error", true, rttUs, text);
    }
    const rttUs = (performance.now() - t0) * 1000;
    if (tap !== null) tap.reply(this.#replyBuf, n, rttUs);
    this.#c.bytesSent.inc(frameLen);
    this.#c.bytesReceived.inc(n);
    this.#c.rtt.observe(rttUs / 1e6);
    let reply: StepReplyViews;
    try {
      const { header: h, body } = splitFrame(this.#replyBuf, n);
      const echo = echoProblem(h, Op.STEP, seq, session);
      if (echo !== null) return this.#badReply(cli, rttUs, echo);
      if (h.status !== FrameStatus.OK) return this.#frameStatus(cli, h.status, rttUs);
      reply = decodeStepReply(body, {
        nReq: nEntries,
        numSpec: o.numSpec,
        margin: o.wantMargin,
        sampled: o.sampled,
      });
      const ctx = this.#ctx;
      ctx.stepId = call.stepId;
      ctx.entries = call.entries;
      ctx.nEntries = nEntries;
      ctx.sampleMeta = sampleMeta;
      checkReplyValues(reply, ctx);
      if (o.sampled) validateSampled(reply, ctx);
    } catch (e) {
      if (!(e instanceof WireError)) throw e;
      return this.#badReply(cli, rttUs, e.message);
    }
    return { ok: true, reason: "ok", unknownApply: false, rttUs, reply, error: null };
  }

  #badReply(cli: RpcClient, rttUs: number, what: string): StepOutcome {
    this.#c.badReplies.inc();
    this.#c.lastBadReply.set(what);
    this.#log.warn({ violation: what }, `tapwire STEP reply refused (round fails, slots resync): ${what}`);
    this.#drop(cli, `bad reply: ${what}`, true);
    return failed("bad_reply", true, rttUs, what);
  }

  // non-OK frame statuses: the worker changed nothing (CONTRACT 5, 9.2)
  #frameStatus(cli: RpcClient, status: number, rttUs: number): StepOutcome {
    const row = frameStatusRow(status);
    if (row === null) return this.#badReply(cli, rttUs, `unknown frame status ${status}`);
    const what = `STEP refused: ${row.name}`;
    this.#react(cli, row.reaction, what);
    return failed(row.reason, false, rttUs, what);
  }

  // the client action of a 9.2 row (`reaction`) on connection `cli`
  #react(cli: RpcClient, reaction: OutcomeReaction, what: string): void {
    if (reaction === "disable") this.#disable(what);
    else if (reaction === "reconnect") this.#drop(cli, what, false);
    else if (reaction === "drop_backoff") this.#drop(cli, what, true);
  }

  // ------------------------------------------------------------------ PING / STATS / RESET (CONTRACT 10)

  /** PING on the engine's connection: echoes `body` (at most 1 KiB); resolves the RTT in microseconds. */
  async ping(body: Uint8Array = new Uint8Array(0)): Promise<number> {
    if (body.length > PING_MAX_BODY) {
      throw new ClientError(
        "CLIENT_BAD_ARGUMENT",
        `PING body of ${body.length} bytes exceeds ${PING_MAX_BODY}`,
      );
    }
    const t0 = performance.now();
    const echo = await this.#control(Op.PING, body);
    if (echo.length !== body.length || !echo.every((v, i) => v === body[i])) {
      throw new ClientError("CLIENT_BAD_REPLY", "PING reply does not echo the body");
    }
    return (performance.now() - t0) * 1000;
  }

  /** STATS: the worker's stats snapshot (parsed JSON). */
  async stats(): Promise<unknown> {
    const body = await this.#control(Op.STATS, new Uint8Array(0));
    try {
      return JSON.parse(Buffer.from(body).toString("utf8"));
    } catch (e) {
      throw new ClientError("CLIENT_BAD_REPLY", `STATS reply is not JSON: ${errText(e)}`, { cause: e });
    }
  }

  /**
   * RESET: the worker drops all slot state of this session. With a RoundCore use
   * `RoundCore.reset()`, which also marks every slot for resync.
   */
  async reset(): Promise<void> {
    await this.#control(Op.RESET, new Uint8Array(0));
  }

  /** The client's own stats snapshot (counters of the seed plus the RTT histogram). */
  snapshot(): ReturnType<Registry["snapshot"]> {
    return this.registry.snapshot();
  }

  async #control(op: number, body: Uint8Array): Promise<Uint8Array> {
    const wait = this.#lock();
    if (wait !== null) await wait;
    try {
      if (this.#state === "CLOSED") throw new ClientError("CLIENT_CLOSED", "client closed");
      if (this.disabled) throw new ClientError("CLIENT_DISABLED", `client disabled: ${this.#disabledReason}`);
      const cli = this.#conn;
      if (this.#state !== "READY" || cli === null) {
        throw new ClientError("CLIENT_NOT_READY", "no ready connection to the worker");
      }
      if (this.#seq >= SEQ_MAX) {
        this.newSession("sequence number would wrap");
        throw new ClientError("CLIENT_NOT_READY", "new session started before the seq wrapped; reconnecting");
      }
      const seq = ++this.#seq;
      const session = this.#session;
      this.#ctrlBuf ??= new Uint8Array(4 * 1024 * 1024);
      let n: number;
      try {
        n = await cli.request(
          frame({ op, seq, session }, body),
          this.#ctrlBuf,
          this.options.requestTimeoutMs,
        );
      } catch (e) {
        this.#drop(cli, `${OP_NAMES[op] ?? op} failed: ${errText(e)}`, true);
        throw new ClientError("CLIENT_TRANSPORT", `request failed: ${errText(e)}`, { cause: e });
      }
      let h: ReturnType<typeof splitFrame>["header"];
      let rb: Uint8Array;
      try {
        ({ header: h, body: rb } = splitFrame(this.#ctrlBuf, n));
      } catch (e) {
        this.#drop(cli, `bad reply: ${errText(e)}`, true);
        throw new ClientError("CLIENT_BAD_REPLY", `reply cannot be parsed: ${errText(e)}`, { cause: e });
      }
      const echo = echoProblem(h, op, seq, session);
      if (echo !== null) {
        this.#drop(cli, "bad reply: echo", true);
        throw new ClientError("CLIENT_BAD_REPLY", echo);
      }
      if (h.status !== FrameStatus.OK) {
        const what = `request refused: ${statusName(h.status)}`;
        // a status CONTRACT 5 does not name: reconnect with backoff, like INTERNAL
        this.#react(cli, frameStatusRow(h.status)?.reaction ?? "drop_backoff", what);
        throw new ClientError("CLIENT_REFUSED", what, { status: h.status });
      }
      return Uint8Array.from(rb);
    } finally {
      this.#unlock();
    }
  }
}
