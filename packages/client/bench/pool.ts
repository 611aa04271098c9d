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
// The null drafter in both (drafting would dominate and hide the link). The run is `BLOCKS`
// blocks; in each, the one_process arrangement then the two_processes one run ITERS / BLOCKS
// iterations, and an iteration is one round of each of the arrangement's three contenders in a
// fresh random order (seeded): no contender always follows the same one (a fixed order favoured
// the one right after a round on the same worker). p50 per contender, ratios within the same run,
// the ratio of each block (their spread shows the noise), and the client process's CPU per round
// (process.cpuUsage: the pool's client-side cost whatever the scheduler does).
// `tsx bench/pool.ts` runs the rows alone (one JSON object on stdout).
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
const BLOCKS = 5;
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
  const l: Line = { name, link, core, reqs, samples: [], cpu: [] };
  for (let i = 0; i < 300; i++) {
    const r = await step(l);
    if (i > 20 && r.outcome === "ok" && r.resynced === 0 && r.deferred === 0) break;
    if (i === 299) throw new Error(`pool bench warm-up did not settle (${r.outcome})`);
  }
  l.samples.length = 0;
  l.cpu.length = 0;
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

/** p50 of `a` over p50 of `b`, whole run and per block of consecutive rounds. */
function ratios(a: Line, b: Line): { ratio: number; blocks: number[] } {
  const per = Math.floor(a.samples.length / BLOCKS);
  const blocks: number[] = [];
  for (let i = 0; i < BLOCKS; i++) {
    blocks.push(
      r3(p50(a.samples.slice(i * per, (i + 1) * per)) / p50(b.samples.slice(i * per, (i + 1) * per))),
    );
  }
  return { ratio: r3(p50(a.samples) / p50(b.samples)), blocks };
}

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

function report(a: Arrangement, processes: number, how: string): Record<string, unknown> {
  const p2 = ratios(a.pool2, a.one);
  const p1 = ratios(a.pool1, a.one);
  const pool = a.pool2.link as WorkerPool;
  return {
    processes,
    how,
    one_member_client_p50_us: Math.round(p50(a.one.samples)),
    pool_2_members_p50_us: Math.round(p50(a.pool2.samples)),
    pool_1_member_p50_us: Math.round(p50(a.pool1.samples)),
    pool2_vs_one_ratio: p2.ratio,
    pool2_vs_one_block_ratios: p2.blocks,
    pool1_vs_one_ratio: p1.ratio,
    pool1_vs_one_block_ratios: p1.blocks,
    client_cpu_p50_us: {
      one: Math.round(p50(a.one.cpu)),
      pool2: Math.round(p50(a.pool2.cpu)),
      pool1: Math.round(p50(a.pool1.cpu)),
    },
    members: pool.members().map((m) => ({
      endpoint: m.endpoint,
      slots: m.assigned,
      steps: m.steps,
      rtt_us: Math.round(m.rttUs),
    })),
  };
}

/** The pool rows: p50 round time in µs per contender and the same-run ratios, per arrangement. */
export async function poolRows(): Promise<Record<string, unknown>> {
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
    const rnd = prng(21);
    const per = Math.floor(ITERS / BLOCKS);
    for (let b = 0; b < BLOCKS; b++) {
      for (const arr of [one, two]) {
        const order = [arr.one, arr.pool2, arr.pool1];
        for (let i = 0; i < per; i++) {
          shuffle(order, rnd);
          for (const l of order) await step(l);
        }
      }
    }
    const oneProcess = report(
      one,
      2,
      "both members are workers in ONE child process (bench/worker-servers.ts); the baseline client talks to the first of them",
    );
    return {
      shape: `${SLOTS} slots x 1 row (${ROW_BYTES} B rows), null drafter, tcp loopback`,
      iterations: Math.floor(ITERS / BLOCKS) * BLOCKS,
      blocks: BLOCKS,
      load_average: (await import("node:os")).loadavg().map((x) => Math.round(x * 100) / 100),
      target: "one_process.pool2_vs_one_ratio <= 1.2 (same run)",
      pool2_vs_one_ratio: oneProcess.pool2_vs_one_ratio,
      one_process: oneProcess,
      two_processes: report(
        two,
        3,
        "one tapwire-worker child per member; the baseline client talks to the first (not the target: three processes)",
      ),
    };
  } finally {
    for (const l of lines) await l.link.close();
    for (const c of children) await c.kill();
  }
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
