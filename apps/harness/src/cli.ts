import { closeSync, existsSync, openSync, statSync, unlinkSync } from "node:fs";
import { parseMetricsListen, StatsError } from "@tapwire/stats";
import { parseDepthPolicy } from "./depth-sim.js";
import { HarnessError, HarnessErrorCode } from "./errors.js";

/** Transports of the drafter link (CONTRACT 3). */
export const DRAFT_TRANSPORTS = ["tcp", "unix", "zmq", "tls"] as const;
export type DraftTransport = (typeof DRAFT_TRANSPORTS)[number];
/** Drafters the worker serves the head with: the JavaScript head, or its ONNX export (@tapwire/drafter-onnx). */
export const DRAFTERS = ["reference", "onnx"] as const;
export type DrafterKind = (typeof DRAFTERS)[number];
/** Data planes of the encoder-cache transfer (EC-CONTRACT 5.4). */
export const EC_DATA_PLANES = ["tcp", "unix"] as const;
export type EcDataPlane = (typeof EC_DATA_PLANES)[number];
/** How progress is shown while the run goes. */
export const PROGRESS_MODES = ["auto", "bar", "lines", "off"] as const;
export type ProgressMode = (typeof PROGRESS_MODES)[number];

/** One point of the load curve: at `batch` running requests the target verifies `tokens` drafts per round. */
export interface LoadPoint {
  batch: number;
  tokens: number;
}

/** Everything a harness run is configured with (the parsed command line). */
export interface HarnessConfig {
  /** Decode slots S: at most this many requests run at once. */
  slots: number;
  /** Drafts per request per round N (CONTRACT 6.1 num_spec). */
  numSpec: number;
  /** Rows each worker window holds W (CONTRACT 6.1 window). */
  window: number;
  /** Tap vectors per row. */
  numTaps: number;
  /** bf16 values per tap vector; a row is `numTaps * hidden * 2` bytes. */
  hidden: number;
  /** Target vocabulary size. */
  vocab: number;
  /** Recurrent state size of the reference target. */
  stateDim: number;
  /** Noise of the draft head's distillation (higher: lower acceptance). */
  draftNoise: number;
  /** Rank of the draft head's backbone (its approximation of the target recurrence). */
  draftRank: number;
  draftTransport: DraftTransport;
  /** How the worker drafts with the head: `reference` (JavaScript) or `onnx` (ONNX Runtime). */
  drafter: DrafterKind;
  ecData: EcDataPlane;
  /** Requests in the run. */
  requests: number;
  /** Mean arrival rate (requests per second, Poisson arrivals); 0 = all arrive at once. */
  rate: number;
  /** Longest generation; each request draws its length from [max/2, max]. */
  maxNewTokens: number;
  /** Longest prompt; each request draws its length from [max/2, max]. */
  promptTokens: number;
  /** Distinct prompts the requests draw from (0: every prompt distinct). */
  promptPool: number;
  /** Share of requests carrying 1 to 3 media items. */
  mmShare: number;
  /** Distinct media items the multimodal requests draw from (smaller: more sharing). */
  mediaPool: number;
  /** Bytes of one media item's embedding. */
  embeddingBytes: number;
  /** Sampled decoding (rejection sampling, CONTRACT 8) instead of greedy. */
  sample: boolean;
  /** Sampling temperature (with `sample`). */
  temperature: number;
  /** Top-k of the drafter's proposal q (with `sample`, CONTRACT 8: 1..32). */
  topK: number;
  seed: number;
  /** Inject faults during the run. */
  faults: boolean;
  /** Serve Prometheus metrics on 127.0.0.1 at this port while running (null: off); `--metrics-listen` wins. */
  metricsPort: number | null;
  /** Serve /metrics, /healthz and /readyz at this `tcp://HOST:PORT` while running (null: off). */
  metricsListen: string | null;
  /** Write the report as JSON to this file (null: off). */
  json: string | null;
  /** Fixed verification budget in draft tokens per round (null: from the load curve). */
  budget: number | null;
  /** Load curve giving the budget from the batch size (piecewise linear). */
  loadCurve: LoadPoint[];
  /** Depth policy: `fixed:K` (0..N), `budget` (--budget / --load-curve) or `goodput` (docs/depth-policy.md). */
  depthPolicy: string;
  /** STEP timeout of the drafter link, milliseconds. */
  stepTimeoutMs: number;
  /** Deadline of one embedding transfer (retries included), milliseconds. */
  ecDeadlineMs: number;
  progress: ProgressMode;
  /** Log child processes' stderr and the engine's debug lines. */
  verbose: boolean;
}

/** Defaults of the normal (greedy) scenario: `pnpm start` runs exactly this. */
export const DEFAULTS: Readonly<HarnessConfig> = Object.freeze({
  slots: 8,
  numSpec: 4,
  window: 16,
  numTaps: 3,
  hidden: 4096,
  vocab: 2048,
  stateDim: 48,
  draftNoise: -1,
  draftRank: -1,
  draftTransport: "tcp",
  drafter: "reference",
  ecData: "tcp",
  requests: 48,
  rate: 40,
  maxNewTokens: 64,
  promptTokens: 24,
  promptPool: 0,
  mmShare: 0.3,
  mediaPool: 10,
  embeddingBytes: 576 * 1024 * 2,
  sample: false,
  temperature: 1,
  topK: 32,
  seed: 1,
  faults: false,
  metricsPort: null,
  metricsListen: null,
  json: null,
  budget: null,
  depthPolicy: "goodput",
  loadCurve: [
    { batch: 1, tokens: 8 },
    { batch: 4, tokens: 16 },
    { batch: 8, tokens: 24 },
    { batch: 32, tokens: 64 },
  ],
  stepTimeoutMs: 1000,
  ecDeadlineMs: 5000,
  progress: "auto",
  verbose: false,
} satisfies HarnessConfig);

/** Defaults that change with `--sample` unless given: many short requests for the statistical test. */
export const SAMPLE_DEFAULTS = Object.freeze({
  requests: 600,
  maxNewTokens: 6,
  rate: 0,
  slots: 16,
  promptPool: 4,
  mediaPool: 2,
  mmShare: 0.2,
});

/**
 * Defaults that change with `--faults` unless given: slower arrivals so that the run outlasts the
 * fault schedule, a STEP timeout a stall can trip quickly, and more distinct media so that
 * transfers keep happening after the encoder restarts.
 */
export const FAULT_DEFAULTS = Object.freeze({ rate: 6, stepTimeoutMs: 400, mediaPool: 40 });

type Kind =
  | { t: "int"; min: number; max: number }
  | { t: "num"; min: number; max: number }
  | { t: "bool" }
  | { t: "enum"; values: readonly string[] }
  | { t: "str" }
  | { t: "port" }
  | { t: "listen" }
  | { t: "budget" }
  | { t: "curve" }
  | { t: "row" };

interface FlagSpec {
  key: keyof HarnessConfig | "row" | "help";
  kind: Kind;
  arg?: string;
  help: string;
}

const FLAGS: Record<string, FlagSpec> = {
  "--slots": {
    key: "slots",
    kind: { t: "int", min: 1, max: 1024 },
    arg: "S",
    help: "decode slots (max running requests)",
  },
  "--num-spec": {
    key: "numSpec",
    kind: { t: "int", min: 1, max: 32 },
    arg: "N",
    help: "drafts per request per round (1..32)",
  },
  "--window": {
    key: "window",
    kind: { t: "int", min: 1, max: 4096 },
    arg: "W",
    help: "tap rows in each worker window (1..4096)",
  },
  "--num-taps": {
    key: "numTaps",
    kind: { t: "int", min: 1, max: 16 },
    arg: "T",
    help: "tap vectors per row",
  },
  "--hidden": {
    key: "hidden",
    kind: { t: "int", min: 8, max: 16384 },
    arg: "H",
    help: "bf16 values per tap vector",
  },
  "--row": { key: "row", kind: { t: "row" }, arg: "TxH", help: "row geometry shorthand, e.g. 3x4096" },
  "--vocab": {
    key: "vocab",
    kind: { t: "int", min: 64, max: 65536 },
    arg: "V",
    help: "target vocabulary size",
  },
  "--state-dim": {
    key: "stateDim",
    kind: { t: "int", min: 4, max: 512 },
    arg: "D",
    help: "reference target state size",
  },
  "--draft-noise": {
    key: "draftNoise",
    kind: { t: "num", min: 0, max: 10 },
    arg: "X",
    help: "draft head distillation noise",
  },
  "--draft-rank": {
    key: "draftRank",
    kind: { t: "int", min: 1, max: 512 },
    arg: "R",
    help: "draft head backbone rank",
  },
  "--draft-transport": {
    key: "draftTransport",
    kind: { t: "enum", values: DRAFT_TRANSPORTS },
    arg: "T",
    help: "drafter link: tcp | unix | zmq | tls",
  },
  "--drafter": {
    key: "drafter",
    kind: { t: "enum", values: DRAFTERS },
    arg: "D",
    help: "worker drafter: reference (JavaScript head) | onnx (the head exported to ONNX, @tapwire/drafter-onnx)",
  },
  "--ec-data": {
    key: "ecData",
    kind: { t: "enum", values: EC_DATA_PLANES },
    arg: "T",
    help: "embedding data plane: tcp | unix",
  },
  "--requests": {
    key: "requests",
    kind: { t: "int", min: 1, max: 1_000_000 },
    arg: "N",
    help: "requests in the run",
  },
  "--rate": {
    key: "rate",
    kind: { t: "num", min: 0, max: 1e6 },
    arg: "R",
    help: "arrivals per second (Poisson); 0 = all at once",
  },
  "--max-new-tokens": {
    key: "maxNewTokens",
    kind: { t: "int", min: 1, max: 100_000 },
    arg: "N",
    help: "longest generation (lengths drawn in [N/2, N])",
  },
  "--prompt-tokens": {
    key: "promptTokens",
    kind: { t: "int", min: 2, max: 100_000 },
    arg: "N",
    help: "longest prompt (lengths drawn in [N/2, N])",
  },
  "--prompt-pool": {
    key: "promptPool",
    kind: { t: "int", min: 0, max: 1_000_000 },
    arg: "N",
    help: "distinct prompts (0 = all distinct)",
  },
  "--mm-share": {
    key: "mmShare",
    kind: { t: "num", min: 0, max: 1 },
    arg: "F",
    help: "share of multimodal requests (1-3 media items)",
  },
  "--media-pool": {
    key: "mediaPool",
    kind: { t: "int", min: 1, max: 1_000_000 },
    arg: "N",
    help: "distinct media items (smaller: more cache hits)",
  },
  "--embedding-bytes": {
    key: "embeddingBytes",
    kind: { t: "int", min: 64, max: 256 * 1024 * 1024 },
    arg: "B",
    help: "bytes of one media embedding",
  },
  "--sample": {
    key: "sample",
    kind: { t: "bool" },
    help: "sampled decoding with rejection sampling (CONTRACT 8)",
  },
  "--temperature": {
    key: "temperature",
    kind: { t: "num", min: 0.05, max: 10 },
    arg: "T",
    help: "sampling temperature",
  },
  "--top-k": {
    key: "topK",
    kind: { t: "int", min: 1, max: 32 },
    arg: "K",
    help: "drafter proposal top-k (1..32)",
  },
  "--seed": {
    key: "seed",
    kind: { t: "int", min: 0, max: 0xffffffff },
    arg: "N",
    help: "seed of models, workload and sampling",
  },
  "--faults": {
    key: "faults",
    kind: { t: "bool" },
    help: "inject faults (worker kill, link stall, encoder restart, corrupt reply)",
  },
  "--metrics-listen": {
    key: "metricsListen",
    kind: { t: "listen" },
    arg: "tcp://H:P",
    help: "serve /metrics (harness + worker), /healthz, /readyz while running, e.g. tcp://127.0.0.1:9464",
  },
  "--metrics-port": {
    key: "metricsPort",
    kind: { t: "port" },
    arg: "P",
    help: "same as --metrics-listen tcp://127.0.0.1:P",
  },
  "--json": { key: "json", kind: { t: "str" }, arg: "FILE", help: "also write the report as JSON to FILE" },
  "--depth-policy": {
    key: "depthPolicy",
    kind: { t: "str" },
    arg: "P",
    help: "depth policy: fixed:K (K drafts, 0..N) | budget (--budget / --load-curve) | goodput (cost model + calibration)",
  },
  "--budget": {
    key: "budget",
    kind: { t: "budget" },
    arg: "N|auto",
    help: "draft tokens verified per round (auto: from --load-curve)",
  },
  "--load-curve": {
    key: "loadCurve",
    kind: { t: "curve" },
    arg: "B:T,..",
    help: "verify budget T at batch size B, linear between points",
  },
  "--step-timeout-ms": {
    key: "stepTimeoutMs",
    kind: { t: "int", min: 10, max: 600_000 },
    arg: "MS",
    help: "drafter STEP timeout",
  },
  "--ec-deadline-ms": {
    key: "ecDeadlineMs",
    kind: { t: "int", min: 10, max: 600_000 },
    arg: "MS",
    help: "deadline of one embedding load before local fallback",
  },
  "--progress": {
    key: "progress",
    kind: { t: "enum", values: PROGRESS_MODES },
    arg: "M",
    help: "auto | bar | lines | off",
  },
  "--verbose": { key: "verbose", kind: { t: "bool" }, help: "pass child process logs through to stderr" },
  "--help": { key: "help", kind: { t: "bool" }, help: "print this help and exit" },
};

const ALIASES: Record<string, string> = { "-h": "--help" };

function usage(message: string): HarnessError {
  return new HarnessError(HarnessErrorCode.USAGE, message);
}

function parseValue(flag: string, kind: Kind, raw: string): unknown {
  switch (kind.t) {
    case "int": {
      if (!/^-?\d+$/.test(raw)) throw usage(`${flag}: expected an integer, got "${raw}"`);
      const v = Number(raw);
      if (v < kind.min || v > kind.max) throw usage(`${flag}: ${v} outside [${kind.min}, ${kind.max}]`);
      return v;
    }
    case "num": {
      const v = Number(raw);
      if (raw.trim() === "" || !Number.isFinite(v)) throw usage(`${flag}: expected a number, got "${raw}"`);
      if (v < kind.min || v > kind.max) throw usage(`${flag}: ${v} outside [${kind.min}, ${kind.max}]`);
      return v;
    }
    case "enum":
      if (!kind.values.includes(raw))
        throw usage(`${flag}: "${raw}" is not one of ${kind.values.join(", ")}`);
      return raw;
    case "str":
      if (raw === "") throw usage(`${flag}: expected a value`);
      return raw;
    case "port": {
      if (!/^\d+$/.test(raw) || Number(raw) > 65535)
        throw usage(`${flag}: expected a port 0..65535, got "${raw}"`);
      return Number(raw);
    }
    case "listen":
      try {
        parseMetricsListen(raw);
      } catch (e) {
        if (e instanceof StatsError) throw usage(`${flag}: ${e.message}`);
        throw e;
      }
      return raw;
    case "budget": {
      if (raw === "auto") return null;
      if (!/^\d+$/.test(raw) || Number(raw) < 1)
        throw usage(`${flag}: expected a positive integer or "auto", got "${raw}"`);
      return Number(raw);
    }
    case "curve":
      return parseLoadCurve(flag, raw);
    case "row": {
      const m = /^(\d+)[xX*](\d+)$/.exec(raw);
      if (!m) throw usage(`${flag}: expected TAPSxHIDDEN such as 3x4096, got "${raw}"`);
      return {
        numTaps: parseValue("--num-taps", FLAGS["--num-taps"]!.kind, m[1]!),
        hidden: parseValue("--hidden", FLAGS["--hidden"]!.kind, m[2]!),
      };
    }
    case "bool":
      if (raw === "true" || raw === "1") return true;
      if (raw === "false" || raw === "0") return false;
      throw usage(`${flag}: expected true or false, got "${raw}"`);
  }
}

/** Parses `B:T,B:T,...` (batch size : verify tokens), batches strictly increasing. */
export function parseLoadCurve(flag: string, raw: string): LoadPoint[] {
  const points: LoadPoint[] = [];
  for (const part of raw.split(",")) {
    const m = /^\s*(\d+)\s*:\s*(\d+)\s*$/.exec(part);
    if (!m) throw usage(`${flag}: point "${part}" is not BATCH:TOKENS`);
    const batch = Number(m[1]);
    const tokens = Number(m[2]);
    if (batch < 1) throw usage(`${flag}: batch ${batch} must be >= 1`);
    const prev = points[points.length - 1];
    if (prev && batch <= prev.batch)
      throw usage(`${flag}: batch ${batch} not above the previous ${prev.batch}`);
    points.push({ batch, tokens });
  }
  return points;
}

/** The parse result: a config, or a request for help. */
export type ParseResult = { help: true } | { help: false; config: HarnessConfig; given: ReadonlySet<string> };

/**
 * Parses harness flags (`--flag value` or `--flag=value`; booleans take no value).
 * @throws HarnessError HARNESS_USAGE naming the first bad flag.
 */
export function parseArgs(argv: readonly string[]): ParseResult {
  const cfg: HarnessConfig = { ...DEFAULTS, loadCurve: [...DEFAULTS.loadCurve] };
  const given = new Set<string>();
  const rec = cfg as unknown as Record<string, unknown>;
  for (let i = 0; i < argv.length; i++) {
    let arg = argv[i] as string;
    // `pnpm start -- --help` passes the separator through; there are no positionals to end
    if (arg === "--") continue;
    let inline: string | undefined;
    const eq = arg.indexOf("=");
    if (arg.startsWith("--") && eq > 0) {
      inline = arg.slice(eq + 1);
      arg = arg.slice(0, eq);
    }
    arg = ALIASES[arg] ?? arg;
    const spec = FLAGS[arg];
    if (!spec) throw usage(`unknown flag "${arg}" (see --help)`);
    if (spec.key === "help") return { help: true };
    let raw: string;
    if (spec.kind.t === "bool") {
      raw = inline ?? "true";
    } else if (inline !== undefined) {
      raw = inline;
    } else {
      const next = argv[i + 1];
      if (next === undefined) throw usage(`${arg}: missing value ${spec.arg ?? ""}`.trim());
      raw = next;
      i++;
    }
    const value = parseValue(arg, spec.kind, raw);
    if (spec.key === "row") {
      const r = value as { numTaps: number; hidden: number };
      cfg.numTaps = r.numTaps;
      cfg.hidden = r.hidden;
      given.add("numTaps").add("hidden");
    } else {
      rec[spec.key] = value;
      given.add(spec.key);
    }
  }
  if (cfg.sample) {
    for (const [k, v] of Object.entries(SAMPLE_DEFAULTS)) if (!given.has(k)) rec[k] = v;
  }
  if (cfg.faults) {
    // --sample's own defaults win (its test needs many requests, all at once)
    for (const [k, v] of Object.entries(FAULT_DEFAULTS)) {
      if (!given.has(k) && !(cfg.sample && k in SAMPLE_DEFAULTS)) rec[k] = v;
    }
  }
  validate(cfg);
  return { help: false, config: cfg, given };
}

/** Cross-flag checks (each flag alone is checked while parsing). */
export function validate(cfg: HarnessConfig): void {
  if (cfg.topK > cfg.vocab) throw usage(`--top-k: ${cfg.topK} above --vocab ${cfg.vocab}`);
  if (cfg.sample && cfg.vocab < 32)
    throw usage("--vocab: sampled sessions need at least 32 tokens (CONTRACT 6.1)");
  if (cfg.promptTokens < 2) throw usage("--prompt-tokens: at least 2");
  if (parseDepthPolicy(cfg.depthPolicy, cfg.numSpec) === null) {
    throw usage(
      `--depth-policy: "${cfg.depthPolicy}" is not fixed:K (K in 0..${cfg.numSpec}), budget or goodput`,
    );
  }
  if (cfg.embeddingBytes % 2 !== 0)
    throw usage(`--embedding-bytes: ${cfg.embeddingBytes} is not a whole number of bf16 values`);
  const rowBytes = cfg.numTaps * cfg.hidden * 2;
  if (rowBytes * cfg.window * cfg.slots > 2 ** 30) {
    throw usage(
      `--slots x --window x row bytes = ${rowBytes * cfg.window * cfg.slots} exceeds 1 GiB of rings`,
    );
  }
}

/**
 * Checks, before the run, that the `--json` report can be written to `path`: an existing file is
 * opened for writing (not truncated), a new one is created and removed again. A missing folder, a
 * directory, a read-only file system or no permission is a usage error (exit 2) naming the path,
 * instead of a failure after the whole run.
 */
export function checkJsonPath(path: string): void {
  const fail = (why: string) => usage(`--json ${path}: ${why}`);
  try {
    if (existsSync(path)) {
      if (statSync(path).isDirectory()) throw fail("is a directory");
      closeSync(openSync(path, "r+"));
    } else {
      closeSync(openSync(path, "wx"));
      unlinkSync(path);
    }
  } catch (e) {
    if (e instanceof HarnessError) throw e;
    const code = (e as NodeJS.ErrnoException).code;
    const why =
      code === "ENOENT"
        ? "its folder does not exist"
        : code === "EACCES" || code === "EPERM"
          ? "permission denied"
          : code === "EROFS"
            ? "read-only file system"
            : code === "ENOTDIR"
              ? "a parent is not a folder"
              : `cannot be written (${code ?? String(e)})`;
    throw fail(why);
  }
}

/** The effective `--metrics-listen` address (`--metrics-port P` is `tcp://127.0.0.1:P`), or null. */
export function metricsListenOf(cfg: Pick<HarnessConfig, "metricsListen" | "metricsPort">): string | null {
  if (cfg.metricsListen !== null) return cfg.metricsListen;
  return cfg.metricsPort === null ? null : `tcp://127.0.0.1:${cfg.metricsPort}`;
}

/** Row bytes of a configuration (CONTRACT 2: `num_taps * hidden * 2`). */
export function rowBytesOf(cfg: Pick<HarnessConfig, "numTaps" | "hidden">): number {
  return cfg.numTaps * cfg.hidden * 2;
}

/** Verification budget at a batch size from a load curve (linear between points, flat outside). */
export function budgetFromCurve(curve: readonly LoadPoint[], batch: number): number {
  const first = curve[0];
  if (!first) return Number.MAX_SAFE_INTEGER;
  if (batch <= first.batch) return first.tokens;
  for (let i = 1; i < curve.length; i++) {
    const p = curve[i] as LoadPoint;
    const q = curve[i - 1] as LoadPoint;
    if (batch <= p.batch)
      return Math.round(q.tokens + ((p.tokens - q.tokens) * (batch - q.batch)) / (p.batch - q.batch));
  }
  return (curve[curve.length - 1] as LoadPoint).tokens;
}

/** `--flag value, ...` for config keys and values. */
function flagList(values: Readonly<Record<string, unknown>>): string {
  const byKey = new Map(Object.entries(FLAGS).map(([flag, spec]) => [spec.key as string, flag]));
  return Object.entries(values)
    .map(([k, v]) => `${byKey.get(k) ?? k} ${String(v)}`)
    .join(", ");
}

/** The `--help` text. */
export function helpText(): string {
  const lines = [
    "tapwire-harness: speculative decoding across processes (engine + drafter worker + encoder)",
    "",
    "usage: tapwire-harness [flags]",
    "",
  ];
  const defaults = DEFAULTS as unknown as Record<string, unknown>;
  for (const [flag, spec] of Object.entries(FLAGS)) {
    const left = `  ${flag}${spec.arg ? ` ${spec.arg}` : ""}`;
    let def = "";
    if (spec.key !== "help" && spec.key !== "row") {
      const v = defaults[spec.key];
      if (spec.key === "loadCurve") def = DEFAULTS.loadCurve.map((p) => `${p.batch}:${p.tokens}`).join(",");
      else if (spec.key === "budget") def = "auto";
      else if (spec.key === "draftNoise" || spec.key === "draftRank") def = "reference-model default";
      else if (v !== null && v !== false) def = String(v);
    }
    lines.push(`${left.padEnd(30)} ${spec.help}${def ? ` [${def}]` : ""}`);
  }
  lines.push(
    "",
    "--sample changes the defaults of flags not given to many short requests over few prompts, for the",
    `distribution test: ${flagList(SAMPLE_DEFAULTS)}.`,
    "",
    `--faults changes the defaults of flags not given: ${flagList(FAULT_DEFAULTS)}.`,
    "",
    "Exit status: 0 lossless, 1 output differs from target-only (or the sampled test rejects, or a leak),",
    "2 usage error (also an unwritable --json path, checked before the run), 3 a child process died or a",
    "package failed, 130 SIGINT, 143 SIGTERM (children stopped first).",
  );
  return `${lines.join("\n")}\n`;
}
