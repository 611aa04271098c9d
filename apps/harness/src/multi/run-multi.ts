/**
 * A multi-instance run (issue 21, CONTRACT 12.2): `--engines E --workers K --encoders M
 * --discovery static|etcd`. K shared `tapwire-worker` processes (`--max-sessions E`, `--register`
 * with etcd), M shared `tapwire-ec-producer` encoders (residency events, `--register` with etcd;
 * EC-CONTRACT 10), an etcd child when asked (in a keeper that dies with the harness), and E
 * engine processes (`engine-main.ts`), each with its own `WorkerPool` (its own session at every
 * worker) behind `RoundCore` and its own consumer connector placing transfers over the shared
 * encoders (10.4). Every child is started with `--exit-with-parent`: a killed harness leaves none.
 * With `--faults`: a worker killed with SIGKILL and restarted (a new incarnation on the same
 * endpoint), an encoder killed with SIGKILL and restarted, a new worker started mid-run (etcd:
 * found through discovery), a worker stopped cleanly, and etcd stopped for `--etcd-down-ms`. The
 * engines report their outputs in JSON lines; each is checked lossless here against target-only
 * decoding, and the report has a section per process.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DEFAULT_DRAFT_CONFIG, DraftHead } from "@tapwire/reference-model";
import type { HarnessConfig } from "../cli/cli.js";
import { localEmbedding } from "../ec/media.js";
import { checkGreedy, checkSampled } from "../engine/lossless.js";
import { decodeTargetOnly, mediaConditioning } from "../engine/sequence.js";
import { SampleScratch } from "../engine/verify.js";
import { makeWorkload } from "../engine/workload.js";
import { HarnessError, HarnessErrorCode } from "../errors.js";
import { type RunScope, workerArgsFor } from "../procs/children.js";
import { EtcdProc } from "../procs/etcd-proc.js";
import { binPath, ChildService } from "../procs/procs.js";
import { LocalTopology } from "../procs/topology.js";
import type { LosslessResult } from "../report/report.js";
import { binHasFlag } from "../report/worker-metrics.js";
import {
  type EngineListening,
  type EngineResultLine,
  type EngineSpec,
  type EngineStats,
  engineScript,
  targetOf,
} from "./engine-proc.js";
import { type EtcdDownReport, type MultiReport, percentile } from "./multi-report.js";
import { type SharedEncoder, startSharedEncoders } from "./shared-encoders.js";

/** True when `cfg` asks for a multi-instance run. */
export function isMulti(cfg: HarnessConfig): boolean {
  return cfg.discovery !== "none";
}

/**
 * Lease TTL of the workers' and encoders' records in a harness run, seconds: the default. An etcd
 * outage longer than 2 TTLs makes their etcd clients give their leases up (records may then
 * expire and pools drain the members), so `--etcd-down-ms` stays below it.
 */
export const MULTI_TTL_S = 10;
const PREFIX = "/tapwire/v1/";

interface WorkerProc {
  id: string;
  svc: ChildService;
  endpoint: string;
  /** What happened to it. */
  events: string[];
  /** Member STEPs to it failed over all pools just before its clean stop (null: never stopped). */
  failedBeforeCleanStop: number | null;
}

/** One engine process as the harness sees it. */
interface EngineProc {
  id: number;
  svc: ChildService;
  session: number;
  /** Its last `stats` line (null before the first). */
  stats: EngineStats | null;
  /** Called on its next `stats` line. */
  statsWaiters: Array<() => void>;
  result: Promise<EngineResultLine>;
}

/** Runs a multi-instance harness. Never leaves child processes behind. */
export async function runMulti(
  cfg0: HarnessConfig,
  log: (m: string) => void,
): Promise<{ report: MultiReport; exitCode: number }> {
  // M shared encoders (-1: as many as engines), every engine's connector placing over all of
  // them (EC-CONTRACT 10.4); 0: none (local media only)
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
  const target = targetOf(cfg);
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
  return { target, weights };
}

async function startWorkerProc(
  scope: RunScope,
  weights: string,
  id: string,
  etcd: EtcdProc | null,
): Promise<WorkerProc> {
  const { cfg } = scope;
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
  const script = binPath("@tapwire/worker", "tapwire-worker");
  const svc = new ChildService({
    name: `worker-${id}`,
    script,
    args: [...args, "--listen", "tcp://127.0.0.1:0"],
    exitWithParent: binHasFlag(script, "--exit-with-parent"),
    ...(scope.childLog !== undefined ? { log: scope.childLog } : {}),
  });
  scope.watch(svc);
  scope.cleanups.push(() => svc.kill("SIGTERM"));
  const line = await svc.start();
  const endpoint = (line["endpoints"] as string[] | undefined)?.[0];
  if (endpoint === undefined)
    throw new HarnessError(HarnessErrorCode.PROCESS, `worker-${id}: no endpoint in its listening line`);
  // a restart comes back on the same endpoint (a static list stays right)
  svc.setArgs([...args, "--listen", endpoint]);
  scope.note(`worker-${id} pid ${svc.pid} listening on ${endpoint}`);
  return { id, svc, endpoint, events: [`started pid ${svc.pid}`], failedBeforeCleanStop: null };
}

/** Starts engine process `id` from `spec` (written to the run dir); resolves once its pool is ready. */
async function startEngineProc(scope: RunScope, spec: EngineSpec): Promise<EngineProc> {
  const file = join(scope.dir, `engine-${spec.id}.json`);
  writeFileSync(file, JSON.stringify(spec));
  const svc = new ChildService({
    name: `engine-${spec.id}`,
    script: engineScript(),
    args: ["--spec", file],
    exitWithParent: true,
    readyTimeoutMs: 90_000,
    ...(scope.childLog !== undefined ? { log: scope.childLog } : {}),
  });
  let resolveResult: (r: EngineResultLine) => void = () => {};
  let rejectResult: (e: Error) => void = () => {};
  const result = new Promise<EngineResultLine>((res, rej) => {
    resolveResult = res;
    rejectResult = rej;
  });
  result.catch(() => {}); // handled by whoever awaits it
  const ep: EngineProc = { id: spec.id, svc, session: 0, stats: null, statsWaiters: [], result };
  svc.onLine = (l) => {
    if (l["msg"] === "stats") {
      ep.stats = l as unknown as EngineStats;
      for (const w of ep.statsWaiters.splice(0)) w();
    } else if (l["msg"] === "result") resolveResult(l as unknown as EngineResultLine);
  };
  // an engine that dies never reports: the run fails instead of waiting
  scope.watch(svc);
  const watched = svc.onUnexpectedExit;
  svc.onUnexpectedExit = (e) => {
    watched?.(e);
    rejectResult(
      new HarnessError(
        HarnessErrorCode.PROCESS,
        `engine-${spec.id} exited (code ${e.code}, signal ${e.signal})`,
      ),
    );
  };
  scope.cleanups.push(() => svc.kill("SIGTERM", 5000));
  const first = (await svc.start()) as unknown as EngineListening;
  ep.session = first.session;
  scope.note(`engine-${spec.id} pid ${svc.pid} ready (session 0x${first.session.toString(16)})`);
  return ep;
}

/** Resolves on the next `stats` line of every engine (fresh views after an action; bounded). */
function freshStats(engines: readonly EngineProc[], timeoutMs = 5000): Promise<void> {
  return Promise.race([
    Promise.all(engines.map((ep) => new Promise<void>((r) => ep.statsWaiters.push(r)))).then(() => {}),
    new Promise<void>((r) => setTimeout(r, timeoutMs)),
  ]);
}

async function run(
  cfg: HarnessConfig,
  dir: string,
  cleanups: Array<() => Promise<void> | void>,
  log: (m: string) => void,
  t0: number,
): Promise<{ report: MultiReport; exitCode: number }> {
  const { target, weights } = models(cfg, dir);
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
  let etcd: EtcdProc | null = null;
  if (cfg.discovery === "etcd") {
    const e = await EtcdProc.start(scope.childLog);
    etcd = e;
    scope.watch(e.svc);
    cleanups.push(() => e.close());
    log(`etcd at ${e.clientUrl} (pid ${e.pid}, keeper pid ${e.svc.pid})`);
  }
  const workers: WorkerProc[] = [];
  for (let i = 0; i < cfg.workers; i++) workers.push(await startWorkerProc(scope, weights, String(i), etcd));
  log(`${workers.length} workers: ${workers.map((w) => w.endpoint).join(", ")}`);

  // the encoders, shared by every engine (EC-CONTRACT 10); with etcd they register their records
  const register =
    etcd !== null
      ? ["--register", etcd.endpoint, "--register-prefix", PREFIX, "--register-ttl", String(MULTI_TTL_S)]
      : [];
  const encoders: SharedEncoder[] = await startSharedEncoders(scope, cfg.encoders, register);
  if (encoders.length > 0)
    log(`${encoders.length} shared encoders: ${encoders.map((x) => x.record.control).join(", ")}`);

  // the engines, each its own process with its own pool and connector (started together)
  const engines: EngineProc[] = await Promise.all(
    Array.from({ length: cfg.engines }, (_, id) =>
      startEngineProc(scope, {
        id,
        cfg,
        weights,
        workers: etcd === null ? workers.map((w) => w.endpoint) : null,
        etcd: etcd === null ? null : { endpoint: etcd.endpoint, prefix: PREFIX },
        encoders: etcd === null ? encoders.map((x) => x.record) : null,
      }),
    ),
  );
  log(
    `${engines.length} engine processes (pids ${engines.map((e) => e.svc.pid).join(", ")}), each with a pool of ${cfg.workers} (discovery ${cfg.discovery})`,
  );

  const faultLog: { atMs: number; what: string }[] = [];
  let discoveredMs: number | null = null;
  let encoderTrustedAgainMs: number | null = null;
  let etcdDown: EtcdDownReport | null = null;
  let cleanStopped: WorkerProc | null = null;
  const fault = (what: string) => {
    faultLog.push({ atMs: Date.now() - t0, what });
    log(`fault: ${what}`);
  };
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
  // --faults: traffic is let in in stages so that every fault meets live requests
  const setShare = (value: number) => {
    for (const ep of engines) ep.svc.send(JSON.stringify({ cmd: "share", value }));
  };
  const member = (ep: EngineProc, endpoint: string) => ep.stats?.members.find((m) => m.endpoint === endpoint);
  // members each pool holds (not draining): a member is lost when its pool drops it, not when one
  // STEP of a loaded machine times out and its connection is re-made
  const membersNow = () => engines.map((ep) => ep.stats?.members.filter((m) => !m.draining).length ?? 0);
  const schedule = async (): Promise<void> => {
    if (!cfg.faults) return;
    // 1. an encoder killed with SIGKILL while transfers run; restarted on the same endpoints
    // (with etcd: registered again); every engine's directory trusts it again
    const enc = encoders[0];
    if (enc !== undefined) {
      // while transfers are in flight, best effort: early, while the caches are cold, once the
      // engines' stats show transfers (bounded)
      const ts0 = Date.now();
      const inFlight = () => engines.reduce((n, ep) => n + (ep.stats?.transfersInFlight ?? 0), 0);
      while (inFlight() === 0 && Date.now() - ts0 < 3000) await sleep(2);
      const met = inFlight();
      await enc.svc.kill("SIGKILL", 0);
      enc.events.push(`killed with SIGKILL (${met} transfers in flight in the engines)`);
      fault(`SIGKILL ${enc.id}`);
      // its items are asked of it until the directories see it gone (failed or retried
      // transfers, or encoded locally), then of the other encoder
      await sleep(1000);
      await enc.svc.start();
      enc.events.push(`restarted pid ${enc.svc.pid}`);
      fault(`${enc.id} restarted`);
      const ts = Date.now();
      while (!engines.every((ep) => ep.stats?.encoders.includes(enc.record.control) === true)) {
        if (Date.now() - ts > MULTI_TTL_S * 1000 * 3) break;
        await sleep(10);
      }
      encoderTrustedAgainMs = Date.now() - ts;
    }
    await sleep(300);
    // 2. SIGKILL of a worker mid-run, then back with a new incarnation on the same endpoint:
    // the worker holding the most slots in the engine that gives it the fewest, once it holds
    // slots of every engine (bounded wait), so that the kill meets live slots of both
    const held = (w: WorkerProc) => Math.min(...engines.map((ep) => member(ep, w.endpoint)?.assigned ?? 0));
    const tv = Date.now();
    while (!workers.some((w) => held(w) > 0) && Date.now() - tv < 5000) await sleep(10);
    const victim = [...workers].sort((a, b) => held(b) - held(a))[0]!;
    await victim.svc.kill("SIGKILL", 0);
    victim.events.push("killed with SIGKILL");
    fault(`SIGKILL worker-${victim.id} (${victim.endpoint})`);
    await sleep(Math.max(4 * cfg.stepTimeoutMs, 1000));
    await victim.svc.start();
    victim.events.push(`restarted pid ${victim.svc.pid} (new incarnation)`);
    fault(`worker-${victim.id} restarted with a new incarnation`);
    setShare(0.6);
    // 3. a worker started mid-run: with etcd it is found through discovery and given slots
    if (etcd !== null) {
      const fresh = await startWorkerProc(scope, weights, String(workers.length), etcd);
      workers.push(fresh);
      fault(`worker-${fresh.id} started mid-run at ${fresh.endpoint}`);
      const ts = Date.now();
      while (!engines.every((ep) => member(ep, fresh.endpoint)?.state === "READY")) {
        if (Date.now() - ts > MULTI_TTL_S * 1000 * 5) break;
        await sleep(10);
      }
      discoveredMs = Date.now() - ts;
      // 4. a clean stop (SIGTERM: revoke, drain, close): it leaves every pool without a failed
      // STEP (counted from fresh views before the stop to the engines' final results)
      const leaving = workers.find((w) => w !== victim && w !== fresh)!;
      await freshStats(engines);
      leaving.failedBeforeCleanStop = engines.reduce(
        (s, ep) => s + (member(ep, leaving.endpoint)?.stepsFailed ?? 0),
        0,
      );
      cleanStopped = leaving;
      fault(`worker-${leaving.id} stopped cleanly (SIGTERM)`);
      await leaving.svc.kill("SIGTERM", 5000);
      leaving.events.push("stopped cleanly (SIGTERM)");
      // 5. etcd stopped for a while: no member lost, no round waits on it
      await freshStats(engines);
      const membersBefore = membersNow();
      fault(`etcd stopped for ${cfg.etcdDownMs} ms`);
      await etcd.stop();
      setShare(1); // the rest of the traffic decodes while etcd is away
      const during: number[] = [];
      const te = Date.now();
      while (Date.now() - te < cfg.etcdDownMs) {
        during.push(Math.min(...membersNow()));
        await sleep(100);
      }
      await etcd.start();
      fault("etcd restarted");
      await sleep(500);
      await freshStats(engines);
      etcdDown = {
        ms: cfg.etcdDownMs,
        membersBefore,
        membersDuring: [Math.min(...during)],
        membersAfter: membersNow(),
      };
    }
  };
  const tDecode = Date.now();
  // engine-0 first, the others once it has decoded a little (bounded): their first media items
  // are then already resident at an encoder, placed through the directory (EC-CONTRACT 10.4)
  engines[0]?.svc.send(JSON.stringify({ cmd: "run" }));
  if (engines.length > 1 && encoders.length > 0) {
    const ts = Date.now();
    while ((engines[0]?.stats?.rounds ?? 0) < 10 && Date.now() - ts < 3000) await sleep(20);
  }
  for (const ep of engines.slice(1)) ep.svc.send(JSON.stringify({ cmd: "run" }));
  const faultsRun = schedule().finally(() => setShare(1));
  let results: EngineResultLine[];
  try {
    results = await Promise.all(engines.map((ep) => ep.result));
  } finally {
    await faultsRun.catch(() => {});
  }
  await faultsRun;
  const wallMs = Date.now() - tDecode;
  // the engines release their sessions and exit
  await Promise.all(engines.map((ep) => ep.svc.kill("SIGTERM", 5000)));

  // target-only decoding of the same requests, once; every engine's outputs are checked against it
  const { requests } = makeWorkload(cfg);
  const scratch = new SampleScratch(cfg.vocab);
  const reference = new Map<number, number[]>();
  for (const r of requests) {
    const extra = mediaConditioning(r.media.map((h) => localEmbedding(h, cfg.embeddingBytes)));
    reference.set(r.id, decodeTargetOnly(target, r, extra, cfg, scratch));
  }
  const lossless: LosslessResult[] = results.map((res) => {
    const outputs = new Map(res.outputs);
    return cfg.sample
      ? checkSampled(requests, outputs, reference)
      : checkGreedy(requests, outputs, reference);
  });

  // per worker process: every pool's view of it, summed
  const perWorker = workers.map((w) => {
    let steps = 0;
    let stepsFailed = 0;
    let peak = 0;
    let failoversOut = 0;
    let movedReleases = 0;
    const servedEngines: Record<string, number> = {};
    for (const res of results) {
      const m = res.members.find((x) => x.endpoint === w.endpoint);
      if (m === undefined) continue;
      steps += m.steps;
      stepsFailed += m.stepsFailed;
      peak += res.peakSlots[w.endpoint] ?? 0;
      failoversOut += m.failoversOut;
      movedReleases += m.movedReleases;
      servedEngines[`engine-${res.engine}`] = m.steps;
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
      servedEngines,
      events: w.events,
      failedStepsAfterCleanStop:
        w === cleanStopped && w.failedBeforeCleanStop !== null ? stepsFailed - w.failedBeforeCleanStop : null,
    };
  });
  const perEncoder = encoders.map((x) => {
    const servedEngines: Record<string, number> = {};
    for (const res of results) {
      const n = res.media.byEncoder[x.record.control] ?? 0;
      if (n > 0) servedEngines[`engine-${res.engine}`] = n;
    }
    return {
      id: x.id,
      endpoint: x.record.control,
      pids: [...x.svc.pids],
      transfers: Object.values(servedEngines).reduce((a, b) => a + b, 0),
      servedEngines,
      registered: etcd !== null,
      events: x.events,
    };
  });
  const gaps = results.flatMap((r) => r.failoverRounds);
  const report: MultiReport = {
    mode: "multi",
    discovery: cfg.discovery,
    harnessPid: process.pid,
    engines: engines.map((ep, i) => {
      const r = results[i]!;
      return {
        id: `engine-${ep.id}`,
        pids: [...ep.svc.pids],
        session: r.session,
        requests: requests.length,
        tokens: r.tokens,
        rounds: r.rounds,
        roundsWithoutDrafts: r.roundsWithoutDrafts,
        entriesWithoutDrafts: r.entriesWithoutDrafts,
        maxRoundMs: r.maxRoundMs,
        roundsOverTimeout: r.roundsOverTimeout,
        media: r.media,
        lossless: lossless[i]!,
      };
    }),
    workers: perWorker,
    encoders: perEncoder,
    processes: [
      { id: "harness", role: "harness", pids: [process.pid] },
      ...(etcd !== null ? [{ id: "etcd", role: "etcd", pids: [...etcd.etcdPids] }] : []),
      ...engines.map((ep) => ({ id: `engine-${ep.id}`, role: "engine", pids: [...ep.svc.pids] })),
      ...workers.map((w) => ({ id: `worker-${w.id}`, role: "worker", pids: [...w.svc.pids] })),
      ...encoders.map((x) => ({ id: x.id, role: "encoder", pids: [...x.svc.pids] })),
    ],
    unexpectedExits: deaths,
    etcd: etcd !== null ? { clientUrl: etcd.clientUrl, pids: [...etcd.etcdPids], down: etcdDown } : null,
    failover_rounds: {
      n: gaps.length,
      p50: percentile(gaps, 50),
      max: gaps.length > 0 ? Math.max(...gaps) : null,
    },
    discovered_ms: discoveredMs,
    encoder_trusted_again_ms: encoderTrustedAgainMs,
    ttl_s: etcd !== null ? MULTI_TTL_S : null,
    step_timeout_ms: cfg.stepTimeoutMs,
    faults: faultLog,
    wall_ms: wallMs,
    ok: lossless.every((l) => l.ok) && deaths.length === 0,
  };
  return { report, exitCode: report.ok ? 0 : 1 };
}
