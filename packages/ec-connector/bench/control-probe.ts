/**
 * `tsx bench/control-probe.ts`: where the EC control round trip's fixed cost goes (issue 23). In
 * one run, interleaved: a 1 KiB transfer (CRC on) from the producer bin in a child process and a
 * raw ZeroMQ DEALER/ROUTER round trip against bench/zmq-echo.ts in another child, while
 * bench/send-timing.mjs (loaded with `--import` into every process) times each synchronous
 * zeromq.js `send()` and the gap from a ROUTER receive to the next send. Prints one JSON document.
 * Diagnosis, not a target row: the targets are in bench/index.ts.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { ConsumerConnector } from "../src/index.js";

const PRODUCER = fileURLToPath(new URL("../src/bin/producer.ts", import.meta.url));
const ZMQ_ECHO = fileURLToPath(new URL("./zmq-echo.ts", import.meta.url));
const TIMING = fileURLToPath(new URL("./send-timing.mjs", import.meta.url));
const ITERS = Number(process.env.BENCH_ITERS ?? 300);

process.env["TAPWIRE_SEND_TIMING_ROLE"] = "bench (consumer and baseline dealers)";
const timingLines: Record<string, unknown>[] = [];
const origWrite = process.stderr.write.bind(process.stderr);
// This process's own timing lines are collected like the children's (not printed).
process.stderr.write = ((chunk: string | Uint8Array, ...rest: never[]) => {
  const s = String(chunk);
  if (s.startsWith("send-timing ")) {
    timingLines.push(JSON.parse(s.slice("send-timing ".length)) as Record<string, unknown>);
    return true;
  }
  return origWrite(chunk, ...rest);
}) as typeof process.stderr.write;
await import("./send-timing.mjs");
const { Dealer } = await import("zeromq");

// Extra node flags for the producer child, e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof".
const PRODUCER_NODE_ARGS = (process.env["PROBE_PRODUCER_NODE_ARGS"] ?? "").split(" ").filter((a) => a !== "");

async function spawnChild(script: string, args: string[], role: string, nodeArgs: string[] = []) {
  const proc: ChildProcess = spawn(
    process.execPath,
    [...nodeArgs, "--import", "tsx", "--import", TIMING, script, ...args],
    {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, TAPWIRE_SEND_TIMING_ROLE: role },
    },
  );
  createInterface({ input: proc.stderr! }).on("line", (l) => {
    if (l.startsWith("send-timing ")) timingLines.push(JSON.parse(l.slice("send-timing ".length)));
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

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[xs.length >> 1] ?? 0;

const echo = await spawnChild(ZMQ_ECHO, [], "zmq-echo (baseline ROUTER)");
const dealer = new Dealer({ linger: 0 });
dealer.connect(String(echo.line["endpoint"]));
const msg = new Uint8Array(200);
const prod = await spawnChild(
  PRODUCER,
  ["--num-blocks", "64", "--block-bytes", "65536", "--data", "tcp://127.0.0.1:0"].concat([
    "--prepopulate",
    "emb-1k:1024",
    "--log-level",
    "warn",
  ]),
  "producer (ROUTER)",
  PRODUCER_NODE_ARGS,
);
const conn = await ConsumerConnector.create({
  numBlocks: 64,
  blockBytes: 65536,
  compatibility: String(prod.line["compatibilityHash"]),
  // The default connector (read-ahead + ack-ahead since issue 23, docs/ec-protocol.md 3.2, 3.3);
  // PROBE_READ_AHEAD=0: the 1.1 sequence.
  readAhead: process.env["PROBE_READ_AHEAD"] !== "0",
});
const endpoint = String(prod.line["control"]);

async function fetch1k(): Promise<number> {
  let wake: (() => void) | null = null;
  conn.onActivity = () => {
    const w = wake;
    wake = null;
    w?.();
  };
  const t0 = performance.now();
  conn.request("emb-1k", endpoint, 1024, t0 + 30_000);
  for (;;) {
    const r = conn.poll();
    if (r.loaded.length > 0) break;
    if (r.failed.length > 0) throw new Error(`emb-1k: ${r.failed[0]!.reason}`);
    await new Promise<void>((resolve) => {
      wake = resolve;
      setTimeout(resolve, 5).unref();
    });
  }
  const dt = performance.now() - t0;
  conn.free("emb-1k");
  return dt;
}
async function zmqRtt(): Promise<number> {
  const t0 = performance.now();
  await dealer.send(msg);
  await dealer.receive();
  return performance.now() - t0;
}

for (let i = 0; i < 50; i++) {
  await fetch1k();
  await zmqRtt();
}
timingLines.length = 0;
const ec: number[] = [];
const raw: number[] = [];
for (let i = 0; i < ITERS; i++) {
  ec.push(await fetch1k());
  raw.push(await zmqRtt());
}
await new Promise((r) => setTimeout(r, 200)); // the children's last lines
const bySocket: Record<string, Record<string, number>> = {};
const groups = new Map<string, Record<string, unknown>[]>();
for (const l of timingLines) {
  const k = `${String(l["role"])} ${String(l["socket"])}`;
  groups.set(k, [...(groups.get(k) ?? []), l]);
}
for (const [k, ls] of groups) {
  const row: Record<string, number> = {};
  for (const f of Object.keys(ls[0]!)) {
    if (typeof ls[0]![f] === "number") row[f] = median(ls.map((l) => Number(l[f])));
  }
  bySocket[k] = row;
}
const ecP50 = median(ec);
const rawP50 = median(raw);
process.stdout.write(
  `${JSON.stringify(
    {
      iterations: ITERS,
      read_ahead: process.env["PROBE_READ_AHEAD"] !== "0",
      transfer_1k_ms_p50: Number(ecP50.toFixed(3)),
      zmq_round_trip_ms_p50: Number(rawP50.toFixed(3)),
      ratio: Number((ecP50 / rawP50).toFixed(2)),
      send_timing: bySocket,
    },
    null,
    2,
  )}\n`,
);
await conn.close();
dealer.close();
prod.proc.kill();
echo.proc.kill();
// the producer exits on SIGTERM (writing a --cpu-prof profile first)
await new Promise((r) => prod.proc.once("exit", r));
process.exit(0);
