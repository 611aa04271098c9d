/**
 * `--svg DIR` (issue 24): the report's pictures, written with @tapwire/stats' SVG writer:
 * acceptance per draft position, the STEP RTT histogram, and goodput against a fixed depth (the
 * run's measured acceptance per position priced with the H100 / 8B cost model of
 * docs/depth-policy.md, at the run's slot count).
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { VerifyCostModel } from "@tapwire/client";
import type { Histogram } from "@tapwire/stats";
import { barChartSvg, lineChartSvg } from "@tapwire/stats";
import type { Report } from "./report.js";

/** Bin edges (ms) of the RTT histograms of the live view and the pictures. */
export const RTT_EDGES_MS = [0, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 1e9];

/** A histogram as counts per {@link RTT_EDGES_MS} bin, estimated from 200 of its quantiles. */
export function histogramBins(h: Histogram): { edgesMs: number[]; counts: number[] } {
  const counts = new Array<number>(RTT_EDGES_MS.length - 1).fill(0);
  if (h.count > 0) {
    for (let i = 0; i < 200; i++) {
      const v = h.percentile((i + 0.5) / 2) * 1000;
      let b = 0;
      while (b < counts.length - 1 && v >= RTT_EDGES_MS[b + 1]!) b++;
      counts[b] = counts[b]! + h.count / 200;
    }
  }
  return { edgesMs: RTT_EDGES_MS, counts: counts.map((c) => Math.round(c)) };
}

/** Expected tokens per forward at fixed depth k: 1 + the acceptance of positions 0..k-1. */
export function goodputByDepth(acceptance: readonly number[], slots: number): Array<[number, number]> {
  const cost = new VerifyCostModel({ online: false });
  const out: Array<[number, number]> = [];
  let tokens = 1;
  for (let k = 0; k <= acceptance.length; k++) {
    if (k > 0) tokens += acceptance[k - 1]!;
    out.push([k, (slots * tokens) / cost.roundSeconds(slots, slots * k)]);
  }
  return out;
}

/** The SVG documents of a report, by file name. */
export function reportPictures(
  report: Report,
  rtt: { edgesMs: number[]; counts: number[] } | null,
): Record<string, string> {
  const out: Record<string, string> = {};
  const acc = report.specDecode?.acceptanceByPosition ?? [];
  out["acceptance-per-position.svg"] = barChartSvg({
    title: "Acceptance per draft position",
    labels: acc.map((_, j) => `position ${j}`),
    values: acc,
    max: 1,
    format: (v) => `${(100 * v).toFixed(1)}%`,
    yLabel: "accepted / verifications with drafts",
    xLabel: `mean accepted length ${(report.specDecode?.acceptanceLength ?? 0).toFixed(2)}`,
  });
  if (rtt !== null) {
    out["step-rtt.svg"] = barChartSvg({
      title: "STEP RTT histogram",
      labels: rtt.counts.map((_, i) =>
        i === rtt.counts.length - 1 ? `>${rtt.edgesMs[i]}` : `<${rtt.edgesMs[i + 1]}`,
      ),
      values: rtt.counts,
      format: (v) => (v > 0 ? String(v) : ""),
      xLabel: `ms (p50 ${report.latency.stepRtt.p50.toFixed(2)}, p99 ${report.latency.stepRtt.p99.toFixed(2)})`,
      yLabel: "STEPs",
      color: "#3a9d5d",
    });
  }
  const slots = Number(report.config["slots"] ?? 8);
  out["goodput-vs-depth.svg"] = lineChartSvg({
    title: `Goodput vs fixed depth (H100 / 8B cost model, ${slots} slots)`,
    series: [{ name: "tokens / simulated second", points: goodputByDepth(acc, slots) }],
    xLabel: "drafts verified per request (depth k)",
    yLabel: "tokens / s",
  });
  return out;
}

/** Writes {@link reportPictures} into `dir`; returns the paths. */
export function writePictures(dir: string, pictures: Record<string, string>): string[] {
  mkdirSync(dir, { recursive: true });
  return Object.entries(pictures).map(([name, svg]) => {
    const p = join(dir, name);
    writeFileSync(p, svg);
    return p;
  });
}
