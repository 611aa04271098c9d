// issue 23: a STEP-shaped request (a 2 KiB head then 64 rows of 24 KiB, 1.5 MiB) over shm+unix
// against the same request over unix, interleaved round by round in one run. The server places
// the rows into 64 window segments with receiveInto (the worker's path: over unix the kernel
// reads into them, over shm they are copied once from the mapping); the client's rows sit in
// 64 ring buffers (unix: ordinary buffers sent as parts; shm: rings inside a ShmArena, sent by
// offset). Reply 1 KiB. Same process for both contenders. JSON on stdout when run directly.
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { createShmArena, listen, makeClient, type ReceivePlan } from "../src/index.js";

const HEAD = 2048;
const ROWS = 64;
const ROW = 24 * 1024;
const TOTAL = HEAD + ROWS * ROW;
const REPLY = Buffer.alloc(1024, 3);

interface Sample {
  p50: number;
  p99: number;
}

function pct(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))] as number;
}

async function contender(scheme: "unix" | "shm+unix", dir: string) {
  const windows = Array.from({ length: ROWS }, () => Buffer.alloc(ROW));
  const plan: ReceivePlan = { headBytes: HEAD, segments: windows };
  const srv = await listen(`${scheme}://${join(dir, `${scheme === "unix" ? "u" : "m"}.sock`)}`, () => REPLY, {
    receiveInto: (h) => (h.length < HEAD ? HEAD : plan),
    onError: (e) => process.stderr.write(`server error: ${String(e)}\n`),
  });
  const arena = scheme === "shm+unix" ? createShmArena(16 * 1024 * 1024) : null;
  if (scheme === "shm+unix" && arena === null) throw new Error("koffi missing: no shm bench");
  const c = makeClient(srv.endpoint, arena !== null ? { shmArena: arena } : {});
  await c.connect();
  const head = Buffer.alloc(HEAD, 1);
  const rows: Uint8Array[] = [];
  for (let i = 0; i < ROWS; i++) {
    // rings of 8 rows, the row of this round in each: a view, as RoundCore's parts mode sends
    const ring =
      arena !== null
        ? arena.bytes.subarray(i * 8 * ROW + 65536, (i + 1) * 8 * ROW + 65536)
        : Buffer.alloc(8 * ROW);
    ring.fill(i);
    rows.push(ring.subarray(3 * ROW, 4 * ROW));
  }
  const parts = [head, ...rows];
  const reply = Buffer.alloc(4096);
  return {
    async run(iters: number): Promise<Sample> {
      const t: number[] = [];
      for (let i = 0; i < iters; i++) {
        const t0 = performance.now();
        await c.requestParts(parts, reply, 10_000);
        t.push((performance.now() - t0) * 1000);
      }
      return { p50: pct(t, 0.5), p99: pct(t, 0.99) };
    },
    async close() {
      c.close();
      await srv.close();
    },
  };
}

function median(xs: number[]): number {
  return pct(xs, 0.5);
}

/** Interleaved rounds of unix and shm; medians over rounds of per-round p50/p99 and their ratios. */
export async function benchShm(rounds = 6, iters = 300): Promise<Record<string, unknown>> {
  const dir = mkdtempSync(join(tmpdir(), "tws-"));
  const u = await contender("unix", dir);
  const m = await contender("shm+unix", dir);
  await u.run(50);
  await m.run(50);
  const su: Sample[] = [];
  const sm: Sample[] = [];
  const r50: number[] = [];
  const r99: number[] = [];
  for (let r = 0; r < rounds; r++) {
    // Which contender goes first alternates by round (the second one finds the caches the first
    // left), as the ec bench's rotation does.
    let a: Sample;
    let b: Sample;
    if (r % 2 === 0) {
      a = await u.run(iters);
      b = await m.run(iters);
    } else {
      b = await m.run(iters);
      a = await u.run(iters);
    }
    su.push(a);
    sm.push(b);
    r50.push(b.p50 / a.p50);
    r99.push(b.p99 / a.p99);
    process.stderr.write(`shm round ${r}: unix p50 ${a.p50.toFixed(0)} us, shm p50 ${b.p50.toFixed(0)} us\n`);
  }
  await u.close();
  await m.close();
  const round = (x: number) => Math.round(x * 100) / 100;
  return {
    bench: "STEP 64 rows x 24 KiB: shm+unix vs unix (issue 23)",
    requestBytes: TOTAL,
    replyBytes: REPLY.length,
    rounds,
    iterations_per_round: iters,
    unix: { p50_us: round(median(su.map((s) => s.p50))), p99_us: round(median(su.map((s) => s.p99))) },
    shm: { p50_us: round(median(sm.map((s) => s.p50))), p99_us: round(median(sm.map((s) => s.p99))) },
    p50_ratio_shm_to_unix: round(median(r50)),
    p99_ratio_shm_to_unix: round(median(r99)),
    per_round_p50_ratios: r50.map(round),
    targets: { p50_ratio: "<= 0.5", p99_ratio: "<= 1.0" },
  };
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) {
  const out = await benchShm(Number(process.env.BENCH_ROUNDS ?? 6));
  process.stdout.write(`${JSON.stringify(out, null, 1)}\n`);
}
