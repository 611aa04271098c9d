import { intInRange } from "./check.js";
import { ClientError } from "./errors.js";

/** One point of a load curve: at `batchSize` running requests the target verifies `tokens` draft tokens per round. */
export interface LoadCurvePoint {
  /** Requests in the target's batch. */
  readonly batchSize: number;
  /** Draft tokens the target can verify this round at that batch size. */
  readonly tokens: number;
}

/** Verification budget as a function of the batch size: draft tokens the target can verify this round. */
export type LoadCurve = (batchSize: number) => number;

/**
 * A piecewise-linear load curve through `points` (sorted by batch size, at least one), flat
 * beyond the first and last point. Returns whole tokens (floor).
 *
 * @throws ClientError `CLIENT_BAD_OPTION` when the points are empty, unsorted, or not finite.
 */
export function piecewiseLinearBudget(points: readonly LoadCurvePoint[]): LoadCurve {
  if (points.length === 0) throw new ClientError("CLIENT_BAD_OPTION", "loadCurve needs at least one point");
  const xs = new Float64Array(points.length);
  const ys = new Float64Array(points.length);
  for (let i = 0; i < points.length; i++) {
    const p = points[i]!;
    if (!Number.isFinite(p.batchSize) || !Number.isFinite(p.tokens) || p.tokens < 0) {
      throw new ClientError("CLIENT_BAD_OPTION", `loadCurve point ${i} is not finite and non-negative`);
    }
    if (i > 0 && p.batchSize <= xs[i - 1]!) {
      throw new ClientError("CLIENT_BAD_OPTION", `loadCurve point ${i}: batchSize must increase`);
    }
    xs[i] = p.batchSize;
    ys[i] = p.tokens;
  }
  const n = points.length;
  return (batchSize: number): number => {
    if (!(batchSize > xs[0]!)) return Math.floor(ys[0]!);
    if (batchSize >= xs[n - 1]!) return Math.floor(ys[n - 1]!);
    let i = 1;
    while (xs[i]! < batchSize) i++;
    const x0 = xs[i - 1]!;
    const x1 = xs[i]!;
    const t = (batchSize - x0) / (x1 - x0);
    return Math.floor(ys[i - 1]! + t * (ys[i]! - ys[i - 1]!));
  };
}

/** The drafts of one request as the depth policy sees them. */
export interface DepthCandidate {
  /** Draft tokens available (the consumed positions, CONTRACT 6.3); 0 = no draft. */
  readonly k: number;
  /** Confidence per position, in [0, 1]; at least `k` values. */
  readonly conf: ArrayLike<number>;
  /** Margin (top-1 minus top-2 logit) per position, or null when the session has none. */
  readonly margin?: ArrayLike<number> | null;
}

/** Options of {@link DepthPolicy}. */
export interface DepthPolicyOptions {
  /** Draft tokens verified per round: a constant or a load curve of the batch size (see {@link piecewiseLinearBudget}). */
  budget: number | LoadCurve;
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
 */
export class DepthPolicy {
  /** Positions with a margin below this end the verifiable prefix (0: no gate). */
  readonly marginGate: number;
  /** Positions whose prefix gain is at most this are never verified (default 0). */
  readonly minGain: number;
  /** How equal gains are ordered: by larger margin, or by request index. */
  readonly tieBreak: "margin" | "index";
  readonly #budget: number | LoadCurve;
  // heap of request indices keyed by (gain, margin) of their next position
  #heap: Int32Array;
  #gain: Float64Array;
  #tie: Float64Array;
  #limit: Int32Array;

  constructor(options: DepthPolicyOptions) {
    const b = options.budget;
    if (typeof b === "number") {
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
    this.#budget = b;
    this.marginGate = gate;
    this.minGain = minGain;
    this.tieBreak = tie;
    this.#heap = new Int32Array(cap);
    this.#gain = new Float64Array(cap);
    this.#tie = new Float64Array(cap);
    this.#limit = new Int32Array(cap);
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
    const n = cands.length;
    this.#ensure(n);
    const heap = this.#heap;
    const gain = this.#gain;
    const tie = this.#tie;
    const limit = this.#limit;
    const gate = this.marginGate;
    const minGain = this.minGain;
    const byMargin = this.tieBreak === "margin";
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
      const g = c.conf[0]!;
      gain[i] = g;
      tie[i] = byMargin ? tieValue(m, 0) : 0;
      if (g > minGain) {
        heap[size++] = i;
        positions += k;
      }
    }
    let left = Number.isFinite(budget) && budget > 0 ? Math.floor(budget) : 0;
    let total = 0;
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
          if (d < k) g *= conf[d]!;
        }
        outDepth[i] = d;
      }
      return total;
    }
    for (let s = (size >> 1) - 1; s >= 0; s--) siftDown(heap, gain, tie, s, size);
    while (left > 0 && size > 0) {
      const i = heap[0]!;
      const d = (outDepth[i] as number) + 1;
      outDepth[i] = d;
      total += gain[i]!;
      left--;
      if (d < limit[i]!) {
        const c = cands[i]!;
        const g = gain[i]! * c.conf[d]!;
        gain[i] = g;
        if (byMargin) tie[i] = tieValue(c.margin ?? null, d);
        if (g > minGain) {
          siftDown(heap, gain, tie, 0, size);
          continue;
        }
      }
      heap[0] = heap[--size]!;
      siftDown(heap, gain, tie, 0, size);
    }
    return total;
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
