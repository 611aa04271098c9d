import type { EntryValueContext, ReqEntry, StepReplyViews, StepRequest } from "@tapwire/wire";
import {
  APP_HEADER_SIZE,
  beginStepReply,
  decodeStepHead,
  decodeStepRequest,
  EntryFlag,
  entryValueProblem,
  FrameStatus,
  Op,
  ReqStatus,
  setReplyWorkerUs,
  TOP_K_MAX,
} from "@tapwire/wire";
import type { Batcher } from "./batcher.js";
import type { DraftBatchEntry, DraftOutput } from "./drafter.js";
import type { CoreMetrics } from "./metrics.js";
import type { CoreConfig } from "./options.js";
import type { StepPlacement } from "./placement.js";
import { smallReply, statusOf } from "./reply.js";
import type { FrameConn, Session } from "./session.js";
import type { WindowStore } from "./window-store.js";
import { GenerationCheck } from "./window-store.js";

const U32_MAX = 0xffffffff;
const EMPTY = new Uint8Array(0);

type ReplyViews = StepReplyViews & { frameLength: number };

/**
 * @internal A STEP from its checks to its reply: CONTRACT 6.2 (bound connection, session, seq),
 * 7.2 (size, structure, then the per-entry apply loop), the batched drafter call, the drafted
 * values checked against 6.3 and 8 (an entry that breaks them is DRAFT_FAILED), and 7.4.
 */
export class StepRunner {
  readonly #cfg: CoreConfig;
  readonly #store: WindowStore;
  readonly #session: Session;
  readonly #m: CoreMetrics;
  readonly #batch: DraftBatchEntry[] = [];
  readonly #batchPool: DraftBatchEntry[] = [];
  // Per entry index: marks of the batch entries (#checkDrafted) and the drafter's failures.
  readonly #marks: Uint8Array;
  readonly #failed: Uint8Array;
  /** The drafter's output views of the STEP being answered (#draft). */
  readonly #out: DraftOutput = {
    draftIds: new Int32Array(0),
    confidence: new Float32Array(0),
    margin: null,
    sampledMask: null,
    supportIds: null,
    proposalQ: null,
    numSpec: 0,
  };
  // What entryValueProblem reads of the STEP being answered (CONTRACT 6.3, 8).
  readonly #valueCtx: EntryValueContext = { vocabSize: 0, entries: [], sampleMeta: null };

  readonly #batcher: Batcher | null;
  /** STEPs of this runner's session answered OK (CONTRACT 12.1 STATS: its own counters). */
  steps = 0;
  /** Entries of those STEPs. */
  entries = 0;
  /** Entries of those STEPs that were drafted. */
  drafted = 0;

  constructor(
    cfg: CoreConfig,
    store: WindowStore,
    session: Session,
    metrics: CoreMetrics,
    batcher: Batcher | null = null,
  ) {
    this.#batcher = batcher;
    this.#cfg = cfg;
    this.#store = store;
    this.#session = session;
    this.#m = metrics;
    this.#marks = new Uint8Array(cfg.maxSlots);
    this.#failed = new Uint8Array(cfg.maxSlots);
  }

  /** CONTRACT 6.2 then 7.2: check, apply, draft, reply (7.4). */
  run(
    seq: number,
    session: number,
    body: Uint8Array,
    placed: StepPlacement | null,
    conn: FrameConn,
    arrival?: number,
  ): Uint8Array | Promise<Uint8Array> {
    // CONTRACT 12.1: in a shared worker worker_us runs from the STEP's arrival, queueing included.
    const t0 = arrival ?? performance.now();
    const req = this.#admit(seq, session, body, placed, conn);
    if (req instanceof Uint8Array) return req;
    const s = this.#session;
    const N = this.#cfg.drafter.numSpec;
    const buf = s.nextReplyBuffer();
    const views = beginStepReply(buf, {
      seq,
      session,
      stepId: req.stepId,
      nReq: req.nReq,
      numSpec: N,
      margin: s.margin,
      sampled: s.sampled,
    });
    const vc = this.#valueCtx;
    vc.entries = req.entries;
    vc.sampleMeta = req.sampleMeta;
    // Accepted: from here on the frame is applied and answered OK (CONTRACT 5).
    if (placed !== null) placed.consumed = true;
    s.accept(seq);
    this.#apply(req, views, placed, seq);
    const batch = this.#batch;
    if (batch.length === 0) return this.#finish(buf, views, req.nReq, t0);
    return this.#draft(buf, views, req.nReq, t0);
  }

  /** The checks before anything is applied, in the order of CONTRACT 6.2: a refusal, or the request. */
  #admit(
    seq: number,
    session: number,
    body: Uint8Array,
    placed: StepPlacement | null,
    conn: FrameConn,
  ): StepRequest | Uint8Array {
    const s = this.#session;
    const st = s.admit(seq, session, conn);
    if (st !== FrameStatus.OK) return smallReply(this.#m, Op.STEP, st, seq, session);
    // CONTRACT 7.2, 11: the size limit of the session comes before any parsing.
    const bodyLen = placed === null ? body.length : placed.length - APP_HEADER_SIZE;
    if (bodyLen > s.maxBody) return smallReply(this.#m, Op.STEP, FrameStatus.TOO_LARGE, seq, session);
    const limits = s.limits!;
    try {
      // Placed: the head was decoded at placement against these very limits (a re-HELLO installs
      // new ones), or is checked again against the session's current limits.
      return placed === null
        ? decodeStepRequest(body, limits)
        : placed.limits === limits
          ? placed.req
          : decodeStepHead(body, bodyLen, limits);
    } catch (e) {
      this.#cfg.log.warn({ session, seq, err: String((e as Error)?.message ?? e) }, "STEP refused");
      return smallReply(this.#m, Op.STEP, statusOf(e), seq, session);
    }
  }

  /** CONTRACT 7.2 steps 1-6 for every entry, in order; fills the batch of entries to draft. */
  #apply(req: StepRequest, views: ReplyViews, placed: StepPlacement | null, seq: number): void {
    const store = this.#store;
    const rb = this.#cfg.rowBytes;
    const W = this.#cfg.drafter.window;
    this.#batch.length = 0;
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
          this.#m.placementsLost.inc();
          this.#cfg.log.warn({ slot, seq }, "placed rows overtaken by another frame: window dropped");
          store.dropWindow(slot);
        }
      } else if (resync || e.nRows > 0) {
        try {
          store.applyRows(slot, e.rowStart, e.nRows, req.rows, off, resync);
          applied += e.nRows;
        } catch (err) {
          // Only a failed allocation can land here. The frame is being applied, so it must stay
          // OK (CONTRACT 5): the slot's window is dropped and step 5 answers NEED_RESYNC for it.
          this.#m.internal.inc();
          this.#cfg.log.error({ slot, err: String(err) }, "applying rows failed: window dropped");
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
        this.#enqueue(req, i, e, held);
      }
    }
    this.#m.rowsApplied.inc(applied);
    this.#m.rowsPlaced.inc(placedRows);
    this.#m.rowsCopied.inc(applied - placedRows);
  }

  #enqueue(req: StepRequest, i: number, e: ReqEntry, held: number): void {
    const batch = this.#batch;
    const N = this.#cfg.drafter.numSpec;
    let be = this.#batchPool[batch.length];
    if (be === undefined) {
      be = { index: 0, slot: 0, anchorPos: 0, anchorToken: 0, k: 0, rows: EMPTY, nRows: 0, sample: null };
      this.#batchPool.push(be);
    }
    be.index = i;
    be.slot = e.slot;
    be.anchorPos = e.anchorPos;
    be.anchorToken = e.anchorToken;
    be.k = e.nOut === 0 ? N : Math.min(e.nOut, N);
    be.rows = this.#store.rowsView(e.slot, held);
    be.nRows = held;
    be.sample = req.sampleMeta !== null ? req.sampleMeta[i]! : null;
    batch.push(be);
  }

  /** One batched drafter call (CONTRACT 7.2 step 5), then the value checks and the reply. */
  #draft(buf: Uint8Array, views: ReplyViews, nReq: number, t0: number): Uint8Array | Promise<Uint8Array> {
    const d = this.#cfg.drafter;
    const batch = this.#batch;
    const batcher = this.#batcher;
    this.drafted += batch.length;
    // Reused, like #batch: a runner answers one STEP at a time (the session's frames are serialised).
    const out = this.#out;
    out.draftIds = views.draftIds;
    out.confidence = views.confidence;
    out.margin = views.margin;
    out.sampledMask = views.sampledMask;
    out.supportIds = views.supportIds;
    out.proposalQ = views.proposalQ;
    out.numSpec = d.numSpec;
    out.failed = this.#failed;
    const td = performance.now();
    let r: void | Promise<void>;
    try {
      if (batcher !== null) {
        // CONTRACT 12.1: drafted with the STEPs of other sessions when a call is running.
        r = batcher.submit(batch, out);
      } else {
        this.#m.drafterCalls.inc();
        this.#m.entriesDrafted.inc(batch.length);
        r = d.draft(batch, out);
      }
    } catch (e) {
      this.#drafterFailed(e, views, nReq);
      return this.#finish(buf, views, nReq, t0, td);
    }
    if (r instanceof Promise) return this.#drafted(r, buf, views, nReq, t0, td);
    return this.#checkedFinish(buf, views, nReq, t0, td);
  }

  /**
   * The reply of an asynchronous drafter call. Its own method, so that the synchronous path of
   * {@link #draft} creates no closures (and no context for them) per STEP.
   */
  #drafted(
    r: Promise<void>,
    buf: Uint8Array,
    views: ReplyViews,
    nReq: number,
    t0: number,
    td: number,
  ): Promise<Uint8Array> {
    return r.then(
      () => this.#checkedFinish(buf, views, nReq, t0, td),
      (e: unknown) => {
        this.#drafterFailed(e, views, nReq);
        return this.#finish(buf, views, nReq, t0, td);
      },
    );
  }

  /**
   * Checks the drafted values and finishes the reply. The windows are applied by now, so the
   * frame must be answered OK (CONTRACT 5: a non-OK answer changes nothing): an unexpected
   * failure here fails the batch's entries (DRAFT_FAILED, values zeroed) instead of INTERNAL.
   */
  #checkedFinish(buf: Uint8Array, views: ReplyViews, nReq: number, t0: number, td: number): Uint8Array {
    try {
      this.#checkDrafted(views, nReq);
    } catch (e) {
      this.#m.internal.inc();
      this.#cfg.log.error({ err: String(e) }, "checking drafted values failed: batch DRAFT_FAILED");
      this.#marks.fill(0);
      this.#failed.fill(0);
      for (let i = 0; i < nReq; i++) zeroEntry(views, i, 0);
      for (const be of this.#batch) views.status[be.index] = ReqStatus.DRAFT_FAILED;
    }
    return this.#finish(buf, views, nReq, t0, td);
  }

  #finish(buf: Uint8Array, v: ReplyViews, nReq: number, t0: number, td?: number): Uint8Array {
    const m = this.#m;
    const t1 = performance.now();
    if (td !== undefined) m.drafterTime.observe((t1 - td) / 1000);
    for (let i = 0; i < nReq; i++) m.entries[v.status[i]!]?.inc();
    this.steps++;
    this.entries += nReq;
    const us = Math.min(U32_MAX, Math.max(0, Math.round((t1 - t0) * 1000)));
    setReplyWorkerUs(buf, us);
    m.stepTime.observe((t1 - t0) / 1000);
    m.replies[FrameStatus.OK]!.inc();
    m.bytesOut.inc(v.frameLength);
    return buf.subarray(0, v.frameLength);
  }

  #drafterFailed(e: unknown, v: StepReplyViews, nReq: number): void {
    this.#m.drafterErrors.inc();
    this.#cfg.log.error(
      { err: e instanceof Error ? e.message : String(e) },
      "drafter failed: batch DRAFT_FAILED",
    );
    // A drafter that threw midway may have written anywhere: zero every entry.
    for (let i = 0; i < nReq; i++) zeroEntry(v, i, 0);
    for (const be of this.#batch) {
      v.status[be.index] = ReqStatus.DRAFT_FAILED;
      this.#failed[be.index] = 0;
    }
  }

  /**
   * After the drafter: zero everything outside the consumed positions (CONTRACT 6.3) and mark an
   * entry whose values break 6.3 or 8 DRAFT_FAILED rather than let the client refuse the reply.
   */
  #checkDrafted(v: StepReplyViews, nReq: number): void {
    const batch = this.#batch;
    const mark = this.#marks;
    const failed = this.#failed;
    this.#valueCtx.vocabSize = this.#cfg.drafter.vocabSize;
    for (const be of batch) mark[be.index] = 1;
    for (let i = 0; i < nReq; i++) {
      if (mark[i] === 0) {
        zeroEntry(v, i, 0);
        failed[i] = 0;
      }
    }
    for (const be of batch) {
      mark[be.index] = 0;
      if (failed[be.index] === 1) {
        failed[be.index] = 0;
        failEntry(v, be.index);
        continue;
      }
      zeroEntry(v, be.index, be.k);
      const why = entryValueProblem(v, be.index, this.#valueCtx);
      if (why !== null) {
        this.#m.drafterBadValues.inc();
        this.#cfg.log.error(
          { slot: be.slot, problem: why },
          "drafter wrote invalid values: entry DRAFT_FAILED",
        );
        failEntry(v, be.index);
      }
    }
  }
}

/** Marks entry `i` DRAFT_FAILED and zeroes its values (CONTRACT 6.3: not consumed). */
function failEntry(v: StepReplyViews, i: number): void {
  v.status[i] = ReqStatus.DRAFT_FAILED;
  zeroEntry(v, i, 0);
}

/** Zeroes the values of entry `i` from position `from` on (CONTRACT 6.3, 8). */
function zeroEntry(v: StepReplyViews, i: number, from: number): void {
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
