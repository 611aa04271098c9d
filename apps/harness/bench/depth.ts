// pnpm --filter @tapwire/harness bench:depth — depth policies in simulated time
// (docs/benchmarks/depth-policy.md). The reference target and head run in process (real drafts,
// real greedy verification, see src/depth/depth-sim.ts); each round's time comes from the cost model
// (H100_8B_COST: a dense 8B target on one H100). At concurrency 1, 4, 16 and 64, for fixed depths
// 0..N, the budget policy (the harness's load curve), goodput mode (calibrated, uncalibrated,
// and with the cost model fitted online from a wrong prior), and heads with their confidence
// temperatures scaled by 1, 0.5 and 2. Goodput ratios are against the best fixed depth of the same
// head and concurrency, measured in the same run. JSON on stdout, a markdown table on stderr;
// `--write` also writes docs/benchmarks/depth-policy.json and depth-policy.svg; `--svg-only`
// redraws the SVG from that JSON.
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { H100_8B_COST, piecewiseLinearBudget, VerifyCostModel } from "@tapwire/client";
import { createDefaultPair } from "@tapwire/reference-model";
import { DEFAULTS } from "../src/cli/cli.js";
import {
  type DepthPolicySpec,
  depthPolicyName,
  makeDepthPolicy,
  parseDepthPolicy,
  type SimResult,
  scaleConfidenceTemperatures,
  simulateDepth,
  traceRequests,
} from "../src/depth/depth-sim.js";

const N = Number(process.env.BENCH_NUM_SPEC ?? 8);
const CONCURRENCY = (process.env.BENCH_CONCURRENCY ?? "1,4,16,64").split(",").map(Number);
const SCALES = [1, 0.5, 2];
const POOL = Number(process.env.BENCH_POOL ?? 256);
const LENGTH = 64;
const WARMUP = Number(process.env.BENCH_WARMUP ?? 400);
const ROUND_TOKENS = Number(process.env.BENCH_ROUND_REQUESTS ?? 64_000); // request-rounds per run
// the online fit starts from a wrong, flat prior: it has to find the knee and both slopes
const WRONG_PRIOR = { floorSec: 2e-3, kneeTokens: 1000, slopeSec: 5e-6, subKneeSlopeSec: 0 } as const;
// BENCH_SUB_KNEE_SLOPE (seconds per token) overrides H100_8B_COST's sub-knee slope of the true
// cost, for the sensitivity of the results to that assumption (0: the ideal, flat roofline)
const SUB_KNEE = process.env.BENCH_SUB_KNEE_SLOPE;
const TRUTH = {
  ...H100_8B_COST,
  ...(SUB_KNEE !== undefined ? { subKneeSlopeSec: Number(SUB_KNEE) } : {}),
};
const docs = (f: string) => fileURLToPath(new URL(`../../../docs/benchmarks/${f}`, import.meta.url));

const log = (s: string) => process.stderr.write(`${s}\n`);

interface Row {
  head: string;
  scale: number;
  concurrency: number;
  policy: string;
  goodput: number;
  ratio_to_best_fixed: number;
  mean_accepted_length: number;
  verified_per_round: number;
  depth_histogram: number[];
  ece_raw: number[];
  ece_calibrated: number[];
  ece_observations: number[];
  ece_raw_overall: number;
  ece_calibrated_overall: number;
}

function main(): void {
  const t0 = performance.now();
  log(`bench:depth: distilling the reference head (N=${N})`);
  const { target, head } = createDefaultPair({ draft: { numSpec: N } });
  const truth = new VerifyCostModel({ ...TRUTH, online: false });
  const budget = piecewiseLinearBudget(
    DEFAULTS.loadCurve.map((p) => ({ batchSize: p.batch, tokens: p.tokens })),
  );
  const policies: (DepthPolicySpec & { online?: boolean })[] = [];
  for (let k = 0; k <= N; k++) policies.push(parseDepthPolicy(`fixed:${k}`, N)!);
  policies.push(
    { kind: "budget" },
    { kind: "goodput", calibrate: true },
    { kind: "goodput", calibrate: false },
  );
  policies.push({ kind: "goodput", calibrate: true, online: true });
  const rows: Row[] = [];
  for (const scale of SCALES) {
    const h = scale === 1 ? head : scaleConfidenceTemperatures(head, target, scale);
    const label = scale === 1 ? "calibrated" : `temperature x${scale}`;
    log(`bench:depth: tracing ${POOL} requests x ${LENGTH} tokens with the ${label} head`);
    const traces = traceRequests(target, h, {
      count: POOL,
      length: LENGTH,
      numSpec: N,
      promptTokens: 24,
      seed: 1,
    });
    for (const C of CONCURRENCY) {
      const rounds = Math.max(500, Math.round(ROUND_TOKENS / C));
      const results: { name: string; r: SimResult }[] = [];
      for (const spec of policies) {
        const online = spec.online === true;
        // goodput mode knows the true cost (TRUTH), or fits it online from the wrong prior
        const cost = new VerifyCostModel(
          online ? { ...WRONG_PRIOR, online: true } : { ...TRUTH, online: false },
        );
        const setup = makeDepthPolicy(spec, { numSpec: N, budget, cost });
        const r = simulateDepth({ traces, concurrency: C, rounds, warmupRounds: WARMUP, setup, cost: truth });
        results.push({ name: depthPolicyName(spec) + (online ? "-online" : ""), r });
      }
      const best = Math.max(...results.filter((x) => x.name.startsWith("fixed:")).map((x) => x.r.goodput));
      for (const { name, r } of results) {
        rows.push({
          head: label,
          scale,
          concurrency: C,
          policy: name,
          goodput: Number(r.goodput.toFixed(2)),
          ratio_to_best_fixed: Number((r.goodput / best).toFixed(4)),
          mean_accepted_length: Number(r.meanAcceptedLength.toFixed(3)),
          verified_per_round: Number(r.verifiedPerRound.toFixed(2)),
          depth_histogram: r.depthHistogram,
          ece_raw: r.ece.raw.map((v) => Number(v.toFixed(4))),
          ece_calibrated: r.ece.calibrated.map((v) => Number(v.toFixed(4))),
          ece_observations: r.ece.observations.map(Math.round),
          ece_raw_overall: Number(r.ece.rawOverall.toFixed(4)),
          ece_calibrated_overall: Number(r.ece.calibratedOverall.toFixed(4)),
        });
      }
      log(`  C=${C}: done (${rounds} rounds per policy)`);
    }
  }
  const summary = summarize(rows);
  const out = {
    bench: "depth-policy",
    node: process.version,
    arrangement:
      "reference target + head in process (real drafts, real greedy verification, request traces replayed by every policy); simulated time from the cost model; closed loop, every slot busy",
    cost_model: {
      ...TRUTH,
      source:
        SUB_KNEE === undefined
          ? "H100_8B_COST (docs/depth-policy.md)"
          : `H100_8B_COST with subKneeSlopeSec = ${SUB_KNEE} (BENCH_SUB_KNEE_SLOPE)`,
    },
    num_spec: N,
    request_pool: POOL,
    tokens_per_request: LENGTH,
    warmup_rounds: WARMUP,
    budget_load_curve: DEFAULTS.loadCurve,
    online_prior: WRONG_PRIOR,
    seconds: Number(((performance.now() - t0) / 1000).toFixed(1)),
    summary,
    rows,
  };
  const json = `${JSON.stringify(out, null, 2)}\n`;
  process.stdout.write(json);
  log(table(rows));
  log(depthTable(rows));
  if (process.argv.includes("--write")) {
    writeFileSync(docs("depth-policy.json"), json);
    writeFileSync(docs("depth-policy.svg"), svg(rows));
    log("bench:depth: wrote docs/benchmarks/depth-policy.json and depth-policy.svg");
  }
}

function summarize(rows: Row[]) {
  const out: Record<string, unknown>[] = [];
  for (const head of [...new Set(rows.map((r) => r.head))]) {
    for (const C of CONCURRENCY) {
      const at = rows.filter((r) => r.head === head && r.concurrency === C);
      const g = (p: string) => at.find((r) => r.policy === p)!;
      const fixed = at.filter((r) => r.policy.startsWith("fixed:"));
      const best = fixed.reduce((a, b) => (b.goodput > a.goodput ? b : a));
      out.push({
        head,
        concurrency: C,
        best_fixed: best.policy,
        goodput_vs_best_fixed: g("goodput").ratio_to_best_fixed,
        goodput_vs_budget: Number((g("goodput").goodput / g("budget").goodput).toFixed(4)),
        budget_vs_best_fixed: g("budget").ratio_to_best_fixed,
        goodput_raw_vs_best_fixed: g("goodput-raw").ratio_to_best_fixed,
        goodput_online_vs_best_fixed: g("goodput-online").ratio_to_best_fixed,
        ece_raw_overall: g("goodput").ece_raw_overall,
        ece_calibrated_overall: g("goodput").ece_calibrated_overall,
      });
    }
  }
  return out;
}

function table(rows: Row[]): string {
  const lines = [
    "| head | C | policy | goodput (tok/s) | vs best fixed | mean accepted length | verified / round | ECE raw | ECE calibrated |",
    "|---|---|---|---|---|---|---|---|---|",
  ];
  for (const r of rows) {
    lines.push(
      `| ${r.head} | ${r.concurrency} | ${r.policy} | ${r.goodput} | ${r.ratio_to_best_fixed.toFixed(3)} | ${r.mean_accepted_length.toFixed(2)} | ${r.verified_per_round.toFixed(1)} | ${r.ece_raw_overall.toFixed(3)} | ${r.ece_calibrated_overall.toFixed(3)} |`,
    );
  }
  return lines.join("\n");
}

// the chosen depths: the share of request-rounds verified at depth 0..N, per policy and
// concurrency (calibrated head), as in docs/benchmarks/depth-policy.md
function depthTable(rows: Row[]): string {
  const cols = Array.from({ length: N + 1 }, (_, d) => `d=${d}`);
  const lines = [`| policy | C | ${cols.join(" | ")} |`, `|---|---|${cols.map(() => "---").join("|")}|`];
  for (const policy of ["budget", "goodput", "goodput-raw", "goodput-online"]) {
    for (const C of CONCURRENCY) {
      const r = rows.find((x) => x.head === "calibrated" && x.policy === policy && x.concurrency === C);
      if (r === undefined) continue;
      const total = r.depth_histogram.reduce((a, b) => a + b, 0) || 1;
      const cells = r.depth_histogram.map((v) => {
        const pct = (100 * v) / total;
        return pct === 0 ? "·" : pct < 0.05 ? "<0.1" : pct.toFixed(1);
      });
      lines.push(`| ${policy} | ${C} | ${cells.join(" | ")} |`);
    }
  }
  return lines.join("\n");
}

// two panels: goodput against concurrency (log-log), and goodput / best fixed depth against
// concurrency; one line per policy for the calibrated head, plus goodput mode for the two
// miscalibrated heads
function svg(rows: Row[]): string {
  const W = 1000;
  const H = 440;
  const m = { l: 70, t: 36, b: 50, gap: 80, legend: 200 };
  const pw = (W - m.l - m.gap - m.legend - 20) / 2;
  const ph = H - m.t - m.b;
  const xs = CONCURRENCY;
  const px = (c: number, x0: number) =>
    x0 + (pw * Math.log2(c / xs[0]!)) / Math.log2(xs[xs.length - 1]! / xs[0]!);
  const ys = rows.map((r) => r.goodput).filter((v) => v > 0);
  const g0 = Math.log10(Math.min(...ys) * 0.8);
  const g1 = Math.log10(Math.max(...ys) * 1.2);
  const ratios = rows
    .filter((r) => r.head === "calibrated" || r.policy === "goodput")
    .map((r) => r.ratio_to_best_fixed);
  const r0 = Math.max(0, Math.floor(Math.min(...ratios) * 20) / 20);
  const r1 = Math.ceil(Math.max(...ratios) * 50) / 50 + 0.01;
  const left = m.l;
  const right = m.l + pw + m.gap;
  const pyG = (v: number) => m.t + ph - (ph * (Math.log10(v) - g0)) / (g1 - g0);
  const pyR = (v: number) => m.t + ph - (ph * (v - r0)) / (r1 - r0);
  const series: {
    name: string;
    head: string;
    policy: string;
    color: string;
    dash?: string;
    width?: number;
  }[] = [];
  for (let k = 0; k <= N; k++)
    series.push({ name: `fixed:${k}`, head: "calibrated", policy: `fixed:${k}`, color: "#bbbbbb" });
  series.push(
    { name: "budget (load curve)", head: "calibrated", policy: "budget", color: "#e08a1e", width: 2.5 },
    {
      name: "goodput, uncalibrated",
      head: "calibrated",
      policy: "goodput-raw",
      color: "#7a9cc6",
      dash: "5,4",
      width: 2,
    },
    {
      name: "goodput, online cost fit",
      head: "calibrated",
      policy: "goodput-online",
      color: "#c0392b",
      dash: "1,3",
      width: 2,
    },
    {
      name: "goodput, head x0.5",
      head: "temperature x0.5",
      policy: "goodput",
      color: "#2a9d5b",
      dash: "2,3",
      width: 2,
    },
    {
      name: "goodput, head x2",
      head: "temperature x2",
      policy: "goodput",
      color: "#9b4dca",
      dash: "6,3",
      width: 2,
    },
    { name: "goodput", head: "calibrated", policy: "goodput", color: "#1f5fbf", width: 3 },
  );
  const p: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12">`,
    `<title>Depth policies in simulated time: goodput against concurrency per policy</title>`,
    `<rect width="${W}" height="${H}" fill="white"/>`,
    `<text x="${left}" y="20" font-size="14">Depth policies in simulated time (H100 / 8B cost model, sub-knee slope ${(TRUTH.subKneeSlopeSec * 1e6).toFixed(1)} µs/token, reference head, N=${N})</text>`,
  ];
  const frame = (x0: number, title: string, ylabel: string) => {
    for (const c of xs) {
      const x = px(c, x0).toFixed(1);
      p.push(`<line x1="${x}" x2="${x}" y1="${m.t}" y2="${m.t + ph}" stroke="#eeeeee"/>`);
      p.push(`<text x="${x}" y="${m.t + ph + 18}" text-anchor="middle">${c}</text>`);
    }
    p.push(
      `<rect x="${x0}" y="${m.t}" width="${pw}" height="${ph}" fill="none" stroke="#444444"/>`,
      `<text x="${x0 + pw / 2}" y="${m.t - 6}" text-anchor="middle">${title}</text>`,
      `<text x="${x0 + pw / 2}" y="${H - 12}" text-anchor="middle">concurrency (requests per round)</text>`,
      `<text transform="translate(${x0 - 52} ${m.t + ph / 2}) rotate(-90)" text-anchor="middle">${ylabel}</text>`,
    );
  };
  for (let e = Math.ceil(g0); e <= Math.floor(g1); e++) {
    for (const f of [1, 2, 5]) {
      const v = f * 10 ** e;
      if (Math.log10(v) < g0 || Math.log10(v) > g1) continue;
      const y = pyG(v).toFixed(1);
      p.push(`<line x1="${left}" x2="${left + pw}" y1="${y}" y2="${y}" stroke="#eeeeee"/>`);
      p.push(`<text x="${left - 6}" y="${y}" text-anchor="end" dominant-baseline="middle">${v}</text>`);
    }
  }
  for (let v = r0; v <= r1 + 1e-9; v += 0.05) {
    const y = pyR(v).toFixed(1);
    p.push(
      `<line x1="${right}" x2="${right + pw}" y1="${y}" y2="${y}" stroke="${Math.abs(v - 1) < 1e-9 ? "#888888" : "#eeeeee"}"/>`,
    );
    p.push(
      `<text x="${right - 6}" y="${y}" text-anchor="end" dominant-baseline="middle">${v.toFixed(2)}</text>`,
    );
  }
  frame(left, "goodput", "tokens per simulated second");
  frame(right, "goodput / best fixed depth (same head, same concurrency)", "ratio");
  let ly = m.t + 8;
  const lx = right + pw + 16;
  for (const s of series) {
    const at = xs
      .map((c) => rows.find((r) => r.head === s.head && r.policy === s.policy && r.concurrency === c))
      .filter((r): r is Row => r !== undefined && r.goodput > 0);
    if (at.length === 0) continue;
    const style = `fill="none" stroke="${s.color}" stroke-width="${s.width ?? 1}"${s.dash ? ` stroke-dasharray="${s.dash}"` : ""}`;
    p.push(
      `<polyline points="${at.map((r) => `${px(r.concurrency, left).toFixed(1)},${pyG(r.goodput).toFixed(1)}`).join(" ")}" ${style}/>`,
    );
    p.push(
      `<polyline points="${at.map((r) => `${px(r.concurrency, right).toFixed(1)},${pyR(r.ratio_to_best_fixed).toFixed(1)}`).join(" ")}" ${style}/>`,
    );
    if (s.policy.startsWith("fixed:") && s.policy !== "fixed:0") continue;
    const name = s.policy === "fixed:0" ? `fixed:0..${N} (grey)` : s.name;
    p.push(
      `<line x1="${lx}" x2="${lx + 24}" y1="${ly}" y2="${ly}" ${style}/>`,
      `<text x="${lx + 30}" y="${ly}" dominant-baseline="middle">${name}</text>`,
    );
    ly += 18;
  }
  p.push("</svg>");
  return `${p.join("\n")}\n`;
}

if (process.argv.includes("--svg-only")) {
  // redraw the plot from the committed JSON without re-running the sweep
  const saved = JSON.parse(readFileSync(docs("depth-policy.json"), "utf8")) as { rows: Row[] };
  writeFileSync(docs("depth-policy.svg"), svg(saved.rows));
} else {
  main();
}
