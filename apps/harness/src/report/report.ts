/**
 * The run report: one JSON object (`--json FILE`) and the same numbers as a table on stdout.
 * docs/harness.md explains every field.
 */
import type { SpecDecodeSnapshot } from "@tapwire/client";
import type { DepthPolicyReport } from "../depth/depth-sim.js";
import type { PlacementReport } from "../ec/placement.js";
import type { TopologyReport } from "../procs/topology.js";

/** Percentiles of a latency, milliseconds. */
export interface LatencySummary {
  count: number;
  p50: number;
  p99: number;
  mean: number;
  max: number;
}

/** One fault the harness injected and what recovering from it took. */
export interface FaultRecord {
  kind: "worker_kill" | "link_stall" | "corrupt_reply" | "encoder_restart";
  /** ms after the run started. */
  atMs: number;
  detail: string;
  /** Counter deltas from the injection until the next fault or the end (reconnects, resyncs, retries, ...). */
  recovery: Record<string, number>;
  /**
   * ms from injection until recovery: for link faults a successful HELLO after the fault (a new
   * epoch); for the encoder a completed transfer after the restart. Null when not observed.
   */
  recoveredAfterMs: number | null;
  /** worker_kill, encoder_restart: the pid the fault killed (null for the link faults). */
  killedPid: number | null;
  /** How the killed process ended, as observed (its exit was awaited before the restart). */
  killedExit: { code: number | null; signal: string | null } | null;
  /** The pid of the process started in its place (null until it listened, or for link faults). */
  newPid: number | null;
}

/** A child process that died without being asked to (not by `--faults`, not at the end). */
export interface ChildDeath {
  /** "worker" or "encoder". */
  name: string;
  pid: number;
  /** ms after decoding started (the clock of {@link FaultRecord.atMs}); negative: before it. */
  atMs: number;
  /** Exit code, null when a signal ended it. */
  code: number | null;
  /** The signal that ended it (`SIGKILL`, `SIGSEGV`, …), null when it exited. */
  signal: string | null;
}

/** The result of the lossless check. */
export interface LosslessResult {
  mode: "greedy" | "sampled";
  ok: boolean;
  /** Requests compared with target-only decoding. */
  checked: number;
  /** Greedy: requests whose output differs from target-only. */
  mismatched: number;
  /** Greedy: the first difference. */
  firstMismatch: { request: number; position: number; speculative: number; targetOnly: number } | null;
  /** Sampled: the distribution test. */
  test: {
    name: string;
    positions: number[];
    statistic: number;
    df: number;
    pValue: number;
    alpha: number;
    perPosition: Array<{ position: number; statistic: number; df: number; pValue: number }>;
  } | null;
}

/** The complete report of a run. */
export interface Report {
  tool: "tapwire-harness";
  ok: boolean;
  config: Record<string, unknown>;
  lossless: LosslessResult;
  requests: { total: number; completed: number; multimodal: number; mediaItems: number };
  tokens: { generated: number; prompt: number; targetOnlyGenerated: number };
  rounds: { total: number; withDrafts: number; targetOnly: number };
  speculation: {
    /** Request-rounds: one verification pass (target forward over anchor + drafts) each. */
    targetForwards: number;
    draftsReceived: number;
    draftsVerified: number;
    draftsAccepted: number;
    /** draftsAccepted / draftsVerified. */
    acceptanceRate: number;
    /** Mean of (accepted drafts + 1) over request-rounds that verified at least one draft. */
    meanAcceptedLength: number;
    /** Generated tokens per target forward (1.0 without speculation). */
    tokensPerTargetForward: number;
    /** Mean verification budget per round (depth policy). */
    meanBudget: number;
    /** Drafts the depth policy left unverified (beyond the budget or not worth it). */
    draftsSkippedByPolicy: number;
  };
  /** The depth policy (`--depth-policy`): simulated goodput, chosen depths, ECE (docs/depth-policy.md). */
  depthPolicy?: DepthPolicyReport;
  /** The spec-decode counters under vLLM's names, with acceptance per position (issue 24, docs/dashboards). */
  specDecode?: SpecDecodeSnapshot;
  /** STEP RTT as counts per bin (edges in ms), for the pictures (`--svg`, issue 24). */
  stepRttHistogram?: { edgesMs: number[]; counts: number[] };
  latency: { stepRtt: LatencySummary; round: LatencySummary };
  roundTime: {
    draftLinkMs: number;
    verifyMs: number;
    prefillMs: number;
    schedulingMs: number;
    totalMs: number;
  };
  throughput: {
    wallSeconds: number;
    tokensPerSecond: number;
    requestsPerSecond: number;
    targetOnlySeconds: number;
  };
  ec: {
    requestsWaited: number;
    lookups: number;
    /** Lookups that joined a transfer already in flight for another request. */
    joined: number;
    transfers: number;
    bytes: number;
    cacheHits: number;
    fallbacks: number;
    retries: number;
    meanWaitMs: number;
    statusCounts: Record<string, number>;
    consumer: Record<string, number>;
    producer: Record<string, number>;
  };
  client: {
    outcomes: Record<string, number>;
    hellos: number;
    reconnects: number;
    resyncs: number;
    newSessions: number;
    connectFailures: number;
    disabledReason: string;
    other: Record<string, number>;
  };
  worker: Record<string, unknown>;
  faults: { enabled: boolean; injected: FaultRecord[] };
  /** `--encoders N` (N >= 2): placement through residency events (EC-CONTRACT 10). */
  placement?: PlacementReport;
  /** Things worth knowing about the run: local fallbacks and why, faults skipped or not injected. */
  notes: string[];
  /** The child processes: every pid each service ran as, and deaths nobody asked for. */
  processes: {
    worker: { pids: number[]; starts: number };
    encoder: { pids: number[]; starts: number } | null;
    unexpectedExits: ChildDeath[];
  };
  leaks: {
    ok: boolean;
    /**
     * none: both sides measured, nothing held; leaked; unknown: a side could not be measured (its
     * figures are null, never invented zeros); not_applicable: the run used no encoder cache.
     */
    status: "none" | "leaked" | "unknown" | "not_applicable";
    consumerPinnedBlocks: number | null;
    consumerInFlightBlocks: number | null;
    consumerRetiredBlocks: number | null;
    producerPinnedBlocks: number | null;
    producerGrants: number | null;
    notes: string[];
  };
  /** Where the processes ran (`--topology`, `--link`) and what the relay forwarded (docs/harness.md). */
  topology: TopologyReport;
}

const num = (v: number, d = 2) => (Number.isFinite(v) ? v.toFixed(d) : "-");
const int = (v: number) => (Number.isFinite(v) ? Math.round(v).toLocaleString("en-US") : "-");

function bytes(n: number): string {
  if (n >= 1 << 30) return `${(n / 2 ** 30).toFixed(2)} GiB`;
  if (n >= 1 << 20) return `${(n / 2 ** 20).toFixed(1)} MiB`;
  if (n >= 1 << 10) return `${(n / 2 ** 10).toFixed(1)} KiB`;
  return `${n} B`;
}

function counts(rec: Record<string, number>): string {
  const parts = Object.entries(rec)
    .filter(([, v]) => v !== 0)
    .map(([k, v]) => `${k} ${int(v)}`);
  return parts.length > 0 ? parts.join(", ") : "none";
}

/** The summary table being built: section lines and key/value rows. */
interface Rows {
  sec: (t: string) => void;
  row: (k: string, v: string) => void;
}

/** The lossless check (CONTRACT 8 for sampled runs). */
function losslessRows(r: Report, { sec, row }: Rows): void {
  sec("lossless");
  if (r.lossless.mode === "greedy") {
    row(
      "  greedy vs target-only",
      r.lossless.ok
        ? `identical: ${r.lossless.checked}/${r.lossless.checked} requests token for token`
        : `DIFFERS: ${r.lossless.mismatched} of ${r.lossless.checked} requests (first: request ${r.lossless.firstMismatch?.request} at token ${r.lossless.firstMismatch?.position})`,
    );
  } else if (r.lossless.test) {
    const t = r.lossless.test;
    row(
      "  sampled vs target-only",
      `${r.lossless.ok ? "consistent" : "REJECTED"}: adjusted p = ${num(t.pValue, 4)} (alpha ${t.alpha}; ${r.lossless.checked} requests)`,
    );
    row("  test", t.name);
    for (const p of t.perPosition) {
      row(`    token ${p.position}`, `chi2 ${num(p.statistic, 1)} df ${p.df}, p = ${num(p.pValue, 4)}`);
    }
  }
}

/** Requests, tokens, rounds, drafts and the depth policy. */
function decodingRows(r: Report, { sec, row }: Rows): void {
  sec("decoding");
  row(
    "  requests",
    `${int(r.requests.completed)}/${int(r.requests.total)} done, ${int(r.requests.multimodal)} multimodal`,
  );
  row("  tokens generated", `${int(r.tokens.generated)} (prompts ${int(r.tokens.prompt)})`);
  row(
    "  rounds",
    `${int(r.rounds.total)} (${int(r.rounds.withDrafts)} with drafts, ${int(r.rounds.targetOnly)} target-only)`,
  );
  row(
    "  drafts received / verified",
    `${int(r.speculation.draftsReceived)} / ${int(r.speculation.draftsVerified)} (budget ${num(r.speculation.meanBudget, 1)}/round)`,
  );
  row(
    "  drafts accepted",
    `${int(r.speculation.draftsAccepted)} (${num(r.speculation.acceptanceRate * 100, 1)}% of verified)`,
  );
  row(
    "  mean accepted length",
    `${num(r.speculation.meanAcceptedLength)} tokens per verification with drafts`,
  );
  row("  tokens per target forward", `${num(r.speculation.tokensPerTargetForward)} (target-only: 1.00)`);
  const dp = r.depthPolicy;
  if (dp) {
    row(
      "  depth policy",
      `${dp.policy}: ${num(dp.goodputSimulated, 0)} tokens per simulated second (H100 / 8B cost model), ${num(dp.verifiedPerRound, 1)} drafts verified/round`,
    );
    row("  chosen depths 0..N", dp.depthHistogram.map(int).join(" / "));
    row(
      "  ECE raw -> calibrated",
      `${num(dp.ece.rawOverall, 3)} -> ${num(dp.ece.calibratedOverall, 3)} (per position: ${dp.ece.raw.map((v, j) => `${num(v, 2)}->${num(dp.ece.calibrated[j] ?? 0, 2)}`).join(" ")})`,
    );
  }
}

/** Latencies, where the round time went, throughput. */
function timeRows(r: Report, { sec, row }: Rows): void {
  sec("time");
  if (r.topology.kind === "netns") {
    const relayed = r.topology.relay?.reduce((a, f) => a + f.bytesUp + f.bytesDown, 0);
    row(
      "  topology",
      `netns, link ${r.topology.link}${relayed === undefined ? " (routed, no relay)" : ` (relay forwarded ${bytes(relayed)})`}`,
    );
  }
  row(
    "  STEP RTT p50 / p99",
    `${num(r.latency.stepRtt.p50, 3)} / ${num(r.latency.stepRtt.p99, 3)} ms (${int(r.latency.stepRtt.count)} STEPs)`,
  );
  row("  round p50 / p99", `${num(r.latency.round.p50, 3)} / ${num(r.latency.round.p99, 3)} ms`);
  const tot = r.roundTime.totalMs || 1;
  const pct = (v: number) => `${num(v, 0)} ms (${num((100 * v) / tot, 0)}%)`;
  row("  round time: draft link", pct(r.roundTime.draftLinkMs));
  row("  round time: verify", pct(r.roundTime.verifyMs));
  row("  round time: prefill", pct(r.roundTime.prefillMs));
  row("  round time: scheduling", pct(r.roundTime.schedulingMs));
  row(
    "  throughput",
    `${num(r.throughput.tokensPerSecond, 0)} tokens/s, ${num(r.throughput.requestsPerSecond, 1)} requests/s over ${num(r.throughput.wallSeconds, 1)} s`,
  );
}

/** The encoder cache transfers (EC-CONTRACT 3 statuses). */
function ecRows(r: Report, { sec, row }: Rows): void {
  sec("encoder cache");
  row(
    "  media lookups",
    `${int(r.ec.lookups)} for ${int(r.ec.requestsWaited)} requests (mean wait ${num(r.ec.meanWaitMs, 1)} ms)`,
  );
  row("  transfers", `${int(r.ec.transfers)} (${bytes(r.ec.bytes)})`);
  row("  cache hits / joined in flight", `${int(r.ec.cacheHits)} / ${int(r.ec.joined)}`);
  row("  retries / local fallbacks", `${int(r.ec.retries)} / ${int(r.ec.fallbacks)}`);
  row("  EC statuses", counts(r.ec.statusCounts));
}

/** Placement over the encoders (EC-CONTRACT 10.4), when there were two or more. */
function placementRows(r: Report, { sec, row }: Rows): void {
  const p = r.placement;
  if (p === undefined) return;
  sec("");
  sec(`placement (${p.encoders} encoders, residency events)`);
  if (p.discovery === "etcd")
    row("  encoders found through", `etcd (${int(p.etcdRecords)} records at the end)`);
  row(
    "  placed on a trusted holder",
    `${int(p.placed)} (NACK_MISSING avoided vs round robin: ${int(p.nackMissingAvoided)})`,
  );
  row(
    "  not resident / encodes asked",
    `${int(p.notResident)} / ${int(p.encodesAsked)} (timed out: ${int(p.timedOut)})`,
  );
  row(
    "  sent without a trusted holder",
    `${int(p.sentWithoutHolder)} (NACK_MISSING received: ${int(p.nackMissingReceived)})`,
  );
  row(
    "  gaps / snapshots",
    `${int(p.gaps)} / ${int(p.snapshots)}; trust again after ${num(p.trustAfterGapMs.mean, 1)} ms mean, ${num(p.trustAfterGapMs.max, 1)} ms max (${int(p.trustAfterGapMs.count)})`,
  );
  if (p.droppedEvents > 0) row("  events dropped by the lossy relay", int(p.droppedEvents));
  if (p.late !== null) {
    row(
      "  late subscriber",
      `${int(p.late.snapshots)} snapshots, ${int(p.late.differences)} differences over ${int(p.late.trusted)} trusted views`,
    );
  }
}

/** The drafter link, and the faults injected. */
function linkRows(r: Report, { sec, row }: Rows): void {
  sec("drafter link");
  row("  client outcomes", counts(r.client.outcomes));
  row(
    "  hellos / reconnects / resyncs",
    `${int(r.client.hellos)} / ${int(r.client.reconnects)} / ${int(r.client.resyncs)}`,
  );
  row("  new sessions / connect failures", `${int(r.client.newSessions)} / ${int(r.client.connectFailures)}`);
  if (r.client.disabledReason) row("  DISABLED", r.client.disabledReason);
  if (r.faults.enabled) {
    sec("");
    sec("faults injected");
    if (r.faults.injected.length === 0) row("  (none)", "");
    for (const f of r.faults.injected) {
      const rec =
        f.recoveredAfterMs === null ? "NOT recovered" : `recovered in ${num(f.recoveredAfterMs, 0)} ms`;
      row(`  ${f.kind} @${num(f.atMs / 1000, 1)}s`, `${f.detail}; ${rec}: ${counts(f.recovery)}`);
    }
  }
}

/** The child processes and their unexpected exits. */
function processRows(r: Report, { sec, row }: Rows): void {
  sec("processes");
  const pids = (p: { pids: number[] }) => p.pids.join(" -> ");
  row("  worker pids", pids(r.processes.worker));
  if (r.processes.encoder) row("  encoder pids", pids(r.processes.encoder));
  for (const d of r.processes.unexpectedExits) {
    row(
      `  DIED: ${d.name} pid ${d.pid}`,
      `${d.signal !== null ? `signal ${d.signal}` : `exit code ${d.code}`} at ${num(d.atMs / 1000, 1)} s into decoding, not by --faults`,
    );
  }
}

/** The leak check at the end of the run (EC-CONTRACT 8). */
function endStateRows(r: Report, { sec, row }: Rows): void {
  sec("end state");
  const v = (n: number | null) => (n === null ? "unknown" : String(n));
  const leakWord = {
    none: "none",
    leaked: "LEAKED",
    unknown: "UNKNOWN",
    not_applicable: "n/a (no encoder cache)",
  }[r.leaks.status];
  row(
    "  leaks",
    r.leaks.status === "not_applicable"
      ? leakWord
      : `${leakWord}: consumer pinned ${v(r.leaks.consumerPinnedBlocks)}, in flight ${v(r.leaks.consumerInFlightBlocks)}, retired ${v(r.leaks.consumerRetiredBlocks)}; producer pinned ${v(r.leaks.producerPinnedBlocks)}, grants ${v(r.leaks.producerGrants)}`,
  );
  for (const n of r.leaks.notes) row("  note", n);
}

/** Renders the report as the summary table printed on stdout. */
export function formatReport(r: Report): string {
  const rows: Array<[string, string] | string> = [];
  const sec = (t: string) => rows.push(t);
  const row = (k: string, v: string) => rows.push([k, v]);
  const c = r.config;
  sec(
    `tapwire harness: ${c["requests"]} requests, S=${c["slots"]} N=${c["numSpec"]} W=${c["window"]}, rows ${c["numTaps"]}x${c["hidden"]} bf16, ` +
      `${c["sample"] ? "sampled" : "greedy"}, link ${c["draftTransport"]}, ec data ${c["ecData"]}${c["faults"] ? ", faults" : ""}`,
  );
  sec("");
  const table: Rows = { sec, row };
  losslessRows(r, table);
  sec("");
  decodingRows(r, table);
  sec("");
  timeRows(r, table);
  sec("");
  ecRows(r, table);
  placementRows(r, table);
  sec("");
  linkRows(r, table);
  sec("");
  processRows(r, table);
  sec("");
  endStateRows(r, table);
  if (r.notes.length > 0) {
    sec("");
    sec("notes");
    for (const n of r.notes) sec(`  ${n}`);
  }
  sec("");
  sec(`result: ${r.ok ? "OK (lossless)" : "FAILED"}`);

  const width = Math.max(...rows.map((x) => (typeof x === "string" ? 0 : x[0].length))) + 2;
  return `${rows.map((x) => (typeof x === "string" ? x : `${x[0].padEnd(width)}${x[1]}`)).join("\n")}\n`;
}
