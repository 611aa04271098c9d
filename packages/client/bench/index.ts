// Full RoundCore round (rows into the ring, rows staged in the send buffer, STEP, reply
// validation 6.3/7.4, draft copy-out, depth policy) against an in-process worker with the
// NullDrafter, over tcp:// and unix://, versus a raw node:net length-prefixed exchange of the
// same request and reply byte counts (onread into a reused buffer, cork/uncork), measured in the
// same run and process. JSON on stdout; progress on stderr.
import { mkdtempSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { APP_HEADER_SIZE, rowsOffsetFor, stepReplyBodySize } from "@tapwire/wire";
import { createWorker, NullDrafter } from "@tapwire/worker";
import { pino } from "pino";
import { DepthPolicy, RemoteDraftClient, RoundCore, type RoundRequest } from "../src/index.js";

const NUM_TAPS = 3;
const HIDDEN = 4096;
const ROW_BYTES = NUM_TAPS * HIDDEN * 2;
const WINDOW = 16;
const NUM_SPEC = 4;
const VOCAB = 32_000;
const MAX_SLOTS = 64;
const MAX_ROWS = 64;
const ITERS = Number(process.env.BENCH_ITERS ?? 200);
const BLOCKS = Number(process.env.BENCH_BLOCKS ?? 3);
const dir = mkdtempSync(join(tmpdir(), "twc-"));
const ids = { drafterIdentity: new Uint8Array(32).fill(1), markovIdentity: new Uint8Array(32).fill(2) };

interface Scenario {
  name: string;
  slots: number;
  rowsPerSlot: number;
}
const SCENARIOS: Scenario[] = [
  { name: "64 slots x 1 row", slots: 64, rowsPerSlot: 1 },
  { name: "8 slots x 8 rows", slots: 8, rowsPerSlot: 8 },
];

// samples in microseconds, preallocated; percentiles by sorting at the end
class Samples {
  readonly v = new Float64Array(ITERS * BLOCKS);
  n = 0;
  recordValue(us: number): void {
    this.v[this.n++] = us;
  }
  getValueAtPercentile(q: number): number {
    const s = this.v.slice(0, this.n).sort();
    return s[Math.min(s.length - 1, Math.floor((q / 100) * s.length))]!;
  }
}
function newHist(): Samples {
  return new Samples();
}

// Raw baseline: length-prefixed request of reqBytes, reply of replyBytes.
async function rawNet(kind: "tcp" | "unix", replyBytes: number) {
  const reply = Buffer.alloc(replyBytes, 7);
  const server = net.createServer({ noDelay: true }, (s) => {
    let asm = Buffer.allocUnsafe(4 << 20);
    let hdr = 0;
    let len = 0;
    let got = 0;
    const h = Buffer.allocUnsafe(4);
    h.writeUInt32LE(replyBytes);
    s.on("data", (c: Buffer) => {
      let off = 0;
      while (off < c.length) {
        if (hdr < 4) {
          len |= (c[off++] as number) << (8 * hdr);
          if (++hdr === 4) {
            got = 0;
            if (asm.length < len) asm = Buffer.allocUnsafe(len);
          }
          if (hdr < 4 || len > 0) continue;
        } else {
          const n = Math.min(c.length - off, len - got);
          c.copy(asm, got, off, off + n);
          got += n;
          off += n;
        }
        if (hdr === 4 && got === len) {
          hdr = 0;
          len = 0;
          s.cork();
          s.write(h);
          s.write(reply);
          s.uncork();
        }
      }
    });
  });
  const path = join(dir, `raw-${Math.random().toString(36).slice(2)}.sock`);
  await new Promise<void>((r) =>
    kind === "unix" ? server.listen(path, r) : server.listen(0, "127.0.0.1", r),
  );
  const port = kind === "tcp" ? (server.address() as net.AddressInfo).port : 0;
  const out = Buffer.allocUnsafe(replyBytes + 64);
  let hdr = 0;
  let len = 0;
  let got = 0;
  let done: () => void = () => {};
  const onread = {
    buffer: Buffer.allocUnsafe(256 * 1024),
    callback: (n: number, b: Uint8Array): boolean => {
      const buf = b as Buffer;
      let off = 0;
      while (off < n) {
        if (hdr < 4) {
          len |= (buf[off++] as number) << (8 * hdr);
          hdr++;
          continue;
        }
        const k = Math.min(n - off, len - got);
        buf.copy(out, got, off, off + k);
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
  const sock = await new Promise<net.Socket>((resolve) => {
    const s =
      kind === "unix"
        ? net.connect({ path, onread }, () => resolve(s))
        : net.connect({ host: "127.0.0.1", port, noDelay: true, onread }, () => resolve(s));
  });
  const header = Buffer.allocUnsafe(4);
  return {
    rt(msg: Uint8Array): Promise<void> {
      return new Promise<void>((resolve) => {
        done = resolve;
        header.writeUInt32LE(msg.length);
        sock.cork();
        sock.write(header);
        sock.write(msg);
        sock.uncork();
      });
    },
    async close() {
      sock.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

async function run(kind: "tcp" | "unix", sc: Scenario, rowsMode: "stage" | "parts") {
  const listenOn =
    kind === "tcp" ? "tcp://127.0.0.1:0" : `unix://${join(dir, `w-${sc.slots}-${rowsMode}.sock`)}`;
  const worker = await createWorker({
    drafter: new NullDrafter({
      ...ids,
      window: WINDOW,
      numSpec: NUM_SPEC,
      vocabSize: VOCAB,
      numTaps: NUM_TAPS,
      hidden: HIDDEN,
    }),
    listen: [listenOn],
    maxSlots: MAX_SLOTS,
    maxRowsPerStep: MAX_ROWS,
  });
  const client = new RemoteDraftClient({
    endpoint: worker.endpoints[0]!,
    ...ids,
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
  if (!(await client.waitReady(10_000))) throw new Error(`no connection to ${worker.endpoints[0]}`);
  const core = new RoundCore({
    client,
    rowsMode,
    depthPolicy: new DepthPolicy({
      budget: (b: number) => Math.max(8, 2 * b),
    }),
  });
  // one request per slot, each with a prompt of WINDOW rows, then rowsPerSlot accepted per round
  const rows = new Uint8Array(Math.max(WINDOW, sc.rowsPerSlot) * ROW_BYTES);
  for (let i = 0; i < rows.length; i++) rows[i] = (i * 31) & 0xff;
  const reqs: {
    slot: number;
    generation: number;
    anchorPos: number;
    anchorToken: number;
    newRows: Uint8Array | null;
  }[] = [];
  for (let s = 0; s < sc.slots; s++) {
    reqs.push({
      slot: s,
      generation: 1,
      anchorPos: WINDOW,
      anchorToken: 1,
      newRows: rows.subarray(0, WINDOW * ROW_BYTES),
    });
  }
  const step = rows.subarray(0, sc.rowsPerSlot * ROW_BYTES);
  const input = { requests: reqs as RoundRequest[] };
  // warm-up: resync rounds (deferred over several rounds) until everything is in sync
  for (let i = 0; i < 200; i++) {
    const r = await core.round(input);
    for (const q of reqs) {
      q.anchorPos += sc.rowsPerSlot;
      q.newRows = step;
    }
    if (r.outcome === "ok" && r.resynced === 0 && r.deferred === 0 && i > 10) break;
  }
  const frameBytes = APP_HEADER_SIZE + rowsOffsetFor(sc.slots, false) + sc.slots * sc.rowsPerSlot * ROW_BYTES;
  const replyBytes =
    APP_HEADER_SIZE + stepReplyBodySize({ nReq: sc.slots, numSpec: NUM_SPEC, margin: true, sampled: false });
  const raw = await rawNet(kind, replyBytes);
  const rawMsg = new Uint8Array(frameBytes).fill(3);
  for (let i = 0; i < 50; i++) await raw.rt(rawMsg);

  const hRound = newHist();
  const hStep = newHist();
  const hRaw = newHist();
  let bad = 0;
  let resynced = 0;
  for (let b = 0; b < BLOCKS; b++) {
    for (let i = 0; i < ITERS; i++) {
      const t0 = performance.now();
      const r = await core.round(input);
      const us = (performance.now() - t0) * 1000;
      if (r.outcome !== "ok" || r.rowsSent !== sc.slots * sc.rowsPerSlot) bad++;
      resynced += r.resynced;
      hRound.recordValue(Math.max(1, Math.round(us)));
      hStep.recordValue(Math.max(1, Math.round(r.rttUs)));
      for (const q of reqs) q.anchorPos += sc.rowsPerSlot;
    }
    for (let i = 0; i < ITERS; i++) {
      const t0 = performance.now();
      await raw.rt(rawMsg);
      hRaw.recordValue(Math.max(1, Math.round((performance.now() - t0) * 1000)));
    }
  }
  await raw.close();
  await client.close();
  await worker.close();
  const p = (h: Samples, q: number) => Math.round(h.getValueAtPercentile(q));
  return {
    transport: kind,
    scenario: sc.name,
    rows_mode: rowsMode,
    request_bytes: frameBytes,
    reply_bytes: replyBytes,
    iterations: ITERS * BLOCKS,
    failed_rounds: bad,
    resynced_entries: resynced,
    round_us: { p50: p(hRound, 50), p99: p(hRound, 99) },
    step_rtt_us: { p50: p(hStep, 50), p99: p(hStep, 99) },
    raw_baseline_us: { p50: p(hRaw, 50), p99: p(hRaw, 99) },
    round_p50_ratio_to_raw: Math.round((p(hRound, 50) / p(hRaw, 50)) * 100) / 100,
    round_p99_ratio_to_raw: Math.round((p(hRound, 99) / p(hRaw, 99)) * 100) / 100,
    step_p50_ratio_to_raw: Math.round((p(hStep, 50) / p(hRaw, 50)) * 100) / 100,
  };
}

const results = [];
for (const sc of SCENARIOS) {
  for (const kind of ["tcp", "unix"] as const) {
    for (const mode of ["stage", "parts"] as const) {
      process.stderr.write(`client bench: ${kind} ${sc.name} ${mode}\n`);
      results.push(await run(kind, sc, mode));
    }
  }
}
process.stdout.write(
  `${JSON.stringify(
    {
      package: "@tapwire/client",
      node: process.version,
      row_bytes: ROW_BYTES,
      window: WINDOW,
      num_spec: NUM_SPEC,
      target: "round p50 within 1.3x of the raw baseline",
      results,
    },
    null,
    2,
  )}\n`,
);
