import type { DraftHead, DraftOut, DraftSample } from "@tapwire/reference-model";
import { Capability, TOP_K_MAX } from "@tapwire/wire";
import type { DraftBatchEntry, Drafter, DraftOutput } from "./drafter.js";
import { checkDrafter } from "./drafter.js";
import { WorkerError } from "./errors.js";

/** Options of {@link ReferenceDrafter}. */
export interface ReferenceDrafterOptions {
  /** Window `W` announced in the HelloReply (default the head's `config.window`). */
  window?: number;
  /** `N` (default the head's `config.numSpec`). */
  numSpec?: number;
}

/**
 * A {@link Drafter} over `@tapwire/reference-model`'s `DraftHead`: identities, vocabulary and
 * row geometry come from the head; greedy and TOP32 (dyadic q, CONTRACT 8) drafting write
 * straight into the reply views. Entries are drafted one after another in the calling thread.
 * An entry the head refuses (e.g. an anchor token outside the vocabulary) is marked
 * DRAFT_FAILED alone; the rest of the batch is unaffected.
 */
export class ReferenceDrafter implements Drafter {
  readonly drafterIdentity: Uint8Array;
  readonly markovIdentity: Uint8Array;
  readonly window: number;
  readonly numSpec: number;
  readonly vocabSize: number;
  readonly numTaps: number;
  readonly hidden: number;
  readonly capabilities = Capability.TAPS_BF16 | Capability.TOP32 | Capability.MARGIN;
  /** The wrapped head. */
  readonly head: DraftHead;
  // Reused per entry: the head's out/sample records (no allocation per STEP).
  readonly #out: DraftOut = {
    ids: new Int32Array(0),
    conf: new Float32Array(0),
    margin: null,
    offset: 0,
  };
  readonly #sample: DraftSample = {
    seed: 0,
    topK: 1,
    tempMilli: 0,
    supportIds: new Int32Array(0),
    proposalQ: new Uint32Array(0),
    offset: 0,
    position: 0,
  };

  constructor(head: DraftHead, options: ReferenceDrafterOptions = {}) {
    if (head === null || typeof head !== "object" || typeof head.draft !== "function") {
      throw new WorkerError("WORKER_BAD_OPTION", "ReferenceDrafter: head is not a DraftHead");
    }
    this.head = head;
    this.drafterIdentity = head.drafterIdentity;
    this.markovIdentity = head.markovIdentity;
    this.window = options.window ?? head.config.window;
    this.numSpec = options.numSpec ?? head.config.numSpec;
    this.vocabSize = head.vocabSize;
    this.numTaps = head.numTaps;
    this.hidden = head.hidden;
    checkDrafter(this);
  }

  draft(batch: readonly DraftBatchEntry[], out: DraftOutput): void {
    const N = out.numSpec;
    const o = this.#out;
    o.ids = out.draftIds;
    o.conf = out.confidence;
    o.margin = out.margin;
    const s = this.#sample;
    const sampledSession = out.supportIds !== null && out.proposalQ !== null && out.sampledMask !== null;
    if (sampledSession) {
      s.supportIds = out.supportIds!;
      s.proposalQ = out.proposalQ!;
      s.sampledMask = out.sampledMask!;
    }
    for (let b = 0; b < batch.length; b++) {
      const e = batch[b]!;
      o.offset = e.index * N;
      const meta = e.sample;
      try {
        if (sampledSession && meta !== null && meta.tempMilli > 0) {
          s.seed = meta.seed;
          s.topK = meta.topK;
          s.tempMilli = meta.tempMilli;
          s.offset = o.offset * TOP_K_MAX;
          s.position = e.anchorPos;
          this.head.draft(e.rows, e.nRows, e.anchorToken, e.k, o, s);
        } else {
          this.head.draft(e.rows, e.nRows, e.anchorToken, e.k, o);
        }
      } catch {
        if (out.failed !== undefined) out.failed[e.index] = 1;
        else throw new WorkerError("WORKER_BAD_DRAFTER", `reference head refused slot ${e.slot}`);
      }
    }
  }
}
