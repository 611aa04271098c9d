/**
 * Issue 21: the engine processes of a multi-instance run. Each engine is a child process of the
 * harness (`engine-main.ts`), started like the worker and the encoders (`--exit-with-parent`, its
 * stdin a pipe the harness holds: a killed harness leaves no engine behind). The harness writes
 * its spec to a file and sends commands as JSON lines on the stdin pipe; the engine answers with
 * JSON lines on stdout: `listening` once its pool is ready, `stats` every
 * {@link STATS_INTERVAL_MS}, and one `result` at the end with its outputs, checked lossless by the
 * harness against target-only decoding.
 */
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { PoolMemberStats } from "@tapwire/client";
import type { ProducerRecord } from "@tapwire/ec-connector";
import { TargetModel } from "@tapwire/reference-model";
import type { HarnessConfig } from "../cli/cli.js";

/** How often an engine process prints its `stats` line, ms. */
export const STATS_INTERVAL_MS = 50;

/** What an engine process is told (a JSON file named by its `--spec` flag). */
export interface EngineSpec {
  /** Engine number (0-based). */
  id: number;
  cfg: HarnessConfig;
  /** The draft head's safetensors (the workers serve the same file). */
  weights: string;
  /** Static discovery: the worker endpoints; null with etcd. */
  workers: string[] | null;
  /** `--discovery etcd`: where the pool and the EC directory watch the records. */
  etcd: { endpoint: string; prefix: string } | null;
  /**
   * The shared encoders (EC-CONTRACT 10): their records with static discovery, null with etcd
   * (found through their `--register` records). Unused with `--encoders 0`.
   */
  encoders: ProducerRecord[] | null;
}

/** One member as an engine's pool sees it (the fields of `PoolMemberStats` the report uses). */
export type MemberView = Pick<
  PoolMemberStats,
  | "endpoint"
  | "incarnation"
  | "state"
  | "draining"
  | "assigned"
  | "steps"
  | "stepsOk"
  | "stepsFailed"
  | "failoversOut"
  | "movedReleases"
>;

/** The `listening` line of an engine process: its pool is ready. */
export interface EngineListening {
  msg: "listening";
  engine: number;
  pid: number;
  /** Its pool's session id (the same at every worker, CONTRACT 12.2). */
  session: number;
}

/** The periodic `stats` line: the pool's members now, and the encoders its directory knows. */
export interface EngineStats {
  msg: "stats";
  engine: number;
  rounds: number;
  members: MemberView[];
  /** Control endpoints of the encoders its EC directory trusts now. */
  encoders: string[];
  /** Embedding transfers in flight now. */
  transfersInFlight: number;
}

/** What an engine's media side did (EC-CONTRACT 10.4 placement over the shared encoders). */
export interface EngineMediaResult {
  /** Where the directory found the encoders: `static`, `etcd`, or `none` (`--encoders 0`). */
  discovery: "static" | "etcd" | "none";
  /** Transfers completed, items encoded locally after a failed transfer or no encoder. */
  transfers: number;
  fallbacks: number;
  /** Transfers placed on a trusted holder, and encodes asked of an owner encoder (no holder). */
  placed: number;
  encodesAsked: number;
  /** Transfers asked of each encoder (control endpoint), placed or encode-on-miss. */
  byEncoder: Record<string, number>;
  /** Encoders the directory ever trusted. */
  encodersSeen: string[];
}

/** The final `result` line of an engine process. */
export interface EngineResultLine {
  msg: "result";
  engine: number;
  pid: number;
  session: number;
  /** Generated tokens per request id. */
  outputs: [number, number[]][];
  tokens: number;
  rounds: number;
  roundsWithoutDrafts: Record<string, number>;
  entriesWithoutDrafts: Record<string, number>;
  /** The longest round's link time, ms, and the rounds whose link time passed the STEP timeout. */
  maxRoundMs: number;
  roundsOverTimeout: number;
  /** The last stats of every member its pool ever had (a drained member leaves members()). */
  members: MemberView[];
  /** Most slots each member held at once. */
  peakSlots: Record<string, number>;
  /** Per moved slot: rounds from the old member's first failed STEP to a draft elsewhere. */
  failoverRounds: number[];
  media: EngineMediaResult;
  wallMs: number;
}

/** A command from the harness (one JSON line on the engine's stdin). */
export type EngineCommand = { cmd: "run" } | { cmd: "share"; value: number };

/** The target model of a run (the same in the harness and in every engine process). */
export function targetOf(cfg: HarnessConfig): TargetModel {
  return TargetModel.create({
    vocabSize: cfg.vocab,
    stateDim: cfg.stateDim,
    numTaps: cfg.numTaps,
    hidden: cfg.hidden,
    seed: cfg.seed,
  });
}

/**
 * The engine process's script: next to this file once built; from the sources (vitest) the built
 * `dist/multi/engine-main.js` (`pnpm build` first).
 */
export function engineScript(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  const sibling = join(here, "engine-main.js");
  if (existsSync(sibling)) return sibling;
  return join(here, "..", "..", "dist", "multi", "engine-main.js");
}
