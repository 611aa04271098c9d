#!/usr/bin/env node
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import pino from "pino";
import { crc32Info } from "../crc.js";
import { EcError } from "../errors.js";
import type { EcProducerOptions } from "../producer.js";
import { EC_PRODUCER_DEFAULTS, EcProducer } from "../producer.js";
import { HEARTBEAT_DEFAULTS } from "../zmq.js";

const USAGE = `tapwire-ec-producer: serve a synthetic encoder cache over ZeroMQ + a tcp/unix data plane

  --control <zmq endpoint>     ROUTER endpoint (default ${EC_PRODUCER_DEFAULTS.control})
  --data <tcp://h:p|unix://p>  data server endpoint (default ${EC_PRODUCER_DEFAULTS.data})
  --num-blocks <n>             cache blocks (default ${EC_PRODUCER_DEFAULTS.numBlocks})
  --block-bytes <n>            bytes per block (default ${EC_PRODUCER_DEFAULTS.blockBytes})
  --model-id <s> --dtype <s> --hidden-size <n>   compatibility inputs (EC-CONTRACT 2)
  --name <s>                   agent name (default ${EC_PRODUCER_DEFAULTS.name})
  --pin-lease-ms <n>           grant lease (default 30000)
  --encode-on-miss             encode a requested-but-missing mm_hash (NOT_READY until done)
  --miss-nbytes <n>            size encoded on a miss (default hidden-size x dtype bytes x 256)
  --encode-delay-ms <n>        simulated encode time (default 0)
  --prepopulate <h:n,...>      encode these mm_hash:nbytes at start
  --prepopulate-file <path>    one "mm_hash nbytes" per line
  --throttle-bps <n>           pace the data server (bytes/s; demos, slow-read tests)
  --heartbeat-ivl-ms <n> --heartbeat-timeout-ms <n> --heartbeat-ttl-ms <n>   (default ${HEARTBEAT_DEFAULTS.intervalMs}/${HEARTBEAT_DEFAULTS.timeoutMs}/${HEARTBEAT_DEFAULTS.ttlMs})
  --stats-interval-ms <n>      log a "stats" line this often (default 0: off; also: admin op "stats")
  --log-level <level>          pino level (default info)
`;

function num(name: string, v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isFinite(n) || v.trim() === "")
    throw new EcError("EC_BAD_OPTION", `--${name}: not a number: ${v}`);
  return n;
}

function parsePairs(text: string, sep: RegExp, where: string): [string, number][] {
  const out: [string, number][] = [];
  for (const raw of text.split(sep)) {
    const item = raw.trim();
    if (item === "" || item.startsWith("#")) continue;
    const m = /^(.+?)[\s:]+(\d+)$/.exec(item);
    if (m === null)
      throw new EcError("EC_BAD_OPTION", `${where}: expected "mm_hash:nbytes", got ${JSON.stringify(item)}`);
    out.push([m[1]!, Number(m[2])]);
  }
  return out;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      control: { type: "string" },
      data: { type: "string" },
      "num-blocks": { type: "string" },
      "block-bytes": { type: "string" },
      "model-id": { type: "string" },
      dtype: { type: "string" },
      "hidden-size": { type: "string" },
      name: { type: "string" },
      "pin-lease-ms": { type: "string" },
      "encode-on-miss": { type: "boolean" },
      "miss-nbytes": { type: "string" },
      "encode-delay-ms": { type: "string" },
      prepopulate: { type: "string" },
      "prepopulate-file": { type: "string" },
      "throttle-bps": { type: "string" },
      "heartbeat-ivl-ms": { type: "string" },
      "heartbeat-timeout-ms": { type: "string" },
      "heartbeat-ttl-ms": { type: "string" },
      "stats-interval-ms": { type: "string" },
      "log-level": { type: "string" },
      help: { type: "boolean", short: "h" },
    },
    strict: true,
  });
  if (values.help === true) {
    process.stdout.write(USAGE);
    return;
  }
  const log = pino({ name: "tapwire-ec-producer", level: values["log-level"] ?? "info" });
  const prepopulate: [string, number][] = [];
  if (values.prepopulate !== undefined)
    prepopulate.push(...parsePairs(values.prepopulate, /,/, "--prepopulate"));
  if (values["prepopulate-file"] !== undefined) {
    prepopulate.push(
      ...parsePairs(readFileSync(values["prepopulate-file"], "utf8"), /\n/, "--prepopulate-file"),
    );
  }
  const opts: EcProducerOptions = { logger: log, prepopulate };
  const set = <K extends keyof EcProducerOptions>(k: K, v: EcProducerOptions[K] | undefined) => {
    if (v !== undefined) opts[k] = v;
  };
  set("control", values.control);
  set("data", values.data);
  set("numBlocks", num("num-blocks", values["num-blocks"]));
  set("blockBytes", num("block-bytes", values["block-bytes"]));
  set("modelId", values["model-id"]);
  set("dtype", values.dtype);
  set("hiddenSize", num("hidden-size", values["hidden-size"]));
  set("name", values.name);
  set("pinLeaseMs", num("pin-lease-ms", values["pin-lease-ms"]));
  set("encodeOnMiss", values["encode-on-miss"]);
  set("missNbytes", num("miss-nbytes", values["miss-nbytes"]));
  set("encodeDelayMs", num("encode-delay-ms", values["encode-delay-ms"]));
  set("throttleBytesPerSec", num("throttle-bps", values["throttle-bps"]));
  const hb = {
    intervalMs: num("heartbeat-ivl-ms", values["heartbeat-ivl-ms"]),
    timeoutMs: num("heartbeat-timeout-ms", values["heartbeat-timeout-ms"]),
    ttlMs: num("heartbeat-ttl-ms", values["heartbeat-ttl-ms"]),
  };
  opts.heartbeat = Object.fromEntries(Object.entries(hb).filter(([, v]) => v !== undefined));
  const statsEvery = num("stats-interval-ms", values["stats-interval-ms"]) ?? 0;

  const producer = await EcProducer.start(opts);
  // The "listening" and "closed" lines are the bin's interface: printed at any --log-level.
  const always = log.child({}, { level: "info" });
  always.info(
    {
      control: producer.controlEndpoint,
      data: producer.dataEndpoint,
      admin: producer.adminEndpoint,
      dataKind: producer.data.kind,
      compatibilityHash: producer.compatibilityHash,
      numBlocks: producer.cache.numBlocks,
      blockBytes: producer.cache.blockBytes,
      entries: producer.cache.size,
      crcImpl: crc32Info.impl,
      pid: process.pid,
    },
    "listening",
  );
  const statsTimer =
    statsEvery > 0 ? setInterval(() => log.info({ stats: producer.stats() }, "stats"), statsEvery) : null;
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    if (statsTimer !== null) clearInterval(statsTimer);
    void producer
      .close()
      .then(() => {
        always.info({ signal, stats: producer.stats() }, "closed");
        process.exit(0);
      })
      .catch((err: unknown) => {
        log.error({ err }, "close failed");
        process.exit(1);
      });
  };
  process.on("SIGINT", () => stop("SIGINT"));
  process.on("SIGTERM", () => stop("SIGTERM"));
}

main().catch((err: unknown) => {
  const msg = err instanceof Error ? err.message : String(err);
  process.stderr.write(`tapwire-ec-producer: ${msg}\n\n${USAGE}`);
  process.exit(2);
});
