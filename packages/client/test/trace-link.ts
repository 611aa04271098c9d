// Shared pieces of the link-capture tests (issue 24): a reference head on disk (and a perturbed
// copy), reference / ONNX workers started from the worker bin, and a small engine that drives a
// RemoteDraftClient + RoundCore with realistic bf16 rows.
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  createDefaultPair,
  DEFAULT_DRAFT_CONFIG,
  DEFAULT_TARGET_CONFIG,
  encodeBf16,
  readSafetensors,
  writeSafetensors,
  Xoshiro128,
} from "@tapwire/reference-model";
import { type ChildHandle, spawnBin } from "@tapwire/testing";
import type { LinkTap } from "@tapwire/trace";
import { pino } from "pino";
import { RemoteDraftClient, RoundCore, type RoundRequest } from "../src/index.js";
import { binPath, WORKER_BIN } from "./worker-bin.js";

/** `tapwire-replay` of the installed @tapwire/trace. */
export const REPLAY_BIN = binPath("@tapwire/trace", "tapwire-replay");
/** The harness package: the worker finds @tapwire/drafter-onnx through its dependencies. */
export const HARNESS_DIR = join(import.meta.dirname, "..", "..", "..", "apps", "harness");

/** The geometry of the default reference pair (the worker bin's defaults). */
export const REF = {
  window: DEFAULT_DRAFT_CONFIG.window,
  numSpec: DEFAULT_DRAFT_CONFIG.numSpec,
  numTaps: DEFAULT_TARGET_CONFIG.numTaps,
  hidden: DEFAULT_TARGET_CONFIG.hidden,
  vocabSize: DEFAULT_TARGET_CONFIG.vocabSize,
  rowBytes: DEFAULT_TARGET_CONFIG.numTaps * DEFAULT_TARGET_CONFIG.hidden * 2,
} as const;

/** A temp dir with `head.safetensors` and `perturbed.safetensors`, and the head's identities. */
export function headFiles(): {
  dir: string;
  head: string;
  perturbed: string;
  drafterIdentity: Uint8Array;
  markovIdentity: Uint8Array;
  remove(): void;
} {
  const dir = mkdtempSync(join(tmpdir(), "tapwire-trace-"));
  const { head } = createDefaultPair();
  const path = join(dir, "head.safetensors");
  head.save(path);
  // the perturbed head: every float32 tensor scaled by 1 + 0.3 * noise (a different build's head)
  const md = new Map<string, string>();
  const tensors = readSafetensors(head.toSafetensors(), { metadata: md });
  const rng = new Xoshiro128(99);
  for (const t of tensors.values()) {
    if (t.dtype !== "F32") continue;
    const f = new Float32Array(t.data.slice().buffer);
    for (let i = 0; i < f.length; i++) f[i] = f[i]! * (1 + 0.3 * (rng.nextFloat() * 2 - 1));
    t.data = new Uint8Array(f.buffer);
  }
  const perturbed = join(dir, "perturbed.safetensors");
  writeFileSync(perturbed, writeSafetensors(tensors, md));
  return {
    dir,
    head: path,
    perturbed,
    drafterIdentity: head.drafterIdentity,
    markovIdentity: head.markovIdentity,
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}

/** Starts `tapwire-worker` on a free loopback port; `kind` reference or onnx of `weights`. */
export async function startWorker(
  kind: "reference" | "onnx",
  weights: string,
  extra: string[] = [],
): Promise<{ child: ChildHandle; endpoint: string }> {
  const args =
    kind === "reference"
      ? ["--drafter", "reference", "--weights", weights]
      : ["--drafter", "onnx", "--model", weights];
  const child = await spawnBin(
    WORKER_BIN,
    [...args, "--listen", "tcp://127.0.0.1:0", "--log-level", "warn", ...extra],
    {
      cwd: HARNESS_DIR,
      timeoutMs: 60_000,
    },
  );
  const eps = (child.readyLine.json?.endpoints ?? []) as string[];
  return { child, endpoint: eps[0]! };
}

/** Runs `tapwire-replay` to completion. */
export function runReplay(args: string[]): { code: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [REPLAY_BIN, ...args], { encoding: "utf8", timeout: 120_000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/**
 * Drives `requests` requests through a RemoteDraftClient + RoundCore against `endpoint`, at most
 * `slots` at once; each request has a prompt of 4..27 rows and lives 3..10 rounds, accepting 1..3
 * tokens a round. Rows are bf16 of a seeded normal-ish distribution. Resolves the rounds run and
 * the total round time (ms) as the engine saw it.
 */
export async function driveRun(opts: {
  endpoint: string;
  drafterIdentity: Uint8Array;
  markovIdentity: Uint8Array;
  trace?: LinkTap;
  requests: number;
  slots: number;
  seed?: number;
}): Promise<{ rounds: number; roundMs: number; drafted: number }> {
  const c = new RemoteDraftClient({
    endpoint: opts.endpoint,
    window: REF.window,
    numSpec: REF.numSpec,
    numTaps: REF.numTaps,
    hidden: REF.hidden,
    vocabSize: REF.vocabSize,
    maxSlots: opts.slots,
    maxRowsPerStep: 64 * opts.slots,
    drafterIdentity: opts.drafterIdentity,
    markovIdentity: opts.markovIdentity,
    requestTimeoutMs: 20_000,
    connectTimeoutMs: 10_000,
    logger: pino({ level: "silent" }),
    ...(opts.trace !== undefined ? { trace: opts.trace } : {}),
  });
  try {
    if (!(await c.waitReady(20_000))) throw new Error(`client not ready: ${c.lastError}`);
    const core = new RoundCore({ client: c });
    const rng = new Xoshiro128(opts.seed ?? 5);
    const live = new Map<number, { gen: number; anchor: number; sent: number; left: number }>();
    let started = 0;
    let gen = 1;
    let rounds = 0;
    let drafted = 0;
    let roundMs = 0;
    const rows = (n: number): Uint8Array => {
      const f = new Float32Array(n * REF.numTaps * REF.hidden);
      for (let i = 0; i < f.length; i++)
        f[i] = (rng.nextFloat() + rng.nextFloat() + rng.nextFloat() - 1.5) * 1.6;
      const b = new Uint8Array(n * REF.rowBytes);
      encodeBf16(f, b);
      return b;
    };
    while ((started < opts.requests || live.size > 0) && rounds < 10 * opts.requests) {
      const release: number[] = [];
      for (const [slot, r] of live) {
        if (r.left <= 0) {
          live.delete(slot);
          release.push(slot);
        }
      }
      for (let slot = 0; slot < opts.slots && started < opts.requests; slot++) {
        if (live.has(slot) || release.includes(slot)) continue;
        const prompt = 4 + Math.floor(rng.nextFloat() * 24);
        live.set(slot, { gen: gen++, anchor: prompt, sent: 0, left: 3 + Math.floor(rng.nextFloat() * 8) });
        started++;
      }
      const reqs: RoundRequest[] = [];
      for (const [slot, r] of live) {
        const n = r.anchor - r.sent;
        reqs.push({
          slot,
          generation: r.gen,
          anchorPos: r.anchor,
          anchorToken: Math.floor(rng.nextFloat() * REF.vocabSize),
          newRows: n > 0 ? rows(n) : null,
        });
        r.sent = r.anchor;
      }
      const t0 = performance.now();
      const res = await core.round({ requests: reqs, release });
      roundMs += performance.now() - t0;
      rounds++;
      drafted += res.drafts.filter((d) => d.reason === "ok").length;
      for (const r of live.values()) {
        r.anchor += 1 + Math.floor(rng.nextFloat() * 3);
        r.left--;
      }
    }
    return { rounds, roundMs, drafted };
  } finally {
    await c.close();
  }
}
