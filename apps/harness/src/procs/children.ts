/**
 * Starting the run's child processes: the drafter worker and the encoder (EC producer), each with
 * the arguments that make a restart (`--faults`) come back on the same endpoints.
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { freePort, makeTlsCredentials } from "@tapwire/testing";
import type { HarnessConfig } from "../cli/cli.js";
import { HarnessError, HarnessErrorCode } from "../errors.js";
import { binHasFlag, workerHasMetricsListen } from "../report/worker-metrics.js";
import { binPath, ChildService } from "./procs.js";

/** Block size of both encoder caches (64 KiB, the EC connector's default). */
export const EC_BLOCK_BYTES = 65_536;
/** Simulated encode time of the encoder per item, ms. */
export const ENCODE_DELAY_MS = 15;

/** What the run's steps share: its temp dir, its cleanups and how it reports progress. */
export interface RunScope {
  cfg: HarnessConfig;
  dir: string;
  /** Run in reverse order when the run ends, however it ends. */
  cleanups: Array<() => Promise<void> | void>;
  note: (m: string) => void;
  /** Registers a child whose unexpected exits fail the run. */
  watch: (svc: ChildService) => void;
  childLog: ((l: string) => void) | undefined;
  /** What `/readyz` answers while the run starts. */
  setPhase: (phase: string) => void;
  /** `--metrics-listen` / `--metrics-port`, or null. */
  metricsAt: string | null;
  /** The children's own metrics endpoints, set once known (read by our `/metrics`). */
  urls: { worker: string | null; encoder: string | null };
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
    case "shm":
      // issue 23: doorbells on a unix socket, rows through a /dev/shm mapping
      return `shm+unix://${join(dir, "worker.sock")}`;
  }
}

/** `host` and `port` of a `scheme://host:port` endpoint. */
export function parseHostPort(endpoint: string): { host: string; port: number } {
  const m = /^[a-z+]+:\/\/(.+):(\d+)$/.exec(endpoint);
  if (!m) throw new HarnessError(HarnessErrorCode.INTERNAL, `cannot parse endpoint ${endpoint}`);
  return { host: m[1] as string, port: Number(m[2]) };
}

function workerArgsFor(cfg: HarnessConfig, weights: string): string[] {
  return [
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
}

/** The started drafter worker. */
export interface StartedWorker {
  worker: ChildService;
  endpoint: string;
  /** The CA the client must trust (`--draft-transport tls`). */
  tls: { ca: string } | null;
}

/** Starts the drafter worker serving the head saved at `weights`. */
export async function startWorker(scope: RunScope, weights: string): Promise<StartedWorker> {
  const { cfg, dir } = scope;
  const listen = endpointFor(cfg.draftTransport, dir);
  const workerArgs = workerArgsFor(cfg, weights);
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
  if (scope.metricsAt !== null && workerHasMetricsListen(workerScript)) {
    const port = await freePort();
    workerArgs.push("--metrics-listen", `tcp://127.0.0.1:${port}`);
    scope.urls.worker = `http://127.0.0.1:${port}/metrics`;
  }
  const worker = new ChildService({
    name: "worker",
    script: workerScript,
    args: [...workerArgs, "--listen", listen],
    ...(scope.childLog ? { log: scope.childLog } : {}),
  });
  scope.watch(worker);
  scope.cleanups.push(() => worker.kill("SIGTERM"));
  scope.setPhase("starting: the drafter worker");
  scope.note(`starting the drafter worker (${cfg.draftTransport})`);
  const wl = await worker.start();
  const endpoints = wl["endpoints"];
  const endpoint = Array.isArray(endpoints) && typeof endpoints[0] === "string" ? endpoints[0] : null;
  if (!endpoint)
    throw new HarnessError(
      HarnessErrorCode.PROCESS,
      `worker listening line has no endpoints: ${JSON.stringify(wl)}`,
    );
  scope.note(`worker pid ${worker.pid} listening on ${endpoint}`);
  // a restart (faults) must come back on the same endpoint
  worker.setArgs([...workerArgs, "--listen", endpoint]);
  return { worker, endpoint, tls };
}

/** The encoder cache geometry and compatibility both sides of the EC link share. */
export interface EcGeometry {
  cacheBlocks: number;
  compat: { modelId: string; dtype: string; hiddenSize: number; blockBytes: number };
  hb: { intervalMs: number; timeoutMs: number; ttlMs: number };
}

/** The cache geometry for `cfg`. */
export function ecGeometry(cfg: HarnessConfig): EcGeometry {
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
  return { cacheBlocks, compat, hb: { intervalMs: 250, timeoutMs: 1000, ttlMs: 2000 } };
}

function encoderArgsFor(cfg: HarnessConfig, dir: string, geo: EcGeometry): (control: string) => string[] {
  const dataListen = cfg.ecData === "unix" ? `unix://${join(dir, "ec-data.sock")}` : "tcp://127.0.0.1:0";
  const { compat, hb } = geo;
  return (control: string) => [
    "--control",
    control,
    "--data",
    dataListen,
    "--num-blocks",
    String(geo.cacheBlocks),
    "--block-bytes",
    String(compat.blockBytes),
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
}

/** The started encoder. */
export interface StartedEncoder {
  encoder: ChildService;
  /** Its control endpoint (`tcp://`). */
  producerEndpoint: string;
  /** The `listening` line it printed. */
  listening: Record<string, unknown>;
}

/** Starts the encoder (EC producer) with the cache geometry `geo`. */
export async function startEncoder(scope: RunScope, geo: EcGeometry): Promise<StartedEncoder> {
  const { cfg } = scope;
  const encoderArgs = encoderArgsFor(cfg, scope.dir, geo);
  const encoderScript = binPath("@tapwire/ec-connector", "tapwire-ec-producer");
  // the producer's own metrics endpoint, announced (not merged into ours: its tapwire_ec_
  // families would clash with the engine-side consumer's)
  const encoderMetrics: string[] = [];
  if (scope.metricsAt !== null && binHasFlag(encoderScript, "--metrics-listen")) {
    const port = await freePort();
    encoderMetrics.push("--metrics-listen", `tcp://127.0.0.1:${port}`);
    scope.urls.encoder = `http://127.0.0.1:${port}/metrics`;
  }
  const encoder = new ChildService({
    name: "encoder",
    script: encoderScript,
    args: [...encoderArgs("tcp://127.0.0.1:0"), ...encoderMetrics],
    ...(scope.childLog ? { log: scope.childLog } : {}),
  });
  scope.watch(encoder);
  scope.cleanups.push(() => encoder.kill("SIGTERM"));
  scope.setPhase("starting: the encoder");
  scope.note(`starting the encoder (EC producer, data plane ${cfg.ecData})`);
  const el = await encoder.start();
  const producerEndpoint = String(el["control"] ?? "");
  if (!producerEndpoint.startsWith("tcp://")) {
    throw new HarnessError(
      HarnessErrorCode.PROCESS,
      `encoder listening line has no control endpoint: ${JSON.stringify(el)}`,
    );
  }
  scope.note(`encoder pid ${encoder.pid} listening on ${producerEndpoint}`);
  // a restart (faults) must come back on the same control (and admin) endpoint
  const pinAdmin =
    typeof el["admin"] === "string" && binHasFlag(encoder.script, "--admin") ? ["--admin", el["admin"]] : [];
  encoder.setArgs([...encoderArgs(producerEndpoint), ...encoderMetrics, ...pinAdmin]);
  return { encoder, producerEndpoint, listening: el };
}
