#!/usr/bin/env node
/**
 * `tapwire-worker`: runs a drafter worker (CONTRACT 5-11) until SIGINT/SIGTERM.
 * Logs pino JSON lines to stdout; once bound it logs `{"msg":"listening","endpoints":[...]}`.
 */
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { pino } from "pino";
import type { Drafter } from "../drafter.js";
import { NullDrafter } from "../drafter.js";
import { WorkerError } from "../errors.js";
import { createWorker, DEFAULT_LISTEN } from "../worker.js";

const HELP = `Usage: tapwire-worker [options]

Serves the tapwire remote drafter link (STEP/HELLO/PING/STATS/RESET) on one or more endpoints.

Listening
  --listen URL             endpoint, repeatable (default ${DEFAULT_LISTEN}, loopback only):
                           tcp://host:port, unix:///abs/path, tls://host:port, zmq+tcp://..., zmq+ipc://...
  --tls-cert FILE          PEM certificate for tls:// endpoints
  --tls-key FILE           PEM key for tls:// endpoints
  --tls-ca FILE            PEM CA: ask clients for a certificate signed by it
  --idle-timeout-ms MS     close idle connections (default 0 = never)

Drafter
  --drafter null|reference null: no model (link benchmarks); reference: @tapwire/reference-model
                           (default reference)
  --weights FILE           reference: draft head safetensors (else distilled in-process)
  --seed N                 reference: target model seed (default 1, as the reference-model package)
  --vocab N                vocabulary size (default 2048)
  --state-dim N            reference: target state size (default 48)
  --num-taps N             tap vectors per row (default 3)
  --hidden N               bf16 values per tap vector (default 1024)
  --window N               window W in rows (default 16)
  --num-spec N             drafts per entry N (default 4)
  --draft-seed N           reference: distillation noise seed (default 7)
  --draft-rank N           reference: backbone rank (default 40)
  --draft-noise X          reference: distillation noise (default 0.3)
  --draft-markov-rank N    reference: Markov head rank (default 16)
  --drafter-identity HEX   null: drafter identity (32 bytes hex; default zeros)
  --markov-identity HEX    null: Markov identity (32 bytes hex; default zeros)

Sessions and limits
  --max-slots N            largest max_slots a session may ask (default 256)
  --max-rows-per-step N    largest max_rows_per_step a session may ask (default 4096)
  --token TOKEN            shared HELLO token (default env TAPWIRE_TOKEN; none: no auth)
  --takeover allow|refuse  another session's HELLO takes over (allow, default) or gets BUSY
                           while the current session is leased (refuse)
  --session-lease-ms MS    lease after the last OK frame (default 10000)
  --name NAME              worker_name in HelloReply (default tapwire-worker)
  --slot-buffer-windows N  slot buffers hold up to N windows of rows (2..16, default 4)
  --receive-in-place yes|no  receive large STEPs' rows straight into the slot windows (tcp,
                           unix, tls; default yes, or env TAPWIRE_WORKER_RECEIVE_IN_PLACE)

Other
  --log-level LEVEL        pino level: fatal|error|warn|info|debug|trace|silent (default info)
  --help                   this text
`;

class UsageError extends Error {}

function int(name: string, v: string | undefined, lo: number, hi: number): number | undefined {
  if (v === undefined) return undefined;
  if (!/^\d+$/.test(v)) throw new UsageError(`--${name} ${v} is not a non-negative integer`);
  const x = Number(v);
  if (x < lo || x > hi) throw new UsageError(`--${name} ${v} outside ${lo}..${hi}`);
  return x;
}

function num(name: string, v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const x = Number(v);
  if (v.trim() === "" || !Number.isFinite(x) || x < 0)
    throw new UsageError(`--${name} ${v} is not a number >= 0`);
  return x;
}

function hex32(name: string, v: string | undefined): Uint8Array | undefined {
  if (v === undefined) return undefined;
  if (!/^[0-9a-fA-F]{64}$/.test(v)) throw new UsageError(`--${name} must be 64 hex digits`);
  return new Uint8Array(Buffer.from(v, "hex"));
}

function defined<T extends object>(o: T): { [K in keyof T]: Exclude<T[K], undefined> } {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as never;
}

async function buildDrafter(v: Record<string, string | string[] | boolean | undefined>): Promise<Drafter> {
  const s = (k: string) => v[k] as string | undefined;
  const geom = {
    vocabSize: int("vocab", s("vocab"), 2, 0x7fffffff),
    numTaps: int("num-taps", s("num-taps"), 1, 0xffff),
    hidden: int("hidden", s("hidden"), 1, 0x7fffffff),
    window: int("window", s("window"), 1, 4096),
    numSpec: int("num-spec", s("num-spec"), 1, 32),
  };
  const kind = s("drafter") ?? "reference";
  if (kind === "null") {
    return new NullDrafter(
      defined({
        ...geom,
        drafterIdentity: hex32("drafter-identity", s("drafter-identity")),
        markovIdentity: hex32("markov-identity", s("markov-identity")),
      }),
    );
  }
  if (kind !== "reference") throw new UsageError(`--drafter ${kind} is not null or reference`);
  // Loaded only when asked for: the null drafter needs no model code.
  const rm = await import("@tapwire/reference-model");
  const { ReferenceDrafter } = await import("../reference-drafter.js");
  const target = rm.TargetModel.create({
    ...rm.DEFAULT_TARGET_CONFIG,
    ...defined({
      seed: int("seed", s("seed"), 0, 0xffffffff),
      vocabSize: geom.vocabSize,
      stateDim: int("state-dim", s("state-dim"), 4, 512),
      numTaps: geom.numTaps,
      hidden: geom.hidden,
    }),
  });
  const weights = s("weights");
  const head =
    weights !== undefined
      ? rm.DraftHead.load(weights, target)
      : rm.DraftHead.distill(target, {
          ...rm.DEFAULT_DRAFT_CONFIG,
          ...defined({
            window: geom.window,
            numSpec: geom.numSpec,
            seed: int("draft-seed", s("draft-seed"), 0, 0xffffffff),
            rank: int("draft-rank", s("draft-rank"), 1, 512),
            noise: num("draft-noise", s("draft-noise")),
            markovRank: int("draft-markov-rank", s("draft-markov-rank"), 1, 512),
          }),
        });
  return new ReferenceDrafter(head, defined({ window: geom.window, numSpec: geom.numSpec }));
}

async function main(): Promise<number> {
  const str = { type: "string" } as const;
  const { values: v } = parseArgs({
    options: {
      listen: { type: "string", multiple: true },
      "tls-cert": str,
      "tls-key": str,
      "tls-ca": str,
      "idle-timeout-ms": str,
      drafter: str,
      weights: str,
      seed: str,
      vocab: str,
      "state-dim": str,
      "num-taps": str,
      hidden: str,
      window: str,
      "num-spec": str,
      "draft-seed": str,
      "draft-rank": str,
      "draft-noise": str,
      "draft-markov-rank": str,
      "drafter-identity": str,
      "markov-identity": str,
      "max-slots": str,
      "max-rows-per-step": str,
      token: str,
      takeover: str,
      "session-lease-ms": str,
      name: str,
      "slot-buffer-windows": str,
      "receive-in-place": str,
      "log-level": str,
      help: { type: "boolean" },
    },
    strict: true,
    allowPositionals: false,
  });
  if (v.help === true) {
    process.stdout.write(HELP);
    return 0;
  }
  // Handlers go in before anything is bound or logged: a supervisor may signal as soon as it
  // reads the "listening" line.
  const stopSignal = new Promise<string>((resolve) => {
    process.once("SIGINT", () => resolve("SIGINT"));
    process.once("SIGTERM", () => resolve("SIGTERM"));
  });
  // Unset: the core's default (refuse with a token, CONTRACT 11; else allow).
  const takeover = v.takeover;
  if (takeover !== undefined && takeover !== "allow" && takeover !== "refuse")
    throw new UsageError(`--takeover ${takeover} is not allow or refuse`);
  const level = v["log-level"] ?? "info";
  const logger = pino({ level, base: { name: v.name ?? "tapwire-worker", pid: process.pid } });
  const drafter = await buildDrafter(v);
  const cert = v["tls-cert"];
  const key = v["tls-key"];
  if ((cert === undefined) !== (key === undefined))
    throw new UsageError("--tls-cert and --tls-key go together");
  const tls =
    cert !== undefined && key !== undefined
      ? {
          cert: readFileSync(cert),
          key: readFileSync(key),
          ...(v["tls-ca"] !== undefined ? { ca: readFileSync(v["tls-ca"]), requestCert: true } : {}),
        }
      : undefined;
  const token = v.token ?? process.env.TAPWIRE_TOKEN;
  const inPlace = v["receive-in-place"] ?? process.env.TAPWIRE_WORKER_RECEIVE_IN_PLACE ?? "yes";
  if (inPlace !== "yes" && inPlace !== "no")
    throw new UsageError(`--receive-in-place ${inPlace} is not yes or no`);
  const worker = await createWorker(
    defined({
      drafter,
      listen: v.listen ?? [DEFAULT_LISTEN],
      maxSlots: int("max-slots", v["max-slots"], 1, 1 << 20),
      maxRowsPerStep: int("max-rows-per-step", v["max-rows-per-step"], 0, 0xffffffff),
      token: token === "" ? undefined : token,
      takeover,
      sessionLease: int("session-lease-ms", v["session-lease-ms"], 0, 2 ** 31 - 1),
      name: v.name,
      slotBufferWindows: int("slot-buffer-windows", v["slot-buffer-windows"], 2, 16),
      receiveInPlace: inPlace === "yes",
      logger,
      tls,
      idleTimeoutMs: int("idle-timeout-ms", v["idle-timeout-ms"], 0, 2 ** 31 - 1),
    }),
  );
  // The "listening" line is the bin's interface to supervisors: printed at any --log-level.
  logger.child({}, { level: "info" }).info(
    {
      endpoints: worker.endpoints,
      drafter: drafter.constructor.name,
      drafterIdentity: Buffer.from(drafter.drafterIdentity).toString("hex"),
      markovIdentity: Buffer.from(drafter.markovIdentity).toString("hex"),
      window: drafter.window,
      numSpec: drafter.numSpec,
      vocabSize: drafter.vocabSize,
      rowBytes: drafter.numTaps * drafter.hidden * 2,
      auth: token !== undefined && token !== "",
    },
    "listening",
  );
  const signal = await stopSignal;
  logger.info({ signal }, "closing");
  try {
    await worker.close();
  } catch (e) {
    logger.error({ err: String(e) }, "close failed");
    return 1;
  }
  logger.info({ stats: worker.stats() }, "closed");
  return 0;
}

main().then(
  (code) => {
    process.exitCode = code;
    // Transport handles are closed; exit now rather than wait for stray timers.
    setImmediate(() => process.exit(code));
  },
  (e: unknown) => {
    if (
      e instanceof UsageError ||
      (e instanceof Error && "code" in e && String(e.code).startsWith("ERR_PARSE_ARGS"))
    ) {
      process.stderr.write(`tapwire-worker: ${e.message}\n(see --help)\n`);
      process.exit(2);
    }
    const msg =
      e instanceof WorkerError ? `${e.code}: ${e.message}` : e instanceof Error ? e.message : String(e);
    process.stderr.write(`tapwire-worker: ${msg}\n`);
    process.exit(1);
  },
);
