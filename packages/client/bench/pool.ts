// Pool rows of the client bench (issue 21, CONTRACT 12.2): a full RoundCore round of 64 slots x 1
// row over a WorkerPool of 2 members (32 slots each, one STEP per member, concurrently) versus
// the same round over one RemoteDraftClient to one of those workers, and over a pool of that one
// worker alone (the pool's own cost). Workers: two `tapwire-worker --drafter null --max-sessions 3`
// children on tcp. The contenders alternate round by round; medians; ratios in the same run.
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
const ITERS = Number(process.env.BENCH_POOL_ITERS ?? 400);
const DRAFTER_ID = new Uint8Array(32).fill(1);
const MARKOV_ID = new Uint8Array(32).fill(2);

const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");

async function worker(): Promise<{ child: ChildHandle; endpoint: string }> {
  const child = await spawnBin(WORKER_BIN, [
    "--drafter",
    "null",
    "--listen",
    "tcp://127.0.0.1:0",
    "--window",
    String(WINDOW),
    "--num-spec",
    String(NUM_SPEC),
    "--vocab",
    String(VOCAB),
    "--num-taps",
    String(NUM_TAPS),
    "--hidden",
    String(HIDDEN),
    "--drafter-identity",
    hex(DRAFTER_ID),
    "--markov-identity",
    hex(MARKOV_ID),
    "--max-slots",
    String(SLOTS),
    "--max-rows-per-step",
    String(SLOTS * WINDOW),
    "--max-sessions",
    "3",
    "--log-level",
    "warn",
  ]);
  const eps = child.readyLine.json?.endpoints as string[];
  return { child, endpoint: eps[0]! };
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
  core: RoundCore;
  reqs: {
    slot: number;
    generation: number;
    anchorPos: number;
    anchorToken: number;
    newRows: Uint8Array | null;
  }[];
  samples: number[];
  close(): Promise<void>;
}

async function line(link: DraftLink & { close(): Promise<void> }): Promise<Line> {
  const core = new RoundCore({ client: link });
  const prompt = new Uint8Array(WINDOW * ROW_BYTES).fill(7);
  const reqs = Array.from({ length: SLOTS }, (_, s) => ({
    slot: s,
    generation: 1,
    anchorPos: WINDOW,
    anchorToken: 1,
    newRows: prompt as Uint8Array | null,
  }));
  const l: Line = { core, reqs, samples: [], close: () => link.close() };
  for (let i = 0; i < 300; i++) {
    const r = await step(l);
    if (i > 20 && r.outcome === "ok" && r.resynced === 0 && r.deferred === 0) break;
    if (i === 299) throw new Error(`pool bench warm-up did not settle (${r.outcome})`);
  }
  l.samples.length = 0;
  return l;
}

const row = new Uint8Array(ROW_BYTES).fill(3);

async function step(l: Line) {
  const t = performance.now();
  const r = await l.core.round({ requests: l.reqs as RoundRequest[] });
  l.samples.push((performance.now() - t) * 1000);
  if (r.outcome !== "ok") throw new Error(`pool bench round: ${r.outcome}`);
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

/** The pool rows: p50 round time in µs per contender and the same-run ratios. */
export async function poolRows(): Promise<Record<string, unknown>> {
  const a = await worker();
  const b = await worker();
  const lines: Line[] = [];
  try {
    const one = new RemoteDraftClient({ ...common, endpoint: a.endpoint });
    if (!(await one.waitReady(10_000))) throw new Error("pool bench: no connection");
    const pool2 = new WorkerPool({ ...common, members: [a.endpoint, b.endpoint] });
    const pool1 = new WorkerPool({ ...common, members: [a.endpoint] });
    if (!(await pool2.waitReady(10_000, 2)) || !(await pool1.waitReady(10_000, 1))) {
      throw new Error("pool bench: pool not ready");
    }
    const lOne = await line(one);
    const lPool2 = await line(pool2);
    const lPool1 = await line(pool1);
    lines.push(lOne, lPool2, lPool1);
    for (let i = 0; i < ITERS; i++) {
      // rotating order, one round each
      for (let k = 0; k < 3; k++) await step(lines[(i + k) % 3]!);
    }
    const one50 = p50(lOne.samples);
    const pool250 = p50(lPool2.samples);
    const pool150 = p50(lPool1.samples);
    const members = pool2.members().map((m) => ({ endpoint: m.endpoint, slots: m.assigned, steps: m.steps }));
    return {
      shape: `${SLOTS} slots x 1 row (${ROW_BYTES} B rows)`,
      iterations: ITERS,
      one_member_client_p50_us: Math.round(one50),
      pool_2_members_p50_us: Math.round(pool250),
      pool_1_member_p50_us: Math.round(pool150),
      pool2_vs_one_ratio: Math.round((pool250 / one50) * 1000) / 1000,
      pool1_vs_one_ratio: Math.round((pool150 / one50) * 1000) / 1000,
      target: "pool2_vs_one_ratio <= 1.2 (same run)",
      members,
    };
  } finally {
    for (const l of lines) await l.close();
    await a.child.kill();
    await b.child.kill();
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
