/**
 * Parsing and checking the harness's flags (the table is `flag-table.ts`, the configuration
 * `config.ts`).
 */
import { closeSync, existsSync, openSync, statSync, unlinkSync } from "node:fs";
import { parseMetricsListen, StatsError } from "@tapwire/stats";
import { parseLinkSpec, TestingError } from "@tapwire/testing";
import { parseDepthPolicy } from "../depth/depth-sim.js";
import { HarnessError, HarnessErrorCode } from "../errors.js";
import { DEFAULTS, FAULT_DEFAULTS, type HarnessConfig, type LoadPoint, SAMPLE_DEFAULTS } from "./config.js";
import { ALIASES, FLAGS, type Kind } from "./flag-table.js";

export * from "./config.js";
export { helpText } from "./flag-table.js";

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
  // a multi-instance run (src/multi/): tcp links, local media (see docs/harness.md)
  if (cfg.discovery === "none" && (cfg.engines > 1 || cfg.workers > 1)) {
    throw usage("--engines / --workers above 1 need --discovery static or etcd");
  }
  if (cfg.discovery !== "none" && cfg.draftTransport !== "tcp") {
    throw usage("--discovery: multi-instance runs use --draft-transport tcp");
  }
  if (cfg.discovery !== "none" && cfg.topology !== "local") {
    throw usage("--discovery: multi-instance runs use the local topology");
  }
  if (cfg.discovery === "none" && cfg.encoders === 0) {
    throw usage("--encoders: 0 (local media) only in a multi-instance run; a classic run has 1 or more");
  }
  if (cfg.placementDiscovery === "etcd" && (cfg.encoders < 2 || cfg.discovery !== "none")) {
    throw usage("--placement-discovery: etcd needs --encoders 2 or more in a classic run (no --discovery)");
  }
  if (cfg.encoders > 1 && cfg.topology !== "local") {
    throw usage("--encoders: 2 or more (residency events) run in the local topology");
  }
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
  traceRowsOf(cfg.traceRows);
  if (!/^[a-zA-Z_:][a-zA-Z0-9_:]*$/.test(cfg.metricsEnginePrefix)) {
    throw usage(`--metrics-engine-prefix: "${cfg.metricsEnginePrefix}" is not a Prometheus name prefix`);
  }
  if (cfg.uiListen !== null) {
    uiListenOf(cfg.uiListen);
    cfg.ui = true;
  }
  validateTopology(cfg);
  const rowBytes = cfg.numTaps * cfg.hidden * 2;
  if (rowBytes * cfg.window * cfg.slots > 2 ** 30) {
    throw usage(
      `--slots x --window x row bytes = ${rowBytes * cfg.window * cfg.slots} exceeds 1 GiB of rings`,
    );
  }
}

/** `--trace-rows` as the TraceWriter option (all, none, or 1..65535). */
export function traceRowsOf(raw: string): "all" | "none" | number {
  if (raw === "all" || raw === "none") return raw;
  if (/^\d{1,5}$/.test(raw) && Number(raw) >= 1 && Number(raw) <= 65535) return Number(raw);
  throw usage(`--trace-rows: "${raw}" is not all, none or an integer 1..65535`);
}

/** `--ui-listen HOST:PORT` (or `tcp://HOST:PORT`) as host and port. */
export function uiListenOf(raw: string): { host: string; port: number } {
  try {
    return parseMetricsListen(raw.startsWith("tcp://") ? raw : `tcp://${raw}`);
  } catch (e) {
    if (e instanceof StatsError) throw usage(`--ui-listen: ${e.message}`);
    throw e;
  }
}

/** `--topology` and `--link` against each other and the transports (a namespace has no shared unix sockets). */
function validateTopology(cfg: HarnessConfig): void {
  try {
    parseLinkSpec(cfg.link);
  } catch (e) {
    if (e instanceof TestingError) throw usage(`--link: ${e.message}`);
    throw e;
  }
  if (cfg.topology !== "netns") {
    if (cfg.link.trim() !== "none" && cfg.link.trim() !== "") {
      throw usage(`--link "${cfg.link}" needs --topology netns (links are veth pairs between namespaces)`);
    }
    return;
  }
  if (cfg.draftTransport === "unix") {
    throw usage("--draft-transport unix: a unix socket does not cross network namespaces (--topology netns)");
  }
  if (cfg.ecData === "unix" && cfg.mmShare > 0) {
    throw usage("--ec-data unix: a unix socket does not cross network namespaces (--topology netns)");
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
