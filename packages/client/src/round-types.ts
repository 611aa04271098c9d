import type { SampleMeta } from "@tapwire/wire";
import type { StepCall } from "./client.js";
import type { DepthPolicy } from "./depth-policy.js";
import type { StepOutcome, StepOutcomeReason } from "./outcomes.js";

// The public shapes of RoundCore (CONTRACT 7.5): what the engine passes in and gets back.

/**
 * The one interface {@link RoundCore} talks to (CONTRACT 7.5, 12.2): implemented by
 * {@link RemoteDraftClient} (one worker) and {@link WorkerPool} (several workers, each slot
 * assigned to one of them); a fake implements it in unit tests. RoundCore has one code path for
 * both: it asks {@link DraftLink.slotEpoch} per slot whether the slot must resync, sends one
 * {@link DraftLink.step} per round, and applies each entry's own outcome
 * ({@link StepOutcome.perEntry}).
 */
export interface DraftLink {
  /** The link's validated options (geometry and limits). */
  readonly options: {
    /** Window `W`: rows kept per slot (1..4096, CONTRACT 7.1). */
    readonly window: number;
    /** Draft tokens per request `N` (1..32). */
    readonly numSpec: number;
    /** Bytes of one tap row: `numTaps * hidden * 2` (bf16). */
    readonly rowBytes: number;
    /** Slots asked for in the HELLO (`slot < maxSlots`). */
    readonly maxSlots: number;
    /** Rows per STEP at most, asked for in the HELLO. */
    readonly maxRowsPerStep: number;
    /** True in top32 (sampled) sessions (CONTRACT 8). */
    readonly sampled: boolean;
    /** Whether the HELLO asked for margins (flag WANT_MARGIN; default true). */
    readonly wantMargin: boolean;
  };
  /** Where rows are staged in `"stage"` mode. */
  readonly sendBuffer: Uint8Array;
  /** True once disabled (CONTRACT 9.3; a pool: no member can ever serve, 12.2). */
  readonly disabled: boolean;
  /**
   * Memory for a slot's ring of `bytes` bytes that a shared-memory transport sends by offset
   * (issue 23, `shm+unix://`), or null (the ring is then an ordinary buffer). Optional.
   */
  allocRows?(bytes: number): Uint8Array | null;
  /** The ready connection's epoch (a pool: a number while any member is ready), or null. */
  connectionEpoch(): number | null;
  /**
   * The epoch a slot's entry is built for this round, or null when no connection can take it
   * (the entry is then target-only, `not_ready`). A slot whose value differs from the one of
   * its last sync is sent with RESYNC and its whole ring (CONTRACT 7.5). A pool assigns the slot
   * to a ready member here (12.2), so RoundCore calls it once per planned slot and round;
   * `fresh` is true when a new request took the slot this round (a pool places it anew, fewest
   * slots first). Optional: without it every slot uses {@link connectionEpoch}.
   */
  slotEpoch?(slot: number, fresh: boolean): number | null;
  /** Offset of the rows in `sendBuffer` for `nEntries` entries. */
  rowsOffset(nEntries: number): number;
  /** One round's STEP (a pool: one STEP per member) and its CONTRACT 9.2 outcome(s). */
  step(call: StepCall): Promise<StepOutcome>;
  /** Takes a new session id and reconnects (CONTRACT 6.2). */
  newSession(reason: string): void;
  /** RESET on the worker(s) (CONTRACT 10). */
  reset(): Promise<void>;
}

/** The part of {@link RemoteDraftClient} RoundCore uses: the 1.1 name of {@link DraftLink}. */
export type RoundClient = DraftLink;

/** One running request as the engine reports it for a round (CONTRACT 7.5). */
export interface RoundRequest {
  /** Slot index (< maxSlots). */
  readonly slot: number;
  /** The request's generation in the slot (u32, serial; newer for every new request, CONTRACT 7.1). */
  readonly generation: number;
  /** Position of the anchor token (the last accepted token; rows exist for `[0, anchorPos)`). */
  readonly anchorPos: number;
  /** The anchor token id. */
  readonly anchorToken: number;
  /**
   * Tap rows of the tokens accepted since the last round (`n * rowBytes` bytes, positions
   * `[newRowsStart, anchorPos)`), or null/empty when none. Copied into the slot's ring.
   */
  readonly newRows?: Uint8Array | null;
  /**
   * Zero-copy alternative to `newRows`: the number of new rows the engine already wrote into the
   * views {@link RoundCore.rowsTarget} returned for this slot, generation and positions. Not
   * with a non-empty `newRows`.
   */
  readonly rowsInRing?: number;
  /** Position of the first new row (default `anchorPos - n`); it must continue the ring unless the request is new. */
  readonly newRowsStart?: number;
  /** Ask for drafts this round (default true). */
  readonly needDraft?: boolean;
  /** Draft tokens wanted (0 = N, default 0; at most N). */
  readonly nOut?: number;
  /** Sampling of this request in top32 sessions (default greedy: `{seed 0, topK 1, tempMilli 0}`). */
  readonly sampleMeta?: SampleMeta | null;
}

/** The input of one decode round. */
export interface RoundInput {
  /** Running requests. */
  readonly requests: readonly RoundRequest[];
  /** Use only `requests[0..nRequests)` (default all); lets engines reuse arrays. */
  readonly nRequests?: number;
  /** Slots whose requests finished since the last round: sent as RELEASE (retried until answered). */
  readonly release?: readonly number[];
  /** Batch size for the depth policy's load curve (default the number of requests). */
  readonly batchSize?: number;
}

/** Why a request got (or did not get) drafts this round. */
export type DraftReason =
  | "ok"
  | "partial_window"
  | "deferred"
  | "not_requested"
  | "need_resync"
  | "stale_generation"
  | "skipped"
  | "draft_failed"
  | Exclude<StepOutcomeReason, "ok">;

/**
 * The drafts of one request for one round. The arrays belong to the slot and are overwritten by
 * the next round that carries the slot: copy what must outlive the round.
 */
export interface RoundDraft {
  /** The request's slot. */
  readonly slot: number;
  /** `"ok"` / `"partial_window"` when `k > 0`, else why there is no draft. */
  readonly reason: DraftReason;
  /** The per-request status of the reply (CONTRACT 7.2), or -1 when the entry got none. */
  readonly status: number;
  /** Draft tokens usable: `ids[0..k)` (CONTRACT 6.3); 0 when none. */
  readonly k: number;
  /** Tokens the target should verify (the depth policy's choice, `<= k`; `k` without a policy). */
  readonly depth: number;
  /** The worker's window rows for the entry (CONTRACT 7.2 step 6). */
  readonly windowRows: number;
  /** Draft ids, length N. */
  readonly ids: Int32Array;
  /** Confidences, length N. */
  readonly conf: Float32Array;
  /** Margins, length N, or null without WANT_MARGIN. */
  readonly margin: Float32Array | null;
  /** Sampled mask, length N, in top32 sessions (CONTRACT 8). */
  readonly sampledMask: Uint8Array | null;
  /** Support ids, length N*32, in top32 sessions. */
  readonly supportIds: Int32Array | null;
  /** Dyadic q (units of 2^-24), length N*32, in top32 sessions. */
  readonly proposalQ: Uint32Array | null;
}

/** The result of one round. The object and its drafts are reused: valid until the next round. */
export interface RoundResult {
  /** The STEP's 9.2 outcome, or `"idle"` when there was nothing to send. */
  readonly outcome: StepOutcomeReason | "idle";
  /** The round's step id (u32; one per round that sent a STEP). */
  readonly stepId: number;
  /** The connection epoch the round was built for, or null for a target-only round. */
  readonly epoch: number | null;
  /** STEP round-trip time in microseconds (0 when nothing was sent). */
  readonly rttUs: number;
  /** One per input request, in input order. */
  readonly drafts: readonly RoundDraft[];
  /** Entries sent with RESYNC this round. */
  readonly resynced: number;
  /** Entries deferred to a later round (rows over max_rows_per_step). */
  readonly deferred: number;
  /** RELEASE entries sent. */
  readonly released: number;
  /** Rows carried by the STEP. */
  readonly rowsSent: number;
  /** Expected accepted tokens of the chosen depths (0 without a depth policy). */
  readonly expectedAccepted: number;
}

/** Options of {@link RoundCore}. */
export interface RoundCoreOptions {
  /** The link: a {@link RemoteDraftClient} or a {@link WorkerPool} (CONTRACT 12.2). */
  client: DraftLink;
  /** Confidence-scheduled verification; without it every draft's depth is its k. */
  depthPolicy?: DepthPolicy;
  /**
   * How rows leave: `"parts"` (default) sends the prefix followed by views of the rings
   * (scatter/gather: the copy into the ring is the only copy of a row on the client);
   * `"stage"` copies them from the rings into the client's send buffer at
   * `24 + rows_offset_for(n)` and sends one message (one more copy per row; slower in every
   * benchmarked shape, see docs/benchmarks/client.md).
   */
  rowsMode?: "stage" | "parts";
}

/** What RoundCore keeps for one slot, for inspection in tests and tools. */
export interface SlotView {
  /** True while a request holds the slot. */
  readonly active: boolean;
  /** The slot's current generation (CONTRACT 7.1). */
  readonly generation: number;
  /** Positions the ring holds: `[ringStart, ringEnd)`. */
  readonly ringStart: number;
  /** End (exclusive) of the positions the ring holds. */
  readonly ringEnd: number;
  /** Where the worker's window is known to end, or -1 when unknown (resync due). */
  readonly workerEnd: number;
  /** True when the next round sends this slot with RESYNC and the whole ring (CONTRACT 7.5). */
  readonly needResync: boolean;
  /** True while a RELEASE for the slot is still to be answered. */
  readonly pendingRelease: boolean;
  /** A copy of the ring's rows, oldest first. */
  readonly rows: Uint8Array;
}
