/**
 * Depth policies of the harness (`--depth-policy fixed:K|budget|goodput`) and the simulated-time
 * decode loop of `pnpm bench:depth` (docs/benchmarks/depth-policy.md).
 *
 * The simulation is closed-loop continuous batching at a fixed concurrency: every slot always
 * holds a request, a finished request is replaced at once. Drafting and verification are real
 * and in process: the reference head drafts from the target's own tap rows, and greedy
 * verification accepts the longest drafted prefix that equals the target's continuation.
 * Because greedy decoding is a deterministic function of the prompt, each request's continuation
 * and the head's draft at every position are computed once ({@link traceRequests}) and every
 * policy then replays the same requests: the policies see the same drafts and the same
 * outcomes, so their differences are the policies' alone. Time is simulated: each round takes
 * `cost.roundSeconds(concurrency, verifiedTokens)` of the cost model.
 */
import {
  ConfidenceCalibrator,
  type DepthCandidate,
  DepthPolicy,
  type LoadCurve,
  type VerifyCost,
  VerifyCostModel,
} from "@tapwire/client";
import { DraftHead, readSafetensors, type TargetModel, writeSafetensors } from "@tapwire/reference-model";
import { Rng } from "../engine/prng.js";
import { argmax } from "../engine/verify.js";

/** A `--depth-policy` value: a fixed depth, the budget (load curve) policy, or goodput mode. */
export type DepthPolicySpec =
  | { readonly kind: "fixed"; readonly depth: number }
  | { readonly kind: "budget" }
  | { readonly kind: "goodput"; readonly calibrate: boolean };

/** Parses `fixed:K`, `budget`, `goodput` (and `goodput-raw`: goodput without calibration); null when malformed. */
export function parseDepthPolicy(text: string, numSpec: number): DepthPolicySpec | null {
  if (text === "budget") return { kind: "budget" };
  if (text === "goodput") return { kind: "goodput", calibrate: true };
  if (text === "goodput-raw") return { kind: "goodput", calibrate: false };
  const m = /^fixed:(\d+)$/.exec(text);
  if (m === null) return null;
  const depth = Number(m[1]);
  return depth <= numSpec ? { kind: "fixed", depth } : null;
}

/** The spec as `--depth-policy` spells it. */
export function depthPolicyName(spec: DepthPolicySpec): string {
  if (spec.kind === "fixed") return `fixed:${spec.depth}`;
  if (spec.kind === "budget") return "budget";
  return spec.calibrate ? "goodput" : "goodput-raw";
}

/** The client objects behind a spec: the policy, its cost model and calibrator (goodput). */
export interface DepthPolicySetup {
  readonly policy: DepthPolicy;
  /** The cost model of goodput mode; also what the harness reports simulated goodput with. */
  readonly cost: VerifyCostModel;
  /** Measures ECE in every mode; the goodput policy also uses it when calibrating. */
  readonly calibrator: ConfidenceCalibrator;
}

/** Builds the client's DepthPolicy for a spec (budget: the load curve; goodput: the cost model). */
export function makeDepthPolicy(
  spec: DepthPolicySpec,
  o: { numSpec: number; budget: number | LoadCurve; cost?: VerifyCostModel },
): DepthPolicySetup {
  const cost = o.cost ?? new VerifyCostModel({ online: false });
  // no forgetting: the reference head does not drift within a run, so every outcome counts
  const calibrator = new ConfidenceCalibrator({ positions: o.numSpec, decay: 1 });
  let policy: DepthPolicy;
  if (spec.kind === "fixed") policy = new DepthPolicy({ mode: "fixed", depth: spec.depth });
  else if (spec.kind === "budget") policy = new DepthPolicy({ budget: o.budget });
  else policy = new DepthPolicy({ cost, ...(spec.calibrate ? { calibrator } : {}) });
  return { policy, cost, calibrator };
}

/**
 * A head whose confidence temperatures are all multiplied by `factor` (docs/reference-model.md,
 * "Confidence head"): 0.5 makes it over-confident, 2 under-confident. Draft ids are unchanged
 * (the temperature only shapes the confidence), so it drafts exactly what `head` drafts.
 */
export function scaleConfidenceTemperatures(head: DraftHead, target: TargetModel, factor: number): DraftHead {
  const md = new Map<string, string>();
  const tensors = readSafetensors(head.toSafetensors(), { metadata: md });
  const t = tensors.get("confidence.temperature");
  if (t === undefined) throw new Error("draft head has no confidence.temperature tensor");
  const data = Uint8Array.from(t.data);
  const view = new DataView(data.buffer);
  for (let i = 0; i < data.length; i += 4) view.setFloat32(i, view.getFloat32(i, true) * factor, true);
  tensors.set("confidence.temperature", { ...t, data });
  return DraftHead.fromSafetensors(writeSafetensors(tensors, md), target);
}

/** Greedy continuations of a pool of requests and the head's draft at every position. */
export interface RequestTraces {
  /** Requests in the pool. */
  readonly count: number;
  /** Tokens generated per request. */
  readonly length: number;
  /** Draft positions N. */
  readonly numSpec: number;
  /** Confidence of draft j at step s of request r: `conf[(r * length + s) * N + j]`. */
  readonly conf: Float32Array;
  /** Leading drafts at step s of request r that equal the target's continuation (0..N). */
  readonly match: Uint8Array;
}

/**
 * Runs the target greedily over `count` random prompts for `length + N` tokens and drafts with
 * `head` at each of the first `length` positions from the row of the token before the anchor
 * (what the worker's reference drafter reads, CONTRACT 2). Deterministic in the seed.
 */
export function traceRequests(
  target: TargetModel,
  head: DraftHead,
  o: { count: number; length: number; numSpec: number; promptTokens: number; seed: number },
): RequestTraces {
  const N = o.numSpec;
  const L = o.length;
  const V = target.config.vocabSize;
  const conf = new Float32Array(o.count * L * N);
  const match = new Uint8Array(o.count * L);
  const ids = new Int32Array(L * N);
  const tokens = new Int32Array(L + N);
  const row = new Uint8Array(target.rowBytes);
  const logits = new Float32Array(V);
  const out = { ids, conf: new Float32Array(L * N), margin: null, offset: 0 };
  const rng = new Rng(o.seed);
  for (let r = 0; r < o.count; r++) {
    let state = target.initialState([]);
    const prompt = Array.from({ length: o.promptTokens }, () => rng.int(0, V - 1));
    for (let i = 0; i < prompt.length - 1; i++) state = target.forward(state, prompt[i]!, logits, row, state);
    let anchor = prompt[prompt.length - 1]!;
    for (let s = 0; s < L + N; s++) {
      if (s < L) {
        out.offset = s * N;
        head.draft(row, 1, anchor, N, out);
      }
      state = target.forward(state, anchor, logits, row, state);
      anchor = argmax(logits);
      tokens[s] = anchor;
    }
    for (let s = 0; s < L; s++) {
      let m = 0;
      while (m < N && ids[s * N + m] === tokens[s + m]) m++;
      match[r * L + s] = m;
      conf.set(out.conf.subarray(s * N, (s + 1) * N), (r * L + s) * N);
    }
  }
  return { count: o.count, length: L, numSpec: N, conf, match };
}

/** Options of {@link simulateDepth}. */
export interface SimOptions {
  readonly traces: RequestTraces;
  /** Requests decoding at once (every slot always busy). */
  readonly concurrency: number;
  /** Rounds measured after the warm-up. */
  readonly rounds: number;
  /** Rounds before the measurement (calibration and the cost fit learn; nothing is counted). */
  readonly warmupRounds: number;
  /** The depth policy and its models. */
  readonly setup: DepthPolicySetup;
  /** The true cost: each round's simulated seconds. */
  readonly cost: VerifyCost & { forwardSeconds?(batch: number, verified: number): number };
}

/** What one simulated run measured (after the warm-up). */
export interface SimResult {
  /** Tokens generated per simulated second. */
  readonly goodput: number;
  readonly tokens: number;
  readonly seconds: number;
  readonly rounds: number;
  /** Mean tokens per request per round (accepted drafts + 1). */
  readonly meanAcceptedLength: number;
  /** Draft tokens verified per round. */
  readonly verifiedPerRound: number;
  /** Requests verified at depth d, for d = 0..N. */
  readonly depthHistogram: number[];
  /** ECE per position of the raw and the calibrated confidences (what the calibrator measured). */
  readonly ece: {
    readonly raw: number[];
    readonly calibrated: number[];
    /** Outcomes observed per position. */
    readonly observations: number[];
    /** ECE over all positions, weighted by their observations: raw and calibrated. */
    readonly rawOverall: number;
    readonly calibratedOverall: number;
  };
}

/** The observation-weighted mean of per-position ECEs. */
export function overallEce(ece: readonly number[], observations: readonly number[]): number {
  let w = 0;
  let s = 0;
  for (let j = 0; j < ece.length; j++) {
    w += observations[j]!;
    s += observations[j]! * ece[j]!;
  }
  return w === 0 ? 0 : s / w;
}

/** Runs the closed loop: the policy chooses depths, verification replays the traces, time is simulated. */
export function simulateDepth(o: SimOptions): SimResult {
  const { traces: tr, concurrency: C, setup } = o;
  const { policy, calibrator } = setup;
  const N = tr.numSpec;
  const L = tr.length;
  const req = new Int32Array(C); // pool index of the request in each slot
  const step = new Int32Array(C); // tokens it has generated
  let next = 0;
  for (let i = 0; i < C; i++) req[i] = next++ % tr.count;
  const cands: { k: number; conf: Float32Array }[] = [];
  for (let i = 0; i < C; i++) cands.push({ k: 0, conf: tr.conf.subarray(0, N) });
  const depth = new Int32Array(C);
  const hist = new Array<number>(N + 1).fill(0);
  let tokens = 0;
  let seconds = 0;
  let verified = 0;
  const total = o.warmupRounds + o.rounds;
  const online = setup.cost.online;
  for (let round = 0; round < total; round++) {
    if (round === o.warmupRounds) {
      tokens = 0;
      seconds = 0;
      verified = 0;
      hist.fill(0);
      calibrator.resetMetrics();
    }
    for (let i = 0; i < C; i++) {
      const base = (req[i]! * L + step[i]!) * N;
      const c = cands[i]!;
      // never past the request's last token (the harness engine's cap)
      c.k = Math.max(0, Math.min(N, L - step[i]! - 1));
      c.conf = tr.conf.subarray(base, base + N);
    }
    policy.allocateFor(cands as readonly DepthCandidate[], C, depth);
    let m = 0;
    for (let i = 0; i < C; i++) {
      const d = depth[i]!;
      const c = cands[i]!;
      const accepted = Math.min(d, tr.match[req[i]! * L + step[i]!]!);
      if (d > 0) calibrator.observeDraft(c.conf, d, accepted);
      hist[d] = hist[d]! + 1;
      m += d;
      tokens += accepted + 1;
      step[i] = step[i]! + accepted + 1;
      if (step[i]! >= L) {
        req[i] = next++ % tr.count;
        step[i] = 0;
      }
    }
    calibrator.endRound();
    seconds += o.cost.roundSeconds(C, m);
    if (online && o.cost.forwardSeconds !== undefined) {
      setup.cost.observeRound(C, m, o.cost.forwardSeconds(C, m));
    }
    verified += m;
  }
  const rep = calibrator.report();
  return {
    goodput: tokens / seconds,
    tokens,
    seconds,
    rounds: o.rounds,
    meanAcceptedLength: tokens / (o.rounds * C),
    verifiedPerRound: verified / o.rounds,
    depthHistogram: hist,
    ece: {
      raw: rep.raw,
      calibrated: rep.calibrated,
      observations: rep.observations,
      rawOverall: overallEce(rep.raw, rep.observations),
      calibratedOverall: overallEce(rep.calibrated, rep.observations),
    },
  };
}

/** What the harness report says about the depth policy (`--depth-policy`). */
export interface DepthPolicyReport {
  /** The policy as given (`fixed:K`, `budget`, `goodput`). */
  policy: string;
  /** Tokens per simulated second: the run's tokens over the cost model's seconds for its rounds. */
  goodputSimulated: number;
  /** The cost model's seconds for the run's rounds (H100_8B_COST unless configured). */
  simulatedSeconds: number;
  /** Draft tokens verified per decode round. */
  verifiedPerRound: number;
  /** Requests verified at depth d (d = 0..N) over the run: the policy's chosen depths. */
  depthHistogram: number[];
  /** ECE per position of the raw and of the calibrated confidences, and over all positions. */
  ece: {
    raw: number[];
    calibrated: number[];
    observations: number[];
    rawOverall: number;
    calibratedOverall: number;
  };
}

/**
 * Collects, during a harness run, what {@link DepthPolicyReport} says: fed by the engine after
 * every verification (the calibrator learns from the outcome) and after every round (simulated
 * seconds of the round from the cost model).
 */
export class DepthRunStats {
  readonly #setup: DepthPolicySetup;
  readonly #name: string;
  readonly #hist: number[];
  #seconds = 0;
  #rounds = 0;
  #verified = 0;

  constructor(spec: DepthPolicySpec, setup: DepthPolicySetup, numSpec: number) {
    this.#setup = setup;
    this.#name = depthPolicyName(spec);
    this.#hist = new Array<number>(numSpec + 1).fill(0);
  }

  /** After a request's verification: `depth` drafts verified, `accepted` accepted. */
  readonly onVerified = (drafts: { conf: ArrayLike<number> }, depth: number, accepted: number): void => {
    this.#setup.calibrator.observeDraft(drafts.conf, depth, accepted);
    const d = Math.min(depth, this.#hist.length - 1);
    this.#hist[d] = this.#hist[d]! + 1;
  };

  /** After a decode round: `batch` requests verified `verified` draft tokens in all. */
  readonly onRoundVerified = (batch: number, verified: number, unverified: number): void => {
    this.#setup.calibrator.endRound();
    this.#hist[0] = this.#hist[0]! + unverified;
    this.#seconds += this.#setup.cost.roundSeconds(batch, verified);
    this.#rounds++;
    this.#verified += verified;
  };

  /** The report for a run that generated `tokens` tokens. */
  report(tokens: number): DepthPolicyReport {
    const rep = this.#setup.calibrator.report();
    return {
      policy: this.#name,
      goodputSimulated: this.#seconds > 0 ? tokens / this.#seconds : 0,
      simulatedSeconds: this.#seconds,
      verifiedPerRound: this.#rounds > 0 ? this.#verified / this.#rounds : 0,
      depthHistogram: [...this.#hist],
      ece: {
        raw: rep.raw,
        calibrated: rep.calibrated,
        observations: rep.observations,
        rawOverall: overallEce(rep.raw, rep.observations),
        calibratedOverall: overallEce(rep.calibrated, rep.observations),
      },
    };
  }
}
