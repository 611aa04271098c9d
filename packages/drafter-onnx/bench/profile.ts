/**
 * Profiling aid (not a benchmark): per-node ONNX Runtime times of the exported reference head
 * at a few batch sizes (session option enableProfiling), aggregated by op type and position.
 * TAPWIRE_PROFILE_DIR: where ORT writes its JSON (default the OS temp dir).
 */
import { readdirSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createDefaultPair, Xoshiro128 } from "@tapwire/reference-model";
import * as ort from "onnxruntime-node";
import { exportReferenceHead } from "../src/index.js";
import { rowPool } from "../test/helpers.js";

const { head } = createDefaultPair();
const model = exportReferenceHead(head);
const rb = head.numTaps * head.hidden * 2;
const rng = new Xoshiro128(7);
const pool = rowPool(rng, rb, 64);
const dir = process.env["TAPWIRE_PROFILE_DIR"] ?? tmpdir();
const sizes = (process.env["TAPWIRE_PROFILE_SIZES"] ?? "8,64").split(",").map(Number);

for (const B of sizes) {
  const s = await ort.InferenceSession.create(model, {
    intraOpNumThreads: 1,
    interOpNumThreads: 1,
    graphOptimizationLevel: "all",
    executionMode: "sequential",
    enableProfiling: true,
    profileFilePrefix: join(dir, `b${B}`),
    logSeverityLevel: 3,
  });
  const rows = new Uint16Array((B * rb) / 2);
  for (let i = 0; i < B; i++)
    rows.set(new Uint16Array(pool.buffer.slice(i * rb, (i + 1) * rb)), (i * rb) / 2);
  const i64 = (v: number) => new BigInt64Array(B).fill(BigInt(v));
  const feeds: Record<string, ort.Tensor> = {
    rows: new ort.Tensor("uint16", rows, [B, 1, head.numTaps, head.hidden]),
    row_count: new ort.Tensor("int64", i64(16), [B]),
    anchor_token: new ort.Tensor("int64", i64(5), [B]),
    prev_token: new ort.Tensor("int64", i64(5), [B]),
    state: new ort.Tensor("float32", new Float32Array(B * head.stateDim), [B, head.stateDim]),
    top_k: new ort.Tensor("int64", BigInt64Array.from([2n]), [1]),
  };
  const iters = Number(process.env["TAPWIRE_PROFILE_ITERS"] ?? 50);
  const t = [0, 0, 0, 0];
  for (let it = 0; it < iters; it++) {
    for (let j = 0; j < 4; j++) {
      feeds["position"] = new ort.Tensor("int64", BigInt64Array.from([BigInt(j)]), [1]);
      const a = performance.now();
      await s.run(feeds);
      t[j] = (t[j] ?? 0) + performance.now() - a;
    }
  }
  s.endProfiling();
  const file = join(
    dir,
    readdirSync(dir)
      .filter((f) => f.startsWith(`b${B}_`))
      .sort()
      .at(-1)!,
  );
  await s.release();
  const ev = JSON.parse(readFileSync(file, "utf8")) as {
    cat: string;
    name: string;
    dur: number;
    args?: { op_name?: string };
  }[];
  const byOp = new Map<string, { us: number; n: number }>();
  let runs = 0;
  let runUs = 0;
  for (const e of ev) {
    if (e.cat === "Session" && e.name === "model_run") {
      runs++;
      runUs += e.dur;
    }
    if (e.cat !== "Node" || !e.name.endsWith("_kernel_time")) continue;
    const op = e.args?.op_name ?? "?";
    const key = `${op}${e.name.startsWith("r/") ? " (readout)" : ""}`;
    const x = byOp.get(key) ?? { us: 0, n: 0 };
    x.us += e.dur;
    x.n++;
    byOp.set(key, x);
  }
  const total = [...byOp.values()].reduce((a, x) => a + x.us, 0);
  console.log(
    `B=${B} runs ${runs} model_run mean ${(runUs / runs).toFixed(1)} us; kernels ${(total / runs).toFixed(1)} us/run; js-side per position ms ${t.map((x) => (x / iters).toFixed(3)).join(" ")}`,
  );
  for (const [k, v] of [...byOp].sort((a, b) => b[1].us - a[1].us).slice(0, 25)) {
    console.log(
      `  ${k.padEnd(30)} ${(v.us / runs).toFixed(1).padStart(8)} us/run  (${(v.n / runs).toFixed(1)} nodes/run)`,
    );
  }
}
