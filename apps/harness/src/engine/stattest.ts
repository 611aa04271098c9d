/**
 * The statistics the lossless check of sampled mode needs: Pearson chi-square tests with sparse
 * categories pooled, and the chi-square survival function.
 */

/** ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms; relative error < 1e-13). */
export function lnGamma(x: number): number {
  const c = [
    0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313, -176.61502916214059,
    12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7,
  ];
  if (x < 0.5) return Math.log(Math.PI / Math.sin(Math.PI * x)) - lnGamma(1 - x);
  x -= 1;
  let a = c[0] as number;
  const t = x + 7.5;
  for (let i = 1; i < 9; i++) a += (c[i] as number) / (x + i);
  return 0.5 * Math.log(2 * Math.PI) + (x + 0.5) * Math.log(t) - t + Math.log(a);
}

/** Regularised upper incomplete gamma Q(a, x) = Γ(a, x) / Γ(a). */
export function gammaQ(a: number, x: number): number {
  if (x <= 0) return 1;
  if (x < a + 1) {
    // series for P, then Q = 1 - P
    let sum = 1 / a;
    let term = sum;
    for (let n = 1; n < 1000; n++) {
      term *= x / (a + n);
      sum += term;
      if (Math.abs(term) < Math.abs(sum) * 1e-15) break;
    }
    return Math.max(0, 1 - sum * Math.exp(-x + a * Math.log(x) - lnGamma(a)));
  }
  // continued fraction for Q (modified Lentz)
  const tiny = 1e-300;
  let b = x + 1 - a;
  let c = 1 / tiny;
  let d = 1 / b;
  let h = d;
  for (let i = 1; i < 1000; i++) {
    const an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (Math.abs(d) < tiny) d = tiny;
    c = b + an / c;
    if (Math.abs(c) < tiny) c = tiny;
    d = 1 / d;
    const del = d * c;
    h *= del;
    if (Math.abs(del - 1) < 1e-15) break;
  }
  return Math.min(1, Math.exp(-x + a * Math.log(x) - lnGamma(a)) * h);
}

/** P(X >= stat) for X ~ chi-square with `df` degrees of freedom. */
export function chiSquareSurvival(stat: number, df: number): number {
  if (df <= 0) return 1;
  return gammaQ(df / 2, stat / 2);
}

/** The outcome of a chi-square test. */
export interface ChiSquareResult {
  statistic: number;
  df: number;
  pValue: number;
  /** Categories after pooling sparse ones (the pooled remainder counts as one). */
  categories: number;
  /** Total observations (per sample for the two-sample test). */
  n: number | [number, number];
}

/**
 * Two-sample chi-square test of homogeneity: do counts `a` and `b` (same categories) come from one
 * distribution? Categories whose pooled expected count in either sample is below `minExpected`
 * are merged into one remainder category (dropped if it is still too sparse).
 */
export function chiSquareHomogeneity(
  a: ReadonlyMap<number, number>,
  b: ReadonlyMap<number, number>,
  minExpected = 5,
): ChiSquareResult {
  let na = 0;
  let nb = 0;
  for (const v of a.values()) na += v;
  for (const v of b.values()) nb += v;
  const n = na + nb;
  const keys = new Set<number>([...a.keys(), ...b.keys()]);
  const cells: Array<[number, number]> = [];
  let restA = 0;
  let restB = 0;
  const fa = na / n;
  const fb = nb / n;
  for (const k of [...keys].sort((x, y) => x - y)) {
    const ca = a.get(k) ?? 0;
    const cb = b.get(k) ?? 0;
    const tot = ca + cb;
    if (tot * fa >= minExpected && tot * fb >= minExpected) cells.push([ca, cb]);
    else {
      restA += ca;
      restB += cb;
    }
  }
  if ((restA + restB) * fa >= minExpected && (restA + restB) * fb >= minExpected) cells.push([restA, restB]);
  let stat = 0;
  for (const [ca, cb] of cells) {
    const tot = ca + cb;
    const ea = tot * fa;
    const eb = tot * fb;
    stat += (ca - ea) ** 2 / ea + (cb - eb) ** 2 / eb;
  }
  const df = Math.max(0, cells.length - 1);
  return { statistic: stat, df, pValue: chiSquareSurvival(stat, df), categories: cells.length, n: [na, nb] };
}

/**
 * Chi-square goodness of fit of observed counts to probabilities `p` (sums to 1). Sparse categories
 * (expected count below `minExpected`) are pooled into one remainder.
 */
export function chiSquareGoodnessOfFit(
  observed: ArrayLike<number>,
  p: ArrayLike<number>,
  minExpected = 5,
): ChiSquareResult {
  let n = 0;
  for (let i = 0; i < observed.length; i++) n += observed[i] as number;
  let stat = 0;
  let cells = 0;
  let restO = 0;
  let restE = 0;
  for (let i = 0; i < p.length; i++) {
    const e = n * (p[i] as number);
    const o = observed[i] as number;
    if (e >= minExpected) {
      stat += (o - e) ** 2 / e;
      cells++;
    } else {
      restO += o;
      restE += e;
    }
  }
  if (restE >= minExpected) {
    stat += (restO - restE) ** 2 / restE;
    cells++;
  } else if (restO > 0 && restE > 0) {
    // Too sparse to test on its own: fold it in as a cell anyway only when it was observed
    // far more than expected (an impossible token would otherwise go unnoticed).
    stat += (restO - restE) ** 2 / restE;
    cells++;
  }
  const df = Math.max(0, cells - 1);
  return { statistic: stat, df, pValue: chiSquareSurvival(stat, df), categories: cells, n };
}
