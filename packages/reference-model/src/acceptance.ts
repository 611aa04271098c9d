// Greedy acceptance of a head against its target: the rollout, the harness-style measurement,
// and the confidence calibration fitted on the same rollouts.
import type { DraftHead } from "./draft.js";
import { type DraftConfig, type DraftOut, MAX_DRAFT_POSITIONS } from "./draft-config.js";
import { badArgument, checkInt } from "./errors.js";
import { mix32, Xoshiro128 } from "./prng.js";
import { expNonPositive } from "./sampling.js";
import type { TargetModel, TargetState } from "./target.js";

/**
 * Fits the per-position confidence temperature: for each position j, over greedy rounds where
 * the drafts before j matched, minimise the Brier score of the top-1 probability against
 * "draft j matched" (golden-section search over log temperature).
 */
export function calibrate(target: TargetModel, head: DraftHead, config: Required<DraftConfig>): Float32Array {
  const v = head.vocabSize;
  const n = config.numSpec;
  const samples: { j: number; logits: Float32Array; hit: number }[] = [];
  rollout(
    target,
    head,
    { numSpec: n, rounds: config.calibrationRounds, seed: mix32(config.seed ^ 0xca11b) },
    (j, hit) => {
      const lo = j * v;
      const src = head.lastLogits.subarray(lo, lo + v);
      let max = Number.NEGATIVE_INFINITY;
      for (let t = 0; t < v; t++) if (src[t]! > max) max = src[t]!;
      // Keep only logits that can matter (within 30 of the max) to make the search cheap.
      let m = 0;
      for (let t = 0; t < v; t++) if (src[t]! - max > -30) m++;
      const kept = new Float32Array(m);
      m = 0;
      for (let t = 0; t < v; t++) if (src[t]! - max > -30) kept[m++] = src[t]! - max;
      samples.push({ j, logits: kept, hit: hit ? 1 : 0 });
    },
  );
  const temps = new Float32Array(MAX_DRAFT_POSITIONS).fill(1);
  let last = 1;
  for (let j = 0; j < MAX_DRAFT_POSITIONS; j++) {
    const s = samples.filter((x) => x.j === j);
    if (s.length < 8) {
      temps[j] = last;
      continue;
    }
    const loss = (logT: number): number => {
      const inv = Math.exp(-logT);
      let total = 0;
      for (const x of s) {
        let z = 0;
        for (let t = 0; t < x.logits.length; t++) z += expNonPositive(x.logits[t]! * inv);
        total += (1 / z - x.hit) ** 2;
      }
      return total;
    };
    let a = Math.log(0.05);
    let b = Math.log(50);
    const g = (Math.sqrt(5) - 1) / 2;
    let c = b - g * (b - a);
    let dd = a + g * (b - a);
    let fc = loss(c);
    let fd = loss(dd);
    for (let it = 0; it < 24; it++) {
      if (fc < fd) {
        b = dd;
        dd = c;
        fd = fc;
        c = b - g * (b - a);
        fc = loss(c);
      } else {
        a = c;
        c = dd;
        fc = fd;
        dd = a + g * (b - a);
        fd = loss(dd);
      }
    }
    last = Math.exp((a + b) / 2);
    temps[j] = last;
  }
  return temps;
}

/** Per-round greedy acceptance statistics of {@link measureAcceptance}. */
export interface AcceptanceReport {
  /**
   * Mean accepted length as this package defines it: matched drafts + 1 bonus token per round,
   * i.e. tokens per target forward when every round verifies all `numSpec` drafts.
   */
  meanAcceptedLength: number;
  /** Mean number of drafted tokens per round that matched the target's greedy continuation. */
  meanMatchedDrafts: number;
  /** Rounds measured. */
  rounds: number;
  /** Tokens produced (sum of matched + 1 over rounds). */
  tokens: number;
  /** Per position j: P(draft j matches | drafts before j matched). */
  acceptanceByPosition: number[];
  /** Per position j: mean confidence over the same rounds (compare with acceptanceByPosition). */
  meanConfidenceByPosition: number[];
  /** Distinct tokens among those produced (a sanity check that greedy output is not trivial). */
  distinctTokens: number;
}

/** Options of {@link measureAcceptance}. */
export interface MeasureOptions {
  /** Drafts per round N (1..32; default the head's numSpec). */
  numSpec?: number;
  /** Rounds to measure (default 512). */
  rounds?: number;
  /** Seed of the random prompts, a u32 (default 1). */
  seed?: number;
  /** Window rows handed to the head, 1..4096 (default the head's window). */
  window?: number;
  /** Tokens per sequence before a new random prompt starts, at least 32 (default 256). */
  sequenceLength?: number;
}

/**
 * Measures greedy acceptance the way the harness does: run the target greedily from random
 * prompts; each round, draft N tokens from the window of rows ending at the anchor, compare
 * with the target's greedy continuation, accept the matching prefix plus the bonus token.
 * @throws ReferenceModelError `RM_BAD_CONFIG` naming the first bad option, `RM_BAD_ARGUMENT` when
 *   the head was made for another vocabulary or row size.
 */
export function measureAcceptance(
  target: TargetModel,
  head: DraftHead,
  opts: MeasureOptions = {},
): AcceptanceReport {
  const n = checkInt("numSpec", opts.numSpec ?? head.config.numSpec, 1, MAX_DRAFT_POSITIONS);
  const rounds = checkInt("rounds", opts.rounds ?? 512, 1, 10_000_000);
  const seed = checkInt("seed", opts.seed ?? 1, 0, 0xffffffff);
  const window = checkInt("window", opts.window ?? head.config.window, 1, 4096);
  const sequenceLength = checkInt("sequenceLength", opts.sequenceLength ?? 256, 32, 1_000_000);
  if (head.vocabSize !== target.config.vocabSize || head.rowBytes !== target.rowBytes) {
    throw badArgument(
      `head (vocab ${head.vocabSize}, row_bytes ${head.rowBytes}) does not fit target (vocab ${target.config.vocabSize}, row_bytes ${target.rowBytes})`,
    );
  }
  const hits = new Array<number>(n).fill(0);
  const tries = new Array<number>(n).fill(0);
  const confSum = new Array<number>(n).fill(0);
  const seen = new Set<number>();
  const res = rollout(
    target,
    head,
    {
      numSpec: n,
      rounds,
      seed,
      window,
      sequenceLength,
    },
    (j, hit, conf, token) => {
      tries[j]!++;
      if (hit) hits[j]!++;
      confSum[j]! += conf;
      seen.add(token);
    },
  );
  return {
    meanAcceptedLength: res.tokens / rounds,
    meanMatchedDrafts: res.matched / rounds,
    rounds,
    tokens: res.tokens,
    acceptanceByPosition: hits.map((h, j) => (tries[j]! > 0 ? h / tries[j]! : 0)),
    meanConfidenceByPosition: confSum.map((c, j) => (tries[j]! > 0 ? c / tries[j]! : 0)),
    distinctTokens: seen.size,
  };
}

function rollout(
  target: TargetModel,
  head: DraftHead,
  opts: { numSpec: number; rounds: number; seed: number; window?: number; sequenceLength?: number },
  onPosition: (j: number, hit: boolean, conf: number, targetToken: number) => void,
): { tokens: number; matched: number } {
  const n = opts.numSpec;
  const window = opts.window ?? head.config.window;
  const seqLen = Math.max(opts.sequenceLength ?? 256, 32);
  const rb = target.rowBytes;
  const v = target.config.vocabSize;
  const maxLen = seqLen + 16 + n + 2;
  const rowsBuf = new Uint8Array(maxLen * rb);
  const logits = new Float32Array(v);
  const ids = new Int32Array(n);
  const conf = new Float32Array(n);
  const margin = new Float32Array(n);
  const out: DraftOut = { ids, conf, margin, offset: 0 };
  const rng = new Xoshiro128(opts.seed);
  let tokens = 0;
  let matched = 0;
  let done = 0;
  while (done < opts.rounds) {
    const st: TargetState = target.initialState();
    const promptLen = 4 + rng.nextInt(13);
    let p = 0;
    for (; p < promptLen; p++)
      target.forward(st, rng.nextInt(v), logits, rowsBuf.subarray(p * rb, (p + 1) * rb), st);
    let anchor = target.argmax(logits);
    while (done < opts.rounds && p + n + 1 <= seqLen + 16) {
      const nRows = Math.min(window, p);
      head.draft(rowsBuf.subarray((p - nRows) * rb, p * rb), nRows, anchor, n, out);
      let m = 0;
      let tok = anchor;
      for (;;) {
        target.forward(st, tok, logits, rowsBuf.subarray(p * rb, (p + 1) * rb), st);
        p++;
        const g = target.argmax(logits);
        if (m < n) {
          const hit = ids[m] === g;
          onPosition(m, hit, conf[m]!, g);
          if (hit) {
            m++;
            tok = g;
            continue;
          }
        }
        anchor = g;
        break;
      }
      matched += m;
      tokens += m + 1;
      done++;
    }
  }
  return { tokens, matched };
}
