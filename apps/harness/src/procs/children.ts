/**
 * Starting the run's child processes: the drafter worker and the encoder (EC producer), each with
 * the arguments that make a restart (`--faults`) come back on the same endpoints.
 */
import { writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { freePort, makeTlsCredentials } from "@tapwire/testing";
import type { HarnessConfig } from "../cli/cli.js";
import { HarnessError, HarnessErrorCode } from "../errors.js";
import { binHasFlag, workerHasMetricsListen } from "../report/worker-metrics.js";
import { binPath, ChildService } from "./procs.js";
import type { ServerRole, Topology } from "./topology.js";

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
  /** Where the children run and bind, and how the engine reaches them (`--topology`). */
  topology: Topology;
}

/** The namespace option of a child of `role` (none with the local topology). */
function placement(scope: RunScope, role: ServerRole): { netns?: string } {
  const netns = scope.topology.netnsOf(role);
  return netns === undefined ? {} : { netns };
}

/** `--advertise <address>` when a server of `role` binds a wildcard (netns), nothing locally. */
function advertiseArgs(scope: RunScope, role: ServerRole): string[] {
  const t = scope.topology;
  return t.bindHost(role) === t.address(role) ? [] : ["--advertise", t.address(role)];
}

/** `endpoint` (as advertised) with the bind host back in place: what a restart listens on. */
function rebind(endpoint: string, host: string): string {
  return endpoint.replace(/^([a-z+]+:\/\/).+(:\d+)$/, `$1${host}$2`);
}

/** Makes the port of each `scheme://host:port` endpoint of a server reachable from the engine. */
async function exposeAll(scope: RunScope, role: ServerRole, endpoints: readonly unknown[]): Promise<void> {
  for (const e of endpoints) {
    if (typeof e === "string" && /:\d+$/.test(e)) await scope.topology.expose(role, parseHostPort(e).port);
  }
}

function endpointFor(transport: HarnessConfig["draftTransport"], dir: string, host: string): string {
  switch (transport) {
    case "tcp":
      return `tcp://${host}:0`;
    case "tls":
      return `tls://${host}:0`;
    case "zmq":
      return `zmq+tcp://${host}:0`;
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

/** The worker flags of a run (drafter, geometry, name); the caller adds `--listen` and the rest. */
export function workerArgsFor(cfg: HarnessConfig, weights: string): string[] {
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

/**
 * The entry file of the harness's own `@tapwire/drafter-onnx` (a dependency), for the worker's
 * `TAPWIRE_DRAFTER_ONNX`; null when it cannot be resolved (not built: the worker then says so).
 */
function onnxDrafterEntry(): string | null {
  try {
    return createRequire(import.meta.url).resolve("@tapwire/drafter-onnx");
  } catch {
    return null;
  }
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
  const bind = scope.topology.bindHost("worker");
  const host = scope.topology.address("worker");
  const listen = endpointFor(cfg.draftTransport, dir, bind);
  const workerArgs = [...workerArgsFor(cfg, weights), ...advertiseArgs(scope, "worker")];
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
    // free here; in a namespace of its own (netns) every port is free
    const port = await freePort();
    workerArgs.push("--metrics-listen", `tcp://${host}:${port}`);
    scope.urls.worker = `http://${host}:${port}/metrics`;
    await scope.topology.expose("worker", port);
  }
  const onnx = onnxDrafterEntry();
  const worker = new ChildService({
    name: "worker",
    script: workerScript,
    args: [...workerArgs, "--listen", listen],
    exitWithParent: binHasFlag(workerScript, "--exit-with-parent"),
    // --drafter onnx: the drafter package the harness depends on, whatever the cwd (issue 19)
    ...(onnx !== null ? { env: { TAPWIRE_DRAFTER_ONNX: onnx } } : {}),
    ...(scope.childLog ? { log: scope.childLog } : {}),
    ...placement(scope, "worker"),
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
  await exposeAll(scope, "worker", [endpoint]);
  const bound =
    Array.isArray(wl["bind"]) && wl["bind"][0] !== endpoint ? ` (bound ${String(wl["bind"][0])})` : "";
  scope.note(`worker pid ${worker.pid} listening on ${endpoint}${bound}`);
  // a restart (faults) must come back on the same endpoint
  worker.setArgs([
    ...workerArgs,
    "--listen",
    endpoint.startsWith("unix:") ? endpoint : rebind(endpoint, bind),
  ]);
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

function encoderArgsFor(
  cfg: HarnessConfig,
  dir: string,
  geo: EcGeometry,
  host: string,
  name?: string,
): (control: string, data?: string) => string[] {
  const dataListen =
    cfg.ecData === "tcp"
      ? `tcp://${host}:0`
      : // shm: the same unix socket, also offering rings (docs/ec-protocol.md 3.4)
        `${cfg.ecData === "shm" ? "shm+unix" : "unix"}://${join(dir, `${name ?? "ec"}-data.sock`)}`;
  const { compat, hb } = geo;
  return (control: string, data = dataListen) => [
    "--control",
    control,
    "--data",
    data,
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
    `harness-${name ?? "encoder"}`,
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
export async function startEncoder(
  scope: RunScope,
  geo: EcGeometry,
  more: { name?: string; args?: string[] } = {},
): Promise<StartedEncoder> {
  const { cfg } = scope;
  const bind = scope.topology.bindHost("encoder");
  const host = scope.topology.address("encoder");
  const base = encoderArgsFor(cfg, scope.dir, geo, bind, more.name);
  const encoderArgs = (control: string, data?: string) => [...base(control, data), ...(more.args ?? [])];
  const encoderScript = binPath("@tapwire/ec-connector", "tapwire-ec-producer");
  // the producer's own metrics endpoint, announced (not merged into ours: its tapwire_ec_
  // families would clash with the engine-side consumer's)
  const encoderMetrics: string[] = [];
  if (more.name === undefined && scope.metricsAt !== null && binHasFlag(encoderScript, "--metrics-listen")) {
    const port = await freePort();
    encoderMetrics.push("--metrics-listen", `tcp://${host}:${port}`);
    scope.urls.encoder = `http://${host}:${port}/metrics`;
    await scope.topology.expose("encoder", port);
  }
  // over a network the engine's leak check asks the admin socket from its own host
  const remoteAdmin = scope.topology.remote ? ["--admin", `tcp://${host}:0`, "--admin-allow-remote"] : [];
  const advertise = advertiseArgs(scope, "encoder");
  const encoder = new ChildService({
    name: more.name ?? "encoder",
    script: encoderScript,
    exitWithParent: binHasFlag(encoderScript, "--exit-with-parent"),
    args: [...encoderArgs(`tcp://${bind}:0`), ...encoderMetrics, ...remoteAdmin, ...advertise],
    ...(scope.childLog ? { log: scope.childLog } : {}),
    ...placement(scope, "encoder"),
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
  await exposeAll(scope, "encoder", [el["control"], el["data"], el["admin"]]);
  const cb = (el["bind"] as { control?: unknown } | undefined)?.control;
  const encBound = typeof cb === "string" && cb !== producerEndpoint ? ` (bound ${cb})` : "";
  scope.note(`encoder pid ${encoder.pid} listening on ${producerEndpoint}${encBound}`);
  // a restart (faults) must come back on the same control (and admin) endpoint; over a network
  // on the same data port too (the relay forwards the ports it was told)
  const pinAdmin =
    typeof el["admin"] === "string" && binHasFlag(encoder.script, "--admin") ? ["--admin", el["admin"]] : [];
  const pinData =
    scope.topology.remote && typeof el["data"] === "string" ? rebind(el["data"], bind) : undefined;
  // EC-CONTRACT 10: the events and replay endpoints too (a subscriber reconnects to them)
  const pinEvents =
    typeof el["events"] === "string" && typeof el["replay"] === "string"
      ? ["--events-listen", el["events"], "--replay-listen", el["replay"]]
      : [];
  encoder.setArgs([
    ...base(rebind(producerEndpoint, bind), pinData),
    ...advertise,
    ...encoderMetrics,
    ...pinAdmin,
    ...(pinAdmin.length > 0 && scope.topology.remote ? ["--admin-allow-remote"] : []),
    ...(pinEvents.length > 0 ? pinEvents : (more.args ?? [])),
  ]);
  return { encoder, producerEndpoint, listening: el };
}
