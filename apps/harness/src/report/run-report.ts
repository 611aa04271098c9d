/**
 * Assembling the run's {@link Report} from what the run measured: the engine's and the EC media's
 * metrics, the client's counters, the lossless check, the leak check and the child processes.
 */
import type { StatsSnapshot } from "@tapwire/stats";
import type { HarnessConfig } from "../cli/cli.js";
import type { DepthRunStats } from "../depth/depth-sim.js";
import type { EcMediaMetrics } from "../ec/media.js";
import type { EngineMetrics, EngineResult } from "../engine/engine.js";
import type { RequestSpec } from "../engine/workload.js";
import type { FaultDriver } from "../faults/faults.js";
import type { ChildExit, ChildService } from "../procs/procs.js";
import type { TopologyReport } from "../procs/topology.js";
import { type EndState, ecStatusCounts } from "./leak-check.js";
import type { ChildDeath, LatencySummary, LosslessResult, Report } from "./report.js";

function latency(h: {
  count: number;
  percentile(p: number): number;
  mean: number;
  max: number;
}): LatencySummary {
  // recorded in seconds, reported in ms
  return {
    count: h.count,
    p50: h.percentile(50) * 1000,
    p99: h.percentile(99) * 1000,
    mean: h.mean * 1000,
    max: h.max * 1000,
  };
}

function toDeath(e: ChildExit, decodeStartEpoch: number): ChildDeath {
  return { name: e.name, pid: e.pid, atMs: e.atEpochMs - decodeStartEpoch, code: e.code, signal: e.signal };
}

/** Everything {@link buildReport} reads. */
export interface ReportInputs {
  cfg: HarnessConfig;
  requests: RequestSpec[];
  res: EngineResult;
  metrics: EngineMetrics;
  /** Target-only outputs by request id. */
  reference: Map<number, number[]>;
  refSeconds: number;
  lossless: LosslessResult;
  depthStats: DepthRunStats;
  ecMetrics: EcMediaMetrics;
  /** The consumer connector's counters. */
  ecCounters: Record<string, number>;
  /** The client registry's snapshot. */
  clientStats: StatsSnapshot;
  disabledReason: string | null;
  workerStats: Record<string, unknown>;
  faults: FaultDriver | null;
  notes: string[];
  worker: ChildService;
  encoder: ChildService | null;
  deaths: ChildExit[];
  decodeStartEpoch: number;
  leaks: EndState;
  /** Where the processes ran (`--topology`) and what the relay forwarded. */
  topology: TopologyReport;
}

function speculation(m: EngineMetrics, generated: number): Report["speculation"] {
  return {
    targetForwards: m.targetForwards.value,
    draftsReceived: m.draftsReceived.value,
    draftsVerified: m.draftsVerified.value,
    draftsAccepted: m.draftsAccepted.value,
    acceptanceRate: m.draftsVerified.value > 0 ? m.draftsAccepted.value / m.draftsVerified.value : 0,
    meanAcceptedLength:
      m.verificationsWithDrafts.value > 0 ? m.acceptedLengthSum.value / m.verificationsWithDrafts.value : 0,
    tokensPerTargetForward: m.targetForwards.value > 0 ? generated / m.targetForwards.value : 0,
    meanBudget: m.roundsWithDrafts.value > 0 ? m.budgetSum.value / m.roundsWithDrafts.value : 0,
    draftsSkippedByPolicy: m.draftsSkipped.value,
  };
}

function ecSection(x: ReportInputs): Report["ec"] {
  const { ecMetrics, ecCounters } = x;
  return {
    requestsWaited: ecMetrics.requests.value,
    lookups: ecMetrics.lookups.value,
    joined: ecMetrics.joined.value,
    transfers: ecMetrics.transfers.value,
    bytes: ecMetrics.bytes.value,
    cacheHits: ecMetrics.cacheHits.value,
    fallbacks: ecMetrics.fallbacks.value,
    retries: ecCounters["connector_retries"] ?? 0,
    meanWaitMs: ecMetrics.wait.mean * 1000,
    statusCounts: ecStatusCounts(ecCounters),
    consumer: ecCounters,
    producer: x.leaks.producerCounters,
  };
}

function clientSection(x: ReportInputs): Report["client"] {
  const cs = x.clientStats;
  return {
    outcomes: x.metrics.outcomeCounts(),
    hellos: cs.counters["hellos"] ?? 0,
    reconnects: Math.max(0, (cs.counters["hellos"] ?? 0) - 1),
    resyncs: x.metrics.resyncs.value,
    newSessions: cs.counters["new_sessions"] ?? 0,
    connectFailures: cs.counters["connect_failures"] ?? 0,
    disabledReason: x.disabledReason ?? "",
    other: cs.counters,
  };
}

function leaksSection(leaks: EndState): Report["leaks"] {
  return {
    ok: leaks.ok,
    status: leaks.status,
    consumerPinnedBlocks: leaks.consumerPinnedBlocks,
    consumerInFlightBlocks: leaks.consumerInFlightBlocks,
    consumerRetiredBlocks: leaks.consumerRetiredBlocks,
    producerPinnedBlocks: leaks.producerPinnedBlocks,
    producerGrants: leaks.producerGrants,
    notes: leaks.notes,
  };
}

/** The run's report, `ok` set: lossless, no leak, every request completed, no child died. */
export function buildReport(x: ReportInputs): Report {
  const { cfg, requests, res, metrics: m, faults, worker, encoder } = x;
  const generated = m.tokensGenerated.value;
  const wallSeconds = res.wallMs / 1000;
  const report: Report = {
    tool: "tapwire-harness",
    ok: false,
    config: { ...cfg, loadCurve: cfg.loadCurve.map((p) => `${p.batch}:${p.tokens}`).join(",") },
    lossless: x.lossless,
    requests: {
      total: requests.length,
      completed: m.requestsCompleted.value,
      multimodal: requests.filter((r) => r.media.length > 0).length,
      mediaItems: requests.reduce((a, r) => a + r.media.length, 0),
    },
    tokens: {
      generated,
      prompt: m.promptTokens.value,
      targetOnlyGenerated: [...x.reference.values()].reduce((a, o) => a + o.length, 0),
    },
    rounds: {
      total: m.rounds.value,
      withDrafts: m.roundsWithDrafts.value,
      targetOnly: m.roundsTargetOnly.value,
    },
    speculation: speculation(m, generated),
    depthPolicy: x.depthStats.report(generated),
    latency: { stepRtt: latency(m.stepRtt), round: latency(m.roundTime) },
    roundTime: {
      draftLinkMs: res.linkMs,
      verifyMs: res.verifyMs,
      prefillMs: res.prefillMs,
      schedulingMs: res.schedulingMs,
      totalMs: res.linkMs + res.verifyMs + res.prefillMs + res.schedulingMs,
    },
    throughput: {
      wallSeconds,
      tokensPerSecond: wallSeconds > 0 ? generated / wallSeconds : 0,
      requestsPerSecond: wallSeconds > 0 ? requests.length / wallSeconds : 0,
      targetOnlySeconds: x.refSeconds,
    },
    ec: ecSection(x),
    client: clientSection(x),
    worker: x.workerStats,
    faults: { enabled: cfg.faults, injected: faults ? [...faults.injected] : [] },
    notes: x.notes,
    processes: {
      worker: { pids: [...worker.pids], starts: worker.starts },
      encoder: encoder ? { pids: [...encoder.pids], starts: encoder.starts } : null,
      unexpectedExits: x.deaths.map((d) => toDeath(d, x.decodeStartEpoch)),
    },
    leaks: leaksSection(x.leaks),
    topology: x.topology,
  };
  if (faults) {
    for (const k of faults.notInjected) report.notes.push(`fault ${k} not injected: the run ended first`);
    for (const e of faults.errors) report.notes.push(`fault action failed: ${e}`);
    for (const k of faults.skipped) report.notes.push(k);
  }
  for (const d of report.processes.unexpectedExits) {
    report.notes.push(
      `${d.name} pid ${d.pid} died ${(d.atMs / 1000).toFixed(1)} s into decoding (${d.signal !== null ? `signal ${d.signal}` : `exit code ${d.code}`}), not by --faults`,
    );
  }
  report.ok =
    x.lossless.ok &&
    report.leaks.ok &&
    report.requests.completed === report.requests.total &&
    x.deaths.length === 0;
  return report;
}
