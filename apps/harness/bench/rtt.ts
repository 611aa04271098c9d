// pnpm --filter @tapwire/harness bench:rtt — remote drafting against added link RTT
// (docs/benchmarks/rtt.md). Root only: each row is one harness run with `--topology netns` (engine,
// worker and encoder in their own network namespaces) and `--link "delay=<RTT/2>ms relay=on"`:
// the relay in the router adds half the RTT in each direction. Every row, the 0 ms one included,
// goes through the relay, so the 0 ms row is the same-path baseline of the same run. Reported per
// row: STEP RTT and round time (p50, mean), wall tokens/s and the same run's target-only tokens/s
// (the reference model decoding the same requests in process), the harness's goodput line
// (tokens per simulated second, H100 / 8B cost model with its fixed 0.3 ms RTT term), and that goodput
// with the measured STEP RTT (p50) in place of the fixed term against the cost model's target-only
// goodput at the same batch. The budget is where drafting stops paying (goodput with drafts <=
// target-only), linearly interpolated between rows.
// JSON on stdout, a markdown table on stderr; `--write` also writes docs/benchmarks/rtt.json and
// rtt.svg (bench/rtt-svg.ts). Env: BENCH_RTTS (ms, default 0,0.5,1,2,3,4,5), BENCH_REQUESTS (24),
// BENCH_REPEATS (3: passes over the rows interleaved, the median of each figure kept).
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { cpus, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { H100_8B_COST, VerifyCostModel } from "@tapwire/client";
import type { Report } from "../src/report/report.js";
import { rttSvg } from "./rtt-svg.js";

const RTTS = (process.env.BENCH_RTTS ?? "0,0.5,1,2,3,4,5").split(",").map(Number);
const REQUESTS = Number(process.env.BENCH_REQUESTS ?? 24);
const REPEATS = Number(process.env.BENCH_REPEATS ?? 3);
const BIN = fileURLToPath(new URL("../dist/bin/harness.js", import.meta.url));
const docs = (f: string) => fileURLToPath(new URL(`../../../docs/benchmarks/${f}`, import.meta.url));
const log = (s: string) => process.stderr.write(`${s}\n`);

/** One row of the sweep. */
export interface RttRow {
  added_rtt_ms: number;
  link: string;
  step_rtt_p50_ms: number;
  step_rtt_mean_ms: number;
  round_p50_ms: number;
  round_mean_ms: number;
  tokens_per_target_forward: number;
  wall_tokens_per_s: number;
  target_only_wall_tokens_per_s: number;
  wall_ratio_to_target_only: number;
  wall_ratio_to_0ms: number;
  harness_goodput_line: number;
  goodput_with_measured_rtt: number;
  target_only_goodput: number;
  goodput_ratio_to_target_only: number;
  /** The STEP RTT (ms, p50) at which this row's modelled goodput would equal target-only's. */
  break_even_step_rtt_ms: number;
  relay_bytes: number;
  lossless: boolean;
}

/** The JSON the bench writes. */
export interface RttBench {
  bench: "rtt";
  machine: { cpus: number; loadavg1: number };
  config: { requests: number; repeats: number; args: string[] };
  rows: RttRow[];
  budget: {
    /** Added RTT (ms) where wall tokens/s with drafts falls to target-only's; null: never above it. */
    wall_ms: number | null;
    /** Added RTT (ms) where modelled goodput (H100 / 8B, measured RTT) falls to target-only's. */
    h100_8b_ms: number | null;
    /** The budget is past the sweep's last row (linear extrapolation). */
    h100_8b_extrapolated: boolean;
    /** The whole STEP RTT (ms, p50) at which drafting stops paying for the H100 / 8B model (median over rows). */
    h100_8b_step_rtt_ms: number;
    /** The 0 ms row's STEP RTT (ms, p50): this machine's own link + worker time. */
    base_step_rtt_ms: number;
    statement: string;
  };
}

const ARGS = [
  "--topology",
  "netns",
  "--requests",
  String(REQUESTS),
  "--rate",
  "0",
  "--mm-share",
  "0",
  "--seed",
  "7",
  "--progress",
  "off",
];

function runOnce(rtt: number, dir: string): Promise<Report> {
  const link = rtt === 0 ? "relay=on" : `delay=${rtt / 2}ms relay=on`;
  const json = join(dir, `rtt-${rtt}.json`);
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, ...ARGS, "--link", link, "--json", json], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    let err = "";
    child.stderr.on("data", (d: Buffer) => {
      err += d.toString();
    });
    child.once("exit", (code) => {
      if (code !== 0) reject(new Error(`harness --link "${link}" exited ${code}:\n${err}`));
      else resolve(JSON.parse(readFileSync(json, "utf8")) as Report);
    });
  });
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 === 1 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

function rowOf(rtt: number, runs: Report[]): Omit<RttRow, "wall_ratio_to_0ms"> {
  const cost = new VerifyCostModel({ online: false });
  const pick = (f: (r: Report) => number) => median(runs.map(f));
  const modelled = (r: Report) => {
    const dp = r.depthPolicy!;
    const rounds = r.rounds.total;
    // the harness's line counts H100_8B_COST.rttSec per round: put the measured STEP RTT there
    // p50, not the mean: on a shared machine a few scheduling stalls would dominate a mean
    const seconds = dp.simulatedSeconds + rounds * (r.latency.stepRtt.p50 / 1000 - H100_8B_COST.rttSec);
    return r.tokens.generated / seconds;
  };
  const targetOnly = (r: Report) => {
    // the same requests target-only: one token per request per forward, no link
    const batch = r.speculation.targetForwards / r.rounds.total;
    return batch / (cost.forwardSeconds(batch, 0) + H100_8B_COST.overheadSec);
  };
  const breakEven = (r: Report) => {
    // tokens / (S0 + rounds x rtt) = target-only goodput, with S0 the rounds' seconds without RTT
    const s0 = r.depthPolicy!.simulatedSeconds - r.rounds.total * H100_8B_COST.rttSec;
    return ((r.tokens.generated / targetOnly(r) - s0) / r.rounds.total) * 1000;
  };
  const g = pick(modelled);
  const t = pick(targetOnly);
  const wall = pick((r) => r.throughput.tokensPerSecond);
  const wallTarget = pick((r) => r.tokens.targetOnlyGenerated / r.throughput.targetOnlySeconds);
  return {
    added_rtt_ms: rtt,
    link: runs[0]!.topology.link,
    step_rtt_p50_ms: pick((r) => r.latency.stepRtt.p50),
    step_rtt_mean_ms: pick((r) => r.latency.stepRtt.mean),
    round_p50_ms: pick((r) => r.latency.round.p50),
    round_mean_ms: pick((r) => r.latency.round.mean),
    tokens_per_target_forward: pick((r) => r.speculation.tokensPerTargetForward),
    wall_tokens_per_s: wall,
    target_only_wall_tokens_per_s: wallTarget,
    wall_ratio_to_target_only: wall / wallTarget,
    harness_goodput_line: pick((r) => r.depthPolicy!.goodputSimulated),
    goodput_with_measured_rtt: g,
    target_only_goodput: t,
    goodput_ratio_to_target_only: g / t,
    break_even_step_rtt_ms: pick(breakEven),
    relay_bytes: pick((r) => (r.topology.relay ?? []).reduce((a, f) => a + f.bytesUp + f.bytesDown, 0)),
    lossless: runs.every((r) => r.lossless.ok),
  };
}

/** Where `ratio` (decreasing in RTT) crosses 1: interpolated, extrapolated past the last row, or null. */
function crossing(
  rows: RttRow[],
  ratio: (r: RttRow) => number,
): { ms: number | null; extrapolated: boolean } {
  if (ratio(rows[0]!) <= 1) return { ms: 0, extrapolated: false };
  for (let i = 1; i < rows.length; i++) {
    const a = rows[i - 1]!;
    const b = rows[i]!;
    if (ratio(b) <= 1) {
      const f = (ratio(a) - 1) / (ratio(a) - ratio(b));
      return { ms: a.added_rtt_ms + f * (b.added_rtt_ms - a.added_rtt_ms), extrapolated: false };
    }
  }
  // past the sweep: extend the line through the first and the last row
  const a = rows[0]!;
  const b = rows[rows.length - 1]!;
  const slope = (ratio(b) - ratio(a)) / (b.added_rtt_ms - a.added_rtt_ms);
  if (!(slope < 0)) return { ms: null, extrapolated: true };
  return { ms: a.added_rtt_ms + (1 - ratio(a)) / slope, extrapolated: true };
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "tapwire-bench-rtt-"));
  try {
    const runs = new Map<number, Report[]>(RTTS.map((r) => [r, []]));
    for (let k = 0; k < REPEATS; k++) {
      for (const rtt of RTTS) {
        log(`bench:rtt: pass ${k + 1}/${REPEATS}, added RTT ${rtt} ms`);
        runs.get(rtt)!.push(await runOnce(rtt, dir));
      }
    }
    const partial = RTTS.map((rtt) => rowOf(rtt, runs.get(rtt)!));
    const base = partial[0]!.wall_tokens_per_s;
    const rows: RttRow[] = partial.map((r) => ({ ...r, wall_ratio_to_0ms: r.wall_tokens_per_s / base }));
    const wall = crossing(rows, (r) => r.wall_ratio_to_target_only);
    const h100 = crossing(rows, (r) => r.goodput_ratio_to_target_only);
    const fmt = (v: number | null) => (v === null ? "never" : `${v.toFixed(2)} ms`);
    const stepBudget = median(rows.map((r) => r.break_even_step_rtt_ms));
    const baseRtt = rows[0]!.step_rtt_p50_ms;
    const statement = [
      wall.ms === 0
        ? `Reference model (wall time on this CPU): remote drafting does not pay at any added RTT, 0 ms included: the same run's target-only decode makes ${rows[0]!.target_only_wall_tokens_per_s.toFixed(0)} tokens/s against ${rows[0]!.wall_tokens_per_s.toFixed(0)} with drafts, since one reference forward costs far less than one STEP round trip.`
        : `Reference model (wall time on this CPU): remote drafting stops paying at ${fmt(wall.ms)} of added RTT.`,
      `H100 / 8B cost model with the measured STEP RTT: drafting pays while the whole STEP RTT stays below ${stepBudget.toFixed(2)} ms (p50), the round trip in which the extra tokens per forward still buy more than they wait for; this machine's 0 ms row already spends ${baseRtt.toFixed(2)} ms per STEP (link, relay and a CPU worker drafting), so the added-RTT budget here is ${fmt(h100.ms)}${h100.extrapolated ? " (beyond the sweep, extrapolated linearly)" : ""} and ${(stepBudget - baseRtt).toFixed(2)} ms by the break-even RTT.`,
    ].join(" ");
    const out: RttBench = {
      bench: "rtt",
      machine: { cpus: cpus().length, loadavg1: loadavg()[0]! },
      config: { requests: REQUESTS, repeats: REPEATS, args: ARGS },
      rows,
      budget: {
        wall_ms: wall.ms,
        h100_8b_ms: h100.ms,
        h100_8b_extrapolated: h100.extrapolated,
        h100_8b_step_rtt_ms: stepBudget,
        base_step_rtt_ms: baseRtt,
        statement,
      },
    };
    const json = `${JSON.stringify(out, null, 2)}\n`;
    process.stdout.write(json);
    log(
      "\n| added RTT ms | STEP RTT p50 ms | round p50 ms | tokens/forward | wall tok/s (x 0 ms) | target-only tok/s | goodput line | goodput, measured RTT | target-only goodput |",
    );
    log("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (const r of rows) {
      log(
        `| ${r.added_rtt_ms} | ${r.step_rtt_p50_ms.toFixed(2)} | ${r.round_p50_ms.toFixed(2)} | ${r.tokens_per_target_forward.toFixed(2)} | ${r.wall_tokens_per_s.toFixed(0)} (${r.wall_ratio_to_0ms.toFixed(2)}) | ${r.target_only_wall_tokens_per_s.toFixed(0)} | ${r.harness_goodput_line.toFixed(0)} | ${r.goodput_with_measured_rtt.toFixed(0)} | ${r.target_only_goodput.toFixed(0)} |`,
      );
    }
    log(`\n${statement}`);
    if (process.argv.includes("--write")) {
      writeFileSync(docs("rtt.json"), json);
      writeFileSync(docs("rtt.svg"), rttSvg(out));
      log("bench:rtt: wrote docs/benchmarks/rtt.json and rtt.svg");
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv.includes("--svg-only")) {
  const saved = JSON.parse(readFileSync(docs("rtt.json"), "utf8")) as RttBench;
  writeFileSync(docs("rtt.svg"), rttSvg(saved));
  log("bench:rtt: redrew docs/benchmarks/rtt.svg from rtt.json");
} else {
  await main();
}
