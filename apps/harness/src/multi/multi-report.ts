/**
 * The report of a multi-instance run (issue 21): every process with its pids, one section per
 * engine process, per worker and per shared encoder, the failover gap (`failover_rounds`), the
 * discovery latency, what etcd's outage changed.
 */
import type { LosslessResult } from "../report/report.js";
import type { EngineMediaResult } from "./engine-proc.js";

/** One engine of the run. */
export interface MultiEngineReport {
  id: string;
  /** Its process (one engine, one process). */
  pids: number[];
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
  /** Rounds whose link time passed the STEP timeout (a loaded machine's scheduling included). */
  roundsOverTimeout: number;
  /** Its media over the shared encoders (placement, transfers per encoder, local fallbacks). */
  media: EngineMediaResult;
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
  /** Member STEPs each engine sent it. */
  servedEngines: Record<string, number>;
  events: string[];
  /** Member STEPs that failed after its clean stop began (null: never stopped cleanly). */
  failedStepsAfterCleanStop: number | null;
}

/** One shared encoder process (every incarnation at one control endpoint). */
export interface MultiEncoderReport {
  id: string;
  endpoint: string;
  pids: number[];
  /** Transfers the engines asked of it (placed on it as a holder, or encode-on-miss as owner). */
  transfers: number;
  /** The same per engine: more than one engine means it was shared. */
  servedEngines: Record<string, number>;
  /** True when it registered in etcd (`--register`) and the engines found it there. */
  registered: boolean;
  events: string[];
}

/** What stopping etcd changed: non-draining members per pool before, at the lowest during, after. */
export interface EtcdDownReport {
  ms: number;
  membersBefore: number[];
  membersDuring: number[];
  membersAfter: number[];
}

/** The JSON report of a multi-instance run. */
export interface MultiReport {
  mode: "multi";
  discovery: string;
  engines: MultiEngineReport[];
  workers: MultiWorkerReport[];
  /** The shared encoders (none with `--encoders 0`). */
  encoders: MultiEncoderReport[];
  /** The harness's own pid. */
  harnessPid: number;
  /** Every process of the run (harness, etcd, engines, workers, encoders) with its pids. */
  processes: { id: string; role: string; pids: number[] }[];
  /** Child processes that died outside the fault schedule (the run is then not ok). */
  unexpectedExits: string[];
  etcd: {
    clientUrl: string;
    /** Every etcd process (a restart is a new one). */
    pids: number[];
    down: EtcdDownReport | null;
  } | null;
  /** Per moved slot: rounds from its old member's first failed STEP to its first draft elsewhere. */
  failover_rounds: { n: number; p50: number | null; max: number | null };
  /** With etcd: ms from a mid-run worker's registration to a ready member in every pool. */
  discovered_ms: number | null;
  /** ms from the restart of the SIGKILLed encoder until every engine's directory trusted it again. */
  encoder_trusted_again_ms: number | null;
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
    `tapwire harness: multi-instance run (${r.engines.length} engines, ${r.workers.length} workers, ${r.encoders.length} encoders, discovery ${r.discovery})`,
  );
  out.push("");
  out.push("processes");
  for (const p of r.processes) out.push(`  ${p.id.padEnd(10)} ${p.role.padEnd(8)} pids ${p.pids.join(",")}`);
  out.push("engines");
  for (const e of r.engines) {
    out.push(
      `  ${e.id}  pid ${e.pids.join(",")}  session 0x${e.session.toString(16)}  ${e.requests} requests, ${e.tokens} tokens, ${e.rounds} rounds, longest round ${e.maxRoundMs} ms (${e.roundsOverTimeout} over the STEP timeout)  lossless ${e.lossless.ok ? "yes" : `NO (${e.lossless.mismatched} differ)`}`,
    );
    const m = e.media;
    if (m.discovery !== "none")
      out.push(
        `    media: encoders by ${m.discovery} (${m.encodersSeen.length} seen), ${m.transfers} transfers (${m.placed} placed on a holder, ${m.encodesAsked} encodes asked), ${m.fallbacks} local fallbacks; per encoder ${kv(m.byEncoder)}`,
      );
    out.push(`    rounds without drafts: ${kv(e.roundsWithoutDrafts)}`);
    out.push(`    requests without drafts: ${kv(e.entriesWithoutDrafts)}`);
  }
  out.push("workers");
  for (const w of r.workers) {
    out.push(
      `  ${w.id}  ${w.endpoint}  pids ${w.pids.join(",")}  peak slots ${w.peakSlots}, STEPs ${w.steps} (${w.stepsFailed} failed), failovers ${w.failoversOut}, moved RELEASEs ${w.movedReleases}; STEPs per engine ${kv(w.servedEngines)}`,
    );
    if (w.events.length > 0) out.push(`    ${w.events.join("; ")}`);
    if (w.failedStepsAfterCleanStop !== null)
      out.push(`    failed STEPs after its clean stop: ${w.failedStepsAfterCleanStop}`);
  }
  if (r.encoders.length > 0) out.push("encoders");
  for (const x of r.encoders) {
    out.push(
      `  ${x.id}  ${x.endpoint}  pids ${x.pids.join(",")}  transfers ${x.transfers} (per engine ${kv(x.servedEngines)})${x.registered ? ", registered in etcd" : ""}`,
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
  if (r.encoder_trusted_again_ms !== null)
    out.push(`encoder restart: trusted again by every engine after ${r.encoder_trusted_again_ms} ms`);
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
