import type { Registry } from "@tapwire/stats";
import {
  APP_HEADER_SIZE,
  Capability,
  decodeHeader,
  FrameStatus,
  headerReadable,
  MAGIC_U32,
  maxStepBodySize,
  Op,
  PING_MAX_BODY,
  partialHeader,
  peekHeader,
  STATS_MAX_BODY,
} from "@tapwire/wire";
import { SharedBatcher } from "./batcher.js";
import type { Drafter } from "./drafter.js";
import { WorkerError } from "./errors.js";
import type { CoreMetrics } from "./metrics.js";
import { createCoreMetrics, OP_KEYS } from "./metrics.js";
import type { WorkerCoreOptions, WorkerLogger } from "./options.js";
import { resolveCoreOptions } from "./options.js";
import { Placer, StepPlacement } from "./placement.js";
import { smallReply, statusOf } from "./reply.js";
import type { FrameConn } from "./session.js";
import { Session } from "./session.js";
import type { HeldSession } from "./sessions.js";
import { SessionTable } from "./sessions.js";
import { StepRunner } from "./step.js";
import type { WindowSnapshot } from "./window-store.js";
import { WindowStore } from "./window-store.js";

export type { WorkerCoreOptions, WorkerLogger } from "./options.js";
export { Takeover } from "./options.js";
export { StepPlacement } from "./placement.js";
export type { FrameConn } from "./session.js";

/** A reply of {@link WorkerCore.handle}. */
export type FrameReply = Uint8Array;

/**
 * The worker's frame handler (CONTRACT 4–8, 10, 11) without sockets: one session, slot windows,
 * batched drafting. `handle()` takes one request message and returns its reply; frames are
 * processed strictly one at a time (an async drafter queues the frames behind it). Never throws
 * for any input: an internal failure is answered INTERNAL. The op families live in their own
 * modules: `session.ts` (HELLO, RESET, binding), `step.ts` (STEP), `placement.ts` (rows
 * received in place); this class reads the header and dispatches.
 */
export class WorkerCore {
  /** The drafting backend. */
  readonly drafter: Drafter;
  /** Largest `max_slots` a session may ask (the `max_slots` of the HelloReply). */
  readonly maxSlots: number;
  /** Largest `max_rows_per_step` a session may ask. */
  readonly maxRowsPerStep: number;
  /** `num_taps * hidden * 2` of the drafter. */
  readonly rowBytes: number;
  /** `worker_name` of the HelloReply. */
  readonly name: string;
  /** Where the worker counts (prefix `tapwire_worker_` by default). */
  readonly registry: Registry;
  /**
   * Largest request message the worker can ever accept: 24 + the largest STEP body of a session
   * asking the worker's own `max_slots` and `max_rows_per_step` (CONTRACT 7.2, 11).
   */
  readonly maxMessageBytes: number;
  readonly #log: WorkerLogger;
  readonly #store: WindowStore;
  readonly #m: CoreMetrics;
  readonly #session: Session;
  readonly #placer: Placer;
  readonly #steps: StepRunner;
  // The connection of handle() calls that name none (tests, benchmarks, embedding).
  readonly #direct: FrameConn = {};
  #tail: Promise<void> | null = null;
  // CONTRACT 12.1: the sessions of a shared worker (max_sessions > 1), else null.
  readonly #table: SessionTable | null;
  readonly #batcher: SharedBatcher | null;
  // Which held session a placed STEP belongs to (shared workers).
  readonly #placedBy = new WeakMap<StepPlacement, HeldSession>();
  /** CONTRACT 12.1 `max_sessions` (1: a 1.1 worker with one current session). */
  readonly maxSessions: number;

  constructor(options: WorkerCoreOptions) {
    const cfg = resolveCoreOptions(options);
    const d = cfg.drafter;
    this.drafter = d;
    this.maxSlots = cfg.maxSlots;
    this.maxRowsPerStep = cfg.maxRowsPerStep;
    this.rowBytes = cfg.rowBytes;
    this.name = cfg.name;
    this.registry = cfg.registry;
    this.#log = cfg.log;
    this.#store = new WindowStore(cfg.maxSlots, d.window, cfg.rowBytes, cfg.slotBufferWindows);
    this.maxMessageBytes =
      APP_HEADER_SIZE +
      maxStepBodySize({
        sampled: (d.capabilities & Capability.TOP32) !== 0,
        rowBytes: cfg.rowBytes,
        maxSlots: cfg.maxSlots,
        maxRowsPerStep: cfg.maxRowsPerStep,
        numSpec: d.numSpec,
      });
    this.#m = createCoreMetrics(cfg.registry);
    this.#session = new Session(cfg, this.#store, this.#m);
    this.#placer = new Placer(cfg, this.#store, this.#session, this.#m);
    this.#steps = new StepRunner(cfg, this.#store, this.#session, this.#m);
    this.maxSessions = cfg.maxSessions;
    this.#batcher =
      cfg.maxSessions > 1 ? new SharedBatcher(d, cfg.maxBatchEntries, cfg.registry, cfg.batchGatherUs) : null;
    this.#table = this.#batcher !== null ? new SessionTable(cfg, this.#m, this.#batcher) : null;
  }

  /** CONTRACT 12.1: the held sessions' ids of a shared worker ([] when not shared). */
  get heldSessions(): number[] {
    return this.#table?.ids() ?? [];
  }

  /**
   * CONTRACT 12.1 "Idle sessions": drops the held sessions idle for `sessionIdleMs` (a shared
   * worker's timer calls it; HELLOs sweep too). No-op when not shared.
   */
  sweepIdle(): void {
    this.#table?.sweep();
  }

  /**
   * Prometheus text of the per-client counters of a shared worker (labelled by `client_name`,
   * bounded cardinality), for a metrics endpoint's extra text; "" when not shared. Never part of
   * STATS (CONTRACT 12.1 isolation).
   */
  clientMetricsText(): string {
    return this.#table?.clientMetricsText() ?? "";
  }

  /** The current session id (0: none; in a shared worker the session held longest). */
  get currentSession(): number {
    if (this.#table !== null) return this.#table.ids()[0] ?? 0;
    return this.#session.id;
  }

  /**
   * True when `conn` is bound to the current session by an OK HELLO on it (CONTRACT 6.2); in a
   * shared worker, to any held session (12.1).
   */
  isBound(conn: FrameConn): boolean {
    if (this.#table !== null) return this.#table.boundTo(conn) !== null;
    return this.#session.isBound(conn);
  }

  /** Forgets a closed connection (its binding, if any). */
  connectionClosed(conn: FrameConn): void {
    if (this.#table !== null) this.#table.connectionClosed(conn);
    else this.#session.forget(conn);
  }

  /**
   * Handles one request message that arrived on `conn` and returns the reply message (a view
   * valid until the next reply but one). STEP and RESET are accepted only on a connection bound
   * by an OK HELLO of the current session (CONTRACT 6.2); `conn` is that connection's identity,
   * and its optional hooks hear of binding. Without `conn` every call is on one implicit
   * connection. A function as `conn` is the older form: the implicit connection, with the
   * function called when the header is unreadable. When the header is unreadable (CONTRACT 4)
   * the reply is BAD_FRAME and `conn.closeAfterReply()` is called.
   */
  handle(
    msg: Uint8Array,
    conn?: FrameConn | (() => void) | null,
    placed?: unknown,
  ): Uint8Array | Promise<Uint8Array> {
    const pl = placed instanceof StepPlacement ? placed : null;
    const id = typeof conn === "function" ? this.#direct : (conn ?? this.#direct);
    const c = typeof conn === "function" ? { closeAfterReply: conn } : id;
    if (this.#table !== null) return this.#handleShared(msg, c, id, pl, this.#table);
    if (this.#tail !== null) {
      const p = this.#tail.then(() => this.#processAny(msg, c, id, pl));
      this.#track(p);
      return p;
    }
    const r = this.#processAny(msg, c, id, pl);
    if (r instanceof Promise) this.#track(r);
    return r;
  }

  /**
   * Compaction between STEPs (docs/worker.md "Compaction between STEPs"): moves, ahead of time,
   * the rows the next append of each slot keeps when that append would reach its buffer's end,
   * so that the next STEP does not copy them. Changes no window; call it in idle time, after a
   * reply was written (the server does). Returns the rows copied.
   */
  prepareWindows(): number {
    if (this.#tail !== null) return 0;
    if (this.#table === null) return this.#store.prepareAppends();
    // CONTRACT 12.1: a shared worker prepares every held session's windows.
    return this.#table.prepareAppends();
  }

  /**
   * Receive placement hook (the transport's `receiveInto`, see docs/worker.md "Rows received in
   * place"): given the first bytes `head` of a request of `length` bytes on `conn`, returns where
   * its rows should be received, a number of head bytes to wait for first, or null (receive it
   * whole, the normal path). Only a STEP on a bound connection of the current session with a
   * newer seq that passes every structural check of CONTRACT 7.2 is placed, and only while no
   * frame is in flight: anything else is declined, so the normal path answers it exactly as
   * before. Each entry's rows go right after its slot's window (the window itself is untouched);
   * {@link handle} with the returned plan then applies them without copying. Never throws.
   */
  placeStep(head: Uint8Array, length: number, conn?: FrameConn | null): StepPlacement | number | null {
    if (this.#table !== null) return this.#placeShared(head, length, conn ?? this.#direct, this.#table);
    if (this.#tail !== null) return null;
    try {
      return this.#placer.place(head, length, conn ?? this.#direct);
    } catch (e) {
      this.#log.warn({ err: String(e) }, "receive placement declined");
      return null;
    }
  }

  /**
   * The answer to a message refused before it was buffered because its length prefix is above
   * what an unbound connection may send (CONTRACT 11 "Before HELLO"): `head` is its first
   * `min(24, declaredLength)` bytes. A readable header (magic, and `body_len` matching the
   * prefix) of a STEP or RESET is answered NO_SESSION (the connection is not bound, 6.2: a client
   * whose session was taken over reconnects instead of being disabled), of anything else
   * TOO_LARGE, each echoing op, seq and session; no readable header: null (just close). The
   * transport closes the connection either way. Never throws.
   */
  oversizeReply(head: Uint8Array, declaredLength: number): Uint8Array | null {
    const m = this.#m;
    m.oversizeUnbound.inc();
    const h = peekHeader(head);
    if (h === null || h.magic !== MAGIC_U32 || h.bodyLen !== declaredLength - APP_HEADER_SIZE) return null;
    m.frames[OP_KEYS[h.op] ?? "unknown"]!.inc();
    const status = h.op === Op.STEP || h.op === Op.RESET ? FrameStatus.NO_SESSION : FrameStatus.TOO_LARGE;
    return this.#small(h.op, status, h.seq, h.session);
  }

  /**
   * Test hook: a copy of a slot's generation and window (see README "Test hooks"); in a shared
   * worker, of the held session `session` (CONTRACT 12.1: each session has its own slots).
   */
  debugWindow(slot: number, session?: number): WindowSnapshot {
    if (!Number.isInteger(slot) || slot < 0 || slot >= this.maxSlots) {
      throw new WorkerError("WORKER_BAD_OPTION", `slot ${slot} outside 0..${this.maxSlots - 1}`);
    }
    if (this.#table !== null) {
      const h = this.#table.find(session ?? this.currentSession);
      if (h === null) throw new WorkerError("WORKER_BAD_OPTION", `session ${String(session)} is not held`);
      return h.store.debugWindow(slot);
    }
    return this.#store.debugWindow(slot);
  }

  /**
   * The worker's stats snapshot: what STATS answers (CONTRACT 10). With `{ bound: false }` (STATS
   * on a connection not bound to the current session) it holds neither the session id nor its
   * seq.
   */
  stats(options?: { bound?: boolean }): Record<string, unknown> {
    if (this.#table !== null) return this.#sharedStats(null, this.#table);
    const s = this.#session;
    const showSession = options?.bound !== false;
    return {
      name: this.name,
      ...(showSession
        ? {
            session: s.id,
            session_hex: `0x${s.id.toString(16).padStart(8, "0")}`,
            highest_seq: s.highestSeq,
          }
        : {}),
      windows_held: this.#store.windowsHeld,
      slot_bytes: this.#store.bytesAllocated,
      bound_connections: s.boundConnections,
      limits: {
        max_slots: this.maxSlots,
        max_rows_per_step: this.maxRowsPerStep,
        window: this.drafter.window,
        num_spec: this.drafter.numSpec,
        row_bytes: this.rowBytes,
        vocab_size: this.drafter.vocabSize,
        max_message_bytes: this.maxMessageBytes,
      },
      ...this.registry.snapshot(),
    };
  }

  /**
   * CONTRACT 12.1 STATS: a bound connection sees its own session (id, seq, slots, counters) and
   * worker-wide totals; an unbound one (or `conn` null: the local snapshot) no session id or seq.
   */
  #sharedStats(conn: FrameConn | null, t: SessionTable): Record<string, unknown> {
    const own = conn === null ? null : t.sessionStats(conn);
    return {
      name: this.name,
      shared: true,
      ...(own ?? {}),
      worker: t.totals(),
      limits: {
        max_slots: this.maxSlots,
        max_rows_per_step: this.maxRowsPerStep,
        window: this.drafter.window,
        num_spec: this.drafter.numSpec,
        row_bytes: this.rowBytes,
        vocab_size: this.drafter.vocabSize,
        max_message_bytes: this.maxMessageBytes,
        max_sessions: this.maxSessions,
      },
      ...this.registry.snapshot(),
    };
  }

  /**
   * A shared worker's frames (CONTRACT 12.1): each held session's frames are processed one at a
   * time in order (its STEPs, RESETs and re-HELLOs wait for its frame in flight), while other
   * sessions' frames go on, so their STEPs can meet in one drafter call (batcher.ts).
   */
  #handleShared(
    msg: Uint8Array,
    conn: FrameConn,
    id: FrameConn,
    placed: StepPlacement | null,
    t: SessionTable,
  ): Uint8Array | Promise<Uint8Array> {
    const arrival = performance.now();
    let key: HeldSession | null = null;
    if (placed !== null) key = this.#placedBy.get(placed) ?? null;
    else if (msg.length >= APP_HEADER_SIZE) {
      const op = msg[6];
      if (op === Op.STEP || op === Op.RESET) key = t.boundTo(id);
      else if (op === Op.HELLO) {
        key = t.find((msg[12]! | (msg[13]! << 8) | (msg[14]! << 16) | (msg[15]! << 24)) >>> 0);
      }
    }
    if (key === null || key.tail === null) {
      const r = this.#processShared(msg, conn, id, placed, arrival, t);
      if (r instanceof Promise && key !== null) this.#trackHeld(key, r);
      return r;
    }
    return this.#afterTail(key, key.tail, msg, conn, id, placed, arrival, t);
  }

  /**
   * A frame of a session with a frame in flight: processed after it. Its own method, so that
   * {@link #handleShared} creates no closure (and no context for one) per frame.
   */
  #afterTail(
    key: HeldSession,
    tail: Promise<unknown>,
    msg: Uint8Array,
    conn: FrameConn,
    id: FrameConn,
    placed: StepPlacement | null,
    arrival: number,
    t: SessionTable,
  ): Promise<Uint8Array> {
    const p = tail.then(() => this.#processShared(msg, conn, id, placed, arrival, t));
    this.#trackHeld(key, p);
    return p;
  }

  #trackHeld(h: HeldSession, p: Promise<unknown>): void {
    const settled = p.then(
      () => undefined,
      () => undefined,
    );
    h.tail = settled;
    void settled.then(() => {
      if (h.tail === settled) h.tail = null;
    });
  }

  #processShared(
    msg: Uint8Array,
    conn: FrameConn,
    id: FrameConn,
    placed: StepPlacement | null,
    arrival: number,
    t: SessionTable,
  ): Uint8Array | Promise<Uint8Array> {
    if (placed === null) return this.#process(msg, conn, id, arrival);
    const h = this.#placedBy.get(placed);
    try {
      this.#m.bytesIn.inc(placed.length);
      this.#m.frames.step!.inc();
      const body = msg.subarray(APP_HEADER_SIZE);
      if (h === undefined || !h.held || t.boundTo(id) !== h) {
        return this.#small(Op.STEP, FrameStatus.NO_SESSION, placed.seq, placed.session);
      }
      return this.#countedStep(h, t, placed.seq, placed.session, body, placed, id, arrival);
    } catch (e) {
      return this.#internal(msg, e);
    } finally {
      if (!placed.consumed && h !== undefined) h.placer.cancel(placed);
    }
  }

  /** A STEP of a held session, counted for the per-client metrics once answered. */
  #countedStep(
    h: HeldSession,
    t: SessionTable,
    seq: number,
    session: number,
    body: Uint8Array,
    placed: StepPlacement | null,
    id: FrameConn,
    arrival: number,
  ): Uint8Array | Promise<Uint8Array> {
    const steps = h.steps.steps;
    const entries = h.steps.entries;
    const r = h.steps.run(seq, session, body, placed, id, arrival);
    if (r instanceof Promise) return this.#countedLater(r, h, t, steps, entries);
    if (h.steps.steps !== steps) t.countStep(h, h.steps.entries - entries);
    return r;
  }

  /** {@link #countedStep} of an asynchronous STEP (no closure on the synchronous path). */
  #countedLater(
    r: Promise<Uint8Array>,
    h: HeldSession,
    t: SessionTable,
    steps: number,
    entries: number,
  ): Promise<Uint8Array> {
    return r.then((v) => {
      if (h.steps.steps !== steps) t.countStep(h, h.steps.entries - entries);
      return v;
    });
  }

  #placeShared(
    head: Uint8Array,
    length: number,
    conn: FrameConn,
    t: SessionTable,
  ): StepPlacement | number | null {
    try {
      const h = t.boundTo(conn);
      if (h === null || h.tail !== null) return null;
      const r = h.placer.place(head, length, conn);
      if (r instanceof StepPlacement) this.#placedBy.set(r, h);
      return r;
    } catch (e) {
      this.#log.warn({ err: String(e) }, "receive placement declined");
      return null;
    }
  }

  #track(p: Promise<unknown>): void {
    const settled = p.then(
      () => undefined,
      () => undefined,
    );
    this.#tail = settled;
    void settled.then(() => {
      if (this.#tail === settled) this.#tail = null;
    });
  }

  #processAny(
    msg: Uint8Array,
    conn: FrameConn,
    id: FrameConn,
    placed: StepPlacement | null,
  ): Uint8Array | Promise<Uint8Array> {
    if (placed === null) return this.#process(msg, conn, id);
    try {
      // A STEP received in place: `msg` is its first `headBytes` bytes, checked by placeStep.
      this.#m.bytesIn.inc(placed.length);
      this.#m.frames.step!.inc();
      return this.#steps.run(placed.seq, placed.session, msg.subarray(APP_HEADER_SIZE), placed, id);
    } catch (e) {
      return this.#internal(msg, e);
    } finally {
      if (!placed.consumed) this.#placer.cancel(placed);
    }
  }

  #process(
    msg: Uint8Array,
    conn: FrameConn,
    id: FrameConn,
    arrival?: number,
  ): Uint8Array | Promise<Uint8Array> {
    const t = this.#table;
    const m = this.#m;
    m.bytesIn.inc(msg.length);
    try {
      const n = msg.length;
      // CONTRACT 4: an unreadable header is BAD_FRAME echoing what is wholly present, then close.
      if (!headerReadable(msg, n)) {
        m.frames.unreadable!.inc();
        m.badHeaders.inc();
        const p = partialHeader(msg);
        conn.closeAfterReply?.();
        return this.#small(p.op, FrameStatus.BAD_FRAME, p.seq, p.session);
      }
      let h: { op: number; seq: number; session: number };
      try {
        h = decodeHeader(msg, n, { request: true });
      } catch (e) {
        const p = partialHeader(msg);
        m.frames[OP_KEYS[p.op] ?? "unknown"]!.inc();
        return this.#small(p.op, statusOf(e), p.seq, p.session);
      }
      const body = msg.subarray(APP_HEADER_SIZE);
      m.frames[OP_KEYS[h.op] ?? "unknown"]!.inc();
      switch (h.op) {
        case Op.HELLO:
          if (t !== null) return t.hello(h.seq, h.session, body, id);
          return this.#session.hello(h.seq, h.session, body, id);
        case Op.STEP: {
          if (t === null) return this.#steps.run(h.seq, h.session, body, null, id);
          // CONTRACT 12.1: a STEP acts on the session its connection is bound to.
          const held = t.boundTo(id);
          if (held === null) return this.#small(h.op, FrameStatus.NO_SESSION, h.seq, h.session);
          return this.#countedStep(held, t, h.seq, h.session, body, null, id, arrival ?? performance.now());
        }
        case Op.PING:
          // CONTRACT 10: any session; touches no session state.
          if (body.length > PING_MAX_BODY) return this.#small(h.op, FrameStatus.TOO_LARGE, h.seq, h.session);
          return this.#small(h.op, FrameStatus.OK, h.seq, h.session, body);
        case Op.STATS: {
          if (body.length > STATS_MAX_BODY) return this.#small(h.op, FrameStatus.TOO_LARGE, h.seq, h.session);
          // CONTRACT 10 (1.1): an unbound connection learns neither the session id nor its seq;
          // 12.1: a bound one of a shared worker learns its own session's only.
          const snap =
            t !== null ? this.#sharedStats(id, t) : this.stats({ bound: this.#session.isBound(id) });
          const json = Buffer.from(JSON.stringify(snap), "utf8");
          return this.#small(h.op, FrameStatus.OK, h.seq, h.session, json);
        }
        case Op.RESET:
          if (t !== null) return t.reset(h.seq, h.session, body, id);
          return this.#session.reset(h.seq, h.session, body, id);
        default:
          return this.#small(h.op, FrameStatus.UNKNOWN_OP, h.seq, h.session);
      }
    } catch (e) {
      return this.#internal(msg, e);
    }
  }

  #internal(msg: Uint8Array, e: unknown): Uint8Array {
    this.#m.internal.inc();
    this.#log.error({ err: e }, "internal error handling a frame");
    const p = partialHeader(msg);
    return this.#small(p.op, FrameStatus.INTERNAL, p.seq, p.session);
  }

  #small(op: number, status: number, seq: number, session: number, body?: Uint8Array): Uint8Array {
    return smallReply(this.#m, op, status, seq, session, body);
  }
}
