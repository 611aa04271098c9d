/**
 * The tensor pool of {@link OnnxDrafter}: one set of input and output tensors per batch-size
 * bucket, made once and reused by every STEP of that size (no allocation per STEP).
 */
import * as ort from "onnxruntime-node";
import type { ModelInfo } from "./model.js";
import { Input, Output } from "./signature.js";

/** The top outputs of one bucket for one K. */
export interface TopOut {
  logits: ort.Tensor;
  ids: ort.Tensor;
  logitsData: Float32Array;
  ids32: Int32Array;
}

/** Tensors of one batch size, made once and reused by every STEP of that size. */
export interface Bucket {
  size: number;
  rowsU8: Uint8Array;
  rows32: Uint32Array;
  rowCount32: Int32Array;
  anchor32: Int32Array;
  prev32: Int32Array;
  feeds: Record<string, ort.Tensor>;
  zeroState: ort.Tensor | null;
  states: [ort.Tensor, ort.Tensor] | null;
  fetches: Record<string, ort.Tensor>;
  /** The same without `next_state`: the last position needs no state (one output copy less). */
  fetchesLast: Record<string, ort.Tensor>;
  /** Per K (2 or 32, or the model's fixed K): the top outputs. */
  top: Map<number, TopOut>;
  logits: ort.Tensor | null;
  logitRows: Float32Array[];
  confidence: ort.Tensor;
  confData: Float32Array;
}

/** Bucket size for a batch: exact up to 8, then the next multiple of 8 (bounded number of tensor sets). */
export function bucketSize(n: number): number {
  return n <= 8 ? n : Math.ceil(n / 8) * 8;
}

/** The tensors of batch size `size` (a {@link bucketSize}) for a model `info`; `position` is shared. */
export function newBucket(info: ModelInfo, size: number, position: ort.Tensor): Bucket {
  const rows = new Uint16Array(size * info.windowRows * info.numTaps * info.hidden);
  const i64 = () => new BigInt64Array(size);
  const rowCount = i64();
  const anchor = i64();
  const prev = i64();
  const feeds: Record<string, ort.Tensor> = {
    [Input.ROWS]: new ort.Tensor("uint16", rows, [size, info.windowRows, info.numTaps, info.hidden]),
    [Input.ROW_COUNT]: new ort.Tensor("int64", rowCount, [size]),
    [Input.ANCHOR_TOKEN]: new ort.Tensor("int64", anchor, [size]),
    [Input.PREV_TOKEN]: new ort.Tensor("int64", prev, [size]),
    [Input.POSITION]: position,
  };
  const confData = new Float32Array(size);
  const confidence = new ort.Tensor("float32", confData, [size]);
  const fetches: Record<string, ort.Tensor> = { [Output.CONFIDENCE]: confidence };
  let zeroState: ort.Tensor | null = null;
  let states: [ort.Tensor, ort.Tensor] | null = null;
  if (info.stateSize > 0) {
    const s = info.stateSize;
    zeroState = new ort.Tensor("float32", new Float32Array(size * s), [size, s]);
    states = [
      new ort.Tensor("float32", new Float32Array(size * s), [size, s]),
      new ort.Tensor("float32", new Float32Array(size * s), [size, s]),
    ];
  }
  let logits: ort.Tensor | null = null;
  const logitRows: Float32Array[] = [];
  if (info.output === "logits") {
    const data = new Float32Array(size * info.vocabSize);
    logits = new ort.Tensor("float32", data, [size, info.vocabSize]);
    for (let i = 0; i < size; i++)
      logitRows.push(data.subarray(i * info.vocabSize, (i + 1) * info.vocabSize));
    fetches[Output.LOGITS] = logits;
  }
  return {
    size,
    rowsU8: new Uint8Array(rows.buffer),
    rows32: new Uint32Array(rows.buffer),
    rowCount32: new Int32Array(rowCount.buffer),
    anchor32: new Int32Array(anchor.buffer),
    prev32: new Int32Array(prev.buffer),
    feeds,
    zeroState,
    states,
    fetches,
    fetchesLast: { ...fetches },
    top: new Map(),
    logits,
    logitRows,
    confidence,
    confData,
  };
}

/** The top outputs of bucket `b` for `k` candidates, made on first use. */
export function topOutputs(b: Bucket, k: number): TopOut {
  let t = b.top.get(k);
  if (t === undefined) {
    const logitsData = new Float32Array(b.size * k);
    const ids = new BigInt64Array(b.size * k);
    t = {
      logits: new ort.Tensor("float32", logitsData, [b.size, k]),
      ids: new ort.Tensor("int64", ids, [b.size, k]),
      logitsData,
      ids32: new Int32Array(ids.buffer),
    };
    b.top.set(k, t);
  }
  return t;
}
