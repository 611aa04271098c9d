// Pool rows of the client bench (issue 21, CONTRACT 12.2): a full RoundCore round of 64 slots x 1
// row over a WorkerPool of 2 members (32 slots each, one STEP per member, concurrently) versus the
// same round over one RemoteDraftClient to one of those workers, and over a pool of that one
// worker alone (the pool's own cost), in two arrangements:
//
// - `one_process` (the target row): both members are workers of ONE child process
//   (bench/worker-servers.ts: two `createWorker`s of @tapwire/worker, each its own WorkerCore,
//   listener and null drafter, one event loop). Client and workers then run on two processes, as
//   many as the one-client baseline: the pool's cost is what the pool adds (two connections, two
//   STEP frames and replies, split and merge), not a third process competing for the same cores.
// - `two_processes` (kept, reported, not the target): two `tapwire-worker --drafter null
//   --max-sessions 3` children, one per member. On a machine with fewer cores than processes this
//   measures the scheduler as much as the pool.
//
// The null drafter in both (drafting would dominate and hide the link). The run is `REPS` reps,
// each with fresh worker processes and fresh clients (a rep's ratios carry a bias of their own,
// the same in all of its rounds: where its buffers and connections landed); in a rep the two
// arrangements take turns (one, two, one, two; ITERS / REPS iterations each), and an iteration
// is one round of each of the arrangement's three contenders in a fresh random order (seeded): no
// contender always follows the same one (a fixed order favoured the one right after a round on
// the same worker). Reported: the median over the reps of each rep's ratio of p50s (same run),
// every rep's ratio, p50s over all reps, the client process's CPU per round
// (process.cpuUsage: the pool's client-side cost whatever the scheduler does), and the pool's own
// time per round (`pool_own_p50_us`: its connectionEpoch and slotEpoch calls, its step up to the
// first member STEP and from the last member reply on; the member clients' own work, which a
// single client does too, is excluded), measured by wrapping those methods.
// `tsx bench/pool.ts` runs the rows alone (one JSON object on stdout).
import { loadavg } from "node:os";
import { fileURLToPath } from "node:url";
import { type ChildHandle, spawnBin } from "@tapwire/testing";
import { pino } from "pino";
import { type DraftLink, RemoteDraftClient, RoundCore, type RoundRequest, WorkerPool } from "../src/index.js";
import { WORKER_BIN } from "../test/worker-bin.js";

const NUM_TAPS = 3;
const HIDDEN = 4096;
const ROW_BYTES = NUM_TAPS * HIDDEN * 2;
const WINDOW = 16;
const NUM_SPEC = 4;
const VOCAB = 32_000;
const SLOTS = 64;
const ITERS = Number(process.env.BENCH_POOL_ITERS ?? 600);
const REPS = Number(process.env.BENCH_POOL_REPS ?? 5);
const DRAFTER_ID = new Uint8Array(32).fill(1);
const MARKOV_ID = new Uint8Array(32).fill(2);
const WORKER_SERVERS = fileURLToPath(new URL("./worker-servers.ts", import.meta.url));

const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");

// `tapwire-worker` flags (bench/worker-servers.ts takes the same)
const GEOMETRY_FLAGS = Object.entries({
  window: WINDOW,
  "num-spec": NUM_SPEC,
  vocab: VOCAB,
  "num-taps": NUM_TAPS,
  hidden: HIDDEN,
  "drafter-identity": hex(DRAFTER_ID),
  "markov-identity": hex(MARKOV_ID),
  "max-slots": SLOTS,
  "max-rows-per-step": SLOTS * WINDOW,
  "max-sessions": 3,
  ...(process.env.SBW ? { "slot-buffer-windows": process.env.SBW } : {}),
}).flatMap(([flag, value]) => [`--${flag}`, String(value)]);

/** One `tapwire-worker --drafter null` child: one worker. */
async function workerBin(): Promise<{ child: ChildHandle; endpoints: string[] }> {
  const child = await spawnBin(WORKER_BIN, [
    "--drafter",
    "null",
    "--listen",
    "tcp://127.0.0.1:0",
    ...GEOMETRY_FLAGS,
    "--log-level",
    "warn",
  ]);
  return { child, endpoints: child.readyLine.json?.endpoints as string[] };
}

/** One child process holding `count` independent workers (bench/worker-servers.ts). */
async function workersInOneProcess(count: number): Promise<{ child: ChildHandle; endpoints: string[] }> {
  const child = await spawnBin(
    WORKER_SERVERS,
    ["--workers", String(count), "--listen", "tcp://127.0.0.1:0", ...GEOMETRY_FLAGS],
    { nodeArgs: ["--import", "tsx"] },
  );
  return { child, endpoints: child.readyLine.json?.endpoints as string[] };
}

const common = {
  drafterIdentity: DRAFTER_ID,
  markovIdentity: MARKOV_ID,
  window: WINDOW,
  numSpec: NUM_SPEC,
  numTaps: NUM_TAPS,
  hidden: HIDDEN,
  vocabSize: VOCAB,
  maxSlots: SLOTS,
  maxRowsPerStep: SLOTS * WINDOW,
  requestTimeoutMs: 10_000,
  logger: pino({ level: "silent" }),
};

interface Line {
  name: string;
  link: DraftLink & { close(): Promise<void> };
  core: RoundCore;
  reqs: {
    slot: number;
    generation: number;
    anchorPos: number;
    anchorToken: number;
    newRows: Uint8Array | null;
  }[];
  /** Round wall time, µs. */
  samples: number[];
  /** Client process CPU (user + system) per round, µs. */
  cpu: number[];
  /** A pool's own time per round, µs (see the header). */
  own: number[];
}

// Wraps a pool's DraftLink methods and its members' step to time what the pool itself does in a
// round (the member clients' work excluded); pushes one sample per round into `own`.
export function timePoolOwn(pool: WorkerPool, endpoints: readonly string[], own: number[]): void {
  let acc = 0;
  let firstCall = 0;
  let lastDone = 0;
  const ce = pool.connectionEpoch.bind(pool);
  pool.connectionEpoch = () => {
    const t = performance.now();
    const r = ce();
    acc = performance.now() - t;
    return r;
  };
  const se = pool.slotEpoch.bind(pool);
  pool.slotEpoch = (slot, fresh) => {
    const t = performance.now();
    const r = se(slot, fresh);
    acc += performance.now() - t;
    return r;
  };
  for (const ep of endpoints) {
    const c = pool.member(ep)!;
    const st = c.step.bind(c);
    c.step = (call) => {
      if (firstCall === 0) firstCall = performance.now();
      return st(call).then((o) => {
        lastDone = performance.now();
        return o;
      });
    };
  }
  const step = pool.step.bind(pool);
  pool.step = async (call) => {
    firstCall = 0;
    const t = performance.now();
    const o = await step(call);
    const end = performance.now();
    own.push((acc + (firstCall === 0 ? end - t : firstCall - t + (end - lastDone))) * 1000);
    return o;
  };
}

async function line(name: string, link: DraftLink & { close(): Promise<void> }): Promise<Line> {
  const core = new RoundCore({ client: link });
  const prompt = new Uint8Array(WINDOW * ROW_BYTES).fill(7);
  const reqs = Array.from({ length: SLOTS }, (_, s) => ({
    slot: s,
    generation: 1,
    anchorPos: WINDOW,
    anchorToken: 1,
    newRows: prompt as Uint8Array | null,
  }));
  const l: Line = { name, link, core, reqs, samples: [], cpu: [], own: [] };
  if (link instanceof WorkerPool)
    timePoolOwn(
      link,
      link.members().map((m) => m.endpoint),
      l.own,
    );
  for (let i = 0; i < 300; i++) {
    const r = await step(l);
    if (i > 20 && r.outcome === "ok" && r.resynced === 0 && r.deferred === 0) break;
    if (i === 299) throw new Error(`pool bench warm-up did not settle (${r.outcome})`);
  }
  l.samples.length = 0;
  l.cpu.length = 0;
  l.own.length = 0;
  return l;
}

const row = new Uint8Array(ROW_BYTES).fill(3);

async function step(l: Line) {
  const c0 = process.cpuUsage();
  const t = performance.now();
  const r = await l.core.round({ requests: l.reqs as RoundRequest[] });
  l.samples.push((performance.now() - t) * 1000);
  const c = process.cpuUsage(c0);
  l.cpu.push(c.user + c.system);
  if (r.outcome !== "ok") throw new Error(`pool bench round (${l.name}): ${r.outcome}`);
  for (const q of l.reqs) {
    q.anchorPos++;
    q.newRows = row;
  }
  return r;
}

function p50(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

const r3 = (x: number) => Math.round(x * 1000) / 1000;

// a seeded PRNG (mulberry32): the same orders in every run
function prng(seed: number): () => number {
  let t = seed >>> 0;
  return () => {
    t = (t + 0x6d2b79f5) >>> 0;
    let x = Math.imul(t ^ (t >>> 15), 1 | t);
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

function shuffle<T>(xs: T[], rnd: () => number): void {
  for (let i = xs.length - 1; i > 0; i--) {
    const j = Math.floor(rnd() * (i + 1));
    [xs[i], xs[j]] = [xs[j]!, xs[i]!];
  }
}

const median = (xs: number[]) => p50(xs);

interface Arrangement {
  one: Line;
  pool2: Line;
  pool1: Line;
}

async function arrangement(prefix: string, eps: string[]): Promise<Arrangement> {
  const one = new RemoteDraftClient({ ...common, endpoint: eps[0]! });
  const pool2 = new WorkerPool({ ...common, members: [eps[0]!, eps[1]!] });
  const pool1 = new WorkerPool({ ...common, members: [eps[0]!] });
  if (
    !(await one.waitReady(10_000)) ||
    !(await pool2.waitReady(10_000, 2)) ||
    !(await pool1.waitReady(10_000, 1))
  ) {
    await Promise.all([one.close(), pool2.close(), pool1.close()]);
    throw new Error(`pool bench (${prefix}): not ready`);
  }
  return {
    one: await line(`${prefix}.one`, one),
    pool2: await line(`${prefix}.pool2`, pool2),
    pool1: await line(`${prefix}.pool1`, pool1),
  };
}

/** Samples of one arrangement over every rep, and each rep's ratios. */
class Tally {
  readonly wall = { one: [] as number[], pool2: [] as number[], pool1: [] as number[] };
  readonly cpu = { one: [] as number[], pool2: [] as number[], pool1: [] as number[] };
  readonly own = { pool2: [] as number[], pool1: [] as number[] };
  readonly pool2Ratios: number[] = [];
  readonly pool1Ratios: number[] = [];
  readonly rtt: number[][] = [];
  add(a: Arrangement): void {
    for (const k of ["one", "pool2", "pool1"] as const) {
      this.wall[k].push(...a[k].samples);
      this.cpu[k].push(...a[k].cpu);
    }
    this.own.pool2.push(...a.pool2.own);
    this.own.pool1.push(...a.pool1.own);
    const one = p50(a.one.samples);
    this.pool2Ratios.push(r3(p50(a.pool2.samples) / one));
    this.pool1Ratios.push(r3(p50(a.pool1.samples) / one));
    this.rtt.push((a.pool2.link as WorkerPool).members().map((m) => Math.round(m.rttUs)));
  }
  report(processes: number, how: string): Record<string, unknown> {
    const w = this.wall;
    return {
      processes,
      how,
      pool2_vs_one_ratio: r3(median(this.pool2Ratios)),
      pool2_vs_one_rep_ratios: this.pool2Ratios,
      pool1_vs_one_ratio: r3(median(this.pool1Ratios)),
      pool1_vs_one_rep_ratios: this.pool1Ratios,
      one_member_client_p50_us: Math.round(p50(w.one)),
      pool_2_members_p50_us: Math.round(p50(w.pool2)),
      pool_1_member_p50_us: Math.round(p50(w.pool1)),
      client_cpu_p50_us: {
        one: Math.round(p50(this.cpu.one)),
        pool2: Math.round(p50(this.cpu.pool2)),
        pool1: Math.round(p50(this.cpu.pool1)),
      },
      pool_own_p50_us: {
        pool2: Math.round(p50(this.own.pool2) * 10) / 10,
        pool1: Math.round(p50(this.own.pool1) * 10) / 10,
      },
      pool2_member_rtt_us_per_rep: this.rtt,
    };
  }
}

/**
 * The pool rows: per arrangement, the median over `REPS` reps (fresh worker processes and
 * clients each) of the rep's p50 ratios, the p50s over every rep, CPU and the pool's own time.
 */
export async function poolRows(): Promise<Record<string, unknown>> {
  const t0 = performance.now();
  const load0 = loadavg();
  const tallies = { one: new Tally(), two: new Tally() };
  const rnd = prng(21);
  const per = Math.max(1, Math.floor(ITERS / REPS));
  for (let rep = 0; rep < REPS; rep++) {
    const children: ChildHandle[] = [];
    const lines: Line[] = [];
    try {
      const shared = await workersInOneProcess(2);
      children.push(shared.child);
      const a = await workerBin();
      children.push(a.child);
      const b = await workerBin();
      children.push(b.child);
      const one = await arrangement("one_process", shared.endpoints);
      const two = await arrangement("two_processes", [a.endpoints[0]!, b.endpoints[0]!]);
      lines.push(one.one, one.pool2, one.pool1, two.one, two.pool2, two.pool1);
      // the arrangements take turns in halves: a load change reaches both
      for (const arr of [one, two, one, two]) {
        const order = [arr.one, arr.pool2, arr.pool1];
        for (let i = 0; i < per / 2; i++) {
          shuffle(order, rnd);
          for (const l of order) await step(l);
        }
      }
      tallies.one.add(one);
      tallies.two.add(two);
    } finally {
      for (const l of lines) await l.link.close();
      for (const c of children) await c.kill();
    }
  }
  const oneProcess = tallies.one.report(
    2,
    "both members are workers in ONE child process (bench/worker-servers.ts); the baseline client talks to the first of them",
  );
  const r2 = (x: number) => Math.round(x * 100) / 100;
  return {
    shape: `${SLOTS} slots x 1 row (${ROW_BYTES} B rows), null drafter, tcp loopback`,
    reps: REPS,
    iterations_per_rep: per,
    seconds: Math.round((performance.now() - t0) / 100) / 10,
    load_average_start: load0.map(r2),
    load_average_end: loadavg().map(r2),
    target: "one_process.pool2_vs_one_ratio <= 1.2 (median of the reps' same-run ratios)",
    pool2_vs_one_ratio: oneProcess.pool2_vs_one_ratio,
    one_process: oneProcess,
    two_processes: tallies.two.report(
      3,
      "one tapwire-worker child per member; the baseline client talks to the first (not the target: three processes)",
    ),
  };
}

// `tsx bench/pool.ts` runs the pool rows alone
if (process.argv[1]?.endsWith("pool.ts")) {
  poolRows().then(
    (r) => process.stdout.write(`${JSON.stringify(r, null, 2)}\n`),
    (e: unknown) => {
      process.stderr.write(`${e instanceof Error ? e.stack : String(e)}\n`);
      process.exit(1);
    },
  );
}
