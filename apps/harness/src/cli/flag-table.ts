/**
 * The harness's flag table (what each flag sets and how its value is checked) and the `--help`
 * text rendered from it.
 */
import {
  DEFAULTS,
  DRAFT_TRANSPORTS,
  DRAFTERS,
  EC_DATA_PLANES,
  FAULT_DEFAULTS,
  type HarnessConfig,
  PROGRESS_MODES,
  SAMPLE_DEFAULTS,
  TOPOLOGIES,
} from "./config.js";

/** How a flag's value is parsed and checked. */
export type Kind =
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

/** One flag: the config key it sets, its value kind, its `--help` line. */
export interface FlagSpec {
  key: keyof HarnessConfig | "row" | "help";
  kind: Kind;
  arg?: string;
  help: string;
}

type FlagKey = FlagSpec["key"];
const int = (key: FlagKey, min: number, max: number, arg: string, help: string): FlagSpec => ({
  key,
  kind: { t: "int", min, max },
  arg,
  help,
});
const num = (key: FlagKey, min: number, max: number, arg: string, help: string): FlagSpec => ({
  key,
  kind: { t: "num", min, max },
  arg,
  help,
});
const oneOf = (key: FlagKey, values: readonly string[], arg: string, help: string): FlagSpec => ({
  key,
  kind: { t: "enum", values },
  arg,
  help,
});
const bool = (key: FlagKey, help: string): FlagSpec => ({ key, kind: { t: "bool" }, help });
/** A flag whose value kind has no bounds (`str`, `port`, `listen`, `budget`, `curve`, `row`). */
const valued = (
  key: FlagKey,
  t: "str" | "port" | "listen" | "budget" | "curve" | "row",
  arg: string,
  help: string,
): FlagSpec => ({ key, kind: { t }, arg, help });

/** Every flag, in `--help` order. */
export const FLAGS: Record<string, FlagSpec> = {
  "--slots": int("slots", 1, 1024, "S", "decode slots (max running requests)"),
  "--num-spec": int("numSpec", 1, 32, "N", "drafts per request per round (1..32)"),
  "--window": int("window", 1, 4096, "W", "tap rows in each worker window (1..4096)"),
  "--num-taps": int("numTaps", 1, 16, "T", "tap vectors per row"),
  "--hidden": int("hidden", 8, 16384, "H", "bf16 values per tap vector"),
  "--row": valued("row", "row", "TxH", "row geometry shorthand, e.g. 3x4096"),
  "--vocab": int("vocab", 64, 65536, "V", "target vocabulary size"),
  "--state-dim": int("stateDim", 4, 512, "D", "reference target state size"),
  "--draft-noise": num("draftNoise", 0, 10, "X", "draft head distillation noise"),
  "--draft-rank": int("draftRank", 1, 512, "R", "draft head backbone rank"),
  "--draft-transport": oneOf(
    "draftTransport",
    DRAFT_TRANSPORTS,
    "T",
    "drafter link: tcp | unix | zmq | tls | shm (same host, shared memory)",
  ),
  "--drafter": oneOf(
    "drafter",
    DRAFTERS,
    "D",
    "worker drafter: reference (JavaScript head) | onnx (the head exported to ONNX, @tapwire/drafter-onnx)",
  ),
  "--ec-data": oneOf("ecData", EC_DATA_PLANES, "T", "embedding data plane: tcp | unix"),
  "--encoders": int(
    "encoders",
    -1,
    16,
    "N",
    "encoder processes (-1: one, or one per engine with --engines); N >= 2 places transfers through their residency events (EC-CONTRACT 10); multi-instance: M encoders shared by every engine (-1: as many as engines; 0: local media)",
  ),
  "--requests": int("requests", 1, 1_000_000, "N", "requests in the run"),
  "--rate": num("rate", 0, 1e6, "R", "arrivals per second (Poisson); 0 = all at once"),
  "--max-new-tokens": int("maxNewTokens", 1, 100_000, "N", "longest generation (lengths drawn in [N/2, N])"),
  "--prompt-tokens": int("promptTokens", 2, 100_000, "N", "longest prompt (lengths drawn in [N/2, N])"),
  "--prompt-pool": int("promptPool", 0, 1_000_000, "N", "distinct prompts (0 = all distinct)"),
  "--mm-share": num("mmShare", 0, 1, "F", "share of multimodal requests (1-3 media items)"),
  "--media-pool": int("mediaPool", 1, 1_000_000, "N", "distinct media items (smaller: more cache hits)"),
  "--embedding-bytes": int("embeddingBytes", 64, 256 * 1024 * 1024, "B", "bytes of one media embedding"),
  "--sample": bool("sample", "sampled decoding with rejection sampling (CONTRACT 8)"),
  "--temperature": num("temperature", 0.05, 10, "T", "sampling temperature"),
  "--top-k": int("topK", 1, 32, "K", "drafter proposal top-k (1..32)"),
  "--seed": int("seed", 0, 0xffffffff, "N", "seed of models, workload and sampling"),
  "--faults": bool("faults", "inject faults (worker kill, link stall, encoder restart, corrupt reply)"),
  "--metrics-listen": valued(
    "metricsListen",
    "listen",
    "tcp://H:P",
    "serve /metrics (harness + worker), /healthz, /readyz while running, e.g. tcp://127.0.0.1:9464",
  ),
  "--metrics-engine-prefix": valued(
    "metricsEnginePrefix",
    "str",
    "P",
    "prefix of the spec-decode series under vLLM's names (docs/dashboards)",
  ),
  "--metrics-port": valued("metricsPort", "port", "P", "same as --metrics-listen tcp://127.0.0.1:P"),
  "--json": valued("json", "str", "FILE", "also write the report as JSON to FILE"),
  "--svg": valued(
    "svg",
    "str",
    "DIR",
    "also write the report's pictures (acceptance, RTT, goodput vs depth) as SVG into DIR",
  ),
  "--depth-policy": valued(
    "depthPolicy",
    "str",
    "P",
    "depth policy: fixed:K (K drafts, 0..N) | budget (--budget / --load-curve) | goodput (cost model + calibration)",
  ),
  "--budget": valued(
    "budget",
    "budget",
    "N|auto",
    "draft tokens verified per round (auto: from --load-curve)",
  ),
  "--load-curve": valued(
    "loadCurve",
    "curve",
    "B:T,..",
    "verify budget T at batch size B, linear between points",
  ),
  "--step-timeout-ms": int("stepTimeoutMs", 10, 600_000, "MS", "drafter STEP timeout"),
  "--ec-deadline-ms": int(
    "ecDeadlineMs",
    10,
    600_000,
    "MS",
    "deadline of one embedding load before local fallback",
  ),
  "--topology": oneOf(
    "topology",
    TOPOLOGIES,
    "T",
    "local (all on 127.0.0.1) | netns (root: engine, worker, encoder in their own network namespaces)",
  ),
  "--link": valued(
    "link",
    "str",
    "SPEC",
    'link of every veth with --topology netns, e.g. "delay=0.5ms jitter=0.1ms rate=10gbit stall=0.1%"',
  ),
  "--progress": oneOf("progress", PROGRESS_MODES, "M", "auto | bar | lines | off"),
  "--verbose": bool("verbose", "pass child process logs through to stderr"),
  "--engines": int(
    "engines",
    1,
    16,
    "E",
    "engines, each with its own worker pool (multi-instance run, docs/harness.md)",
  ),
  "--workers": int(
    "workers",
    1,
    16,
    "K",
    "drafter worker processes shared by the engines (multi-instance run)",
  ),
  "--discovery": oneOf(
    "discovery",
    ["none", "static", "etcd"],
    "D",
    "how pools find workers: static list or etcd (starts an etcd child)",
  ),
  "--placement-discovery": oneOf(
    "placementDiscovery",
    ["static", "etcd"],
    "D",
    "with --encoders 2 or more: the directory finds the encoders by a static list or by their etcd records (starts an etcd child; issue 22)",
  ),
  "--etcd-down-ms": int(
    "etcdDownMs",
    0,
    600_000,
    "MS",
    "with --faults --discovery etcd: how long etcd stays stopped",
  ),
  "--trace": valued(
    "trace",
    "str",
    "FILE",
    "write a link trace of every HELLO and STEP to FILE (docs/trace.md)",
  ),
  "--trace-rows": valued("traceRows", "str", "R", "rows kept in the trace: all | none | N (one STEP in N)"),
  "--ui": bool("ui", "serve the live view (SSE) while the run goes; its URL is printed"),
  "--ui-listen": valued("uiListen", "str", "H:P", "where the live view listens (implies --ui) [127.0.0.1:0]"),
  "--ui-linger-ms": int(
    "uiLingerMs",
    0,
    3_600_000,
    "MS",
    "keep the live view up after the run until closed, at most MS",
  ),
  "--help": bool("help", "print this help and exit"),
};

/** Short spellings. */
export const ALIASES: Record<string, string> = { "-h": "--help" };

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
