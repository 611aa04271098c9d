/**
 * A multi-instance run (issue 21, CONTRACT 12.2): `--engines E --workers K --discovery
 * static|etcd`. K shared `tapwire-worker` processes (`--max-sessions E`, `--register` with etcd),
 * an etcd child when asked, and E engines in this process, each with its own `WorkerPool` (its own
 * session at every worker) behind `RoundCore`. With `--faults`: a worker killed with SIGKILL and
 * restarted (a new incarnation on the same endpoint), a new worker started mid-run (etcd: found
 * through discovery), a worker stopped cleanly, and etcd stopped for `--etcd-down-ms`. Every engine
 * is checked lossless against target-only decoding; the report has a section per process.
 * Media are local in this mode (no encoder processes: docs/harness.md says what is missing).
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type PoolMemberStats, RoundCore, type RoundResult, WorkerPool } from "@tapwire/client";
import { type EtcdMemberSource, etcdMembers } from "@tapwire/discovery";
import { EC_METRICS_PREFIX } from "@tapwire/ec-connector";
import { DEFAULT_DRAFT_CONFIG, DraftHead, TargetModel } from "@tapwire/reference-model";
import { Registry } from "@tapwire/stats";
import { type EtcdChild, startEtcd } from "@tapwire/testing";
import { budgetFromCurve, type HarnessConfig } from "../cli/cli.js";
import { type EcSide, startEc } from "../ec/ec-side.js";
import { EcMediaMetrics, LocalMedia, localEmbedding } from "../ec/media.js";
import { clientOptionsOf } from "../engine/client-options.js";
import { Engine, EngineMetrics } from "../engine/engine.js";
import { RoundCoreLink } from "../engine/link.js";
import { checkGreedy, checkSampled } from "../engine/lossless.js";
import { decodeTargetOnly, mediaConditioning } from "../engine/sequence.js";
import { SampleScratch } from "../engine/verify.js";
import { makeWorkload } from "../engine/workload.js";
import { HarnessError, HarnessErrorCode } from "../errors.js";
import { type RunScope, workerArgsFor } from "../procs/children.js";
import { binPath, ChildService } from "../procs/procs.js";
import { LocalTopology } from "../procs/topology.js";
import type { LosslessResult } from "../report/report.js";
import { type MultiReport, percentile } from "./multi-report.js";

/** True when `cfg` asks for a multi-instance run. */
export function isMulti(cfg: HarnessConfig): boolean {
  return cfg.discovery !== "none";
}

/**
 * Lease TTL of the workers' records in a harness run, seconds: the default. An etcd outage longer
 * than 2 TTLs makes the workers' etcd clients give their leases up (records may then expire and
 * pools drain the members), so `--etcd-down-ms` stays below it.
 */
export const MULTI_TTL_S = 10;
const PREFIX = "/tapwire/v1/";

interface WorkerProc {
  id: string;
  svc: ChildService;
  endpoint: string;
  /** Registration time of each incarnation (ms since the epoch) for the discovery latency. */
  registeredAt: number;
  /** What happened to it. */
  events: string[];
  /** Member STEPs failed after its clean stop began (must stay 0). */
  failedAfterCleanStop: number | null;
}

interface EngineRun {
  id: number;
  pool: WorkerPool;
  source: EtcdMemberSource | null;
  core: RoundCore;
  engine: Engine;
  metrics: EngineMetrics;
  rounds: number;
  roundsWithoutDrafts: Record<string, number>;
  entriesWithoutDrafts: Record<string, number>;
  maxRoundMs: number;
  /** The last stats of every member this pool ever had (a drained member leaves members()). */
  memberStats: Map<string, PoolMemberStats>;
  /** Most slots each member held at once. */
  peakSlots: Map<string, number>;
}

/** Runs a multi-instance harness. Never leaves child processes behind. */
export async function runMulti(
  cfg0: HarnessConfig,
  log: (m: string) => void,
): Promise<{ report: MultiReport; exitCode: number }> {
  // one encoder per engine (its own consumer connector), or none (local media only)
  const encoders = cfg0.encoders < 0 ? cfg0.engines : cfg0.encoders;
  const cfg: HarnessConfig = { ...cfg0, encoders, ecData: "tcp", ...(encoders === 0 ? { mmShare: 0 } : {}) };
  const dir = mkdtempSync(join(tmpdir(), "tapwire-harness-multi-"));
  const cleanups: Array<() => Promise<void> | void> = [() => rmSync(dir, { recursive: true, force: true })];
  const t0 = Date.now();
  try {
    return await run(cfg, dir, cleanups, log, t0);
  } finally {
    for (const c of cleanups.reverse()) {
      try {
        await c();
      } catch (e) {
        log(`cleanup: ${e instanceof Error ? e.message : String(e)}`);
      }
    }
  }
}

function models(cfg: HarnessConfig, dir: string) {
  const target = TargetModel.create({
    vocabSize: cfg.vocab,
    stateDim: cfg.stateDim,
    numTaps: cfg.numTaps,
    hidden: cfg.hidden,
    seed: cfg.seed,
  });
  const maxRank = cfg.stateDim - 2;
  const head = DraftHead.distill(target, {
    ...DEFAULT_DRAFT_CONFIG,
    window: cfg.window,
    numSpec: cfg.numSpec,
    rank: Math.min(cfg.draftRank > 0 ? cfg.draftRank : DEFAULT_DRAFT_CONFIG.rank, maxRank),
    markovRank: Math.min(DEFAULT_DRAFT_CONFIG.markovRank, maxRank),
    noise: cfg.draftNoise >= 0 ? cfg.draftNoise : DEFAULT_DRAFT_CONFIG.noise,
  });
  const weights = join(dir, "draft-head.safetensors");
  head.save(weights);
  return { target, head, weights };
}

async function startWorkerProc(
  cfg: HarnessConfig,
  weights: string,
  id: string,
  etcd: EtcdChild | null,
  verbose: boolean,
): Promise<WorkerProc> {
  const args = [
    ...workerArgsFor(cfg, weights),
    "--max-sessions",
    String(cfg.engines),
    ...(etcd !== null
      ? [
          "--register",
          etcd.endpoint,
          "--register-prefix",
          PREFIX,
          "--register-ttl",
          String(MULTI_TTL_S),
          "--register-drain-ms",
          "500",
        ]
      : []),
  ];
  const svc = new ChildService({
    name: `worker-${id}`,
    script: binPath("@tapwire/worker", "tapwire-worker"),
    args: [...args, "--listen", "tcp://127.0.0.1:0"],
    ...(verbose ? { log: (l: string) => process.stderr.write(`${l}\n`) } : {}),
  });
  const line = await svc.start();
  const endpoint = (line["endpoints"] as string[] | undefined)?.[0];
  if (endpoint === undefined)
    throw new HarnessError(HarnessErrorCode.PROCESS, `worker-${id}: no endpoint in its listening line`);
  // a restart comes back on the same endpoint (a static list stays right)
  svc.setArgs([...args, "--listen", endpoint]);
  return {
    id,
    svc,
    endpoint,
    registeredAt: Date.now(),
    events: [`started pid ${svc.pid}`],
    failedAfterCleanStop: null,
  };
}

function count(rec: Record<string, number>, k: string): void {
  rec[k] = (rec[k] ?? 0) + 1;
}

async function run(
  cfg: HarnessConfig,
  dir: string,
  cleanups: Array<() => Promise<void> | void>,
  log: (m: string) => void,
  t0: number,
): Promise<{ report: MultiReport; exitCode: number }> {
  const { target, head, weights } = models(cfg, dir);
  let etcd: EtcdChild | null = null;
  if (cfg.discovery === "etcd") {
    const e = await startEtcd();
    etcd = e;
    cleanups.push(() => e.close());
    log(`etcd at ${e.clientUrl} (pid ${e.pid})`);
  }
  const workers: WorkerProc[] = [];
  cleanups.push(async () => {
    await Promise.all(workers.map((w) => w.svc.kill("SIGTERM")));
  });
  for (let i = 0; i < cfg.workers; i++)
    workers.push(await startWorkerProc(cfg, weights, String(i), etcd, cfg.verbose));
  log(`${workers.length} workers: ${workers.map((w) => w.endpoint).join(", ")}`);

  // encoders: one per engine through the harness's own EC side (EC-CONTRACT), in its run scope
  const deaths: string[] = [];
  const scope: RunScope = {
    cfg,
    dir,
    cleanups,
    note: log,
    watch: (svc) => {
      svc.onUnexpectedExit = (e) => {
        deaths.push(`${e.name} pid ${e.pid} (code ${e.code}, signal ${e.signal})`);
      };
    },
    childLog: cfg.verbose ? (l: string) => process.stderr.write(`${l}\n`) : undefined,
    setPhase: () => {},
    metricsAt: null,
    urls: { worker: null, encoder: null },
    topology: new LocalTopology(),
  };
  const ecs: { ec: EcSide; metrics: EcMediaMetrics; events: string[] }[] = [];
  for (let e = 0; e < cfg.encoders; e++) {
    const metrics = new EcMediaMetrics(new Registry({ prefix: `tapwire_harness_ec${e}_` }));
    const ec = await startEc(scope, {}, new Registry({ prefix: EC_METRICS_PREFIX }), metrics);
    ecs.push({ ec, metrics, events: [`started pid ${ec.encoder.pid}`] });
  }
  const { requests } = makeWorkload(cfg);
  // --faults: traffic is let in in stages so that every fault meets live requests
  let share = cfg.faults ? 0.4 : 1;
  const engines: EngineRun[] = [];
  for (let e = 0; e < cfg.engines; e++) {
    const source =
      etcd !== null
        ? etcdMembers({ etcd: etcd.endpoint, prefix: PREFIX, backoffMs: 100, backoffMaxMs: 1000 })
        : null;
    const pool = new WorkerPool({
      members: source ?? workers.map((w) => w.endpoint),
      ...clientOptionsOf(cfg, head),
      clientName: `tapwire-harness-e${e}`,
    });
    cleanups.push(() => pool.close());
    if (source !== null) cleanups.push(() => source.close());
    const core = new RoundCore({ client: pool });
    const metrics = new EngineMetrics(new Registry({ prefix: `tapwire_harness_e${e}_` }));
    const er: EngineRun = {
      id: e,
      pool,
      source,
      core,
      engine: null as unknown as Engine,
      metrics,
      rounds: 0,
      roundsWithoutDrafts: {},
      entriesWithoutDrafts: {},
      maxRoundMs: 0,
      memberStats: new Map(),
      peakSlots: new Map(),
    };
    // the per-round accounting of the report: why an entry or a whole round had no drafts
    const round = core.round.bind(core);
    core.round = async (input) => {
      const ts = performance.now();
      const res: RoundResult = await round(input);
      er.maxRoundMs = Math.max(er.maxRoundMs, performance.now() - ts);
      er.rounds++;
      let any = false;
      let wanted = false;
      for (const d of res.drafts) {
        if (d.reason !== "not_requested") wanted = true;
        if (d.k > 0) any = true;
        else if (d.reason !== "not_requested") count(er.entriesWithoutDrafts, d.reason);
      }
      if (!any && wanted) count(er.roundsWithoutDrafts, res.outcome);
      for (const m of pool.members()) {
        er.memberStats.set(m.endpoint, m);
        er.peakSlots.set(m.endpoint, Math.max(er.peakSlots.get(m.endpoint) ?? 0, m.assigned));
      }
      return res;
    };
    er.engine = new Engine({
      cfg,
      target,
      requests,
      link: new RoundCoreLink(core),
      media: ecs[e]?.ec.media ?? new LocalMedia(cfg.embeddingBytes),
      budgetFor: (b) => (cfg.budget !== null ? cfg.budget : budgetFromCurve(cfg.loadCurve, b)),
      metrics,
      arrivalCap: ({ total }) => Math.ceil(total * share),
    });
    engines.push(er);
  }
  for (const er of engines) {
    if (!(await er.pool.waitReady(20_000, cfg.workers))) {
      throw new HarnessError(
        HarnessErrorCode.PROCESS,
        `engine ${er.id}: the pool did not reach ${cfg.workers} ready members`,
      );
    }
  }
  log(`${engines.length} engines, each with a pool of ${cfg.workers} (discovery ${cfg.discovery})`);

  const faultLog: { atMs: number; what: string }[] = [];
  let discoveredMs: number | null = null;
  let etcdDown: {
    ms: number;
    membersBefore: number[];
    membersDuring: number[];
    membersAfter: number[];
  } | null = null;
  const fault = (what: string) => {
    faultLog.push({ atMs: Date.now() - t0, what });
    log(`fault: ${what}`);
  };
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
  // members each pool holds (not draining): a member is lost when its pool drops it, not when one
  // STEP of a loaded machine times out and its connection is re-made
  const membersNow = () => engines.map((er) => er.pool.members().filter((m) => !m.draining).length);
  const schedule = async (): Promise<void> => {
    if (!cfg.faults) return;
    await sleep(300);
    // 1. SIGKILL of a worker mid-run, then back with a new incarnation on the same endpoint
    // the worker holding the most slots now, so that the kill meets live slots
    const held = (w: WorkerProc) =>
      engines.reduce(
        (n, er) => n + (er.pool.members().find((m) => m.endpoint === w.endpoint)?.assigned ?? 0),
        0,
      );
    const victim = [...workers].sort((a, b) => held(b) - held(a))[0]!;
    await victim.svc.kill("SIGKILL", 0);
    victim.events.push("killed with SIGKILL");
    fault(`SIGKILL worker-${victim.id} (${victim.endpoint})`);
    await sleep(Math.max(4 * cfg.stepTimeoutMs, 1000));
    await victim.svc.start();
    share = 0.6;
    victim.events.push(`restarted pid ${victim.svc.pid} (new incarnation)`);
    fault(`worker-${victim.id} restarted with a new incarnation`);
    // an encoder killed with SIGKILL while transfers run; restarted on the same control endpoint
    const enc = ecs[0];
    if (enc !== undefined) {
      await enc.ec.encoder.kill("SIGKILL", 0);
      enc.events.push("killed with SIGKILL");
      fault("SIGKILL encoder-0");
      await sleep(1000);
      await enc.ec.encoder.start();
      enc.events.push(`restarted pid ${enc.ec.encoder.pid}`);
      fault("encoder-0 restarted");
    }
    // 2. a worker started mid-run: with etcd it is found through discovery and given slots
    if (etcd !== null) {
      const fresh = await startWorkerProc(cfg, weights, String(workers.length), etcd, cfg.verbose);
      workers.push(fresh);
      fault(`worker-${fresh.id} started mid-run at ${fresh.endpoint}`);
      const ts = Date.now();
      while (
        !engines.every((er) =>
          er.pool.members().some((m) => m.endpoint === fresh.endpoint && m.state === "READY"),
        )
      ) {
        if (Date.now() - ts > MULTI_TTL_S * 1000 * 5) break;
        await sleep(10);
      }
      discoveredMs = Date.now() - ts;
      // 3. a clean stop (SIGTERM: revoke, drain, close): it leaves every pool without a failed STEP
      const leaving = workers.find((w) => w !== victim && w !== fresh)!;
      const failed = () =>
        engines.reduce((s, er) => s + (er.memberStats.get(leaving.endpoint)?.stepsFailed ?? 0), 0);
      const before = failed();
      fault(`worker-${leaving.id} stopped cleanly (SIGTERM)`);
      await leaving.svc.kill("SIGTERM", 5000);
      leaving.events.push("stopped cleanly (SIGTERM)");
      leaving.failedAfterCleanStop = failed() - before;
      // 4. etcd stopped for a while: no member lost, no round waits on it
      const membersBefore = membersNow();
      fault(`etcd stopped for ${cfg.etcdDownMs} ms`);
      await etcd.stop();
      share = 1; // the rest of the traffic decodes while etcd is away
      const during: number[] = [];
      const te = Date.now();
      while (Date.now() - te < cfg.etcdDownMs) {
        during.push(Math.min(...membersNow()));
        await sleep(100);
      }
      await etcd.start();
      fault("etcd restarted");
      await sleep(500);
      etcdDown = {
        ms: cfg.etcdDownMs,
        membersBefore,
        membersDuring: [Math.min(...during)],
        membersAfter: membersNow(),
      };
    }
  };
  const tDecode = Date.now();
  const faultsRun = schedule().finally(() => {
    share = 1;
  });
  const results = await Promise.all(engines.map((er) => er.engine.run()));
  await faultsRun;
  const wallMs = Date.now() - tDecode;
  for (const x of ecs) await x.ec.media.drain(10_000);

  // target-only decoding of the same requests, once; every engine is checked against it
  const scratch = new SampleScratch(cfg.vocab);
  const reference = new Map<number, number[]>();
  for (const r of requests) {
    const extra = mediaConditioning(r.media.map((h) => localEmbedding(h, cfg.embeddingBytes)));
    reference.set(r.id, decodeTargetOnly(target, r, extra, cfg, scratch));
  }
  const lossless: LosslessResult[] = results.map((res) =>
    cfg.sample
      ? checkSampled(requests, res.outputs, reference)
      : checkGreedy(requests, res.outputs, reference),
  );

  // per process: every pool's view of every worker, summed
  const perWorker = workers.map((w) => {
    let steps = 0;
    let stepsFailed = 0;
    let peak = 0;
    let failoversOut = 0;
    let movedReleases = 0;
    for (const er of engines) {
      const m = er.memberStats.get(w.endpoint);
      if (m === undefined) continue;
      steps += m.steps;
      stepsFailed += m.stepsFailed;
      peak += er.peakSlots.get(w.endpoint) ?? 0;
      failoversOut += m.failoversOut;
      movedReleases += m.movedReleases;
    }
    return {
      id: `worker-${w.id}`,
      endpoint: w.endpoint,
      pids: [...w.svc.pids],
      peakSlots: peak,
      steps,
      stepsFailed,
      failoversOut,
      movedReleases,
      events: w.events,
      failedStepsAfterCleanStop: w.failedAfterCleanStop,
    };
  });
  const gaps = engines.flatMap((er) => er.pool.failoverRounds());
  const report: MultiReport = {
    mode: "multi",
    discovery: cfg.discovery,
    engines: engines.map((er, i) => ({
      id: `engine-${er.id}`,
      session: er.pool.sessionId,
      requests: requests.length,
      tokens: er.metrics.tokensGenerated.value,
      rounds: er.rounds,
      roundsWithoutDrafts: er.roundsWithoutDrafts,
      entriesWithoutDrafts: er.entriesWithoutDrafts,
      maxRoundMs: Math.round(er.maxRoundMs * 10) / 10,
      lossless: lossless[i]!,
    })),
    workers: perWorker,
    encoders: ecs.map((x, i) => ({
      id: `encoder-${i}`,
      endpoint: x.ec.encoder.args[x.ec.encoder.args.indexOf("--control") + 1] ?? "",
      pids: [...x.ec.encoder.pids],
      transfers: x.metrics.transfers.value,
      fallbacks: x.metrics.fallbacks.value,
      events: x.events,
    })),
    unexpectedExits: deaths,
    etcd: etcd !== null ? { clientUrl: etcd.clientUrl, down: etcdDown } : null,
    failover_rounds: {
      n: gaps.length,
      p50: percentile(gaps, 50),
      max: gaps.length > 0 ? Math.max(...gaps) : null,
    },
    discovered_ms: discoveredMs,
    ttl_s: etcd !== null ? MULTI_TTL_S : null,
    step_timeout_ms: cfg.stepTimeoutMs,
    faults: faultLog,
    wall_ms: wallMs,
    ok: lossless.every((l) => l.ok) && deaths.length === 0,
  };
  return { report, exitCode: report.ok ? 0 : 1 };
}
