/**
 * Metrics a vLLM dashboard reads (issue 24): a real harness run serves the spec-decode counters
 * under vLLM's names next to the tapwire_* series; a real Prometheus (/usr/bin/prometheus, temp
 * dir, free port) scrapes it while the run decodes, and every query copied from vLLM's Grafana
 * dashboard `vllm_speculative_decoding.json` (test/fixtures, path and commit cited there) returns
 * data; the per-position acceptance it computes equals the run's JSON report.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parsePrometheus, promtoolCheck } from "@tapwire/testing";
import { afterAll, expect, test } from "vitest";
import { parseArgs } from "../src/cli/cli.js";
import { runHarness } from "../src/run.js";
import { type Dashboard, expressions, structureProblems } from "./dashboard.js";

/** docs/dashboards/tapwire-spec-decode.json: the per-position acceptance panels (issue 24). */
const OURS = JSON.parse(
  readFileSync(
    join(import.meta.dirname, "..", "..", "..", "docs", "dashboards", "tapwire-spec-decode.json"),
    "utf8",
  ),
) as Dashboard;
const oursSubstituted = (e: string) =>
  e.replaceAll("$__rate_interval", "5m").replaceAll("$__range", "5m").replaceAll("$engine", ".*");

interface Fixture {
  path: string;
  commit: string;
  variables: string[];
  panels: Array<{ title: string; id: number; refId: string; expr: string }>;
}
const FIXTURE = JSON.parse(
  readFileSync(join(import.meta.dirname, "fixtures", "vllm-speculative-decoding-queries.json"), "utf8"),
) as Fixture;

const dir = mkdtempSync(join(tmpdir(), "tapwire-prom-"));
let prom: ChildProcess | null = null;
afterAll(() => {
  prom?.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
});

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const a = s.address();
      s.close(() => resolve(typeof a === "object" && a !== null ? a.port : 0));
    });
  });
}

async function until(pred: () => Promise<boolean>, ms: number, what: string): Promise<void> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await pred().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`timed out waiting for ${what}`);
}

/** The metric names a PromQL expression reads (names with a colon or an underscore before `{`). */
function names(expr: string): string[] {
  return [...expr.matchAll(/([a-zA-Z_:][a-zA-Z0-9_:]*)\{/g)].map((m) => m[1]!);
}

/** The dashboard's variables as Grafana substitutes "All": `.*`; the rate interval: the run's window. */
function substitute(expr: string): string {
  let e = expr.replaceAll("$__rate_interval", "5m");
  for (const v of FIXTURE.variables) e = e.replaceAll(`$${v}`, ".*");
  return e;
}

test("vLLM's spec-decode dashboard queries return data from a real Prometheus scraping a tapwire run", async () => {
  expect(FIXTURE.path).toBe("examples/observability/dashboards/grafana/vllm_speculative_decoding.json");
  expect(FIXTURE.panels.length).toBeGreaterThanOrEqual(10);
  const promPort = await freePort();
  const parsed = parseArgs([
    "--row",
    "2x512",
    "--requests",
    "24",
    "--rate",
    "6",
    "--mm-share",
    "0.3",
    "--progress",
    "off",
    "--depth-policy",
    "fixed:4",
    "--metrics-listen",
    "tcp://127.0.0.1:0",
  ]);
  if (parsed.help) throw new Error("help");
  const api = `http://127.0.0.1:${promPort}/api/v1`;
  const query = async (q: string) => {
    const r = await fetch(`${api}/query?query=${encodeURIComponent(q)}`);
    const j = (await r.json()) as {
      status: string;
      error?: string;
      data: { result: Array<{ metric: Record<string, string>; value: [number, string] }> };
    };
    if (j.status !== "success") throw new Error(`${q}: ${j.error}`);
    return j.data.result;
  };
  let scrape = "";
  let metricsPort = 0;
  const results: Record<string, Array<{ metric: Record<string, string>; value: [number, string] }>> = {};
  const { report } = await runHarness(parsed.config, {
    log: () => {},
    onMetrics: async (port) => {
      metricsPort = port;
      writeFileSync(
        join(dir, "prometheus.yml"),
        `global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: tapwire\n    static_configs:\n      - targets: ["127.0.0.1:${port}"]\n`,
      );
      prom = spawn(
        "/usr/bin/prometheus",
        [
          `--config.file=${join(dir, "prometheus.yml")}`,
          `--storage.tsdb.path=${join(dir, "data")}`,
          `--web.listen-address=127.0.0.1:${promPort}`,
        ],
        { stdio: "ignore" },
      );
      await until(
        async () => (await fetch(`http://127.0.0.1:${promPort}/-/ready`)).ok,
        60_000,
        "prometheus ready",
      );
    },
    onDecoded: async () => {
      scrape = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
      // two scrapes after the last verification: every counter's last increase is in Prometheus
      const drafts = async () => Number((await query("vllm:spec_decode_num_drafts_total"))[0]?.value[1] ?? 0);
      await until(async () => (await drafts()) > 0, 60_000, "a scrape with drafts");
      const seen = await drafts();
      await until(
        async () => (await query('up{job="tapwire"}')).length > 0 && (await drafts()) >= seen,
        30_000,
        "scrapes",
      );
      await new Promise((r) => setTimeout(r, 2500));
      for (const p of FIXTURE.panels) results[`${p.id}/${p.refId}`] = await query(substitute(p.expr));
      for (const e of expressions(OURS)) results[`ours/${e.where}`] = await query(oursSubstituted(e.expr));
      results["raw/perPos"] = await query("vllm:spec_decode_num_accepted_tokens_per_pos_total");
      results["raw/drafts"] = await query("vllm:spec_decode_num_drafts_total");
    },
  });
  expect(report.lossless.ok).toBe(true);
  const spec = report.specDecode!;
  expect(spec.numDrafts).toBeGreaterThan(0);
  // every name the dashboard reads is exported
  const live = new Set<string>();
  for (const f of parsePrometheus(scrape).values()) for (const s of f.samples) live.add(s.name);
  const text = await fetchScrapeNames(scrape);
  for (const p of FIXTURE.panels)
    for (const n of names(p.expr)) expect(live.has(n) || text.has(n), `${n} (${p.title})`).toBe(true);
  // and every query returns data
  for (const p of FIXTURE.panels) {
    const r = results[`${p.id}/${p.refId}`]!;
    expect(r.length, `${p.title} ${p.refId}: ${substitute(p.expr)}`).toBeGreaterThan(0);
    for (const s of r) expect(Number.isFinite(Number(s.value[1])), p.title).toBe(true);
  }
  // the panels' values are the run's: rate() extrapolates each series to the window's edges
  // (differently where a counter starts at 0), so the ratios agree to a few percent, and the
  // raw counters Prometheus holds equal the report exactly
  const near = (got: number, want: number) => expect(Math.abs(got - want)).toBeLessThan(0.05 * want + 0.02);
  near(Number(results["1/A"]![0]!.value[1]), spec.acceptanceRate);
  near(Number(results["2/A"]![0]!.value[1]), spec.acceptanceLength);
  const byPos = new Map(results["10/A"]!.map((s) => [Number(s.metric.position), Number(s.value[1])]));
  expect(byPos.size).toBe(spec.acceptanceByPosition.length);
  for (const [j, v] of spec.acceptanceByPosition.entries()) near(byPos.get(j)!, v);
  const raw = results["raw/perPos"]!;
  const rawByPos = new Map(raw.map((s) => [Number(s.metric.position), Number(s.value[1])]));
  for (const [j, v] of spec.acceptedPerPosition.entries()) expect(rawByPos.get(j)).toBe(v);
  expect(Number(results["raw/drafts"]![0]!.value[1])).toBe(spec.numDrafts);
  // monotone in position (a token is accepted only if the ones before it were)
  for (let j = 1; j < spec.acceptedPerPosition.length; j++) {
    expect(spec.acceptedPerPosition[j]!).toBeLessThanOrEqual(spec.acceptedPerPosition[j - 1]!);
  }
  expect(spec.numAcceptedTokens).toBe(report.speculation.draftsAccepted);
  expect(spec.numDraftTokens).toBe(report.speculation.draftsVerified);
  // the exposition with the vLLM series still passes promtool
  // promtool parses it; its only lint is the colon vLLM's own names carry (colons are meant for
  // recording rules, vLLM uses them anyway and so must we to match its dashboard)
  const check = promtoolCheck(scrape);
  expect(check.status === 0 || check.status === 3, check.problems.join("\n")).toBe(true);
  expect(check.problems.filter((l) => !/^vllm:\S+ metric names should not contain ':'$/.test(l))).toEqual([]);
  // docs/dashboards/tapwire-spec-decode.json: well-formed, every name live, every query has data
  expect(structureProblems(OURS)).toEqual([]);
  for (const e of expressions(OURS)) {
    for (const n of names(e.expr)) expect(live.has(n) || text.has(n), `${n} (${e.where})`).toBe(true);
    expect(results[`ours/${e.where}`]!.length, `${e.where}: ${e.expr}`).toBeGreaterThan(0);
  }
  const ourPos = results["ours/Acceptance rate by draft position/A"]!;
  expect(ourPos.length).toBe(spec.acceptanceByPosition.length);
  // the EC side's ec_* byte and time series
  expect(live.has("vllm:ec_transfer_bytes_total")).toBe(true);
  expect(live.has("vllm:ec_wait_seconds_sum")).toBe(true);
}, 240_000);

// names of samples in the text (a second reading, independent of parsePrometheus)
async function fetchScrapeNames(text: string): Promise<Set<string>> {
  const out = new Set<string>();
  for (const l of text.split("\n")) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]/.exec(l);
    if (m) out.add(m[1]!);
  }
  return out;
}
