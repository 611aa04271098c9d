/**
 * The worker's metrics on the harness's `/metrics`: re-served from the worker's own endpoint
 * (`tapwire-worker --metrics-listen`) when the worker build has one, or rendered from its STATS
 * snapshot (CONTRACT 10) otherwise.
 */
import { spawnSync } from "node:child_process";
import type { RemoteDraftClient } from "@tapwire/client";

const helpCache = new Map<string, string>();

/**
 * True when the `--help` of the bin at `script` lists `flag` (the harness runs the bins of this
 * workspace, which gain flags over time; asking is cheaper than failing on an unknown flag).
 * Cached per script.
 */
export function binHasFlag(script: string, flag: string): boolean {
  let help = helpCache.get(script);
  if (help === undefined) {
    const r = spawnSync(process.execPath, [script, "--help"], { encoding: "utf8", timeout: 20_000 });
    help = r.status === 0 ? r.stdout : "";
    helpCache.set(script, help);
  }
  return new RegExp(`(^|\\s)${flag.replace(/[-]/g, "\\-")}(\\s|=|$)`, "m").test(help);
}

/** True when `tapwire-worker --help` (at `script`) lists `--metrics-listen`. */
export function workerHasMetricsListen(script: string): boolean {
  return binHasFlag(script, "--metrics-listen");
}

/** The `tapwire_harness_worker_scrape_up` gauge: 1 when the worker's metrics answered this scrape. */
export function scrapeUpText(up: 0 | 1, source: "endpoint" | "stats" | "none"): string {
  return [
    "# HELP tapwire_harness_worker_scrape_up 1 when the worker's metrics answered this scrape (source: its endpoint or its STATS)",
    "# TYPE tapwire_harness_worker_scrape_up gauge",
    `tapwire_harness_worker_scrape_up{source="${source}"} ${up}`,
    "",
  ].join("\n");
}

const NAME_OK = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;

function esc(s: string): string {
  return s.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/"/g, '\\"');
}

function num(v: number): string {
  if (Number.isNaN(v)) return "NaN";
  if (!Number.isFinite(v)) return v > 0 ? "+Inf" : "-Inf";
  return String(v);
}

const UNIT_SUFFIX: Record<string, string> = { seconds: "_seconds", bytes: "_bytes" };

/**
 * Renders a `@tapwire/stats` snapshot (what STATS answers: `{ counters, gauges, info, histograms }`,
 * other fields ignored) as Prometheus text under `prefix`: counters as `_total` counters, gauges,
 * info values as `_info{value=…} 1`, histograms as summaries (the snapshot has HDR quantiles p50,
 * p90, p99, not buckets). Names that are not Prometheus names are left out.
 */
export function statsToPrometheus(snapshot: unknown, prefix: string): string {
  if (typeof snapshot !== "object" || snapshot === null) return "";
  const s = snapshot as Record<string, unknown>;
  const out: string[] = [];
  const family = (name: string, type: string, help: string) => {
    out.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
  };
  const each = (key: string, fn: (name: string, v: unknown) => void) => {
    const rec = s[key];
    if (typeof rec !== "object" || rec === null) return;
    for (const [name, v] of Object.entries(rec)) if (NAME_OK.test(name)) fn(name, v);
  };
  each("counters", (name, v) => {
    if (typeof v !== "number") return;
    const full = `${prefix}${name}${name.endsWith("_total") ? "" : "_total"}`;
    family(full, "counter", `worker counter ${name} (from STATS)`);
    out.push(`${full} ${num(v)}`);
  });
  each("gauges", (name, v) => {
    if (typeof v !== "number") return;
    family(`${prefix}${name}`, "gauge", `worker gauge ${name} (from STATS)`);
    out.push(`${prefix}${name} ${num(v)}`);
  });
  each("info", (name, v) => {
    if (typeof v !== "string") return;
    const full = `${prefix}${name}${name.endsWith("_info") ? "" : "_info"}`;
    family(full, "gauge", `worker value ${name} (from STATS)`);
    out.push(`${full}{value="${esc(v)}"} 1`);
  });
  each("histograms", (name, v) => {
    if (typeof v !== "object" || v === null) return;
    const h = v as Record<string, unknown>;
    const suffix = UNIT_SUFFIX[String(h["unit"])] ?? "";
    const full = `${prefix}${name}${suffix !== "" && name.endsWith(suffix) ? "" : suffix}`;
    family(full, "summary", `worker histogram ${name} (from STATS: HDR quantiles)`);
    for (const [q, k] of [
      ["0.5", "p50"],
      ["0.9", "p90"],
      ["0.99", "p99"],
    ] as const) {
      out.push(`${full}{quantile="${q}"} ${num(Number(h[k] ?? 0))}`);
    }
    out.push(`${full}_sum ${num(Number(h["sum"] ?? 0))}`, `${full}_count ${num(Number(h["count"] ?? 0))}`);
  });
  return out.length > 0 ? `${out.join("\n")}\n` : "";
}

/**
 * The worker's metrics for our /metrics: its own endpoint's text when it has one (re-served as
 * is), else, outside `--faults`, its STATS snapshot over the drafter link (counters, gauges and
 * HDR quantiles as summaries), and `tapwire_harness_worker_scrape_up` saying whether it answered.
 */
export async function workerMetrics(url: string | null, client: RemoteDraftClient | null): Promise<string> {
  if (url !== null) {
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(1000) });
      if (res.ok) return `${scrapeUpText(1, "endpoint")}${await res.text()}`;
    } catch {
      // a worker being restarted by --faults does not answer; up 0 says so
    }
    return scrapeUpText(0, "endpoint");
  }
  if (client?.ready) {
    try {
      const snap = await Promise.race([
        client.stats(),
        new Promise<never>((_, reject) => setTimeout(() => reject(new Error("timeout")), 1000).unref()),
      ]);
      return `${scrapeUpText(1, "stats")}${statsToPrometheus(snap, "tapwire_worker_")}`;
    } catch {
      // link down or busy: up 0
    }
  }
  return scrapeUpText(0, url === null && client === null ? "none" : "stats");
}
