import type { SampleMeta } from "@tapwire/wire";
import { Capability, DYADIC_ONE, TOP_K_MAX } from "@tapwire/wire";
import { WorkerError } from "./errors.js";
import { intOption } from "./int-option.js";

/**
 * One consumed entry of a STEP handed to {@link Drafter.draft} (CONTRACT 7.2 step 5): an entry
 * with NEED_DRAFT whose status is OK or PARTIAL_WINDOW.
 */
export interface DraftBatchEntry {
  /** Index of the entry in the STEP; its outputs live at `index * numSpec + j`. */
  index: number;
  /** Slot of the entry. */
  slot: number;
  /** Position of the anchor token (CONTRACT 2). */
  anchorPos: number;
  /** The anchor token id. */
  anchorToken: number;
  /** Positions to draft: `n_out == 0 ? N : min(n_out, N)` (CONTRACT 6.3). */
  k: number;
  /**
   * The window rows that end at `anchorPos`, oldest first, contiguous bf16 (`nRows * rowBytes`
   * bytes). A view into the worker's slot store: valid during the call only, never written.
   */
  rows: Uint8Array;
  /** Rows in `rows` (`<= min(W, anchorPos)`; fewer means PARTIAL_WINDOW). */
  nRows: number;
  /** Sample meta of the entry in TOP32 sessions (CONTRACT 7.3, 8), else null. */
  sample: SampleMeta | null;
}

/**
 * Where a drafter writes: the reply's views (CONTRACT 7.4), zero-filled before the call. Entry
 * `e` position `j` lives at `[e.index * numSpec + j]`; its support ids and q at
 * `[(e.index * numSpec + j) * 32 + t]`.
 */
export interface DraftOutput {
  /** Draft token ids, `i32[n_req * N]`, each in `[0, vocab_size)` for consumed positions. */
  draftIds: Int32Array;
  /** Top-1 probability per position, finite in `[0, 1]`. */
  confidence: Float32Array;
  /** Top-1 minus top-2 logit; present exactly when the session asked WANT_MARGIN. */
  margin: Float32Array | null;
  /** Present exactly in TOP32 sessions (CONTRACT 8). */
  sampledMask: Uint8Array | null;
  /** TOP32 sessions: `i32[n_req * N * 32]`, the top_k distinct support ids of a sampled position. */
  supportIds: Int32Array | null;
  /** TOP32 sessions: `u32[n_req * N * 32]`, dyadic q (each >= 1, summing to 2^24) of the support. */
  proposalQ: Uint32Array | null;
  /** `N` of the session: the stride of the per-position arrays. */
  numSpec: number;
  /**
   * Per entry index, zeroed before the call: a drafter sets `failed[e.index] = 1` to answer that
   * entry DRAFT_FAILED without failing the rest of the batch. (The worker always provides it.)
   */
  failed?: Uint8Array;
}

/**
 * A drafting backend served by the worker. The worker calls {@link draft} once per STEP with
 * every consumed entry. A throw (or a rejected promise) marks every entry of the batch
 * DRAFT_FAILED; values that break CONTRACT 6.3 or 8 mark that entry DRAFT_FAILED.
 */
export interface Drafter {
  /** SHA-256 of the drafter's weights (32 bytes, CONTRACT 6.1). */
  readonly drafterIdentity: Uint8Array;
  /** SHA-256 of the Markov head's weights (32 bytes). */
  readonly markovIdentity: Uint8Array;
  /** Window `W` in rows (1..4096). */
  readonly window: number;
  /** Draft positions `N` (1..32). */
  readonly numSpec: number;
  /** Vocabulary size; drafted ids are in `[0, vocabSize)`. */
  readonly vocabSize: number;
  /** Tap vectors per row. */
  readonly numTaps: number;
  /** bf16 values per tap vector (`row_bytes = numTaps * hidden * 2`). */
  readonly hidden: number;
  /** {@link Capability} bits; TAPS_BF16 is required. */
  readonly capabilities: number;
  /** Draft every entry of the batch into `out`. */
  draft(batch: readonly DraftBatchEntry[], out: DraftOutput): void | Promise<void>;
}

/** Options of {@link NullDrafter}. */
export interface NullDrafterOptions {
  /** Default 32 zero bytes. */
  drafterIdentity?: Uint8Array;
  /** Default 32 zero bytes. */
  markovIdentity?: Uint8Array;
  /** Default 16. */
  window?: number;
  /** Default 4. */
  numSpec?: number;
  /** Default 2048. */
  vocabSize?: number;
  /** Default 3. */
  numTaps?: number;
  /** Default 1024. */
  hidden?: number;
  /** Default TAPS_BF16 | TOP32 | MARGIN. */
  capabilities?: number;
}

/** @internal Validates the geometry every drafter must have (names the bad field). */
export function checkDrafter(d: Drafter): void {
  const bad = (what: string): never => {
    throw new WorkerError("WORKER_BAD_DRAFTER", `drafter ${what}`);
  };
  if (!(d.drafterIdentity instanceof Uint8Array) || d.drafterIdentity.length !== 32) {
    bad("drafterIdentity is not 32 bytes");
  }
  if (!(d.markovIdentity instanceof Uint8Array) || d.markovIdentity.length !== 32) {
    bad("markovIdentity is not 32 bytes");
  }
  if (!Number.isInteger(d.window) || d.window < 1 || d.window > 4096)
    bad(`window ${d.window} outside 1..4096`);
  if (!Number.isInteger(d.numSpec) || d.numSpec < 1 || d.numSpec > 32)
    bad(`numSpec ${d.numSpec} outside 1..32`);
  if (!Number.isInteger(d.vocabSize) || d.vocabSize < 1 || d.vocabSize > 0x7fffffff) {
    bad(`vocabSize ${d.vocabSize} outside 1..2^31-1`);
  }
  if (!Number.isInteger(d.numTaps) || d.numTaps < 1 || d.numTaps > 0xffff)
    bad(`numTaps ${d.numTaps} outside 1..65535`);
  if (!Number.isInteger(d.hidden) || d.hidden < 1 || d.numTaps * d.hidden * 2 > 0xffffffff) {
    bad(`hidden ${d.hidden} gives no u32 row_bytes`);
  }
  if ((d.capabilities & Capability.TAPS_BF16) === 0) bad("capabilities lack TAPS_BF16");
  if (typeof d.draft !== "function") bad("has no draft() method");
}

function identityOption(name: string, v: Uint8Array | undefined): Uint8Array {
  if (v === undefined) return new Uint8Array(32);
  if (!(v instanceof Uint8Array) || v.length !== 32) {
    throw new WorkerError("WORKER_BAD_OPTION", `${name} must be 32 bytes`);
  }
  return v.slice();
}

/**
 * A drafter that does no model work, for link benchmarks and tests: position `j` of an entry is
 * `(anchorToken + j + 1) % vocabSize` with confidence 0.5 and margin 1.0. Sampled positions
 * (CONTRACT 8) get the support `(anchorToken + j + 1 + t) % vocabSize` for `t < top_k`, q as
 * equal as dyadic units allow (the remainder on the first ids), and the draft id
 * `support[(seed + j) % top_k]`. Deterministic and allocation-free.
 */
export class NullDrafter implements Drafter {
  readonly drafterIdentity: Uint8Array;
  readonly markovIdentity: Uint8Array;
  readonly window: number;
  readonly numSpec: number;
  readonly vocabSize: number;
  readonly numTaps: number;
  readonly hidden: number;
  readonly capabilities: number;
  /** Draft calls so far (tests read it). */
  calls = 0;

  constructor(options: NullDrafterOptions = {}) {
    this.drafterIdentity = identityOption("drafterIdentity", options.drafterIdentity);
    this.markovIdentity = identityOption("markovIdentity", options.markovIdentity);
    this.window = intOption("window", options.window, 16, 1, 4096);
    this.numSpec = intOption("numSpec", options.numSpec, 4, 1, 32);
    this.vocabSize = intOption("vocabSize", options.vocabSize, 2048, 1, 0x7fffffff);
    this.numTaps = intOption("numTaps", options.numTaps, 3, 1, 0xffff);
    this.hidden = intOption("hidden", options.hidden, 1024, 1, 0x7fffffff);
    this.capabilities = intOption(
      "capabilities",
      options.capabilities,
      Capability.TAPS_BF16 | Capability.TOP32 | Capability.MARGIN,
      0,
      7,
    );
    checkDrafter(this);
  }

  draft(batch: readonly DraftBatchEntry[], out: DraftOutput): void {
    this.calls++;
    const V = this.vocabSize;
    const N = out.numSpec;
    for (let b = 0; b < batch.length; b++) {
      const e = batch[b]!;
      const base = e.index * N;
      const sample = e.sample;
      const sampled = sample !== null && sample.tempMilli > 0 && out.supportIds !== null;
      for (let j = 0; j < e.k; j++) {
        const p = base + j;
        let id = (e.anchorToken + j + 1) % V;
        if (sampled) {
          const topK = sample.topK;
          const q = out.proposalQ!;
          const ids = out.supportIds!;
          const o = p * TOP_K_MAX;
          const each = Math.floor(DYADIC_ONE / topK);
          const extra = DYADIC_ONE - each * topK;
          for (let t = 0; t < topK; t++) {
            ids[o + t] = (e.anchorToken + j + 1 + t) % V;
            q[o + t] = each + (t < extra ? 1 : 0);
          }
          id = ids[o + ((sample.seed + j) % topK)]!;
          out.sampledMask![p] = 1;
        }
        out.draftIds[p] = id;
        out.confidence[p] = 0.5;
        if (out.margin !== null) out.margin[p] = 1.0;
      }
    }
  }
}
