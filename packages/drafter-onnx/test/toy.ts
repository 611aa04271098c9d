/**
 * Small hand-built models of the head signature for the tests: a stateless bigram head with a
 * full `logits` output, and variants that break the signature or misbehave at run time.
 */
import { DataType, GraphBuilder, type OnnxNs, onnx, valueInfo } from "../src/onnx.js";
import { Input, Meta, Output } from "../src/signature.js";

/** Geometry of the toy models. */
export const TOY = { window: 4, numSpec: 3, vocab: 64, numTaps: 2, hidden: 8 } as const;

/** Options of {@link toyModel}. */
export interface ToyOptions {
  /** Rows of the bigram table that are NaN (the logits of a `prev_token` in here are NaN). */
  nanRows?: number[];
  /** Make the graph fail at run time for positions >= 1 (an index outside the table). */
  throwAfterPosition0?: boolean;
  /**
   * Add 10 to the logit of (first bf16 bits of the last row) mod V: every position then drafts
   * that id, which shows which row the model saw at index R - 1.
   */
  probeRows?: boolean;
  /** Edit the model before it is encoded. */
  edit?: (m: OnnxNs.IModelProto) => void;
}

/**
 * A stateless bigram head: logits = table[prev_token] + 0 * (sum of the last row), so the row
 * input is used; confidence = max softmax. Token t's favourite successor is (5t + 1) mod V.
 */
export function toyModel(o: ToyOptions = {}): Uint8Array {
  const V = TOY.vocab;
  const table = new Float32Array(V * V);
  for (let a = 0; a < V; a++)
    for (let b = 0; b < V; b++) table[a * V + b] = b === (5 * a + 1) % V ? 4 : ((a * 7 + b * 3) % 11) / 10;
  for (const r of o.nanRows ?? []) table.fill(Number.NaN, r * V, (r + 1) * V);
  const g = new GraphBuilder("t/");
  g.init("bigram.table", DataType.FLOAT, [V, V], new Uint8Array(table.buffer));
  const axes = g.i64("tapwire.axes", [1, 2, 3]);
  const idx = o.throwAfterPosition0
    ? g.op1("Add", [Input.PREV_TOKEN, g.op1("Mul", [Input.POSITION, g.i64("tapwire.big", [1000])])])
    : Input.PREV_TOKEN;
  const rowsF = g.op1("Cast", [Input.ROWS], { to: DataType.FLOAT });
  const rowSum = g.op1("ReduceSum", [rowsF, axes], { keepdims: 0 }); // [B]
  const zero = g.op1("Mul", [rowSum, g.init("tapwire.zero", DataType.FLOAT, [], new Uint8Array(4))]);
  let logits = g.op1("Add", [
    g.op1("Gather", ["bigram.table", idx], { axis: 0 }),
    g.op1("Unsqueeze", [zero, g.i64("tapwire.ax1", [1])]),
  ]);
  if (o.probeRows) {
    const last = g.op1("Gather", [Input.ROWS, g.i64("tapwire.last", [1])], { axis: 1 }); // [B, 1, T, H]
    const flat = g.op1("Reshape", [last, g.i64("tapwire.flat", [0, -1])]);
    const first = g.op1("Gather", [flat, g.i64("tapwire.first", [0])], { axis: 1 }); // [B, 1]
    const id = g.op1("Mod", [g.op1("Cast", [first], { to: DataType.INT64 }), g.i64("tapwire.v", [V])]);
    const hot = g.op1("OneHot", [
      g.op1("Squeeze", [id, g.i64("tapwire.sq", [1])]),
      g.i64("tapwire.depth", [V]),
      g.init("tapwire.hot", DataType.FLOAT, [2], new Uint8Array(new Float32Array([0, 10]).buffer)),
    ]);
    logits = g.op1("Add", [logits, hot]);
  }
  g.op1("Identity", [logits], {}, Output.LOGITS);
  const sm = g.op1("Softmax", [logits], { axis: 1 });
  g.op1("ReduceMax", [sm], { axes: [1], keepdims: 0 }, Output.CONFIDENCE);
  const model: OnnxNs.IModelProto = {
    irVersion: 8,
    opsetImport: [{ domain: "", version: 17 }],
    graph: {
      name: "toy",
      node: g.nodes,
      initializer: g.initializers,
      input: [
        valueInfo(Input.ROWS, DataType.UINT16, ["batch", 2, TOY.numTaps, TOY.hidden]),
        valueInfo(Input.ROW_COUNT, DataType.INT64, ["batch"]),
        valueInfo(Input.ANCHOR_TOKEN, DataType.INT64, ["batch"]),
        valueInfo(Input.PREV_TOKEN, DataType.INT64, ["batch"]),
        valueInfo(Input.POSITION, DataType.INT64, [1]),
      ],
      output: [
        valueInfo(Output.LOGITS, DataType.FLOAT, ["batch", V]),
        valueInfo(Output.CONFIDENCE, DataType.FLOAT, ["batch"]),
      ],
    },
    metadataProps: Object.entries({
      [Meta.SIGNATURE]: "1",
      [Meta.WINDOW]: String(TOY.window),
      [Meta.NUM_SPEC]: String(TOY.numSpec),
      [Meta.VOCAB_SIZE]: String(V),
      [Meta.NUM_TAPS]: String(TOY.numTaps),
      [Meta.HIDDEN]: String(TOY.hidden),
    }).map(([key, value]) => ({ key, value })),
  };
  o.edit?.(model);
  return onnx.ModelProto.encode(onnx.ModelProto.create(model)).finish();
}

/** Decodes, edits and re-encodes model bytes. */
export function editModel(bytes: Uint8Array, edit: (m: OnnxNs.ModelProto) => void): Uint8Array {
  const m = onnx.ModelProto.decode(bytes);
  edit(m);
  return onnx.ModelProto.encode(m).finish();
}

/** Sets (or with `undefined` removes) a metadata entry. */
export function setMeta(m: OnnxNs.IModelProto, key: string, value: string | undefined): void {
  const props = (m.metadataProps ?? []).filter((p) => p.key !== key);
  if (value !== undefined) props.push({ key, value });
  m.metadataProps = props;
}
