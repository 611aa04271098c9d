/**
 * The flags of `tapwire-worker`: one table from which the help text, the defaults and the parser
 * all come, so that what `--help` states is what the worker does (a test compares them).
 */
import { DEFAULT_DRAFT_CONFIG, DEFAULT_TARGET_CONFIG } from "@tapwire/reference-model";
import { DEFAULT_METRICS_LISTEN, LOG_LEVELS } from "@tapwire/stats";
import { CORE_DEFAULTS } from "../options.js";
import { DEFAULT_LISTEN, WORKER_DEFAULTS } from "../worker.js";
import { REGISTER_FLAGS } from "./register-flags.js";

/** A command-line mistake: the bin prints its one-line message and exits 2. */
export class UsageError extends Error {
  override name = "UsageError";
}

type Kind =
  | { t: "int"; min: number; max: number }
  | { t: "num"; min: number }
  | { t: "str" }
  | { t: "list" }
  | { t: "bool" }
  | { t: "choice"; of: readonly string[] };

/** One flag: its argument's name, kind, default (as stated in the help) and help text. */
export interface FlagSpec {
  readonly section: string;
  readonly arg?: string;
  readonly kind: Kind;
  /** The default used when the flag is absent (undefined: none, see `note`). */
  readonly default?: string | number;
  /** How the default reads when it is not a plain value ("env TAPWIRE_TOKEN; none: no auth"). */
  readonly note?: string;
  readonly help: string;
}

const U32 = 0xffffffff;
const MS = 2 ** 31 - 1;

/** An integer flag in `min..max` with a default. */
function int(section: string, arg: string, min: number, max: number, dflt: number, help: string): FlagSpec {
  return { section, arg, kind: { t: "int", min, max }, default: dflt, help };
}

/** Every flag of `tapwire-worker`, in help order. */
export const FLAGS = {
  listen: {
    section: "Listening",
    arg: "URL",
    kind: { t: "list" },
    default: DEFAULT_LISTEN,
    help: "endpoint, repeatable (loopback only by default): tcp://host:port, unix:///abs/path, tls://host:port, zmq+tcp://..., zmq+ipc://..., shm+unix:///abs/path (same host, shared memory)",
  },
  "tls-cert": {
    section: "Listening",
    arg: "FILE",
    kind: { t: "str" },
    help: "PEM certificate for tls:// endpoints",
  },
  "tls-key": { section: "Listening", arg: "FILE", kind: { t: "str" }, help: "PEM key for tls:// endpoints" },
  "tls-ca": {
    section: "Listening",
    arg: "FILE",
    kind: { t: "str" },
    help: "PEM CA: ask clients for a certificate signed by it (refused handshakes are logged and counted)",
  },
  advertise: {
    section: "Listening",
    arg: "HOST[:PORT]",
    kind: { t: "str" },
    note: "the bind address; for 0.0.0.0/:: the first non-loopback interface",
    help: "address peers are told to connect to (listening line, discovery); PORT only with a single network listen endpoint",
  },
  "idle-timeout-ms": int("Listening", "MS", 0, MS, 0, "close connections idle this long (0 = never)"),
  "metrics-listen": {
    section: "Listening",
    arg: "URL",
    kind: { t: "str" },
    note: "off",
    help: `serve Prometheus /metrics, /healthz and /readyz on tcp://HOST:PORT (e.g. ${DEFAULT_METRICS_LISTEN}, loopback)`,
  },
  drafter: {
    section: "Drafter",
    arg: "KIND",
    kind: { t: "choice", of: ["null", "reference", "onnx"] },
    default: "reference",
    help: "null: no model (link benchmarks); reference: @tapwire/reference-model; onnx: a head of the tapwire ONNX signature on ONNX Runtime (@tapwire/drafter-onnx, installed separately; docs/onnx-drafter.md)",
  },
  model: {
    section: "Drafter",
    arg: "FILE",
    kind: { t: "str" },
    help: "onnx: the model (.onnx, or a reference head .safetensors); window and N default to its metadata, and vocab, num-taps and hidden must match it when given",
  },
  "onnx-threads": int("Drafter", "N", 1, 64, 1, "onnx: ONNX Runtime intra-op threads"),
  "onnx-inter-threads": int("Drafter", "N", 1, 64, 1, "onnx: ONNX Runtime inter-op threads"),
  "onnx-provider": {
    section: "Drafter",
    arg: "EP",
    kind: { t: "choice", of: ["cpu", "cuda"] },
    default: "cpu",
    help: "onnx: execution provider (cuda needs a GPU and onnxruntime-node's CUDA binaries)",
  },
  "onnx-cuda-device": int("Drafter", "N", 0, 255, 0, "onnx: CUDA device id (with the cuda provider)"),
  "onnx-optimization": {
    section: "Drafter",
    arg: "LEVEL",
    kind: { t: "choice", of: ["disabled", "basic", "extended", "all"] },
    default: "all",
    help: "onnx: ONNX Runtime graph optimisation level",
  },
  weights: {
    section: "Drafter",
    arg: "FILE",
    kind: { t: "str" },
    note: "distilled in-process",
    help: "reference: draft head safetensors (DraftHead.save); its geometry is the file's (vocab, state-dim, num-taps and hidden, when given, must agree)",
  },
  seed: int("Drafter", "N", 0, U32, DEFAULT_TARGET_CONFIG.seed, "reference: target model seed"),
  vocab: int("Drafter", "N", 2, 0x7fffffff, DEFAULT_TARGET_CONFIG.vocabSize, "vocabulary size"),
  "state-dim": int("Drafter", "N", 4, 512, DEFAULT_TARGET_CONFIG.stateDim, "reference: target state size"),
  "num-taps": int("Drafter", "N", 1, 0xffff, DEFAULT_TARGET_CONFIG.numTaps, "tap vectors per row"),
  hidden: int("Drafter", "N", 1, 0x7fffffff, DEFAULT_TARGET_CONFIG.hidden, "bf16 values per tap vector"),
  window: int("Drafter", "N", 1, 4096, DEFAULT_DRAFT_CONFIG.window, "window W in rows"),
  "num-spec": int("Drafter", "N", 1, 32, DEFAULT_DRAFT_CONFIG.numSpec, "drafts per entry N"),
  "draft-seed": int("Drafter", "N", 0, U32, DEFAULT_DRAFT_CONFIG.seed, "reference: distillation noise seed"),
  "draft-rank": int("Drafter", "N", 1, 512, DEFAULT_DRAFT_CONFIG.rank, "reference: backbone rank"),
  "draft-noise": {
    section: "Drafter",
    arg: "X",
    kind: { t: "num", min: 0 },
    default: DEFAULT_DRAFT_CONFIG.noise,
    help: "reference: distillation noise",
  },
  "draft-markov-rank": int(
    "Drafter",
    "N",
    1,
    512,
    DEFAULT_DRAFT_CONFIG.markovRank,
    "reference: Markov head rank",
  ),
  "drafter-identity": {
    section: "Drafter",
    arg: "HEX",
    kind: { t: "str" },
    note: "zeros",
    help: "null: drafter identity (32 bytes hex)",
  },
  "markov-identity": {
    section: "Drafter",
    arg: "HEX",
    kind: { t: "str" },
    note: "zeros",
    help: "null: Markov identity (32 bytes hex)",
  },
  "max-slots": {
    section: "Sessions and limits",
    arg: "N",
    kind: { t: "int", min: 1, max: 1 << 20 },
    default: CORE_DEFAULTS.maxSlots,
    help: "largest max_slots a session may ask",
  },
  "max-rows-per-step": int(
    "Sessions and limits",
    "N",
    0,
    U32,
    CORE_DEFAULTS.maxRowsPerStep,
    "largest max_rows_per_step a session may ask (with max-slots, row bytes and N: the largest STEP accepted)",
  ),
  "max-connections": {
    section: "Sessions and limits",
    arg: "N",
    kind: { t: "int", min: 0, max: 1 << 20 },
    default: WORKER_DEFAULTS.maxConnections,
    help: "connections held at once, at most half of them before HELLO (0 = no limit; CONTRACT 11)",
  },
  "max-buffered-bytes": {
    section: "Sessions and limits",
    arg: "BYTES",
    kind: { t: "int", min: 0, max: Number.MAX_SAFE_INTEGER },
    note: "4 x the largest STEP",
    help: "bytes buffered for all connections together (0 = no budget; CONTRACT 11)",
  },
  "unbound-idle-ms": int(
    "Sessions and limits",
    "MS",
    0,
    MS,
    WORKER_DEFAULTS.unboundIdleMs,
    "close a connection that has not said HELLO and sent no whole message this long (0 = never)",
  ),
  token: {
    section: "Sessions and limits",
    arg: "TOKEN",
    kind: { t: "str" },
    note: "env TAPWIRE_TOKEN; none: no auth",
    help: "shared HELLO token",
  },
  takeover: {
    section: "Sessions and limits",
    arg: "POLICY",
    kind: { t: "choice", of: ["allow", "refuse"] },
    note: "refuse with a token, else allow",
    help: "allow: another session's HELLO takes over; refuse: it gets BUSY while the current session is leased",
  },
  "session-lease-ms": int(
    "Sessions and limits",
    "MS",
    0,
    MS,
    CORE_DEFAULTS.sessionLease,
    "lease after the last OK frame",
  ),
  "max-sessions": int(
    "Sessions and limits",
    "K",
    1,
    4096,
    CORE_DEFAULTS.maxSessions,
    "sessions held at once; K > 1 is a shared worker (CONTRACT 12.1: capability SHARED, admission, cross-session batching)",
  ),
  "max-window-bytes": {
    section: "Sessions and limits",
    arg: "BYTES",
    kind: { t: "int", min: 1, max: Number.MAX_SAFE_INTEGER },
    note: "K x max-slots x window x row bytes",
    help: "shared: window bytes the held sessions may reserve (max_slots x W x row_bytes each; CONTRACT 12.1)",
  },
  "session-idle-ms": int(
    "Sessions and limits",
    "MS",
    1,
    MS,
    CORE_DEFAULTS.sessionIdleMs,
    "shared: drop a held session idle this long (CONTRACT 12.1)",
  ),
  "max-batch-entries": int(
    "Sessions and limits",
    "N",
    0,
    U32,
    CORE_DEFAULTS.maxBatchEntries,
    "shared: most entries per cross-session drafter call (0 = no bound; CONTRACT 12.1)",
  ),
  "batch-gather-us": int(
    "Sessions and limits",
    "US",
    0,
    1_000_000,
    CORE_DEFAULTS.batchGatherUs,
    "shared: a drafter call waits at most this long (and never more than a mean call) for sessions the last call answered; a lone session never waits (0 = off)",
  ),
  name: {
    section: "Sessions and limits",
    arg: "NAME",
    kind: { t: "str" },
    default: CORE_DEFAULTS.name,
    help: "worker_name in HelloReply",
  },
  "slot-buffer-windows": {
    section: "Sessions and limits",
    arg: "N",
    kind: { t: "int", min: 2, max: 16 },
    note: "4; 2 when max-sessions > 1",
    help: "slot buffers hold up to N windows of rows",
  },
  "receive-in-place": {
    section: "Sessions and limits",
    arg: "yes|no",
    kind: { t: "choice", of: ["yes", "no"] },
    default: "yes",
    note: "yes, or env TAPWIRE_WORKER_RECEIVE_IN_PLACE",
    help: "receive large STEPs' rows straight into the slot windows (tcp, unix, tls)",
  },
  ...REGISTER_FLAGS,
  trace: {
    section: "Capture (docs/trace.md)",
    arg: "FILE",
    kind: { t: "str" },
    note: "off",
    help: "write a link trace of every frame answered (turns receive-in-place off; replay it with tapwire-replay)",
  },
  "trace-rows": {
    section: "Capture (docs/trace.md)",
    arg: "ROWS",
    kind: { t: "str" },
    default: "all",
    help: "which STEPs keep their rows in the trace: all, none, or N (one STEP in N)",
  },
  ui: {
    section: "Capture (docs/trace.md)",
    kind: { t: "bool" },
    help: "serve a live page of the worker's own metrics at / of --metrics-listen (Server-Sent Events at /events)",
  },
  "exit-with-parent": {
    section: "Other",
    kind: { t: "bool" },
    help: "exit (as on SIGTERM) when stdin reaches end-of-file: a supervisor starts the worker with stdin a pipe it holds open, so the worker ends with it whatever signal killed it (docs/operations.md)",
  },
  "print-identities": {
    section: "Other",
    kind: { t: "bool" },
    help: "print the drafter's identities and geometry (from --weights, or the default head) as one JSON line, then exit; what an engine's client options need (docs/operations.md)",
  },
  "log-level": {
    section: "Other",
    arg: "LEVEL",
    kind: { t: "choice", of: LOG_LEVELS },
    default: "info",
    help: "pino level",
  },
  help: { section: "Other", kind: { t: "bool" }, help: "this text" },
} as const satisfies Record<string, FlagSpec>;

/** A flag name of {@link FLAGS}. */
export type FlagName = keyof typeof FLAGS;

/** Parsed flags: strings as given, `listen` as a list, `help` as a boolean. */
export type ParsedFlags = Partial<Record<Exclude<FlagName, "listen" | BoolFlag>, string>> & {
  listen?: string[];
} & Partial<Record<BoolFlag, boolean>>;

/** The flags of {@link FLAGS} that take no value (kind `bool`). */
type BoolFlag = { [K in FlagName]: (typeof FLAGS)[K]["kind"]["t"] extends "bool" ? K : never }[FlagName];

function wrap(text: string, width: number, indent: string): string[] {
  const out: string[] = [];
  let line = "";
  for (const word of text.split(" ")) {
    if (line !== "" && line.length + 1 + word.length > width) {
      out.push(line);
      line = word;
    } else line = line === "" ? word : `${line} ${word}`;
  }
  if (line !== "") out.push(line);
  return out.map((l, i) => (i === 0 ? l : indent + l));
}

/** The text of `tapwire-worker --help`, generated from {@link FLAGS}. */
export function helpText(): string {
  const lines = [
    "Usage: tapwire-worker [options]",
    "",
    "Serves the tapwire remote drafter link (STEP/HELLO/PING/STATS/RESET) on one or more endpoints.",
  ];
  let section = "";
  const COL = 27;
  for (const [name, raw] of Object.entries(FLAGS)) {
    const f = raw as FlagSpec;
    if (f.section !== section) {
      section = f.section;
      lines.push("", section);
    }
    const head = `  --${name}${f.arg !== undefined ? ` ${f.arg}` : ""}`;
    const choices = f.kind.t === "choice" && f.arg !== "yes|no" ? ` (${f.kind.of.join("|")})` : "";
    const dflt = f.note ?? (f.default !== undefined ? String(f.default) : undefined);
    const text = `${f.help}${choices}${dflt !== undefined ? ` (default ${dflt})` : ""}`;
    const pad = head.length < COL - 1 ? head.padEnd(COL) : `${head}\n${" ".repeat(COL)}`;
    lines.push(pad + wrap(text, 96 - COL, " ".repeat(COL)).join("\n"));
  }
  return `${lines.join("\n")}\n`;
}

/**
 * Parses `argv` (`--flag value`, `--flag=value`; a value may start with "-", so `--max-slots -1`
 * is read as the value -1 and refused by its range) against {@link FLAGS}.
 * @throws {UsageError} naming the flag, in one line.
 */
export function parseFlags(argv: readonly string[]): ParsedFlags {
  const out: Record<string, string | string[] | boolean> = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (!a.startsWith("--")) throw new UsageError(`unexpected argument ${JSON.stringify(a)}`);
    const eq = a.indexOf("=");
    const name = a.slice(2, eq < 0 ? undefined : eq);
    const f = (FLAGS as Record<string, FlagSpec>)[name];
    if (f === undefined) throw new UsageError(`unknown flag --${name}`);
    if (f.kind.t === "bool") {
      if (eq >= 0) throw new UsageError(`--${name} takes no value`);
      out[name] = true;
      continue;
    }
    let v: string;
    if (eq >= 0) v = a.slice(eq + 1);
    else {
      if (i + 1 >= argv.length) throw new UsageError(`--${name} needs a value (${f.arg ?? "value"})`);
      v = argv[++i]!;
    }
    checkValue(name, f, v);
    if (f.kind.t === "list") out[name] = [...((out[name] as string[] | undefined) ?? []), v];
    else if (out[name] !== undefined) throw new UsageError(`--${name} given twice`);
    else out[name] = v;
  }
  return out as ParsedFlags;
}

function checkValue(name: string, f: FlagSpec, v: string): void {
  const k = f.kind;
  if (k.t === "int") {
    const x = Number(v);
    if (!/^-?\d+$/.test(v) || x < k.min || x > k.max) {
      throw new UsageError(`--${name} ${v} is not an integer in ${k.min}..${k.max}`);
    }
  } else if (k.t === "num") {
    const x = Number(v);
    if (v.trim() === "" || !Number.isFinite(x) || x < k.min) {
      throw new UsageError(`--${name} ${v} is not a number >= ${k.min}`);
    }
  } else if (k.t === "choice" && !k.of.includes(v)) {
    throw new UsageError(`--${name} ${v} is not one of ${k.of.join(", ")}`);
  }
}

/** The integer value of an int flag, or its table default (undefined when it has none). */
export function intFlag(p: ParsedFlags, name: FlagName): number | undefined {
  const v = (p as Record<string, unknown>)[name];
  if (typeof v === "string") return Number(v);
  const d = (FLAGS[name] as FlagSpec).default;
  return typeof d === "number" ? d : undefined;
}

/** The number value of a num flag, or its table default. */
export function numFlag(p: ParsedFlags, name: FlagName): number | undefined {
  return intFlag(p, name);
}

/** The string value of a flag, or its table default. */
export function strFlag(p: ParsedFlags, name: FlagName): string | undefined {
  const v = (p as Record<string, unknown>)[name];
  if (typeof v === "string") return v;
  const d = (FLAGS[name] as FlagSpec).default;
  return d === undefined ? undefined : String(d);
}
