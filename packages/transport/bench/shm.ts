// issue 23: a STEP-shaped request (a 2 KiB head then 64 rows of 24 KiB, 1.5 MiB) over shm+unix
// against the same request over unix, interleaved round by round in one run. The server places
// the rows into 64 window segments with receiveInto (the worker's path: over unix the kernel
// reads into them, over shm they are copied once from the mapping); the client's rows sit in
// 64 ring buffers (unix: ordinary buffers sent as parts; shm: rings inside a ShmArena, sent by
// offset). Reply 1 KiB. Same process for all contenders. JSON on stdout when run directly.
//
// The window segments are laid out as the worker's (packages/worker window-store.ts): one slot
// buffer of 4 windows of 16 rows per slot, from copyTargetBytes, the row of the round at a
// multiple of the row size. A third contender, `shm_malloc_windows`, receives over shm into slot
// buffers from a plain `new Uint8Array` (what the worker used before copyTargetBytes: 16 bytes
// past a page, so every row copy lands 16 bytes ahead of its source mod 4096; src/aligned.ts).
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { interleaved } from "@tapwire/testing";
import { copyTargetBytes, createShmArena, listen, makeClient, type ReceivePlan } from "../src/index.js";
import { loadLibc } from "../src/shm.js";

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

/** Rows per slot buffer, as the worker's default (`--slot-buffer-windows 4` of W 16). */
const SLOT_ROWS = 64;

async function contender(
  scheme: "unix" | "shm+unix",
  dir: string,
  alloc: (n: number) => Uint8Array,
  name: string,
) {
  // Slot i's row lands at row 3 of its own slot buffer (a multiple of ROW, as the worker appends).
  const windows = Array.from({ length: ROWS }, () => alloc(SLOT_ROWS * ROW).subarray(3 * ROW, 4 * ROW));
  const plan: ReceivePlan = { headBytes: HEAD, segments: windows };
  const srv = await listen(`${scheme}://${join(dir, `${name}.sock`)}`, () => REPLY, {
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
  await loadLibc(); // as the worker has once it listens on shm+unix: copyTargetBytes aligns
  const u = await contender("unix", dir, copyTargetBytes, "u");
  const m = await contender("shm+unix", dir, copyTargetBytes, "m");
  const mm = await contender("shm+unix", dir, (n) => new Uint8Array(n), "mm");
  await u.run(50);
  await m.run(50);
  await mm.run(50);
  const su: Sample[] = [];
  const sm: Sample[] = [];
  const smm: Sample[] = [];
  // The contenders in rotating order, forwards then backwards (@tapwire/testing interleaved):
  // each one finds, equally often, the caches each other one left.
  const ran = await interleaved(
    [
      async () => su.push(await u.run(iters)),
      async () => sm.push(await m.run(iters)),
      async () => smm.push(await mm.run(iters)),
    ],
    rounds,
  );
  const r50 = su.map((a, i) => sm[i]!.p50 / a.p50);
  const r99 = su.map((a, i) => sm[i]!.p99 / a.p99);
  const rm50 = su.map((a, i) => smm[i]!.p50 / a.p50);
  for (const [i, a] of su.entries()) {
    process.stderr.write(
      `shm round ${i}: unix p50 ${a.p50.toFixed(0)} us, shm p50 ${sm[i]!.p50.toFixed(0)} us, shm into malloc windows ${smm[i]!.p50.toFixed(0)} us\n`,
    );
  }

  await u.close();
  await m.close();
  await mm.close();
  const round = (x: number) => Math.round(x * 100) / 100;
  return {
    bench: "STEP 64 rows x 24 KiB: shm+unix vs unix (issue 23)",
    requestBytes: TOTAL,
    replyBytes: REPLY.length,
    rounds: ran,
    iterations_per_round: iters,
    unix: { p50_us: round(median(su.map((s) => s.p50))), p99_us: round(median(su.map((s) => s.p99))) },
    shm: { p50_us: round(median(sm.map((s) => s.p50))), p99_us: round(median(sm.map((s) => s.p99))) },
    p50_ratio_shm_to_unix: round(median(r50)),
    p99_ratio_shm_to_unix: round(median(r99)),
    shm_malloc_windows: {
      p50_us: round(median(smm.map((s) => s.p50))),
      p99_us: round(median(smm.map((s) => s.p99))),
    },
    p50_ratio_shm_malloc_windows_to_unix: round(median(rm50)),
    per_round_p50_ratios: r50.map(round),
    targets: { p50_ratio: "<= 0.5", p99_ratio: "<= 1.0" },
  };
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) {
  const out = await benchShm(Number(process.env.BENCH_ROUNDS ?? 6));
  process.stdout.write(`${JSON.stringify(out, null, 1)}\n`);
}
