import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { ConsumerConnector } from "../src/index.js";
const prod = spawn(process.execPath, ["--cpu-prof", "--cpu-prof-dir=/tmp/prof/prod", "dist/bin/producer.js", "--num-blocks", "1024", "--block-bytes", "65536", "--data", process.argv[2] ?? "tcp://127.0.0.1:0", "--prepopulate", "emb-1k:1024,emb-1m:1048576", "--log-level", "warn"], { stdio: ["ignore", "pipe", "inherit"] });
const line = await new Promise<Record<string, unknown>>((res) => createInterface({ input: prod.stdout! }).on("line", (l) => { try { const o = JSON.parse(l); if (o.msg === "listening") res(o); } catch {} }));
const conn = await ConsumerConnector.create({ numBlocks: 1024, blockBytes: 65536, compatibility: String(line.compatibilityHash) });
async function fetchOne(h: string, n: number) {
  let wake: (() => void) | null = null;
  conn.onActivity = () => { const w = wake; wake = null; w?.(); };
  const t0 = performance.now();
  conn.request(h, String(line.control), n, t0 + 30_000);
  for (;;) {
    const r = conn.poll();
    if (r.loaded.length > 0) break;
    if (r.failed.length > 0) throw new Error(r.failed[0]!.reason);
    await new Promise<void>((resolve) => { wake = resolve; setTimeout(resolve, 5).unref(); });
  }
  conn.free(h);
  return performance.now() - t0;
}
const N = Number(process.env.N ?? 3000);
const size = Number(process.env.SIZE ?? 1024);
const h = size === 1024 ? "emb-1k" : "emb-1m";
for (let i = 0; i < 200; i++) await fetchOne(h, size);
const xs: number[] = [];
for (let i = 0; i < N; i++) xs.push(await fetchOne(h, size));
xs.sort((a, b) => a - b);
console.log(JSON.stringify({ p50: xs[N >> 1], p10: xs[Math.floor(N / 10)] }));
await conn.close();
prod.kill("SIGTERM");
await new Promise((r) => prod.once("exit", r));
