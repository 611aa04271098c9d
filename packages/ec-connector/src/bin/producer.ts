#!/usr/bin/env node
import { lstatSync, readFileSync } from "node:fs";
import type { Logger, MetricsServer } from "@tapwire/stats";
import {
  createLogger,
  flushAndExit,
  parseAdvertise,
  parseLogLevel,
  parseMetricsListen,
  serveMetrics,
  watchParent,
} from "@tapwire/stats";
import { crc32Info } from "../crc.js";
import { checkCurveServer, newCurveKeyPair } from "../curve.js";
import { DATA_SERVER_DEFAULTS } from "../data/socket.js";
import { EcError } from "../errors.js";
import { INBOUND_DEFAULTS } from "../inbound.js";
import { defaultRegistry } from "../metrics.js";
import type { EcProducerOptions } from "../producer.js";
import { EC_PRODUCER_DEFAULTS, EcProducer, PRODUCER_HEARTBEAT } from "../producer.js";
import { PRODUCER_DEFAULTS } from "../producer-session.js";
import { HEARTBEAT_DEFAULTS } from "../zmq.js";
import { checkTlsFiles, EXIT, flagNames, isBindFailure } from "./exit.js";
import { REGISTER_FLAGS, startRegistration } from "./register.js";

const NAME = "tapwire-ec-producer";

/** A usage error: one line on stderr, exit 2. */
class UsageError extends Error {}

type Kind = "string" | "int" | "number" | "boolean";

/** Every flag: the parser, the help text and the defaults come from this one table. */
const FLAGS = {
  control: {
    kind: "string",
    arg: "<zmq endpoint>",
    help: "control ROUTER",
    def: EC_PRODUCER_DEFAULTS.control,
  },
  data: {
    kind: "string",
    arg: "<tcp://h:p|unix://p|shm+unix://p|tls://h:p>",
    help: "data server (shm+unix://p: a unix server that also offers same-host shm rings, needs koffi; docs/ec-protocol.md 3.4)",
    def: EC_PRODUCER_DEFAULTS.data,
  },
  advertise: {
    kind: "string",
    arg: "<host[:port]>",
    help: "address consumers reach --control and --data at (port: the data port); needed when no interface but loopback is up and a bind is a wildcard",
    def: "the bind address; for 0.0.0.0/:: the first non-loopback interface",
  },
  admin: {
    kind: "string",
    arg: "<zmq endpoint>",
    help: "admin ROUTER (stats/encode/check; loopback only unless --admin-allow-remote)",
    def: EC_PRODUCER_DEFAULTS.admin,
  },
  "admin-allow-remote": { kind: "boolean", help: "allow a non-loopback --admin endpoint" },
  "events-listen": {
    kind: "string",
    arg: "<zmq endpoint>",
    help: "residency events PUB (EC-CONTRACT 10.1; off when not given; needs --replay-listen)",
  },
  "replay-listen": {
    kind: "string",
    arg: "<zmq endpoint>",
    help: "residency replay ROUTER (EC-CONTRACT 10.2)",
  },
  "events-heartbeat-ms": { kind: "int", arg: "<ms>", help: "events hello period", def: 2000 },
  "events-ring-messages": { kind: "int", arg: "<n>", help: "events kept for replay (>= 4096)", def: 4096 },
  "metrics-listen": {
    kind: "string",
    arg: "<tcp://host:port>",
    help: "serve /metrics (Prometheus), /healthz, /readyz; e.g. tcp://127.0.0.1:9464 (off when not given)",
  },
  "num-blocks": { kind: "int", arg: "<n>", help: "cache blocks", def: EC_PRODUCER_DEFAULTS.numBlocks },
  "block-bytes": { kind: "int", arg: "<n>", help: "bytes per block", def: EC_PRODUCER_DEFAULTS.blockBytes },
  "model-id": {
    kind: "string",
    arg: "<s>",
    help: "compatibility input (EC-CONTRACT 2)",
    def: EC_PRODUCER_DEFAULTS.modelId,
  },
  dtype: { kind: "string", arg: "<s>", help: "compatibility input", def: EC_PRODUCER_DEFAULTS.dtype },
  "hidden-size": {
    kind: "int",
    arg: "<n>",
    help: "compatibility input",
    def: EC_PRODUCER_DEFAULTS.hiddenSize,
  },
  name: { kind: "string", arg: "<s>", help: "agent name", def: EC_PRODUCER_DEFAULTS.name },
  "pin-lease-ms": {
    kind: "number",
    arg: "<ms>",
    help: "grant lease (EC-CONTRACT 4.2)",
    def: PRODUCER_DEFAULTS.pinLeaseMs,
  },
  "max-pinned-blocks-per-peer": {
    kind: "int",
    arg: "<n>",
    help: "blocks pinned per ZeroMQ peer and per session (EC-CONTRACT 9.2)",
    def: "num-blocks / 4",
  },
  "max-pinned-fraction": {
    kind: "number",
    arg: "<0..1>",
    help: "share of the cache grants may pin (EC-CONTRACT 9.2)",
    def: PRODUCER_DEFAULTS.maxPinnedFraction,
  },
  "max-control-peers": {
    kind: "int",
    arg: "<n>",
    help: "control peers served at once; requests from more are dropped, counted (issue 19)",
    def: INBOUND_DEFAULTS.maxPeers,
  },
  "control-hwm": {
    kind: "int",
    arg: "<n>",
    help: "control messages queued per peer, each way (ZMQ_RCVHWM/SNDHWM; issue 19)",
    def: INBOUND_DEFAULTS.receiveHighWaterMark,
  },
  "max-data-connections": {
    kind: "int",
    arg: "<n>",
    help: "data-server connections (EC-CONTRACT 9.5)",
    def: DATA_SERVER_DEFAULTS.maxConnections,
  },
  "data-idle-timeout-ms": {
    kind: "int",
    arg: "<ms>",
    help: "close idle data connections (0: never; EC-CONTRACT 9.5)",
    def: DATA_SERVER_DEFAULTS.idleTimeoutMs,
  },
  "curve-keys": {
    kind: "string",
    arg: "<file>",
    help: "CURVE key pair of the control ROUTER (the JSON `keygen` prints; EC-CONTRACT 9.4)",
  },
  "curve-allow": { kind: "string", arg: "<file>", help: "allowed consumer public keys, one per line" },
  "tls-cert": {
    kind: "string",
    arg: "<pem file>",
    help: "data server certificate (required with --curve-keys)",
  },
  "tls-key": { kind: "string", arg: "<pem file>", help: "its private key" },
  "tls-ca": { kind: "string", arg: "<pem file>", help: "allowed client certificates (or their CA)" },
  "no-data-requests": {
    kind: "boolean",
    help: "do not offer or take XFER_REQ frames on the data plane (docs/ec-protocol.md 3.5; a 1.1 data server)",
  },
  "encode-on-miss": {
    kind: "boolean",
    help: "encode a requested-but-missing mm_hash (NOT_READY until done)",
  },
  "miss-nbytes": {
    kind: "int",
    arg: "<n>",
    help: "size encoded on a miss",
    def: "hidden-size x dtype bytes x 256",
  },
  "encode-delay-ms": { kind: "number", arg: "<ms>", help: "simulated encode time", def: 0 },
  prepopulate: { kind: "string", arg: "<h:n,...>", help: "encode these mm_hash:nbytes at start" },
  "prepopulate-file": { kind: "string", arg: "<path>", help: 'one "mm_hash nbytes" per line' },
  "shm-share-region": {
    kind: "boolean",
    help: "with --data shm+unix://: keep the cache region in shared memory that same-user readers map read-only (one copy per read; ONE TRUST DOMAIN only: such a reader could read blocks it was not granted; docs/security.md)",
  },
  "throttle-bps": {
    kind: "number",
    arg: "<n>",
    help: "pace the data server (bytes/s; demos, slow-read tests)",
  },
  "heartbeat-ivl-ms": {
    kind: "int",
    arg: "<ms>",
    help: "PINGs of the control ROUTER (0: none; consumers' PINGs and their TTL keep liveness; issue 19)",
    def: PRODUCER_HEARTBEAT.intervalMs,
  },
  "heartbeat-timeout-ms": {
    kind: "int",
    arg: "<ms>",
    help: "heartbeat timeout",
    def: HEARTBEAT_DEFAULTS.timeoutMs,
  },
  "heartbeat-ttl-ms": { kind: "int", arg: "<ms>", help: "heartbeat TTL", def: HEARTBEAT_DEFAULTS.ttlMs },
  "stats-interval-ms": {
    kind: "number",
    arg: "<ms>",
    help: 'log a "stats" line this often (0: off)',
    def: 0,
  },
  ...REGISTER_FLAGS,
  "exit-with-parent": {
    kind: "boolean",
    help: "exit (as on SIGTERM) when stdin reaches end-of-file: a supervisor holds stdin open as a pipe, so the producer ends with it whatever signal killed it",
  },
  "log-level": { kind: "string", arg: "<level>", help: "pino level", def: "info" },
  help: { kind: "boolean", help: "this text" },
} as const satisfies Record<string, { kind: Kind; arg?: string; help: string; def?: string | number }>;

type Flag = keyof typeof FLAGS;

/** The help text, built from {@link FLAGS} (so it states the real defaults). */
function usage(): string {
  const lines = [
    `${NAME}: serve a synthetic encoder cache over ZeroMQ + a tcp/unix/tls data plane`,
    "",
    `  ${NAME} [flags]      run the producer`,
    `  ${NAME} keygen       print a new CURVE key pair as JSON {"publicKey","secretKey"}`,
    "",
  ];
  for (const [flag, f] of Object.entries(FLAGS) as [Flag, (typeof FLAGS)[Flag]][]) {
    const head = `  --${flag}${"arg" in f ? ` ${f.arg}` : ""}`;
    const def = "def" in f ? ` (default ${f.def})` : "";
    lines.push(`${head.padEnd(44)} ${f.help}${def}`);
  }
  return `${lines.join("\n")}\n`;
}

function value(flag: Flag, raw: string | boolean | undefined): string | number | boolean | undefined {
  if (raw === undefined) return undefined;
  const kind: Kind = FLAGS[flag].kind;
  if (kind === "boolean" || kind === "string") return raw;
  const s = String(raw);
  const n = Number(s);
  if (s.trim() === "" || !Number.isFinite(n)) throw new UsageError(`--${flag}: not a number: ${s}`);
  if (kind === "int" && !Number.isSafeInteger(n)) throw new UsageError(`--${flag}: not an integer: ${s}`);
  return n;
}

function parsePairs(text: string, sep: RegExp, where: string): [string, number][] {
  const out: [string, number][] = [];
  for (const raw of text.split(sep)) {
    const item = raw.trim();
    if (item === "" || item.startsWith("#")) continue;
    const m = /^(.+?)[\s:]+(\d+)$/.exec(item);
    if (m === null) throw new UsageError(`${where}: expected "mm_hash:nbytes", got ${JSON.stringify(item)}`);
    out.push([m[1]!, Number(m[2])]);
  }
  return out;
}

function readText(flag: string, path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch (err) {
    throw new UsageError(`--${flag}: cannot read ${path}: ${(err as Error).message}`);
  }
}

/** Allowed keys: one Z85 key per line, or lines of `keygen` JSON (their publicKey); # comments. */
function parseAllow(text: string): string[] {
  const keys: string[] = [];
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) continue;
    keys.push(line.startsWith("{") ? String((JSON.parse(line) as { publicKey?: unknown }).publicKey) : line);
  }
  return keys;
}

/**
 * `--flag value` or `--flag=value` against {@link FLAGS}, by the rule of `tapwire-worker`
 * (packages/worker/src/bin/flags.ts): the word after a valued flag is its value even when it starts
 * with "-", so `--num-blocks -1` reaches the range check (node:util parseArgs would call it
 * ambiguous), and every mistake is one {@link UsageError} line naming the flag.
 */
function parse(argv: string[]): {
  v: Partial<Record<Flag, string | number | boolean>>;
  positionals: string[];
} {
  const raw: Partial<Record<Flag, string | boolean>> = {};
  const positionals: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === "--") {
      positionals.push(...argv.slice(i + 1));
      break;
    }
    if (!a.startsWith("-") || a === "-") {
      positionals.push(a);
      continue;
    }
    const eq = a.indexOf("=");
    const name = a.startsWith("--") ? a.slice(2, eq < 0 ? undefined : eq) : "";
    if (!Object.hasOwn(FLAGS, name)) throw new UsageError(`unknown flag ${eq < 0 ? a : a.slice(0, eq)}`);
    const flag = name as Flag;
    const f: { kind: Kind; arg?: string } = FLAGS[flag];
    if (raw[flag] !== undefined) throw new UsageError(`--${flag} given twice`);
    if (f.kind === "boolean") {
      if (eq >= 0) throw new UsageError(`--${flag} takes no value`);
      raw[flag] = true;
    } else if (eq >= 0) raw[flag] = a.slice(eq + 1);
    else if (i + 1 < argv.length) raw[flag] = argv[++i]!;
    else throw new UsageError(`--${flag} needs a value ${f.arg ?? ""}`.trimEnd());
  }
  const v: Partial<Record<Flag, string | number | boolean>> = {};
  for (const k of Object.keys(FLAGS) as Flag[]) {
    const x = value(k, raw[k]);
    if (x !== undefined) v[k] = x;
  }
  return { v, positionals };
}

/** Each `EcProducerOptions` key and its flag (also to name flags in the producer's messages). */
const OPTION_FLAGS: [keyof EcProducerOptions, Flag][] = [
  ["control", "control"],
  ["data", "data"],
  ["advertise", "advertise"],
  ["admin", "admin"],
  ["adminAllowRemote", "admin-allow-remote"],
  ["numBlocks", "num-blocks"],
  ["blockBytes", "block-bytes"],
  ["modelId", "model-id"],
  ["dtype", "dtype"],
  ["hiddenSize", "hidden-size"],
  ["name", "name"],
  ["pinLeaseMs", "pin-lease-ms"],
  ["maxPinnedBlocksPerPeer", "max-pinned-blocks-per-peer"],
  ["maxPinnedFraction", "max-pinned-fraction"],
  ["maxDataConnections", "max-data-connections"],
  ["dataIdleTimeoutMs", "data-idle-timeout-ms"],
  ["encodeOnMiss", "encode-on-miss"],
  ["missNbytes", "miss-nbytes"],
  ["encodeDelayMs", "encode-delay-ms"],
  ["throttleBytesPerSec", "throttle-bps"],
  ["shareRegion", "shm-share-region"],
  ["events", "events-listen"],
  ["replay", "replay-listen"],
  ["eventsHeartbeatMs", "events-heartbeat-ms"],
  ["eventsRingMessages", "events-ring-messages"],
];

/** Names inside `EcProducer` (data server, heartbeats) that are flags of the bin too. */
const INNER_FLAGS: [string, Flag][] = [
  ["heartbeat.intervalMs", "heartbeat-ivl-ms"],
  ["heartbeat.timeoutMs", "heartbeat-timeout-ms"],
  ["heartbeat.ttlMs", "heartbeat-ttl-ms"],
  ["maxConnections", "max-data-connections"],
  ["idleTimeoutMs", "data-idle-timeout-ms"],
  ["inbound.maxPeers", "max-control-peers"],
  ["inbound.receiveHighWaterMark", "control-hwm"],
  ["inbound.sendHighWaterMark", "control-hwm"],
];

function options(v: Partial<Record<Flag, string | number | boolean>>, log: Logger): EcProducerOptions {
  const prepopulate: [string, number][] = [];
  if (v.prepopulate !== undefined)
    prepopulate.push(...parsePairs(String(v.prepopulate), /,/, "--prepopulate"));
  if (v["prepopulate-file"] !== undefined) {
    const f = String(v["prepopulate-file"]);
    prepopulate.push(...parsePairs(readText("prepopulate-file", f), /\n/, `--prepopulate-file ${f}`));
  }
  const opts: EcProducerOptions = { logger: log, prepopulate };
  if (v.advertise !== undefined) parseAdvertise(String(v.advertise)); // STATS_BAD_ADVERTISE names --advertise
  const o = opts as Record<string, unknown>;
  for (const [key, flag] of OPTION_FLAGS) if (v[flag] !== undefined) o[key] = v[flag];
  const hb = {
    intervalMs: v["heartbeat-ivl-ms"],
    timeoutMs: v["heartbeat-timeout-ms"],
    ttlMs: v["heartbeat-ttl-ms"],
  };
  const inbound = {
    maxPeers: v["max-control-peers"],
    receiveHighWaterMark: v["control-hwm"],
    sendHighWaterMark: v["control-hwm"],
  };
  opts.inbound = Object.fromEntries(Object.entries(inbound).filter(([, x]) => x !== undefined));
  opts.heartbeat = Object.fromEntries(Object.entries(hb).filter(([, x]) => x !== undefined));
  if (v["no-data-requests"] === true) opts.dataRequests = false;
  if (v["curve-keys"] !== undefined) {
    const keysFile = String(v["curve-keys"]);
    let keys: { publicKey?: unknown; secretKey?: unknown };
    try {
      keys = JSON.parse(readText("curve-keys", keysFile)) as typeof keys;
    } catch (err) {
      if (err instanceof UsageError) throw err;
      throw new UsageError(`--curve-keys ${keysFile}: not the JSON that ${NAME} keygen prints`);
    }
    if (v["curve-allow"] === undefined) throw new UsageError("--curve-keys needs --curve-allow");
    const allowFile = String(v["curve-allow"]);
    let allow: string[];
    try {
      allow = parseAllow(readText("curve-allow", allowFile));
    } catch (err) {
      if (err instanceof UsageError) throw err;
      throw new UsageError(`--curve-allow ${allowFile}: a line is neither a key nor keygen JSON`);
    }
    opts.curve = { publicKey: String(keys.publicKey), secretKey: String(keys.secretKey), allow };
    try {
      checkCurveServer({ ...opts.curve, allow: [] });
    } catch (err) {
      throw new UsageError(`--curve-keys ${keysFile}: ${(err as Error).message.replace(/^option /, "")}`);
    }
    try {
      checkCurveServer(opts.curve);
    } catch (err) {
      throw new UsageError(`--curve-allow ${allowFile}: ${(err as Error).message.replace(/^option /, "")}`);
    }
  }
  const tlsFlags = (["tls-cert", "tls-key", "tls-ca"] as const).filter((f) => v[f] !== undefined);
  if (tlsFlags.length > 0) {
    if (tlsFlags.length !== 3) throw new UsageError("--tls-cert, --tls-key and --tls-ca go together");
    const [certFile, keyFile, caFile] = [v["tls-cert"], v["tls-key"], v["tls-ca"]].map(String) as [
      string,
      string,
      string,
    ];
    opts.tls = {
      cert: readText("tls-cert", certFile),
      key: readText("tls-key", keyFile),
      ca: readText("tls-ca", caFile),
    };
    const bad = checkTlsFiles({
      cert: [certFile, String(opts.tls.cert)],
      key: [keyFile, String(opts.tls.key)],
      ca: [caFile, String(opts.tls.ca)],
    });
    if (bad !== null) throw new UsageError(bad);
  }
  return opts;
}

async function main(argv: string[]): Promise<void> {
  const { v, positionals } = parse(argv);
  if (v.help === true) {
    process.stdout.write(usage());
    return;
  }
  if (positionals[0] === "keygen" && positionals.length === 1) {
    process.stdout.write(`${JSON.stringify(newCurveKeyPair())}\n`);
    return;
  }
  if (positionals.length > 0) throw new UsageError(`unexpected argument ${JSON.stringify(positionals[0])}`);
  const level = named("log-level", () => parseLogLevel(String(v["log-level"] ?? "info")));
  const metricsAt =
    v["metrics-listen"] === undefined
      ? null
      : named("metrics-listen", () => parseMetricsListen(String(v["metrics-listen"])));
  const statsEvery = Number(v["stats-interval-ms"] ?? 0);
  const log = createLogger({ name: NAME, level });
  const opts = options(v, log);

  // Readiness (issue 15): both sockets bound and the cache allocated, i.e. EcProducer.start resolved.
  let producer: EcProducer | null = null;
  let stopping = false;
  let metrics: MetricsServer | null = null;
  if (metricsAt !== null) {
    const registry = defaultRegistry();
    opts.registry = registry;
    try {
      metrics = await serveMetrics([registry], metricsAt.port, metricsAt.host, {
        ready: () => (stopping ? "closing" : producer === null ? "starting: binding sockets" : true),
      });
    } catch (err) {
      throw new BinError(`--metrics-listen ${String(v["metrics-listen"])}: ${(err as Error).message}`, err);
    }
  }
  currentData = opts.data;
  try {
    producer = await EcProducer.start(opts);
  } catch (err) {
    await metrics?.close();
    throw new BinError(startMessage(err, opts), err);
  }
  const p = producer;
  // The "listening" and "closed" lines are the bin's interface: printed at any --log-level.
  const always = log.child({}, { level: "info" });
  if (p.advertised.control.source === "interface" || p.advertised.data.source === "interface") {
    always.info(
      {
        interface: p.advertised.data.interfaceName ?? p.advertised.control.interfaceName,
        host: p.advertised.data.host,
      },
      "advertising the first non-loopback interface for a wildcard bind (--advertise sets it)",
    );
  }
  always.info(
    {
      // issue 19: what peers connect to (advertised), and what is bound
      control: p.advertised.control.endpoint,
      data: p.dataEndpoint,
      bind: { control: p.controlEndpoint, data: p.advertised.data.bind },
      advertise: {
        host: p.advertised.data.host || p.advertised.control.host,
        source: p.advertised.data.source,
      },
      admin: p.adminEndpoint,
      ...(p.events === null
        ? {}
        : {
            events: p.events.eventsEndpoint,
            replay: p.events.replayEndpoint,
            incarnation: p.events.incarnation,
          }),
      ...(metrics === null ? {} : { metrics: `tcp://${metrics.host}:${metrics.port}` }),
      dataKind: p.data.kind,
      curve: opts.curve !== undefined,
      compatibilityHash: p.compatibilityHash,
      numBlocks: p.cache.numBlocks,
      blockBytes: p.cache.blockBytes,
      entries: p.cache.size,
      crcImpl: crc32Info.impl,
      ...(crc32Info.fallbackReason === null ? {} : { crcFallback: crc32Info.fallbackReason }),
    },
    "listening",
  );
  const unregister = await startRegistration(v, p, log); // --register (issue 21)
  const statsTimer =
    statsEvery > 0 ? setInterval(() => log.info({ stats: p.stats() }, "stats"), statsEvery) : null;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    if (statsTimer !== null) clearInterval(statsTimer);
    always.info({ signal }, "closing");
    void (unregister?.() ?? Promise.resolve())
      .then(() => p.close())
      .then(async () => {
        await metrics?.close();
        always.info({ signal, stats: p.stats() }, "closed");
        await flushAndExit(log, 0);
      })
      .catch(async (err: unknown) => {
        log.error({ err }, "close failed");
        await flushAndExit(log, 1);
      });
  };
  process.on("SIGINT", () => stop("SIGINT"));
  process.on("SIGTERM", () => stop("SIGTERM"));
  if (v["exit-with-parent"] === true) {
    // Orphaned: nobody will SIGKILL a hanging close, so it is bounded (issue 19).
    watchParent(() => {
      setTimeout(() => process.exit(1), 10_000).unref();
      stop("parent-exit");
    });
  }
}

/** A failure while starting, its message naming the flag (`cause`: the original error). */
class BinError extends Error {
  constructor(message: string, cause: unknown) {
    super(message, { cause });
  }
}

/** Runs `f`, prefixing a thrown message with `--flag: ` (the stats parsers name no flag). */
function named<T>(flag: Flag, f: () => T): T {
  try {
    return f();
  } catch (err) {
    const e = err as Error & { code?: string };
    throw Object.assign(new UsageError(`--${flag}: ${e.message}`), { cause: err });
  }
}

/** `EcProducer.start`'s message with flags for option names and the flag of the endpoint it names. */
function startMessage(err: unknown, opts: EcProducerOptions): string {
  let msg = flagNames((err as Error)?.message ?? String(err), [...OPTION_FLAGS, ...INNER_FLAGS]);
  const code = (err as { code?: unknown } | null)?.code;
  if (code === "EC_BAD_ENDPOINT") {
    for (const [flag, at] of [
      ["control", opts.control],
      ["data", opts.data],
      ["admin", opts.admin],
    ] as const) {
      if (at !== undefined && msg.includes(at)) {
        msg = `--${flag}: ${msg}`;
        break;
      }
    }
  }
  return msg;
}

const USAGE_CODES = new Set([
  "EC_BAD_OPTION",
  "EC_BAD_ENDPOINT",
  "STATS_BAD_LISTEN",
  "STATS_BAD_LOG_LEVEL",
  "STATS_BAD_ADVERTISE",
  "STATS_NO_ADVERTISE",
]);

/** The `--data` endpoint being started (a unix path that is not a socket is configuration). */
let currentData: string | undefined;

/** True for `unix://PATH` where PATH exists and is not a socket: binding can never succeed. */
function notASocket(endpoint: string | undefined): boolean {
  const path = endpoint?.replace(/^shm\+unix:\/\//, "unix://");
  if (path === undefined || !path.startsWith("unix://")) return false;
  try {
    return !lstatSync(path.slice("unix://".length)).isSocket();
  } catch {
    return false;
  }
}

/** The exit-code policy (docs/operations.md "Exit codes"): 2 usage/config, 75 bind failure, 1 other. */
function exitCode(err: unknown): number {
  if (err instanceof UsageError) return EXIT.USAGE;
  if (isBindFailure(err)) return notASocket(currentData) ? EXIT.USAGE : EXIT.TEMPFAIL;
  const inner = err instanceof BinError ? err.cause : err;
  const code = (inner as { code?: unknown } | null)?.code;
  if (
    typeof code === "string" &&
    USAGE_CODES.has(code) &&
    (inner instanceof EcError || code.startsWith("STATS_"))
  )
    return EXIT.USAGE;
  return EXIT.RUNTIME;
}

main(process.argv.slice(2)).catch((err: unknown) => {
  const msg = (err instanceof Error ? err.message : String(err)).split("\n")[0];
  const code = exitCode(err);
  const hint = code === EXIT.USAGE ? ` (${NAME} --help lists the flags)` : "";
  process.stderr.write(`${NAME}: ${msg}${hint}\n`);
  process.exit(code);
});
