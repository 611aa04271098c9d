/**
 * One harness run: start the drafter worker and the encoder as child processes, connect the
 * engine's RemoteDraftClient + RoundCore and ConsumerConnector, decode every request
 * speculatively, decode them again target-only, compare, and build the report.
 */
import { rmSync } from "node:fs";
import { join } from "node:path";
import { piecewiseLinearBudget, RemoteDraftClient, RoundCore } from "@tapwire/client";
import { EC_METRICS_PREFIX, EcAdminClient } from "@tapwire/ec-connector";
import { DEFAULT_DRAFT_CONFIG, DraftHead, TargetModel } from "@tapwire/reference-model";
import { createLogger, parseMetricsListen, Registry, serveMetrics } from "@tapwire/stats";
import { type FaultProxy, startFaultProxy } from "@tapwire/testing";
import { budgetFromCurve, type HarnessConfig, metricsListenOf } from "./cli/cli.js";
import { DepthRunStats, makeDepthPolicy, parseDepthPolicy } from "./depth/depth-sim.js";
import { startEc } from "./ec/ec-side.js";
import { EcMediaMetrics, LocalMedia, localEmbedding } from "./ec/media.js";
import { traceOption } from "./engine/capture.js";
import { clientOptionsOf } from "./engine/client-options.js";
import { Engine, EngineMetrics, type MediaSource } from "./engine/engine.js";
import { RoundCoreLink } from "./engine/link.js";
import { checkGreedy, checkSampled } from "./engine/lossless.js";
import { decodeTargetOnly, mediaConditioning } from "./engine/sequence.js";
import { SampleScratch } from "./engine/verify.js";
import { makeWorkload, type RequestSpec } from "./engine/workload.js";
import { HarnessError, HarnessErrorCode } from "./errors.js";
import { FaultDriver } from "./faults/faults.js";
import { parseHostPort, type RunScope, startWorker } from "./procs/children.js";
import type { ChildExit } from "./procs/procs.js";
import { makeRunDir, removeStaleRunDirs } from "./procs/tempdir.js";
import { openTopology } from "./procs/topology.js";
import { endState } from "./report/leak-check.js";
import { histogramBins } from "./report/pictures.js";
import { Progress } from "./report/progress.js";
import type { Report } from "./report/report.js";
import { buildReport } from "./report/run-report.js";
import { VllmExport } from "./report/vllm-metrics.js";
import { workerMetrics } from "./report/worker-metrics.js";
import { LiveView } from "./ui/live.js";

export { EC_BLOCK_BYTES, ENCODE_DELAY_MS } from "./procs/children.js";

/** Result of {@link runHarness}. */
export interface RunResult {
  report: Report;
  /** 0 lossless and clean, 1 otherwise. */
  exitCode: number;
}

/** Hooks for the bin (and tests) to observe a run. */
export interface RunHooks {
  /**
   * Called (and awaited) once the metrics endpoint listens (with `--metrics-listen` /
   * `--metrics-port`), before anything else starts.
   */
  onMetrics?: (port: number) => void | Promise<void>;
  /** Called (and awaited) with the encoder's own metrics URL once it listens (with `--metrics-listen`). */
  onEncoderMetrics?: (url: string) => void | Promise<void>;
  /** Called (and awaited) when decoding ends, before anything stops: every metric has moved. */
  onDecoded?: () => void | Promise<void>;
  /** Called (and awaited) when decoding starts: the link is up, `/readyz` answers 200. */
  onDecoding?: () => void | Promise<void>;
  /** Log lines for humans (stderr). */
  log?: (msg: string) => void;
}

export { CORRUPT_ENV } from "./ec/ec-side.js";

/** The run's three registries: the engine's, the EC consumer's and the client's. */
interface Registries {
  engine: Registry;
  ec: Registry;
  client: Registry;
}

/** What `/readyz` answers (ready while decoding) and the client our `/metrics` asks for STATS. */
interface LiveState {
  phase: string;
  decoding: boolean;
  client: RemoteDraftClient | null;
  /** The vLLM-named series (issue 24). */
  vllm: VllmExport;
}

/** The metrics and health endpoint, first, so that /healthz answers while the run starts. */
async function serveRunMetrics(scope: RunScope, hooks: RunHooks, regs: Registries, live: LiveState) {
  if (scope.metricsAt === null) return;
  const { host, port } = parseMetricsListen(scope.metricsAt);
  const srv = await serveMetrics([regs.engine, regs.client, regs.ec], port, host, {
    ready: () => (live.decoding ? true : live.phase),
    extra: async () =>
      live.vllm.exposition() +
      (await workerMetrics(scope.urls.worker, scope.cfg.faults ? null : live.client)),
  });
  scope.cleanups.push(() => srv.close());
  const shown = host.includes(":") ? `[${host}]` : host;
  scope.note(`Prometheus metrics on http://${shown}:${srv.port}/metrics (also /healthz, /readyz)`);
  await hooks.onMetrics?.(srv.port);
}

/** `--ui`: the live view, up from the start; closed (after `--ui-linger-ms`) at the end. */
async function startLive(scope: RunScope, regs: Registries, live: LiveState): Promise<LiveView> {
  const ui = await LiveView.start(scope.cfg, [regs.engine, regs.client, regs.ec], () => live.phase);
  scope.cleanups.push(() => ui.close());
  // printed at any --progress: the user (and a test) needs the URL
  process.stderr.write(`[harness] live view on ${ui.url}\n`);
  return ui;
}

/** The target, and the draft head the worker will serve (same seed, same weights), saved. */
function makeModels(scope: RunScope): { target: TargetModel; head: DraftHead; weights: string } {
  const { cfg } = scope;
  const target = TargetModel.create({
    vocabSize: cfg.vocab,
    stateDim: cfg.stateDim,
    numTaps: cfg.numTaps,
    hidden: cfg.hidden,
    seed: cfg.seed,
  });
  const maxRank = cfg.stateDim - 2;
  const draftCfg = {
    ...DEFAULT_DRAFT_CONFIG,
    window: cfg.window,
    numSpec: cfg.numSpec,
    rank: Math.min(cfg.draftRank > 0 ? cfg.draftRank : DEFAULT_DRAFT_CONFIG.rank, maxRank),
    markovRank: Math.min(DEFAULT_DRAFT_CONFIG.markovRank, maxRank),
    noise: cfg.draftNoise >= 0 ? cfg.draftNoise : DEFAULT_DRAFT_CONFIG.noise,
  };
  scope.setPhase("starting: distilling the draft head");
  scope.note(
    `distilling the draft head (rows ${cfg.numTaps}x${cfg.hidden}, vocab ${cfg.vocab}, N=${cfg.numSpec}, W=${cfg.window})`,
  );
  const head = DraftHead.distill(target, draftCfg);
  const weights = join(scope.dir, "draft-head.safetensors");
  head.save(weights);
  return { target, head, weights };
}

/** The rank-0 client, connected (throws when the drafter link does not become ready). */
async function connectClient(
  scope: RunScope,
  endpoint: string,
  head: DraftHead,
  tls: { ca: string } | null,
  live: LiveState,
  registry: Registry,
): Promise<RemoteDraftClient> {
  const { cfg } = scope;
  const logger = createLogger({
    name: "tapwire-client",
    level: cfg.verbose ? "info" : "error",
    destination: 2,
  });
  const client = new RemoteDraftClient({
    endpoint,
    ...clientOptionsOf(cfg, head),
    clientName: "tapwire-harness",
    logger,
    registry,
    ...traceOption(scope),
    ...(tls ? { transportOptions: { tls: { ca: tls.ca, servername: "localhost" } } } : {}),
  });
  live.client = client;
  scope.cleanups.push(() => client.close());
  scope.setPhase("starting: connecting to the worker");
  scope.note(`connecting to the worker at ${endpoint}`);
  if (!(await client.waitReady(15_000))) {
    throw new HarnessError(
      HarnessErrorCode.PROCESS,
      `the drafter link did not become ready: ${client.disabledReason ?? client.lastError ?? "no reason"}`,
    );
  }
  return client;
}

/** The counters `--faults` watches to tell whether a fault was noticed and recovered from. */
function faultCounters(metrics: EngineMetrics, regs: Registries, ecMetrics: EcMediaMetrics) {
  const snap = regs.client.snapshot().counters;
  const c: Record<string, number> = {};
  for (const [k, v] of Object.entries(metrics.outcomeCounts())) c[`outcome_${k}`] = v;
  c["hellos"] = snap["hellos"] ?? 0;
  c["connect_failures"] = snap["connect_failures"] ?? 0;
  c["disconnects"] = snap["disconnects"] ?? 0;
  c["new_sessions"] = snap["new_sessions"] ?? 0;
  c["resync_entries"] = metrics.resyncs.value;
  const ec = regs.ec.snapshot().counters;
  c["ec_retries"] = ec["connector_retries"] ?? 0;
  c["ec_failed"] = ec["connector_failed"] ?? 0;
  c["ec_peer_down"] = ec["consumer_peer_down"] ?? 0;
  c["ec_quarantines"] = ec["consumer_quarantines"] ?? 0;
  c["ec_fallbacks"] = ecMetrics.fallbacks.value;
  c["ec_transfers"] = ecMetrics.transfers.value;
  c["ec_probes"] = ecMetrics.probes.value;
  return c;
}

/** The same requests decoded target-only, for the lossless check. */
function referenceDecode(
  cfg: HarnessConfig,
  target: TargetModel,
  requests: RequestSpec[],
): { reference: Map<number, number[]>; refSeconds: number } {
  const tRef = performance.now();
  const scratch = new SampleScratch(cfg.vocab);
  const reference = new Map<number, number[]>();
  for (const r of requests) {
    const extra = mediaConditioning(r.media.map((h) => localEmbedding(h, cfg.embeddingBytes)));
    reference.set(r.id, decodeTargetOnly(target, r, extra, cfg, scratch));
  }
  return { reference, refSeconds: (performance.now() - tRef) / 1000 };
}

/** The drafter link and the media source the engine decodes through. */
interface EngineParts {
  cfg: HarnessConfig;
  target: TargetModel;
  requests: RequestSpec[];
  client: RemoteDraftClient;
  media: MediaSource;
  metrics: EngineMetrics;
  ecMetrics: EcMediaMetrics;
  faults: FaultDriver | null;
  progress: Progress;
  vllm: VllmExport;
}

/** The engine over RoundCore with the `--depth-policy`, reporting progress each round. */
function makeEngine(p: EngineParts): { engine: Engine; depthStats: DepthRunStats } {
  const { cfg, metrics, ecMetrics, faults } = p;
  const budget =
    cfg.budget ?? piecewiseLinearBudget(cfg.loadCurve.map((c) => ({ batchSize: c.batch, tokens: c.tokens })));
  // --depth-policy (checked by the CLI): fixed:K, budget, or goodput (cost model + calibration)
  const depthSpec = parseDepthPolicy(cfg.depthPolicy, cfg.numSpec) ?? { kind: "goodput", calibrate: true };
  const depthSetup = makeDepthPolicy(depthSpec, { numSpec: cfg.numSpec, budget });
  const depthStats = new DepthRunStats(depthSpec, depthSetup, cfg.numSpec);
  const core = new RoundCore({ client: p.client, depthPolicy: depthSetup.policy });
  const engine = new Engine({
    cfg,
    target: p.target,
    requests: p.requests,
    link: new RoundCoreLink(core),
    media: p.media,
    budgetFor: (b) => (cfg.budget !== null ? cfg.budget : budgetFromCurve(cfg.loadCurve, b)),
    metrics,
    onVerified: (d, k, accepted) => {
      depthStats.onVerified(d, k, accepted);
      p.vllm.onVerified(d, k, accepted);
    },
    onRoundVerified: depthStats.onRoundVerified,
    ...(faults ? { arrivalCap: faults.arrivalCap } : {}),
    onRound: async (r) => {
      p.progress.update({
        phase: "decoding",
        done: r.completed,
        total: r.total,
        tokens: metrics.tokensGenerated.value,
        rounds: metrics.rounds.value,
        meanAccepted:
          metrics.verificationsWithDrafts.value > 0
            ? metrics.acceptedLengthSum.value / metrics.verificationsWithDrafts.value
            : 0,
        ecLoaded: ecMetrics.transfers.value,
        faults: faults?.injected.length ?? 0,
      });
      await faults?.hook(r);
    },
  });
  return { engine, depthStats };
}

/** The run's steps in order; {@link runHarness} owns the cleanup. */
async function runSteps(
  scope: RunScope,
  hooks: RunHooks,
  progress: Progress,
  deaths: ChildExit[],
  live: LiveState,
): Promise<RunResult> {
  const { cfg, note } = scope;
  const regs: Registries = {
    engine: new Registry({ prefix: "tapwire_harness_" }),
    ec: new Registry({ prefix: EC_METRICS_PREFIX }),
    client: new Registry({ prefix: "tapwire_client_" }),
  };
  await serveRunMetrics(scope, hooks, regs, live);
  note(scope.topology.describe());
  const ui = cfg.ui ? await startLive(scope, regs, live) : null;
  const { target, head, weights } = makeModels(scope);
  const { worker, endpoint: workerEndpoint, tls } = await startWorker(scope, weights);
  // the fault proxy between client and worker (tcp, --faults)
  let proxy: FaultProxy | null = null;
  let clientEndpoint = workerEndpoint;
  if (cfg.faults && cfg.draftTransport === "tcp") {
    const p = await startFaultProxy(parseHostPort(workerEndpoint));
    proxy = p;
    scope.cleanups.push(() => p.close());
    clientEndpoint = p.endpoint;
  }
  const ecMetrics = new EcMediaMetrics(regs.engine);
  const ec = cfg.mmShare > 0 ? await startEc(scope, hooks, regs.ec, ecMetrics) : null;
  const client = await connectClient(scope, clientEndpoint, head, tls, live, regs.client);

  const { requests } = makeWorkload(cfg);
  const metrics = new EngineMetrics(regs.engine);
  const faults = cfg.faults
    ? new FaultDriver({
        worker,
        encoder: ec?.encoder ?? null,
        proxy,
        linkEpoch: () => client.epoch,
        ready: () => client.ready,
        ecOk: () => ecMetrics.transfers.value + ecMetrics.probes.value,
        probeEncoder: () => ec?.media.probe(),
        ecInFlight: () => ec?.media.pending ?? 0,
        counters: () => faultCounters(metrics, regs, ecMetrics),
        stepTimeoutMs: cfg.stepTimeoutMs,
        log: note,
      })
    : null;
  const media: MediaSource = ec?.media ?? new LocalMedia(cfg.embeddingBytes);
  live.vllm.attach(metrics, ecMetrics);
  const parts = {
    cfg,
    target,
    requests,
    client,
    media,
    metrics,
    ecMetrics,
    faults,
    progress,
    vllm: live.vllm,
  };
  const { engine, depthStats } = makeEngine(parts);
  ui?.attach({
    metrics,
    ecMetrics,
    client: regs.client,
    ec: regs.ec,
    vllm: live.vllm,
    depth: () => depthStats,
    total: requests.length,
  });
  note(
    `decoding ${requests.length} requests (S=${cfg.slots}, N=${cfg.numSpec}, ${cfg.sample ? "sampled" : "greedy"})`,
  );
  live.phase = "decoding";
  live.decoding = true;
  await hooks.onDecoding?.();
  const decodeStartEpoch = Date.now();
  const res = await engine.run();
  await hooks.onDecoded?.();
  live.decoding = false;
  live.phase = "finished decoding: checking the output";
  await faults?.settle();
  progress.finish();
  const drained = ec ? await ec.media.drain(10_000) : true;

  // the worker's own stats, then the reference decode
  let workerStats: Record<string, unknown> = {};
  try {
    workerStats = (await client.stats()) as Record<string, unknown>;
  } catch (e) {
    workerStats = { error: e instanceof Error ? e.message : String(e) };
  }
  note("decoding the same requests target-only for the lossless check");
  const { reference, refSeconds } = referenceDecode(cfg, target, requests);
  const lossless = cfg.sample
    ? checkSampled(requests, res.outputs, reference)
    : checkGreedy(requests, res.outputs, reference);

  // end state of both caches: no pin, no grant, no block in flight or retired
  // a restarted encoder (--faults) may listen for admin on a new port: follow its last line
  const lastAdmin = ec?.encoder.listening?.["admin"];
  if (ec && typeof lastAdmin === "string" && lastAdmin !== ec.adminEndpoint) {
    ec.admin.close();
    ec.adminEndpoint = lastAdmin;
    ec.admin = new EcAdminClient(ec.adminEndpoint);
  }
  const leaks = await endState(ec?.connector ?? null, ec?.admin ?? null, drained);
  const topology = await scope.topology.report();
  const report = buildReport({
    ...{ cfg, requests, res, metrics, reference, refSeconds, lossless, depthStats, ecMetrics, faults },
    ecCounters: regs.ec.snapshot().counters,
    clientStats: regs.client.snapshot(),
    disabledReason: client.disabledReason,
    workerStats,
    notes: (ec?.fallbacks ?? []).map((f) => `local fallback for media ${f}`),
    worker,
    encoder: ec?.encoder ?? null,
    deaths,
    decodeStartEpoch,
    leaks,
    topology,
  });
  live.vllm.sync();
  report.specDecode = live.vllm.spec.snapshot();
  report.stepRttHistogram = histogramBins(metrics.stepRtt);
  ui?.finish(report);
  if (ec?.placement) {
    // EC-CONTRACT 10.4: a request to a producer whose trusted view lacked the item fails the run
    await ec.placement.settleLate();
    report.placement = ec.placement.report(regs.ec.snapshot().counters);
    if (report.placement.sentWithoutHolder > 0) report.ok = false;
    const more = await ec.placement.leakCheck();
    if (more.length > 0) {
      report.ok = false;
      report.leaks.ok = false;
      report.leaks.notes.push(...more);
    }
  }
  // a child that died on its own is a process failure (3), even when the output stayed lossless
  return { report, exitCode: report.ok ? 0 : deaths.length > 0 ? 3 : 1 };
}

/** Runs the harness with `cfg`. Never leaves child processes behind. */
export async function runHarness(cfg: HarnessConfig, hooks: RunHooks = {}): Promise<RunResult> {
  const log = hooks.log ?? ((m: string) => process.stderr.write(`[harness] ${m}\n`));
  const progress = new Progress(cfg.progress);
  const note = (m: string) => progress.note(m);
  // first: a netns run that cannot get its plan or relay fails before anything else starts
  const topology = await openTopology(cfg);
  // the dirs of runs that died by SIGKILL (their children exited with them, issue 19)
  for (const stale of removeStaleRunDirs()) note(`removed the temp dir of a dead run: ${stale}`);
  const dir = makeRunDir();
  // also on SIGINT / process.exit, when the finally below never runs
  const removeDir = () => rmSync(dir, { recursive: true, force: true });
  process.once("exit", removeDir);
  const cleanups: Array<() => Promise<void> | void> = [
    () => topology.close(),
    () => {
      process.off("exit", removeDir);
      removeDir();
    },
  ];
  // exits of child processes nobody asked for (not --faults, not the end of the run)
  const deaths: ChildExit[] = [];
  const live: LiveState = {
    phase: "starting",
    decoding: false,
    client: null,
    vllm: new VllmExport(cfg.metricsEnginePrefix, cfg.numSpec),
  };
  const scope: RunScope = {
    cfg,
    dir,
    cleanups,
    note,
    watch: (svc) => {
      svc.onUnexpectedExit = (e) => {
        deaths.push(e);
        note(`${e.name} pid ${e.pid} died (code ${e.code}, signal ${e.signal}) outside --faults`);
      };
    },
    childLog: cfg.verbose ? (l: string) => process.stderr.write(`${l}\n`) : undefined,
    setPhase: (phase) => {
      live.phase = phase;
    },
    metricsAt: metricsListenOf(cfg),
    urls: { worker: null, encoder: null },
    topology,
  };
  try {
    return await runSteps(scope, hooks, progress, deaths, live);
  } catch (e) {
    if (deaths.length > 0 && e instanceof Error) {
      const text = deaths.map((d) => `${d.name} pid ${d.pid} died (code ${d.code}, signal ${d.signal})`);
      e.message += ` (${text.join("; ")})`;
    }
    throw e;
  } finally {
    progress.finish();
    for (const c of cleanups.reverse()) {
      try {
        await c();
      } catch (e) {
        log(`cleanup: ${e instanceof Error ? e.message : String(e)}`);
      }
    }
  }
}
