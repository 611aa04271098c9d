import type { Counter, Histogram } from "@tapwire/stats";
import { Registry } from "@tapwire/stats";
import type {
  EntryValueContext,
  Hello,
  HelloReply,
  StepLimits,
  StepReplyViews,
  StepRequest,
} from "@tapwire/wire";
import {
  APP_HEADER_SIZE,
  beginStepReply,
  Capability,
  decodeHeader,
  decodeHello,
  decodeStepHead,
  decodeStepRequest,
  EntryFlag,
  encodeHeader,
  encodeHelloReply,
  entryValueProblem,
  FRAME_STATUS_NAMES,
  FrameStatus,
  HELLO_BODY_SIZE,
  HELLO_FLAGS_MASK,
  HELLO_REPLY_BODY_SIZE,
  HelloFlag,
  headerReadable,
  maxStepBodySize,
  OP_NAMES,
  Op,
  PING_MAX_BODY,
  partialHeader,
  peekHeader,
  peekRequestHeader,
  peekStepPrefix,
  REQ_STATUS_NAMES,
  ReqStatus,
  RowDtype,
  rowsOffsetFor,
  SampleMode,
  STATS_MAX_BODY,
  STEP_PREFIX_SIZE,
  serialNewer,
  setReplyWorkerUs,
  stepReplyBodySize,
  TOP_K_MAX,
  verifyHelloAuth,
  WireError,
} from "@tapwire/wire";
import type { DraftBatchEntry, Drafter, DraftOutput } from "./drafter.js";
import { checkDrafter } from "./drafter.js";
import { WorkerError } from "./errors.js";
import type { WindowSnapshot } from "./window-store.js";
import { GenerationCheck, WindowStore } from "./window-store.js";

/** Minimal logger shape (pino's). */
export interface WorkerLogger {
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
  debug(obj: object, msg?: string): void;
}

/** Session takeover policy (CONTRACT 6.2). */
export const Takeover = { ALLOW: "allow", REFUSE: "refuse" } as const;
export type Takeover = (typeof Takeover)[keyof typeof Takeover];

/** Options of {@link WorkerCore}. */
export interface WorkerCoreOptions {
  /** The drafting backend; its identities and geometry are what HELLOs must match. */
  drafter: Drafter;
  /** Largest `max_slots` a session may ask (default 256). */
  maxSlots?: number;
  /** Largest `max_rows_per_step` a session may ask (default 4096). */
  maxRowsPerStep?: number;
  /** Shared token: when set, a HELLO without the right auth is UNAUTHORIZED (CONTRACT 6.1, 11). */
  token?: string | Uint8Array | null;
  /** `refuse`: a HELLO of another session while the current one is leased is BUSY (default `allow`). */
  takeover?: Takeover;
  /** Lease of the current session after its last OK frame, in ms (default 10 000). */
  sessionLease?: number;
  /** `worker_name` of the HelloReply (default "tapwire-worker", at most 32 UTF-8 bytes). */
  name?: string;
  /** Stats registry (default a new one with prefix `tapwire_worker_`). */
  registry?: Registry;
  /** Logger (default silent). */
  logger?: WorkerLogger | null;
  /** Monotonic clock in ms for the session lease (default `performance.now`). */
  now?: () => number;
  /**
   * A slot's row buffer holds up to this many windows (2..16, default 4). The last W rows stay
   * contiguous by compacting when the buffer end is reached; more windows mean fewer
   * compactions (cheaper multi-row appends) for more memory.
   */
  slotBufferWindows?: number;
}

/**
 * A STEP whose rows are being received in place (see {@link WorkerCore.placeStep}): the plan
 * handed to the transport (`headBytes`, `segments`, the shape of `@tapwire/transport`'s
 * `ReceivePlan`) plus, per entry, where its rows go in the slot's buffer and the slot version
 * the placement made.
 */
export class StepPlacement {
  /** The frame's first bytes the transport keeps: header, prefix, sample meta, entries, padding. */
  readonly headBytes: number;
  /** Destinations of the rows, in entry order: views of slot buffers right after the windows. */
  readonly segments: Uint8Array[] = [];
  /** The whole frame's length (24 + body_len). */
  readonly length: number;
  /** Per entry: buffer row of its placed rows, or -1 (no rows). */
  readonly rows: Int32Array;
  /** Per entry: the slot version of the placement. */
  readonly versions: Float64Array;
  /** Per entry: the slot (valid where `rows[i] >= 0`). */
  readonly slots: Uint32Array;
  /** The apply step took over the placements (else they are cancelled once the frame is answered). */
  consumed = false;
  /** The head as decoded at placement, and the session limits it was checked against. */
  readonly req: StepRequest;
  readonly limits: StepLimits;

  constructor(headBytes: number, length: number, req: StepRequest, limits: StepLimits) {
    const nReq = req.nReq;
    this.req = req;
    this.limits = limits;
    this.headBytes = headBytes;
    this.length = length;
    this.rows = new Int32Array(nReq).fill(-1);
    this.versions = new Float64Array(nReq);
    this.slots = new Uint32Array(nReq);
  }
}

/** A connection as the core sees it: something it can close after an unreadable header. */
export interface FrameConn {
  close(): void;
}

/** A reply of {@link WorkerCore.handle}; `close` asks the transport to close after sending it. */
export type FrameReply = Uint8Array;

const DEFAULT_MAX_SLOTS = 256;
const DEFAULT_MAX_ROWS_PER_STEP = 4096;
const DEFAULT_LEASE_MS = 10_000;
const U32_MAX = 0xffffffff;

/** Metric-name keys of a wire name table, indexed by code: `FRAME_STATUS_NAMES` → "no_session", ... */
function metricKeys(names: Readonly<Record<number, string>>): string[] {
  const out: string[] = [];
  for (let code = 0; names[code] !== undefined; code++) out.push(names[code]!.toLowerCase());
  return out;
}
const REQ_STATUS_KEYS = metricKeys(REQ_STATUS_NAMES);
const FRAME_STATUS_KEYS = metricKeys(FRAME_STATUS_NAMES);
const OP_KEYS: Readonly<Record<number, string>> = Object.fromEntries(
  Object.values(Op).map((op) => [op, OP_NAMES[op]!.toLowerCase()]),
);

const silentLogger: WorkerLogger = { info() {}, warn() {}, error() {}, debug() {} };

function optInt(name: string, v: number | undefined, dflt: number, lo: number, hi: number): number {
  const x = v ?? dflt;
  if (typeof x !== "number" || !Number.isInteger(x) || x < lo || x > hi) {
    throw new WorkerError(
      "WORKER_BAD_OPTION",
      `option ${name} ${String(x)} is not an integer in ${lo}..${hi}`,
    );
  }
  return x;
}

function bytesEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

function hex(b: Uint8Array): string {
  return Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString("hex");
}

/** Session parameters fixed by the HELLO that opened or renewed it (CONTRACT 6.2). */
interface SessionShape {
  maxSlots: number;
  maxRowsPerStep: number;
  sampled: boolean;
  margin: boolean;
}

/** A session shape with its limits and (when they change) freshly allocated reply buffers. */
interface PreparedShape {
  shape: SessionShape;
  limits: StepLimits;
  maxBody: number;
  /** null: keep the current reply buffers. */
  replyBufs: [Uint8Array, Uint8Array] | null;
}

/** A 4-aligned reply buffer of a session (CONTRACT 2: aligned views). */
function alignedBuffer(bytes: number): Uint8Array {
  return new Uint8Array(new ArrayBuffer(Math.ceil(bytes / 8) * 8));
}

/**
 * The worker's frame handler (CONTRACT 4–8, 10, 11) without sockets: one session, slot windows,
 * batched drafting. `handle()` takes one request message and returns its reply; frames are
 * processed strictly one at a time (an async drafter queues the frames behind it). Never throws
 * for any input: an internal failure is answered INTERNAL.
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
  /** Largest request message the worker can ever accept (24 + the largest STEP body). */
  readonly maxMessageBytes: number;
  private readonly token: string | Uint8Array | null;
  private readonly takeover: Takeover;
  private readonly leaseMs: number;
  private readonly log: WorkerLogger;
  private readonly now: () => number;
  private readonly store: WindowStore;

  // CONTRACT 6.2 session state.
  private session = 0;
  private highestSeq = 0;
  private lastOkAt = Number.NEGATIVE_INFINITY;
  private shape: SessionShape | null = null;
  private limits: StepLimits | null = null;
  private maxBody = 0;
  // Two reply buffers used in turn, so a reply still being written by a transport is never
  // overwritten by the next one.
  private replyBufs: [Uint8Array, Uint8Array] | null = null;
  private replyTurn = 0;
  // What entryValueProblem reads of the STEP being answered (CONTRACT 6.3, 8).
  private readonly valueCtx: EntryValueContext = { vocabSize: 0, entries: [], sampleMeta: null };

  private tail: Promise<void> | null = null;
  private readonly batch: DraftBatchEntry[] = [];
  private readonly batchPool: DraftBatchEntry[] = [];
  // Per entry index: marks of the batch entries (checkDrafted) and the drafter's failures.
  private readonly marks: Uint8Array;
  private readonly failed: Uint8Array;

  private readonly c: {
    frames: Record<string, Counter>;
    replies: Counter[];
    entries: Counter[];
    sessions: Counter;
    takeovers: Counter;
    rowsApplied: Counter;
    rowsPlaced: Counter;
    rowsCopied: Counter;
    stepsPlaced: Counter;
    placementsLost: Counter;
    entriesDrafted: Counter;
    drafterCalls: Counter;
    drafterErrors: Counter;
    drafterBadValues: Counter;
    bytesIn: Counter;
    bytesOut: Counter;
    badHeaders: Counter;
    internal: Counter;
    windowsKept: Counter;
    drafterTime: Histogram;
    stepTime: Histogram;
  };

  constructor(options: WorkerCoreOptions) {
    if (options === null || typeof options !== "object") {
      throw new WorkerError("WORKER_BAD_OPTION", "options must be an object");
    }
    const d = options.drafter;
    if (d === null || typeof d !== "object")
      throw new WorkerError("WORKER_BAD_OPTION", "option drafter is missing");
    checkDrafter(d);
    this.drafter = d;
    this.maxSlots = optInt("maxSlots", options.maxSlots, DEFAULT_MAX_SLOTS, 1, 1 << 20);
    this.maxRowsPerStep = optInt(
      "maxRowsPerStep",
      options.maxRowsPerStep,
      DEFAULT_MAX_ROWS_PER_STEP,
      0,
      U32_MAX,
    );
    this.leaseMs = optInt("sessionLease", options.sessionLease, DEFAULT_LEASE_MS, 0, 2 ** 31 - 1);
    const takeover = options.takeover ?? Takeover.ALLOW;
    if (takeover !== Takeover.ALLOW && takeover !== Takeover.REFUSE) {
      throw new WorkerError(
        "WORKER_BAD_OPTION",
        `option takeover ${String(takeover)} is not "allow" or "refuse"`,
      );
    }
    this.takeover = takeover;
    const token = options.token ?? null;
    if (token !== null && !(typeof token === "string" || token instanceof Uint8Array)) {
      throw new WorkerError("WORKER_BAD_OPTION", "option token must be a string or bytes");
    }
    if (token !== null && token.length === 0)
      throw new WorkerError("WORKER_BAD_OPTION", "option token is empty");
    this.token = token;
    const name = options.name ?? "tapwire-worker";
    if (typeof name !== "string" || Buffer.byteLength(name, "utf8") > 32 || name.includes("\0")) {
      throw new WorkerError("WORKER_BAD_OPTION", "option name must be at most 32 UTF-8 bytes without NUL");
    }
    this.name = name;
    // Duck-typed, not instanceof: a Registry from another copy of @tapwire/stats is fine.
    const reg = options.registry as unknown as Record<string, unknown> | undefined;
    if (
      reg !== undefined &&
      (reg === null ||
        typeof reg !== "object" ||
        typeof reg.counter !== "function" ||
        typeof reg.histogram !== "function" ||
        typeof reg.snapshot !== "function")
    ) {
      throw new WorkerError("WORKER_BAD_OPTION", "option registry must be a @tapwire/stats Registry");
    }
    this.registry = options.registry ?? new Registry({ prefix: "tapwire_worker_" });
    const logger = options.logger ?? null;
    if (logger !== null) {
      for (const m of ["info", "warn", "error", "debug"] as const) {
        if (typeof (logger as unknown as Record<string, unknown>)[m] !== "function") {
          throw new WorkerError("WORKER_BAD_OPTION", `option logger has no ${m}() method`);
        }
      }
    }
    this.log = logger ?? silentLogger;
    if (options.now !== undefined && typeof options.now !== "function") {
      throw new WorkerError("WORKER_BAD_OPTION", "option now must be a function returning ms");
    }
    this.now = options.now ?? (() => performance.now());
    this.rowBytes = d.numTaps * d.hidden * 2;
    this.store = new WindowStore(
      this.maxSlots,
      d.window,
      this.rowBytes,
      optInt("slotBufferWindows", options.slotBufferWindows, 4, 2, 16),
    );
    this.marks = new Uint8Array(this.maxSlots);
    this.failed = new Uint8Array(this.maxSlots);
    this.maxMessageBytes =
      APP_HEADER_SIZE +
      maxStepBodySize({
        sampled: (d.capabilities & Capability.TOP32) !== 0,
        rowBytes: this.rowBytes,
        maxSlots: this.maxSlots,
        maxRowsPerStep: this.maxRowsPerStep,
        numSpec: d.numSpec,
      });

    const r = this.registry;
    const frames: Record<string, Counter> = {};
    for (const k of [...Object.values(OP_KEYS), "unknown", "unreadable"]) {
      frames[k] = r.counter(`frames_${k}`, `request frames with op ${k}`);
    }
    this.c = {
      frames,
      replies: FRAME_STATUS_KEYS.map((k) => r.counter(`replies_${k}`, `replies with frame status ${k}`)),
      entries: REQ_STATUS_KEYS.map((k) => r.counter(`entries_${k}`, `STEP entries answered ${k}`)),
      sessions: r.counter("sessions", "sessions started by a HELLO (CONTRACT 6.2)"),
      takeovers: r.counter("session_takeovers", "sessions that replaced a live session"),
      rowsApplied: r.counter("rows_applied", "tap rows applied to slot windows"),
      rowsPlaced: r.counter(
        "rows_placed",
        "tap rows applied where the transport received them (no copy; part of rows_applied)",
      ),
      rowsCopied: r.counter(
        "rows_copied",
        "tap rows applied by copying them into the window (part of rows_applied)",
      ),
      stepsPlaced: r.counter("steps_placed", "STEP frames whose rows were received into slot buffers"),
      placementsLost: r.counter(
        "placements_lost",
        "placed entries found invalid at apply (another frame changed the slot meanwhile): window dropped, NEED_RESYNC",
      ),
      entriesDrafted: r.counter("entries_drafted", "entries handed to the drafter"),
      drafterCalls: r.counter("drafter_calls", "batched drafter calls"),
      drafterErrors: r.counter("drafter_errors", "drafter calls that threw (batch DRAFT_FAILED)"),
      drafterBadValues: r.counter("drafter_bad_values", "entries whose drafted values broke CONTRACT 6.3/8"),
      bytesIn: r.counter("bytes_in", "request bytes"),
      bytesOut: r.counter("bytes_out", "reply bytes"),
      badHeaders: r.counter(
        "unreadable_headers",
        "frames whose header could not be read (connection closed)",
      ),
      internal: r.counter(
        "internal_errors",
        "unexpected internal failures: frames answered INTERNAL, or entries failed inside an applied STEP",
      ),
      windowsKept: r.counter("windows_kept", "slot windows kept across a re-HELLO of the same session"),
      drafterTime: r.histogram("drafter_seconds", { help: "drafter time per STEP", unit: "seconds" }),
      stepTime: r.histogram("step_seconds", { help: "STEP processing time", unit: "seconds" }),
    };
  }

  /** The current session id (0: none). */
  get currentSession(): number {
    return this.session;
  }

  /**
   * Handles one request message and returns the reply message (a view valid until the next
   * reply but one). When the header is unreadable (CONTRACT 4) the reply is BAD_FRAME and
   * `onUnreadable` (if given) is called so that the transport can close the connection after
   * sending it.
   */
  handle(
    msg: Uint8Array,
    onUnreadable?: (() => void) | null,
    placed?: unknown,
  ): Uint8Array | Promise<Uint8Array> {
    const pl = placed instanceof StepPlacement ? placed : null;
    if (this.tail !== null) {
      const p = this.tail.then(() => this.processAny(msg, onUnreadable ?? null, pl));
      this.track(p);
      return p;
    }
    const r = this.processAny(msg, onUnreadable ?? null, pl);
    if (r instanceof Promise) this.track(r);
    return r;
  }

  /**
   * Receive placement hook (the transport's `receiveInto`, see docs/worker.md "Rows received in
   * place"): given the first bytes `head` of a request of `length` bytes, returns where its rows
   * should be received, a number of head bytes to wait for first, or null (receive it whole, the
   * normal path). Only a STEP of the current session with a newer seq that passes every
   * structural check of CONTRACT 7.2 is placed, and only while no frame is in flight: anything
   * else is declined, so the normal path answers it exactly as before. Each entry's rows go right
   * after its slot's window (the window itself is untouched); {@link handle} with the returned
   * plan then applies them without copying. Never throws.
   */
  placeStep(head: Uint8Array, length: number): StepPlacement | number | null {
    try {
      return this.tryPlace(head, length);
    } catch (e) {
      this.log.warn({ err: String(e) }, "receive placement declined");
      return null;
    }
  }

  private tryPlace(head: Uint8Array, length: number): StepPlacement | number | null {
    const HEAD = APP_HEADER_SIZE + STEP_PREFIX_SIZE;
    if (this.tail !== null || this.session === 0 || this.limits === null || length <= HEAD) return null;
    if (head.length < HEAD) return HEAD;
    // CONTRACT 4 header, as the normal path would read it: anything odd is left to that path.
    const h = peekRequestHeader(head, length);
    if (h === null || h.op !== Op.STEP) return null;
    if (h.session !== this.session || !serialNewer(h.seq, this.highestSeq)) return null;
    const limits = this.limits;
    const bodyLen = length - APP_HEADER_SIZE;
    if (bodyLen > this.maxBody) return null;
    const nReq = peekStepPrefix(head.subarray(APP_HEADER_SIZE))!.nReq;
    if (nReq > limits.maxSlots) return null;
    const headBytes = APP_HEADER_SIZE + rowsOffsetFor(nReq, limits.sampled);
    if (headBytes >= length) return null;
    if (head.length < headBytes) return headBytes;
    let req: StepRequest;
    try {
      req = decodeStepHead(head.subarray(APP_HEADER_SIZE, headBytes), bodyLen, limits);
    } catch {
      return null; // the normal path answers (and logs) it
    }
    const W = this.drafter.window;
    for (let i = 0; i < nReq; i++) if (req.entries[i]!.nRows > W) return null;
    const plan = new StepPlacement(headBytes, length, req, limits);
    const store = this.store;
    try {
      for (let i = 0; i < nReq; i++) {
        const e = req.entries[i]!;
        if (e.nRows === 0) continue;
        const p = store.placeAfterWindow(e.slot, e.nRows);
        plan.rows[i] = p.row;
        plan.versions[i] = p.version;
        plan.slots[i] = e.slot;
        plan.segments.push(p.view);
      }
    } catch (e) {
      this.cancelPlacement(plan);
      throw e;
    }
    this.c.stepsPlaced.inc();
    return plan;
  }

  /** Releases the placements of a frame that was not applied (its bytes stay in free space). */
  private cancelPlacement(plan: StepPlacement): void {
    for (let i = 0; i < plan.rows.length; i++) {
      if (plan.rows[i]! >= 0) this.store.cancelPlacement(plan.slots[i]!, plan.versions[i]!);
    }
  }

  private processAny(
    msg: Uint8Array,
    onUnreadable: (() => void) | null,
    placed: StepPlacement | null,
  ): Uint8Array | Promise<Uint8Array> {
    if (placed === null) return this.process(msg, onUnreadable);
    try {
      return this.processPlaced(msg, placed);
    } catch (e) {
      return this.internal(msg, e);
    } finally {
      if (!placed.consumed) this.cancelPlacement(placed);
    }
  }

  /** A STEP received in place: `head` is its first `headBytes` bytes, checked by placeStep. */
  private processPlaced(head: Uint8Array, placed: StepPlacement): Uint8Array | Promise<Uint8Array> {
    this.c.bytesIn.inc(placed.length);
    (this.c.frames.step as Counter).inc();
    const h = peekHeader(head)!;
    return this.step(h.seq, h.session, head.subarray(APP_HEADER_SIZE), placed);
  }

  /** Test hook: a copy of a slot's generation and window (see README "Test hooks"). */
  debugWindow(slot: number): WindowSnapshot {
    if (!Number.isInteger(slot) || slot < 0 || slot >= this.maxSlots) {
      throw new WorkerError("WORKER_BAD_OPTION", `slot ${slot} outside 0..${this.maxSlots - 1}`);
    }
    return this.store.debugWindow(slot);
  }

  /** The worker's stats snapshot: what STATS answers (CONTRACT 10). */
  stats(): Record<string, unknown> {
    return {
      name: this.name,
      session: this.session,
      session_hex: `0x${this.session.toString(16).padStart(8, "0")}`,
      highest_seq: this.highestSeq,
      windows_held: this.store.windowsHeld,
      slot_bytes: this.store.bytesAllocated,
      limits: {
        max_slots: this.maxSlots,
        max_rows_per_step: this.maxRowsPerStep,
        window: this.drafter.window,
        num_spec: this.drafter.numSpec,
        row_bytes: this.rowBytes,
        vocab_size: this.drafter.vocabSize,
      },
      ...this.registry.snapshot(),
    };
  }

  private track(p: Promise<unknown>): void {
    const settled = p.then(
      () => undefined,
      () => undefined,
    );
    this.tail = settled;
    void settled.then(() => {
      if (this.tail === settled) this.tail = null;
    });
  }

  private process(msg: Uint8Array, onUnreadable: (() => void) | null): Uint8Array | Promise<Uint8Array> {
    this.c.bytesIn.inc(msg.length);
    try {
      const n = msg.length;
      // CONTRACT 4: an unreadable header is BAD_FRAME echoing what is wholly present, then close.
      if (!headerReadable(msg, n)) {
        this.c.frames.unreadable!.inc();
        this.c.badHeaders.inc();
        const p = partialHeader(msg);
        if (onUnreadable !== null) onUnreadable();
        return this.small(p.op, FrameStatus.BAD_FRAME, p.seq, p.session);
      }
      let h: { op: number; seq: number; session: number };
      try {
        h = decodeHeader(msg, n, { request: true });
      } catch (e) {
        const p = partialHeader(msg);
        (this.c.frames[OP_KEYS[p.op] ?? "unknown"] as Counter).inc();
        return this.small(p.op, statusOf(e), p.seq, p.session);
      }
      const body = msg.subarray(APP_HEADER_SIZE);
      (this.c.frames[OP_KEYS[h.op] ?? "unknown"] as Counter).inc();
      switch (h.op) {
        case Op.HELLO:
          return this.hello(h.seq, h.session, body);
        case Op.STEP:
          return this.step(h.seq, h.session, body, null);
        case Op.PING:
          // CONTRACT 10: any session; touches no session state.
          if (body.length > PING_MAX_BODY) return this.small(h.op, FrameStatus.TOO_LARGE, h.seq, h.session);
          return this.small(h.op, FrameStatus.OK, h.seq, h.session, body);
        case Op.STATS: {
          if (body.length > STATS_MAX_BODY) return this.small(h.op, FrameStatus.TOO_LARGE, h.seq, h.session);
          const json = Buffer.from(JSON.stringify(this.stats()), "utf8");
          return this.small(h.op, FrameStatus.OK, h.seq, h.session, json);
        }
        case Op.RESET:
          return this.reset(h.seq, h.session, body);
        default:
          return this.small(h.op, FrameStatus.UNKNOWN_OP, h.seq, h.session);
      }
    } catch (e) {
      return this.internal(msg, e);
    }
  }

  private internal(msg: Uint8Array, e: unknown): Uint8Array {
    this.c.internal.inc();
    this.log.error({ err: e }, "internal error handling a frame");
    const p = partialHeader(msg);
    return this.small(p.op, FrameStatus.INTERNAL, p.seq, p.session);
  }

  /** A reply with a small body (copied) and no preallocated buffer: HELLO, errors, PING, STATS. */
  private small(op: number, status: number, seq: number, session: number, body?: Uint8Array): Uint8Array {
    const len = body?.length ?? 0;
    const out = new Uint8Array(APP_HEADER_SIZE + len);
    encodeHeader(out, 0, { op, status, seq, session, bodyLen: len });
    if (body !== undefined) out.set(body, APP_HEADER_SIZE);
    this.c.replies[status]?.inc();
    this.c.bytesOut.inc(out.length);
    return out;
  }

  private helloReply(windowsKept: number): HelloReply {
    const d = this.drafter;
    return {
      drafterIdentity: d.drafterIdentity,
      markovIdentity: d.markovIdentity,
      window: d.window,
      numSpec: d.numSpec,
      capabilities: d.capabilities,
      maxSlots: this.maxSlots,
      maxRowsPerStep: this.maxRowsPerStep,
      vocabSize: d.vocabSize,
      rowBytes: this.rowBytes,
      windowsKept,
      workerName: this.name,
    };
  }

  private helloAnswer(status: number, seq: number, session: number, windowsKept: number): Uint8Array {
    const body = new Uint8Array(HELLO_REPLY_BODY_SIZE);
    encodeHelloReply(this.helloReply(windowsKept), body, 0);
    return this.small(Op.HELLO, status, seq, session, body);
  }

  /** CONTRACT 6.1 worker checks in their order, then 6.2. */
  private hello(seq: number, session: number, body: Uint8Array): Uint8Array {
    if (body.length !== HELLO_BODY_SIZE || session === 0) {
      this.log.warn(
        { session, bodyLen: body.length },
        session === 0 ? "HELLO with session 0" : "HELLO body size is not 160",
      );
      return this.small(Op.HELLO, FrameStatus.BAD_FRAME, seq, session);
    }
    let hello: Hello;
    try {
      hello = decodeHello(body);
    } catch (e) {
      this.log.warn({ err: String(e) }, "HELLO body unreadable");
      return this.small(Op.HELLO, statusOf(e), seq, session);
    }
    if (this.token !== null && !verifyHelloAuth(this.token, session, seq, hello.auth)) {
      this.log.warn({ session, client: hello.clientName }, "HELLO refused: UNAUTHORIZED");
      return this.small(Op.HELLO, FrameStatus.UNAUTHORIZED, seq, session);
    }
    const d = this.drafter;
    if (
      !bytesEqual(hello.drafterIdentity, d.drafterIdentity) ||
      !bytesEqual(hello.markovIdentity, d.markovIdentity)
    ) {
      this.log.warn(
        {
          client: hello.clientName,
          theirs: [hex(hello.drafterIdentity), hex(hello.markovIdentity)],
          ours: [hex(d.drafterIdentity), hex(d.markovIdentity)],
        },
        "HELLO refused: IDENTITY_MISMATCH",
      );
      return this.helloAnswer(FrameStatus.IDENTITY_MISMATCH, seq, session, 0);
    }
    const why = this.configProblem(hello);
    if (why !== null) {
      this.log.warn({ client: hello.clientName, reason: why }, "HELLO refused: CONFIG_MISMATCH");
      return this.helloAnswer(FrameStatus.CONFIG_MISMATCH, seq, session, 0);
    }
    // CONTRACT 6.2
    let windowsKept = 0;
    const shape: SessionShape = {
      maxSlots: hello.maxSlots,
      maxRowsPerStep: hello.maxRowsPerStep,
      sampled: hello.sampleMode === SampleMode.TOP32,
      margin: (hello.helloFlags & HelloFlag.WANT_MARGIN) !== 0,
    };
    const now = this.now();
    const same = session === this.session;
    if (same && !serialNewer(seq, this.highestSeq)) {
      return this.helloAnswerStatus(FrameStatus.STALE_SEQ, seq, session);
    }
    if (
      !same &&
      this.takeover === Takeover.REFUSE &&
      this.session !== 0 &&
      now - this.lastOkAt < this.leaseMs
    ) {
      this.log.info({ current: this.session, asked: session }, "HELLO refused: BUSY (session leased)");
      return this.helloAnswerStatus(FrameStatus.BUSY, seq, session);
    }
    // CONTRACT 5: everything that can fail (the reply buffers sized from this HELLO) happens
    // before any state changes, so a non-OK answer (INTERNAL) has changed nothing.
    const prepared = this.prepareShape(shape);
    const reply = new Uint8Array(HELLO_REPLY_BODY_SIZE);
    if (same) {
      if (shape.maxSlots < this.shape!.maxSlots) this.store.dropFrom(shape.maxSlots);
      windowsKept = this.store.windowsHeld;
      this.c.windowsKept.inc(windowsKept);
    } else {
      if (this.session !== 0) this.c.takeovers.inc();
      this.store.resetAll();
      this.session = session;
      this.c.sessions.inc();
      this.log.info({ session, client: hello.clientName, sampleMode: hello.sampleMode }, "new session");
    }
    this.highestSeq = seq;
    this.lastOkAt = now;
    this.installShape(prepared);
    encodeHelloReply(this.helloReply(windowsKept), reply, 0);
    return this.small(Op.HELLO, FrameStatus.OK, seq, session, reply);
  }

  private helloAnswerStatus(status: number, seq: number, session: number): Uint8Array {
    return this.small(Op.HELLO, status, seq, session);
  }

  private configProblem(h: Hello): string | null {
    const d = this.drafter;
    if (h.window !== d.window) return `window ${h.window} != ${d.window}`;
    if (h.numSpec !== d.numSpec) return `num_spec ${h.numSpec} != ${d.numSpec}`;
    if (h.vocabSize !== d.vocabSize) return `vocab_size ${h.vocabSize} != ${d.vocabSize}`;
    if (h.rowBytes !== this.rowBytes) return `row_bytes ${h.rowBytes} != ${this.rowBytes}`;
    if (h.rowBytes !== h.numTaps * h.hidden * 2) {
      return `row_bytes ${h.rowBytes} != num_taps ${h.numTaps} x hidden ${h.hidden} x 2`;
    }
    // Same row_bytes with another tap layout would feed the drafter misread rows.
    if (h.numTaps !== d.numTaps || h.hidden !== d.hidden) {
      return `num_taps x hidden ${h.numTaps}x${h.hidden} != ${d.numTaps}x${d.hidden}`;
    }
    if (h.rowDtype !== RowDtype.BF16) return `row_dtype ${h.rowDtype} is not bf16 (1)`;
    if (h.sampleMode !== SampleMode.GREEDY && h.sampleMode !== SampleMode.TOP32) {
      return `sample_mode ${h.sampleMode} unknown`;
    }
    if (h.sampleMode === SampleMode.TOP32) {
      if ((d.capabilities & Capability.TOP32) === 0) return "sample_mode TOP32 not supported";
      if (h.vocabSize < TOP_K_MAX) return `TOP32 with vocab_size ${h.vocabSize} < 32`;
    }
    if ((h.helloFlags & ~HELLO_FLAGS_MASK) !== 0)
      return `unknown hello_flags bits 0x${h.helloFlags.toString(16)}`;
    if ((h.helloFlags & HelloFlag.WANT_MARGIN) !== 0 && (d.capabilities & Capability.MARGIN) === 0) {
      return "WANT_MARGIN but the drafter has no MARGIN capability";
    }
    if (h.maxSlots > this.maxSlots) return `max_slots ${h.maxSlots} > ${this.maxSlots}`;
    if (h.maxRowsPerStep > this.maxRowsPerStep)
      return `max_rows_per_step ${h.maxRowsPerStep} > ${this.maxRowsPerStep}`;
    return null;
  }

  /**
   * Everything a session of shape `s` needs, computed and allocated without touching the current
   * state (memory sized from the HELLO: reply buffers for its `max_slots`). Reuses the current
   * buffers when the shape's reply size is unchanged.
   */
  private prepareShape(s: SessionShape): PreparedShape {
    const d = this.drafter;
    const limits: StepLimits = {
      sampled: s.sampled,
      rowBytes: this.rowBytes,
      maxSlots: s.maxSlots,
      maxRowsPerStep: s.maxRowsPerStep,
      numSpec: d.numSpec,
    };
    const cur = this.shape;
    const sameReply =
      cur !== null &&
      this.replyBufs !== null &&
      cur.maxSlots === s.maxSlots &&
      cur.sampled === s.sampled &&
      cur.margin === s.margin;
    if (sameReply) {
      return { shape: s, limits, maxBody: maxStepBodySize(limits), replyBufs: null };
    }
    const bytes =
      APP_HEADER_SIZE +
      stepReplyBodySize({ nReq: s.maxSlots, numSpec: d.numSpec, margin: s.margin, sampled: s.sampled });
    return {
      shape: s,
      limits,
      maxBody: maxStepBodySize(limits),
      replyBufs: [alignedBuffer(bytes), alignedBuffer(bytes)],
    };
  }

  private installShape(p: PreparedShape): void {
    this.shape = p.shape;
    this.limits = p.limits;
    this.maxBody = p.maxBody;
    if (p.replyBufs === null) return;
    this.replyBufs = p.replyBufs;
  }

  /** CONTRACT 10: RESET drops all slot state and keeps the session (6.2 seq rules). */
  private reset(seq: number, session: number, body: Uint8Array): Uint8Array {
    if (this.session === 0 || session !== this.session)
      return this.small(Op.RESET, FrameStatus.NO_SESSION, seq, session);
    if (!serialNewer(seq, this.highestSeq)) return this.small(Op.RESET, FrameStatus.STALE_SEQ, seq, session);
    // The contract gives RESET no body; like STATS, a body is ignored up to 1 KiB.
    if (body.length > STATS_MAX_BODY) return this.small(Op.RESET, FrameStatus.TOO_LARGE, seq, session);
    this.highestSeq = seq;
    this.lastOkAt = this.now();
    this.store.resetAll();
    this.log.info({ session }, "RESET: slot state dropped");
    return this.small(Op.RESET, FrameStatus.OK, seq, session);
  }

  /** CONTRACT 6.2 then 7.2: check, apply, draft, reply (7.4). */
  private step(
    seq: number,
    session: number,
    body: Uint8Array,
    placed: StepPlacement | null,
  ): Uint8Array | Promise<Uint8Array> {
    const t0 = performance.now();
    if (this.session === 0 || session !== this.session)
      return this.small(Op.STEP, FrameStatus.NO_SESSION, seq, session);
    if (!serialNewer(seq, this.highestSeq)) return this.small(Op.STEP, FrameStatus.STALE_SEQ, seq, session);
    // CONTRACT 7.2, 11: the size limit of the session comes before any parsing.
    const bodyLen = placed === null ? body.length : placed.length - APP_HEADER_SIZE;
    if (bodyLen > this.maxBody) return this.small(Op.STEP, FrameStatus.TOO_LARGE, seq, session);
    const limits = this.limits!;
    const shape = this.shape!;
    let req: ReturnType<typeof decodeStepRequest>;
    try {
      // Placed: the head was decoded at placement against these very limits (a re-HELLO installs
      // new ones), or is checked again against the session's current limits.
      req =
        placed === null
          ? decodeStepRequest(body, limits)
          : placed.limits === limits
            ? placed.req
            : decodeStepHead(body, bodyLen, limits);
    } catch (e) {
      const st = statusOf(e);
      this.log.warn({ session, seq, err: String((e as Error)?.message ?? e) }, "STEP refused");
      return this.small(Op.STEP, st, seq, session);
    }
    const d = this.drafter;
    const N = d.numSpec;
    const W = d.window;
    const bufs = this.replyBufs!;
    this.replyTurn ^= 1;
    const buf = bufs[this.replyTurn]!;
    const views = beginStepReply(buf, {
      seq,
      session,
      stepId: req.stepId,
      nReq: req.nReq,
      numSpec: N,
      margin: shape.margin,
      sampled: shape.sampled,
    });
    const vc = this.valueCtx;
    vc.entries = req.entries;
    vc.sampleMeta = req.sampleMeta;
    // Accepted: from here on the frame is applied and answered OK (CONTRACT 5).
    if (placed !== null) placed.consumed = true;
    this.highestSeq = seq;
    this.lastOkAt = this.now();
    const store = this.store;
    const rows = req.rows;
    const rb = this.rowBytes;
    const batch = this.batch;
    batch.length = 0;
    let rowOff = 0;
    let applied = 0;
    let placedRows = 0;
    for (let i = 0; i < req.nReq; i++) {
      const e = req.entries[i]!;
      const slot = e.slot;
      views.generation[i] = e.generation;
      const off = rowOff;
      rowOff += e.nRows * rb;
      // Placed rows: still where they were received unless another frame changed the slot since
      // (checked before step 1, which may itself change the slot).
      const pRow = placed !== null ? placed.rows[i]! : -1;
      const placedOk = pRow >= 0 && store.placementValid(slot, placed!.versions[i]!);
      // Step 1 (CONTRACT 7.1).
      if (store.checkGeneration(slot, e.generation) === GenerationCheck.STALE) {
        if (placedOk) store.cancelPlacement(slot, placed!.versions[i]!);
        views.status[i] = ReqStatus.STALE_GENERATION;
        continue;
      }
      // Step 4 (RELEASE comes alone, so steps 2-3 have nothing to apply).
      if ((e.flags & EntryFlag.RELEASE) !== 0) {
        store.release(slot);
        views.status[i] = ReqStatus.OK;
        continue;
      }
      // Steps 2-3.
      const resync = (e.flags & EntryFlag.RESYNC) !== 0;
      if (pRow >= 0) {
        if (placedOk) {
          store.commitPlaced(slot, e.rowStart, e.nRows, pRow, resync);
          applied += e.nRows;
          placedRows += e.nRows;
        } else {
          // The rows may have been clobbered: as if the worker had lost the window (step 5
          // answers NEED_RESYNC). See docs/worker.md "Rows received in place".
          this.c.placementsLost.inc();
          this.log.warn({ slot, seq }, "placed rows overtaken by another frame: window dropped");
          store.dropWindow(slot);
        }
      } else if (resync || e.nRows > 0) {
        try {
          store.applyRows(slot, e.rowStart, e.nRows, rows, off, resync);
          applied += e.nRows;
        } catch (err) {
          // Only a failed allocation can land here. The frame is being applied, so it must stay
          // OK (CONTRACT 5): the slot's window is dropped and step 5 answers NEED_RESYNC for it.
          this.c.internal.inc();
          this.log.error({ slot, err: String(err) }, "applying rows failed: window dropped");
          store.release(slot);
        }
      }
      // Steps 5-6.
      const expected = Math.min(W, e.anchorPos);
      const held = store.heldAt(slot, e.anchorPos);
      const status =
        held === expected ? ReqStatus.OK : held > 0 ? ReqStatus.PARTIAL_WINDOW : ReqStatus.NEED_RESYNC;
      views.status[i] = status;
      views.windowRows[i] = held;
      if ((e.flags & EntryFlag.NEED_DRAFT) !== 0 && status !== ReqStatus.NEED_RESYNC) {
        let be = this.batchPool[batch.length];
        if (be === undefined) {
          be = { index: 0, slot: 0, anchorPos: 0, anchorToken: 0, k: 0, rows: EMPTY, nRows: 0, sample: null };
          this.batchPool.push(be);
        }
        be.index = i;
        be.slot = slot;
        be.anchorPos = e.anchorPos;
        be.anchorToken = e.anchorToken;
        be.k = e.nOut === 0 ? N : Math.min(e.nOut, N);
        be.rows = store.rowsView(slot, held);
        be.nRows = held;
        be.sample = req.sampleMeta !== null ? req.sampleMeta[i]! : null;
        batch.push(be);
      }
    }
    this.c.rowsApplied.inc(applied);
    this.c.rowsPlaced.inc(placedRows);
    this.c.rowsCopied.inc(applied - placedRows);
    if (batch.length === 0) return this.finishStep(buf, views, req.nReq, t0);
    this.c.drafterCalls.inc();
    this.c.entriesDrafted.inc(batch.length);
    const out: DraftOutput = {
      draftIds: views.draftIds,
      confidence: views.confidence,
      margin: views.margin,
      sampledMask: views.sampledMask,
      supportIds: views.supportIds,
      proposalQ: views.proposalQ,
      numSpec: N,
      failed: this.failed,
    };
    const td = performance.now();
    let r: void | Promise<void>;
    try {
      r = d.draft(batch, out);
    } catch (e) {
      this.drafterFailed(e, views, req.nReq);
      return this.finishStep(buf, views, req.nReq, t0, td);
    }
    if (r instanceof Promise) {
      return r.then(
        () => this.checkedFinish(buf, views, req.nReq, t0, td),
        (e: unknown) => {
          this.drafterFailed(e, views, req.nReq);
          return this.finishStep(buf, views, req.nReq, t0, td);
        },
      );
    }
    return this.checkedFinish(buf, views, req.nReq, t0, td);
  }

  /**
   * Checks the drafted values and finishes the reply. The windows are applied by now, so the
   * frame must be answered OK (CONTRACT 5: a non-OK answer changes nothing): an unexpected
   * failure here fails the batch's entries (DRAFT_FAILED, values zeroed) instead of INTERNAL.
   */
  private checkedFinish(
    buf: Uint8Array,
    views: StepReplyViews & { frameLength: number },
    nReq: number,
    t0: number,
    td: number,
  ): Uint8Array {
    try {
      this.checkDrafted(views, nReq);
    } catch (e) {
      this.c.internal.inc();
      this.log.error({ err: String(e) }, "checking drafted values failed: batch DRAFT_FAILED");
      this.marks.fill(0);
      this.failed.fill(0);
      for (let i = 0; i < nReq; i++) this.zeroEntry(views, i, 0);
      for (const be of this.batch) views.status[be.index] = ReqStatus.DRAFT_FAILED;
    }
    return this.finishStep(buf, views, nReq, t0, td);
  }

  private finishStep(
    buf: Uint8Array,
    v: StepReplyViews & { frameLength: number },
    nReq: number,
    t0: number,
    td?: number,
  ): Uint8Array {
    const t1 = performance.now();
    if (td !== undefined) this.c.drafterTime.observe((t1 - td) / 1000);
    for (let i = 0; i < nReq; i++) this.c.entries[v.status[i]!]?.inc();
    const us = Math.min(U32_MAX, Math.max(0, Math.round((t1 - t0) * 1000)));
    setReplyWorkerUs(buf, us);
    this.c.stepTime.observe((t1 - t0) / 1000);
    this.c.replies[FrameStatus.OK]!.inc();
    this.c.bytesOut.inc(v.frameLength);
    return buf.subarray(0, v.frameLength);
  }

  private drafterFailed(e: unknown, v: StepReplyViews, nReq: number): void {
    this.c.drafterErrors.inc();
    this.log.error({ err: e instanceof Error ? e.message : String(e) }, "drafter failed: batch DRAFT_FAILED");
    // A drafter that threw midway may have written anywhere: zero every entry.
    for (let i = 0; i < nReq; i++) this.zeroEntry(v, i, 0);
    for (const be of this.batch) {
      v.status[be.index] = ReqStatus.DRAFT_FAILED;
      this.failed[be.index] = 0;
    }
  }

  /** Marks entry `i` DRAFT_FAILED and zeroes its values (CONTRACT 6.3: not consumed). */
  private failEntry(v: StepReplyViews, i: number): void {
    v.status[i] = ReqStatus.DRAFT_FAILED;
    this.zeroEntry(v, i, 0);
  }

  private zeroEntry(v: StepReplyViews, i: number, from: number): void {
    const N = v.numSpec;
    const a = i * N + from;
    const b = (i + 1) * N;
    if (a >= b) return;
    v.draftIds.fill(0, a, b);
    v.confidence.fill(0, a, b);
    v.margin?.fill(0, a, b);
    if (v.sampledMask !== null) {
      v.sampledMask.fill(0, a, b);
      v.supportIds!.fill(0, a * TOP_K_MAX, b * TOP_K_MAX);
      v.proposalQ!.fill(0, a * TOP_K_MAX, b * TOP_K_MAX);
    }
  }

  /**
   * After the drafter: zero everything outside the consumed positions (CONTRACT 6.3) and mark an
   * entry whose values break 6.3 or 8 DRAFT_FAILED rather than let the client refuse the reply.
   */
  private checkDrafted(v: StepReplyViews, nReq: number): void {
    const batch = this.batch;
    const mark = this.marks;
    this.valueCtx.vocabSize = this.drafter.vocabSize;
    for (const be of batch) mark[be.index] = 1;
    for (let i = 0; i < nReq; i++) {
      if (mark[i] === 0) {
        this.zeroEntry(v, i, 0);
        this.failed[i] = 0;
      }
    }
    for (const be of batch) {
      mark[be.index] = 0;
      if (this.failed[be.index] === 1) {
        this.failed[be.index] = 0;
        this.failEntry(v, be.index);
        continue;
      }
      this.zeroEntry(v, be.index, be.k);
      const why = entryValueProblem(v, be.index, this.valueCtx);
      if (why !== null) {
        this.c.drafterBadValues.inc();
        this.log.error({ slot: be.slot, problem: why }, "drafter wrote invalid values: entry DRAFT_FAILED");
        this.failEntry(v, be.index);
      }
    }
  }
}

const EMPTY = new Uint8Array(0);

function statusOf(e: unknown): number {
  if (e instanceof WireError && e.status !== undefined) return e.status;
  return FrameStatus.BAD_FRAME;
}
