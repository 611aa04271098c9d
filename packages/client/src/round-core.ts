// RoundCore is one state machine over per-slot rings (CONTRACT 7.5): its round phases (rings,
// plan, entries, reply, depths) share preallocated typed arrays and the slots' private state, so
// they stay methods of one class in one file (about 800 lines) rather than modules passing that
// state around; the public shapes live in round-types.ts.
import { setImmediate as yieldToEventLoop } from "node:timers/promises";
import type { ReqEntry, SampleMeta, StepReplyViews } from "@tapwire/wire";
import { EntryFlag, REQ_STATUS_NAMES, ReqStatus, serialNewer } from "@tapwire/wire";
import type { StepCall } from "./client.js";
import type { DepthCandidate, DepthPolicy } from "./depth-policy.js";
import { ClientError } from "./errors.js";
import type { StepOutcome, StepOutcomeReason } from "./outcomes.js";
import type {
  DraftLink,
  DraftReason,
  RoundCoreOptions,
  RoundDraft,
  RoundInput,
  RoundResult,
  SlotView,
} from "./round-types.js";

const GREEDY_META: SampleMeta = Object.freeze({ seed: 0, topK: 1, tempMilli: 0 });

class Slot {
  active = false;
  known = false; // a generation was seen for the slot
  generation = 0;
  ring: Uint8Array | null = null;
  /** Views of the ring by `idx * (W + 1) + run`, made once (parts mode sends them every round). */
  views: Map<number, Uint8Array> | null = null;
  ringStart = 0;
  ringEnd = 0;
  workerEnd = -1;
  syncedEpoch = -1;
  needResync = true;
  pendingRelease = false;
  seenRound = -1;
  /** The round a new request (generation) took the slot. */
  freshRound = -1;
  waitedRounds = 0;
  draft: DraftOut | null = null;
  /** A {@link RoundCore.rowsTarget} reservation waiting for its round: rows, or 0 for none. */
  resN = 0;
  resStart = 0;
  resGeneration = 0;
}

class DraftOut implements RoundDraft {
  slot: number;
  reason: DraftReason = "not_requested";
  status = -1;
  k = 0;
  depth = 0;
  windowRows = 0;
  readonly ids: Int32Array;
  readonly conf: Float32Array;
  readonly margin: Float32Array | null;
  readonly sampledMask: Uint8Array | null;
  readonly supportIds: Int32Array | null;
  readonly proposalQ: Uint32Array | null;
  constructor(slot: number, n: number, margin: boolean, sampled: boolean) {
    this.slot = slot;
    this.ids = new Int32Array(n);
    this.conf = new Float32Array(n);
    this.margin = margin ? new Float32Array(n) : null;
    this.sampledMask = sampled ? new Uint8Array(n) : null;
    this.supportIds = sampled ? new Int32Array(n * 32) : null;
    this.proposalQ = sampled ? new Uint32Array(n * 32) : null;
  }
  clear(reason: DraftReason): void {
    this.reason = reason;
    this.status = -1;
    this.k = 0;
    this.depth = 0;
    this.windowRows = 0;
  }
}

class Result implements RoundResult {
  outcome: StepOutcomeReason | "idle" = "idle";
  stepId = 0;
  epoch: number | null = null;
  rttUs = 0;
  drafts: DraftOut[] = [];
  resynced = 0;
  deferred = 0;
  released = 0;
  rowsSent = 0;
  expectedAccepted = 0;
}

function bad(message: string): ClientError {
  return new ClientError("CLIENT_BAD_ARGUMENT", message);
}

// names a request in error messages (built only when throwing)
function at(i: number, slot: number): string {
  return `request ${i} (slot ${slot})`;
}

function isU32(v: number): boolean {
  return Number.isInteger(v) && v >= 0 && v <= 0xffffffff;
}

/**
 * The rank-0 round core (CONTRACT 7.5): called once per decode round. It keeps per slot a ring
 * of the last W rows and where the worker's window is known to end; decides per slot between
 * sending new rows and RESYNC with the whole ring (epoch change, unknown outcome,
 * PARTIAL_WINDOW / NEED_RESYNC, new request); stages rows straight into the client's send
 * buffer; defers whole entries past `max_rows_per_step`; sends RELEASE for finished requests;
 * calls `step`; and returns per request the drafts or why there are none. On STALE_GENERATION
 * it starts a new session. Without a ready connection the round is target-only.
 *
 * Rounds must not overlap: await each `round()` before the next.
 */
export class RoundCore {
  /** The client the rounds go through. */
  readonly client: DraftLink;
  /** The depth policy applied to each round's drafts, or null (every draft position kept). */
  readonly depthPolicy: DepthPolicy | null;
  /** `"parts"`: rows leave as views of the rings; `"stage"`: copied into the send buffer. */
  readonly rowsMode: "stage" | "parts";
  readonly #parts: Uint8Array[] = [];
  readonly #targetOut: Uint8Array[] = [];
  readonly #W: number;
  readonly #N: number;
  readonly #rowBytes: number;
  readonly #maxSlots: number;
  readonly #maxRows: number;
  readonly #sampled: boolean;
  readonly #slots: Slot[];
  readonly #entries: ReqEntry[];
  readonly #meta: SampleMeta[];
  readonly #entryReq: Int32Array; // request index of entry e, or -1 for RELEASE
  readonly #order: Int32Array;
  readonly #plannedRows: Int32Array; // per request: rows to send (-1 deferred)
  readonly #plannedStart: Float64Array;
  readonly #plannedResync: Uint8Array;
  readonly #plannedEpoch: Float64Array; // per request: the slot's epoch this round (DraftLink.slotEpoch)
  readonly #entryEpoch: Float64Array; // per entry: the same, by entry index
  readonly #result = new Result();
  readonly #call: StepCall;
  readonly #cands: { k: number; conf: Float32Array; margin: Float32Array | null }[] = [];
  #depthOut: Int32Array;
  #round = 0;
  #stepId = 0;
  #running = false;
  #nOrd = 0;

  constructor(options: RoundCoreOptions) {
    const c = options?.client;
    if (c === undefined || c === null || typeof c.step !== "function") {
      throw new ClientError("CLIENT_BAD_OPTION", "client must be a RemoteDraftClient");
    }
    const dp = options.depthPolicy;
    if (dp !== undefined && (dp === null || typeof dp.allocate !== "function")) {
      throw new ClientError("CLIENT_BAD_OPTION", "depthPolicy must be a DepthPolicy");
    }
    const mode = options.rowsMode ?? "parts";
    if (mode !== "stage" && mode !== "parts") {
      throw new ClientError("CLIENT_BAD_OPTION", `rowsMode must be "stage" or "parts", got ${String(mode)}`);
    }
    this.client = c;
    this.depthPolicy = dp ?? null;
    this.rowsMode = mode;
    const o = c.options;
    this.#W = o.window;
    this.#N = o.numSpec;
    this.#rowBytes = o.rowBytes;
    this.#maxSlots = o.maxSlots;
    this.#maxRows = o.maxRowsPerStep;
    this.#sampled = o.sampled;
    const n = o.maxSlots;
    this.#slots = [];
    this.#entries = [];
    this.#meta = [];
    this.#entryReq = new Int32Array(n);
    this.#order = new Int32Array(n);
    this.#plannedRows = new Int32Array(n);
    this.#plannedStart = new Float64Array(n);
    this.#plannedResync = new Uint8Array(n);
    this.#plannedEpoch = new Float64Array(n);
    this.#entryEpoch = new Float64Array(n);
    this.#depthOut = new Int32Array(Math.min(n, 1024));
    // one StepCall object, refilled every round
    const call: StepCall = {
      stepId: 0,
      entries: this.#entries,
      nEntries: 0,
      nRows: 0,
      sampleMeta: this.#sampled ? this.#meta : null,
      epoch: 0,
    };
    if (mode === "parts") call.rows = this.#parts;
    this.#call = call;
  }

  #slot(i: number): Slot {
    let s = this.#slots[i];
    if (s === undefined) {
      while (this.#slots.length <= i) this.#slots.push(new Slot());
      s = this.#slots[i]!;
    }
    return s;
  }

  #entry(e: number): ReqEntry {
    let en = this.#entries[e];
    if (en === undefined) {
      en = { slot: 0, generation: 0, anchorPos: 0, anchorToken: 0, rowStart: 0, nRows: 0, nOut: 0, flags: 0 };
      this.#entries[e] = en;
      this.#meta[e] = { seed: 0, topK: 1, tempMilli: 0 };
    }
    return en;
  }

  #draftOf(slot: number, s: Slot): DraftOut {
    s.draft ??= new DraftOut(slot, this.#N, this.client.options.wantMargin, this.#sampled);
    return s.draft;
  }

  /** A snapshot of what RoundCore keeps for `slot` (copies the ring; for tests and tools). */
  slotView(slot: number): SlotView {
    const s = this.#slots[slot];
    if (s === undefined) {
      return {
        active: false,
        generation: 0,
        ringStart: 0,
        ringEnd: 0,
        workerEnd: -1,
        needResync: true,
        pendingRelease: false,
        rows: new Uint8Array(0),
      };
    }
    const n = s.ringEnd - s.ringStart;
    const rows = new Uint8Array(n * this.#rowBytes);
    if (n > 0) this.#copyRing(s, s.ringStart, s.ringEnd, rows, 0);
    return {
      active: s.active,
      generation: s.generation,
      ringStart: s.ringStart,
      ringEnd: s.ringEnd,
      workerEnd: s.workerEnd,
      needResync: s.needResync || s.workerEnd < 0,
      pendingRelease: s.pendingRelease,
      rows,
    };
  }

  /** Slots RoundCore currently tracks as running. */
  activeSlots(): number[] {
    const out: number[] = [];
    for (let i = 0; i < this.#slots.length; i++) if (this.#slots[i]!.active) out.push(i);
    return out;
  }

  /**
   * Zero-copy staging of a slot's next rows (CONTRACT 7.5): the views of the slot's ring where
   * the rows of positions `[start, start + n)` live (one view, or two when the range wraps the
   * ring, oldest first; `n * rowBytes` bytes in all). The engine writes the tap rows there (for
   * example its device-to-host copy lands there) and, in the next round, passes
   * `rowsInRing: n` in the slot's request (with `anchorPos = start + n`, or `newRowsStart =
   * start`) instead of `newRows`: the ring copy is then skipped, and with `rowsMode: "parts"`
   * the rows are never copied on rank 0 at all.
   *
   * For the request the slot is running, `start` must be where the ring ends (the next
   * position); for a newer generation (a new request) any start. The ring positions the new rows
   * overwrite (the oldest, `start + n - W` and before) leave the ring at once, so a round that
   * never comes cannot make the ring claim rows it no longer holds; a new generation empties
   * the old request's ring and marks the slot for resync. A later call for the same slot
   * replaces the reservation. The returned array and views are reused: valid until the next call.
   *
   * @throws ClientError `CLIENT_BAD_ARGUMENT` for a slot outside `0..maxSlots-1`, a generation
   *   older than the slot's, `n` outside `1..W`, or a `start` that does not continue the ring.
   */
  rowsTarget(slot: number, generation: number, start: number, n: number): readonly Uint8Array[] {
    const W = this.#W;
    const rb = this.#rowBytes;
    if (!Number.isInteger(slot) || slot < 0 || slot >= this.#maxSlots) {
      throw bad(`rowsTarget: slot ${slot} outside 0..${this.#maxSlots - 1}`);
    }
    if (!isU32(generation)) throw bad(`rowsTarget: slot ${slot}: generation ${generation} is not a u32`);
    if (!Number.isInteger(n) || n < 1 || n > W) throw bad(`rowsTarget: slot ${slot}: n ${n} outside 1..${W}`);
    if (!isU32(start) || start + n > 0xffffffff) {
      throw bad(`rowsTarget: slot ${slot}: positions ${start}..${start + n} are not u32`);
    }
    const s = this.#slot(slot);
    const same = s.known && generation === s.generation;
    if (s.known && !same && !serialNewer(generation, s.generation)) {
      throw bad(
        `rowsTarget: slot ${slot}: generation ${generation} is older than ${s.generation} (CONTRACT 7.1)`,
      );
    }
    if (same && !s.active) {
      throw bad(
        `rowsTarget: slot ${slot}: generation ${generation} was released; a new request needs a newer one`,
      );
    }
    if (same && start !== s.ringEnd) {
      throw bad(`rowsTarget: slot ${slot}: rows from position ${start} but the ring ends at ${s.ringEnd}`);
    }
    s.ring ??= this.#newRing(W * rb);
    if (same) {
      if (s.ringStart < start + n - W) s.ringStart = Math.min(s.ringEnd, start + n - W);
    } else {
      s.ringStart = s.ringEnd;
      s.needResync = true;
    }
    s.resN = n;
    s.resStart = start;
    s.resGeneration = generation;
    const out = this.#targetOut;
    out.length = this.#ringViews(s, start, start + n, out, 0);
    return out;
  }

  // a slot's ring: in the transport's shared memory when it offers some (shm+unix: rows written
  // there by rowsTarget leave by offset and reach the worker with its one copy), else a buffer
  #newRing(bytes: number): Uint8Array {
    return this.client.allocRows?.(bytes) ?? Buffer.alloc(bytes);
  }

  /** RESET on the worker (CONTRACT 10) and resync of every slot on the next round. */
  async reset(): Promise<void> {
    for (const s of this.#slots) s.needResync = true;
    await this.client.reset();
  }

  // copies ring positions [a, b) into dst at off
  #copyRing(s: Slot, a: number, b: number, dst: Uint8Array, off: number): void {
    const W = this.#W;
    const rb = this.#rowBytes;
    const ring = s.ring!;
    let p = a;
    while (p < b) {
      const idx = p % W;
      const run = Math.min(b - p, W - idx);
      dst.set(ring.subarray(idx * rb, (idx + run) * rb), off);
      off += run * rb;
      p += run;
    }
  }

  // views of ring positions [a, b) written to out from index np (one, or two across the wrap);
  // each distinct view is made once per slot and reused; returns the new count
  #ringViews(s: Slot, a: number, b: number, out: Uint8Array[], np: number): number {
    const W = this.#W;
    const rb = this.#rowBytes;
    s.views ??= new Map();
    const views = s.views;
    let p = a;
    while (p < b) {
      const idx = p % W;
      const run = Math.min(b - p, W - idx);
      const key = idx * (W + 1) + run;
      let v = views.get(key);
      if (v === undefined) {
        v = s.ring!.subarray(idx * rb, (idx + run) * rb);
        views.set(key, v);
      }
      out[np++] = v;
      p += run;
    }
    return np;
  }

  // appends rows of positions [start, start + n) to the ring (only the last W are kept)
  #appendRing(s: Slot, rows: Uint8Array, start: number, n: number): void {
    const W = this.#W;
    const rb = this.#rowBytes;
    // a Buffer, so that ring views go to the socket without a Buffer wrapper per write
    s.ring ??= this.#newRing(W * rb);
    const ring = s.ring;
    let skip = n > W ? n - W : 0;
    let p = start + skip;
    const end = start + n;
    if (skip === 0 && (start % W) + n <= W) {
      // the common case: one run, the whole input (no subarray)
      ring.set(rows, (start % W) * rb);
      p = end;
    }
    while (p < end) {
      const idx = p % W;
      const run = Math.min(end - p, W - idx);
      ring.set(rows.subarray(skip * rb, (skip + run) * rb), idx * rb);
      skip += run;
      p += run;
    }
    s.ringEnd = end;
    if (s.ringEnd - s.ringStart > W) s.ringStart = s.ringEnd - W;
  }

  /**
   * Runs one round: updates the rings with the new rows, builds and sends the STEP (or none
   * when not ready), validates the reply through the client, and returns the drafts.
   *
   * @throws ClientError `CLIENT_BAD_ARGUMENT` for input the worker would refuse (a slot twice,
   *   an older generation, rows that do not end at the anchor, nOut > N, bad top_k); nothing
   *   is sent and no slot state changes for that round.
   */
  async round(input: RoundInput): Promise<RoundResult> {
    if (this.#running) throw bad("round() called while the previous round is still running");
    this.#running = true;
    try {
      return await this.#roundImpl(input);
    } finally {
      this.#running = false;
    }
  }

  #validate(input: RoundInput, nReq: number): void {
    const round = this.#round;
    const rb = this.#rowBytes;
    for (let i = 0; i < nReq; i++) {
      const r = input.requests[i]!;
      if (!Number.isInteger(r.slot) || r.slot < 0 || r.slot >= this.#maxSlots) {
        throw bad(`request ${i}: slot ${r.slot} outside 0..${this.#maxSlots - 1}`);
      }
      const s = this.#slot(r.slot);
      if (s.seenRound === round) throw bad(`${at(i, r.slot)}: slot appears twice in the round`);
      s.seenRound = round;
      if (!isU32(r.generation)) throw bad(`${at(i, r.slot)}: generation ${r.generation} is not a u32`);
      if (s.known && r.generation !== s.generation && !serialNewer(r.generation, s.generation)) {
        throw bad(
          `${at(i, r.slot)}: generation ${r.generation} is older than ${s.generation} (CONTRACT 7.1)`,
        );
      }
      if (s.known && !s.active && r.generation === s.generation) {
        throw bad(
          `${at(i, r.slot)}: generation ${r.generation} was released; a new request needs a newer one`,
        );
      }
      if (!isU32(r.anchorPos)) throw bad(`${at(i, r.slot)}: anchorPos ${r.anchorPos} is not a u32`);
      if (!isU32(r.anchorToken)) throw bad(`${at(i, r.slot)}: anchorToken ${r.anchorToken} is not a u32`);
      const nOut = r.nOut ?? 0;
      if (!Number.isInteger(nOut) || nOut < 0 || nOut > this.#N) {
        throw bad(`${at(i, r.slot)}: nOut ${nOut} outside 0..${this.#N}`);
      }
      const rows = r.newRows ?? null;
      const bytes = rows === null ? 0 : rows.length;
      if (bytes % rb !== 0)
        throw bad(`${at(i, r.slot)}: newRows holds ${bytes} bytes, not a multiple of row_bytes ${rb}`);
      const inRing = r.rowsInRing ?? 0;
      if (!Number.isInteger(inRing) || inRing < 0) {
        throw bad(`${at(i, r.slot)}: rowsInRing ${inRing} is not a non-negative integer`);
      }
      if (inRing > 0 && bytes > 0) throw bad(`${at(i, r.slot)}: both newRows and rowsInRing given`);
      const n = inRing > 0 ? inRing : bytes / rb;
      const start = r.newRowsStart ?? r.anchorPos - n;
      if (inRing > 0 && (s.resN !== inRing || s.resStart !== start || s.resGeneration !== r.generation)) {
        const held =
          s.resN === 0 ? "none" : `${s.resN} rows from ${s.resStart}, generation ${s.resGeneration}`;
        throw bad(
          `${at(i, r.slot)}: rowsInRing ${inRing} from position ${start}, generation ${r.generation} does not match the rowsTarget reservation (${held})`,
        );
      }
      if (n > 0 && (!Number.isInteger(start) || start < 0 || start + n !== r.anchorPos)) {
        throw bad(
          `${at(i, r.slot)}: ${n} new rows from position ${start} do not end at anchorPos ${r.anchorPos}`,
        );
      }
      const fresh = !s.known || r.generation !== s.generation;
      if (!fresh) {
        if (n > 0 && start !== s.ringEnd) {
          throw bad(
            `${at(i, r.slot)}: new rows start at position ${start} but the ring ends at ${s.ringEnd}`,
          );
        }
        if (n === 0 && r.anchorPos !== s.ringEnd) {
          throw bad(
            `${at(i, r.slot)}: anchorPos ${r.anchorPos} moved past the ring end ${s.ringEnd} without rows`,
          );
        }
      }
      if (this.#sampled && r.sampleMeta != null) {
        const m = r.sampleMeta;
        if (!isU32(m.seed)) throw bad(`${at(i, r.slot)}: sampleMeta.seed ${m.seed} is not a u32`);
        if (!Number.isInteger(m.topK) || m.topK < 1 || m.topK > 32) {
          throw bad(`${at(i, r.slot)}: sampleMeta.topK ${m.topK} outside 1..32 (CONTRACT 7.3)`);
        }
        if (!Number.isInteger(m.tempMilli) || m.tempMilli < 0 || m.tempMilli > 0xffff) {
          throw bad(`${at(i, r.slot)}: sampleMeta.tempMilli ${m.tempMilli} is not a u16`);
        }
      }
    }
    for (const slot of input.release ?? []) {
      if (!Number.isInteger(slot) || slot < 0 || slot >= this.#maxSlots) {
        throw bad(`release: slot ${slot} outside 0..${this.#maxSlots - 1}`);
      }
    }
  }

  async #roundImpl(input: RoundInput): Promise<RoundResult> {
    this.#round++;
    const nReq = input.nRequests ?? input.requests.length;
    if (!Number.isInteger(nReq) || nReq < 0 || nReq > input.requests.length) {
      throw bad(`nRequests ${nReq} outside 0..${input.requests.length}`);
    }
    this.#validate(input, nReq);
    const res = this.#result;
    res.drafts.length = nReq;
    res.resynced = 0;
    res.deferred = 0;
    res.released = 0;
    res.rowsSent = 0;
    res.rttUs = 0;
    res.expectedAccepted = 0;
    this.#updateRings(input, nReq);
    const client = this.client;
    const epoch = client.connectionEpoch();
    res.epoch = epoch;
    if (epoch === null) {
      const why: DraftReason = client.disabled ? "disabled" : "not_ready";
      for (let i = 0; i < nReq; i++) res.drafts[i]!.clear(why);
      res.outcome = why;
      // A target-only round does no I/O. An engine that awaits round() in a tight loop would
      // then never leave the microtask queue, starving the client's own connect-loop timers;
      // one macrotask turn per target-only round lets the reconnect (and everything else) run.
      await yieldToEventLoop();
      return res;
    }
    const nEntries = this.#plan(input, nReq, epoch);
    if (nEntries === 0) {
      res.outcome = "idle";
      return res;
    }
    this.#buildEntries(input, nEntries);

    // the STEP
    const call = this.#call;
    call.stepId = this.#stepId;
    call.nEntries = nEntries;
    call.nRows = res.rowsSent;
    call.epoch = epoch;
    const outcome = await client.step(call);
    res.outcome = outcome.reason;
    res.rttUs = outcome.rttUs;
    if (!outcome.ok || outcome.reply === null) {
      this.#failEntries(outcome, nEntries);
      return res;
    }
    this.#applyReply(outcome, outcome.reply, nEntries);
    this.#allocateDepths(input, nReq);
    return res;
  }

  // 1. rings: every round, ready or not (CONTRACT 7.5); releases marked
  #updateRings(input: RoundInput, nReq: number): void {
    const W = this.#W;
    const rb = this.#rowBytes;
    const res = this.#result;
    for (let i = 0; i < nReq; i++) {
      const r = input.requests[i]!;
      const s = this.#slot(r.slot);
      const rows = r.newRows ?? null;
      const inRing = r.rowsInRing ?? 0;
      const n = inRing > 0 ? inRing : rows === null ? 0 : rows.length / rb;
      if (!s.known || r.generation !== s.generation) {
        // a new request in the slot: its ring starts over, the worker must resync it
        s.known = true;
        s.generation = r.generation;
        s.active = true;
        s.pendingRelease = false;
        s.needResync = true;
        s.workerEnd = -1;
        s.waitedRounds = 0;
        s.freshRound = this.#round;
        s.ringStart = s.ringEnd = n > 0 ? (r.newRowsStart ?? r.anchorPos - n) : r.anchorPos;
      }
      if (inRing > 0) {
        // the engine wrote them in place (rowsTarget): the ring only moves on
        s.ringEnd += n;
        if (s.ringEnd - s.ringStart > W) s.ringStart = s.ringEnd - W;
      } else if (n > 0) {
        this.#appendRing(s, rows!, s.ringEnd, n);
      }
      s.resN = 0;
      res.drafts[i] = this.#draftOf(r.slot, s);
    }
    for (const slot of input.release ?? []) {
      const s = this.#slot(slot);
      if (s.seenRound === this.#round || !s.known) continue; // a new request took it, or never used
      if (s.active || s.pendingRelease) {
        s.active = false;
        s.pendingRelease = true;
      }
    }
  }

  // 2. plan: resync or new rows per request; defer whole entries past max_rows_per_step.
  // Returns the entry count (RELEASE entries included); leaves the order in #order / #nOrd.
  #plan(input: RoundInput, nReq: number, epoch: number): number {
    const res = this.#result;
    const link = this.client;
    const perSlot = typeof link.slotEpoch === "function";
    const order = this.#order;
    let nOrd = 0;
    // requests deferred before go first, so that none starves
    for (let pass = 0; pass < 2; pass++) {
      for (let i = 0; i < nReq; i++) {
        const waited = this.#slots[input.requests[i]!.slot]!.waitedRounds > 0;
        if (waited === (pass === 0)) order[nOrd++] = i;
      }
    }
    let totalRows = 0;
    let nEntries = 0;
    const plannedRows = this.#plannedRows;
    for (let o = 0; o < nOrd; o++) {
      const i = order[o]!;
      const r = input.requests[i]!;
      const s = this.#slots[r.slot]!;
      const anchor = r.anchorPos;
      // the slot's epoch: a pool assigns the slot to a ready member here (CONTRACT 12.2)
      const se = perSlot ? link.slotEpoch!(r.slot, s.freshRound === this.#round) : epoch;
      if (se === null) {
        plannedRows[i] = -2;
        res.drafts[i]!.clear("not_ready");
        continue;
      }
      this.#plannedEpoch[i] = se;
      let resync = s.needResync || s.syncedEpoch !== se || s.workerEnd < s.ringStart || s.workerEnd > anchor;
      let start = resync ? s.ringStart : s.workerEnd;
      let count = anchor - start;
      if (count > this.#maxRows) {
        // more rows than one STEP may carry: send the newest as a RESYNC (the worker answers PARTIAL_WINDOW)
        resync = true;
        start = anchor - this.#maxRows;
        count = this.#maxRows;
      }
      if (totalRows + count > this.#maxRows) {
        plannedRows[i] = -1;
        s.waitedRounds++;
        res.drafts[i]!.clear("deferred");
        res.deferred++;
        continue;
      }
      s.waitedRounds = 0;
      totalRows += count;
      plannedRows[i] = count;
      this.#plannedStart[i] = start;
      this.#plannedResync[i] = resync ? 1 : 0;
      nEntries++;
    }
    for (const s of this.#slots) if (s.pendingRelease && s.seenRound !== this.#round) nEntries++;
    this.#nOrd = nOrd;
    res.rowsSent = totalRows;
    return nEntries;
  }

  // 3. entries, then rows staged straight into the send buffer or as ring views (CONTRACT 7.3)
  #buildEntries(input: RoundInput, nEntries: number): void {
    const client = this.client;
    const res = this.#result;
    const rb = this.#rowBytes;
    const order = this.#order;
    const nOrd = this.#nOrd;
    const plannedRows = this.#plannedRows;
    const buf = client.sendBuffer;
    let off = client.rowsOffset(nEntries);
    const parts = this.#parts;
    const asParts = this.rowsMode === "parts";
    let np = 0; // parts written; the array keeps its length between rounds of the same shape
    let e = 0;
    for (let o = 0; o < nOrd; o++) {
      const i = order[o]!;
      const count = plannedRows[i]!;
      if (count < 0) continue;
      const r = input.requests[i]!;
      const s = this.#slots[r.slot]!;
      const en = this.#entry(e);
      const start = this.#plannedStart[i]!;
      const resync = this.#plannedResync[i] === 1;
      const needDraft = r.needDraft ?? true;
      en.slot = r.slot;
      en.generation = r.generation;
      en.anchorPos = r.anchorPos;
      en.anchorToken = r.anchorToken;
      en.rowStart = count > 0 ? start : 0;
      en.nRows = count;
      en.nOut = r.nOut ?? 0;
      en.flags = (needDraft ? EntryFlag.NEED_DRAFT : 0) | (resync ? EntryFlag.RESYNC : 0);
      if (this.#sampled) {
        const m = this.#meta[e]!;
        const src = r.sampleMeta ?? GREEDY_META;
        m.seed = src.seed;
        m.topK = src.topK;
        m.tempMilli = src.tempMilli;
      }
      if (resync) res.resynced++;
      this.#entryEpoch[e] = this.#plannedEpoch[i]!;
      if (count > 0 && asParts) {
        np = this.#ringViews(s, start, start + count, parts, np);
      } else if (count > 0) {
        this.#copyRing(s, start, start + count, buf, off);
        off += count * rb;
      }
      this.#entryReq[e] = i;
      e++;
    }
    for (let slot = 0; slot < this.#slots.length; slot++) {
      const s = this.#slots[slot]!;
      if (!s.pendingRelease || s.seenRound === this.#round) continue;
      const en = this.#entry(e);
      en.slot = slot;
      en.generation = s.generation;
      en.anchorPos = 0;
      en.anchorToken = 0;
      en.rowStart = 0;
      en.nRows = 0;
      en.nOut = 0;
      en.flags = EntryFlag.RELEASE;
      if (this.#sampled) {
        const m = this.#meta[e]!;
        m.seed = 0;
        m.topK = 1;
        m.tempMilli = 0;
      }
      this.#entryReq[e] = -1;
      res.released++;
      e++;
    }
    if (parts.length !== np) parts.length = np;
    this.#stepId = (this.#stepId + 1) >>> 0;
    res.stepId = this.#stepId;
  }

  // a STEP that failed: its entries get no draft; an unknown apply resyncs them (CONTRACT 7.5, 9.2)
  #failEntries(all: StepOutcome, nEntries: number): void {
    for (let k = 0; k < nEntries; k++) this.#failEntry(all.perEntry?.[k] ?? all, k);
  }

  // one entry whose STEP failed (a pool's entries each have their own STEP, CONTRACT 12.2)
  #failEntry(outcome: StepOutcome, k: number): void {
    const res = this.#result;
    {
      const i = this.#entryReq[k]!;
      if (outcome.unknownApply) {
        // the worker may or may not hold these rows: resync (CONTRACT 7.5, 9.2)
        const s = this.#slots[this.#entries[k]!.slot]!;
        s.needResync = true;
      }
      if (i >= 0) res.drafts[i]!.clear(outcome.reason as DraftReason);
    }
  }

  // 5. apply the reply: windows known, drafts copied, STALE_GENERATION starts a new session
  #applyReply(outcome: StepOutcome, reply: StepReplyViews, nEntries: number): void {
    const W = this.#W;
    const res = this.#result;
    const client = this.client;
    const perEntry = outcome.perEntry;
    // 5. apply the reply
    let stale = -1;
    for (let k = 0; k < nEntries; k++) {
      const own = perEntry?.[k];
      if (own !== undefined && !own.ok) {
        this.#failEntry(own, k);
        continue;
      }
      const en = this.#entries[k]!;
      const s = this.#slots[en.slot]!;
      const st = reply.status[k]!;
      const held = reply.windowRows[k]!;
      const i = this.#entryReq[k]!;
      if (i < 0) {
        if (st === ReqStatus.STALE_GENERATION) stale = en.slot;
        else s.pendingRelease = false;
        continue;
      }
      const d = res.drafts[i]!;
      d.windowRows = held;
      if (st === ReqStatus.STALE_GENERATION) {
        stale = en.slot;
        s.needResync = true;
        d.clear("stale_generation");
        d.windowRows = held;
        continue;
      }
      const expected = Math.min(W, en.anchorPos);
      const have = Math.min(W, en.anchorPos - s.ringStart);
      if (held === expected || held === have) {
        s.workerEnd = en.anchorPos;
        s.syncedEpoch = this.#entryEpoch[k]!;
        s.needResync = false;
      } else {
        s.needResync = true;
      }
      d.status = st;
      if ((en.flags & EntryFlag.NEED_DRAFT) === 0) {
        d.clear("not_requested");
        d.status = st;
        d.windowRows = held;
        continue;
      }
      if (st !== ReqStatus.OK && st !== ReqStatus.PARTIAL_WINDOW) {
        d.clear((REQ_STATUS_NAMES[st] ?? "draft_failed").toLowerCase() as DraftReason);
        d.status = st;
        d.windowRows = held;
        continue;
      }
      this.#copyDraft(reply, k, en.nOut, d);
      d.reason = st === ReqStatus.OK ? "ok" : "partial_window";
    }
    if (stale >= 0) {
      client.newSession(`STALE_GENERATION for slot ${stale} (CONTRACT 7.1)`);
    }
  }

  // 6. confidence-scheduled verification
  #allocateDepths(input: RoundInput, nReq: number): void {
    const res = this.#result;
    // 6. confidence-scheduled verification
    const dp = this.depthPolicy;
    if (dp !== null) {
      const cands = this.#cands;
      cands.length = nReq;
      for (let i = 0; i < nReq; i++) {
        const d = res.drafts[i]!;
        let c = cands[i];
        if (c === undefined) {
          c = { k: 0, conf: d.conf, margin: d.margin };
          cands[i] = c;
        }
        c.k = d.k;
        c.conf = d.conf;
        c.margin = d.margin;
      }
      if (this.#depthOut.length < nReq) this.#depthOut = new Int32Array(nReq);
      const out = this.#depthOut;
      res.expectedAccepted = dp.allocateFor(cands as readonly DepthCandidate[], input.batchSize ?? nReq, out);
      for (let i = 0; i < nReq; i++) res.drafts[i]!.depth = out[i]!;
    }
  }

  #copyDraft(reply: StepReplyViews, k: number, nOut: number, d: DraftOut): void {
    // element loops: N is small, and subarray() would allocate a view per array per entry
    const N = this.#N;
    const kk = nOut === 0 ? N : Math.min(nOut, N);
    const a = k * N;
    d.k = kk;
    d.depth = kk;
    const ids = d.ids;
    const conf = d.conf;
    const rIds = reply.draftIds;
    const rConf = reply.confidence;
    for (let j = 0; j < N; j++) {
      ids[j] = rIds[a + j]!;
      conf[j] = rConf[a + j]!;
    }
    const m = d.margin;
    const rm = reply.margin;
    if (m !== null && rm !== null) for (let j = 0; j < N; j++) m[j] = rm[a + j]!;
    if (d.sampledMask !== null && reply.sampledMask !== null) {
      const mask = d.sampledMask;
      const rMask = reply.sampledMask;
      for (let j = 0; j < N; j++) mask[j] = rMask[a + j]!;
      const sup = d.supportIds!;
      const q = d.proposalQ!;
      const rSup = reply.supportIds!;
      const rq = reply.proposalQ!;
      const b = a * 32;
      for (let j = 0; j < N * 32; j++) {
        sup[j] = rSup[b + j]!;
        q[j] = rq[b + j]!;
      }
    }
  }
}
