// The SVG of docs/benchmarks/rtt.md, drawn from the bench's JSON (no dependencies): left, STEP RTT
// and round time against added RTT; right, goodput with drafts over target-only (1 = break-even)
// for the H100 / 8B cost model with the measured RTT and for the reference model in wall time.
import type { RttBench } from "./rtt.js";

const W = 760;
const H = 320;
const PAD = { l: 56, r: 16, t: 36, b: 44 };
const PANEL = (W - PAD.l * 2 - PAD.r * 2) / 2;

interface Series {
  name: string;
  color: string;
  points: Array<[number, number]>;
  dashed?: boolean;
}

const esc = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;");

function panel(x0: number, title: string, yLabel: string, series: Series[], hline: number | null): string {
  const xs = series.flatMap((s) => s.points.map((p) => p[0]));
  const ys = series.flatMap((s) => s.points.map((p) => p[1])).concat(hline === null ? [] : [hline]);
  const xMax = Math.max(...xs, 1);
  const yMax = Math.max(...ys) * 1.1 || 1;
  const h = H - PAD.t - PAD.b;
  const px = (x: number) => x0 + (x / xMax) * PANEL;
  const py = (y: number) => PAD.t + h - (y / yMax) * h;
  const out: string[] = [];
  out.push(
    `<text x="${x0 + PANEL / 2}" y="${PAD.t - 14}" text-anchor="middle" font-weight="bold">${esc(title)}</text>`,
  );
  out.push(`<rect x="${x0}" y="${PAD.t}" width="${PANEL}" height="${h}" fill="none" stroke="#999"/>`);
  for (let i = 0; i <= 4; i++) {
    const y = (yMax * i) / 4;
    out.push(`<line x1="${x0}" x2="${x0 + PANEL}" y1="${py(y)}" y2="${py(y)}" stroke="#eee"/>`);
    out.push(`<text x="${x0 - 4}" y="${py(y) + 4}" text-anchor="end">${y.toFixed(yMax < 5 ? 2 : 0)}</text>`);
  }
  for (const x of [...new Set(xs)]) {
    out.push(`<text x="${px(x)}" y="${PAD.t + h + 16}" text-anchor="middle">${x}</text>`);
  }
  out.push(`<text x="${x0 + PANEL / 2}" y="${H - 8}" text-anchor="middle">added RTT (ms)</text>`);
  out.push(
    `<text transform="translate(${x0 - 42},${PAD.t + h / 2}) rotate(-90)" text-anchor="middle">${esc(yLabel)}</text>`,
  );
  if (hline !== null) {
    out.push(
      `<line x1="${x0}" x2="${x0 + PANEL}" y1="${py(hline)}" y2="${py(hline)}" stroke="#c00" stroke-dasharray="4 3"/>`,
    );
  }
  series.forEach((s, i) => {
    const d = s.points
      .map((p, j) => `${j === 0 ? "M" : "L"}${px(p[0]).toFixed(1)},${py(p[1]).toFixed(1)}`)
      .join(" ");
    out.push(
      `<path d="${d}" fill="none" stroke="${s.color}" stroke-width="2"${s.dashed ? ' stroke-dasharray="6 3"' : ""}/>`,
    );
    for (const p of s.points) out.push(`<circle cx="${px(p[0])}" cy="${py(p[1])}" r="3" fill="${s.color}"/>`);
    out.push(`<rect x="${x0 + 8}" y="${PAD.t + 8 + i * 16}" width="10" height="10" fill="${s.color}"/>`);
    out.push(`<text x="${x0 + 22}" y="${PAD.t + 17 + i * 16}">${esc(s.name)}</text>`);
  });
  return out.join("\n");
}

/** The sweep as an SVG document. */
export function rttSvg(b: RttBench): string {
  const at = (f: (r: RttBench["rows"][number]) => number): Array<[number, number]> =>
    b.rows.map((r) => [r.added_rtt_ms, f(r)]);
  const left = panel(
    PAD.l,
    "Latency (p50)",
    "ms",
    [
      { name: "STEP RTT", color: "#1f77b4", points: at((r) => r.step_rtt_p50_ms) },
      { name: "round", color: "#ff7f0e", points: at((r) => r.round_p50_ms) },
    ],
    null,
  );
  const right = panel(
    PAD.l * 2 + PAD.r + PANEL,
    "Goodput with drafts / target-only",
    "ratio (1 = break-even)",
    [
      {
        name: "H100 / 8B model, measured RTT",
        color: "#2ca02c",
        points: at((r) => r.goodput_ratio_to_target_only),
      },
      {
        name: "reference model, wall time",
        color: "#9467bd",
        points: at((r) => r.wall_ratio_to_target_only),
        dashed: true,
      },
    ],
    1,
  );
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="11">
<title>STEP RTT, round time and goodput over target-only against added link RTT (bench:rtt)</title>
<rect width="${W}" height="${H}" fill="white"/>
${left}
${right}
</svg>
`;
}
