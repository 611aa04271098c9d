/**
 * Issue 21: one engine of a multi-instance run as its own process (`node engine-main.js --spec
 * <file> --exit-with-parent`): its own `WorkerPool` (static list or etcd discovery, CONTRACT
 * 12.2) behind `RoundCore`, its own session at every worker, its own consumer connector placing
 * transfers over the run's shared encoders (EC-CONTRACT 10.4, `shared-media.ts`). Talks to the
 * harness in JSON lines (engine-proc.ts): commands on stdin, `listening` / `stats` / `result` on
 * stdout, logs on stderr. Exits when its stdin ends (the harness died, SIGKILL included), when
 * its stdout pipe breaks (the same, seen on the next stats line) or on SIGTERM, releasing its
 * session first.
 */
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { type PoolMemberStats, RoundCore, type RoundResult, WorkerPool } from "@tapwire/client";
import { type EtcdMemberSource, etcdMembers } from "@tapwire/discovery";
import { ConsumerConnector, EC_METRICS_PREFIX } from "@tapwire/ec-connector";
import { DraftHead } from "@tapwire/reference-model";
import { createLogger, Registry } from "@tapwire/stats";
import { budgetFromCurve } from "../cli/cli.js";
import { EcMedia, EcMediaMetrics, LocalMedia } from "../ec/media.js";
import { clientOptionsOf } from "../engine/client-options.js";
import { Engine, EngineMetrics, type MediaSource } from "../engine/engine.js";
import { RoundCoreLink } from "../engine/link.js";
import { makeWorkload } from "../engine/workload.js";
import { HarnessError, HarnessErrorCode } from "../errors.js";
import { ecGeometry } from "../procs/children.js";
import type {
  EngineCommand,
  EngineListening,
  EngineResultLine,
  EngineSpec,
  EngineStats,
  MemberView,
} from "./engine-proc.js";
import { STATS_INTERVAL_MS, targetOf } from "./engine-proc.js";
import { SharedPlacement } from "./shared-media.js";

const emit = (line: EngineListening | EngineStats | EngineResultLine) =>
  process.stdout.write(`${JSON.stringify(line)}\n`);
const note = (m: string) => process.stderr.write(`${m}\n`);

function view(m: PoolMemberStats): MemberView {
  return {
    endpoint: m.endpoint,
    incarnation: m.incarnation,
    state: m.state,
    draining: m.draining,
    assigned: m.assigned,
    steps: m.steps,
    stepsOk: m.stepsOk,
    stepsFailed: m.stepsFailed,
    failoversOut: m.failoversOut,
    movedReleases: m.movedReleases,
  };
}

function count(rec: Record<string, number>, k: string): void {
  rec[k] = (rec[k] ?? 0) + 1;
}

function readSpec(argv: readonly string[]): EngineSpec {
  const i = argv.indexOf("--spec");
  const file = i >= 0 ? argv[i + 1] : undefined;
  if (file === undefined) throw new HarnessError(HarnessErrorCode.USAGE, "engine: --spec <file> is required");
  return JSON.parse(readFileSync(file, "utf8")) as EngineSpec;
}

async function main(): Promise<void> {
  const spec = readSpec(process.argv.slice(2));
  const { cfg, id } = spec;
  const closers: Array<() => Promise<void> | void> = [];
  let closing = false;
  const shutdown = async (code: number) => {
    if (closing) return;
    closing = true;
    for (const c of closers.reverse()) {
      try {
        await c();
      } catch {
        // the process ends anyway
      }
    }
    process.exit(code);
  };
  process.once("SIGTERM", () => void shutdown(0));
  process.once("SIGINT", () => void shutdown(0));
  // stdin lines are the harness's commands; with --exit-with-parent its end is the harness's death
  let share = cfg.faults ? 0.4 : 1;
  let go: () => void = () => {};
  const started = new Promise<void>((r) => {
    go = r;
  });
  const stdin = createInterface({ input: process.stdin });
  stdin.on("line", (l) => {
    let c: EngineCommand | null;
    try {
      c = JSON.parse(l) as EngineCommand | null;
    } catch {
      note(`engine-${id}: ignored a line that is not JSON`);
      return;
    }
    if (c?.cmd === "run") go();
    else if (c?.cmd === "share" && Number.isFinite(c.value) && c.value >= 0 && c.value <= 1) share = c.value;
    else note(`engine-${id}: ignored an unknown command`);
  });
  if (process.argv.includes("--exit-with-parent")) stdin.once("close", () => void shutdown(0));
  // a broken stdout pipe (EPIPE on a stats line) also means the harness is gone
  process.stdout.on("error", () => void shutdown(0));

  const target = targetOf(cfg);
  const head = DraftHead.load(spec.weights, target);
  const source: EtcdMemberSource | null =
    spec.etcd !== null
      ? etcdMembers({
          etcd: spec.etcd.endpoint,
          prefix: spec.etcd.prefix,
          backoffMs: 100,
          backoffMaxMs: 1000,
        })
      : null;
  const pool = new WorkerPool({
    members: source ?? spec.workers ?? [],
    ...clientOptionsOf(cfg, head),
    clientName: `tapwire-harness-e${id}`,
  });
  closers.push(() => source?.close());
  closers.push(() => pool.close());

  // media: the shared encoders through this engine's own connector and directory
  let media: MediaSource = new LocalMedia(cfg.embeddingBytes);
  let placement: SharedPlacement | null = null;
  let ecMetrics: EcMediaMetrics | null = null;
  if (cfg.encoders > 0) {
    const geo = ecGeometry(cfg);
    const ecRegistry = new Registry({ prefix: EC_METRICS_PREFIX });
    const p = new SharedPlacement({
      records: spec.encoders,
      etcd: spec.encoders === null ? spec.etcd : null,
      registry: ecRegistry,
    });
    placement = p;
    closers.push(() => p.close());
    const connector = await ConsumerConnector.create({
      numBlocks: geo.cacheBlocks,
      blockBytes: geo.compat.blockBytes,
      name: `harness-engine-${id}`,
      compatibility: geo.compat,
      ackTimeoutMs: 1000,
      readTimeoutMs: 3000,
      quarantineTimeoutMs: 5000,
      retry: { initialMs: 10, maxMs: 100 },
      heartbeat: geo.hb,
      registry: ecRegistry,
      logger: createLogger({ name: "tapwire-ec", level: cfg.verbose ? "info" : "error", destination: 2 }),
      placement: p.directory,
    });
    closers.push(() => connector.close());
    if (!(await p.waitTrusted(cfg.encoders, 30_000))) {
      throw new HarnessError(
        HarnessErrorCode.PROCESS,
        `engine-${id}: ${p.trusted().length} of ${cfg.encoders} encoders trusted after 30 s (discovery ${p.discovery})`,
      );
    }
    ecMetrics = new EcMediaMetrics(new Registry({ prefix: "tapwire_harness_" }));
    media = new EcMedia({
      connector,
      producer: p.trusted()[0] as string,
      nbytes: cfg.embeddingBytes,
      deadlineMs: cfg.ecDeadlineMs,
      metrics: ecMetrics,
      placement: p,
    });
  }

  const core = new RoundCore({ client: pool });
  const metrics = new EngineMetrics(new Registry({ prefix: "tapwire_harness_" }));
  let rounds = 0;
  let maxRoundMs = 0;
  let roundsOverTimeout = 0;
  const roundsWithoutDrafts: Record<string, number> = {};
  const entriesWithoutDrafts: Record<string, number> = {};
  const memberStats = new Map<string, MemberView>();
  const peakSlots: Record<string, number> = {};
  // the per-round accounting of the report: why an entry or a whole round had no drafts
  const round = core.round.bind(core);
  core.round = async (input) => {
    const ts = performance.now();
    const res: RoundResult = await round(input);
    const ms = performance.now() - ts;
    maxRoundMs = Math.max(maxRoundMs, ms);
    if (ms > cfg.stepTimeoutMs) roundsOverTimeout++;
    rounds++;
    let any = false;
    let wanted = false;
    for (const d of res.drafts) {
      if (d.reason !== "not_requested") wanted = true;
      if (d.k > 0) any = true;
      else if (d.reason !== "not_requested") count(entriesWithoutDrafts, d.reason);
    }
    if (!any && wanted) count(roundsWithoutDrafts, res.outcome);
    for (const m of pool.members()) {
      memberStats.set(m.endpoint, view(m));
      peakSlots[m.endpoint] = Math.max(peakSlots[m.endpoint] ?? 0, m.assigned);
    }
    return res;
  };
  const { requests } = makeWorkload(cfg);
  const engine = new Engine({
    cfg,
    target,
    requests,
    link: new RoundCoreLink(core),
    media,
    budgetFor: (b) => (cfg.budget !== null ? cfg.budget : budgetFromCurve(cfg.loadCurve, b)),
    metrics,
    arrivalCap: ({ total }) => Math.ceil(total * share),
  });

  if (!(await pool.waitReady(30_000, cfg.workers))) {
    throw new HarnessError(
      HarnessErrorCode.PROCESS,
      `engine-${id}: the pool did not reach ${cfg.workers} ready members`,
    );
  }
  const statsTimer = setInterval(() => {
    emit({
      msg: "stats",
      engine: id,
      rounds,
      members: pool.members().map(view),
      encoders: placement?.trusted() ?? [],
      transfersInFlight: media instanceof EcMedia ? media.pending : 0,
    });
  }, STATS_INTERVAL_MS);
  closers.push(() => clearInterval(statsTimer));
  emit({ msg: "listening", engine: id, pid: process.pid, session: pool.sessionId });
  await started;
  const t0 = Date.now();
  const res = await engine.run();
  if (media instanceof EcMedia) await media.drain(10_000);
  const wallMs = Date.now() - t0;
  for (const m of pool.members()) memberStats.set(m.endpoint, view(m));
  emit({
    msg: "result",
    engine: id,
    pid: process.pid,
    session: pool.sessionId,
    outputs: [...res.outputs.entries()],
    tokens: metrics.tokensGenerated.value,
    rounds,
    roundsWithoutDrafts,
    entriesWithoutDrafts,
    maxRoundMs: Math.round(maxRoundMs * 10) / 10,
    roundsOverTimeout,
    members: [...memberStats.values()],
    peakSlots,
    failoverRounds: pool.failoverRounds(),
    media: {
      discovery: placement?.discovery ?? "none",
      transfers: ecMetrics?.transfers.value ?? 0,
      fallbacks: ecMetrics?.fallbacks.value ?? 0,
      placed: placement?.stats.placed ?? 0,
      encodesAsked: placement?.stats.encodesAsked ?? 0,
      byEncoder: Object.fromEntries(placement?.byEncoder ?? []),
      encodersSeen: [...(placement?.seen ?? [])].sort(),
    },
    wallMs,
  });
  // the harness stops it (SIGTERM) once every engine has reported
}

main().catch((e: unknown) => {
  note(`engine: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}`);
  process.exit(3);
});
