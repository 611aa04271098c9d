// A small dependency-free SVG writer for report pictures (issue 24): bar charts and line charts
// as standalone SVG documents, deterministic text (same input, same bytes) so that generated
// pictures can be committed and diffed.

/** Options of {@link barChartSvg}. */
export interface BarChartOptions {
  /** Title above the chart. */
  title: string;
  /** One label per bar. */
  labels: readonly string[];
  /** One value per bar (>= 0). */
  values: readonly number[];
  /** Axis caption under the labels. */
  xLabel?: string;
  /** Axis caption of the values. */
  yLabel?: string;
  /** How a value is printed above its bar (default 3 significant digits). */
  format?: (v: number) => string;
  /** Largest value of the axis (default the largest value). */
  max?: number;
  /** Width in px (default 560). */
  width?: number;
  /** Height in px (default 300). */
  height?: number;
  /** Bar colour (default #4a7bd0). */
  color?: string;
}

/** One series of {@link lineChartSvg}. */
export interface LineSeries {
  /** Legend name. */
  name: string;
  /** Points `[x, y]` in order of x. */
  points: ReadonlyArray<readonly [number, number]>;
  /** Colour (default from a palette). */
  color?: string;
}

/** Options of {@link lineChartSvg}. */
export interface LineChartOptions {
  /** Title above the chart. */
  title: string;
  /** The series. */
  series: readonly LineSeries[];
  /** Caption of the x axis. */
  xLabel?: string;
  /** Caption of the y axis. */
  yLabel?: string;
  /** Width in px (default 560). */
  width?: number;
  /** Height in px (default 300). */
  height?: number;
}

const PALETTE = ["#4a7bd0", "#e0913a", "#3a9d5d", "#6a5acd", "#c24a4a"];

function esc(s: string): string {
  return s.replace(/[<>&"]/g, (c) => `&#${c.charCodeAt(0)};`);
}

function num(v: number): string {
  return Number.isFinite(v) ? String(Math.round(v * 100) / 100) : "0";
}

function sig(v: number): string {
  if (v === 0) return "0";
  return Math.abs(v) >= 100 ? String(Math.round(v)) : String(Number(v.toPrecision(3)));
}

function frame(w: number, h: number, title: string, body: string[]): string {
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}" viewBox="0 0 ${w} ${h}" font-family="system-ui, sans-serif" font-size="12" role="img" aria-label="${esc(title)}">`,
    `<title>${esc(title)}</title>`,
    `<rect width="${w}" height="${h}" fill="#ffffff"/>`,
    `<text x="${w / 2}" y="20" text-anchor="middle" font-size="14" font-weight="600">${esc(title)}</text>`,
    ...body,
    "</svg>",
    "",
  ].join("\n");
}

/** A bar chart as an SVG document. */
export function barChartSvg(o: BarChartOptions): string {
  const w = o.width ?? 560;
  const h = o.height ?? 300;
  const fmt = o.format ?? sig;
  const left = o.yLabel ? 80 : 56;
  const right = 16;
  const top = 36;
  const bottom = 48;
  const n = Math.max(1, o.values.length);
  const max = o.max ?? Math.max(1e-12, ...o.values.map((v) => (Number.isFinite(v) ? v : 0)));
  const plotW = w - left - right;
  const plotH = h - top - bottom;
  const bw = plotW / n;
  const body: string[] = [];
  for (let t = 0; t <= 4; t++) {
    const y = top + plotH - (plotH * t) / 4;
    body.push(`<line x1="${left}" y1="${num(y)}" x2="${w - right}" y2="${num(y)}" stroke="#e4e4e4"/>`);
    body.push(
      `<text x="${left - 6}" y="${num(y + 4)}" text-anchor="end" fill="#555">${esc(fmt((max * t) / 4))}</text>`,
    );
  }
  o.values.forEach((raw, i) => {
    const v = Number.isFinite(raw) ? Math.max(0, raw) : 0;
    const bh = (plotH * Math.min(v, max)) / max;
    const x = left + i * bw + bw * 0.15;
    body.push(
      `<rect x="${num(x)}" y="${num(top + plotH - bh)}" width="${num(bw * 0.7)}" height="${num(bh)}" fill="${o.color ?? PALETTE[0]}"/>`,
    );
    body.push(
      `<text x="${num(x + bw * 0.35)}" y="${num(top + plotH - bh - 4)}" text-anchor="middle">${esc(fmt(v))}</text>`,
    );
    body.push(
      `<text x="${num(x + bw * 0.35)}" y="${num(top + plotH + 16)}" text-anchor="middle" fill="#333">${esc(o.labels[i] ?? "")}</text>`,
    );
  });
  body.push(`<line x1="${left}" y1="${top + plotH}" x2="${w - right}" y2="${top + plotH}" stroke="#888"/>`);
  if (o.xLabel)
    body.push(
      `<text x="${left + plotW / 2}" y="${h - 8}" text-anchor="middle" fill="#555">${esc(o.xLabel)}</text>`,
    );
  if (o.yLabel) {
    body.push(
      `<text x="14" y="${top + plotH / 2}" text-anchor="middle" fill="#555" transform="rotate(-90 14 ${top + plotH / 2})">${esc(o.yLabel)}</text>`,
    );
  }
  return frame(w, h, o.title, body);
}

/** A line chart (one polyline and its points per series, with a legend) as an SVG document. */
export function lineChartSvg(o: LineChartOptions): string {
  const w = o.width ?? 560;
  const h = o.height ?? 300;
  const left = o.yLabel ? 80 : 60;
  const right = 16;
  const top = 36;
  const bottom = 48;
  const pts = o.series.flatMap((s) => s.points);
  const xs = pts.map((p) => p[0]);
  const ys = pts.map((p) => p[1]).filter(Number.isFinite);
  const x0 = Math.min(0, ...xs);
  const x1 = Math.max(x0 + 1e-12, ...xs);
  const y1 = Math.max(1e-12, ...ys);
  const plotW = w - left - right;
  const plotH = h - top - bottom;
  const X = (x: number) => left + ((x - x0) / (x1 - x0)) * plotW;
  const Y = (y: number) => top + plotH - (Math.max(0, y) / y1) * plotH;
  const body: string[] = [];
  for (let t = 0; t <= 4; t++) {
    const y = top + plotH - (plotH * t) / 4;
    body.push(`<line x1="${left}" y1="${num(y)}" x2="${w - right}" y2="${num(y)}" stroke="#e4e4e4"/>`);
    body.push(
      `<text x="${left - 6}" y="${num(y + 4)}" text-anchor="end" fill="#555">${esc(sig((y1 * t) / 4))}</text>`,
    );
  }
  for (const x of [...new Set(xs)].sort((a, b) => a - b)) {
    body.push(
      `<text x="${num(X(x))}" y="${top + plotH + 16}" text-anchor="middle" fill="#333">${esc(sig(x))}</text>`,
    );
  }
  o.series.forEach((s, i) => {
    const c = s.color ?? PALETTE[i % PALETTE.length]!;
    const line = s.points.map((p) => `${num(X(p[0]))},${num(Y(p[1]))}`).join(" ");
    body.push(`<polyline points="${line}" fill="none" stroke="${c}" stroke-width="2"/>`);
    for (const p of s.points)
      body.push(`<circle cx="${num(X(p[0]))}" cy="${num(Y(p[1]))}" r="3" fill="${c}"/>`);
    body.push(`<rect x="${left + 8}" y="${top + 4 + i * 16}" width="10" height="10" fill="${c}"/>`);
    body.push(`<text x="${left + 22}" y="${top + 13 + i * 16}">${esc(s.name)}</text>`);
  });
  body.push(`<line x1="${left}" y1="${top + plotH}" x2="${w - right}" y2="${top + plotH}" stroke="#888"/>`);
  if (o.xLabel)
    body.push(
      `<text x="${left + plotW / 2}" y="${h - 8}" text-anchor="middle" fill="#555">${esc(o.xLabel)}</text>`,
    );
  if (o.yLabel) {
    body.push(
      `<text x="14" y="${top + plotH / 2}" text-anchor="middle" fill="#555" transform="rotate(-90 14 ${top + plotH / 2})">${esc(o.yLabel)}</text>`,
    );
  }
  return frame(w, h, o.title, body);
}
