/**
 * `pnpm bench`: encoder-cache transfer over ZeroMQ + the tcp/unix data planes, side by side with a raw
 * socket streaming the same bytes into a reused buffer, in the same process and the same run.
 * Prints one JSON document to stdout.
 */

import { type ChildProcess, spawn } from "node:child_process";
import * as net from "node:net";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { interleaved } from "@tapwire/testing";
import { Dealer } from "zeromq";
import {
  CHECKSUM_THREAD_MAX_INLINE_GBPS,
  checksumThreadUsed,
  crc32InlineGbps,
  defaultIsalLoad,
  type IsalCrc32,
} from "../src/crc.js";
import { DEFAULT_SEND_BUFFER_BYTES } from "../src/data/sockbuf.js";
import { SEND_BUFFER_ENV } from "../src/data/socket.js";
import {
  ConsumerConnector,
  CRC32_IMPLS,
  type Crc32Fn,
  crc32Info,
  EcAdminClient,
  EcDirectory,
  EmbeddingCache,
  ISAL_MIN_BYTES,
  loadCrc32,
  SocketDataTransport,
} from "../src/index.js";

const PRODUCER = fileURLToPath(new URL("../src/bin/producer.ts", import.meta.url));
const RAW_SERVER = fileURLToPath(new URL("./raw-server.ts", import.meta.url));
const ZMQ_ECHO = fileURLToPath(new URL("./zmq-echo.ts", import.meta.url));
const SHM_DATA_CHILD = fileURLToPath(new URL("./shm-data-child.ts", import.meta.url));

const MiB = 1024 * 1024;
const BB = 65_536;
const BLOCKS = 1024;
const SIZES = [1 * MiB, 4 * MiB, 16 * MiB];
const ITER: Record<number, number> = { [MiB]: 100, [4 * MiB]: 50, [16 * MiB]: 40 };
const LAT_ITER = 50;

function pct(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
}

function median(xs: number[]): number {
  return pct(xs, 50);
}

function round(x: number, d = 3): number {
  return Number(x.toFixed(d));
}

// ---- children: the producer bin and the raw baseline server, each in its own process ----

interface Child {
  proc: ChildProcess;
  line: Record<string, unknown>;
}

async function spawnChild(script: string, args: string[]): Promise<Child> {
  const proc = spawn(process.execPath, ["--import", "tsx", script, ...args], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const line = await new Promise<Record<string, unknown>>((resolve, reject) => {
    proc.once("exit", (code) => reject(new Error(`${script} exited ${code}`)));
    createInterface({ input: proc.stdout! }).on("line", (l) => {
      try {
        const o = JSON.parse(l) as Record<string, unknown>;
        if (o["msg"] === "listening") resolve(o);
      } catch {
        // not JSON
      }
    });
  });
  return { proc, line };
}

function netTarget(endpoint: string): net.NetConnectOpts {
  return endpoint.startsWith("unix://")
    ? { path: endpoint.slice("unix://".length) }
    : { host: "127.0.0.1", port: Number(endpoint.split(":").pop()) };
}

// ---- raw baseline client: request N, read straight into a reused N-byte buffer ----

class RawClient {
  readonly dest = Buffer.alloc(16 * MiB);
  #want = 0;
  #got = 0;
  #done: (() => void) | null = null;
  readonly socket: net.Socket;
  constructor(endpoint: net.NetConnectOpts) {
    this.socket = net.connect({
      ...endpoint,
      onread: {
        buffer: () =>
          this.#got < this.#want ? this.dest.subarray(this.#got, this.#want) : this.dest.subarray(0, 65_536),
        callback: (n: number) => {
          this.#got += n;
          if (this.#got >= this.#want && this.#done !== null) {
            const d = this.#done;
            this.#done = null;
            d();
          }
          return true;
        },
      },
    } as net.NetConnectOpts);
    this.socket.setNoDelay(true);
  }
  fetch(n: number): Promise<void> {
    this.#want = n;
    this.#got = 0;
    const req = Buffer.alloc(4);
    req.writeUInt32LE(n, 0);
    const p = new Promise<void>((r) => {
      this.#done = r;
    });
    this.socket.write(req);
    return p;
  }
}

// ---- ec-connector: request → poll until loaded (an engine step loop), then free ----

/**
 * request → poll until loaded → free. Between polls the loop sleeps until the connector reports
 * activity (a control message or a finished read), as an engine that has other work would; spinning
 * on setImmediate instead would steal the CPU the producer needs on a small machine.
 */
async function fetchOne(conn: ConsumerConnector, producer: string, h: string, n: number): Promise<number> {
  let wake: (() => void) | null = null;
  conn.onActivity = () => {
    const w = wake;
    wake = null;
    w?.();
  };
  const t0 = performance.now();
  conn.request(h, producer, n, t0 + 30_000);
  for (;;) {
    const r = conn.poll();
    if (r.loaded.length > 0) break;
    if (r.failed.length > 0) throw new Error(`${h}: ${r.failed[0]!.reason}`);
    await new Promise<void>((resolve) => {
      wake = resolve;
      setTimeout(resolve, 5).unref(); // safety net: a step at least every 5 ms
    });
  }
  const dt = performance.now() - t0;
  conn.free(h);
  return dt;
}

let producerCrcImpl = "";

// The throughput rows and the 1 KiB control row run their variants through @tapwire/testing's
// `interleaved`: in the fixed order it replaced, the transfer right after the two raw fetches
// measured 0.1-0.4 ms slower at 1 MiB than the same connector two slots later (2026-12-03,
// docs/benchmarks/ec-connector.md "The slot bias"), a cost charged to whichever variant sat
// there (`crc`, the target's).

/**
 * EC-CONTRACT 10: the cost of residency events on transfer throughput at 16 MiB. Two producer
 * children, one with events (and an EcDirectory subscribed to it), one without; before each timed
 * transfer both get the same untimed-but-concurrent churn (encode a fresh 1 KiB item, evict the
 * previous one: two events on the one that publishes), so the publishing overlaps the transfer.
 * Interleaved; ratio = events_off_time / events_on_time (1.0 = no cost).
 */
async function eventsRow(): Promise<Record<string, unknown>> {
  const n = 16 * MiB;
  const iters = 2 * ITER[n]!;
  const common = [
    "--num-blocks",
    String(BLOCKS),
    "--block-bytes",
    String(BB),
    "--prepopulate",
    `emb:${n}`,
    "--log-level",
    "warn",
  ];
  const on = await spawnChild(PRODUCER, [
    ...common,
    "--events-listen",
    "tcp://127.0.0.1:0",
    "--replay-listen",
    "tcp://127.0.0.1:0",
  ]);
  const off = await spawnChild(PRODUCER, common);
  const dir = new EcDirectory({
    producers: [
      {
        control: String(on.line["control"]),
        events: String(on.line["events"]),
        replay: String(on.line["replay"]),
      },
    ],
  });
  const sides = [on, off].map((c) => ({
    control: String(c.line["control"]),
    admin: new EcAdminClient(String(c.line["admin"])),
    times: [] as number[],
  }));
  const conn = await ConsumerConnector.create({
    numBlocks: BLOCKS,
    blockBytes: BB,
    compatibility: String(on.line["compatibilityHash"]),
  });
  for (const s of sides) await fetchOne(conn, s.control, "emb", n); // warm up
  for (let i = 0; i < iters; i++) {
    // alternate which side goes first (the second one finds warmer caches)
    for (const s of i % 2 === 0 ? sides : [...sides].reverse()) {
      void s.admin.encode(`churn-${i}`, 1024).catch(() => undefined);
      if (i > 0) void s.admin.evict(`churn-${i - 1}`).catch(() => undefined);
      s.times.push(await fetchOne(conn, s.control, "emb", n));
    }
  }
  const published = (dir.views()[0]?.seq ?? 0) as number;
  const [onT, offT] = sides.map((s) => median(s.times)) as [number, number];
  await conn.close();
  dir.close();
  for (const s of sides) s.admin.close();
  on.proc.kill("SIGTERM");
  off.proc.kill("SIGTERM");
  const gbps = (ms: number) => round(n / (ms / 1000) / 1e9, 3);
  return {
    kind: "tcp",
    bytes: n,
    iterations: iters,
    events_off_median_ms: round(offT),
    events_off_gb_s: gbps(offT),
    events_on_median_ms: round(onT),
    events_on_gb_s: gbps(onT),
    ratio_on_vs_off: round(offT / onT),
    cost_pct: round((onT / offT - 1) * 100, 2),
    // best-of-N: what each path does when the shared machine leaves it alone
    best_cost_pct: round((Math.min(...sides[0]!.times) / Math.min(...sides[1]!.times) - 1) * 100, 2),
    events_seen_by_directory: published,
  };
}

/**
 * The shm data plane (docs/ec-protocol.md 3.4, issue 23): one producer on `shm+unix://` (a unix
 * data server that also offers rings), two consumers, CRC on: one reading over the unix socket,
 * one through the ring; and a third reading from a second producer with `--shm-share-region`
 * (3.4 "Shared region"). Interleaved per iteration, in rounds (the order rotates), medians.
 */
async function shmRow(): Promise<Record<string, unknown>[]> {
  // two producers, the second with its cache region shared (3.4 "Shared region")
  const spawnProducer = (tag: string, extra: string[]) =>
    spawnChild(PRODUCER, [
      "--num-blocks",
      String(BLOCKS),
      "--block-bytes",
      String(BB),
      "--data",
      `shm+unix://${join(tmpdir(), `ec-bench-${process.pid}-${tag}.sock`)}`,
      "--prepopulate",
      SIZES.map((n) => `emb-${n}:${n}`).join(","),
      ...extra,
      "--log-level",
      "warn",
    ]);
  const prod = await spawnProducer("shm", []);
  const prodRegion = await spawnProducer("rgn", ["--shm-share-region"]);
  const control = String(prod.line["control"]);
  const controlRegion = String(prodRegion.line["control"]);
  const compatibility = String(prod.line["compatibilityHash"]);
  const unix = await ConsumerConnector.create({ numBlocks: BLOCKS, blockBytes: BB, compatibility });
  const mkShm = () =>
    ConsumerConnector.create({ numBlocks: BLOCKS, blockBytes: BB, compatibility, dataShm: true });
  const shm = await mkShm();
  const region = await mkShm();
  const sides = [
    { c: unix, at: control },
    { c: shm, at: control },
    { c: region, at: controlRegion },
  ];
  const rows: Record<string, unknown>[] = [];
  const rounds = Number(process.env["EC_BENCH_ROUNDS"] ?? 5);
  for (const x of sides) for (const n of SIZES) await fetchOne(x.c, x.at, `emb-${n}`, n); // warm up
  for (const n of process.env["EC_BENCH_SIZES"]
    ? process.env["EC_BENCH_SIZES"].split(",").map((x) => Number(x) * MiB)
    : SIZES) {
    const per = Math.max(4, Math.floor(ITER[n]! / 2));
    const t: number[][] = [[], [], []];
    const roundRatios: number[] = [];
    for (let round = 0; round < rounds; round++) {
      const r: number[][] = [[], [], []];
      for (let i = 0; i < per; i++)
        for (let k = 0; k < sides.length; k++) {
          const j = (round + i + k) % sides.length;
          r[j]!.push(await fetchOne(sides[j]!.c, sides[j]!.at, `emb-${n}`, n));
        }
      roundRatios.push(round3(median(r[0]!) / median(r[1]!)));
      for (let j = 0; j < 3; j++) t[j]!.push(...r[j]!);
    }
    const [u, m, g] = t.map(median) as [number, number, number];
    const gbps = (ms: number) => round(n / (ms / 1000) / 1e9, 3);
    const chunks = shm.registry.snapshot().counters["data_shm_chunks"] ?? 0;
    rows.push({
      kind: "shm",
      bytes: n,
      rounds,
      iterations: t[0]!.length,
      unix_median_ms: round(u),
      unix_gb_s: gbps(u),
      shm_median_ms: round(m),
      shm_gb_s: gbps(m),
      ratio_shm_vs_unix: round(u / m),
      round_ratios: roundRatios,
      shm_chunks_so_far: chunks,
      // the same transfer from a producer with --shm-share-region (3.4 "Shared region")
      region_median_ms: round(g),
      region_gb_s: gbps(g),
      ratio_region_vs_unix: round(u / g),
      // Informational: the issue's ">= 1.5x the unix data plane" target is shm_data_plane's row
      // (docs/benchmarks/ec-connector.md); here the same control round trip is on both sides.
      ...(n === 16 * MiB ? { target: "none (>= 1.5 is shm_data_plane's)" } : {}),
    });
  }
  await unix.close();
  await shm.close();
  await region.close();
  prod.proc.kill("SIGTERM");
  prodRegion.proc.kill("SIGTERM");
  return rows;
}

/**
 * The data plane alone (issue 23 target: EC 16 MiB over shm >= 1.5x the unix data plane): a
 * `SocketDataTransport` on `shm+unix://` in a child process, two readers here over the same
 * socket path, one plain unix, one with shm; per transfer a grant (child) then a READ with the
 * CRC on, timed from postRead to DONE. Interleaved, the order flipping each transfer, medians.
 */
/**
 * `EC_BENCH_SHM_NOCRC=1`: the shm side of the data-plane row reads with the CRC off (an upper
 * bound for moving the CRC elsewhere; the row then has no target). `EC_BENCH_SHM_SLOTS` and
 * `EC_BENCH_SHM_SLOT_KIB` size the child's ring (default 2 x 4 MiB).
 */
const NO_SHM_CRC = process.env["EC_BENCH_SHM_NOCRC"] === "1";

/** One data-plane child (`region`: its cache region shared, 3.4 "Shared region") and its two readers. */
async function dataPlaneChild(sizes: number[], region: boolean) {
  const child = spawn(process.execPath, ["--import", "tsx", SHM_DATA_CHILD, ...sizes.map(String)], {
    stdio: ["pipe", "pipe", "inherit"],
    env: { ...process.env, EC_BENCH_SHM_REGION: region ? "1" : "0" },
  });
  const lines: Record<string, unknown>[] = [];
  let wake: (() => void) | null = null;
  createInterface({ input: child.stdout! }).on("line", (l) => {
    lines.push(JSON.parse(l) as Record<string, unknown>);
    wake?.();
  });
  const next = async (): Promise<Record<string, unknown>> => {
    while (lines.length === 0) await new Promise<void>((r) => (wake = r));
    return lines.shift()!;
  };
  const first = await next();
  const meta = Buffer.from(String(first["meta"]), "base64");
  const desc = Buffer.from(String(first["desc"]), "base64");
  const NB = 512;
  const mk = async (shm: boolean, checksumThread = false) => {
    // as ConsumerConnector.create: a region the checksum thread will not read stays an ArrayBuffer
    const thread = checksumThread && checksumThreadUsed(true);
    const cache = new EmbeddingCache({ numBlocks: NB, blockBytes: BB, shared: thread });
    const r = await SocketDataTransport.create({
      name: shm ? "bench-shm" : "bench-unix",
      region: cache.region,
      numBlocks: NB,
      blockBytes: BB,
      ...(shm ? { shm: true } : {}),
      ...(thread ? { checksumThread: true } : {}),
    });
    return { r, cache, agent: r.addRemotePeer(meta, desc), shm };
  };
  const unix = await mk(false);
  const shm = await mk(true);
  // The shm reader with the checksum thread (each landed piece CRC'd there while the next copies).
  const shmThread = await mk(true, true);
  const te = new TextEncoder();
  const one = async (s: Awaited<ReturnType<typeof mk>>, n: number): Promise<number> => {
    child.stdin!.write(`${n}\n`);
    const g = await next();
    const local = s.cache.allocate("x", n);
    let done: (() => void) | null = null;
    s.r.onReadDone = () => done?.();
    const t0 = performance.now();
    const h = s.r.postRead(local, s.agent, g["blocks"] as number[], te.encode(String(g["key"])), {
      nbytes: n,
      checksum: !(NO_SHM_CRC && s.shm),
    });
    while (s.r.checkXferState(h) === "PROC") {
      await new Promise<void>((r) => {
        done = r;
        setTimeout(r, 5).unref();
      });
    }
    const dt = performance.now() - t0;
    if (s.r.checkXferState(h) !== "DONE") throw new Error(`data plane: ${s.r.getXferError(h)}`);
    s.r.releaseXferHandle(h);
    s.cache.free("x");
    return dt;
  };
  const close = async () => {
    await unix.r.close();
    await shm.r.close();
    await shmThread.r.close();
    child.kill("SIGTERM");
  };
  return { unix, shm, shmThread, one, close };
}

/**
 * The data plane alone, both shm modes in the same run: a ring child and a shared-region child
 * (docs/ec-protocol.md 3.4 "Shared region", `--shm-share-region`), each read by a plain unix
 * reader and an shm reader (the region child also by an shm reader with the checksum thread); per
 * iteration all five transfers, the order rotating. Returns the
 * region rows (`shm_data_plane`, the target's: `ratio_shm_vs_unix` is the shared region's over
 * the unix socket of the same child) and the ring rows (`shm_data_plane_ring`).
 */
async function shmDataPlaneRows(
  sizes: number[],
): Promise<{ region: Record<string, unknown>[]; ring: Record<string, unknown>[] }> {
  const ring = await dataPlaneChild(sizes, false);
  const region = await dataPlaneChild(sizes, true);
  const out = { region: [] as Record<string, unknown>[], ring: [] as Record<string, unknown>[] };
  for (const n of sizes) {
    const sides = [
      { c: ring, s: ring.unix, t: [] as number[] },
      { c: ring, s: ring.shm, t: [] as number[] },
      { c: region, s: region.unix, t: [] as number[] },
      { c: region, s: region.shm, t: [] as number[] },
      { c: region, s: region.shmThread, t: [] as number[] },
    ];
    for (let i = 0; i < 5; i++) for (const x of sides) await x.c.one(x.s, n); // warm up
    const iters = n >= 16 * MiB ? 60 : 100;
    for (let i = 0; i < iters; i++)
      for (let k = 0; k < sides.length; k++) {
        const x = sides[(i + k) % sides.length]!;
        x.t.push(await x.c.one(x.s, n));
      }
    const [ringUnix, ringShm, regionUnix, regionShm, regionThread] = sides.map((x) => median(x.t)) as [
      number,
      number,
      number,
      number,
      number,
    ];
    const gbps = (ms: number) => round(n / (ms / 1000) / 1e9, 3);
    out.region.push({
      kind: "shm-data-plane",
      shm_mode: "shared region (--shm-share-region, one copy by the reader)",
      bytes: n,
      iterations: iters,
      unix_median_ms: round(regionUnix),
      unix_gb_s: gbps(regionUnix),
      shm_median_ms: round(regionShm),
      shm_gb_s: gbps(regionShm),
      ratio_shm_vs_unix: round(regionUnix / regionShm),
      ratio_region_vs_ring: round(ringShm / regionShm),
      shm_checksum_thread_median_ms: round(regionThread),
      ratio_shm_checksum_thread_vs_unix: round(regionUnix / regionThread),
      // checksumThread: true uses the thread only where the CRC is slow (crc.ts CHECKSUM_THREAD_MAX_INLINE_GBPS)
      checksum_thread_in_use: region.shmThread.r.checksumThreadInUse,
      ...(NO_SHM_CRC ? { shm_crc: false } : n === 16 * MiB ? { target: ">= 1.5" } : {}),
    });
    out.ring.push({
      kind: "shm-data-plane-ring",
      shm_mode: "per-connection ring (default, two copies)",
      bytes: n,
      iterations: iters,
      unix_median_ms: round(ringUnix),
      unix_gb_s: gbps(ringUnix),
      shm_median_ms: round(ringShm),
      shm_gb_s: gbps(ringShm),
      ratio_shm_vs_unix: round(ringUnix / ringShm),
      ...(NO_SHM_CRC ? { shm_crc: false } : {}),
    });
  }
  await ring.close();
  await region.close();
  return out;
}

/**
 * The CRC-32 implementations side by side (issue 23: the CRC is the consumer's remaining cost):
 * GB/s per chunk size, hot (one buffer over and over, in cache) and cold (rotating through 256 MiB,
 * more than the last-level cache, like bytes a socket just landed in a large region). `in_use` is
 * what {@link crc32Info} picked; `libisal_raw` calls ISA-L at every size, to show where its call
 * cost stops mattering ({@link ISAL_MIN_BYTES}).
 */
function crcRows(): Record<string, unknown>[] {
  const impls: [string, Crc32Fn][] = [["in_use", crc32Info.fn]];
  const nodeRs = loadCrc32(undefined, null);
  if (nodeRs.impl === CRC32_IMPLS.native) impls.push(["node_rs", nodeRs.fn]);
  const zlibOnly = loadCrc32(() => {
    throw new Error("zlib row");
  }, null);
  impls.push([zlibOnly.impl === CRC32_IMPLS.zlib ? "node_zlib" : "table", zlibOnly.fn]);
  if (crc32Info.impl === CRC32_IMPLS.isal) impls.push(["libisal_raw", isalRaw]);
  const COLD = 256 * MiB;
  const pool = new Uint8Array(COLD);
  for (let i = 0; i < COLD; i += 4096) pool[i] = i >>> 12;
  const rows: Record<string, unknown>[] = [];
  for (const n of [1024, 4096, 16 * 1024, 64 * 1024, MiB, 16 * MiB]) {
    const row: Record<string, unknown> = { bytes: n };
    const reps = Math.max(20, Math.min(20_000, Math.floor((256 * MiB) / n)));
    for (const [name, fn] of impls) {
      const hot = pool.subarray(0, n);
      for (let i = 0; i < 10; i++) fn(hot);
      let t0 = performance.now();
      for (let i = 0; i < reps; i++) fn(hot);
      const hotMs = (performance.now() - t0) / reps;
      const slots = Math.floor(COLD / n);
      t0 = performance.now();
      for (let i = 0; i < reps; i++) {
        const at = ((i * 7919) % slots) * n;
        fn(pool.subarray(at, at + n));
      }
      const coldMs = (performance.now() - t0) / reps;
      row[`${name}_hot_gb_s`] = round((n / hotMs) * 1e-6, 2);
      row[`${name}_cold_gb_s`] = round((n / coldMs) * 1e-6, 2);
    }
    rows.push(row);
  }
  return rows;
}

/** ISA-L on a chunk shorter than ISAL_MIN_BYTES (the hybrid would not): bound once, straight. */
let isalBound: IsalCrc32 | undefined;
function isalRaw(d: Uint8Array, v = 0): number {
  isalBound ??= defaultIsalLoad();
  return isalBound(v >>> 0, d, d.length) >>> 0;
}

/**
 * `EC_BENCH_ONLY`: `crc` (the CRC-32 implementations alone), `shm` (the shm rows), `shm-data-plane` (only the shm target's row,
 * `EC_BENCH_SIZES=16` narrows it), `events` (the events row), `throughput` (the tcp/unix
 * throughput rows and their targets alone; `EC_BENCH_KINDS=tcp|unix` and `EC_BENCH_SIZES=4,16`
 * (MiB) narrow them); unset: everything.
 */
const ONLY = process.env["EC_BENCH_ONLY"] ?? "";
const KINDS = (process.env["EC_BENCH_KINDS"]?.split(",") ?? ["tcp", "unix"]) as ("tcp" | "unix")[];
const THROUGHPUT_SIZES =
  ONLY === "throughput" && process.env["EC_BENCH_SIZES"]
    ? process.env["EC_BENCH_SIZES"].split(",").map((x) => Number(x) * MiB)
    : SIZES;

/** The SO_SNDBUF the producer's data server asks for (its default, or `TAPWIRE_EC_SEND_BUFFER`). */
function ecSendBuffer(): number {
  const v = process.env[SEND_BUFFER_ENV];
  return v === undefined || v === "" ? DEFAULT_SEND_BUFFER_BYTES : Number(v);
}

function round3(x: number): number {
  return round(x, 3);
}

async function main(): Promise<void> {
  const results: Record<string, unknown> = {};
  if (ONLY === "shm" || ONLY === "shm-data-plane") {
    // the shm data-plane rows alone (docs/benchmarks/ec-connector.md "shm"); `shm-data-plane`:
    // only the target's row (EC_BENCH_SIZES=16 narrows it)
    const load0 = loadavg();
    const shm = ONLY === "shm" ? await shmRow() : [];
    const dataPlane = await shmDataPlaneRows(
      ONLY === "shm-data-plane" && process.env["EC_BENCH_SIZES"]
        ? process.env["EC_BENCH_SIZES"].split(",").map((x) => Number(x) * MiB)
        : SIZES,
    );
    process.stdout.write(
      `${JSON.stringify({ node: process.version, loadavg: load0, shm, shm_data_plane: dataPlane.region, shm_data_plane_ring: dataPlane.ring, loadavg_after: loadavg() }, null, 2)}\n`,
    );
    return;
  }
  if (ONLY === "crc") {
    process.stdout.write(
      `${JSON.stringify({ node: process.version, loadavg: loadavg(), crc_impl: crc32Info.impl, crc_small_impl: crc32Info.smallImpl, isal_min_bytes: ISAL_MIN_BYTES, crc: crcRows(), loadavg_after: loadavg() }, null, 2)}\n`,
    );
    return;
  }
  if (process.env["EC_BENCH_ONLY"] === "events") {
    // the events row alone (docs/benchmarks.md: the events cost on a busy machine)
    process.stdout.write(`${JSON.stringify({ node: process.version, events: await eventsRow() }, null, 2)}
`);
    return;
  }
  const throughput: Record<string, unknown>[] = [];
  const latency: Record<string, unknown>[] = [];
  const control: Record<string, unknown>[] = [];
  // Raw ZeroMQ DEALER/ROUTER round trip (the control target's baseline), in a child like the producer.
  const zmqChild = await spawnChild(ZMQ_ECHO, []);
  const zmqDealer = new Dealer({ linger: 0 });
  zmqDealer.connect(String(zmqChild.line["endpoint"]));
  const zmqMsg = new Uint8Array(200); // about an XferReq's size
  const zmqRtt = async (): Promise<number> => {
    const t0 = performance.now();
    await zmqDealer.send(zmqMsg);
    await zmqDealer.receive();
    return performance.now() - t0;
  };
  for (let i = 0; i < 50; i++) await zmqRtt();
  for (const kind of KINDS) {
    const unixPath = join(tmpdir(), `ec-bench-${process.pid}-${kind}.sock`);
    const prodChild = await spawnChild(PRODUCER, [
      "--num-blocks",
      String(BLOCKS),
      "--block-bytes",
      String(BB),
      "--data",
      kind === "tcp" ? "tcp://127.0.0.1:0" : `unix://${unixPath}`,
      "--prepopulate",
      [...SIZES.map((n) => `emb-${n}:${n}`), "emb-1k:1024"].join(","),
      "--log-level",
      "warn",
    ]);
    producerCrcImpl = String(prodChild.line["crcImpl"]);
    const producer = {
      controlEndpoint: String(prodChild.line["control"]),
      compatibilityHash: String(prodChild.line["compatibilityHash"]),
    };
    const rawChild = await spawnChild(RAW_SERVER, [
      kind === "tcp" ? "tcp://127.0.0.1:0" : `unix://${unixPath}.raw`,
    ]);
    const rawClient = new RawClient(netTarget(String(rawChild.line["endpoint"])));
    // Issue 23: the same raw stream with the socket send buffer the ec data server asks for by
    // default (src/data/sockbuf.ts), so the per-byte comparison is also shown like for like.
    const rawSbChild = await spawnChild(RAW_SERVER, [
      kind === "tcp" ? "tcp://127.0.0.1:0" : `unix://${unixPath}.rawsb`,
      String(ecSendBuffer()),
    ]);
    const rawSbClient = new RawClient(netTarget(String(rawSbChild.line["endpoint"])));
    const conns = {
      crc: await ConsumerConnector.create({
        numBlocks: BLOCKS,
        blockBytes: BB,
        compatibility: producer.compatibilityHash,
      }),
      // Issue 23: `crc` is the default, i.e. read-ahead with the ack on the data plane
      // (docs/ec-protocol.md 3.2, 3.3); this one is the 1.1 sequence (XferReq, ack, then READ),
      // CRC on, against `crc` in the same run.
      crcClassic: await ConsumerConnector.create({
        numBlocks: BLOCKS,
        blockBytes: BB,
        compatibility: producer.compatibilityHash,
        readAhead: false,
      }),
      // Issue 23 item 1: `crc` sends its requests on the data connection (docs/ec-protocol.md 3.5);
      // this one is the previous default (3.2 + 3.3: XferReq on ZeroMQ, ack on the data plane).
      crcAckAhead: await ConsumerConnector.create({
        numBlocks: BLOCKS,
        blockBytes: BB,
        compatibility: producer.compatibilityHash,
        dataRequests: false,
      }),
      crcThread: await ConsumerConnector.create({
        numBlocks: BLOCKS,
        blockBytes: BB,
        compatibility: producer.compatibilityHash,
        checksumThread: true,
      }),
      nocrc: await ConsumerConnector.create({
        numBlocks: BLOCKS,
        blockBytes: BB,
        compatibility: producer.compatibilityHash,
        verifyChecksum: false,
      }),
    };
    // warm up sessions, pooled connections and JIT
    for (const c of Object.values(conns))
      for (const n of SIZES) await fetchOne(c, producer.controlEndpoint, `emb-${n}`, n);
    for (const n of SIZES) await rawClient.fetch(n);
    for (const n of SIZES) await rawSbClient.fetch(n);

    for (const n of THROUGHPUT_SIZES) {
      const iters = ITER[n]!;
      const rawTimes: number[] = [];
      const rawSbTimes: number[] = [];
      const crcTimes: number[] = [];
      const crcThreadTimes: number[] = [];
      const noCrcTimes: number[] = [];
      const classicTimes: number[] = [];
      const ackAheadTimes: number[] = [];
      const rawFetch = async (c: RawClient): Promise<number> => {
        const t0 = performance.now();
        await c.fetch(n);
        return performance.now() - t0;
      };
      const item = `emb-${n}`;
      const cp = producer.controlEndpoint;
      const rounds = await interleaved(
        [
          async () => void rawTimes.push(await rawFetch(rawClient)),
          async () => void rawSbTimes.push(await rawFetch(rawSbClient)),
          async () => void crcTimes.push(await fetchOne(conns.crc, cp, item, n)),
          async () => void crcThreadTimes.push(await fetchOne(conns.crcThread, cp, item, n)),
          async () => void noCrcTimes.push(await fetchOne(conns.nocrc, cp, item, n)),
          async () => void classicTimes.push(await fetchOne(conns.crcClassic, cp, item, n)),
          async () => void ackAheadTimes.push(await fetchOne(conns.crcAckAhead, cp, item, n)),
        ],
        iters,
      );
      const gbps = (ms: number) => round(n / (ms / 1000) / 1e9, 3);
      const raw = median(rawTimes);
      const crc = median(crcTimes);
      const nocrc = median(noCrcTimes);
      const crcThread = median(crcThreadTimes);
      const best = (xs: number[]) => Math.min(...xs);
      throughput.push({
        kind,
        bytes: n,
        iterations: rounds,
        raw_median_ms: round(raw),
        raw_gb_s: gbps(raw),
        ec_crc_median_ms: round(crc),
        ec_crc_gb_s: gbps(crc),
        ec_crc_thread_median_ms: round(crcThread),
        ec_crc_thread_gb_s: gbps(crcThread),
        ec_nocrc_median_ms: round(nocrc),
        ec_nocrc_gb_s: gbps(nocrc),
        ratio_crc_vs_raw: round(raw / crc),
        // the raw stream with the ec data server's socket send buffer (like for like)
        raw_sockbuf_median_ms: round(median(rawSbTimes)),
        ratio_crc_vs_raw_sockbuf: round(median(rawSbTimes) / crc),
        ratio_nocrc_vs_raw_sockbuf: round(median(rawSbTimes) / nocrc),
        ratio_crc_thread_vs_raw: round(raw / crcThread),
        ratio_nocrc_vs_raw: round(raw / nocrc),
        ec_crc_classic_median_ms: round(median(classicTimes)),
        ratio_crc_classic_vs_raw: round(raw / median(classicTimes)),
        ec_crc_ack_ahead_median_ms: round(median(ackAheadTimes)),
        ratio_crc_ack_ahead_vs_raw: round(raw / median(ackAheadTimes)),
        // time the control plane + protocol add per transfer (CRC off: data bytes are the same)
        overhead_ms_nocrc: round(nocrc - raw),
        // best-of-N: what the path does when the (shared) machine leaves it alone
        best_raw_gb_s: gbps(best(rawTimes)),
        best_ec_crc_gb_s: gbps(best(crcTimes)),
        best_ec_nocrc_gb_s: gbps(best(noCrcTimes)),
        best_ratio_crc_vs_raw: round(best(rawTimes) / best(crcTimes)),
        best_ratio_crc_thread_vs_raw: round(best(rawTimes) / best(crcThreadTimes)),
        best_ratio_nocrc_vs_raw: round(best(rawTimes) / best(noCrcTimes)),
      });
    }

    // request-to-promotion latency of one 16 MiB embedding, and of a 1 KiB one (control-plane bound)
    // EC_BENCH_CONTROL=1 keeps these rows (and the 1 KiB control target) with EC_BENCH_ONLY=throughput.
    for (const n of ONLY === "throughput" && process.env["EC_BENCH_CONTROL"] !== "1"
      ? []
      : [16 * MiB, 1024]) {
      const h = n === 1024 ? "emb-1k" : `emb-${n}`;
      const xs: number[] = [];
      const rawXs: number[] = [];
      for (let i = 0; i < LAT_ITER; i++) {
        xs.push(await fetchOne(conns.crc, producer.controlEndpoint, h, n));
        const t0 = performance.now();
        await rawClient.fetch(n);
        rawXs.push(performance.now() - t0);
      }
      if (n === 1024) {
        // EC-CONTRACT 5/6 target (issue 23): a 1 KiB transfer (control round trip + a tiny read)
        // against the raw ZeroMQ round trip, interleaved.
        const ecXs: number[] = [];
        const zXs: number[] = [];
        const oldXs: number[] = [];
        const aaXs: number[] = [];
        const cp = producer.controlEndpoint;
        const rounds = await interleaved(
          [
            async () => void ecXs.push(await fetchOne(conns.crc, cp, h, n)),
            async () => void oldXs.push(await fetchOne(conns.crcClassic, cp, h, n)),
            async () => void aaXs.push(await fetchOne(conns.crcAckAhead, cp, h, n)),
            async () => void zXs.push(await zmqRtt()),
          ],
          2 * LAT_ITER,
        );
        control.push({
          kind,
          iterations: rounds,
          ec_1k_transfer_p50_ms: round(median(ecXs)),
          raw_zmq_rtt_p50_ms: round(median(zXs)),
          ratio_ec_1k_to_raw_zmq: round(median(ecXs) / median(zXs)),
          ec_1k_classic_p50_ms: round(median(oldXs)),
          ratio_classic_to_raw_zmq: round(median(oldXs) / median(zXs)),
          ec_1k_ack_ahead_p50_ms: round(median(aaXs)),
          ratio_ack_ahead_to_raw_zmq: round(median(aaXs) / median(zXs)),
          target: "<= 1.5",
        });
      }
      latency.push({
        kind,
        bytes: n,
        iterations: LAT_ITER,
        request_to_promotion_p50_ms: round(median(xs)),
        request_to_promotion_p99_ms: round(pct(xs, 99)),
        raw_stream_p50_ms: round(median(rawXs)),
        overhead_p50_ms: round(median(xs) - median(rawXs)),
        overhead_best_ms: round(Math.min(...xs) - Math.min(...rawXs)),
      });
    }
    for (const c of Object.values(conns)) await c.close();
    rawClient.socket.destroy();
    rawChild.proc.kill("SIGTERM");
    rawSbClient.socket.destroy();
    rawSbChild.proc.kill("SIGTERM");
    prodChild.proc.kill("SIGTERM");
  }
  results["node"] = process.version;
  results["loadavg"] = loadavg();
  results["block_bytes"] = BB;
  results["crc_impl"] = crc32Info.impl;
  results["producer_crc_impl"] = producerCrcImpl;
  results["crc_small_impl"] = crc32Info.smallImpl;
  // With checksumThread: true the thread is used only below CHECKSUM_THREAD_MAX_INLINE_GBPS.
  results["crc_inline_gb_s"] = round(crc32InlineGbps(), 1);
  results["checksum_thread_max_inline_gb_s"] = CHECKSUM_THREAD_MAX_INLINE_GBPS;
  results["note"] =
    "producer (tapwire-ec-producer) and raw server each in a child process, consumer in the bench process; medians; ratio = raw_time / ec_time (1.0 = as fast as raw)";
  results["loadavg"] = loadavg();
  results["send_buffer_bytes"] = ecSendBuffer();
  results["throughput"] = throughput;
  if (ONLY !== "throughput") {
    results["events"] = await eventsRow();
    results["shm"] = await shmRow();
    const dataPlane = await shmDataPlaneRows(SIZES);
    results["shm_data_plane"] = dataPlane.region;
    results["shm_data_plane_ring"] = dataPlane.ring;
    results["crc"] = crcRows();
  }
  results["latency"] = latency;
  results["control"] = control;
  results["targets"] = [
    ...throughput.map((t) => ({
      kind: t["kind"],
      bytes: t["bytes"],
      ratio_crc_vs_raw: t["ratio_crc_vs_raw"],
      target: Number(t["bytes"]) <= 1 << 20 ? ">= 0.8" : ">= 0.9",
      met: Number(t["ratio_crc_vs_raw"]) >= (Number(t["bytes"]) <= 1 << 20 ? 0.8 : 0.9),
    })),
    ...control.map((c) => ({
      kind: c["kind"],
      bytes: 1024,
      ratio_ec_1k_to_raw_zmq: c["ratio_ec_1k_to_raw_zmq"],
      target: "<= 1.5",
      met: Number(c["ratio_ec_1k_to_raw_zmq"]) <= 1.5,
    })),
  ];
  zmqDealer.close();
  zmqChild.proc.kill("SIGTERM");
  process.stdout.write(`${JSON.stringify(results, null, 2)}\n`);
}

await main();
