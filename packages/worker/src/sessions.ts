import type { Counter, Gauge, Registry } from "@tapwire/stats";
import type { Hello } from "@tapwire/wire";
import { FrameStatus, Op, serialNewer } from "@tapwire/wire";
import type { Batcher, SharedBatcher } from "./batcher.js";
import type { CoreMetrics } from "./metrics.js";
import type { CoreConfig } from "./options.js";
import { Placer } from "./placement.js";
import { smallReply } from "./reply.js";
import type { FrameConn } from "./session.js";
import { Session } from "./session.js";
import { StepRunner } from "./step.js";
import { WindowStore } from "./window-store.js";

/** Why a held session was dropped (CONTRACT 12.1), the label of `sessions_dropped_<reason>`. */
export const DropReason = {
  /** Droppable, and dropped to admit another session's HELLO. */
  ADMISSION: "admission",
  /** Its idle time reached `session_idle_ms`. */
  IDLE: "idle",
} as const;
/** One of {@link DropReason}. */
export type DropReason = (typeof DropReason)[keyof typeof DropReason];

/** Most distinct `client_name` values given their own per-client metrics (the rest: "other"). */
export const MAX_CLIENT_LABELS = 32;

/**
 * @internal One session held by a shared worker (CONTRACT 12.1): its own slots and windows, seq,
 * limits, lease and bound connections (a {@link Session} over its own {@link WindowStore}), its
 * STEP runner and placer, its reservation, and the tail of its frames (they are processed one at
 * a time, in order, like the frames of a 1.1 worker).
 */
export class HeldSession {
  readonly session: Session;
  readonly store: WindowStore;
  readonly steps: StepRunner;
  readonly placer: Placer;
  /** `max_slots * W * row_bytes` of its HELLO (CONTRACT 12.1 "Admission"). */
  reservation = 0;
  /** `client_name` of its last HELLO. */
  clientName = "";
  /** RESETs answered OK. */
  resets = 0;
  /** The last frame of this session still being processed (null: none). */
  tail: Promise<void> | null = null;
  /** False once dropped. */
  held = true;
  /** Its door into the shared batcher (CONTRACT 12.1 batching; the batch gather awaits it). */
  readonly port: Batcher;

  constructor(cfg: CoreConfig, metrics: CoreMetrics, batcher: SharedBatcher) {
    this.store = new WindowStore(cfg.maxSlots, cfg.drafter.window, cfg.rowBytes, cfg.slotBufferWindows);
    this.session = new Session(cfg, this.store, metrics);
    this.placer = new Placer(cfg, this.store, this.session, metrics);
    this.port = batcher.port();
    this.steps = new StepRunner(cfg, this.store, this.session, metrics, this.port);
  }

  /** The session id (0 once dropped). */
  get id(): number {
    return this.session.id;
  }
}

/** @internal Counters of the session table (docs/worker.md "Shared workers"). */
interface TableMetrics {
  readonly held: Gauge;
  readonly reserved: Gauge;
  readonly admitted: Counter;
  readonly busy: Counter;
  readonly dropped: Readonly<Record<DropReason, Counter>>;
}

function tableMetrics(r: Registry): TableMetrics {
  return {
    held: r.gauge("sessions_held", "sessions held by the shared worker (CONTRACT 12.1)"),
    reserved: r.gauge("window_bytes_reserved", "window bytes reserved by held sessions (CONTRACT 12.1)"),
    admitted: r.counter(
      "sessions_admitted",
      "HELLOs of a session not held that were admitted (CONTRACT 12.1)",
    ),
    busy: r.counter(
      "sessions_refused_busy",
      "HELLOs refused BUSY: no seat or reservation room (CONTRACT 12.1)",
    ),
    dropped: {
      admission: r.counter(
        "sessions_dropped_admission",
        "droppable sessions dropped to admit another (CONTRACT 12.1)",
      ),
      idle: r.counter("sessions_dropped_idle", "sessions dropped after session_idle_ms (CONTRACT 12.1)"),
    },
  };
}

/** Per-client counters for the metrics endpoint, labelled by `client_name` (bounded). */
interface ClientCounters {
  rounds: number;
  entries: number;
}

function promLabel(v: string): string {
  return v.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
}

/**
 * @internal The sessions of a shared worker (CONTRACT 12.1): admission against `max_sessions`
 * and `max_window_bytes`, dropping droppable sessions idle longest first (the whole plan decided
 * before anything is dropped, a BUSY changing nothing), idle drops after `session_idle_ms`, the
 * binding of each connection to one held session, and STATS isolation. A state machine over an
 * injected clock: `cfg.now`.
 */
export class SessionTable {
  readonly #cfg: CoreConfig;
  readonly #m: CoreMetrics;
  readonly #tm: TableMetrics;
  readonly #batcher: SharedBatcher;
  readonly #held: HeldSession[] = [];
  readonly #byConn = new Map<FrameConn, HeldSession>();
  // Checks HELLOs (CONTRACT 6.1); reads configuration only.
  readonly #checker: Session;
  readonly #clients = new Map<string, ClientCounters>();
  #reserved = 0;
  readonly #prefix: string;

  constructor(cfg: CoreConfig, metrics: CoreMetrics, batcher: SharedBatcher) {
    this.#cfg = cfg;
    this.#m = metrics;
    this.#tm = tableMetrics(cfg.registry);
    this.#batcher = batcher;
    this.#checker = new Session(cfg, new WindowStore(1, cfg.drafter.window, cfg.rowBytes), metrics);
    this.#prefix = cfg.registry.prefix;
  }

  /** Sessions held. */
  get size(): number {
    return this.#held.length;
  }

  /** Window bytes reserved by the held sessions. */
  get reserved(): number {
    return this.#reserved;
  }

  /** The held sessions' ids, oldest admitted first (tests, the bin's log). */
  ids(): number[] {
    return this.#held.map((h) => h.id);
  }

  /**
   * Compaction between STEPs of every held session ({@link WindowStore.prepareAppends}): the rows
   * copied. Allocates nothing (it runs after every answered frame).
   */
  prepareAppends(): number {
    let rows = 0;
    for (let i = 0; i < this.#held.length; i++) rows += this.#held[i]!.store.prepareAppends();
    return rows;
  }

  /** The held session of id `id`, or null. */
  find(id: number): HeldSession | null {
    if (id === 0) return null;
    for (const h of this.#held) if (h.id === id) return h;
    return null;
  }

  /** The held session `conn` is bound to (CONTRACT 12.1), or null. */
  boundTo(conn: FrameConn): HeldSession | null {
    const h = this.#byConn.get(conn);
    if (h === undefined) return null;
    if (!h.held || !h.session.isBound(conn)) return null;
    // CONTRACT 12.1 "Idle sessions": dropped when its idle time reaches session_idle_ms, whether
    // or not the sweep timer has run yet.
    if (this.#cfg.now() - h.session.lastOkAt >= this.#cfg.sessionIdleMs) {
      this.#drop(h, DropReason.IDLE);
      return null;
    }
    return h;
  }

  /** A closed connection: forgotten by its session (which may become droppable). */
  connectionClosed(conn: FrameConn): void {
    const h = this.#byConn.get(conn);
    if (h === undefined) return;
    this.#byConn.delete(conn);
    h.session.forget(conn);
    // No connection left: it sends no STEP soon, so the batch gather does not wait for it.
    if (h.session.boundConnections === 0) h.port.leave();
  }

  /** `max_slots * W * row_bytes` of a HELLO. */
  #reservationOf(h: Hello): number {
    return h.maxSlots * this.#cfg.drafter.window * this.#cfg.rowBytes;
  }

  /** CONTRACT 12.1 "Words": live = an open bound connection and idle time below the lease. */
  live(h: HeldSession, now: number): boolean {
    return h.session.boundConnections > 0 && now - h.session.lastOkAt < this.#cfg.leaseMs;
  }

  /** CONTRACT 12.1 "Idle sessions": drops every held session idle for `session_idle_ms`. */
  sweep(now = this.#cfg.now()): void {
    for (let i = this.#held.length - 1; i >= 0; i--) {
      const h = this.#held[i]!;
      if (now - h.session.lastOkAt >= this.#cfg.sessionIdleMs) this.#drop(h, DropReason.IDLE);
    }
  }

  /**
   * The drop plan of an admission (CONTRACT 12.1): droppable sessions other than `keep`, idle
   * longest first, as few as needed so that `seat` more sessions fit below `max_sessions` and
   * `bytes` of reservations (with `keep`'s own counted free) fit `max_window_bytes`; null when no
   * plan admits the HELLO (BUSY). Decides only: nothing is dropped here.
   */
  plan(bytes: number, seat: boolean, keep: HeldSession | null, now: number): HeldSession[] | null {
    const cfg = this.#cfg;
    let count = this.#held.length + (seat ? 1 : 0);
    let need = this.#reserved - (keep?.reservation ?? 0) + bytes;
    const fits = (): boolean => count <= cfg.maxSessions && need <= cfg.maxWindowBytes;
    if (fits()) return [];
    const cand = this.#held
      .filter((h) => h !== keep && !this.live(h, now))
      .sort((a, b) => a.session.lastOkAt - b.session.lastOkAt);
    const drops: HeldSession[] = [];
    for (const h of cand) {
      drops.push(h);
      count--;
      need -= h.reservation;
      if (fits()) return drops;
    }
    return null;
  }

  /** CONTRACT 6.1 then 12.1 admission, then 6.2 per session (seq, binding). */
  hello(seq: number, session: number, body: Uint8Array, conn: FrameConn): Uint8Array {
    const cfg = this.#cfg;
    const checked = this.#checker.checkHello(seq, session, body, (h) => {
      const r = this.#reservationOf(h);
      return r > cfg.maxWindowBytes
        ? `reservation ${r} bytes > max_window_bytes ${cfg.maxWindowBytes}`
        : null;
    });
    if (checked instanceof Uint8Array) return checked;
    const now = cfg.now();
    this.sweep(now);
    const bytes = this.#reservationOf(checked);
    let target = this.find(session);
    if (target !== null && !serialNewer(seq, target.session.highestSeq)) {
      return smallReply(this.#m, Op.HELLO, FrameStatus.STALE_SEQ, seq, session);
    }
    const plan = this.plan(bytes, target === null, target, now);
    if (plan === null) {
      this.#tm.busy.inc();
      cfg.log.info(
        { asked: session, held: this.#held.length, reserved: this.#reserved, client: checked.clientName },
        "HELLO refused: BUSY (no droppable session makes room)",
      );
      return smallReply(this.#m, Op.HELLO, FrameStatus.BUSY, seq, session);
    }
    // Admitted: allocate and answer first (an allocation failure answers INTERNAL, nothing dropped).
    const fresh = target === null;
    if (target === null) target = new HeldSession(cfg, this.#m, this.#batcher);
    const reply = target.session.commitHello(checked, seq, session, conn);
    const prev = this.#byConn.get(conn);
    if (prev !== undefined && prev !== target) prev.session.forget(conn);
    for (const h of plan) this.#drop(h, DropReason.ADMISSION);
    this.#byConn.set(conn, target);
    this.#reserved += bytes - target.reservation;
    target.reservation = bytes;
    target.clientName = checked.clientName;
    if (fresh) {
      this.#held.push(target);
      this.#tm.admitted.inc();
    }
    this.#gauges();
    return reply;
  }

  /** CONTRACT 12.1: RESET drops the slot state of the connection's session only. */
  reset(seq: number, session: number, body: Uint8Array, conn: FrameConn): Uint8Array {
    const h = this.boundTo(conn);
    if (h === null) return smallReply(this.#m, Op.RESET, FrameStatus.NO_SESSION, seq, session);
    const r = h.session.reset(seq, session, body, conn);
    if (r[7] === FrameStatus.OK) h.resets++;
    return r;
  }

  /** Counts an answered STEP for the per-client metrics. */
  countStep(h: HeldSession, entries: number): void {
    let key = h.clientName;
    let c = this.#clients.get(key);
    if (c === undefined) {
      if (this.#clients.size >= MAX_CLIENT_LABELS) key = "other";
      c = this.#clients.get(key);
      if (c === undefined) {
        c = { rounds: 0, entries: 0 };
        this.#clients.set(key, c);
      }
    }
    c.rounds++;
    c.entries += entries;
  }

  /**
   * Per-client Prometheus text (STEPs and entries labelled by `client_name`, at most
   * {@link MAX_CLIENT_LABELS} values plus "other"): for the metrics endpoint only, never STATS
   * (CONTRACT 12.1 isolation).
   */
  clientMetricsText(): string {
    const p = this.#prefix;
    const lines = [
      `# HELP ${p}client_rounds_total STEPs answered OK per client_name (CONTRACT 12.1; bounded labels)`,
      `# TYPE ${p}client_rounds_total counter`,
    ];
    for (const [k, c] of this.#clients)
      lines.push(`${p}client_rounds_total{client="${promLabel(k)}"} ${c.rounds}`);
    lines.push(
      `# HELP ${p}client_entries_total STEP entries answered OK per client_name (CONTRACT 12.1; bounded labels)`,
      `# TYPE ${p}client_entries_total counter`,
    );
    for (const [k, c] of this.#clients)
      lines.push(`${p}client_entries_total{client="${promLabel(k)}"} ${c.entries}`);
    return `${lines.join("\n")}\n`;
  }

  /**
   * CONTRACT 12.1 "Isolation": on a connection bound to a held session, that session's id, seq,
   * slots and counters; always the worker-wide totals; never another session's anything.
   */
  sessionStats(conn: FrameConn): Record<string, unknown> | null {
    const h = this.boundTo(conn);
    if (h === null) return null;
    const s = h.session;
    return {
      session: s.id,
      session_hex: `0x${s.id.toString(16).padStart(8, "0")}`,
      highest_seq: s.highestSeq,
      client_name: h.clientName,
      windows_held: h.store.windowsHeld,
      slot_bytes: h.store.bytesAllocated,
      bound_connections: s.boundConnections,
      reservation_bytes: h.reservation,
      steps: h.steps.steps,
      entries: h.steps.entries,
      entries_drafted: h.steps.drafted,
      resets: h.resets,
      limits:
        s.limits === null
          ? null
          : { max_slots: s.limits.maxSlots, max_rows_per_step: s.limits.maxRowsPerStep },
    };
  }

  /** Worker-wide totals of the table (CONTRACT 12.1 STATS: allowed on every connection). */
  totals(): Record<string, unknown> {
    let windows = 0;
    let bytes = 0;
    for (const h of this.#held) {
      windows += h.store.windowsHeld;
      bytes += h.store.bytesAllocated;
    }
    return {
      max_sessions: this.#cfg.maxSessions,
      sessions_held: this.#held.length,
      max_window_bytes: this.#cfg.maxWindowBytes,
      window_bytes_reserved: this.#reserved,
      windows_held: windows,
      slot_bytes: bytes,
      batch_queued: this.#batcher.queued,
      batch_awaited: this.#batcher.awaited,
    };
  }

  #drop(h: HeldSession, reason: DropReason): void {
    const i = this.#held.indexOf(h);
    if (i < 0) return;
    this.#held.splice(i, 1);
    for (const c of h.session.boundList()) this.#byConn.delete(c);
    this.#cfg.log.info(
      {
        session: h.id,
        client: h.clientName,
        reason,
        idleMs: Math.round(this.#cfg.now() - h.session.lastOkAt),
      },
      "session dropped",
    );
    h.session.drop();
    h.port.leave();
    h.held = false;
    this.#reserved -= h.reservation;
    h.reservation = 0;
    this.#tm.dropped[reason].inc();
    this.#gauges();
  }

  #gauges(): void {
    this.#tm.held.set(this.#held.length);
    this.#tm.reserved.set(this.#reserved);
  }
}
