import { randomInt } from "node:crypto";
import type { Registry } from "@tapwire/stats";
import type { LinkTap } from "@tapwire/trace";
import type { ClientOptions, RpcClient } from "@tapwire/transport";
import type { Logger } from "pino";
import { badOption, finiteAtLeast, intInRange } from "./check.js";
import type { Clock } from "./clock.js";
import { ClientError } from "./errors.js";

/** Sample modes accepted by {@link RemoteDraftClientOptions.sampleMode} (CONTRACT 6.1, 8). */
export const SAMPLE_MODES = { greedy: 0, top32: 1 } as const;

/** Creates the transport client of one connection attempt (default: `makeClient` of `@tapwire/transport`). */
export type TransportFactory = (endpoint: string, options: ClientOptions) => RpcClient;

/** Defaults of {@link RemoteDraftClientOptions}. */
export const CLIENT_DEFAULTS = {
  /** connect + HELLO timeout, ms. */
  connectTimeoutMs: 2_000,
  /** STEP / PING / STATS / RESET timeout, ms. */
  requestTimeoutMs: 1_000,
  /** First reconnect delay, ms (CONTRACT 9.1; the seed's production value). */
  backoffMs: 5_000,
  /** Reconnect delay ceiling, ms. */
  backoffMaxMs: 60_000,
  /** Connect-failure log cadence after the first failure of a run, ms (CONTRACT 9.1). */
  connectFailLogMs: 60_000,
  clientName: "tapwire-client",
  wantMargin: true,
  sampleMode: "greedy",
} as const;

/** Options of {@link RemoteDraftClient}. Every option is validated in the constructor. */
export interface RemoteDraftClientOptions {
  /** Worker endpoint URL (`tcp://`, `unix://`, `tls://`, `zmq+tcp://`, `zmq+ipc://`, `shm+unix://`; CONTRACT 3, issue 23). */
  endpoint: string;
  /** connect + HELLO timeout in ms (default 2000). */
  connectTimeoutMs?: number;
  /** STEP / PING / STATS / RESET timeout in ms (default 1000). */
  requestTimeoutMs?: number;
  /** First reconnect delay in ms (default 5000); doubles per failure (CONTRACT 9.1). */
  backoffMs?: number;
  /** Reconnect delay ceiling in ms (default 60000); >= backoffMs. */
  backoffMaxMs?: number;
  /** Window `W`, rows kept per slot (1..4096). */
  window: number;
  /** Draft tokens per request `N` (1..32). */
  numSpec: number;
  /** `"greedy"` (default) or `"top32"` (CONTRACT 8). */
  sampleMode?: "greedy" | "top32";
  /** Tap vectors per row. */
  numTaps: number;
  /** bf16 values per tap vector; `row_bytes = numTaps * hidden * 2`. */
  hidden: number;
  /** Target vocabulary size (>= 32 for top32). */
  vocabSize: number;
  /** Slots this client uses (`slot < maxSlots`), asked in HELLO. */
  maxSlots: number;
  /** Rows per STEP at most, asked in HELLO. */
  maxRowsPerStep: number;
  /** SHA-256 of the drafter's weights (32 bytes). */
  drafterIdentity: Uint8Array;
  /** SHA-256 of the Markov head's weights (32 bytes). */
  markovIdentity: Uint8Array;
  /** Ask for margins (HELLO WANT_MARGIN; default true). */
  wantMargin?: boolean;
  /** Shared token for the HELLO HMAC (CONTRACT 6.1); none by default. */
  token?: string | Uint8Array;
  /** Client name sent in HELLO (at most 32 UTF-8 bytes; default "tapwire-client"). */
  clientName?: string;
  /** Session id (1..2^32-1); default a random non-zero u32 from node:crypto (CONTRACT 6.2). */
  sessionId?: number;
  /**
   * Sequence number of the last frame sent before this client's first (default 0, so the first
   * frame is seq 1). For tests of the wrap rule: the client starts a new session before its seq
   * would wrap (CONTRACT 6.2).
   */
  initialSeq?: number;
  /** Transport client factory (default `makeClient` of `@tapwire/transport`). */
  transportFactory?: TransportFactory;
  /** Extra transport options (TLS, maxMessageBytes); the client sets connectTimeoutMs. */
  transportOptions?: ClientOptions;
  /** Time source (default the real clock with unref'd timers). */
  clock?: Clock;
  /** pino logger (default: none, the client is silent; pass one to see connect failures and the like). */
  logger?: Logger;
  /** Stats registry (default a new one with prefix "tapwire_client_"). */
  registry?: Registry;
  /** Start the background connect loop in the constructor (default true). */
  autoStart?: boolean;
  /** Connect-failure log cadence in ms after the first failure of a run (default 60000). */
  connectFailLogMs?: number;
  /**
   * Link capture (issue 24): every OK HELLO and every STEP request and reply are handed to this
   * tap (a `TraceWriter` of `@tapwire/trace`), which copies them into its ring off the hot path.
   * The request is tapped after it was handed to the transport, while the worker drafts.
   */
  trace?: LinkTap;
}

/** The options after validation and defaults. */
export interface ResolvedClientOptions {
  /** Worker endpoint URL. */
  readonly endpoint: string;
  /** Connect + HELLO timeout, ms. */
  readonly connectTimeoutMs: number;
  /** STEP / PING / STATS / RESET timeout, ms. */
  readonly requestTimeoutMs: number;
  /** First reconnect delay, ms (CONTRACT 9.1). */
  readonly backoffMs: number;
  /** Largest reconnect delay, ms. */
  readonly backoffMaxMs: number;
  /** Window `W` (1..4096). */
  readonly window: number;
  /** Drafts per request `N` (1..32). */
  readonly numSpec: number;
  /** `"greedy"` or `"top32"` (CONTRACT 8). */
  readonly sampleMode: "greedy" | "top32";
  /** True in top32 sessions. */
  readonly sampled: boolean;
  /** Tap layers per row. */
  readonly numTaps: number;
  /** Hidden size per tap. */
  readonly hidden: number;
  /** `numTaps * hidden * 2` (bf16). */
  readonly rowBytes: number;
  /** Vocabulary size; draft ids are checked against it (CONTRACT 6.3). */
  readonly vocabSize: number;
  /** Slots asked for in the HELLO. */
  readonly maxSlots: number;
  /** Rows per STEP asked for in the HELLO. */
  readonly maxRowsPerStep: number;
  /** SHA-256 of the drafter's weights (32 bytes). */
  readonly drafterIdentity: Uint8Array;
  /** SHA-256 of the Markov head's weights (32 bytes). */
  readonly markovIdentity: Uint8Array;
  /** HELLO flag WANT_MARGIN. */
  readonly wantMargin: boolean;
  /** Shared token for the HELLO's HMAC, or null (zeros). */
  readonly token: string | Uint8Array | null;
  /** `client_name` of the HELLO (at most 32 UTF-8 bytes). */
  readonly clientName: string;
  /** The first session id (random non-zero u32 unless given). */
  readonly sessionId: number;
  /** The seq before the first frame (the first frame uses `initialSeq + 1`). */
  readonly initialSeq: number;
  /** At most one connect-failure log line per this many ms after the first of a run. */
  readonly connectFailLogMs: number;
}

const bad = badOption;

function int(o: Record<string, unknown>, name: string, min: number, max: number, dflt?: number): number {
  return intInRange(name, o[name] ?? dflt, min, max);
}

function ms(o: Record<string, unknown>, name: string, min: number, dflt: number): number {
  return finiteAtLeast(name, o[name] ?? dflt, min);
}

/** Validates every option, naming the first bad one; fills defaults. */
export function resolveOptions(options: RemoteDraftClientOptions): ResolvedClientOptions {
  if (options === null || typeof options !== "object") {
    throw new ClientError("CLIENT_BAD_OPTION", "options must be an object");
  }
  const o = options as unknown as Record<string, unknown>;
  const endpoint = o.endpoint;
  if (typeof endpoint !== "string" || !/^(tcp|unix|tls|zmq\+tcp|zmq\+ipc|shm\+unix):\/\/./.test(endpoint)) {
    throw bad("endpoint", "a tcp://, unix://, tls://, zmq+tcp://, zmq+ipc:// or shm+unix:// URL", endpoint);
  }
  const connectTimeoutMs = ms(o, "connectTimeoutMs", 1, CLIENT_DEFAULTS.connectTimeoutMs);
  const requestTimeoutMs = ms(o, "requestTimeoutMs", 1, CLIENT_DEFAULTS.requestTimeoutMs);
  const backoffMs = ms(o, "backoffMs", 0, CLIENT_DEFAULTS.backoffMs);
  const backoffMaxMs = ms(o, "backoffMaxMs", 0, CLIENT_DEFAULTS.backoffMaxMs);
  if (backoffMaxMs < backoffMs) throw bad("backoffMaxMs", `>= backoffMs (${backoffMs})`, backoffMaxMs);
  const window = int(o, "window", 1, 4096);
  const numSpec = int(o, "numSpec", 1, 32);
  const sampleMode = o.sampleMode ?? CLIENT_DEFAULTS.sampleMode;
  if (sampleMode !== "greedy" && sampleMode !== "top32")
    throw bad("sampleMode", '"greedy" or "top32"', sampleMode);
  const numTaps = int(o, "numTaps", 1, 0xffff);
  const hidden = int(o, "hidden", 1, 0x7fffffff);
  const rowBytes = numTaps * hidden * 2;
  if (rowBytes > 0xffffffff) throw bad("hidden", "small enough that numTaps * hidden * 2 fits a u32", hidden);
  const vocabSize = int(o, "vocabSize", sampleMode === "top32" ? 32 : 1, 0x7fffffff);
  const maxSlots = int(o, "maxSlots", 1, 0xffffffff);
  const maxRowsPerStep = int(o, "maxRowsPerStep", 1, 0xffffffff);
  for (const name of ["drafterIdentity", "markovIdentity"] as const) {
    const v = o[name];
    if (!(v instanceof Uint8Array) || v.length !== 32) throw bad(name, "a 32-byte Uint8Array (SHA-256)", v);
  }
  const wantMargin = o.wantMargin ?? CLIENT_DEFAULTS.wantMargin;
  if (typeof wantMargin !== "boolean") throw bad("wantMargin", "a boolean", wantMargin);
  const token = o.token ?? null;
  if (token !== null && !(typeof token === "string" && token.length > 0) && !(token instanceof Uint8Array)) {
    throw bad("token", "a non-empty string or a Uint8Array", token);
  }
  const clientName = o.clientName ?? CLIENT_DEFAULTS.clientName;
  if (
    typeof clientName !== "string" ||
    Buffer.byteLength(clientName, "utf8") > 32 ||
    clientName.includes("\0")
  ) {
    throw bad("clientName", "a string of at most 32 UTF-8 bytes without NUL", clientName);
  }
  const sessionId = o.sessionId === undefined ? randomInt(1, 2 ** 32) : int(o, "sessionId", 1, 0xffffffff);
  const initialSeq = int(o, "initialSeq", 0, 0xffffffff, 0);
  if (o.transportFactory !== undefined && typeof o.transportFactory !== "function") {
    throw bad("transportFactory", "a function", o.transportFactory);
  }
  if (
    o.transportOptions !== undefined &&
    (o.transportOptions === null || typeof o.transportOptions !== "object")
  ) {
    throw bad("transportOptions", "an object", o.transportOptions);
  }
  const clock = o.clock as Clock | undefined;
  if (
    clock !== undefined &&
    (clock === null ||
      typeof clock.now !== "function" ||
      typeof clock.setTimeout !== "function" ||
      typeof clock.clearTimeout !== "function")
  ) {
    throw bad("clock", "an object with now, setTimeout and clearTimeout", clock);
  }
  const logger = o.logger as Logger | undefined;
  if (logger !== undefined && (logger === null || typeof logger.warn !== "function")) {
    throw bad("logger", "a pino logger", logger);
  }
  const registry = o.registry as Registry | undefined;
  if (registry !== undefined && (registry === null || typeof registry.counter !== "function")) {
    throw bad("registry", "a @tapwire/stats Registry", registry);
  }
  if (o.autoStart !== undefined && typeof o.autoStart !== "boolean")
    throw bad("autoStart", "a boolean", o.autoStart);
  const connectFailLogMs = ms(o, "connectFailLogMs", 0, CLIENT_DEFAULTS.connectFailLogMs);
  const trace = o.trace as LinkTap | undefined;
  if (
    trace !== undefined &&
    (trace === null || typeof trace.request !== "function" || typeof trace.reply !== "function")
  ) {
    throw bad("trace", "a LinkTap (an object with request and reply, e.g. a TraceWriter)", trace);
  }
  return {
    endpoint,
    connectTimeoutMs,
    requestTimeoutMs,
    backoffMs,
    backoffMaxMs,
    window,
    numSpec,
    sampleMode,
    sampled: sampleMode === "top32",
    numTaps,
    hidden,
    rowBytes,
    vocabSize,
    maxSlots,
    maxRowsPerStep,
    drafterIdentity: Uint8Array.from(o.drafterIdentity as Uint8Array),
    markovIdentity: Uint8Array.from(o.markovIdentity as Uint8Array),
    wantMargin,
    token: token as string | Uint8Array | null,
    clientName,
    sessionId,
    initialSeq,
    connectFailLogMs,
  };
}
