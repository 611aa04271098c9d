/**
 * The client options a harness run derives from its config and draft head, shared by the
 * single-worker client (run.ts) and the pools of the multi-engine run (multi/run-multi.ts).
 */
import type { DraftHead } from "@tapwire/reference-model";
import type { HarnessConfig } from "../cli/cli.js";

/** Geometry, identities, timeouts and backoff of a harness client. */
export function clientOptionsOf(cfg: HarnessConfig, head: DraftHead) {
  return {
    window: cfg.window,
    numSpec: cfg.numSpec,
    sampleMode: cfg.sample ? ("top32" as const) : ("greedy" as const),
    numTaps: cfg.numTaps,
    hidden: cfg.hidden,
    vocabSize: cfg.vocab,
    maxSlots: cfg.slots,
    maxRowsPerStep: cfg.slots * Math.max(cfg.window, cfg.numSpec + 1),
    drafterIdentity: head.drafterIdentity,
    markovIdentity: head.markovIdentity,
    requestTimeoutMs: cfg.stepTimeoutMs,
    connectTimeoutMs: Math.max(500, cfg.stepTimeoutMs),
    backoffMs: 25,
    backoffMaxMs: 400,
  };
}
