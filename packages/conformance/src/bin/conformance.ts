#!/usr/bin/env node
/**
 * `tapwire-conformance`: runs the conformance cases of CONTRACT / EC-CONTRACT against a peer and
 * prints a report; exit 0 only when no case FAILED (2: usage, 3: the peer could not be reached or probed).
 */
import { writeFileSync } from "node:fs";
import { parseArgs } from "node:util";
import type { CaseInfo, Mode } from "../cases.js";
import { listCases as allCases } from "../cases.js";
import { runClientSuite } from "../client/suite.js";
import { runEcConsumerSuite, runEcEventsSuite, runEcProducerSuite } from "../ec/suite.js";
import { ConformanceError } from "../errors.js";
import type { RunReport } from "../report.js";
import { formatJunit, formatText } from "../report.js";
import type { CaseResult } from "../runner.js";
import { caseFilter } from "../runner.js";
import { runWorkerSharedSuite, SHARED_CASES } from "../worker/shared-suite.js";
import { runWorkerSuite } from "../worker/suite.js";

const HELP = `Usage: tapwire-conformance <mode> [endpoint] [options]

Modes
  worker <endpoint>            test a drafter worker (CONTRACT 3-11) at tcp://, unix://, tls://, zmq+tcp://, zmq+ipc://, shm+unix://
  client --listen <endpoint>   act as a scripted worker; a rank-0 client connects and is judged (CONTRACT 9)
  ec-producer <endpoint>       test an encoder-cache producer's control socket (EC-CONTRACT 3, 4, 9)
  ec-consumer --listen <endpoint>  act as a scripted producer (control ROUTER + data server) for a consumer (EC-CONTRACT 3, 6, 9)

Worker options (flag names as tapwire-worker's; anything not given is discovered from a HelloReply)
  --token T                 shared HELLO token (default env TAPWIRE_TOKEN)
  --window N --num-spec N --vocab N --num-taps N --hidden N
  --drafter-identity HEX --markov-identity HEX
  --sample-mode greedy|top32   sample mode of the general cases (default greedy)
  --takeover allow|refuse      the worker's policy (default refuse with a token, else allow)
  --session-lease-ms MS        the worker's session lease (default 10000; waited out under refuse)
  --unbound-idle-ms MS         the worker's unbound idle timeout (11.20 checks it when given)
  --max-connections N          the worker's max_connections (11.21 checks it when given)
  --shared                     run the CONTRACT 12.1 cases of a shared worker (tapwire-worker --max-sessions K) instead
  --max-sessions K             --shared: the worker's max_sessions (default 4)
  --session-idle-ms MS         --shared: the worker's session_idle_ms (12.1.18 waits it out when given)
  --max-window-bytes BYTES     --shared: the worker's max_window_bytes (12.1.17 checks it when given)
  --tls-ca FILE --tls-cert FILE --tls-key FILE --tls-servername NAME
  --shm-bytes BYTES            shm+unix: bytes of each area of a connection's mapping (default 1048576, a page multiple)
  --shm-dir DIR                shm+unix: the worker's shmDir (default /dev/shm)

Client options
  --listen URL              where the scripted worker listens (tcp://, unix://, zmq+tcp://, zmq+ipc://)
  --backoff-ms MS           the client's backoff_ms: judge "after backoff" and "at once" by time
  --disable-wait-ms MS      how long a disabled client must stay silent (default max(4 x backoff, 1500))
  --token T                 the client's token (its HELLO auth is checked as HMAC)
  (--window --num-spec --vocab --num-taps --hidden --drafter-identity --markov-identity: the
   geometry the scripted worker announces; configure the client the same. A case that must
   disable the client needs a fresh one afterwards: restart it when the tester says so)

EC producer options (flag names as tapwire-ec-producer's)
  --compatibility-hash HEX  the producer's compatibility_hash, or its inputs:
  --model-id S --dtype S --hidden-size N --block-bytes N
  --mm-hash H               an entry the producer holds ready (the grant cases)
  --num-blocks N            its cache size (the quota cases)
  --pin-lease-ms MS         its pin lease (the lease case waits it out)
  --events URL              run the residency cases instead (EC-CONTRACT 10.1, 10.2, 10.5): its
                            events PUB endpoint; with --replay URL (its replay ROUTER) and
                            --admin URL (its admin socket: drives encode / evict); the endpoint
                            argument (control) is optional then

EC consumer options
  --listen URL              the scripted producer's control ROUTER (tcp://host:port, tcp://127.0.0.1:* for any port)
  --compatibility-hash HEX  the hash the consumer must send
  --num-blocks N --block-bytes N   the scripted producer's cache (default 64 x 4096)
  --ack-timeout-ms MS       the consumer's ack timeout (judge re-requests by time)

Report
  --list                    print every case of the mode, one per line: number, title, sentence
  --cases GLOB[,GLOB]       run only these cases (7.2.*, 6.2.3)
  --json FILE --junit FILE  write the report as JSON / JUnit XML
  --timeout-ms MS           reply timeout (default 2000)
  --seed N                  seed of session ids, rows and fuzz input (default 1)
  --verbose                 print notes and non-failing details
  --help
`;

class UsageError extends Error {}

function int(name: string, v: string | undefined, lo: number, hi: number): number | undefined {
  if (v === undefined) return undefined;
  if (!/^\d+$/.test(v)) throw new UsageError(`--${name} ${v} is not a non-negative integer`);
  const x = Number(v);
  if (x < lo || x > hi) throw new UsageError(`--${name} ${v} outside ${lo}..${hi}`);
  return x;
}

function defined<T extends object>(o: T): { [K in keyof T]: Exclude<T[K], undefined> } {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as never;
}

function listCases(defs: readonly CaseInfo[], filter: string | undefined): string {
  const keep = caseFilter(filter);
  return defs
    .filter((d) => keep(d.id))
    .map((d) => `${d.id} ${d.title} — ${d.cite}`)
    .join("\n");
}

const str = { type: "string" } as const;
const OPTIONS = {
  token: str,
  window: str,
  "num-spec": str,
  vocab: str,
  "num-taps": str,
  hidden: str,
  "drafter-identity": str,
  "markov-identity": str,
  "sample-mode": str,
  takeover: str,
  "session-lease-ms": str,
  "unbound-idle-ms": str,
  "max-connections": str,
  shared: { type: "boolean" },
  "max-sessions": str,
  "session-idle-ms": str,
  "max-window-bytes": str,
  "shm-bytes": str,
  "shm-dir": str,
  "tls-ca": str,
  "tls-cert": str,
  "tls-key": str,
  "tls-servername": str,
  listen: str,
  "mm-hash": str,
  "compatibility-hash": str,
  "num-blocks": str,
  "model-id": str,
  dtype: str,
  "hidden-size": str,
  "pin-lease-ms": str,
  "ack-timeout-ms": str,
  "block-bytes": str,
  events: str,
  replay: str,
  admin: str,
  list: { type: "boolean" },
  cases: str,
  json: str,
  junit: str,
  "timeout-ms": str,
  "backoff-ms": str,
  "disable-wait-ms": str,
  seed: str,
  verbose: { type: "boolean" },
  help: { type: "boolean" },
} as const;

type Values = {
  [K in keyof typeof OPTIONS]?: (typeof OPTIONS)[K]["type"] extends "boolean" ? boolean : string;
};

/**
 * Parses argv with one rule for values: the word after a flag that takes a value is its value
 * even when it starts with "-" (so `--timeout-ms -1` reaches the range check instead of
 * parseArgs' "ambiguous" message), and an unknown flag is named in one line.
 */
function parseCli(argv: readonly string[]): { v: Values; positionals: string[] } {
  const joined: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    const name = a.startsWith("--") && !a.includes("=") ? a.slice(2) : undefined;
    if (name !== undefined && !(name in OPTIONS)) throw new UsageError(`unknown flag ${a}`);
    if (a.startsWith("-") && !a.startsWith("--") && a.length > 1) throw new UsageError(`unknown flag ${a}`);
    const opt = name === undefined ? undefined : OPTIONS[name as keyof typeof OPTIONS];
    if (opt !== undefined && opt.type === "string" && i + 1 < argv.length) {
      joined.push(`${a}=${argv[++i] as string}`);
    } else {
      joined.push(a);
    }
  }
  const { values, positionals } = parseArgs({
    args: joined,
    options: OPTIONS,
    strict: true,
    allowPositionals: true,
  });
  return { v: values as Values, positionals };
}

interface Common {
  timeoutMs: number | undefined;
  seed: number | undefined;
  run: ReturnType<typeof runOptions>;
}

function runOptions(v: Values) {
  const onResult = (r: CaseResult) => {
    if (v.verbose === true) process.stderr.write(`${r.verdict.padEnd(13)} ${r.id}\n`);
  };
  return defined({ cases: v.cases, onResult });
}

function worker(v: Values, positionals: readonly string[], c: Common): Promise<RunReport> {
  const endpoint = positionals[1];
  if (endpoint === undefined) throw new UsageError("worker needs an endpoint");
  const sm = v["sample-mode"];
  if (sm !== undefined && sm !== "greedy" && sm !== "top32")
    throw new UsageError(`--sample-mode ${sm} is not greedy or top32`);
  const tk = v.takeover;
  if (tk !== undefined && tk !== "allow" && tk !== "refuse")
    throw new UsageError(`--takeover ${tk} is not allow or refuse`);
  const token = v.token ?? process.env.TAPWIRE_TOKEN;
  const run = v.shared === true ? runWorkerSharedSuite : runWorkerSuite;
  return run(
    defined({
      maxSessions: int("max-sessions", v["max-sessions"], 2, 4096),
      sessionIdleMs: int("session-idle-ms", v["session-idle-ms"], 1, 2 ** 31 - 1),
      maxWindowBytes: int("max-window-bytes", v["max-window-bytes"], 1, Number.MAX_SAFE_INTEGER),
      endpoint,
      token: token === "" ? undefined : token,
      window: int("window", v.window, 1, 4096),
      numSpec: int("num-spec", v["num-spec"], 1, 32),
      vocab: int("vocab", v.vocab, 1, 0xffffffff),
      numTaps: int("num-taps", v["num-taps"], 1, 0xffff),
      hidden: int("hidden", v.hidden, 1, 0xffffffff),
      drafterIdentity: v["drafter-identity"],
      markovIdentity: v["markov-identity"],
      sampleMode: sm as "greedy" | "top32" | undefined,
      takeover: tk as "allow" | "refuse" | undefined,
      sessionLeaseMs: int("session-lease-ms", v["session-lease-ms"], 0, 2 ** 31 - 1),
      unboundIdleMs: int("unbound-idle-ms", v["unbound-idle-ms"], 0, 2 ** 31 - 1),
      maxConnections: int("max-connections", v["max-connections"], 1, 1 << 20),
      timeoutMs: c.timeoutMs,
      seed: c.seed,
      shmBytes: int("shm-bytes", v["shm-bytes"], 65536, 1 << 30),
      shmDir: v["shm-dir"],
      tls: defined({
        caFile: v["tls-ca"],
        certFile: v["tls-cert"],
        keyFile: v["tls-key"],
        servername: v["tls-servername"],
      }),
    }),
    c.run,
  );
}

function client(v: Values, positionals: readonly string[], c: Common): Promise<RunReport> {
  const listen = v.listen ?? positionals[1];
  if (listen === undefined) throw new UsageError("client needs --listen <endpoint>");
  return runClientSuite(
    defined({
      listen,
      window: int("window", v.window, 1, 4096),
      numSpec: int("num-spec", v["num-spec"], 1, 32),
      vocab: int("vocab", v.vocab, 1, 0xffffffff),
      numTaps: int("num-taps", v["num-taps"], 1, 0xffff),
      hidden: int("hidden", v.hidden, 1, 0xffffffff),
      drafterIdentity: v["drafter-identity"],
      markovIdentity: v["markov-identity"],
      timeoutMs: c.timeoutMs,
      backoffMs: int("backoff-ms", v["backoff-ms"], 0, 2 ** 31 - 1),
      disableWaitMs: int("disable-wait-ms", v["disable-wait-ms"], 0, 2 ** 31 - 1),
      onNeedClient: (why: string) => process.stderr.write(`restart the client now (${why})\n`),
      token: v.token,
      onListening: (ep: string) => process.stderr.write(`listening on ${ep}\n`),
    }),
    c.run,
  );
}

function ecProducer(v: Values, positionals: readonly string[], c: Common): Promise<RunReport> {
  if (v.events !== undefined) return ecEvents(v, positionals, c);
  const endpoint = positionals[1];
  if (endpoint === undefined) throw new UsageError("ec-producer needs an endpoint");
  return runEcProducerSuite(
    defined({
      endpoint,
      mmHash: v["mm-hash"],
      compatibilityHash: v["compatibility-hash"],
      modelId: v["model-id"],
      dtype: v.dtype,
      hiddenSize: int("hidden-size", v["hidden-size"], 1, 2 ** 31 - 1),
      blockBytes: int("block-bytes", v["block-bytes"], 1, 2 ** 31 - 1),
      numBlocks: int("num-blocks", v["num-blocks"], 1, 2 ** 31 - 1),
      pinLeaseMs: int("pin-lease-ms", v["pin-lease-ms"], 0, 2 ** 31 - 1),
      timeoutMs: c.timeoutMs,
      seed: c.seed,
    }),
    c.run,
  );
}

function ecEvents(v: Values, positionals: readonly string[], c: Common): Promise<RunReport> {
  if (v.replay === undefined) throw new UsageError("ec-producer --events needs --replay <endpoint>");
  return runEcEventsSuite(
    defined({
      events: v.events!,
      replay: v.replay,
      admin: v.admin,
      control: positionals[1],
      compatibilityHash: v["compatibility-hash"],
      mmHash: v["mm-hash"],
      numBlocks: int("num-blocks", v["num-blocks"], 1, 2 ** 31 - 1),
      blockBytes: int("block-bytes", v["block-bytes"], 1, 2 ** 31 - 1),
      timeoutMs: c.timeoutMs,
    }),
    c.run,
  );
}

function ecConsumer(v: Values, positionals: readonly string[], c: Common): Promise<RunReport> {
  const listen = v.listen ?? positionals[1];
  if (listen === undefined) throw new UsageError("ec-consumer needs --listen <endpoint>");
  const hash = v["compatibility-hash"];
  if (hash === undefined) throw new UsageError("ec-consumer needs --compatibility-hash");
  return runEcConsumerSuite(
    defined({
      listen,
      compatibilityHash: hash,
      blocks: int("num-blocks", v["num-blocks"], 1, 1 << 20),
      blockBytes: int("block-bytes", v["block-bytes"], 1, 1 << 30),
      ackTimeoutMs: int("ack-timeout-ms", v["ack-timeout-ms"], 0, 2 ** 31 - 1),
      timeoutMs: c.timeoutMs,
      onListening: (ep: string) => process.stderr.write(`listening on ${ep}\n`),
    }),
    c.run,
  );
}

const RUNNERS = { worker, client, "ec-producer": ecProducer, "ec-consumer": ecConsumer } as const;

async function main(): Promise<number> {
  const { v, positionals } = parseCli(process.argv.slice(2));
  if (v.help === true || positionals.length === 0) {
    process.stdout.write(HELP);
    return v.help === true ? 0 : 2;
  }
  const mode = positionals[0] as string;
  if (!(mode in RUNNERS))
    throw new UsageError(`mode ${mode} is not worker, client, ec-producer or ec-consumer`);
  const defs =
    mode === "worker" && v.shared === true
      ? SHARED_CASES.map((d) => ({ id: d.id, title: d.title, cite: d.cite }))
      : allCases(mode === "ec-producer" && v.events !== undefined ? "ec-producer-events" : (mode as Mode));
  if (v.list === true) {
    process.stdout.write(`${listCases(defs, v.cases)}\n`);
    return 0;
  }
  const common: Common = {
    timeoutMs: int("timeout-ms", v["timeout-ms"], 1, 600_000),
    seed: int("seed", v.seed, 0, 0xffffffff),
    run: runOptions(v),
  };
  const rep = await RUNNERS[mode as keyof typeof RUNNERS](v, positionals, common);
  const color = process.stdout.isTTY === true;
  process.stdout.write(formatText(rep, defined({ color, verbose: v.verbose })));
  if (v.json !== undefined) writeFileSync(v.json, `${JSON.stringify(rep, null, 2)}\n`);
  if (v.junit !== undefined) writeFileSync(v.junit, formatJunit(rep));
  return rep.totals.FAILED === 0 ? 0 : 1;
}

main().then(
  (code) => {
    process.exitCode = code;
    // Exit once stdout is flushed (a pipe is written asynchronously; zeromq handles would keep the process up).
    process.stdout.write("", () => process.exit(code));
  },
  (e: unknown) => {
    if (
      e instanceof UsageError ||
      (e instanceof Error && "code" in e && String(e.code).startsWith("ERR_PARSE_ARGS"))
    ) {
      process.stderr.write(`tapwire-conformance: ${e.message} (see --help)\n`);
      process.exit(2);
    }
    const msg =
      e instanceof ConformanceError
        ? `${e.code}: ${e.message}`
        : e instanceof Error
          ? (e.stack ?? e.message)
          : String(e);
    process.stderr.write(`tapwire-conformance: ${msg}\n`);
    process.exit(3);
  },
);
