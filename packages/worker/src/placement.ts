import type { StepLimits, StepRequest } from "@tapwire/wire";
import {
  APP_HEADER_SIZE,
  decodeStepHead,
  Op,
  peekRequestHeader,
  peekStepPrefix,
  rowsOffsetFor,
  STEP_PREFIX_SIZE,
  serialNewer,
} from "@tapwire/wire";
import type { CoreMetrics } from "./metrics.js";
import type { CoreConfig } from "./options.js";
import type { FrameConn, Session } from "./session.js";
import type { WindowStore } from "./window-store.js";

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
  /** The head (prefix, sample meta, entries) as decoded at placement. */
  readonly req: StepRequest;
  /** The session limits (from its HELLO) the head was checked against (CONTRACT 7.2). */
  readonly limits: StepLimits;
  /** The header's `seq` (u32), as checked at placement; 0 when not given. */
  readonly seq: number;
  /** The header's `session` (u32), as checked at placement; 0 when not given. */
  readonly session: number;

  constructor(headBytes: number, length: number, req: StepRequest, limits: StepLimits, seq = 0, session = 0) {
    const nReq = req.nReq;
    this.seq = seq;
    this.session = session;
    this.req = req;
    this.limits = limits;
    this.headBytes = headBytes;
    this.length = length;
    this.rows = new Int32Array(nReq).fill(-1);
    this.versions = new Float64Array(nReq);
    this.slots = new Uint32Array(nReq);
  }
}

/**
 * @internal Rows received in place (docs/worker.md "Rows received in place"): decides from a
 * STEP's first bytes whether and where its rows go, and releases placements not applied.
 */
export class Placer {
  readonly #cfg: CoreConfig;
  readonly #store: WindowStore;
  readonly #session: Session;
  readonly #m: CoreMetrics;

  constructor(cfg: CoreConfig, store: WindowStore, session: Session, metrics: CoreMetrics) {
    this.#cfg = cfg;
    this.#store = store;
    this.#session = session;
    this.#m = metrics;
  }

  /**
   * The placement of a STEP of `length` bytes whose first bytes are `head` on `conn`, a number of
   * head bytes to wait for, or null (the normal path answers it). Only a STEP that the normal
   * path would accept is placed: on a bound connection of the current session (CONTRACT 6.2),
   * with a newer seq, within the session's size limit, passing every check of CONTRACT 7.2.
   */
  place(head: Uint8Array, length: number, conn: FrameConn): StepPlacement | number | null {
    const HEAD = APP_HEADER_SIZE + STEP_PREFIX_SIZE;
    const s = this.#session;
    const limits = s.limits;
    if (limits === null || length <= HEAD || !s.isBound(conn)) return null;
    if (head.length < HEAD) return HEAD;
    // CONTRACT 4 header, as the normal path would read it: anything odd is left to that path.
    const h = peekRequestHeader(head, length);
    if (h === null || h.op !== Op.STEP) return null;
    // CONTRACT 6.2 as admit() checks it (the connection is bound, checked above).
    if (h.session !== s.id || !serialNewer(h.seq, s.highestSeq)) return null;
    const bodyLen = length - APP_HEADER_SIZE;
    if (bodyLen > s.maxBody) return null;
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
    const W = this.#cfg.drafter.window;
    for (let i = 0; i < nReq; i++) if (req.entries[i]!.nRows > W) return null;
    const plan = new StepPlacement(headBytes, length, req, limits, h.seq, h.session);
    const store = this.#store;
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
      this.cancel(plan);
      throw e;
    }
    this.#m.stepsPlaced.inc();
    return plan;
  }

  /** Releases the placements of a frame that was not applied (its bytes stay in free space). */
  cancel(plan: StepPlacement): void {
    for (let i = 0; i < plan.rows.length; i++) {
      if (plan.rows[i]! >= 0) this.#store.cancelPlacement(plan.slots[i]!, plan.versions[i]!);
    }
  }
}
