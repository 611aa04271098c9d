import { describe, expect, test } from "vitest";
import { chiSquareHomogeneity, chiSquareSurvival, gammaQ, lnGamma } from "../src/engine/stattest.js";

describe("chi-square machinery", () => {
  test("lnGamma and the survival function match known values", () => {
    expect(lnGamma(5)).toBeCloseTo(Math.log(24), 10);
    expect(lnGamma(0.5)).toBeCloseTo(Math.log(Math.sqrt(Math.PI)), 10);
    // chi-square critical values: P(X >= 3.841) = 0.05 at df 1; P(X >= 18.307) = 0.05 at df 10
    expect(chiSquareSurvival(3.841458820694124, 1)).toBeCloseTo(0.05, 6);
    expect(chiSquareSurvival(18.307038053275146, 10)).toBeCloseTo(0.05, 6);
    expect(chiSquareSurvival(124.342, 100)).toBeCloseTo(0.05, 3);
    expect(gammaQ(1, 2)).toBeCloseTo(Math.exp(-2), 12);
    expect(chiSquareSurvival(0, 3)).toBe(1);
  });

  test("homogeneity: same counts give p = 1, very different counts a tiny p, sparse cells pooled", () => {
    const a = new Map([
      [1, 100],
      [2, 200],
      [3, 300],
      [9, 1],
    ]);
    const same = chiSquareHomogeneity(a, new Map(a));
    expect(same.statistic).toBeCloseTo(0, 12);
    expect(same.pValue).toBeCloseTo(1, 12);
    expect(same.categories).toBe(3); // token 9 is too rare and has no remainder partner worth a cell
    const b = new Map([
      [1, 300],
      [2, 200],
      [3, 100],
    ]);
    expect(chiSquareHomogeneity(a, b).pValue).toBeLessThan(1e-20);
  });
});
