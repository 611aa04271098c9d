// Load curves: the verification budget of the target as a function of its batch size.
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
