#!/usr/bin/env node
/**
 * `tapwire-worker`: runs a drafter worker (CONTRACT 5-11) until SIGINT/SIGTERM.
 * Logs pino JSON lines to stdout (the shared `createLogger` setup of `@tapwire/stats`); once bound
 * it logs `{"msg":"listening","endpoints":[...]}`. Exit codes (./exit.ts): 2 usage or configuration
 * (one line naming the flag), 75 a listener that cannot bind yet (address in use), 1 other failures.
 */
import { closeSync, openSync, readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import type { Advertised, Logger, MetricsServer } from "@tapwire/stats";
import {
  advertiseEndpoint,
  createLogger,
  flushAndExit,
  pageRoute,
  parseAdvertise,
  parseLogLevel,
  parseMetricsListen,
  Registry,
  registryPage,
  serveMetrics,
  sseRoute,
  watchParent,
} from "@tapwire/stats";
import { TraceWriter } from "@tapwire/trace";
import { parseEndpoint } from "@tapwire/transport";
import type { Drafter } from "../drafter.js";
import { NullDrafter } from "../drafter.js";
import { WorkerError } from "../errors.js";
import type { Worker } from "../worker.js";
import { createWorker } from "../worker.js";
import { BindError, errnoOf, exitCodeOf } from "./exit.js";
import type { ParsedFlags } from "./flags.js";
import { FLAGS, helpText, intFlag, numFlag, parseFlags, strFlag, UsageError } from "./flags.js";
import { printIdentities } from "./identities.js";
import { locateOnnxDrafter } from "./onnx-import.js";
import { checkRegisterFlags, startRegistration } from "./register.js";

function hex32(name: string, v: string | undefined): Uint8Array | undefined {
  if (v === undefined) return undefined;
  if (!/^[0-9a-fA-F]{64}$/.test(v)) throw new UsageError(`--${name} must be 64 hex digits`);
  return new Uint8Array(Buffer.from(v, "hex"));
}

function defined<T extends object>(o: T): { [K in keyof T]: Exclude<T[K], undefined> } {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as never;
}

/** Every usage check that needs no I/O, before anything is bound or loaded. */
function checkUsage(p: ParsedFlags): void {
  for (const ep of p.listen ?? []) {
    try {
      parseEndpoint(ep);
    } catch (e) {
      throw new UsageError(`--listen ${ep}: ${e instanceof Error ? e.message : String(e)}`);
    }
  }
  if ((p["tls-cert"] === undefined) !== (p["tls-key"] === undefined)) {
    throw new UsageError("--tls-cert and --tls-key go together");
  }
  if (p.advertise !== undefined) advertiseOrUsage(() => parseAdvertise(p.advertise!));
  hex32("drafter-identity", p["drafter-identity"]);
  hex32("markov-identity", p["markov-identity"]);
  checkRegisterFlags(p); // --register (issue 21)
  if (p.ui === true && p["metrics-listen"] === undefined) {
    throw new UsageError(
      "--ui serves its page on the --metrics-listen endpoint: give --metrics-listen tcp://HOST:PORT",
    );
  }
  const rows = p["trace-rows"];
  if (
    rows !== undefined &&
    rows !== "all" &&
    rows !== "none" &&
    !(/^[1-9]\d{0,4}$/.test(rows) && Number(rows) <= 65535)
  ) {
    throw new UsageError(`--trace-rows ${rows} is not all, none or an integer 1..65535`);
  }
}

async function buildDrafter(p: ParsedFlags): Promise<Drafter> {
  const geom = {
    vocabSize: intFlag(p, "vocab")!,
    numTaps: intFlag(p, "num-taps")!,
    hidden: intFlag(p, "hidden")!,
    window: intFlag(p, "window")!,
    numSpec: intFlag(p, "num-spec")!,
  };
  if (strFlag(p, "drafter") === "null") {
    return new NullDrafter(
      defined({
        ...geom,
        drafterIdentity: hex32("drafter-identity", p["drafter-identity"]),
        markovIdentity: hex32("markov-identity", p["markov-identity"]),
      }),
    );
  }
  if (strFlag(p, "drafter") === "onnx") return onnxDrafter(p);
  // Loaded only when asked for: the null drafter needs no model code.
  const rm = await import("@tapwire/reference-model");
  const { ReferenceDrafter } = await import("../reference-drafter.js");
  if (p.weights !== undefined) {
    const given = (name: "window" | "num-spec") => (p[name] !== undefined ? Number(p[name]) : undefined);
    return new ReferenceDrafter(
      loadHead(rm, p.weights, p),
      defined({ window: given("window"), numSpec: given("num-spec") }),
    );
  }
  const target = rm.TargetModel.create({
    ...rm.DEFAULT_TARGET_CONFIG,
    seed: intFlag(p, "seed")!,
    vocabSize: geom.vocabSize,
    stateDim: intFlag(p, "state-dim")!,
    numTaps: geom.numTaps,
    hidden: geom.hidden,
  });
  const head = rm.DraftHead.distill(target, {
    ...rm.DEFAULT_DRAFT_CONFIG,
    window: geom.window,
    numSpec: geom.numSpec,
    seed: intFlag(p, "draft-seed")!,
    rank: intFlag(p, "draft-rank")!,
    noise: numFlag(p, "draft-noise")!,
    markovRank: intFlag(p, "draft-markov-rank")!,
  });
  return new ReferenceDrafter(head, { window: geom.window, numSpec: geom.numSpec });
}

/**
 * `--weights FILE`: the geometry comes from the file; `--vocab`, `--state-dim`, `--num-taps` and
 * `--hidden`, when given, must agree with it. An unreadable file, one that is not a draft head and
 * a disagreeing flag are usage errors (exit 2) naming the flag and the file.
 */
function loadHead(
  rm: typeof import("@tapwire/reference-model"),
  file: string,
  p: ParsedFlags,
): import("@tapwire/reference-model").DraftHead {
  let bytes: Uint8Array;
  try {
    bytes = readFileSync(file);
  } catch (e) {
    throw new UsageError(`--weights ${file}: cannot read it (${errnoOf(e) ?? (e as Error).message})`);
  }
  let head: import("@tapwire/reference-model").DraftHead;
  try {
    head = rm.DraftHead.fromSafetensors(bytes);
  } catch (e) {
    const code = (e as { code?: unknown }).code;
    throw new UsageError(
      `--weights ${file}: not a draft head safetensors file (${String(code ?? "error")}: ${(e as Error).message}; docs/operations.md "Exporting a head")`,
    );
  }
  for (const [flag, got] of [
    ["vocab", head.vocabSize],
    ["state-dim", head.stateDim],
    ["num-taps", head.numTaps],
    ["hidden", head.hidden],
  ] as const) {
    if (p[flag] !== undefined && Number(p[flag]) !== got) {
      throw new UsageError(`--${flag} ${p[flag]} differs from the head's ${got} (--weights ${file})`);
    }
  }
  return head;
}

/** What this bin uses of @tapwire/drafter-onnx (no type dependency: that package depends on this one). */
interface OnnxDrafterModule {
  OnnxDrafter: { create(model: string, options: Record<string, unknown>): Promise<Drafter> };
}

/** @tapwire/drafter-onnx by the rules of `onnx-import.ts` (any working directory of the workspace). */
async function importOnnxDrafter(): Promise<OnnxDrafterModule> {
  return (await import(pathToFileURL(locateOnnxDrafter()).href)) as OnnxDrafterModule;
}

/** `--drafter onnx`: geometry from the model; the flags given must agree with it. */
async function onnxDrafter(p: ParsedFlags): Promise<Drafter> {
  const model = p.model;
  if (model === undefined) {
    throw new UsageError("--drafter onnx needs --model FILE (.onnx, or a reference head .safetensors)");
  }
  const given = (name: "window" | "num-spec") => (p[name] !== undefined ? Number(p[name]) : undefined);
  const { OnnxDrafter } = await importOnnxDrafter();
  let d: Drafter;
  try {
    d = await OnnxDrafter.create(
      model,
      defined({
        window: given("window"),
        numSpec: given("num-spec"),
        intraOpThreads: intFlag(p, "onnx-threads"),
        interOpThreads: intFlag(p, "onnx-inter-threads"),
        executionProvider: strFlag(p, "onnx-provider"),
        cudaDeviceId: p["onnx-cuda-device"] !== undefined ? intFlag(p, "onnx-cuda-device") : undefined,
        graphOptimization: strFlag(p, "onnx-optimization"),
      }),
    );
  } catch (e) {
    const code = (e as { code?: unknown }).code;
    const msg = `${typeof code === "string" ? `${code}: ` : ""}${(e as Error).message}`;
    // An unreadable or invalid model is configuration (exit 2), named by its flag and file.
    if (typeof code === "string" && /BAD_MODEL|BAD_OPTION/.test(code))
      throw new UsageError(`--model ${model}: ${msg}`);
    throw new Error(msg, { cause: e });
  }
  for (const [flag, got] of [
    ["vocab", d.vocabSize],
    ["num-taps", d.numTaps],
    ["hidden", d.hidden],
  ] as const) {
    if (p[flag] !== undefined && Number(p[flag]) !== got) {
      throw new WorkerError("WORKER_BAD_OPTION", `--${flag} ${p[flag]} differs from the model's ${got}`);
    }
  }
  return d;
}

/** A file a flag names; unreadable: a usage error naming both (exit 2). */
function readFlagFile(flag: string, file: string): Buffer {
  try {
    return readFileSync(file);
  } catch (e) {
    throw new UsageError(`--${flag} ${file}: cannot read it (${errnoOf(e) ?? (e as Error).message})`);
  }
}

function tlsOf(p: ParsedFlags) {
  const cert = p["tls-cert"];
  const key = p["tls-key"];
  if (cert === undefined || key === undefined) return undefined;
  return {
    cert: readFlagFile("tls-cert", cert),
    key: readFlagFile("tls-key", key),
    ...(p["tls-ca"] !== undefined ? { ca: readFlagFile("tls-ca", p["tls-ca"]), requestCert: true } : {}),
  };
}

/** `--ui` (issue 24): the live page of the worker's own metrics and its event stream. */
function liveRoutes(state: { worker: Worker | null; closing: boolean }) {
  const events = sseRoute(() => state.worker?.stats() ?? { phase: "drafter loading" }, { intervalMs: 500 });
  return { "/": pageRoute(registryPage("tapwire-worker")), "/events": events };
}

/** `--trace FILE` (issue 24): a TraceWriter of the worker's frames, or null. */
function openTrace(p: ParsedFlags): TraceWriter | null {
  const path = p.trace;
  if (path === undefined) return null;
  const r = strFlag(p, "trace-rows")!;
  // fail at start, not at shutdown: the writer opens its file in the background
  try {
    closeSync(openSync(path, "w"));
  } catch (e) {
    throw new UsageError(`--trace ${path}: cannot be written (${errnoOf(e) ?? String(e)})`);
  }
  return new TraceWriter({ path, source: "worker", rows: r === "all" || r === "none" ? r : Number(r) });
}

/** The metrics endpoint, up before the drafter loads so that /readyz can say it is loading. */
async function startMetrics(
  p: ParsedFlags,
  registry: Registry,
  state: { worker: Worker | null; closing: boolean },
): Promise<MetricsServer | null> {
  const at = p["metrics-listen"];
  if (at === undefined) return null;
  const { host, port } = parseMetricsListen(at);
  try {
    return await serveMetrics([registry], port, host, {
      extra: () => state.worker?.core.clientMetricsText() ?? "",
      ready: () => (state.closing ? "closing" : state.worker !== null ? true : "drafter loading"),
      ...(p.ui === true ? { routes: liveRoutes(state) } : {}),
    });
  } catch (e) {
    const errno = errnoOf(e);
    throw new BindError(`--metrics-listen ${at}: cannot bind (${errno ?? (e as Error).message})`, errno, {
      cause: e,
    });
  }
}

async function run(p: ParsedFlags, log: Logger, stopSignal: Promise<string>): Promise<number> {
  const registry = new Registry({ prefix: "tapwire_worker_" });
  const state: { worker: Worker | null; closing: boolean } = { worker: null, closing: false };
  const metrics = await startMetrics(p, registry, state);
  const drafter = await buildDrafter(p);
  const token = p.token ?? process.env.TAPWIRE_TOKEN;
  const inPlace = p["receive-in-place"] ?? process.env.TAPWIRE_WORKER_RECEIVE_IN_PLACE ?? "yes";
  if (inPlace !== "yes" && inPlace !== "no") {
    throw new UsageError(`TAPWIRE_WORKER_RECEIVE_IN_PLACE ${inPlace} is not yes or no`);
  }
  const takeover = p.takeover as "allow" | "refuse" | undefined;
  const trace = openTrace(p);
  const worker = await bindOrExplain(() =>
    createWorker(
      defined({
        drafter,
        registry,
        listen: p.listen ?? [String(FLAGS.listen.default)],
        maxSlots: intFlag(p, "max-slots"),
        maxRowsPerStep: intFlag(p, "max-rows-per-step"),
        maxConnections: intFlag(p, "max-connections"),
        maxBufferedBytes: intFlag(p, "max-buffered-bytes"),
        unboundIdleMs: intFlag(p, "unbound-idle-ms"),
        token: token === "" ? undefined : token,
        takeover,
        sessionLease: intFlag(p, "session-lease-ms"),
        maxSessions: intFlag(p, "max-sessions"),
        maxWindowBytes: intFlag(p, "max-window-bytes"),
        sessionIdleMs: intFlag(p, "session-idle-ms"),
        maxBatchEntries: intFlag(p, "max-batch-entries"),
        batchGatherUs: intFlag(p, "batch-gather-us"),
        name: strFlag(p, "name"),
        slotBufferWindows: intFlag(p, "slot-buffer-windows"),
        receiveInPlace: inPlace === "yes",
        logger: log,
        tls: tlsOf(p),
        idleTimeoutMs: intFlag(p, "idle-timeout-ms"),
        frameTap: trace ?? undefined,
      }),
    ),
  );
  state.worker = worker;
  const advertised = advertiseOrUsage(() => advertiseAll(worker.endpoints, p.advertise));
  for (const a of advertised.filter((x) => x.source === "interface")) {
    log
      .child({}, { level: "info" })
      .info(
        { bind: a.bind, endpoint: a.endpoint, interface: a.interfaceName },
        "advertising the first non-loopback interface for a wildcard bind (--advertise sets it)",
      );
  }
  // The "listening" line is the bin's interface to supervisors: printed at any --log-level.
  log.child({}, { level: "info" }).info(
    {
      // issue 19: what peers connect to (advertised), and what is bound
      endpoints: advertised.map((a) => a.endpoint),
      bind: worker.endpoints,
      ...(metrics !== null ? { metrics: `http://${metrics.host}:${metrics.port}/metrics` } : {}),
      drafter: drafter.constructor.name,
      drafterIdentity: Buffer.from(drafter.drafterIdentity).toString("hex"),
      markovIdentity: Buffer.from(drafter.markovIdentity).toString("hex"),
      window: drafter.window,
      numSpec: drafter.numSpec,
      vocabSize: drafter.vocabSize,
      rowBytes: drafter.numTaps * drafter.hidden * 2,
      maxMessageBytes: worker.core.maxMessageBytes,
      auth: token !== undefined && token !== "",
      ...(trace !== null ? { trace: trace.path } : {}),
    },
    "listening",
  );
  // --register (issue 21): the record names the advertised endpoints of the listening line
  const registration = await startRegistration(
    p,
    worker,
    drafter,
    log,
    advertised.map((a) => a.endpoint),
  );
  const signal = await stopSignal;
  state.closing = true;
  log.info({ signal }, "closing");
  // Orphaned: nobody will send SIGKILL if closing hangs, so bound it.
  if (signal === PARENT_EXIT) setTimeout(() => process.exit(1), 10_000).unref();
  try {
    await registration?.stop();
    await worker.close();
    await metrics?.close();
    if (trace !== null) log.info({ trace: trace.path, ...(await trace.close()) }, "trace closed");
  } catch (e) {
    log.error({ err: String(e) }, "close failed");
    return 1;
  }
  log.info({ stats: worker.stats() }, "closed");
  return 0;
}

/** The `signal` of the closing line when `--exit-with-parent` saw the parent go. */
const PARENT_EXIT = "parent-exit";

/** A listener that cannot bind: `--listen`'s endpoint in the message, exit 75 or 2 (exit.ts). */
async function bindOrExplain<T>(bind: () => Promise<T>): Promise<T> {
  try {
    return await bind();
  } catch (e) {
    if ((e as { code?: unknown }).code !== "TRANSPORT_LISTEN") throw e;
    const errno = errnoOf(e);
    throw new BindError(`--listen: ${(e as Error).message}`, errno, { cause: e });
  }
}

async function main(): Promise<void> {
  let log: Logger | null = null;
  try {
    const p = parseFlags(process.argv.slice(2));
    if (p.help === true) {
      process.stdout.write(helpText());
      return;
    }
    const level = parseLevel(p["log-level"] ?? String(FLAGS["log-level"].default));
    if (p["metrics-listen"] !== undefined) parseMetricsOrUsage(p["metrics-listen"]);
    checkUsage(p);
    if (p["print-identities"] === true) {
      process.stdout.write(await printIdentities(p, buildDrafter));
      return;
    }
    // Handlers go in before anything is bound or logged: a supervisor may signal as soon as it
    // reads the "listening" line.
    const stopSignal = new Promise<string>((resolve) => {
      process.once("SIGINT", () => resolve("SIGINT"));
      process.once("SIGTERM", () => resolve("SIGTERM"));
      if (p["exit-with-parent"] === true) watchParent(() => resolve(PARENT_EXIT));
    });
    log = createLogger({ name: "tapwire-worker", level });
    const code = await run(p, log, stopSignal);
    await flushAndExit(log, code);
  } catch (e) {
    const exit = exitCodeOf(e);
    if (e instanceof UsageError) {
      process.stderr.write(`tapwire-worker: ${e.message} (see --help)\n`);
      process.exit(exit);
    }
    const msg =
      e instanceof WorkerError ? `${e.code}: ${e.message}` : e instanceof Error ? e.message : String(e);
    log?.fatal({ err: msg, exitCode: exit }, "failed");
    process.stderr.write(`tapwire-worker: ${msg}\n`);
    if (log !== null) await flushAndExit(log, exit);
    process.exit(exit);
  }
}

/** Issue 19: the advertised endpoints by the rule of `@tapwire/stats` (PORT only with one network endpoint). */
function advertiseAll(endpoints: readonly string[], advertise: string | undefined): Advertised[] {
  if (advertise === undefined) return endpoints.map((e) => advertiseEndpoint(e));
  const adv = parseAdvertise(advertise);
  const network = endpoints.filter((e) => advertiseEndpoint(e).host !== "");
  if (adv.port !== undefined && network.length > 1) {
    throw new UsageError(
      `--advertise ${advertise}: a PORT needs exactly one network --listen, not ${network.length}`,
    );
  }
  return endpoints.map((e) => advertiseEndpoint(e, { advertise: adv }));
}

function advertiseOrUsage<T>(f: () => T): T {
  try {
    return f();
  } catch (e) {
    if (e instanceof UsageError) throw e;
    throw new UsageError(e instanceof Error ? e.message : String(e));
  }
}

function parseLevel(level: string): ReturnType<typeof parseLogLevel> {
  try {
    return parseLogLevel(level);
  } catch (e) {
    throw new UsageError(`--log-level: ${e instanceof Error ? e.message : String(e)}`);
  }
}

function parseMetricsOrUsage(at: string): void {
  try {
    parseMetricsListen(at);
  } catch (e) {
    throw new UsageError(`--metrics-listen: ${e instanceof Error ? e.message : String(e)}`);
  }
}

void main();
