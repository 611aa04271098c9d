// Full RoundCore round (rows staged, STEP, reply validation 6.3/7.4, draft copy-out, depth
// policy) against the worker (tapwire-worker --drafter null) in a CHILD PROCESS, over tcp:// and
// unix://, versus raw node:net length-prefixed exchanges with the same request and reply byte
// counts as the STEP, served by bench/raw-server.ts in other child processes:
//   raw        (the baseline) @tapwire/transport's raw-socket baseline: a plain node:net
//              server, 'data' events copied into a reused buffer;
//   raw-direct (stricter) the kernel reads each request straight into the reused buffer.
// Rounds run with two kinds of engine input: `ring` (RoundCore.rowsTarget: the engine's rows land
// in the rank-0 ring, nothing is copied on rank 0; the bench writes one byte per view, standing
// for the engine's device-to-host copy that exists with or without tapwire) and `copy` (newRows:
// RoundCore copies each row into its ring once). A fifth contender, for diagnosis:
// @tapwire/transport alone (requestParts with the STEP's part layout) against
// bench/transport-server.ts, which only answers a preallocated reply. The contenders alternate
// one by one in rotating order; medians. A separate, untimed phase counts the bytes a round
// allocates (sampling heap profiler + external memory). JSON on stdout; progress on stderr.

import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import * as inspector from "node:inspector/promises";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import * as v8 from "node:v8";
import { barChartSvg } from "@tapwire/stats";
import { type ChildHandle, interleaved, spawnBin, uniqueSocketPath } from "@tapwire/testing";
import { TraceWriter } from "@tapwire/trace";
import { makeClient } from "@tapwire/transport";
import { APP_HEADER_SIZE, rowsOffsetFor, stepReplyBodySize } from "@tapwire/wire";
import { pino } from "pino";
import {
  DepthPolicy,
  RemoteDraftClient,
  RoundCore,
  type RoundRequest,
  type StepCall,
  type StepOutcome,
} from "../src/index.js";
import { WORKER_BIN } from "../test/worker-bin.js";
import { poolRows } from "./pool.js";

const NUM_TAPS = 3;
const HIDDEN = 4096;
const ROW_BYTES = NUM_TAPS * HIDDEN * 2;
const WINDOW = 16;
const NUM_SPEC = 4;
const VOCAB = 32_000;
const MAX_SLOTS = 64;
const MAX_ROWS = 64;
const ITERS = Number(process.env.BENCH_ITERS ?? 1000);
const HEAP_ITERS = Number(process.env.BENCH_HEAP_ITERS ?? 100);
const MODES = (process.env.BENCH_MODES ?? "parts").split(",") as ("stage" | "parts")[];
const KINDS = (process.env.BENCH_KINDS ?? "tcp,unix").split(",") as ("tcp" | "unix")[];
const TRANSPORT_SERVER = fileURLToPath(new URL("./transport-server.ts", import.meta.url));
const RAW_SERVER = process.env.BENCH_RAW_SERVER ?? fileURLToPath(new URL("./raw-server.ts", import.meta.url));
const DRAFTER_ID = new Uint8Array(32).fill(1);
const MARKOV_ID = new Uint8Array(32).fill(2);

interface Shape {
  name: string;
  slots: number;
  rowsPerSlot: number;
  /** Only in the allocation check (shows that allocation does not follow the rows). */
  heapOnly?: boolean;
}
const ALL_SHAPES: Shape[] = [
  { name: "64 slots x 1 row", slots: 64, rowsPerSlot: 1 },
  { name: "8 slots x 8 rows", slots: 8, rowsPerSlot: 8 },
  { name: "8 slots x 1 row", slots: 8, rowsPerSlot: 1, heapOnly: true },
];
// BENCH_SHAPES=0,1 picks shapes by index (default all)
const SHAPES = (process.env.BENCH_SHAPES ?? "0,1,2").split(",").map((i) => ALL_SHAPES[Number(i)]!);

function frameBytesOf(sh: Shape): number {
  return APP_HEADER_SIZE + rowsOffsetFor(sh.slots, false) + sh.slots * sh.rowsPerSlot * ROW_BYTES;
}
function replyBytesOf(sh: Shape): number {
  return (
    APP_HEADER_SIZE + stepReplyBodySize({ nReq: sh.slots, numSpec: NUM_SPEC, margin: true, sampled: false })
  );
}

class Samples {
  readonly v: Float64Array;
  n = 0;
  constructor(cap: number) {
    this.v = new Float64Array(cap);
  }
  add(x: number): void {
    this.v[this.n++] = x;
  }
  pct(q: number): number {
    const s = this.v.slice(0, this.n).sort();
    return s[Math.min(s.length - 1, Math.floor((q / 100) * s.length))] ?? 0;
  }
}

// Raw client: the technique of @tapwire/transport's raw baseline (onread into a reused 64 KiB
// buffer, body copied into a reused reply buffer; header + message with cork/uncork).
async function rawClient(endpoint: string, replyBytes: number) {
  const out = Buffer.allocUnsafe(replyBytes);
  let hdr = 0;
  let len = 0;
  let got = 0;
  let done: () => void = () => {};
  const onread = {
    buffer: Buffer.allocUnsafe(64 * 1024),
    callback: (n: number, buf: Uint8Array): boolean => {
      const b = buf as Buffer;
      let off = 0;
      while (off < n) {
        if (hdr < 4) {
          len += (b[off++] as number) * 2 ** (8 * hdr); // little-endian prefix (CONTRACT 3)
          hdr++;
          continue;
        }
        const k = Math.min(n - off, len - got);
        b.copy(out, got, off, off + k);
        got += k;
        off += k;
      }
      if (hdr === 4 && got === len) {
        hdr = 0;
        len = 0;
        got = 0;
        done();
      }
      return true;
    },
  };
  const sock = await new Promise<net.Socket>((resolve, reject) => {
    const s = endpoint.startsWith("unix://")
      ? net.connect({ path: endpoint.slice("unix://".length), onread }, () => resolve(s))
      : (() => {
          const u = new URL(endpoint.replace(/^tcp:/, "http:"));
          return net.connect({ host: u.hostname, port: Number(u.port), noDelay: true, onread }, () =>
            resolve(s),
          );
        })();
    s.once("error", reject);
  });
  const header = Buffer.allocUnsafe(4);
  const resolver = (resolve: () => void): void => {
    done = resolve;
  };
  return {
    rt(msg: Uint8Array): Promise<void> {
      const p = new Promise<void>(resolver);
      header.writeUInt32LE(msg.length);
      sock.cork();
      sock.write(header);
      sock.write(msg);
      sock.uncork();
      return p;
    },
    close(): void {
      sock.destroy();
    },
  };
}

function workerArgs(listen: string[]): string[] {
  const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");
  return [
    "--drafter",
    "null",
    ...listen.flatMap((l) => ["--listen", l]),
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
    String(MAX_SLOTS),
    "--max-rows-per-step",
    String(MAX_ROWS),
    "--log-level",
    "info",
    // BENCH_WORKER_ARGS: extra tapwire-worker flags (e.g. "--slot-buffer-windows 2")
    ...(process.env.BENCH_WORKER_ARGS ?? "").split(" ").filter((x) => x !== ""),
  ];
}

function endpointsOf(c: ChildHandle): { tcp: string; unix: string } {
  const eps = c.readyLine.json?.endpoints as string[];
  return {
    tcp: eps.find((e) => e.startsWith("tcp://"))!,
    unix: eps.find((e) => e.startsWith("unix://"))!,
  };
}

interface Setup {
  client: RemoteDraftClient;
  core: RoundCore;
  input: { requests: RoundRequest[] };
  reqs: {
    slot: number;
    generation: number;
    anchorPos: number;
    newRows: Uint8Array | null;
    rowsInRing: number;
  }[];
  stepRows: Uint8Array;
  /** Filled by the step wrapper: when step() was called / returned, the worker's worker_us. */
  phase: { call: number; ret: number; workerUs: number };
  /** Removes the phase wrapper (the allocation count then sees only the round). */
  unwrap(): void;
}

export async function setup(
  endpoint: string,
  sh: Shape,
  rowsMode: "stage" | "parts",
  extra: { trace?: TraceWriter } = {},
): Promise<Setup> {
  const client = new RemoteDraftClient({
    ...extra,
    endpoint,
    drafterIdentity: DRAFTER_ID,
    markovIdentity: MARKOV_ID,
    window: WINDOW,
    numSpec: NUM_SPEC,
    numTaps: NUM_TAPS,
    hidden: HIDDEN,
    vocabSize: VOCAB,
    maxSlots: MAX_SLOTS,
    maxRowsPerStep: MAX_ROWS,
    requestTimeoutMs: 10_000,
    logger: pino({ level: "silent" }),
  });
  if (!(await client.waitReady(10_000))) throw new Error(`no connection to ${endpoint}`);
  // phase timestamps around step() (one extra async frame, ~1 µs)
  const phase = { call: 0, ret: 0, workerUs: 0 };
  const step = client.step.bind(client);
  client.step = async (call: StepCall): Promise<StepOutcome> => {
    phase.call = performance.now();
    const o = await step(call);
    phase.ret = performance.now();
    phase.workerUs = o.reply?.workerUs ?? 0;
    return o;
  };
  const core = new RoundCore({
    client,
    rowsMode,
    depthPolicy: new DepthPolicy({ budget: (b: number) => Math.max(8, 2 * b) }),
  });
  // one request per slot with a prompt of WINDOW rows, then rowsPerSlot accepted rows per round
  const rows = new Uint8Array(Math.max(WINDOW, sh.rowsPerSlot) * ROW_BYTES);
  for (let i = 0; i < rows.length; i++) rows[i] = (i * 31) & 0xff;
  const reqs: {
    slot: number;
    generation: number;
    anchorPos: number;
    anchorToken: number;
    newRows: Uint8Array | null;
    rowsInRing: number;
  }[] = [];
  for (let s = 0; s < sh.slots; s++) {
    reqs.push({
      slot: s,
      generation: 1,
      anchorPos: WINDOW,
      anchorToken: 1,
      newRows: rows.subarray(0, WINDOW * ROW_BYTES),
      rowsInRing: 0,
    });
  }
  const stepRows = rows.subarray(0, sh.rowsPerSlot * ROW_BYTES);
  const input = { requests: reqs as RoundRequest[] };
  // warm-up: the prompt rows go as RESYNC entries deferred over several rounds (no new tokens
  // meanwhile), then rounds with rowsPerSlot new rows per slot until the JIT has settled
  for (let i = 0; ; i++) {
    const r = await core.round(input);
    for (const q of reqs) q.newRows = null;
    if (r.outcome === "ok" && r.deferred === 0) break;
    if (i > 100) throw new Error(`${sh.name}: prompt rows not in sync after ${i} rounds (${r.outcome})`);
  }
  for (const q of reqs) q.newRows = stepRows;
  for (let i = 0; i < 200; i++) {
    for (const q of reqs) q.anchorPos += sh.rowsPerSlot;
    if (i % 2 === 1) {
      for (const q of reqs) {
        const views = core.rowsTarget(q.slot, q.generation, q.anchorPos - sh.rowsPerSlot, sh.rowsPerSlot);
        for (const v of views) v[0] = 1;
        q.newRows = null;
        q.rowsInRing = sh.rowsPerSlot;
      }
    } else {
      for (const q of reqs) {
        q.newRows = stepRows;
        q.rowsInRing = 0;
      }
    }
    const r = await core.round(input);
    if (r.outcome !== "ok" || r.resynced !== 0 || r.deferred !== 0) {
      throw new Error(
        `${sh.name}: warm-up round ${i}: ${r.outcome}, ${r.resynced} resynced, ${r.deferred} deferred`,
      );
    }
  }
  for (const q of reqs) q.anchorPos += sh.rowsPerSlot;
  const unwrap = (): void => {
    delete (client as { step?: unknown }).step;
  };
  return { client, core, input, reqs, phase, unwrap, stepRows };
}

// Engine input for the next round: `copy` hands the rows as newRows; `ring` asks RoundCore where
// they go (rowsTarget) and writes there (one byte per view: the engine's own device-to-host copy
// would fill them), then passes rowsInRing.
function stageInput(st: Setup, sh: Shape, ring: boolean): void {
  const k = sh.rowsPerSlot;
  for (const q of st.reqs) {
    if (ring) {
      const views = st.core.rowsTarget(q.slot, q.generation, q.anchorPos - k, k);
      for (const v of views) v[0] = q.anchorPos & 0xff;
      q.newRows = null;
      q.rowsInRing = k;
    } else {
      q.newRows = st.stepRows;
      q.rowsInRing = 0;
    }
  }
}

// a round and the anchors' advance, nothing else (allocation count)
async function advance(st: Setup, sh: Shape, ring: boolean): Promise<void> {
  stageInput(st, sh, ring);
  await st.core.round(st.input);
  for (const q of st.reqs) q.anchorPos += sh.rowsPerSlot;
}

export async function oneRound(
  st: Setup,
  sh: Shape,
  ring: boolean,
): Promise<{ ok: boolean; resynced: number; rttUs: number }> {
  stageInput(st, sh, ring);
  const r = await st.core.round(st.input);
  for (const q of st.reqs) q.anchorPos += sh.rowsPerSlot;
  return {
    ok: r.outcome === "ok" && r.rowsSent === sh.slots * sh.rowsPerSlot,
    resynced: r.resynced,
    rttUs: r.rttUs,
  };
}

interface ProfileNode {
  selfSize: number;
  children: ProfileNode[];
}

/**
 * Bytes allocated per call of `fn`, two ways: V8 heap objects counted by the sampling heap
 * profiler (every 64 bytes on average, objects collected meanwhile included) over `n` calls, and
 * ArrayBuffer memory outside the heap (`external_memory` after minus before, median per call).
 */
async function allocPerCall(
  n: number,
  fn: () => Promise<unknown>,
): Promise<{ heap: number; external: number }> {
  const ext = new Samples(n);
  const session = new inspector.Session();
  session.connect();
  await session.post("HeapProfiler.enable");
  await session.post("HeapProfiler.startSampling", {
    samplingInterval: 64,
    includeObjectsCollectedByMajorGC: true,
    includeObjectsCollectedByMinorGC: true,
  } as inspector.HeapProfiler.StartSamplingParameterType);
  for (let i = 0; i < n; i++) {
    const before = v8.getHeapStatistics().external_memory;
    await fn();
    ext.add(v8.getHeapStatistics().external_memory - before);
  }
  const { profile } = await session.post("HeapProfiler.stopSampling");
  session.disconnect();
  let total = 0;
  const walk = (node: ProfileNode): void => {
    total += node.selfSize;
    for (const c of node.children) walk(c);
  };
  walk(profile.head as ProfileNode);
  return { heap: Math.round(total / n), external: Math.round(ext.pct(50)) };
}

async function runLine(
  kind: "tcp" | "unix",
  sh: Shape,
  rowsMode: "stage" | "parts",
  workerEp: string,
  rawEp: string,
  rawDirectEp: string,
  transportEp: string,
) {
  const st = await setup(workerEp, sh, rowsMode);
  const frameBytes = frameBytesOf(sh);
  const replyBytes = replyBytesOf(sh);
  const raw = await rawClient(rawEp, replyBytes);
  const rawDirect = await rawClient(rawDirectEp, replyBytes);
  const rawMsg = new Uint8Array(frameBytes).fill(3);
  for (let i = 0; i < 200; i++) {
    await raw.rt(rawMsg);
    await rawDirect.rt(rawMsg);
  }
  // diagnostic: @tapwire/transport alone (requestParts with the STEP's part layout) against a
  // server that only answers a preallocated reply
  const tcli = makeClient(transportEp, { maxMessageBytes: 64 << 20 });
  await tcli.connect(10_000);
  const tParts: Uint8Array[] = [rawMsg.subarray(0, APP_HEADER_SIZE + rowsOffsetFor(sh.slots, false))];
  for (let s = 0, off = tParts[0]!.length; s < sh.slots; s++, off += sh.rowsPerSlot * ROW_BYTES) {
    tParts.push(rawMsg.subarray(off, off + sh.rowsPerSlot * ROW_BYTES));
  }
  const tReply = new Uint8Array(replyBytes);
  for (let i = 0; i < 200; i++) await tcli.requestParts(tParts, tReply, 10_000);

  const mk = () => ({
    round: new Samples(ITERS),
    step: new Samples(ITERS),
    worker: new Samples(ITERS),
    pre: new Samples(ITERS),
    post: new Samples(ITERS),
  });
  const hRing = mk();
  const hCopy = mk();
  const hRaw = new Samples(ITERS);
  const hRawDirect = new Samples(ITERS);
  const hTransport = new Samples(ITERS);
  let failed = 0;
  let resynced = 0;
  const doRound = async (ring: boolean) => {
    const h = ring ? hRing : hCopy;
    const t0 = performance.now();
    const r = await oneRound(st, sh, ring);
    const t1 = performance.now();
    if (!r.ok) failed++;
    resynced += r.resynced;
    h.round.add((t1 - t0) * 1000);
    h.step.add(r.rttUs);
    h.worker.add(st.phase.workerUs);
    h.pre.add((st.phase.call - t0) * 1000);
    h.post.add((t1 - st.phase.ret) * 1000);
  };
  const timed = async (h: Samples, f: () => Promise<unknown>) => {
    const t0 = performance.now();
    await f();
    h.add((performance.now() - t0) * 1000);
  };
  const contenders = [
    () => doRound(true),
    () => timed(hRaw, () => raw.rt(rawMsg)),
    () => doRound(false),
    () => timed(hRawDirect, () => rawDirect.rt(rawMsg)),
    () => timed(hTransport, () => tcli.requestParts(tParts, tReply, 10_000)),
  ];
  // the contenders in rotating order, forwards and backwards: none always goes first or follows
  // the same one
  await interleaved(contenders, ITERS);
  st.unwrap();
  const allocRing = await allocPerCall(HEAP_ITERS, () => advance(st, sh, true));
  const allocCopy = await allocPerCall(HEAP_ITERS, () => advance(st, sh, false));
  const allocRaw = await allocPerCall(HEAP_ITERS, () => raw.rt(rawMsg));
  raw.close();
  rawDirect.close();
  tcli.close();
  await st.client.close();
  const p = (h: Samples, q: number) => Math.round(h.pct(q));
  const ratio = (a: number, b: number) => Math.round((a / b) * 100) / 100;
  const rawP50 = p(hRaw, 50);
  const directP50 = p(hRawDirect, 50);
  const rounds = (h: ReturnType<typeof mk>) => ({
    round_us: { p50: p(h.round, 50), p99: p(h.round, 99) },
    round_p50_ratio: ratio(p(h.round, 50), rawP50),
    round_p99_ratio: ratio(p(h.round, 99), p(hRaw, 99)),
    round_p50_ratio_to_direct: ratio(p(h.round, 50), directP50),
    step_rtt_us: { p50: p(h.step, 50), p99: p(h.step, 99) },
    worker_us_p50: p(h.worker, 50),
    before_send_us_p50: p(h.pre, 50),
    after_reply_us_p50: p(h.post, 50),
  });
  return {
    transport: kind,
    shape: sh.name,
    rows_mode: rowsMode,
    request_bytes: frameBytes,
    reply_bytes: replyBytes,
    iterations: ITERS,
    failed_rounds: failed,
    resynced_entries: resynced,
    raw_us: { p50: rawP50, p99: p(hRaw, 99) },
    raw_direct_us: { p50: directP50, p99: p(hRawDirect, 99) },
    ring: rounds(hRing),
    copy: rounds(hCopy),
    transport_only_us: { p50: p(hTransport, 50), p99: p(hTransport, 99) },
    transport_only_p50_ratio: ratio(p(hTransport, 50), rawP50),
    transport_only_p50_ratio_to_direct: ratio(p(hTransport, 50), directP50),
    alloc_bytes_per_round: { ring: allocRing, copy: allocCopy },
    alloc_bytes_per_raw_exchange: allocRaw,
  };
}

async function heapOnly(sh: Shape, rowsMode: "stage" | "parts", workerEp: string) {
  const st = await setup(workerEp, sh, rowsMode);
  st.unwrap();
  const ring = await allocPerCall(HEAP_ITERS, () => advance(st, sh, true));
  const copy = await allocPerCall(HEAP_ITERS, () => advance(st, sh, false));
  await st.client.close();
  return { transport: "unix", shape: sh.name, rows_mode: rowsMode, alloc_bytes_per_round: { ring, copy } };
}

export async function startWorker(): Promise<{ child: ChildHandle; eps: { tcp: string; unix: string } }> {
  const child = await spawnBin(
    WORKER_BIN,
    workerArgs(["tcp://127.0.0.1:0", `unix://${uniqueSocketPath("twc-bench-w")}`]),
  );
  return { child, eps: endpointsOf(child) };
}

if (process.env.BENCH_NO_MAIN === undefined) await main();

async function main(): Promise<void> {
  const t0 = performance.now();
  const { child: worker, eps: wEps } = await startWorker();
  const results = [];
  const allocation = [];
  let capture: Record<string, unknown> | null = null;
  try {
    for (const sh of SHAPES) {
      if (sh.heapOnly) {
        for (const mode of MODES) {
          process.stderr.write(`client bench: allocation ${sh.name} ${mode}\n`);
          allocation.push(await heapOnly(sh, mode, wEps.unix));
        }
        continue;
      }
      const rawServer = (mode: "data" | "direct") =>
        spawnBin(
          RAW_SERVER,
          [
            "--listen",
            "tcp://127.0.0.1:0",
            "--listen",
            `unix://${uniqueSocketPath("twc-bench-r")}`,
            "--request-bytes",
            String(frameBytesOf(sh)),
            "--reply-bytes",
            String(replyBytesOf(sh)),
            "--mode",
            mode,
          ],
          { nodeArgs: process.env.BENCH_RAW_SERVER ? [] : ["--import", "tsx"] },
        );
      const rawChild = await rawServer("data");
      const rawDirectChild = await rawServer("direct");
      const rEps = endpointsOf(rawChild);
      const rdEps = endpointsOf(rawDirectChild);
      const transportChild = await spawnBin(
        TRANSPORT_SERVER,
        [
          "--listen",
          "tcp://127.0.0.1:0",
          "--listen",
          `unix://${uniqueSocketPath("twc-bench-t")}`,
          "--reply-bytes",
          String(replyBytesOf(sh)),
        ],
        { nodeArgs: ["--import", "tsx"] },
      );
      const tEps = endpointsOf(transportChild);
      try {
        for (const kind of KINDS) {
          for (const mode of MODES) {
            process.stderr.write(`client bench: ${kind} ${sh.name} ${mode}\n`);
            results.push(await runLine(kind, sh, mode, wEps[kind], rEps[kind], rdEps[kind], tEps[kind]));
          }
        }
      } finally {
        await rawChild.kill();
        await rawDirectChild.kill();
        await transportChild.kill();
      }
    }
    process.stderr.write("client bench: trace capture on vs off (unix, 8 slots x 8 rows)\n");
    capture = await captureLine(wEps.unix);
    if (process.env.BENCH_SVG !== undefined) writeCaptureSvg(process.env.BENCH_SVG, capture);
  } finally {
    await worker.kill();
  }
  // pool rows (issue 21): a round over 2 members vs one member, same run (bench/pool.ts)
  let pool: Record<string, unknown> | null = null;
  if (process.env.BENCH_POOL !== "0") {
    process.stderr.write("client bench: pool rows\n");
    pool = await poolRows();
  }
  process.stdout.write(
    `${JSON.stringify(
      {
        package: "@tapwire/client",
        node: process.version,
        arrangement:
          "worker (tapwire-worker --drafter null) and raw servers in child processes; rounds and raw exchanges alternate",
        baseline:
          "raw = @tapwire/transport's raw-socket baseline (node:net, 'data' events copied into a reused buffer); raw_direct = the kernel reads straight into the reused buffer",
        row_bytes: ROW_BYTES,
        window: WINDOW,
        num_spec: NUM_SPEC,
        target: "round p50 within 1.3x of the raw baseline (ring.round_p50_ratio)",
        seconds: Math.round((performance.now() - t0) / 100) / 10,
        results,
        allocation,
        pool,
        capture,
      },
      null,
      2,
    )}\n`,
  );
}

// Trace capture (issue 24): three clients, each on a worker of its own (a worker serves one
// session): without capture, with a TraceWriter keeping no rows (drafts, statuses, timing: what a
// production engine would run), and with one keeping every row (for a replay with parity); rounds
// alternate between them in rotating order. The ratios of the round p50s are the cost of capture.
async function captureLine(workerEp: string) {
  const sh: Shape = { name: "8 slots x 8 rows", slots: 8, rowsPerSlot: 8 };
  const dir = mkdtempSync(join(tmpdir(), "twc-bench-trace-"));
  const writers = {
    none: new TraceWriter({ path: join(dir, "none.trace"), rows: "none" }),
    all: new TraceWriter({ path: join(dir, "all.trace"), rows: "all" }),
  };
  const w2 = await startWorker();
  const w3 = await startWorker();
  try {
    const lines = [
      { name: "off", st: await setup(workerEp, sh, "parts"), h: new Samples(ITERS) },
      {
        name: "none",
        st: await setup(w2.eps.unix, sh, "parts", { trace: writers.none }),
        h: new Samples(ITERS),
      },
      {
        name: "all",
        st: await setup(w3.eps.unix, sh, "parts", { trace: writers.all }),
        h: new Samples(ITERS),
      },
    ];
    for (let i = 0; i < ITERS; i++) {
      for (let j = 0; j < lines.length; j++) {
        const l = lines[(i + j) % lines.length]!;
        const t0 = performance.now();
        await oneRound(l.st, sh, true);
        l.h.add((performance.now() - t0) * 1000);
      }
    }
    for (const l of lines) await l.st.client.close();
    const p50 = (k: number) => lines[k]!.h.pct(50);
    const out: Record<string, unknown> = {
      shape: sh.name,
      transport: "unix",
      iterations: ITERS,
      round_us_off: { p50: Math.round(p50(0)), p99: Math.round(lines[0]!.h.pct(99)) },
      target: "round p50 with capture (rows none) within 3% of without (round_p50_ratio_on_off < 1.03)",
    };
    for (const [k, name] of [
      [1, "none"],
      [2, "all"],
    ] as const) {
      const tapNs = writers[name].stats().tapNs;
      const st = await writers[name].close();
      out[`rows_${name}`] = {
        round_us_on: { p50: Math.round(p50(k)), p99: Math.round(lines[k]!.h.pct(99)) },
        round_p50_ratio_on_off: Math.round((p50(k) / p50(0)) * 1000) / 1000,
        tap_us_per_round: Math.round((tapNs / 1000 / Math.max(1, st.records)) * 2 * 10) / 10,
        records: st.records,
        dropped: st.dropped,
        trace_bytes: st.bytesWritten,
      };
    }
    return out;
  } finally {
    await w2.child.kill();
    await w3.child.kill();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** `BENCH_SVG=DIR`: the capture row as a picture (issue 24), with @tapwire/stats' SVG writer. */
export function writeCaptureSvg(dir: string, capture: Record<string, unknown>): void {
  const p50 = (k: string) => {
    const v =
      k === "off"
        ? capture["round_us_off"]
        : (capture[`rows_${k}`] as Record<string, unknown>)["round_us_on"];
    return Number((v as { p50: number }).p50);
  };
  mkdirSync(dir, { recursive: true });
  const path = join(dir, "client-capture.svg");
  writeFileSync(
    path,
    barChartSvg({
      title: "Round p50 with trace capture (8 slots x 8 rows, unix, same run)",
      labels: ["capture off", "rows none", "rows all"],
      values: [p50("off"), p50("none"), p50("all")],
      yLabel: "round p50 (µs)",
      format: (v) => `${Math.round(v)} µs`,
    }),
  );
  process.stderr.write(`client bench: wrote ${path}\n`);
}
