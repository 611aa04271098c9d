/**
 * The lossless check: speculative output against target-only output of the same requests.
 *
 * Greedy: every request's tokens must be identical. Sampled: outputs are random, so the check is
 * statistical. For each tested position j (the j-th generated token) and each stratum (requests
 * with the same prompt and media, hence the same target distribution), the speculative and the
 * target-only token counts form a 2 x C contingency table; the Pearson chi-square statistics and
 * degrees of freedom of all strata add up (independent strata) to one chi-square test of
 * homogeneity per position. Each request contributes one token per position to each side, and
 * the two runs use independent PRNG streams, so under the null hypothesis (speculative sampling
 * is exactly target sampling) each test's p-value is uniform (slightly conservative after pooling
 * sparse categories). The run fails when the Bonferroni-corrected smallest p-value is below alpha.
 */
import type { LosslessResult } from "../report/report.js";
import { chiSquareHomogeneity, chiSquareSurvival } from "./stattest.js";
import type { RequestSpec } from "./workload.js";

/** Greedy check: token-for-token identity of every request. */
export function checkGreedy(
  requests: readonly RequestSpec[],
  speculative: ReadonlyMap<number, readonly number[]>,
  targetOnly: ReadonlyMap<number, readonly number[]>,
): LosslessResult {
  let mismatched = 0;
  let first: LosslessResult["firstMismatch"] = null;
  for (const r of requests) {
    const a = speculative.get(r.id) ?? [];
    const b = targetOnly.get(r.id) ?? [];
    const n = Math.max(a.length, b.length);
    for (let i = 0; i < n; i++) {
      if (a[i] !== b[i]) {
        mismatched++;
        first ??= { request: r.id, position: i, speculative: a[i] ?? -1, targetOnly: b[i] ?? -1 };
        break;
      }
    }
  }
  return {
    mode: "greedy",
    ok: mismatched === 0,
    checked: requests.length,
    mismatched,
    firstMismatch: first,
    test: null,
  };
}

/** Default significance level of the sampled check. */
export const SAMPLED_ALPHA = 0.001;

/** Sampled check: stratified chi-square homogeneity per generated position, Bonferroni over positions. */
export function checkSampled(
  requests: readonly RequestSpec[],
  speculative: ReadonlyMap<number, readonly number[]>,
  targetOnly: ReadonlyMap<number, readonly number[]>,
  maxPositions = 4,
  alpha = SAMPLED_ALPHA,
): LosslessResult {
  let minLen = Number.POSITIVE_INFINITY;
  for (const r of requests) minLen = Math.min(minLen, r.maxNewTokens);
  const positions = Array.from({ length: Math.max(0, Math.min(maxPositions, minLen)) }, (_, i) => i + 1);
  const strata = new Map<string, RequestSpec[]>();
  for (const r of requests) {
    const key = `${r.promptId}|${r.media.join(",")}`;
    let s = strata.get(key);
    if (!s) {
      s = [];
      strata.set(key, s);
    }
    s.push(r);
  }
  const perPosition: NonNullable<LosslessResult["test"]>["perPosition"] = [];
  let statSum = 0;
  let dfSum = 0;
  let minP = 1;
  for (const pos of positions) {
    let stat = 0;
    let df = 0;
    for (const members of strata.values()) {
      const a = new Map<number, number>();
      const b = new Map<number, number>();
      for (const r of members) {
        const x = speculative.get(r.id)?.[pos - 1];
        const y = targetOnly.get(r.id)?.[pos - 1];
        if (x !== undefined) a.set(x, (a.get(x) ?? 0) + 1);
        if (y !== undefined) b.set(y, (b.get(y) ?? 0) + 1);
      }
      const t = chiSquareHomogeneity(a, b);
      stat += t.statistic;
      df += t.df;
    }
    const p = chiSquareSurvival(stat, df);
    perPosition.push({ position: pos, statistic: stat, df, pValue: p });
    statSum += stat;
    dfSum += df;
    minP = Math.min(minP, p);
  }
  const adjusted = Math.min(1, minP * Math.max(1, positions.length));
  return {
    mode: "sampled",
    ok: positions.length > 0 && adjusted >= alpha,
    checked: requests.length,
    mismatched: 0,
    firstMismatch: null,
    test: {
      name: `chi-square homogeneity of tokens 1..${positions.length}, stratified by prompt (${strata.size} strata), Bonferroni over positions`,
      positions,
      statistic: statSum,
      df: dfSum,
      pValue: adjusted,
      alpha,
      perPosition,
    },
  };
}
