import { finiteAtLeast, intInRange } from "./check.js";
import { ClientError } from "./errors.js";

/**
 * Parameters of the verify-cost roofline (docs/depth-policy.md, "Cost model"):
 * `T(b, v) = overheadSec + rttSec + floorSec + subKneeSlopeSec * min(t, kneeTokens)
 *   + slopeSec * max(0, t - kneeTokens)` for a round of `b` requests verifying `v` draft tokens in
 * all (the target's forward runs `t = b + v` tokens).
 */
export interface VerifyCostParams {
  /** Memory-bound floor of one target forward (weights and KV read once), seconds at 0 tokens. */
  readonly floorSec: number;
  /** Tokens per forward where compute starts to bind (the roofline's ridge), tokens. */
  readonly kneeTokens: number;
  /** Extra seconds per token in the forward past the knee (compute-bound slope). */
  readonly slopeSec: number;
  /**
   * Extra seconds per token below the knee: the memory-bound forward is not perfectly flat
   * (per-token attention over the KV cache, imperfect compute/memory overlap, per-position
   * sampling and rejection). Set 0 for the ideal, flat roofline.
   */
  readonly subKneeSlopeSec: number;
  /** Fixed per-round overhead outside the forward (scheduling, sampling, launches), seconds. */
  readonly overheadSec: number;
  /** The draft link's STEP round trip, seconds (measured: {@link VerifyCostModel.observeRtt}). */
  readonly rttSec: number;
}

/**
 * Defaults: a dense 8B target (Llama-3.1-8B, 8.03 B parameters, bf16) on one NVIDIA H100 SXM
 * (3.35 TB/s HBM3, 989 TFLOP/s dense bf16), derived as a roofline in docs/depth-policy.md:
 * floor 6 ms (16 GB of weights at ~80 % of peak bandwidth plus KV reads), slope 32 µs per
 * token (2 x 8e9 FLOP per token at 50 % of peak), knee at floor / slope ≈ 190 tokens, a
 * sub-knee slope of 8 µs per token (an assumption: a quarter of the compute slope leaks through
 * the imperfect overlap of compute and memory), 0.5 ms of per-round overhead and 0.3 ms STEP
 * RTT (tapwire's loopback client bench order).
 */
export const H100_8B_COST: VerifyCostParams = Object.freeze({
  floorSec: 6e-3,
  kneeTokens: 190,
  slopeSec: 32e-6,
  subKneeSlopeSec: 8e-6,
  overheadSec: 0.5e-3,
  rttSec: 0.3e-3,
});

/** Options of {@link VerifyCostModel}: initial parameters and the online fit. */
export interface VerifyCostModelOptions extends Partial<VerifyCostParams> {
  /**
   * Fit floor, knee and both slopes from {@link VerifyCostModel.observeRound} (default true). Until
   * `minObservations` rounds are seen, and whenever the data cannot tell the knee apart, the
   * given parameters are used.
   */
  online?: boolean;
  /** Weight kept per observation by the fit (exponential forgetting; default 0.995, in (0, 1]). */
  decay?: number;
  /** Observations before the fit replaces the given parameters (default 16). */
  minObservations?: number;
  /** Weight of each new STEP RTT in its moving average (default 0.05, in (0, 1]). */
  rttAlpha?: number;
  /** Largest knee the fit considers, tokens (default 8192); candidates are spaced by 2^(1/4). */
  maxKneeTokens?: number;
}

/**
 * The verify-cost model `T(batch, verifiedTokens)` the goodput depth policy divides by
 * (docs/depth-policy.md): a roofline with a memory-bound floor, a small per-token slope below
 * the knee, a per-token compute slope past it, a fixed per-round overhead and the measured STEP
 * RTT.
 *
 * Online mode fits floor, knee and both slopes from the forward times the engine reports
 * ({@link observeRound}): for each candidate knee on a geometric grid it keeps the weighted
 * least-squares sums of `seconds ~ floor + sub * min(tokens, knee) + slope * max(0, tokens - knee)`
 * (slopes constrained >= 0) and uses the knee with the smallest residual; among knees the data
 * cannot tell apart, the one nearest the prior's. O(candidates) per observation, no allocation.
 */
export class VerifyCostModel {
  /** Whether {@link observeRound} refits floor, knee and slopes. */
  readonly online: boolean;
  readonly #prior: VerifyCostParams;
  readonly #decay: number;
  readonly #minObs: number;
  readonly #rttAlpha: number;
  readonly #knees: Float64Array;
  // per candidate knee: weighted sums of 1, x1, x2, y, x1², x1·x2, x2², x1·y, x2·y, y²
  // with x1 = min(t, knee), x2 = max(0, t - knee)
  readonly #sums: Float64Array;
  // per candidate knee: the refit's residual, floor, sub-knee slope and slope
  readonly #fit: Float64Array;
  #observations = 0;
  // weighted sums of (seconds - the prior's slope terms): the floor when the shape cannot be told
  #priorW = 0;
  #priorR = 0;
  #floor: number;
  #knee: number;
  #slope: number;
  #sub: number;
  #overhead: number;
  #rtt: number;
  #rttSeen = false;

  /** @throws ClientError `CLIENT_BAD_OPTION` naming the first bad option. */
  constructor(options: VerifyCostModelOptions = {}) {
    if (options === null || typeof options !== "object") {
      throw new ClientError("CLIENT_BAD_OPTION", "cost model options must be an object");
    }
    const d = H100_8B_COST;
    const prior: VerifyCostParams = {
      floorSec: finiteAtLeast("floorSec", options.floorSec ?? d.floorSec, 0),
      kneeTokens: finiteAtLeast("kneeTokens", options.kneeTokens ?? d.kneeTokens, 0),
      slopeSec: finiteAtLeast("slopeSec", options.slopeSec ?? d.slopeSec, 0),
      subKneeSlopeSec: finiteAtLeast("subKneeSlopeSec", options.subKneeSlopeSec ?? d.subKneeSlopeSec, 0),
      overheadSec: finiteAtLeast("overheadSec", options.overheadSec ?? d.overheadSec, 0),
      rttSec: finiteAtLeast("rttSec", options.rttSec ?? d.rttSec, 0),
    };
    const online = options.online ?? true;
    if (typeof online !== "boolean") throw new ClientError("CLIENT_BAD_OPTION", "online must be a boolean");
    const decay = options.decay ?? 0.995;
    if (!(decay > 0 && decay <= 1)) {
      throw new ClientError("CLIENT_BAD_OPTION", `decay must be in (0, 1], got ${String(decay)}`);
    }
    const alpha = options.rttAlpha ?? 0.05;
    if (!(alpha > 0 && alpha <= 1)) {
      throw new ClientError("CLIENT_BAD_OPTION", `rttAlpha must be in (0, 1], got ${String(alpha)}`);
    }
    this.#minObs = intInRange("minObservations", options.minObservations ?? 16, 2, 1e9);
    const maxKnee = finiteAtLeast("maxKneeTokens", options.maxKneeTokens ?? 8192, 1);
    const n = 1 + Math.ceil(4 * Math.log2(maxKnee));
    this.#knees = new Float64Array(n + 1);
    // candidate 0: no knee (linear from 0 tokens); then 1, 2^(1/4), ... up to maxKnee
    for (let i = 1; i <= n; i++) this.#knees[i] = Math.min(maxKnee, 2 ** ((i - 1) / 4));
    this.#sums = new Float64Array(SUMS * (n + 1));
    this.#fit = new Float64Array(4 * (n + 1));
    this.online = online;
    this.#prior = Object.freeze(prior);
    this.#decay = decay;
    this.#rttAlpha = alpha;
    this.#floor = prior.floorSec;
    this.#knee = prior.kneeTokens;
    this.#slope = prior.slopeSec;
    this.#sub = prior.subKneeSlopeSec;
    this.#overhead = prior.overheadSec;
    this.#rtt = prior.rttSec;
  }

  /** The parameters in use now (the fit's once it has taken over). */
  params(): VerifyCostParams {
    return {
      floorSec: this.#floor,
      kneeTokens: this.#knee,
      slopeSec: this.#slope,
      subKneeSlopeSec: this.#sub,
      overheadSec: this.#overhead,
      rttSec: this.#rtt,
    };
  }

  /** Rounds observed by the fit. */
  get observations(): number {
    return this.#observations;
  }

  /**
   * Seconds of the target's forward over `batch + verified` tokens: the floor, the sub-knee
   * slope up to the knee, then the compute slope past it.
   */
  forwardSeconds(batch: number, verified: number): number {
    const t = batch + verified;
    const k = this.#knee;
    return this.#floor + this.#sub * Math.min(t, k) + (t > k ? this.#slope * (t - k) : 0);
  }

  /** `T(batch, verified) + fixed`: the forward plus the per-round overhead and the STEP RTT, seconds. */
  roundSeconds(batch: number, verified: number): number {
    return this.forwardSeconds(batch, verified) + this.#overhead + this.#rtt;
  }

  /** A measured STEP round trip (seconds): a moving average replaces the RTT term. */
  observeRtt(seconds: number): void {
    if (!(seconds >= 0) || !Number.isFinite(seconds)) return;
    this.#rtt = this.#rttSeen ? this.#rtt + this.#rttAlpha * (seconds - this.#rtt) : seconds;
    this.#rttSeen = true;
  }

  /**
   * One round as the engine measured it: `batch` requests, `tokens` draft tokens verified, the
   * target's forward took `seconds` (without the link's RTT and the fixed overhead). Refits the
   * roofline in online mode; ignores non-finite or negative input.
   */
  observeRound(batch: number, tokens: number, seconds: number): void {
    if (!this.online) return;
    if (!(batch >= 0 && tokens >= 0 && seconds >= 0) || !Number.isFinite(batch + tokens + seconds)) return;
    const t = batch + tokens;
    const knees = this.#knees;
    const s = this.#sums;
    const decay = this.#decay;
    const y = seconds;
    for (let c = 0; c < knees.length; c++) {
      const k = knees[c]!;
      const x1 = Math.min(t, k);
      const x2 = t > k ? t - k : 0;
      const o = SUMS * c;
      s[o] = s[o]! * decay + 1;
      s[o + 1] = s[o + 1]! * decay + x1;
      s[o + 2] = s[o + 2]! * decay + x2;
      s[o + 3] = s[o + 3]! * decay + y;
      s[o + 4] = s[o + 4]! * decay + x1 * x1;
      s[o + 5] = s[o + 5]! * decay + x1 * x2;
      s[o + 6] = s[o + 6]! * decay + x2 * x2;
      s[o + 7] = s[o + 7]! * decay + x1 * y;
      s[o + 8] = s[o + 8]! * decay + x2 * y;
      s[o + 9] = s[o + 9]! * decay + y * y;
    }
    const p = this.#prior;
    const pk = p.kneeTokens;
    this.#priorW = this.#priorW * decay + 1;
    this.#priorR =
      this.#priorR * decay + y - p.subKneeSlopeSec * Math.min(t, pk) - (t > pk ? p.slopeSec * (t - pk) : 0);
    this.#observations++;
    if (this.#observations >= this.#minObs) this.#refit();
  }

  // per candidate knee the least-squares floor and slopes (slopes >= 0: the best of the
  // feasible active sets); then the knee with the least residual, the prior's nearest on ties
  #refit(): void {
    const s = this.#sums;
    const f = this.#fit;
    const p = this.#prior;
    const nk = this.#knees.length;
    let best = Number.POSITIVE_INFINITY;
    for (let c = 0; c < nk; c++) {
      fitCandidate(s, SUMS * c, f, 4 * c, p.subKneeSlopeSec, p.slopeSec);
      if (f[4 * c]! < best) best = f[4 * c]!;
    }
    // candidate 0 has x2 = tokens: did the forward sizes seen vary at all?
    const varied = s[0]! * s[6]! - s[2]! * s[2]! > 1e-9 * s[0]! * s[0]!;
    if (!varied) {
      // one forward size only: the shape of the cost cannot be told from it; keep the prior's
      // knee and slopes, which only speak where nothing was observed, and fit the floor
      this.#floor = Math.max(0, this.#priorR / this.#priorW);
      this.#slope = p.slopeSec;
      this.#sub = p.subKneeSlopeSec;
      this.#knee = p.kneeTokens;
      return;
    }
    const sst = Math.max(0, s[9]! - (s[3]! * s[3]!) / s[0]!);
    const tol = Math.max(0, best) + 1e-7 * sst + 1e-30;
    const logPrior = Math.log2(1 + p.kneeTokens);
    let pick = -1;
    let pickDist = Number.POSITIVE_INFINITY;
    for (let c = 0; c < nk; c++) {
      if (!(f[4 * c]! <= tol)) continue;
      const dist = Math.abs(Math.log2(1 + this.#knees[c]!) - logPrior);
      if (dist < pickDist) {
        pickDist = dist;
        pick = c;
      }
    }
    if (pick < 0) return;
    this.#floor = Math.max(0, f[4 * pick + 1]!);
    this.#sub = f[4 * pick + 2]!;
    this.#slope = f[4 * pick + 3]!;
    this.#knee = this.#knees[pick]!;
  }

  /** The parameters the model was built with (before any fit). */
  get prior(): VerifyCostParams {
    return this.#prior;
  }
}

const SUMS = 10;
// centred (co)variances of the candidate being fitted: c11, c12, c22, c1y, c2y, cyy
const C = new Float64Array(6);

// mean squared residual of the centred fit with slopes u1, u2 (a slope whose feature did not
// vary is a constant of the data: pass 0 for it, the intercept absorbs it)
function centredSse(u1: number, u2: number): number {
  return C[5]! - 2 * u1 * C[3]! - 2 * u2 * C[4]! + u1 * u1 * C[0]! + 2 * u1 * u2 * C[1]! + u2 * u2 * C[2]!;
}

// Weighted least squares of y ~ a + b1·x1 + b2·x2 with b1, b2 >= 0 from the sums at `s[o..]`:
// the best of the active sets {a, b1, b2}, {a, b1}, {a, b2}, {a} whose slopes come out >= 0.
// A slope whose feature never varied (no data on that side of the knee) takes the prior's
// value and is left out of the fit. Writes residual, a, b1, b2 to `out[w..]`.
function fitCandidate(
  s: Float64Array,
  o: number,
  out: Float64Array,
  w: number,
  sub0: number,
  slope0: number,
): void {
  const W = s[o]!;
  const m1 = s[o + 1]! / W;
  const m2 = s[o + 2]! / W;
  const my = s[o + 3]! / W;
  // centred (co)variances: the intercept is then my - b1·m1 - b2·m2
  const c11 = s[o + 4]! / W - m1 * m1;
  const c12 = s[o + 5]! / W - m1 * m2;
  const c22 = s[o + 6]! / W - m2 * m2;
  const c1y = s[o + 7]! / W - m1 * my;
  const c2y = s[o + 8]! / W - m2 * my;
  const cyy = s[o + 9]! / W - my * my;
  const has1 = c11 > 1e-9 * (1 + m1 * m1);
  const has2 = c22 > 1e-9 * (1 + m2 * m2);
  C[0] = c11;
  C[1] = c12;
  C[2] = c22;
  C[3] = c1y;
  C[4] = c2y;
  C[5] = cyy;
  // the last resort {a}: slopes 0 where fitted, the prior's where not
  let b1Best = has1 ? 0 : sub0;
  let b2Best = has2 ? 0 : slope0;
  let bestSse = cyy;
  if (has1 && has2) {
    const det = c11 * c22 - c12 * c12;
    if (det > 1e-9 * c11 * c22) {
      const b1 = (c1y * c22 - c2y * c12) / det;
      const b2 = (c2y * c11 - c1y * c12) / det;
      const e = centredSse(b1, b2);
      if (b1 >= 0 && b2 >= 0 && e < bestSse) {
        bestSse = e;
        b1Best = b1;
        b2Best = b2;
      }
    }
  }
  if (has1) {
    const b1 = c1y / c11;
    const e = centredSse(b1, 0);
    if (b1 >= 0 && e < bestSse) {
      bestSse = e;
      b1Best = b1;
      b2Best = has2 ? 0 : slope0;
    }
  }
  if (has2) {
    const b2 = c2y / c22;
    const e = centredSse(0, b2);
    if (b2 >= 0 && e < bestSse) {
      bestSse = e;
      b1Best = has1 ? 0 : sub0;
      b2Best = b2;
    }
  }
  // the intercept only from the fitted slopes; a prior slope whose feature did not vary is a
  // constant of the data and lands in the intercept
  const a = my - b1Best * m1 - b2Best * m2;
  out[w] = Math.max(0, bestSse) * W;
  out[w + 1] = a;
  out[w + 2] = b1Best;
  out[w + 3] = b2Best;
}
