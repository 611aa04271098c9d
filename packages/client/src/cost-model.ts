import { finiteAtLeast, intInRange } from "./check.js";
import { ClientError } from "./errors.js";

/**
 * Parameters of the verify-cost roofline (docs/depth-policy.md, "Cost model"):
 * `T(b, v) = overheadSec + rttSec + floorSec + slopeSec * max(0, b + v - kneeTokens)` for a round
 * of `b` requests verifying `v` draft tokens in all (the target's forward runs `b + v` tokens).
 */
export interface VerifyCostParams {
  /** Memory-bound floor of one target forward (weights and KV read once), seconds. */
  readonly floorSec: number;
  /** Tokens per forward where compute starts to bind (the roofline's ridge), tokens. */
  readonly kneeTokens: number;
  /** Extra seconds per token in the forward past the knee (compute-bound slope). */
  readonly slopeSec: number;
  /** Fixed per-round overhead outside the forward (scheduling, sampling, launches), seconds. */
  readonly overheadSec: number;
  /** The draft link's STEP round trip, seconds (measured: {@link VerifyCostModel.observeRtt}). */
  readonly rttSec: number;
}

/**
 * Defaults: a dense 8B target (Llama-3.1-8B, 8.03 B parameters, bf16) on one NVIDIA H100 SXM
 * (3.35 TB/s HBM3, 989 TFLOP/s dense bf16), derived as a roofline in docs/depth-policy.md:
 * floor 6 ms (16 GB of weights at ~80 % of peak bandwidth plus KV reads), slope 32 µs per
 * token (2 x 8e9 FLOP per token at 50 % of peak), knee at floor / slope ≈ 190 tokens, 0.5 ms
 * of per-round overhead and 0.3 ms STEP RTT (tapwire's loopback client bench order).
 */
export const H100_8B_COST: VerifyCostParams = Object.freeze({
  floorSec: 6e-3,
  kneeTokens: 190,
  slopeSec: 32e-6,
  overheadSec: 0.5e-3,
  rttSec: 0.3e-3,
});

/** Options of {@link VerifyCostModel}: initial parameters and the online fit. */
export interface VerifyCostModelOptions extends Partial<VerifyCostParams> {
  /**
   * Fit floor, knee and slope from {@link VerifyCostModel.observeRound} (default true). Until
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
 * (docs/depth-policy.md): a roofline with a memory-bound floor, a per-token slope past a knee,
 * a fixed per-round overhead and the measured STEP RTT.
 *
 * Online mode fits floor, knee and slope from the forward times the engine reports
 * ({@link observeRound}): for each candidate knee on a geometric grid it keeps the weighted
 * least-squares sums of `seconds ~ floor + slope * max(0, tokens - knee)` and uses the knee with
 * the smallest residual. O(candidates) per observation, no allocation.
 */
export class VerifyCostModel {
  /** Whether {@link observeRound} refits floor, knee and slope. */
  readonly online: boolean;
  readonly #prior: VerifyCostParams;
  readonly #decay: number;
  readonly #minObs: number;
  readonly #rttAlpha: number;
  readonly #knees: Float64Array;
  // per candidate knee: weighted sums W, Sx, Sy, Sxx, Sxy, Syy
  readonly #sums: Float64Array;
  #observations = 0;
  // weighted sums of (seconds - the prior's slope term): the floor when the knee cannot be told
  #priorW = 0;
  #priorR = 0;
  #floor: number;
  #knee: number;
  #slope: number;
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
    this.#sums = new Float64Array(6 * (n + 1));
    this.online = online;
    this.#prior = Object.freeze(prior);
    this.#decay = decay;
    this.#rttAlpha = alpha;
    this.#floor = prior.floorSec;
    this.#knee = prior.kneeTokens;
    this.#slope = prior.slopeSec;
    this.#overhead = prior.overheadSec;
    this.#rtt = prior.rttSec;
  }

  /** The parameters in use now (the fit's once it has taken over). */
  params(): VerifyCostParams {
    return {
      floorSec: this.#floor,
      kneeTokens: this.#knee,
      slopeSec: this.#slope,
      overheadSec: this.#overhead,
      rttSec: this.#rtt,
    };
  }

  /** Rounds observed by the fit. */
  get observations(): number {
    return this.#observations;
  }

  /** Seconds of the target's forward over `batch + verified` tokens (floor, then the slope past the knee). */
  forwardSeconds(batch: number, verified: number): number {
    const over = batch + verified - this.#knee;
    return this.#floor + (over > 0 ? this.#slope * over : 0);
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
    for (let c = 0; c < knees.length; c++) {
      const x = t > knees[c]! ? t - knees[c]! : 0;
      const o = 6 * c;
      s[o] = s[o]! * decay + 1;
      s[o + 1] = s[o + 1]! * decay + x;
      s[o + 2] = s[o + 2]! * decay + seconds;
      s[o + 3] = s[o + 3]! * decay + x * x;
      s[o + 4] = s[o + 4]! * decay + x * seconds;
      s[o + 5] = s[o + 5]! * decay + seconds * seconds;
    }
    const p = this.#prior;
    this.#priorW = this.#priorW * decay + 1;
    this.#priorR = this.#priorR * decay + seconds - (t > p.kneeTokens ? p.slopeSec * (t - p.kneeTokens) : 0);
    this.#observations++;
    if (this.#observations >= this.#minObs) this.#refit();
  }

  // the candidate knee with the least weighted squared error; slope clamped at >= 0
  #refit(): void {
    const s = this.#sums;
    let best = Number.POSITIVE_INFINITY;
    let bestFloor = this.#floor;
    let bestSlope = this.#slope;
    let bestKnee = this.#knee;
    for (let c = 0; c < this.#knees.length; c++) {
      const o = 6 * c;
      const w = s[o]!;
      const sx = s[o + 1]!;
      const sy = s[o + 2]!;
      const sxx = s[o + 3]!;
      const sxy = s[o + 4]!;
      const syy = s[o + 5]!;
      const den = w * sxx - sx * sx;
      let slope = den > 1e-12 * w * w ? (w * sxy - sx * sy) / den : 0;
      if (slope < 0) slope = 0;
      const floor = (sy - slope * sx) / w;
      const sse =
        syy -
        2 * floor * sy -
        2 * slope * sxy +
        w * floor * floor +
        2 * floor * slope * sx +
        slope * slope * sxx;
      if (c === 0 || sse < best - 1e-12 * Math.abs(best)) {
        best = sse;
        bestFloor = floor;
        bestSlope = slope;
        bestKnee = this.#knees[c]!;
      }
    }
    // candidate 0 is x = tokens: did the forward sizes seen vary at all?
    const varied = s[0]! * s[3]! - s[1]! * s[1]! > 1e-9 * s[0]! * s[0]!;
    if (!varied) {
      // one forward size only: the shape of the cost cannot be told from it; keep
      // the prior's knee and slope, which only speak where nothing was observed, and fit the floor
      this.#floor = Math.max(0, this.#priorR / this.#priorW);
      this.#slope = this.#prior.slopeSec;
      this.#knee = this.#prior.kneeTokens;
      return;
    }
    this.#floor = Math.max(0, bestFloor);
    this.#slope = bestSlope;
    this.#knee = bestKnee;
  }

  /** The parameters the model was built with (before any fit). */
  get prior(): VerifyCostParams {
    return this.#prior;
  }
}
