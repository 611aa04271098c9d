/**
 * The report of a multi-instance run (issue 21): one section per engine and per worker process,
 * the failover gap (`failover_rounds`), the discovery latency, what etcd's outage changed.
 */
import type { LosslessResult } from "../report/report.js";

/** One engine of the run. */
export interface MultiEngineReport {
  id: string;
  /** Its pool's session id (the same at every worker, CONTRACT 12.2). */
  session: number;
  requests: number;
  tokens: number;
  rounds: number;
  /** Rounds in which no request got a draft, by the round's outcome. */
  roundsWithoutDrafts: Record<string, number>;
  /** Requests without drafts in a round, by reason (not_ready, transport_error, timeout, deferred…). */
  entriesWithoutDrafts: Record<string, number>;
  /** The longest round's link time, ms (a dead worker costs at most the STEP timeout). */
  maxRoundMs: number;
  lossless: LosslessResult;
}

/** One worker process (every incarnation at one endpoint), as the engines' pools saw it. */
export interface MultiWorkerReport {
  id: string;
  endpoint: string;
  pids: number[];
  /** Most slots assigned to it at once, summed over the pools. */
  peakSlots: number;
  /** Member STEPs sent to it over all pools. */
  steps: number;
  stepsFailed: number;
  /** Slots moved away from it (failovers). */
  failoversOut: number;
  /** RELEASEs it got for slots that moved while it was away. */
  movedReleases: number;
  events: string[];
  /** Member STEPs that failed after its clean stop began (null: never stopped cleanly). */
  failedStepsAfterCleanStop: number | null;
}

/** The JSON report of a multi-instance run. */
export interface MultiReport {
  mode: "multi";
  discovery: string;
  engines: MultiEngineReport[];
  workers: MultiWorkerReport[];
  /** One encoder per engine (none with `--encoders 0`). */
  encoders: {
    id: string;
    endpoint: string;
    pids: number[];
    transfers: number;
    fallbacks: number;
    events: string[];
  }[];
  /** Child processes that died outside the fault schedule (the run is then not ok). */
  unexpectedExits: string[];
  etcd: {
    clientUrl: string;
    down: { ms: number; membersBefore: number[]; membersDuring: number[]; membersAfter: number[] } | null;
  } | null;
  /** Per moved slot: rounds from its old member's first failed STEP to its first draft elsewhere. */
  failover_rounds: { n: number; p50: number | null; max: number | null };
  /** With etcd: ms from a mid-run worker's registration to a ready member in every pool. */
  discovered_ms: number | null;
  ttl_s: number | null;
  step_timeout_ms: number;
  faults: { atMs: number; what: string }[];
  wall_ms: number;
  ok: boolean;
}

/** The `p`-th percentile (nearest rank) of `xs`, or null when empty. */
export function percentile(xs: readonly number[], p: number): number | null {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}

const kv = (r: Record<string, number>) =>
  Object.entries(r)
    .map(([k, v]) => `${k} ${v}`)
    .join(", ") || "none";

/** The report as text (stdout). */
export function formatMultiReport(r: MultiReport): string {
  const out: string[] = [];
  out.push(
    `tapwire harness: multi-instance run (${r.engines.length} engines, ${r.workers.length} workers, discovery ${r.discovery})`,
  );
  out.push("");
  out.push("engines");
  for (const e of r.engines) {
    out.push(
      `  ${e.id}  session 0x${e.session.toString(16)}  ${e.requests} requests, ${e.tokens} tokens, ${e.rounds} rounds, longest round ${e.maxRoundMs} ms  lossless ${e.lossless.ok ? "yes" : `NO (${e.lossless.mismatched} differ)`}`,
    );
    out.push(`    rounds without drafts: ${kv(e.roundsWithoutDrafts)}`);
    out.push(`    requests without drafts: ${kv(e.entriesWithoutDrafts)}`);
  }
  out.push("workers");
  for (const w of r.workers) {
    out.push(
      `  ${w.id}  ${w.endpoint}  pids ${w.pids.join(",")}  peak slots ${w.peakSlots}, STEPs ${w.steps} (${w.stepsFailed} failed), failovers ${w.failoversOut}, moved RELEASEs ${w.movedReleases}`,
    );
    if (w.events.length > 0) out.push(`    ${w.events.join("; ")}`);
    if (w.failedStepsAfterCleanStop !== null)
      out.push(`    failed STEPs after its clean stop: ${w.failedStepsAfterCleanStop}`);
  }
  if (r.encoders.length > 0) out.push("encoders");
  for (const x of r.encoders) {
    out.push(
      `  ${x.id}  ${x.endpoint}  pids ${x.pids.join(",")}  transfers ${x.transfers}, local fallbacks ${x.fallbacks}`,
    );
    out.push(`    ${x.events.join("; ")}`);
  }
  for (const d of r.unexpectedExits) out.push(`UNEXPECTED EXIT: ${d}`);
  const f = r.failover_rounds;
  out.push(
    `failover: ${f.n} slots moved, rounds p50 ${f.p50 ?? "-"} max ${f.max ?? "-"} (STEP timeout ${r.step_timeout_ms} ms)`,
  );
  if (r.discovered_ms !== null)
    out.push(
      `discovery: a worker started mid-run was ready in every pool after ${r.discovered_ms} ms (TTL ${r.ttl_s} s)`,
    );
  if (r.etcd?.down) {
    const d = r.etcd.down;
    out.push(
      `etcd down ${d.ms} ms: ready members per pool before ${d.membersBefore.join("/")}, lowest during ${d.membersDuring.join("/")}, after ${d.membersAfter.join("/")}`,
    );
  }
  for (const x of r.faults) out.push(`  fault at ${(x.atMs / 1000).toFixed(1)} s: ${x.what}`);
  out.push(`result: ${r.ok ? "lossless" : "OUTPUT DIFFERS"} (${(r.wall_ms / 1000).toFixed(1)} s)`);
  return `${out.join("\n")}\n`;
}
