import type { ConfidenceCalibrator } from "./calibration.js";
import { intInRange } from "./check.js";
import { ClientError } from "./errors.js";
import type { LoadCurve } from "./load-curve.js";

/** The drafts of one request as the depth policy sees them. */
export interface DepthCandidate {
  /** Draft tokens available (the consumed positions, CONTRACT 6.3); 0 = no draft. */
  readonly k: number;
  /** Confidence per position, in [0, 1]; at least `k` values. */
  readonly conf: ArrayLike<number>;
  /** Margin (top-1 minus top-2 logit) per position, or null when the session has none. */
  readonly margin?: ArrayLike<number> | null;
}

/**
 * What the goodput mode divides by: the expected seconds of a round of `batch` requests that
 * verifies `verified` draft tokens in all, fixed costs included (`T(n, M) + fixed`). A
 * {@link VerifyCostModel} is one.
 */
export interface VerifyCost {
  /** Seconds of a round with `batch` requests verifying `verified` draft tokens in all. */
  roundSeconds(batch: number, verified: number): number;
}

/** Options of {@link DepthPolicy}. */
export interface DepthPolicyOptions {
  /**
   * Draft tokens verified per round: a constant or a load curve of the batch size (see
   * {@link piecewiseLinearBudget}). Required in budget mode; in goodput mode it is only what
   * {@link DepthPolicy.budgetFor} reports.
   */
  budget?: number | LoadCurve;
  /**
   * The verify-cost model of goodput mode ({@link VerifyCostModel}): with it the policy chooses
   * per round how many tokens to verify so that expected tokens per expected second is maximal.
   */
  cost?: VerifyCost;
  /**
   * `"goodput"` (default when `cost` is given), `"budget"` (default otherwise), or `"fixed"`:
   * every request verifies `min(depth, k)` drafts (the baseline the others are measured against).
   */
  mode?: "budget" | "goodput" | "fixed";
  /** Drafts verified per request in `"fixed"` mode (0..32). */
  depth?: number;
  /**
   * Per-position calibration of the drafter's confidences ({@link ConfidenceCalibrator}): the
   * gains are computed from calibrated confidences. The engine feeds it the verification outcomes.
   */
  calibrator?: ConfidenceCalibrator;
  /**
   * Margin gate: a position whose margin is below this ends the request's candidate prefix (it
   * and everything after it are not verified). Default 0 (off). Ignored without margins.
   */
  marginGate?: number;
  /** Positions whose expected gain is `<= minGain` are never verified (default 0: spend nothing on certain rejections). */
  minGain?: number;
  /** Tie-break between equal gains: `"margin"` (larger margin first, default) or `"index"` (earlier request first). */
  tieBreak?: "margin" | "index";
  /** Initial capacity in requests (grows on demand). Default 64. */
  capacity?: number;
}

/**
 * Expected accepted length of the first `k` drafts: `sum_{j<k} prod_{i<=j} conf[i]` (greedy
 * acceptance stops at the first rejection, so position j counts only if all before it are accepted).
 */
export function expectedAccepted(conf: ArrayLike<number>, k: number): number {
  let p = 1;
  let s = 0;
  for (let j = 0; j < k; j++) {
    p *= conf[j]!;
    s += p;
  }
  return s;
}

/**
 * Confidence-scheduled verification (docs/depth-policy.md): given each request's drafts and
 * confidences and a budget of draft tokens, choose per request how many draft tokens the target
 * verifies so that the total expected accepted tokens is maximal.
 *
 * The gain of verifying position j of a request is `prod_{i<=j} conf[i]`; these gains are
 * non-increasing in j (each step multiplies by a value in [0, 1]), so the objective is a sum of
 * concave functions and greedy selection of the largest available gain (a max-heap over requests)
 * is optimal. O((n + budget) log n), or O(n * N) without the heap when every position fits the
 * budget; no allocation after warm-up.
 *
 * Goodput mode (with a `cost`): the same greedy order, and the number of tokens M chosen per
 * round to maximise `(n + sum of the top-M gains) / T(n, M)`, expected tokens per expected
 * second; optimal over every allocation for the model (proof in docs/depth-policy.md).
 * O((n + P) log n) for P positions with a positive gain.
 */
export class DepthPolicy {
  /** Positions with a margin below this end the verifiable prefix (0: no gate). */
  readonly marginGate: number;
  /** Positions whose prefix gain is at most this are never verified (default 0). */
  readonly minGain: number;
  /** How equal gains are ordered: by larger margin, or by request index. */
  readonly tieBreak: "margin" | "index";
  /**
   * `"budget"`: verify a budget of tokens; `"goodput"`: choose the tokens per round by the cost
   * model; `"fixed"`: a fixed depth per request.
   */
  readonly mode: "budget" | "goodput" | "fixed";
  /** The depth of `"fixed"` mode (0 otherwise). */
  readonly fixedDepth: number;
  /** The verify-cost model of goodput mode, or null. */
  readonly cost: VerifyCost | null;
  /** The confidence calibration applied to the gains, or null. */
  readonly calibrator: ConfidenceCalibrator | null;
  /** Draft tokens the last allocation chose to verify in all. */
  lastVerified = 0;
  /** Goodput mode: expected tokens per second of the last allocation's choice (0 in budget mode). */
  lastGoodput = 0;
  /** Goodput mode: the cost model's seconds for the last allocation's choice (0 in budget mode). */
  lastSeconds = 0;
  readonly #budget: number | LoadCurve;
  // goodput mode: request index of the m-th greedy pick, and the running sum of gains
  #picks: Int32Array;
  // heap of request indices keyed by (gain, margin) of their next position
  #heap: Int32Array;
  #gain: Float64Array;
  #tie: Float64Array;
  #limit: Int32Array;

  constructor(options: DepthPolicyOptions) {
    if (options === null || typeof options !== "object") {
      throw new ClientError("CLIENT_BAD_OPTION", "depth policy options must be an object");
    }
    const cost = options.cost ?? null;
    if (cost !== null && (typeof cost !== "object" || typeof cost.roundSeconds !== "function")) {
      throw new ClientError(
        "CLIENT_BAD_OPTION",
        "cost must be a VerifyCostModel (an object with roundSeconds)",
      );
    }
    const mode = options.mode ?? (cost !== null ? "goodput" : "budget");
    if (mode !== "budget" && mode !== "goodput" && mode !== "fixed") {
      throw new ClientError(
        "CLIENT_BAD_OPTION",
        `mode must be "budget", "goodput" or "fixed", got ${String(mode)}`,
      );
    }
    this.fixedDepth = mode === "fixed" ? intInRange("depth", options.depth, 0, 32) : 0;
    if (mode === "goodput" && cost === null) {
      throw new ClientError("CLIENT_BAD_OPTION", 'mode "goodput" needs a cost model (cost)');
    }
    const cal = options.calibrator ?? null;
    if (cal !== null && (typeof cal !== "object" || typeof cal.calibrate !== "function")) {
      throw new ClientError("CLIENT_BAD_OPTION", "calibrator must be a ConfidenceCalibrator");
    }
    const b = options.budget ?? (mode !== "budget" ? Number.POSITIVE_INFINITY : undefined);
    if (typeof b === "number" && b === Number.POSITIVE_INFINITY && mode !== "budget") {
      // goodput and fixed modes report an unbounded budget: the cost model or the depth decides
    } else if (typeof b === "number") {
      if (!Number.isFinite(b) || b < 0) {
        throw new ClientError(
          "CLIENT_BAD_OPTION",
          `budget must be a finite number >= 0 or a load curve, got ${b}`,
        );
      }
    } else if (typeof b !== "function") {
      throw new ClientError("CLIENT_BAD_OPTION", "budget must be a number or a load curve function");
    }
    const gate = options.marginGate ?? 0;
    if (!Number.isFinite(gate) || gate < 0) {
      throw new ClientError("CLIENT_BAD_OPTION", `marginGate must be a finite number >= 0, got ${gate}`);
    }
    const minGain = options.minGain ?? 0;
    if (!Number.isFinite(minGain) || minGain < 0 || minGain >= 1) {
      throw new ClientError("CLIENT_BAD_OPTION", `minGain must be in [0, 1), got ${minGain}`);
    }
    const tie = options.tieBreak ?? "margin";
    if (tie !== "margin" && tie !== "index") {
      throw new ClientError("CLIENT_BAD_OPTION", `tieBreak must be "margin" or "index", got ${String(tie)}`);
    }
    const cap = options.capacity ?? 64;
    intInRange("capacity", cap, 1, 0x7fffffff);
    this.#budget = b as number | LoadCurve;
    this.mode = mode;
    this.cost = cost;
    this.calibrator = cal;
    this.marginGate = gate;
    this.minGain = minGain;
    this.tieBreak = tie;
    this.#heap = new Int32Array(cap);
    this.#gain = new Float64Array(cap);
    this.#tie = new Float64Array(cap);
    this.#limit = new Int32Array(cap);
    this.#picks = new Int32Array(cap * 4);
  }

  /** The verification budget (draft tokens) at this batch size: the constant, or the load curve's value (floored, >= 0). */
  budgetFor(batchSize: number): number {
    const b = typeof this.#budget === "number" ? this.#budget : this.#budget(batchSize);
    return Number.isFinite(b) && b > 0 ? Math.floor(b) : 0;
  }

  /**
   * Fills `outDepth[i]` (0..k_i) for every candidate so that `sum(outDepth) <= budget` and the
   * total expected accepted tokens is maximal; returns that total.
   */
  allocate(cands: readonly DepthCandidate[], budget: number, outDepth: Int32Array | number[]): number {
    const size0 = this.#init(cands, outDepth);
    const positions = this.#positions;
    const heap = this.#heap;
    const gain = this.#gain;
    const limit = this.#limit;
    const minGain = this.minGain;
    const cal = this.calibrator;
    let size = size0;
    let left = Number.isFinite(budget) && budget > 0 ? Math.floor(budget) : 0;
    let total = 0;
    let used = 0;
    if (positions <= left) {
      // everything fits: every position whose gain stays above minGain (gains only decrease)
      for (let h = 0; h < size; h++) {
        const i = heap[h]!;
        const conf = cands[i]!.conf;
        const k = limit[i]!;
        let g = gain[i]!;
        let d = 0;
        while (d < k && g > minGain) {
          total += g;
          d++;
          if (d < k) g *= confAt(cal, conf, d);
        }
        outDepth[i] = d;
        used += d;
      }
      this.#done(used, 0, 0);
      return total;
    }
    for (let s = (size >> 1) - 1; s >= 0; s--) siftDown(heap, gain, this.#tie, s, size);
    while (left > 0 && size > 0) {
      const i = heap[0]!;
      outDepth[i] = (outDepth[i] as number) + 1;
      total += gain[i]!;
      left--;
      used++;
      size = this.#advance(cands, i, outDepth[i] as number, size);
    }
    this.#done(used, 0, 0);
    return total;
  }

  /**
   * Goodput mode (docs/depth-policy.md): takes the gains in the same greedy order and verifies
   * the M of them that maximise `(batchSize + sum of the top-M gains) / cost.roundSeconds(batchSize, M)`,
   * expected tokens per expected second (ties: the smaller M). Fills `outDepth`, returns the
   * expected accepted drafts of the choice; `lastVerified`, `lastGoodput` and `lastSeconds` say
   * what it chose.
   *
   * @param batchSize requests in the target's batch this round (each emits one token besides its drafts)
   */
  allocateGoodput(
    cands: readonly DepthCandidate[],
    batchSize: number,
    outDepth: Int32Array | number[],
    cost: VerifyCost | null = this.cost,
  ): number {
    if (cost === null) throw new ClientError("CLIENT_BAD_ARGUMENT", "allocateGoodput needs a cost model");
    const n = cands.length;
    let size = this.#init(cands, outDepth);
    if (this.#picks.length < this.#positions)
      this.#picks = new Int32Array(Math.max(this.#positions, this.#picks.length * 2));
    const picks = this.#picks;
    const heap = this.#heap;
    const gain = this.#gain;
    const batch = Math.max(batchSize, 0) || 0;
    let bestSec = Math.max(cost.roundSeconds(batch, 0), 1e-12);
    let bestRate = batch / bestSec;
    let bestM = 0;
    let bestSum = 0;
    let sum = 0;
    let m = 0;
    for (let s = (size >> 1) - 1; s >= 0; s--) siftDown(heap, gain, this.#tie, s, size);
    while (size > 0) {
      const i = heap[0]!;
      sum += gain[i]!;
      picks[m++] = i;
      const sec = Math.max(cost.roundSeconds(batch, m), 1e-12);
      const rate = (batch + sum) / sec;
      if (rate > bestRate) {
        bestRate = rate;
        bestSec = sec;
        bestM = m;
        bestSum = sum;
      }
      outDepth[i] = (outDepth[i] as number) + 1;
      size = this.#advance(cands, i, outDepth[i] as number, size);
    }
    for (let i = 0; i < n; i++) outDepth[i] = 0;
    for (let k = 0; k < bestM; k++) {
      const i = picks[k]!;
      outDepth[i] = (outDepth[i] as number) + 1;
    }
    this.#done(bestM, bestRate, bestSec);
    return bestSum;
  }

  /**
   * The policy's allocation for a round of `batchSize` requests: {@link allocateGoodput} in
   * goodput mode, else {@link allocate} with {@link budgetFor}(batchSize). Returns the expected
   * accepted drafts.
   */
  allocateFor(cands: readonly DepthCandidate[], batchSize: number, outDepth: Int32Array | number[]): number {
    if (this.mode === "goodput") return this.allocateGoodput(cands, batchSize, outDepth);
    if (this.mode === "fixed") return this.allocateFixed(cands, this.fixedDepth, outDepth);
    return this.allocate(cands, this.budgetFor(batchSize), outDepth);
  }

  /**
   * A fixed depth: `outDepth[i] = min(depth, k_i)` (after the margin gate), whatever the gains.
   * Returns the expected accepted drafts (through the calibration when there is one).
   */
  allocateFixed(cands: readonly DepthCandidate[], depth: number, outDepth: Int32Array | number[]): number {
    const cal = this.calibrator;
    const gate = this.marginGate;
    let total = 0;
    let used = 0;
    for (let i = 0; i < cands.length; i++) {
      const c = cands[i]!;
      let d = Math.min(depth, c.k);
      const m = c.margin ?? null;
      if (m !== null && gate > 0) {
        for (let j = 0; j < d; j++) {
          if (!(m[j]! >= gate)) {
            d = j;
            break;
          }
        }
      }
      let g = 1;
      for (let j = 0; j < d; j++) {
        g *= confAt(cal, c.conf, j);
        total += g;
      }
      outDepth[i] = d;
      used += d;
    }
    this.#done(used, 0, 0);
    return total;
  }

  #done(verified: number, rate: number, seconds: number): void {
    this.lastVerified = verified;
    this.lastGoodput = rate;
    this.lastSeconds = seconds;
  }

  #positions = 0;

  // zeroes outDepth, fills limits and first gains, puts every request with a first gain above
  // minGain in the heap array (not yet heapified); returns its size, #positions the positions
  #init(cands: readonly DepthCandidate[], outDepth: Int32Array | number[]): number {
    const n = cands.length;
    this.#ensure(n);
    const heap = this.#heap;
    const gain = this.#gain;
    const tie = this.#tie;
    const limit = this.#limit;
    const gate = this.marginGate;
    const minGain = this.minGain;
    const byMargin = this.tieBreak === "margin";
    const cal = this.calibrator;
    let size = 0;
    let positions = 0;
    for (let i = 0; i < n; i++) {
      outDepth[i] = 0;
      const c = cands[i]!;
      let k = c.k;
      const m = c.margin ?? null;
      if (m !== null && gate > 0) {
        for (let j = 0; j < k; j++) {
          if (!(m[j]! >= gate)) {
            k = j;
            break;
          }
        }
      }
      limit[i] = k;
      if (k === 0) continue;
      const g = confAt(cal, c.conf, 0);
      gain[i] = g;
      tie[i] = byMargin ? tieValue(m, 0) : 0;
      if (g > minGain) {
        heap[size++] = i;
        positions += k;
      }
    }
    this.#positions = positions;
    return size;
  }

  // request i (the heap's top) just took position d - 1: its next gain, or out of the heap
  #advance(cands: readonly DepthCandidate[], i: number, d: number, size: number): number {
    const heap = this.#heap;
    const gain = this.#gain;
    const tie = this.#tie;
    if (d < this.#limit[i]!) {
      const c = cands[i]!;
      const g = gain[i]! * confAt(this.calibrator, c.conf, d);
      gain[i] = g;
      if (this.tieBreak === "margin") tie[i] = tieValue(c.margin ?? null, d);
      if (g > this.minGain) {
        siftDown(heap, gain, tie, 0, size);
        return size;
      }
    }
    heap[0] = heap[--size]!;
    siftDown(heap, gain, tie, 0, size);
    return size;
  }

  #ensure(n: number): void {
    if (n <= this.#heap.length) return;
    const cap = Math.max(n, this.#heap.length * 2);
    this.#heap = new Int32Array(cap);
    this.#gain = new Float64Array(cap);
    this.#tie = new Float64Array(cap);
    this.#limit = new Int32Array(cap);
  }
}

// confidence of position j, through the calibration when there is one
function confAt(cal: ConfidenceCalibrator | null, conf: ArrayLike<number>, j: number): number {
  return cal === null ? conf[j]! : cal.calibrate(j, conf[j]!);
}

// the tie value of position j: its margin when finite, else 0
function tieValue(m: ArrayLike<number> | null, j: number): number {
  if (m === null) return 0;
  const v = m[j]!;
  return Number.isFinite(v) ? v : 0;
}

// max-heap of request indices ordered by (gain desc, tie desc, index asc)
function siftDown(heap: Int32Array, gain: Float64Array, tie: Float64Array, pos: number, size: number): void {
  const item = heap[pos]!;
  const gi = gain[item]!;
  const ti = tie[item]!;
  for (;;) {
    let child = 2 * pos + 1;
    if (child >= size) break;
    let c = heap[child]!;
    let gc = gain[c]!;
    let tc = tie[c]!;
    if (child + 1 < size) {
      const r = heap[child + 1]!;
      const gr = gain[r]!;
      const tr = tie[r]!;
      if (gr > gc || (gr === gc && (tr > tc || (tr === tc && r < c)))) {
        child++;
        c = r;
        gc = gr;
        tc = tr;
      }
    }
    // stop when the item goes before the larger child
    if (gi > gc || (gi === gc && (ti > tc || (ti === tc && item < c)))) break;
    heap[pos] = c;
    pos = child;
  }
  heap[pos] = item;
}
