/**
 * The exported reference head's arithmetic against the JavaScript head's, value by value
 * (docs/onnx-drafter.md "The exported reference head"; issue 20): at every position, the 32 top
 * logits the model returns are the JavaScript head's logits (`DraftHead.lastLogits`) bit for bit,
 * so the read-out of the row (the Gemm chain), the backbone and the LM head reproduce the head's
 * float32 roundings; and the confidence, whose exponential runs in float32 corrected for its
 * argument's rounding, is within one float32 unit of `min(1 / z, 1)` with `z` summed in float64
 * with `Math.exp` over the head's own logits. (The parity test compares drafts through the
 * drafters; this one looks at the values behind them.)
 */
import { createDefaultPair, Xoshiro128 } from "@tapwire/reference-model";
import * as ort from "onnxruntime-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { exportReferenceHead, Input, Output } from "../src/index.js";
import { rowPool } from "./helpers.js";

const { head } = createDefaultPair();
const V = head.vocabSize;
const N = head.config.numSpec;
const RB = head.numTaps * head.hidden * 2;
const ENTRIES = 160;

/** Distance in float32 units (same sign, finite). */
function ulps(a: number, b: number): number {
  const f = new Float32Array([a, b]);
  const i = new Int32Array(f.buffer);
  return Math.abs(i[0]! - i[1]!);
}

describe("exported reference head: values equal to the JavaScript head's", () => {
  let session: ort.InferenceSession;
  beforeAll(async () => {
    session = await ort.InferenceSession.create(exportReferenceHead(head), { logSeverityLevel: 3 });
  });
  afterAll(async () => {
    await session.release();
  });

  it(`${ENTRIES} entries x ${N} positions: top-32 logits bit for bit, confidence within 1 float32 unit of a float64 exp`, async () => {
    const rng = new Xoshiro128(20);
    const pool = rowPool(rng, RB, 64);
    const temps = new Float32Array(
      (head.weights.get("confidence.temperature")!.data.slice() as Uint8Array).buffer,
    );
    // The JavaScript head, entry by entry: ids and the logits of every position.
    const rows = new Uint16Array((ENTRIES * RB) / 2);
    const anchors = new BigInt64Array(ENTRIES);
    const jsIds = new Int32Array(ENTRIES * N);
    const jsLogits = new Float32Array(ENTRIES * N * V);
    for (let e = 0; e < ENTRIES; e++) {
      const nRows = 1 + rng.nextInt(head.config.window);
      const start = rng.nextInt(pool.length / RB - nRows + 1);
      const win = pool.subarray(start * RB, (start + nRows) * RB);
      const anchor = rng.nextInt(V);
      anchors[e] = BigInt(anchor);
      // the model reads the last row only (R = 1)
      rows.set(new Uint16Array(win.slice((nRows - 1) * RB).buffer), (e * RB) / 2);
      const ids = new Int32Array(N);
      head.draft(win, nRows, anchor, N, {
        ids,
        conf: new Float32Array(N),
        margin: null,
        offset: 0,
      });
      jsIds.set(ids, e * N);
      jsLogits.set(head.lastLogits.subarray(0, N * V), e * N * V);
    }
    const i64 = (x: BigInt64Array) => new ort.Tensor("int64", x, [ENTRIES]);
    const feeds: Record<string, ort.Tensor> = {
      [Input.ROWS]: new ort.Tensor("uint16", rows, [ENTRIES, 1, head.numTaps, head.hidden]),
      [Input.ROW_COUNT]: i64(new BigInt64Array(ENTRIES).fill(1n)),
      [Input.ANCHOR_TOKEN]: i64(anchors),
      [Input.TOP_K]: new ort.Tensor("int64", BigInt64Array.from([32n]), [1]),
      [Input.STATE]: new ort.Tensor("float32", new Float32Array(ENTRIES * head.stateDim), [
        ENTRIES,
        head.stateDim,
      ]),
    };
    let prev = anchors;
    let logitMismatches = 0;
    let confOff = 0;
    let maxConfUlps = 0;
    for (let j = 0; j < N; j++) {
      feeds[Input.POSITION] = new ort.Tensor("int64", BigInt64Array.from([BigInt(j)]), [1]);
      feeds[Input.PREV_TOKEN] = i64(prev);
      const r = await session.run(feeds);
      const topL = r[Output.TOP_LOGITS]!.data as Float32Array;
      const topI = r[Output.TOP_IDS]!.data as BigInt64Array;
      const conf = r[Output.CONFIDENCE]!.data as Float32Array;
      feeds[Input.STATE] = r[Output.NEXT_STATE]!;
      const next = new BigInt64Array(ENTRIES);
      const inv = 1 / temps[j]!;
      for (let e = 0; e < ENTRIES; e++) {
        const lo = (e * N + j) * V;
        expect(Number(topI[e * 32]!), `entry ${e} position ${j}: greedy id`).toBe(jsIds[e * N + j]);
        for (let t = 0; t < 32; t++) {
          const id = Number(topI[e * 32 + t]!);
          if (!Object.is(topL[e * 32 + t]!, jsLogits[lo + id]!)) logitMismatches++;
        }
        let l1 = Number.NEGATIVE_INFINITY;
        for (let t = 0; t < V; t++) l1 = Math.max(l1, jsLogits[lo + t]!);
        let z = 0;
        for (let t = 0; t < V; t++) z += Math.exp((jsLogits[lo + t]! - l1) * inv);
        const u = ulps(conf[e]!, Math.min(1 / z, 1));
        maxConfUlps = Math.max(maxConfUlps, u);
        if (u > 1) confOff++;
        next[e] = BigInt(jsIds[e * N + j]!);
      }
      prev = next;
    }
    console.log(
      `exact: ${ENTRIES * N} positions, ${logitMismatches} of ${ENTRIES * N * 32} top logits differ, confidence max ${maxConfUlps} float32 unit(s) from a float64 exp`,
    );
    expect(logitMismatches).toBe(0);
    expect(confOff).toBe(0);
  });
});
