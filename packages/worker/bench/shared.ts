/**
 * `pnpm --filter @tapwire/worker bench:shared`: a shared worker (CONTRACT 12.1) from outside, JSON
 * on stdout, every figure a same-run ratio. The workers are the built `tapwire-worker` bin (child
 * processes); the clients are this process, one TCP connection and one session each, closed loops
 * (a STEP, its reply, the next STEP), every entry NEED_DRAFT with one new row per round. Rows are
 * moderate bf16 values from a pool (like hidden states; see `rowPool`).
 *
 * - `batching`: 8 sessions x 8 entries against one shared worker, batched (the default, with the
 *   batch gather), batched with `--batch-gather-us 0`, and each STEP drafted alone
 *   (`--max-batch-entries 8`: one STEP per drafter call), and 1 session x 64 entries on a K = 1
 *   worker (the same total entries per round): throughput ratio batched / alone (target >= 2 with
 *   ONNX; also the median of the per-block ratios) and p99 STEP RTT ratio batched / single session
 *   (target <= 1.5); for the ONNX drafter (@tapwire/drafter-onnx, the reference head exported) and
 *   the reference drafter. Each configuration also reports the CPU time per STEP of its worker
 *   process and of this (client) process, and the worker's own call metrics; and
 *   `where_the_time_goes`: per STEP, the worker's wall time, its drafter calls' wall time (from its
 *   metrics, over the blocks only), its CPU beside the drafter calls and its time off a CPU.
 * - `unshared_tax`: 1 session x 8 entries, K = 4 vs K = 1, STEPs interleaved: worker CPU per STEP
 *   and STEP RTT ratios (target <= 1.05); for the null drafter also in the steady state, after
 *   V8 has optimised the worker's hot path (see `unsharedTax`).
 * - `memory`: 4 sessions fill every slot's window (RESYNC of W rows); RSS (from /proc) at idle,
 *   full, after the sessions were dropped and after 5 more admit-fill-drop cycles.
 * - `drafter_alone_in_process`: the drafters called directly at 8 and 64 entries (the ceiling of
 *   what merging 8 STEPs of 8 can gain).
 *
 * The clients stay in this process: its CPU per STEP is measured (`client_cpu_ms_per_step`, about
 * a tenth to a fifth of the worker's) and the worker process is the one on a CPU most of the time
 * (`worker_cpu_share`), so moving them out would not change the ratios; it does spread the 8
 * clients' turn-around over a few ms, which is what `--batch-gather-us` has to cover.
 *
 * TAPWIRE_BENCH_QUICK=1 runs fewer STEPs (a smoke run); TAPWIRE_BENCH_ONLY=onnx,reference,tax,memory
 * runs only those sections; TAPWIRE_BENCH_SHARED_ARGS adds flags to the batched (gather) worker;
 * TAPWIRE_BENCH_ONNX_ARGS adds flags to every ONNX worker (a drafter policy, the same in each mode);
 * TAPWIRE_BENCH_WORKER_NODE_ARGS adds node flags to every worker (e.g. --cpu-prof);
 * TAPWIRE_BENCH_WARM sets the warm-up STEPs per session before a load's blocks (default 400; the
 * null drafter's tax has its own steady-state warm-up).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { cpus, loadavg, tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { createDefaultPair } from "@tapwire/reference-model";
import type { Hello, ReqEntry } from "@tapwire/wire";
import {
  APP_HEADER_SIZE,
  encodeHello,
  FrameStatus,
  frame,
  HelloFlag,
  Op,
  RowDtype,
  rowsOffsetFor,
  SampleMode,
  stepRequestBodySize,
  writeStepPrefix,
} from "@tapwire/wire";
import { Raw } from "../test/helpers.js";

const HERE = dirname(fileURLToPath(import.meta.url));
const BIN = join(HERE, "..", "dist", "bin", "worker.js");
const ONNX_PKG = join(HERE, "..", "..", "drafter-onnx");
const QUICK = process.env.TAPWIRE_BENCH_QUICK === "1";
const STEPS = QUICK ? 30 : 150;
/** Warm-up calls of the in-process drafter timing, and STEPs (x 4) before the tax's cold phase. */
const WARM = QUICK ? 5 : 15;
/**
 * Warm-up STEPs per session before a load's blocks (`TAPWIRE_BENCH_WARM`): enough for V8 to have
 * optimised the worker's and the clients' hot paths, so the blocks measure the steady state a
 * serving worker runs in (15 until 2026-12-06; docs/benchmarks/worker.md "The unshared tax in the
 * steady state").
 */
const LOAD_WARM = Number(process.env.TAPWIRE_BENCH_WARM ?? (QUICK ? 5 : 400));
/** TAPWIRE_BENCH_ONLY=onnx,reference,tax,memory runs only those sections (iteration); tax-null only the null drafter's tax. */
const ONLY = (process.env.TAPWIRE_BENCH_ONLY ?? "").split(",").filter((x) => x !== "");
const want = (s: string): boolean => ONLY.length === 0 || ONLY.includes(s);

interface Geometry {
  drafterIdentity: Uint8Array;
  markovIdentity: Uint8Array;
  window: number;
  numSpec: number;
  vocabSize: number;
  numTaps: number;
  hidden: number;
}

interface Bin {
  proc: ChildProcess;
  endpoint: string;
  pid: number;
  geom: Geometry;
}

const { head } = createDefaultPair();

/**
 * Rows like a target's hidden states: bf16 of moderate values (|x| < 2), from a pool of 256
 * pseudo-random rows (a row is picked by session, slot and position). Arbitrary bytes as bf16
 * hold NaN, infinities and huge exponents: the ONNX drafter then runs up to 2x slower and fails
 * entries (DRAFT_FAILED), which is no workload; and copying a pool row costs the clients a memcpy.
 */
const ROW_POOL = 256;
const rowPool = (() => {
  const rb = head.numTaps * head.hidden * 2;
  const pool = new Uint8Array(ROW_POOL * rb);
  const f = new Float32Array(1);
  const u = new Uint32Array(f.buffer);
  let x = 0x9e3779b9;
  for (let i = 0; i < pool.length; i += 2) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    f[0] = (((x >>> 0) % 4001) - 2000) / 1000;
    const b = u[0]! >>> 16;
    pool[i] = b & 0xff;
    pool[i + 1] = b >>> 8;
  }
  return { pool, rb };
})();

/** A STEP frame whose rows come from {@link rowPool} (`rowBytes` must be the pool's). */
function benchStepFrame(p: {
  seq: number;
  session: number;
  entries: ReqEntry[];
  rowBytes: number;
  /** Where to build it when large enough (a session's buffer, reused STEP after STEP). */
  into?: Uint8Array;
}): Uint8Array {
  const { pool, rb } = rowPool;
  if (p.rowBytes !== rb) throw new Error(`bench rows are ${rb} bytes, not ${p.rowBytes}`);
  let nRows = 0;
  for (const e of p.entries) nRows += e.nRows;
  const n = p.entries.length;
  const size = APP_HEADER_SIZE + stepRequestBodySize(n, nRows, rb, false);
  const buf = p.into !== undefined && p.into.length >= size ? p.into : new Uint8Array(size);
  let off = APP_HEADER_SIZE + rowsOffsetFor(n, false);
  for (const e of p.entries) {
    for (let r = 0; r < e.nRows; r++) {
      const k = (Math.imul(e.rowStart + r, 0x9e3779b1) ^ Math.imul(e.slot + 1, 0x85ebca6b) ^ p.session) >>> 0;
      const src = (k % ROW_POOL) * rb;
      buf.set(pool.subarray(src, src + rb), off);
      off += rb;
    }
  }
  const len = writeStepPrefix(buf, {
    seq: p.seq,
    session: p.session,
    stepId: p.seq,
    entries: p.entries,
    sampleMeta: null,
    nRows,
    rowBytes: rb,
  });
  return buf.subarray(0, len);
}

async function startBin(args: string[], cwd?: string): Promise<Bin> {
  const proc = spawn(
    process.execPath,
    [
      // TAPWIRE_BENCH_WORKER_NODE_ARGS: extra node flags of the workers (e.g. --cpu-prof).
      ...(process.env.TAPWIRE_BENCH_WORKER_NODE_ARGS ?? "").split(" ").filter((x) => x !== ""),
      BIN,
      // Gone with this process, however it ends (docs/operations.md "Children that die with
      // their parent"): a bench that throws or is killed leaves no worker behind.
      "--exit-with-parent",
      "--listen",
      "tcp://127.0.0.1:0",
      "--log-level",
      "warn",
      "--max-slots",
      "64",
      "--max-rows-per-step",
      "1024",
      ...args,
    ],
    { stdio: ["pipe", "pipe", "inherit"], ...(cwd !== undefined ? { cwd } : {}) },
  );
  const line = await new Promise<Record<string, unknown>>((resolve, reject) => {
    createInterface({ input: proc.stdout! }).on("line", (l) => {
      try {
        const j = JSON.parse(l) as Record<string, unknown>;
        if (j.msg === "listening") resolve(j);
      } catch {}
    });
    proc.on("exit", (c) => reject(new Error(`worker exited ${c}`)));
  });
  const hex = (s: unknown) => new Uint8Array(Buffer.from(String(s), "hex"));
  return {
    proc,
    pid: proc.pid!,
    endpoint: (line.endpoints as string[])[0]!,
    geom: {
      drafterIdentity: hex(line.drafterIdentity),
      markovIdentity: hex(line.markovIdentity),
      window: line.window as number,
      numSpec: line.numSpec as number,
      vocabSize: line.vocabSize as number,
      numTaps: head.numTaps,
      hidden: head.hidden,
    },
  };
}

async function stopBin(b: Bin): Promise<void> {
  const exit = new Promise((r) => b.proc.on("exit", r));
  b.proc.kill("SIGTERM");
  await exit;
}

/** CPU seconds (user + system) of process `pid` so far, from /proc (clock ticks of 10 ms). */
function cpuOf(pid: number): number {
  const f = readFileSync(`/proc/${pid}/stat`, "utf8");
  const rest = f.slice(f.lastIndexOf(")") + 2).split(" ");
  return (Number(rest[11]) + Number(rest[12])) / 100;
}

/** CPU seconds of this process (the clients) so far. */
function selfCpu(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
}

/**
 * CPU nanoseconds of every thread of `pid` so far (`schedstat` of each `/proc/PID/task` entry, first field: time
 * on a CPU), for a per-STEP cost far finer than the 10 ms ticks of `/proc/PID/stat`.
 */
function cpuNsOf(pid: number): number {
  let ns = 0;
  for (const t of readdirSync(`/proc/${pid}/task`)) {
    try {
      ns += Number(readFileSync(`/proc/${pid}/task/${t}/schedstat`, "utf8").split(" ")[0]);
    } catch {
      // the thread ended between the listing and the read
    }
  }
  return ns;
}

function rssOf(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m === null ? 0 : Number(m[1]) * 1024;
}

function helloOf(g: Geometry, maxSlots: number, name: string): Hello {
  return {
    drafterIdentity: g.drafterIdentity,
    markovIdentity: g.markovIdentity,
    window: g.window,
    numSpec: g.numSpec,
    sampleMode: SampleMode.GREEDY,
    rowDtype: RowDtype.BF16,
    numTaps: g.numTaps,
    hidden: g.hidden,
    rowBytes: g.numTaps * g.hidden * 2,
    vocabSize: g.vocabSize,
    maxSlots,
    maxRowsPerStep: 1024,
    helloFlags: HelloFlag.WANT_MARGIN,
    auth: new Uint8Array(32),
    clientName: name,
  };
}

/** One session on its own connection, running closed-loop rounds. */
class Session {
  seq = 0;
  round = 0;
  readonly rtts: number[] = [];
  /**
   * The STEP frame buffer, sized by the largest frame so far and reused: a client that allocated
   * a frame per STEP (~50 KiB of ArrayBuffer) drove this process into a mark-compact every
   * 120-250 ms, 1-11 ms pauses that stalled all its sessions (the RTT tail), which a real client
   * (`@tapwire/client`, buffers sized once) does not have. One STEP in flight per session, whose
   * reply arrives after its bytes were read, so the buffer is free again by the next STEP.
   */
  #frame: Uint8Array | undefined;
  constructor(
    readonly raw: Raw,
    readonly id: number,
    readonly g: Geometry,
    readonly slots: number,
  ) {}
  static async open(b: Bin, id: number, slots: number, maxSlots = slots): Promise<Session> {
    const raw = await new Raw(b.endpoint).connect();
    const s = new Session(raw, id, b.geom, slots);
    const body = encodeHello(helloOf(b.geom, maxSlots, `bench-${id}`));
    // BUSY until the worker has seen the previous sessions' connections close (bounded).
    for (let i = 0; ; i++) {
      const a = await raw.send(frame({ op: Op.HELLO, seq: ++s.seq, session: id }, body));
      if (a.status === FrameStatus.OK) break;
      if (a.status !== FrameStatus.BUSY || i > 200) throw new Error(`HELLO of ${id}: status ${a.status}`);
      await new Promise((r) => setTimeout(r, 10));
    }
    return s;
  }
  /** One round: every slot gets its next row (the first round a RESYNC of W rows). */
  async step(record: boolean, full = false): Promise<void> {
    const W = this.g.window;
    const r = this.round++;
    const entries: ReqEntry[] = [];
    for (let slot = 0; slot < this.slots; slot++) {
      const first = r === 0 || full;
      const anchor = W + r;
      const n = first ? W : 1;
      entries.push({
        slot,
        generation: 1,
        anchorPos: anchor,
        anchorToken: (anchor * 31 + slot) % this.g.vocabSize,
        rowStart: anchor - n,
        nRows: n,
        nOut: 0,
        flags: first ? 3 : 1,
      });
    }
    const msg = benchStepFrame({
      seq: ++this.seq,
      session: this.id,
      entries,
      rowBytes: this.g.numTaps * this.g.hidden * 2,
      ...(this.#frame === undefined ? {} : { into: this.#frame }),
    });
    if (this.#frame === undefined || msg.buffer !== this.#frame.buffer)
      this.#frame = new Uint8Array(msg.buffer);
    const t0 = performance.now();
    const a = await this.raw.send(msg);
    const dt = performance.now() - t0;
    if (a.status !== FrameStatus.OK) throw new Error(`STEP status ${a.status}`);
    if (record) this.rtts.push(dt);
  }
  close(): void {
    this.raw.close();
  }
}

function pct(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? 0;
}

const r3 = (x: number) => Math.round(x * 1000) / 1000;

interface Load {
  bin: Bin;
  sessions: Session[];
  slots: number;
  seconds: number;
  /** CPU seconds of the worker process during the blocks. */
  workerCpu: number;
  /** CPU seconds of this (client) process during the blocks. */
  clientCpu: number;
  /** The worker's drafter-call seconds (`batch_call_seconds`, else `drafter_seconds`) at the first block. */
  callSum0: number;
  /** Its drafter calls (the histogram's count) at the first block. */
  calls0: number;
}

async function openLoad(bin: Bin, n: number, slots: number, base: number): Promise<Load> {
  const sessions = await Promise.all(Array.from({ length: n }, (_, k) => Session.open(bin, base + k, slots)));
  await Promise.all(
    sessions.map(async (s) => {
      for (let i = 0; i < LOAD_WARM; i++) await s.step(false);
    }),
  );
  const c = await callTotals(bin);
  return { bin, sessions, slots, seconds: 0, workerCpu: 0, clientCpu: 0, callSum0: c.sum, calls0: c.count };
}

/**
 * The worker's drafter calls so far: a shared worker's `batch_call_seconds` (the wall time of
 * each drafter call), a K = 1 worker's `drafter_seconds` (one call per STEP).
 */
async function callTotals(b: Bin): Promise<{ sum: number; count: number }> {
  const st = (await statsOf(b)) as Stats;
  const h = st.histograms.batch_call_seconds ?? st.histograms.drafter_seconds;
  return { sum: h?.sum ?? 0, count: h?.count ?? 0 };
}

/**
 * Where a STEP's time goes in the worker during the blocks (ms per STEP): its wall time (wall
 * seconds / STEPs: the worker's share of a round), the drafter calls' wall time, the worker's CPU
 * time beside the drafter (CPU minus call time: decode, windows, reply, sockets, the batcher; an
 * estimate, low when a call was preempted), and the time the worker was off a CPU (waiting for
 * frames, the batch gather, or preempted); and the client process's CPU per STEP.
 */
async function breakdown(l: Load, steps: number) {
  const c = await callTotals(l.bin);
  const call = (1000 * (c.sum - l.callSum0)) / steps;
  const cpu = (1000 * l.workerCpu) / steps;
  const wall = (1000 * l.seconds) / steps;
  return {
    wall_ms_per_step: r3(wall),
    drafter_call_ms_per_step: r3(call),
    worker_cpu_beside_drafter_ms_per_step: r3(cpu - call),
    worker_off_cpu_ms_per_step: r3(wall - cpu),
    client_cpu_ms_per_step: r3((1000 * l.clientCpu) / steps),
    drafter_calls_per_step: r3((c.count - l.calls0) / steps),
  };
}

/** One block: every session of `l` runs `rounds` closed-loop rounds at once; its STEPs/s. */
async function block(l: Load, rounds: number): Promise<number> {
  const t0 = performance.now();
  const w0 = cpuOf(l.bin.pid);
  const c0 = selfCpu();
  await Promise.all(
    l.sessions.map(async (s) => {
      for (let i = 0; i < rounds; i++) await s.step(true);
    }),
  );
  const dt = (performance.now() - t0) / 1000;
  l.seconds += dt;
  l.workerCpu += cpuOf(l.bin.pid) - w0;
  l.clientCpu += selfCpu() - c0;
  return (rounds * l.sessions.length) / dt;
}

function summary(l: Load) {
  const rtts = l.sessions.flatMap((s) => s.rtts);
  for (const s of l.sessions) s.close();
  return {
    sessions: l.sessions.length,
    entries_per_step: l.slots,
    steps_per_s: r3(rtts.length / l.seconds),
    entries_per_s: r3((rtts.length * l.slots) / l.seconds),
    rtt_ms_p50: r3(pct(rtts, 50)),
    rtt_ms_p90: r3(pct(rtts, 90)),
    rtt_ms_p99: r3(pct(rtts, 99)),
    rtt_ms_max: r3(pct(rtts, 100)),
    worker_cpu_ms_per_step: r3((1000 * l.workerCpu) / rtts.length),
    client_cpu_ms_per_step: r3((1000 * l.clientCpu) / rtts.length),
    /** Share of the wall time the worker process was on a CPU. */
    worker_cpu_share: r3(l.workerCpu / l.seconds),
  };
}

async function statsOf(b: Bin): Promise<Record<string, unknown>> {
  const raw = await new Raw(b.endpoint).connect();
  const a = await raw.send(frame({ op: Op.STATS, seq: 1, session: 0 }));
  raw.close();
  return JSON.parse(Buffer.from(a.body).toString("utf8")) as Record<string, unknown>;
}

/**
 * The three configurations run in alternating blocks (load on this shared machine drifts within
 * seconds; blocks make every ratio compare figures measured side by side).
 */
async function batching(drafterArgs: string[], cwd?: string) {
  // TAPWIRE_BENCH_SHARED_ARGS: extra flags of the batched worker (e.g. --batch-gather-us 5000).
  const extra = (process.env.TAPWIRE_BENCH_SHARED_ARGS ?? "").split(" ").filter((x) => x !== "");
  const shared = await startBin([...drafterArgs, "--max-sessions", "8", ...extra], cwd);
  const noGatherBin = await startBin([...drafterArgs, "--max-sessions", "8", "--batch-gather-us", "0"], cwd);
  const aloneBin = await startBin([...drafterArgs, "--max-sessions", "8", "--max-batch-entries", "8"], cwd);
  const singleBin = await startBin([...drafterArgs], cwd);
  const lb = await openLoad(shared, 8, 8, 0x1000);
  const ln = await openLoad(noGatherBin, 8, 8, 0x1800);
  const la = await openLoad(aloneBin, 8, 8, 0x2000);
  const ls = await openLoad(singleBin, 1, 64, 0x3000);
  const BLOCKS = QUICK ? 3 : 10;
  // Per block pair: batched / alone throughput (the median of these is robust to load drift).
  const ratios: number[] = [];
  const ratiosNoGather: number[] = [];
  for (let i = 0; i < BLOCKS; i++) {
    const b = await block(lb, STEPS / BLOCKS);
    const a = await block(la, STEPS / BLOCKS);
    const n = await block(ln, STEPS / BLOCKS);
    await block(ls, STEPS / BLOCKS);
    ratios.push(b / a);
    ratiosNoGather.push(n / a);
  }
  const steps = (l: Load) => l.sessions.reduce((a, x) => a + x.rtts.length, 0);
  const where = {
    batched: await breakdown(lb, steps(lb)),
    batched_no_gather: await breakdown(ln, steps(ln)),
    alone: await breakdown(la, steps(la)),
    single_session_64: await breakdown(ls, steps(ls)),
  };
  const st = await statsOf(shared);
  const stn = await statsOf(noGatherBin);
  const batched = summary(lb);
  const noGather = summary(ln);
  const alone = summary(la);
  const single = summary(ls);
  await Promise.all([stopBin(shared), stopBin(noGatherBin), stopBin(aloneBin), stopBin(singleBin)]);
  return {
    batched,
    batched_no_gather: noGather,
    alone,
    single_session_64: single,
    /** Where the time of a STEP goes (see `breakdown`). */
    where_the_time_goes: where,
    batched_worker: batchStats(st),
    batched_no_gather_worker: batchStats(stn),
    throughput_ratio_batched_vs_alone: r3(batched.steps_per_s / alone.steps_per_s),
    throughput_ratio_median_of_blocks: r3(pct(ratios, 50)),
    throughput_ratio_no_gather_vs_alone: r3(noGather.steps_per_s / alone.steps_per_s),
    throughput_ratio_no_gather_median_of_blocks: r3(pct(ratiosNoGather, 50)),
    p99_ratio_batched_vs_single: r3(batched.rtt_ms_p99 / single.rtt_ms_p99),
    p99_ratio_no_gather_vs_single: r3(noGather.rtt_ms_p99 / single.rtt_ms_p99),
  };
}

type Stats = {
  histograms: Record<string, { mean: number; p99: number; count: number; sum: number }>;
  counters: Record<string, number>;
};

/** What the shared worker's own metrics say about its calls (docs/worker.md metrics). */
function batchStats(s: Record<string, unknown>) {
  const st = s as Stats;
  return {
    batch_entries_mean: r3(st.histograms.batch_entries?.mean ?? 0),
    batch_steps_mean: r3(st.histograms.batch_steps?.mean ?? 0),
    queue_ms_p99: r3((st.histograms.batch_queue_seconds?.p99 ?? 0) * 1000),
    call_ms_mean: r3((st.histograms.batch_call_seconds?.mean ?? 0) * 1000),
    drafter_calls: st.counters.drafter_calls ?? 0,
    batch_gathers: st.counters.batch_gathers ?? 0,
    batch_gather_timeouts: st.counters.batch_gather_timeouts ?? 0,
  };
}

/** STEPs of the unshared-tax section's cold phase (the first STEPs after {@link WARM} x 4 warm-up ones). */
const TAX_STEPS = QUICK ? 60 : 1500;
/**
 * STEPs each worker serves before the steady phase is measured: enough for V8 to have optimised
 * the hot path (measured: the null drafter's CPU per STEP falls from ~120-140 µs in the first
 * 1500 STEPs to ~30-40 µs after ~3000; docs/benchmarks/worker.md "The unshared tax in the steady
 * state").
 */
const TAX_STEADY_WARM = QUICK ? 100 : 3000;
/** Blocks of the steady phase, and STEPs per block (per worker). */
const TAX_BLOCKS = QUICK ? 3 : 8;
const TAX_BLOCK_STEPS = QUICK ? 100 : 1000;

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
const trimmed = (xs: number[]) => {
  const ys = [...xs].sort((a, b) => a - b);
  const cut = Math.floor(ys.length * 0.05);
  return mean(ys.slice(cut, ys.length - cut));
};

/**
 * `n` STEPs on each of `s1` and `s4`, interleaved STEP by STEP with the order swapped every pair
 * (so that machine load hits both alike); the workers' CPU per STEP (µs, every thread's schedstat)
 * and the RTTs of these STEPs.
 */
async function taxPhase(k1: Bin, k4: Bin, s1: Session, s4: Session, n: number) {
  const from1 = s1.rtts.length;
  const from4 = s4.rtts.length;
  const cpu1 = cpuNsOf(k1.pid);
  const cpu4 = cpuNsOf(k4.pid);
  for (let i = 0; i < n; i++) {
    if (i % 2 === 0) {
      await s1.step(true);
      await s4.step(true);
    } else {
      await s4.step(true);
      await s1.step(true);
    }
  }
  const cpuUs1 = (cpuNsOf(k1.pid) - cpu1) / 1e3 / n;
  const cpuUs4 = (cpuNsOf(k4.pid) - cpu4) / 1e3 / n;
  return { cpuUs1, cpuUs4, rtt1: s1.rtts.slice(from1), rtt4: s4.rtts.slice(from4) };
}

/** The RTT figures of a phase: means, trimmed means, p50s and their ratios. */
function taxRtts(rtt1: number[], rtt4: number[]) {
  const pairs = rtt4.map((x, i) => x / rtt1[i]!);
  return {
    k1_rtt_ms_mean: r3(mean(rtt1)),
    k4_rtt_ms_mean: r3(mean(rtt4)),
    k1_rtt_ms_trimmed_mean: r3(trimmed(rtt1)),
    k4_rtt_ms_trimmed_mean: r3(trimmed(rtt4)),
    k1_rtt_ms_p50: r3(pct(rtt1, 50)),
    k4_rtt_ms_p50: r3(pct(rtt4, 50)),
    ratio_mean: r3(mean(rtt4) / mean(rtt1)),
    ratio_trimmed_mean: r3(trimmed(rtt4) / trimmed(rtt1)),
    ratio_p50: r3(pct(rtt4, 50) / pct(rtt1, 50)),
    /** Median of the per-pair ratios (each pair measured back to back). */
    ratio_median_of_pairs: r3(pct(pairs, 50)),
  };
}

/**
 * The unshared tax (issue 20: 1 session on a K = 4 worker costs no more than 1.05x K = 1 per
 * STEP), 1 session x 8 entries on each worker, STEPs interleaved. Two measures:
 * - `ratio_cpu`: the worker processes' CPU time per STEP (all threads, schedstat ns), the cost
 *   itself; a loaded machine stretches RTTs but hardly a process's own CPU time. The target row.
 * - RTT ratios (mean, 5% trimmed mean, p50, median of back-to-back pairs): what a client sees,
 *   including scheduler wake-ups, which on a 2-core VM shared with the clients dominate the mean
 *   of ~0.1-0.2 ms round trips.
 * With `steady` (the null drafter, whose STEPs are only the worker's own code), two phases: `cold`,
 * the first {@link TAX_STEPS} STEPs after {@link WARM} x 4 warm-up ones, while V8 is still
 * optimising the hot path (what the section measured until 2026-12-06), then, after
 * {@link TAX_STEADY_WARM} STEPs on each worker, the steady state a serving worker runs in:
 * {@link TAX_BLOCKS} blocks, the top-level figures and `ratio_cpu` the median of the blocks' CPU
 * ratios (docs/benchmarks/worker.md "The unshared tax in the steady state").
 */
async function unsharedTax(drafterArgs: string[], steady: boolean) {
  const k1 = await startBin([...drafterArgs]);
  // TAPWIRE_BENCH_TAX_K4_ARGS: extra flags of the K = 4 worker (to find where a tax comes from)
  const k4Extra = (process.env.TAPWIRE_BENCH_TAX_K4_ARGS ?? "").split(" ").filter((x) => x !== "");
  const k4 = await startBin([...drafterArgs, "--max-sessions", "4", ...k4Extra]);
  const s1 = await Session.open(k1, 0x4001, 8);
  const s4 = await Session.open(k4, 0x4002, 8);
  for (let i = 0; i < WARM * 4; i++) {
    await s1.step(false);
    await s4.step(false);
  }
  const cold = await taxPhase(k1, k4, s1, s4, TAX_STEPS);
  const coldFigures = {
    steps: TAX_STEPS,
    k1_cpu_us_per_step: r3(cold.cpuUs1),
    k4_cpu_us_per_step: r3(cold.cpuUs4),
    ratio_cpu: r3(cold.cpuUs4 / cold.cpuUs1),
    ...taxRtts(cold.rtt1, cold.rtt4),
  };
  if (!steady) {
    s1.close();
    s4.close();
    await Promise.all([stopBin(k1), stopBin(k4)]);
    return { entries_per_step: 8, ...coldFigures };
  }
  for (let i = TAX_STEPS; i < TAX_STEADY_WARM; i++) {
    await s1.step(false);
    await s4.step(false);
  }
  const blocks = [];
  for (let b = 0; b < TAX_BLOCKS; b++) blocks.push(await taxPhase(k1, k4, s1, s4, TAX_BLOCK_STEPS));
  s1.close();
  s4.close();
  await Promise.all([stopBin(k1), stopBin(k4)]);
  const cpu1 = mean(blocks.map((b) => b.cpuUs1));
  const cpu4 = mean(blocks.map((b) => b.cpuUs4));
  const blockRatios = blocks.map((b) => b.cpuUs4 / b.cpuUs1);
  return {
    entries_per_step: 8,
    steps: TAX_BLOCKS * TAX_BLOCK_STEPS,
    /** STEPs each worker had served before the blocks (the warm-up, the cold phase, the rest). */
    warm_steps_before: WARM * 4 + TAX_STEADY_WARM,
    k1_cpu_us_per_step: r3(cpu1),
    k4_cpu_us_per_step: r3(cpu4),
    /** Median of the blocks' CPU ratios (the target row). */
    ratio_cpu: r3(pct(blockRatios, 50)),
    ratio_cpu_all_blocks: r3(cpu4 / cpu1),
    ratio_cpu_blocks: blockRatios.map(r3),
    ...taxRtts(
      blocks.flatMap((b) => b.rtt1),
      blocks.flatMap((b) => b.rtt4),
    ),
    /** The first STEPs, while V8 still optimises (the section's measure until 2026-12-06). */
    cold: coldFigures,
  };
}

async function settle(pid: number): Promise<number> {
  await new Promise((r) => setTimeout(r, 500));
  return rssOf(pid);
}

async function memory(windows: number) {
  const slots = 64;
  const g0 = { numTaps: head.numTaps, hidden: head.hidden, window: head.config.window };
  const reservation = slots * g0.window * g0.numTaps * g0.hidden * 2;
  const mwb = 4 * reservation;
  const b = await startBin([
    "--drafter",
    "null",
    "--num-taps",
    String(g0.numTaps),
    "--hidden",
    String(g0.hidden),
    "--window",
    String(g0.window),
    "--max-sessions",
    "4",
    "--max-window-bytes",
    String(mwb),
    "--slot-buffer-windows",
    String(windows),
  ]);
  const idle = await settle(b.pid);
  const fill = async (base: number) => {
    const ss = await Promise.all([0, 1, 2, 3].map((k) => Session.open(b, base + k, slots)));
    // Full windows, then rounds of appends (the slot buffers grow to what traffic needs).
    for (const s of ss) {
      await s.step(false, true);
      for (let i = 0; i < 3 * g0.window; i++) await s.step(false);
    }
    return ss;
  };
  let ss = await fill(0x5000);
  const full = await settle(b.pid);
  const st = (await statsOf(b)) as { worker: { slot_bytes: number } };
  for (const s of ss) s.close();
  // Dropped by admission (their connections closed: droppable), then 5 more cycles.
  for (let c = 1; c <= 5; c++) {
    ss = await fill(0x5000 + 16 * c);
    for (const s of ss) s.close();
  }
  const cycles = await settle(b.pid);
  await stopBin(b);
  const MiB = 1024 * 1024;
  return {
    slot_buffer_windows: windows,
    max_window_bytes_mib: r3(mwb / MiB),
    idle_rss_mib: r3(idle / MiB),
    full_rss_mib: r3(full / MiB),
    slot_bytes_mib: r3(st.worker.slot_bytes / MiB),
    growth_over_idle_mib: r3((full - idle) / MiB),
    within_max_window_bytes_plus_64mib: full <= idle + mwb + 64 * MiB,
    rss_after_6_admit_fill_drop_cycles_mib: r3(cycles / MiB),
    cycles_growth_over_full_mib: r3((cycles - full) / MiB),
  };
}

/**
 * The drafter alone, in this process, at 8 and 64 entries per call (full windows, greedy): the
 * ceiling of what batching 8 STEPs of 8 entries can gain, `8 * t(8) / t(64)`.
 */
async function drafterScaling(d: { draft(b: unknown[], o: unknown): void | Promise<void>; numSpec: number }) {
  const rb = head.numTaps * head.hidden * 2;
  const W = head.config.window;
  // The rows the clients send (rowPool), W per entry.
  const pool = new Uint8Array(64 * W * rb);
  for (let r = 0; r < 64 * W; r++) {
    const src = ((r * 37) % ROW_POOL) * rowPool.rb;
    pool.set(rowPool.pool.subarray(src, src + rb), r * rb);
  }
  const batchOf = (n: number) =>
    Array.from({ length: n }, (_, i) => ({
      index: i,
      slot: i,
      anchorPos: 100 + i,
      anchorToken: (i * 37) % head.vocabSize,
      k: d.numSpec,
      rows: pool.subarray(i * W * rb, (i + 1) * W * rb),
      nRows: W,
      sample: null,
    }));
  const outOf = (n: number) => ({
    draftIds: new Int32Array(n * d.numSpec),
    confidence: new Float32Array(n * d.numSpec),
    margin: new Float32Array(n * d.numSpec),
    sampledMask: null,
    supportIds: null,
    proposalQ: null,
    numSpec: d.numSpec,
    failed: new Uint8Array(n),
  });
  const time = async (n: number) => {
    const b = batchOf(n);
    const o = outOf(n);
    for (let i = 0; i < WARM; i++) await d.draft(b, o);
    const t0 = performance.now();
    const reps = QUICK ? 10 : 40;
    for (let i = 0; i < reps; i++) await d.draft(b, o);
    return (performance.now() - t0) / reps;
  };
  // Interleaved rounds, medians (the machine's load drifts).
  const t8s: number[] = [];
  const t64s: number[] = [];
  for (let i = 0; i < 3; i++) {
    t8s.push(await time(8));
    t64s.push(await time(64));
  }
  const t8 = pct(t8s, 50);
  const t64 = pct(t64s, 50);
  const o = outOf(64);
  await d.draft(batchOf(64), o);
  return {
    call_ms_8: r3(t8),
    call_ms_64: r3(t64),
    ceiling_8x8_vs_64: r3((8 * t8) / t64),
    failed_entries_of_64: o.failed.reduce((a, x) => a + x, 0),
  };
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "tapwire-bench-shared-"));
  try {
    const onnxMod = (await import(join(ONNX_PKG, "dist", "index.js"))) as {
      exportReferenceHead(h: unknown): Uint8Array;
      OnnxDrafter: {
        create(m: Uint8Array, o: Record<string, unknown>): Promise<Parameters<typeof drafterScaling>[0]>;
      };
    };
    const model = join(dir, "head.onnx");
    const bytes = onnxMod.exportReferenceHead(head);
    writeFileSync(model, bytes);
    const { ReferenceDrafter } = await import("../src/index.js");
    const scaling = {
      onnx: await drafterScaling(await onnxMod.OnnxDrafter.create(bytes, { intraOpThreads: 1 })),
      reference: await drafterScaling(
        new ReferenceDrafter(head) as unknown as Parameters<typeof drafterScaling>[0],
      ),
    };
    // TAPWIRE_BENCH_ONNX_ARGS: extra flags of every ONNX worker (the same policy in each mode).
    const onnxExtra = (process.env.TAPWIRE_BENCH_ONNX_ARGS ?? "").split(" ").filter((x) => x !== "");
    const onnx = ["--drafter", "onnx", "--model", model, "--onnx-threads", "1", ...onnxExtra];
    const load0 = loadavg().map(r3);
    const out = {
      bench: "worker shared (CONTRACT 12.1)",
      quick: QUICK,
      started: new Date().toISOString(),
      cpus: cpus().length,
      steps_per_session: STEPS,
      drafter_alone_in_process: scaling,
      onnx: want("onnx") ? await batching(onnx, ONNX_PKG) : null,
      reference: want("reference") ? await batching(["--drafter", "reference"]) : null,
      unshared_tax_reference: want("tax") ? await unsharedTax(["--drafter", "reference"], false) : null,
      unshared_tax_null: !(want("tax") || ONLY.includes("tax-null"))
        ? null
        : await unsharedTax(
            ["--drafter", "null", "--num-taps", "3", "--hidden", "1024", "--window", "16"],
            true,
          ),
      memory: want("memory") ? [await memory(2), await memory(4)] : null,
      load_average_start: load0,
      load_average_end: loadavg().map(r3),
    };
    process.stdout.write(`${JSON.stringify(out, null, 2)}\n`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

void main().then(
  () => process.exit(0),
  (e: unknown) => {
    process.stderr.write(`bench:shared failed: ${e instanceof Error ? e.stack : String(e)}\n`);
    process.exit(1);
  },
);
