/**
 * One harness run: start the drafter worker and the encoder as child processes, connect the
 * engine's RemoteDraftClient + RoundCore and ConsumerConnector, decode every request
 * speculatively, decode them again target-only, compare, and build the report.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { piecewiseLinearBudget, RemoteDraftClient, RoundCore } from "@tapwire/client";
import { ConsumerConnector, EC_METRICS_PREFIX, EcAdminClient } from "@tapwire/ec-connector";
import { DEFAULT_DRAFT_CONFIG, DraftHead, TargetModel } from "@tapwire/reference-model";
import { createLogger, parseMetricsListen, Registry, serveMetrics } from "@tapwire/stats";
import { type FaultProxy, freePort, makeTlsCredentials, startFaultProxy } from "@tapwire/testing";
import { budgetFromCurve, type HarnessConfig, metricsListenOf } from "./cli.js";
import { DepthRunStats, makeDepthPolicy, parseDepthPolicy } from "./depth-sim.js";
import { Engine, EngineMetrics, type MediaSource } from "./engine.js";
import { HarnessError, HarnessErrorCode } from "./errors.js";
import { FaultDriver } from "./faults.js";
import { RoundCoreLink } from "./link.js";
import { checkGreedy, checkSampled } from "./lossless.js";
import { EcMedia, EcMediaMetrics, LocalMedia, localEmbedding } from "./media.js";
import { binPath, type ChildExit, ChildService } from "./procs.js";
import { Progress } from "./progress.js";
import type { ChildDeath, LatencySummary, Report } from "./report.js";
import { decodeTargetOnly, mediaConditioning } from "./sequence.js";
import { SampleScratch } from "./verify.js";
import { binHasFlag, scrapeUpText, statsToPrometheus, workerHasMetricsListen } from "./worker-metrics.js";
import { makeWorkload } from "./workload.js";

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

function endpointFor(transport: HarnessConfig["draftTransport"], dir: string): string {
  switch (transport) {
    case "tcp":
      return "tcp://127.0.0.1:0";
    case "tls":
      return "tls://127.0.0.1:0";
    case "zmq":
      return "zmq+tcp://127.0.0.1:0";
    case "unix":
      return `unix://${join(dir, "worker.sock")}`;
  }
}

function parseHostPort(endpoint: string): { host: string; port: number } {
  const m = /^[a-z+]+:\/\/(.+):(\d+)$/.exec(endpoint);
  if (!m) throw new HarnessError(HarnessErrorCode.INTERNAL, `cannot parse endpoint ${endpoint}`);
  return { host: m[1] as string, port: Number(m[2]) };
}

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

/**
 * Test-only: with this environment variable set to 1 the engine flips one bit of the first
 * transferred embedding it reads, and the run must then fail the lossless check (exit 1).
 */
export const CORRUPT_ENV = "TAPWIRE_HARNESS_TEST_CORRUPT_EMBEDDING";

/** Block size of both encoder caches (64 KiB, the EC connector's default). */
export const EC_BLOCK_BYTES = 65_536;
/** Simulated encode time of the encoder per item, ms. */
export const ENCODE_DELAY_MS = 15;

const EC_STATUS_COUNTERS: ReadonlyArray<[string, string]> = [
  ["OK", "consumer_acks_ok"],
  ["NACK_MISSING", "consumer_nacks_missing"],
  ["NACK_NOT_READY", "consumer_nacks_not_ready"],
  ["NACK_INCOMPAT", "consumer_nacks_incompat"],
  ["NACK_VERSION", "consumer_nacks_version"],
  ["NACK_INTERNAL", "consumer_nacks_internal"],
  ["ack_timeout", "consumer_ack_timeouts"],
  ["read_failed", "consumer_read_failures"],
  ["checksum_failed", "consumer_checksum_failures"],
  ["quarantined", "consumer_quarantines"],
  ["settled", "consumer_settles"],
  ["peer_down", "consumer_peer_down"],
];

/** XferAck statuses (EC-CONTRACT 3) and transfer outcomes as the consumer counted them. */
function ecStatusCounts(c: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [name, key] of EC_STATUS_COUNTERS) out[name] = c[key] ?? 0;
  return out;
}

interface EndState {
  ok: boolean;
  /** none: both sides measured clean; leaked; unknown: a side could not be measured; not_applicable: no EC. */
  status: "none" | "leaked" | "unknown" | "not_applicable";
  /** null: not measured (never an invented 0). */
  consumerPinnedBlocks: number | null;
  consumerInFlightBlocks: number | null;
  consumerRetiredBlocks: number | null;
  producerPinnedBlocks: number | null;
  producerGrants: number | null;
  producerCounters: Record<string, number>;
  notes: string[];
}

/**
 * EC-CONTRACT 8 at the end of a run: once settled, no pin remains and the free counts return to
 * their initial values on both sides. The consumer frees its ready entries and proves its
 * bookkeeping; the producer is asked over its admin channel (its grants are released by completion
 * notifications, which may still be in flight: polled for up to 3 s).
 */
async function endState(
  connector: ConsumerConnector | null,
  admin: EcAdminClient | null,
  drained: boolean,
): Promise<EndState> {
  const st: EndState = {
    ok: true,
    status: "not_applicable",
    consumerPinnedBlocks: null,
    consumerInFlightBlocks: null,
    consumerRetiredBlocks: null,
    producerPinnedBlocks: null,
    producerGrants: null,
    producerCounters: {},
    notes: [],
  };
  if (!connector || !admin) return st;
  st.status = "none";
  if (!drained) st.notes.push("transfers still in flight 10 s after the run");
  const cache = connector.cache;
  for (const k of cache.keys()) if (cache.isReady(k)) connector.free(k);
  try {
    cache.check();
  } catch (e) {
    st.ok = false;
    st.notes.push(`consumer cache check failed: ${e instanceof Error ? e.message : String(e)}`);
  }
  st.consumerPinnedBlocks = cache.pinnedBlocks;
  st.consumerRetiredBlocks = cache.retiredBlocks;
  st.consumerInFlightBlocks = cache.numBlocks - cache.freeBlocks - cache.retiredBlocks;
  if (
    st.consumerPinnedBlocks + st.consumerInFlightBlocks + st.consumerRetiredBlocks > 0 ||
    connector.pendingCount > 0
  ) {
    st.ok = false;
  }
  const end = performance.now() + 3000;
  for (;;) {
    try {
      const s = await admin.stats(2000);
      const c = s["cache"] as Record<string, unknown> | undefined;
      const grants = Number(s["grants"]);
      const pinned = Number(c?.["pinnedBlocks"]);
      if (!Number.isFinite(grants) || !Number.isFinite(pinned)) {
        throw new Error(
          `stats reply without grants / cache.pinnedBlocks: ${JSON.stringify(s).slice(0, 200)}`,
        );
      }
      st.producerGrants = grants;
      st.producerPinnedBlocks = pinned;
      const m = s["metrics"] as { counters?: Record<string, number> } | undefined;
      st.producerCounters = m?.counters ?? {};
      if ((grants === 0 && pinned === 0) || performance.now() > end) break;
    } catch (e) {
      // the producer side could not be measured: say so, never report zeros it did not see
      st.producerGrants = null;
      st.producerPinnedBlocks = null;
      st.notes.push(
        `producer side not measured: stats unavailable: ${e instanceof Error ? e.message : String(e)}`,
      );
      st.ok = false;
      st.status = "unknown";
      return st;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  const problem = await admin.check(2000).catch((e: unknown) => (e instanceof Error ? e.message : String(e)));
  if (problem !== null) {
    st.ok = false;
    st.notes.push(`producer cache check failed: ${problem}`);
  }
  if ((st.producerGrants ?? 0) > 0 || (st.producerPinnedBlocks ?? 0) > 0) st.ok = false;
  if (!st.ok) st.status = "leaked";
  return st;
}

function toDeath(e: ChildExit, decodeStartEpoch: number): ChildDeath {
  return { name: e.name, pid: e.pid, atMs: e.atEpochMs - decodeStartEpoch, code: e.code, signal: e.signal };
}

/**
 * The worker's metrics for our /metrics: its own endpoint's text when it has one (re-served as
 * is), else, outside `--faults`, its STATS snapshot over the drafter link (counters, gauges and
 * HDR quantiles as summaries), and `tapwire_harness_worker_scrape_up` saying whether it answered.
 */
async function workerMetrics(url: string | null, client: RemoteDraftClient | null): Promise<string> {
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

/** Runs the harness with `cfg`. Never leaves child processes behind. */
export async function runHarness(cfg: HarnessConfig, hooks: RunHooks = {}): Promise<RunResult> {
  const log = hooks.log ?? ((m: string) => process.stderr.write(`[harness] ${m}\n`));
  const progress = new Progress(cfg.progress);
  const note = (m: string) => progress.note(m);
  const dir = mkdtempSync(join(tmpdir(), "tapwire-harness-"));
  // also on SIGINT / process.exit, when the finally below never runs
  const removeDir = () => rmSync(dir, { recursive: true, force: true });
  process.once("exit", removeDir);
  const cleanups: Array<() => Promise<void> | void> = [
    () => {
      process.off("exit", removeDir);
      removeDir();
    },
  ];
  const childLog = cfg.verbose ? (l: string) => process.stderr.write(`${l}\n`) : undefined;
  // exits of child processes nobody asked for (not --faults, not the end of the run)
  const deaths: ChildExit[] = [];
  const services: ChildService[] = [];
  const watch = (svc: ChildService) => {
    services.push(svc);
    svc.onUnexpectedExit = (e) => {
      deaths.push(e);
      note(`${e.name} pid ${e.pid} died (code ${e.code}, signal ${e.signal}) outside --faults`);
    };
  };
  let decodeStartEpoch = Date.now();
  const deathText = () =>
    deaths.map((d) => `${d.name} pid ${d.pid} died (code ${d.code}, signal ${d.signal})`).join("; ");
  // what /readyz answers: ready while decoding
  let phase = "starting";
  let decoding = false;
  const engineRegistry = new Registry({ prefix: "tapwire_harness_" });
  const ecRegistry = new Registry({ prefix: EC_METRICS_PREFIX });
  const clientRegistry = new Registry({ prefix: "tapwire_client_" });
  let metricsClient: RemoteDraftClient | null = null;
  let workerMetricsUrl: string | null = null;
  let encoderMetricsUrl: string | null = null;
  const metricsAt = metricsListenOf(cfg);
  try {
    // 0. metrics and health endpoint first, so that /healthz answers while the run starts
    if (metricsAt !== null) {
      const { host, port } = parseMetricsListen(metricsAt);
      const srv = await serveMetrics([engineRegistry, clientRegistry, ecRegistry], port, host, {
        ready: () => (decoding ? true : phase),
        extra: () => workerMetrics(workerMetricsUrl, cfg.faults ? null : metricsClient),
      });
      cleanups.push(() => srv.close());
      const shown = host.includes(":") ? `[${host}]` : host;
      note(`Prometheus metrics on http://${shown}:${srv.port}/metrics (also /healthz, /readyz)`);
      await hooks.onMetrics?.(srv.port);
    }
    // 1. models: the target, and the draft head the worker will serve (same seed, same weights)
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
    phase = "starting: distilling the draft head";
    note(
      `distilling the draft head (rows ${cfg.numTaps}x${cfg.hidden}, vocab ${cfg.vocab}, N=${cfg.numSpec}, W=${cfg.window})`,
    );
    const head = DraftHead.distill(target, draftCfg);
    const weights = join(dir, "draft-head.safetensors");
    head.save(weights);

    // 2. the drafter worker
    const listen = endpointFor(cfg.draftTransport, dir);
    const workerArgs = [
      // onnx: the worker exports the same safetensors to ONNX in memory (@tapwire/drafter-onnx)
      ...(cfg.drafter === "onnx"
        ? ["--drafter", "onnx", "--model", weights]
        : ["--drafter", "reference", "--weights", weights]),
      "--seed",
      String(cfg.seed),
      "--vocab",
      String(cfg.vocab),
      "--state-dim",
      String(cfg.stateDim),
      "--num-taps",
      String(cfg.numTaps),
      "--hidden",
      String(cfg.hidden),
      "--window",
      String(cfg.window),
      "--num-spec",
      String(cfg.numSpec),
      "--max-slots",
      String(Math.max(cfg.slots, 1)),
      "--name",
      "harness-drafter",
      "--log-level",
      "info", // the "listening" line is an info line
    ];
    let tls: { ca: string } | null = null;
    if (cfg.draftTransport === "tls") {
      const creds = makeTlsCredentials();
      writeFileSync(join(dir, "worker.crt"), creds.serverCert);
      writeFileSync(join(dir, "worker.key"), creds.serverKey);
      workerArgs.push("--tls-cert", join(dir, "worker.crt"), "--tls-key", join(dir, "worker.key"));
      tls = { ca: creds.ca };
    }
    const workerScript = binPath("@tapwire/worker", "tapwire-worker");
    // the worker's own metrics endpoint, re-served by ours (when this worker build has one)
    if (metricsAt !== null && workerHasMetricsListen(workerScript)) {
      const port = await freePort();
      workerArgs.push("--metrics-listen", `tcp://127.0.0.1:${port}`);
      workerMetricsUrl = `http://127.0.0.1:${port}/metrics`;
    }
    const worker = new ChildService({
      name: "worker",
      script: workerScript,
      args: [...workerArgs, "--listen", listen],
      ...(childLog ? { log: childLog } : {}),
    });
    watch(worker);
    cleanups.push(() => worker.kill("SIGTERM"));
    phase = "starting: the drafter worker";
    note(`starting the drafter worker (${cfg.draftTransport})`);
    const wl = await worker.start();
    const endpoints = wl["endpoints"];
    const workerEndpoint = Array.isArray(endpoints) && typeof endpoints[0] === "string" ? endpoints[0] : null;
    if (!workerEndpoint)
      throw new HarnessError(
        HarnessErrorCode.PROCESS,
        `worker listening line has no endpoints: ${JSON.stringify(wl)}`,
      );
    note(`worker pid ${worker.pid} listening on ${workerEndpoint}`);
    // a restart (faults) must come back on the same endpoint
    worker.setArgs([...workerArgs, "--listen", workerEndpoint]);

    // 3. the fault proxy between client and worker (tcp, --faults)
    let proxy: FaultProxy | null = null;
    let clientEndpoint = workerEndpoint;
    if (cfg.faults && cfg.draftTransport === "tcp") {
      proxy = await startFaultProxy(parseHostPort(workerEndpoint));
      const p = proxy;
      cleanups.push(() => p.close());
      clientEndpoint = proxy.endpoint;
    }

    // 4. the encoder (EC producer), the consumer connector and the media source
    const ecMetrics = new EcMediaMetrics(engineRegistry);
    const blockBytes = EC_BLOCK_BYTES;
    const blocksPerItem = Math.ceil(cfg.embeddingBytes / blockBytes);
    // room for every distinct item (up to 64) plus some in flight, at most 1 GiB per side: beyond
    // that the caches evict (LRU) and an item larger than the cache is encoded locally
    const cacheBlocks = Math.min(Math.max(64, blocksPerItem * (Math.min(cfg.mediaPool, 64) + 8)), 1 << 14);
    const compat = {
      modelId: "tapwire-harness-encoder",
      dtype: "bfloat16",
      hiddenSize: cfg.hidden,
      blockBytes,
    };
    const hb = { intervalMs: 250, timeoutMs: 1000, ttlMs: 2000 };
    let encoder: ChildService | null = null;
    let connector: ConsumerConnector | null = null;
    let admin: EcAdminClient | null = null;
    let adminEndpoint = "";
    let media: MediaSource;
    let ecMedia: EcMedia | null = null;
    let producerEndpoint = "";
    const fallbacks: string[] = [];
    if (cfg.mmShare > 0) {
      const dataListen = cfg.ecData === "unix" ? `unix://${join(dir, "ec-data.sock")}` : "tcp://127.0.0.1:0";
      const encoderArgs = (control: string) => [
        "--control",
        control,
        "--data",
        dataListen,
        "--num-blocks",
        String(cacheBlocks),
        "--block-bytes",
        String(blockBytes),
        "--model-id",
        compat.modelId,
        "--dtype",
        compat.dtype,
        "--hidden-size",
        String(compat.hiddenSize),
        "--encode-on-miss",
        "--miss-nbytes",
        String(cfg.embeddingBytes),
        "--encode-delay-ms",
        String(ENCODE_DELAY_MS),
        "--pin-lease-ms",
        "5000",
        "--heartbeat-ivl-ms",
        String(hb.intervalMs),
        "--heartbeat-timeout-ms",
        String(hb.timeoutMs),
        "--heartbeat-ttl-ms",
        String(hb.ttlMs),
        "--name",
        "harness-encoder",
        "--log-level",
        "info",
      ];
      const encoderScript = binPath("@tapwire/ec-connector", "tapwire-ec-producer");
      // the producer's own metrics endpoint, announced (not merged into ours: its tapwire_ec_
      // families would clash with the engine-side consumer's)
      const encoderMetrics: string[] = [];
      if (metricsAt !== null && binHasFlag(encoderScript, "--metrics-listen")) {
        const port = await freePort();
        encoderMetrics.push("--metrics-listen", `tcp://127.0.0.1:${port}`);
        encoderMetricsUrl = `http://127.0.0.1:${port}/metrics`;
      }
      encoder = new ChildService({
        name: "encoder",
        script: encoderScript,
        args: [...encoderArgs("tcp://127.0.0.1:0"), ...encoderMetrics],
        ...(childLog ? { log: childLog } : {}),
      });
      const enc = encoder;
      watch(enc);
      cleanups.push(() => enc.kill("SIGTERM"));
      phase = "starting: the encoder";
      note(`starting the encoder (EC producer, data plane ${cfg.ecData})`);
      const el = await encoder.start();
      producerEndpoint = String(el["control"] ?? "");
      if (!producerEndpoint.startsWith("tcp://")) {
        throw new HarnessError(
          HarnessErrorCode.PROCESS,
          `encoder listening line has no control endpoint: ${JSON.stringify(el)}`,
        );
      }
      note(`encoder pid ${encoder.pid} listening on ${producerEndpoint}`);
      // a restart (faults) must come back on the same control (and admin) endpoint
      const pinAdmin =
        typeof el["admin"] === "string" && binHasFlag(encoder.script, "--admin")
          ? ["--admin", el["admin"]]
          : [];
      encoder.setArgs([...encoderArgs(producerEndpoint), ...encoderMetrics, ...pinAdmin]);
      if (encoderMetricsUrl !== null) {
        note(`encoder metrics on ${encoderMetricsUrl} (also /healthz, /readyz)`);
        await hooks.onEncoderMetrics?.(encoderMetricsUrl);
      }
      const ecLogger = createLogger({
        name: "tapwire-ec",
        level: cfg.verbose ? "info" : "error",
        destination: 2,
      });
      connector = await ConsumerConnector.create({
        numBlocks: cacheBlocks,
        blockBytes,
        name: "harness-engine",
        compatibility: compat,
        ackTimeoutMs: 1000,
        readTimeoutMs: 3000,
        quarantineTimeoutMs: 5000,
        retry: { initialMs: 10, maxMs: 100 },
        heartbeat: hb,
        registry: ecRegistry,
        logger: ecLogger,
      });
      const conn = connector;
      cleanups.push(() => conn.close());
      // EC-CONTRACT 9: admin has its own loopback socket when the producer reports one
      adminEndpoint = typeof el["admin"] === "string" ? el["admin"] : producerEndpoint;
      admin = new EcAdminClient(adminEndpoint);
      cleanups.push(() => admin?.close());
      ecMedia = new EcMedia({
        connector,
        producer: producerEndpoint,
        nbytes: cfg.embeddingBytes,
        deadlineMs: cfg.ecDeadlineMs,
        metrics: ecMetrics,
        corruptFirstLoad: process.env[CORRUPT_ENV] === "1",
        onFallback: (h, why) => {
          if (fallbacks.length < 20) fallbacks.push(`${h.slice(0, 12)}: ${why}`);
        },
      });
      media = ecMedia;
    } else {
      media = new LocalMedia(cfg.embeddingBytes);
    }

    // 5. the rank-0 client, RoundCore and the depth policy
    const logger = createLogger({
      name: "tapwire-client",
      level: cfg.verbose ? "info" : "error",
      destination: 2,
    });
    const client = new RemoteDraftClient({
      endpoint: clientEndpoint,
      window: cfg.window,
      numSpec: cfg.numSpec,
      sampleMode: cfg.sample ? "top32" : "greedy",
      numTaps: cfg.numTaps,
      hidden: cfg.hidden,
      vocabSize: cfg.vocab,
      maxSlots: cfg.slots,
      maxRowsPerStep: cfg.slots * Math.max(cfg.window, cfg.numSpec + 1),
      drafterIdentity: head.drafterIdentity,
      markovIdentity: head.markovIdentity,
      requestTimeoutMs: cfg.stepTimeoutMs,
      connectTimeoutMs: Math.max(500, cfg.stepTimeoutMs),
      backoffMs: 25,
      backoffMaxMs: 400,
      clientName: "tapwire-harness",
      logger,
      registry: clientRegistry,
      ...(tls ? { transportOptions: { tls: { ca: tls.ca, servername: "localhost" } } } : {}),
    });
    metricsClient = client;
    cleanups.push(() => client.close());
    phase = "starting: connecting to the worker";
    note(`connecting to the worker at ${clientEndpoint}`);
    if (!(await client.waitReady(15_000))) {
      throw new HarnessError(
        HarnessErrorCode.PROCESS,
        `the drafter link did not become ready: ${client.disabledReason ?? client.lastError ?? "no reason"}`,
      );
    }
    const budget =
      cfg.budget ??
      piecewiseLinearBudget(cfg.loadCurve.map((p) => ({ batchSize: p.batch, tokens: p.tokens })));
    // --depth-policy (checked by the CLI): fixed:K, budget, or goodput (cost model + calibration)
    const depthSpec = parseDepthPolicy(cfg.depthPolicy, cfg.numSpec) ?? { kind: "goodput", calibrate: true };
    const depthSetup = makeDepthPolicy(depthSpec, { numSpec: cfg.numSpec, budget });
    const depthStats = new DepthRunStats(depthSpec, depthSetup, cfg.numSpec);
    const policy = depthSetup.policy;
    const core = new RoundCore({ client, depthPolicy: policy });
    const link = new RoundCoreLink(core);

    // 7. the run
    const { requests } = makeWorkload(cfg);
    const metrics = new EngineMetrics(engineRegistry);
    const outcomes = () => metrics.outcomeCounts();
    const faults = cfg.faults
      ? new FaultDriver({
          worker,
          encoder,
          proxy,
          linkEpoch: () => client.epoch,
          ready: () => client.ready,
          ecOk: () => ecMetrics.transfers.value + ecMetrics.probes.value,
          probeEncoder: () => ecMedia?.probe(),
          ecInFlight: () => ecMedia?.pending ?? 0,
          counters: () => {
            const snap = clientRegistry.snapshot().counters;
            const c: Record<string, number> = {};
            for (const [k, v] of Object.entries(outcomes())) c[`outcome_${k}`] = v;
            c["hellos"] = snap["hellos"] ?? 0;
            c["connect_failures"] = snap["connect_failures"] ?? 0;
            c["disconnects"] = snap["disconnects"] ?? 0;
            c["new_sessions"] = snap["new_sessions"] ?? 0;
            c["resync_entries"] = metrics.resyncs.value;
            const ec = ecRegistry.snapshot().counters;
            c["ec_retries"] = ec["connector_retries"] ?? 0;
            c["ec_failed"] = ec["connector_failed"] ?? 0;
            c["ec_peer_down"] = ec["consumer_peer_down"] ?? 0;
            c["ec_quarantines"] = ec["consumer_quarantines"] ?? 0;
            c["ec_fallbacks"] = ecMetrics.fallbacks.value;
            c["ec_transfers"] = ecMetrics.transfers.value;
            c["ec_probes"] = ecMetrics.probes.value;
            return c;
          },
          stepTimeoutMs: cfg.stepTimeoutMs,
          log: note,
        })
      : null;
    const engine = new Engine({
      cfg,
      target,
      requests,
      link,
      media,
      budgetFor: (b) => (cfg.budget !== null ? cfg.budget : budgetFromCurve(cfg.loadCurve, b)),
      metrics,
      onVerified: depthStats.onVerified,
      onRoundVerified: depthStats.onRoundVerified,
      ...(faults ? { arrivalCap: faults.arrivalCap } : {}),
      onRound: async (p) => {
        progress.update({
          phase: "decoding",
          done: p.completed,
          total: p.total,
          tokens: metrics.tokensGenerated.value,
          rounds: metrics.rounds.value,
          meanAccepted:
            metrics.verificationsWithDrafts.value > 0
              ? metrics.acceptedLengthSum.value / metrics.verificationsWithDrafts.value
              : 0,
          ecLoaded: ecMetrics.transfers.value,
          faults: faults?.injected.length ?? 0,
        });
        await faults?.hook(p);
      },
    });
    note(
      `decoding ${requests.length} requests (S=${cfg.slots}, N=${cfg.numSpec}, ${cfg.sample ? "sampled" : "greedy"})`,
    );
    phase = "decoding";
    decoding = true;
    await hooks.onDecoding?.();
    decodeStartEpoch = Date.now();
    const res = await engine.run();
    await hooks.onDecoded?.();
    decoding = false;
    phase = "finished decoding: checking the output";
    await faults?.settle();
    progress.finish();
    const drained = ecMedia ? await ecMedia.drain(10_000) : true;

    // 8. the worker's own stats, then the reference decode
    let workerStats: Record<string, unknown> = {};
    try {
      workerStats = (await client.stats()) as Record<string, unknown>;
    } catch (e) {
      workerStats = { error: e instanceof Error ? e.message : String(e) };
    }
    note("decoding the same requests target-only for the lossless check");
    const tRef = performance.now();
    const scratch = new SampleScratch(cfg.vocab);
    const reference = new Map<number, number[]>();
    for (const r of requests) {
      const extra = mediaConditioning(r.media.map((h) => localEmbedding(h, cfg.embeddingBytes)));
      reference.set(r.id, decodeTargetOnly(target, r, extra, cfg, scratch));
    }
    const refSeconds = (performance.now() - tRef) / 1000;
    const lossless = cfg.sample
      ? checkSampled(requests, res.outputs, reference)
      : checkGreedy(requests, res.outputs, reference);

    // 9. end state of both caches: no pin, no grant, no block in flight or retired
    // a restarted encoder (--faults) may listen for admin on a new port: follow its last line
    const lastAdmin = encoder?.listening?.["admin"];
    if (admin !== null && typeof lastAdmin === "string" && lastAdmin !== adminEndpoint) {
      admin.close();
      adminEndpoint = lastAdmin;
      admin = new EcAdminClient(adminEndpoint);
    }
    const leaks = await endState(connector, admin, drained);
    const notes = fallbacks.map((f) => `local fallback for media ${f}`);
    const ecCounters = ecRegistry.snapshot().counters;
    const producerCounters = leaks.producerCounters;

    // 10. report
    const cs = clientRegistry.snapshot();
    const m = metrics;
    const generated = m.tokensGenerated.value;
    const wallSeconds = res.wallMs / 1000;
    const report: Report = {
      tool: "tapwire-harness",
      ok: false,
      config: { ...cfg, loadCurve: cfg.loadCurve.map((p) => `${p.batch}:${p.tokens}`).join(",") },
      lossless,
      requests: {
        total: requests.length,
        completed: m.requestsCompleted.value,
        multimodal: requests.filter((r) => r.media.length > 0).length,
        mediaItems: requests.reduce((a, r) => a + r.media.length, 0),
      },
      tokens: {
        generated,
        prompt: m.promptTokens.value,
        targetOnlyGenerated: [...reference.values()].reduce((a, o) => a + o.length, 0),
      },
      rounds: {
        total: m.rounds.value,
        withDrafts: m.roundsWithDrafts.value,
        targetOnly: m.roundsTargetOnly.value,
      },
      speculation: {
        targetForwards: m.targetForwards.value,
        draftsReceived: m.draftsReceived.value,
        draftsVerified: m.draftsVerified.value,
        draftsAccepted: m.draftsAccepted.value,
        acceptanceRate: m.draftsVerified.value > 0 ? m.draftsAccepted.value / m.draftsVerified.value : 0,
        meanAcceptedLength:
          m.verificationsWithDrafts.value > 0
            ? m.acceptedLengthSum.value / m.verificationsWithDrafts.value
            : 0,
        tokensPerTargetForward: m.targetForwards.value > 0 ? generated / m.targetForwards.value : 0,
        meanBudget: m.roundsWithDrafts.value > 0 ? m.budgetSum.value / m.roundsWithDrafts.value : 0,
        draftsSkippedByPolicy: m.draftsSkipped.value,
      },
      depthPolicy: depthStats.report(generated),
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
        targetOnlySeconds: refSeconds,
      },
      ec: {
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
        producer: producerCounters,
      },
      client: {
        outcomes: m.outcomeCounts(),
        hellos: cs.counters["hellos"] ?? 0,
        reconnects: Math.max(0, (cs.counters["hellos"] ?? 0) - 1),
        resyncs: m.resyncs.value,
        newSessions: cs.counters["new_sessions"] ?? 0,
        connectFailures: cs.counters["connect_failures"] ?? 0,
        disabledReason: client.disabledReason ?? "",
        other: cs.counters,
      },
      worker: workerStats,
      faults: { enabled: cfg.faults, injected: faults ? [...faults.injected] : [] },
      notes,
      processes: {
        worker: { pids: [...worker.pids], starts: worker.starts },
        encoder: encoder ? { pids: [...encoder.pids], starts: encoder.starts } : null,
        unexpectedExits: deaths.map((d) => toDeath(d, decodeStartEpoch)),
      },
      leaks: {
        ok: leaks.ok,
        status: leaks.status,
        consumerPinnedBlocks: leaks.consumerPinnedBlocks,
        consumerInFlightBlocks: leaks.consumerInFlightBlocks,
        consumerRetiredBlocks: leaks.consumerRetiredBlocks,
        producerPinnedBlocks: leaks.producerPinnedBlocks,
        producerGrants: leaks.producerGrants,
        notes: leaks.notes,
      },
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
      lossless.ok &&
      report.leaks.ok &&
      report.requests.completed === report.requests.total &&
      deaths.length === 0;
    // a child that died on its own is a process failure (3), even when the output stayed lossless
    return { report, exitCode: report.ok ? 0 : deaths.length > 0 ? 3 : 1 };
  } catch (e) {
    if (deaths.length > 0 && e instanceof Error) e.message += ` (${deathText()})`;
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
