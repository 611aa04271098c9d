/**
 * The harness configuration: its shape, its defaults (and the defaults `--sample` and `--faults`
 * change), and what is derived from it.
 */
/** Transports of the drafter link (CONTRACT 3). */
export const DRAFT_TRANSPORTS = ["tcp", "unix", "zmq", "tls", "shm"] as const;
export type DraftTransport = (typeof DRAFT_TRANSPORTS)[number];
/** Drafters the worker serves the head with: the JavaScript head, or its ONNX export (@tapwire/drafter-onnx). */
export const DRAFTERS = ["reference", "onnx"] as const;
export type DrafterKind = (typeof DRAFTERS)[number];
/** Data planes of the encoder-cache transfer (EC-CONTRACT 5.4). */
export const EC_DATA_PLANES = ["tcp", "unix"] as const;
export type EcDataPlane = (typeof EC_DATA_PLANES)[number];
/** Where the processes run: all on this host's loopback, or each in its own network namespace (docs/harness.md). */
export const TOPOLOGIES = ["local", "netns"] as const;
export type TopologyKind = (typeof TOPOLOGIES)[number];
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
  /**
   * Encoder processes. -1 (default): one, or one per engine in a multi-instance run. In a classic
   * run 2 or more place transfers through their residency events (EC-CONTRACT 10); in a
   * multi-instance run M encoders shared by every engine process (0: local media; issue 21).
   */
  encoders: number;
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
  /**
   * `local`: every process on 127.0.0.1. `netns` (root only): the engine, the worker and the
   * encoder each in a network namespace, joined through a router namespace by veth pairs.
   */
  topology: TopologyKind;
  /** The link of every veth with `--topology netns` (`delay=1ms jitter=0.2ms rate=1gbit stall=0.1%`, or `none`). */
  link: string;
  progress: ProgressMode;
  /** Log child processes' stderr and the engine's debug lines. */
  verbose: boolean;
  // many instances (issue 21, CONTRACT 12.2): src/multi/
  /** Engines, each with its own WorkerPool (in this process, one session each). */
  engines: number;
  /** Drafter worker processes, shared (`--max-sessions` = engines). */
  workers: number;
  /** Where the pools find the workers: `none` (one engine, one worker: the classic run), `static` or `etcd`. */
  discovery: "none" | "static" | "etcd";
  /** Issue 22: where the `--encoders N` (N >= 2) placement directory finds the encoders: `static` or `etcd`. */
  placementDiscovery: "static" | "etcd";
  /** How long `--faults` keeps etcd stopped in a multi-instance run, ms. */
  etcdDownMs: number;
  /** Write a link trace of the engine's client to this file (null: off; docs/trace.md). */
  trace: string | null;
  /** Which STEPs keep their rows in the trace: `all`, `none` or `N` (one STEP in N). */
  traceRows: string;
  /** Serve the live view while the run goes (docs/harness.md "Live view"). */
  ui: boolean;
  /** Where the live view listens, `HOST:PORT` or `tcp://HOST:PORT` (default 127.0.0.1:0). */
  uiListen: string | null;
  /** With `ui`: keep the page up after the run until its viewers close it, at most this long (ms). */
  uiLingerMs: number;
  /** Write the report's pictures (SVG) into this folder (null: off). */
  svg: string | null;
  /** Prefix of the vLLM-named series on /metrics (vLLM's engine prefix). */
  metricsEnginePrefix: string;
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
  encoders: -1,
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
  topology: "local",
  link: "none",
  progress: "auto",
  verbose: false,
  engines: 1,
  workers: 1,
  discovery: "none",
  placementDiscovery: "static",
  etcdDownMs: 10_000,
  trace: null,
  traceRows: "all",
  ui: false,
  uiListen: null,
  uiLingerMs: 0,
  svg: null,
  metricsEnginePrefix: "vllm:",
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
