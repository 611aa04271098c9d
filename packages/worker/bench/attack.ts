/**
 * Worker under a pre-HELLO flood (JSON on stdout; issue 13, CONTRACT 11): the built
 * `tapwire-worker` (null drafter, rows of 3 x 4096 bf16, so its largest STEP is about 96 MiB) as a
 * child process; 1,000 connections (TAPWIRE_ATTACK_CONNECTIONS) each announcing a 96 MiB message
 * and sending nothing more, reopened as the worker closes them, for TAPWIRE_ATTACK_MS (default
 * 15 s; bench/flood.ts, a process of its own); meanwhile a legitimate client runs STEP rounds
 * (2 slots x 1 row). Reported: the worker's
 * RSS idle and its peak during the flood, and the client's round latency without the flood
 * (baseline, same run, same client) and during it. Run `pnpm --filter @tapwire/worker build` first.
 */
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { rssOf, spawnBin, watchRss } from "@tapwire/testing";
import { FrameStatus, Op } from "@tapwire/wire";
import { NullDrafter } from "../src/index.js";
import { entry, helloFor, Raw, Sess } from "../test/helpers.js";
import { BIN } from "../test/spawn.js";

const CONNECTIONS = Number(process.env.TAPWIRE_ATTACK_CONNECTIONS ?? "1000");
const ATTACK_MS = Number(process.env.TAPWIRE_ATTACK_MS ?? "15000");
const MAX_CONNECTIONS = process.env.TAPWIRE_WORKER_MAX_CONNECTIONS;
const MiB = 1 << 20;
const FLOOD = fileURLToPath(new URL("./flood.ts", import.meta.url));
const GEO = { numTaps: 3, hidden: 4096, window: 8, numSpec: 4, vocabSize: 2048 } as const;

function quantile(sorted: number[], q: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
}

function summary(ms: number[]): Record<string, number> {
  const s = [...ms].sort((a, b) => a - b);
  const r = (x: number) => Math.round(x * 1000) / 1000;
  return {
    rounds: s.length,
    p50_ms: r(quantile(s, 0.5)),
    p99_ms: r(quantile(s, 0.99)),
    max_ms: r(s[s.length - 1] ?? 0),
  };
}

async function main(): Promise<void> {
  const args = ["--drafter", "null", "--listen", "tcp://127.0.0.1:0", "--hidden", String(GEO.hidden)];
  args.push("--window", String(GEO.window), "--log-level", "warn");
  if (MAX_CONNECTIONS !== undefined) args.push("--max-connections", MAX_CONNECTIONS);
  const child = await spawnBin(BIN, args);
  const listening = child.readyLine.json as { endpoints: string[]; maxMessageBytes: number };
  const ep = listening.endpoints[0]!;
  const drafter = new NullDrafter(GEO);
  const raw = await new Raw(ep).connect();
  const s = new Sess(raw, 0xbe7c4, drafter, helloFor(drafter, { maxSlots: 16, maxRowsPerStep: 64 }));
  if ((await s.doHello()).status !== FrameStatus.OK) throw new Error("HELLO refused");
  let pos = 0;
  const round = async (): Promise<number> => {
    const t0 = performance.now();
    const r = await s.step(
      [0, 1].map((slot) => entry({ slot, rowStart: pos, nRows: 1, anchorPos: pos + 1 })),
    );
    const dt = performance.now() - t0;
    if (r.status !== FrameStatus.OK) throw new Error(`STEP status ${r.status}`);
    pos++;
    return dt;
  };
  for (let i = 0; i < 200; i++) await round();
  const baseline: number[] = [];
  const t0 = performance.now();
  while (performance.now() - t0 < Math.min(ATTACK_MS, 5000)) baseline.push(await round());
  const idleRss = rssOf(child.pid);

  const watch = watchRss(child.pid, { intervalMs: 20 });
  const end = performance.now() + ATTACK_MS;
  const flood = spawn(
    process.execPath,
    ["--import", "tsx", FLOOD, ep, String(CONNECTIONS), String(96 * MiB), String(ATTACK_MS)],
    { stdio: ["ignore", "pipe", "inherit"] },
  );
  let floodOut = "";
  flood.stdout!.on("data", (b: Buffer) => {
    floodOut += b.toString();
  });
  const attacker = new Promise<{ opened: number; closedByPeer: number; failed: Record<string, number> }>(
    (resolve, reject) =>
      flood.on("exit", (code) =>
        code === 0 ? resolve(JSON.parse(floodOut)) : reject(new Error(`flood exited ${code}`)),
      ),
  );
  const attacked: number[] = [];
  while (performance.now() < end) attacked.push(await round());
  const { opened, closedByPeer, failed } = await attacker;
  const peakRss = watch.stop().peakBytes;
  const after: number[] = [];
  for (let i = 0; i < 500; i++) after.push(await round());
  const stats = JSON.parse(Buffer.from((await s.simple(Op.STATS)).body).toString("utf8")) as {
    counters: Record<string, number>;
  };
  raw.close();
  await child.kill("SIGTERM");
  const c = stats.counters;
  const base = summary(baseline);
  const under = summary(attacked);
  process.stdout.write(
    `${JSON.stringify(
      {
        bench: "worker pre-HELLO flood (CONTRACT 11)",
        node: process.version,
        worker_max_message_bytes: listening.maxMessageBytes,
        attack: {
          connections_per_wave: CONNECTIONS,
          announced_bytes: 96 * MiB,
          duration_ms: ATTACK_MS,
          opened,
          closed_by_worker: closedByPeer,
          failed,
          max_connections: MAX_CONNECTIONS ?? "default (64)",
        },
        rss: {
          idle_mib: Math.round((idleRss / MiB) * 10) / 10,
          peak_during_attack_mib: Math.round((peakRss / MiB) * 10) / 10,
          peak_minus_idle_mib: Math.round(((peakRss - idleRss) / MiB) * 10) / 10,
        },
        legit_round: { baseline: base, during_attack: under, after: summary(after) },
        ratio_p99_attack_to_baseline: Math.round((under.p99_ms! / base.p99_ms!) * 100) / 100,
        counters: {
          transport_server_too_large: c.transport_server_too_large,
          transport_server_connections_evicted: c.transport_server_connections_evicted,
          transport_server_connections_refused: c.transport_server_connections_refused,
          transport_server_unbound_idle_closed: c.transport_server_unbound_idle_closed,
          transport_server_budget_refused: c.transport_server_budget_refused,
          transport_server_alloc_failures: c.transport_server_alloc_failures,
        },
      },
      null,
      2,
    )}\n`,
  );
}

main().then(
  () => process.exit(0),
  (e: unknown) => {
    process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
    process.exit(1);
  },
);
