import type { Hello, HelloReply, StepLimits } from "@tapwire/wire";
import {
  APP_HEADER_SIZE,
  Capability,
  decodeHello,
  encodeHelloReply,
  FrameStatus,
  HELLO_BODY_SIZE,
  HELLO_FLAGS_MASK,
  HELLO_REPLY_BODY_SIZE,
  HelloFlag,
  maxStepBodySize,
  Op,
  RowDtype,
  SampleMode,
  STATS_MAX_BODY,
  serialNewer,
  stepReplyBodySize,
  TOP_K_MAX,
  toHex,
  verifyHelloAuth,
} from "@tapwire/wire";
import type { CoreMetrics } from "./metrics.js";
import type { CoreConfig } from "./options.js";
import { Takeover } from "./options.js";
import { smallReply, statusOf } from "./reply.js";
import type { WindowStore } from "./window-store.js";

/**
 * A connection as the worker core sees it (CONTRACT 6.2: STEP and RESET need a connection bound
 * by an OK HELLO). Its identity is the object itself; the transport's hooks are optional.
 */
export interface FrameConn {
  /** The header was unreadable (CONTRACT 4): close the connection once the reply is written. */
  closeAfterReply?(): void;
  /** An OK HELLO bound this connection (the transport raises its message limit, CONTRACT 11). */
  bind?(): void;
  /** A HELLO made another session current: this connection is no longer bound. */
  unbind?(): void;
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

function bytesEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/**
 * @internal The worker's one session (CONTRACT 6.1, 6.2, 10 RESET): current id, highest seq,
 * lease, the limits and reply buffers its HELLO asked for, and which connections are bound to
 * it. A connection is bound to one *take* of a session (an epoch): a session that is replaced
 * and later taken back is new, and connections bound before stay unbound (CONTRACT 11).
 */
export class Session {
  /** Current session id (0: none). */
  id = 0;
  /** Highest seq of the current session. */
  highestSeq = 0;
  /** Limits of the current session (null before the first OK HELLO). */
  limits: StepLimits | null = null;
  /** Largest STEP body of the current session (CONTRACT 7.2). */
  maxBody = 0;
  /** MARGIN and SAMPLED of the current session's replies. */
  margin = false;
  sampled = false;
  #lastOkAt = Number.NEGATIVE_INFINITY;
  #maxSlots = 0;
  // Two reply buffers used in turn, so a reply still being written by a transport is never
  // overwritten by the next one.
  #replyBufs: [Uint8Array, Uint8Array] | null = null;
  #replyTurn = 0;
  // Bumped whenever a HELLO makes a session current; a binding holds for its epoch only.
  #epoch = 0;
  readonly #bindings = new WeakMap<FrameConn, number>();
  #lastBound: FrameConn | null = null;
  #lastBoundEpoch = -1;
  readonly #bound = new Set<FrameConn>();
  readonly #cfg: CoreConfig;
  readonly #store: WindowStore;
  readonly #m: CoreMetrics;

  constructor(cfg: CoreConfig, store: WindowStore, metrics: CoreMetrics) {
    this.#cfg = cfg;
    this.#store = store;
    this.#m = metrics;
  }

  /** True when `conn` is bound to the current session (CONTRACT 6.2). */
  isBound(conn: FrameConn): boolean {
    if (this.id === 0) return false;
    // The connection bound last is nearly always the one asking (one client, one connection).
    if (conn === this.#lastBound) return this.#lastBoundEpoch === this.#epoch;
    return this.#bindings.get(conn) === this.#epoch;
  }

  /** Connections bound to the current session. */
  get boundConnections(): number {
    return this.#bound.size;
  }

  /** When a frame of this session was last answered OK (`now()` ms; -Infinity: never). */
  get lastOkAt(): number {
    return this.#lastOkAt;
  }

  /** Connections bound to the current session (a copy). */
  boundList(): FrameConn[] {
    return [...this.#bound];
  }

  /**
   * CONTRACT 12.1 "Dropping a session": discards the slot state and unbinds every connection
   * bound to it (they stay open; their next STEP or RESET is NO_SESSION). The session is gone:
   * `id` becomes 0.
   */
  drop(): void {
    this.#epoch++;
    for (const c of this.#bound) {
      this.#m.unbinds.inc();
      c.unbind?.();
    }
    this.#bound.clear();
    this.#lastBound = null;
    this.#store.resetAll();
    this.id = 0;
  }

  /** Forgets a closed connection. */
  forget(conn: FrameConn): void {
    if (conn === this.#lastBound) this.#lastBound = null;
    this.#bound.delete(conn);
    this.#bindings.delete(conn);
  }

  /**
   * CONTRACT 6.2 checks of a STEP or RESET, in their order: bound connection and session
   * (NO_SESSION), then seq (STALE_SEQ). OK when the frame may go on to its size and structure.
   */
  admit(seq: number, session: number, conn: FrameConn): number {
    if (this.id === 0 || session !== this.id || !this.isBound(conn)) {
      if (this.id !== 0 && session === this.id) this.#m.unbound.inc();
      return FrameStatus.NO_SESSION;
    }
    if (!serialNewer(seq, this.highestSeq)) return FrameStatus.STALE_SEQ;
    return FrameStatus.OK;
  }

  /** An admitted frame is being answered OK: its seq becomes the highest, the lease renews. */
  accept(seq: number): void {
    this.highestSeq = seq;
    this.#lastOkAt = this.#cfg.now();
  }

  /** The reply buffer for the next STEP reply (the two are used in turn). */
  nextReplyBuffer(): Uint8Array {
    this.#replyTurn ^= 1;
    return this.#replyBufs![this.#replyTurn]!;
  }

  /** CONTRACT 10: RESET drops all slot state and keeps the session (6.2 rules). */
  reset(seq: number, session: number, body: Uint8Array, conn: FrameConn): Uint8Array {
    const st = this.admit(seq, session, conn);
    if (st !== FrameStatus.OK) return this.#small(Op.RESET, st, seq, session);
    // The contract gives RESET no body; like STATS, a body is ignored up to 1 KiB.
    if (body.length > STATS_MAX_BODY) return this.#small(Op.RESET, FrameStatus.TOO_LARGE, seq, session);
    this.accept(seq);
    this.#store.resetAll();
    this.#cfg.log.info({ session }, "RESET: slot state dropped");
    return this.#small(Op.RESET, FrameStatus.OK, seq, session);
  }

  /** CONTRACT 6.1 worker checks in their order, then 6.2 (sessions, lease, binding). */
  hello(seq: number, session: number, body: Uint8Array, conn: FrameConn): Uint8Array {
    const checked = this.checkHello(seq, session, body, null);
    if (checked instanceof Uint8Array) return checked;
    return this.commitHello(checked, seq, session, conn);
  }

  /**
   * The CONTRACT 6.1 checks of a HELLO up to (not including) the session step: the decoded HELLO,
   * or the refusal to answer. `extra` adds a CONFIG_MISMATCH reason of the caller's (the shared
   * worker's reservation, CONTRACT 12.1). Reads configuration only, never session state.
   */
  checkHello(
    seq: number,
    session: number,
    body: Uint8Array,
    extra: ((h: Hello) => string | null) | null,
  ): Hello | Uint8Array {
    const log = this.#cfg.log;
    if (body.length !== HELLO_BODY_SIZE || session === 0) {
      log.warn(
        { session, bodyLen: body.length },
        session === 0 ? "HELLO with session 0" : "HELLO body size is not 160",
      );
      return this.#small(Op.HELLO, FrameStatus.BAD_FRAME, seq, session);
    }
    let hello: Hello;
    try {
      hello = decodeHello(body);
    } catch (e) {
      log.warn({ err: String(e) }, "HELLO body unreadable");
      return this.#small(Op.HELLO, statusOf(e), seq, session);
    }
    const token = this.#cfg.token;
    if (token !== null && !verifyHelloAuth(token, session, seq, hello.auth)) {
      log.warn({ session, client: hello.clientName }, "HELLO refused: UNAUTHORIZED");
      return this.#small(Op.HELLO, FrameStatus.UNAUTHORIZED, seq, session);
    }
    const d = this.#cfg.drafter;
    if (
      !bytesEqual(hello.drafterIdentity, d.drafterIdentity) ||
      !bytesEqual(hello.markovIdentity, d.markovIdentity)
    ) {
      log.warn(
        {
          client: hello.clientName,
          theirs: [toHex(hello.drafterIdentity), toHex(hello.markovIdentity)],
          ours: [toHex(d.drafterIdentity), toHex(d.markovIdentity)],
        },
        "HELLO refused: IDENTITY_MISMATCH",
      );
      return this.#helloAnswer(FrameStatus.IDENTITY_MISMATCH, seq, session, 0);
    }
    const why = this.#configProblem(hello) ?? extra?.(hello) ?? null;
    if (why !== null) {
      log.warn({ client: hello.clientName, reason: why }, "HELLO refused: CONFIG_MISMATCH");
      return this.#helloAnswer(FrameStatus.CONFIG_MISMATCH, seq, session, 0);
    }
    return hello;
  }

  /** The session step of a checked HELLO (CONTRACT 6.2): seq, lease, take or renew, bind. */
  commitHello(hello: Hello, seq: number, session: number, conn: FrameConn): Uint8Array {
    const log = this.#cfg.log;
    const now = this.#cfg.now();
    const same = session === this.id;
    if (same && !serialNewer(seq, this.highestSeq)) {
      return this.#small(Op.HELLO, FrameStatus.STALE_SEQ, seq, session);
    }
    if (
      !same &&
      this.#cfg.takeover === Takeover.REFUSE &&
      this.id !== 0 &&
      now - this.#lastOkAt < this.#cfg.leaseMs &&
      // CONTRACT 6.2 (1.2): protected only while a connection bound to it is open.
      this.#bound.size > 0
    ) {
      log.info({ current: this.id, asked: session }, "HELLO refused: BUSY (session leased)");
      return this.#small(Op.HELLO, FrameStatus.BUSY, seq, session);
    }
    // CONTRACT 5: everything that can fail (the reply buffers sized from this HELLO) happens
    // before any state changes, so a non-OK answer (INTERNAL) has changed nothing.
    const prepared = this.#prepareShape({
      maxSlots: hello.maxSlots,
      maxRowsPerStep: hello.maxRowsPerStep,
      sampled: hello.sampleMode === SampleMode.TOP32,
      margin: (hello.helloFlags & HelloFlag.WANT_MARGIN) !== 0,
    });
    const reply = new Uint8Array(HELLO_REPLY_BODY_SIZE);
    let windowsKept = 0;
    if (same) {
      if (hello.maxSlots < this.#maxSlots) this.#store.dropFrom(hello.maxSlots);
      windowsKept = this.#store.windowsHeld;
      this.#m.windowsKept.inc(windowsKept);
    } else {
      if (this.id !== 0) this.#m.takeovers.inc();
      this.#store.resetAll();
      this.id = session;
      this.#newEpoch(conn);
      this.#m.sessions.inc();
      log.info({ session, client: hello.clientName, sampleMode: hello.sampleMode }, "new session");
    }
    this.accept(seq);
    this.#installShape(prepared);
    this.#bind(conn);
    encodeHelloReply(this.#helloReply(windowsKept), reply, 0);
    return this.#small(Op.HELLO, FrameStatus.OK, seq, session, reply);
  }

  // A new session is current: every other connection bound to the old one is unbound
  // (CONTRACT 6.2); `conn`, which said the HELLO, is bound again right after.
  #newEpoch(conn: FrameConn): void {
    this.#epoch++;
    for (const c of this.#bound) {
      if (c === conn) continue;
      this.#m.unbinds.inc();
      c.unbind?.();
    }
    this.#bound.clear();
  }

  #bind(conn: FrameConn): void {
    if (this.#bindings.get(conn) === this.#epoch) return;
    this.#bindings.set(conn, this.#epoch);
    this.#lastBound = conn;
    this.#lastBoundEpoch = this.#epoch;
    this.#bound.add(conn);
    conn.bind?.(); // idempotent in the transport
  }

  #small(op: number, status: number, seq: number, session: number, body?: Uint8Array): Uint8Array {
    return smallReply(this.#m, op, status, seq, session, body);
  }

  #helloReply(windowsKept: number): HelloReply {
    const c = this.#cfg;
    const d = c.drafter;
    return {
      drafterIdentity: d.drafterIdentity,
      markovIdentity: d.markovIdentity,
      window: d.window,
      numSpec: d.numSpec,
      // CONTRACT 12.1: bit 3 SHARED in every HelloReply of a worker holding several sessions.
      capabilities: d.capabilities | (c.maxSessions > 1 ? Capability.SHARED : 0),
      maxSlots: c.maxSlots,
      maxRowsPerStep: c.maxRowsPerStep,
      vocabSize: d.vocabSize,
      rowBytes: c.rowBytes,
      windowsKept,
      workerName: c.name,
    };
  }

  #helloAnswer(status: number, seq: number, session: number, windowsKept: number): Uint8Array {
    const body = new Uint8Array(HELLO_REPLY_BODY_SIZE);
    encodeHelloReply(this.#helloReply(windowsKept), body, 0);
    return this.#small(Op.HELLO, status, seq, session, body);
  }

  #configProblem(h: Hello): string | null {
    const c = this.#cfg;
    const d = c.drafter;
    if (h.window !== d.window) return `window ${h.window} != ${d.window}`;
    if (h.numSpec !== d.numSpec) return `num_spec ${h.numSpec} != ${d.numSpec}`;
    if (h.vocabSize !== d.vocabSize) return `vocab_size ${h.vocabSize} != ${d.vocabSize}`;
    if (h.rowBytes !== c.rowBytes) return `row_bytes ${h.rowBytes} != ${c.rowBytes}`;
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
    if (h.maxSlots > c.maxSlots) return `max_slots ${h.maxSlots} > ${c.maxSlots}`;
    if (h.maxRowsPerStep > c.maxRowsPerStep)
      return `max_rows_per_step ${h.maxRowsPerStep} > ${c.maxRowsPerStep}`;
    return null;
  }

  /**
   * Everything a session of shape `s` needs, computed and allocated without touching the current
   * state (memory sized from the HELLO: reply buffers for its `max_slots`). Reuses the current
   * buffers when the shape's reply size is unchanged.
   */
  #prepareShape(s: SessionShape): PreparedShape {
    const c = this.#cfg;
    const limits: StepLimits = {
      sampled: s.sampled,
      rowBytes: c.rowBytes,
      maxSlots: s.maxSlots,
      maxRowsPerStep: s.maxRowsPerStep,
      numSpec: c.drafter.numSpec,
    };
    const maxBody = maxStepBodySize(limits);
    const sameReply =
      this.#replyBufs !== null &&
      this.#maxSlots === s.maxSlots &&
      this.sampled === s.sampled &&
      this.margin === s.margin;
    if (sameReply) return { shape: s, limits, maxBody, replyBufs: null };
    const bytes =
      APP_HEADER_SIZE +
      stepReplyBodySize({
        nReq: s.maxSlots,
        numSpec: c.drafter.numSpec,
        margin: s.margin,
        sampled: s.sampled,
      });
    return { shape: s, limits, maxBody, replyBufs: [alignedBuffer(bytes), alignedBuffer(bytes)] };
  }

  #installShape(p: PreparedShape): void {
    this.#maxSlots = p.shape.maxSlots;
    this.sampled = p.shape.sampled;
    this.margin = p.shape.margin;
    this.limits = p.limits;
    this.maxBody = p.maxBody;
    if (p.replyBufs !== null) this.#replyBufs = p.replyBufs;
  }
}
