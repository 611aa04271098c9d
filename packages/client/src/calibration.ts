import { finiteAtLeast, intInRange } from "./check.js";
import { ClientError } from "./errors.js";

/** Options of {@link ConfidenceCalibrator}. */
export interface ConfidenceCalibratorOptions {
  /** Draft positions calibrated (num_spec N, 1..32). */
  positions: number;
  /** Equal-width bins of raw confidence per position (default 20, 2..1000). */
  bins?: number;
  /** Weight kept per round by the fit (exponential forgetting; default 0.999, in (0, 1]). */
  decay?: number;
  /**
   * Pseudo-observations per bin at the bin's centre (default 2): before data a bin maps to its
   * own centre (the identity), and a few outcomes cannot swing it far.
   */
  prior?: number;
}

/** ECE per position of the raw and of the calibrated confidences, over the outcomes measured. */
export interface CalibrationReport {
  /** Expected calibration error of the raw confidences, per position. */
  readonly raw: number[];
  /** Expected calibration error of the calibrated confidences (prequential), per position. */
  readonly calibrated: number[];
  /** Outcomes measured per position. */
  readonly observations: number[];
}

/**
 * Online per-position confidence calibration (docs/depth-policy.md, "Calibration"): learns,
 * for each draft position j, the map from the drafter's confidence to the probability that
 * draft j is accepted given that drafts `< j` were, from the verification outcomes the engine
 * reports. Isotonic regression by pool-adjacent-violators over fixed bins of raw confidence
 * (weighted by decayed counts plus a prior at the bin centre), read with linear interpolation
 * between bin centres, so the map is monotone and continuous.
 *
 * Cost: {@link observe} O(1); {@link observeDraft} O(depth); {@link endRound} O(positions x bins),
 * independent of the batch: O(batch) per round in all. No allocation after construction.
 *
 * It also measures expected calibration error per position, for the raw confidences and for the
 * calibrated ones as they were when used (prequential): {@link report}; {@link resetMetrics}
 * starts a new measurement (after warm-up).
 */
export class ConfidenceCalibrator {
  /** Positions calibrated. */
  readonly positions: number;
  /** Bins per position. */
  readonly bins: number;
  readonly #decay: number;
  readonly #prior: number;
  // fit: per (position, bin) decayed trials and successes; the fitted value per bin
  readonly #n: Float64Array;
  readonly #a: Float64Array;
  readonly #fit: Float64Array;
  // PAV scratch: block values, weights, lengths
  readonly #pv: Float64Array;
  readonly #pw: Float64Array;
  readonly #pl: Int32Array;
  // ECE sums per (position, bin): count, sum of confidence, sum of outcomes; raw and calibrated
  readonly #rawC: Float64Array;
  readonly #rawP: Float64Array;
  readonly #rawY: Float64Array;
  readonly #calC: Float64Array;
  readonly #calP: Float64Array;
  readonly #calY: Float64Array;
  #dirty = false;

  /** @throws ClientError `CLIENT_BAD_OPTION` naming the first bad option. */
  constructor(options: ConfidenceCalibratorOptions) {
    if (options === null || typeof options !== "object") {
      throw new ClientError("CLIENT_BAD_OPTION", "calibrator options must be an object");
    }
    this.positions = intInRange("positions", options.positions, 1, 32);
    this.bins = intInRange("bins", options.bins ?? 20, 2, 1000);
    const decay = options.decay ?? 0.999;
    if (!(decay > 0 && decay <= 1)) {
      throw new ClientError("CLIENT_BAD_OPTION", `decay must be in (0, 1], got ${String(decay)}`);
    }
    this.#decay = decay;
    this.#prior = finiteAtLeast("prior", options.prior ?? 2, 0);
    const size = this.positions * this.bins;
    this.#n = new Float64Array(size);
    this.#a = new Float64Array(size);
    this.#fit = new Float64Array(size);
    this.#pv = new Float64Array(this.bins);
    this.#pw = new Float64Array(this.bins);
    this.#pl = new Int32Array(this.bins);
    this.#rawC = new Float64Array(size);
    this.#rawP = new Float64Array(size);
    this.#rawY = new Float64Array(size);
    this.#calC = new Float64Array(size);
    this.#calP = new Float64Array(size);
    this.#calY = new Float64Array(size);
    for (let j = 0; j < this.positions; j++) {
      for (let b = 0; b < this.bins; b++) this.#fit[j * this.bins + b] = (b + 0.5) / this.bins;
    }
  }

  #bin(c: number): number {
    const b = Math.floor(c * this.bins);
    return b < 0 ? 0 : b >= this.bins ? this.bins - 1 : b;
  }

  /** The calibrated confidence of raw confidence `conf` at position `pos` (in [0, 1]). */
  calibrate(pos: number, conf: number): number {
    if (!(conf >= 0)) return 0;
    const j = pos < this.positions ? pos : this.positions - 1;
    const B = this.bins;
    const f = this.#fit;
    const o = j * B;
    // linear interpolation between bin centres; flat beyond the outer centres
    const x = Math.min(conf, 1) * B - 0.5;
    if (x <= 0) return f[o]!;
    if (x >= B - 1) return f[o + B - 1]!;
    const i = Math.floor(x);
    const t = x - i;
    return f[o + i]! + t * (f[o + i + 1]! - f[o + i]!);
  }

  /** Writes the calibrated confidences of positions `[0, k)` of `conf` into `out`. */
  calibrateInto(conf: ArrayLike<number>, k: number, out: Float32Array | Float64Array | number[]): void {
    for (let j = 0; j < k; j++) out[j] = this.calibrate(j, conf[j]!);
  }

  /**
   * One verification outcome: draft `pos` with raw confidence `conf` was verified with every
   * draft before it accepted, and was `accepted` or not. O(1).
   */
  observe(pos: number, conf: number, accepted: boolean): void {
    if (!(pos >= 0 && pos < this.positions) || !(conf >= 0 && conf <= 1)) return;
    const y = accepted ? 1 : 0;
    const i = pos * this.bins + this.#bin(conf);
    this.#n[i] = this.#n[i]! + 1;
    this.#a[i] = this.#a[i]! + y;
    this.#rawC[i] = this.#rawC[i]! + 1;
    this.#rawP[i] = this.#rawP[i]! + conf;
    this.#rawY[i] = this.#rawY[i]! + y;
    const cal = this.calibrate(pos, conf);
    const ci = pos * this.bins + this.#bin(cal);
    this.#calC[ci] = this.#calC[ci]! + 1;
    this.#calP[ci] = this.#calP[ci]! + cal;
    this.#calY[ci] = this.#calY[ci]! + y;
    this.#dirty = true;
  }

  /**
   * The outcomes of one request's verification: `depth` drafts verified, the first `accepted`
   * of them accepted. Positions `< accepted` are successes, position `accepted` (when
   * `< depth`) a failure; later positions are not observed (their prefix was rejected).
   */
  observeDraft(conf: ArrayLike<number>, depth: number, accepted: number): void {
    const d = Math.min(depth, this.positions);
    for (let j = 0; j < d && j <= accepted; j++) this.observe(j, conf[j]!, j < accepted);
  }

  /** Refits every position (PAV over its bins) and applies the round's forgetting. O(positions x bins). */
  endRound(): void {
    if (!this.#dirty && this.#decay === 1) return;
    const B = this.bins;
    const n = this.#n;
    const a = this.#a;
    const fit = this.#fit;
    const pv = this.#pv;
    const pw = this.#pw;
    const pl = this.#pl;
    const prior = this.#prior;
    const decay = this.#decay;
    for (let j = 0; j < this.positions; j++) {
      const o = j * B;
      // pool adjacent violators over the bins' smoothed rates (non-decreasing in confidence)
      let top = 0;
      for (let b = 0; b < B; b++) {
        const w = n[o + b]! + prior;
        let v = w > 0 ? (a[o + b]! + prior * ((b + 0.5) / B)) / w : (b + 0.5) / B;
        let ww = w > 0 ? w : 1e-12;
        let len = 1;
        while (top > 0 && pv[top - 1]! >= v) {
          top--;
          const w2 = pw[top]!;
          v = (pv[top]! * w2 + v * ww) / (w2 + ww);
          ww += w2;
          len += pl[top]!;
        }
        pv[top] = v;
        pw[top] = ww;
        pl[top] = len;
        top++;
      }
      let b = 0;
      for (let t = 0; t < top; t++) for (let l = 0; l < pl[t]!; l++) fit[o + b++] = pv[t]!;
      if (decay < 1) {
        for (let k = 0; k < B; k++) {
          n[o + k] = n[o + k]! * decay;
          a[o + k] = a[o + k]! * decay;
        }
      }
    }
    this.#dirty = false;
  }

  /** Expected calibration error of position `pos`: raw confidences, or calibrated ones. */
  ece(pos: number, which: "raw" | "calibrated" = "calibrated"): number {
    const C = which === "raw" ? this.#rawC : this.#calC;
    const P = which === "raw" ? this.#rawP : this.#calP;
    const Y = which === "raw" ? this.#rawY : this.#calY;
    const o = pos * this.bins;
    let total = 0;
    let err = 0;
    for (let b = 0; b < this.bins; b++) {
      const c = C[o + b]!;
      if (c === 0) continue;
      total += c;
      err += Math.abs(P[o + b]! - Y[o + b]!);
    }
    return total === 0 ? 0 : err / total;
  }

  /** ECE per position before (raw) and after (calibrated) calibration, with the counts (allocates; not per round). */
  report(): CalibrationReport {
    const raw: number[] = [];
    const calibrated: number[] = [];
    const observations: number[] = [];
    for (let j = 0; j < this.positions; j++) {
      raw.push(this.ece(j, "raw"));
      calibrated.push(this.ece(j, "calibrated"));
      let c = 0;
      for (let b = 0; b < this.bins; b++) c += this.#rawC[j * this.bins + b]!;
      observations.push(c);
    }
    return { raw, calibrated, observations };
  }

  /** Starts a new ECE measurement (keeps the fit): e.g. after warm-up. */
  resetMetrics(): void {
    this.#rawC.fill(0);
    this.#rawP.fill(0);
    this.#rawY.fill(0);
    this.#calC.fill(0);
    this.#calP.fill(0);
    this.#calY.fill(0);
  }
}
