/**
 * `exportReferenceHead`: the reference draft head of `@tapwire/reference-model` as an ONNX model
 * of the head signature (docs/onnx-drafter.md), built with onnx-proto.
 *
 * The graph reproduces the JavaScript head's arithmetic exactly: its weights stay float32
 * initializers under their safetensors names (so the identities are the same bytes), are cast
 * to float64 inside the graph (folded once at session creation), every sum runs in float64 and
 * is rounded to float32 wherever the JavaScript head stores into a Float32Array, and the
 * read-out of the last row, which the JavaScript head accumulates in float32 one row value at a
 * time, is unrolled in the same order. The logits are then equal to the head's up to float64
 * reassociation, which changes a float32 result in about one value in 10^8. The confidence's
 * exponential alone runs in float32, corrected for its argument's rounding (see `confidence`).
 */
import { DraftHead, type SafetensorsTensor } from "@tapwire/reference-model";
import { OnnxDrafterError } from "./errors.js";
import { modelIdentities } from "./identity.js";
import { DataType, GraphBuilder, type OnnxNs, onnx, valueInfo } from "./onnx.js";
import { Input, Meta, Output, SIGNATURE_VERSION } from "./signature.js";

/** Domain tags of the reference head's identities (`@tapwire/reference-model` draft.ts). */
const REFERENCE_DRAFTER_DOMAIN = "tapwire/reference-drafter/v1";
const REFERENCE_MARKOV_DOMAIN = "tapwire/reference-markov/v1";
const OPSET = 17;
const IR_VERSION = 8;

/** Options of {@link exportReferenceHead}. */
export interface ExportOptions {
  /** `tapwire.window` (default the head's `config.window`). */
  window?: number;
  /** `tapwire.num_spec` (default the head's `config.numSpec`). */
  numSpec?: number;
}

function bf16Table(): Uint8Array {
  const out = new Uint8Array(65536 * 4);
  const v = new DataView(out.buffer);
  for (let i = 0; i < 65536; i++) v.setUint32(i * 4, i << 16, true);
  return out;
}

function intOpt(name: string, v: number | undefined, dflt: number, lo: number, hi: number): number {
  const x = v ?? dflt;
  if (!Number.isInteger(x) || x < lo || x > hi) {
    throw new OnnxDrafterError("ONNX_DRAFTER_BAD_OPTION", `${name} ${x} outside ${lo}..${hi}`);
  }
  return x;
}

/** The graph being built and the constants every phase uses. */
interface Build {
  g: GraphBuilder;
  /** State size `d` (content `d - 2` plus the two clock values). */
  d: number;
  /** Rows the read-out reads. */
  rd: number;
  table: string;
  /** `1 / confidence.temperature[j]` in float64, per position. */
  invTemp: string;
  /** The clamp of the confidence's exponent argument (-200). */
  expFloor: string;
  zeroI: string;
  oneI: string;
  one: string;
  zeroD: string;
  rowShape: string;
  stateShape: string;
  axis1: string;
  splitState: string;
  split11: string;
  /** Cast to float64, to float32; transpose. */
  D: (x: string) => string;
  F: (x: string) => string;
  T: (x: string) => string;
}

function readHead(head: DraftHead | Uint8Array): DraftHead {
  if (!(head instanceof Uint8Array)) return head;
  try {
    return DraftHead.fromSafetensors(head);
  } catch (cause) {
    throw new OnnxDrafterError(
      "ONNX_DRAFTER_BAD_HEAD",
      `not a reference draft head: ${(cause as Error).message}`,
      {
        cause,
      },
    );
  }
}

/** The values of a float32 tensor. */
function f32Values(t: SafetensorsTensor): Float32Array {
  const b = t.data;
  return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
}

/** The weights as initializers, then the shared constants (in this order: node names follow it). */
function startGraph(w: Map<string, SafetensorsTensor>, d: number): Build {
  const dc = d - 2;
  const rd = w.get("backbone.read_index")!.shape[0]!;
  const g = new GraphBuilder("t/");
  for (const [name, t] of w) {
    g.init(name, t.dtype === "I32" ? DataType.INT32 : DataType.FLOAT, t.shape, t.data);
  }
  return {
    g,
    d,
    rd,
    table: g.init("tapwire.bf16_table", DataType.FLOAT, [65536], bf16Table()),
    invTemp: g.f64(
      "tapwire.inv_temperature",
      Array.from(f32Values(w.get("confidence.temperature")!), (t) => 1 / t),
    ),
    expFloor: g.f64("tapwire.exp_floor", [-200], []),
    zeroI: g.i64("tapwire.zero", [0]),
    oneI: g.i64("tapwire.one_i64", [1]),
    one: g.f64("tapwire.one", [1], []),
    zeroD: g.f64("tapwire.zero_f64", [0], []),
    rowShape: g.i64("tapwire.row_shape", [0, -1]),
    stateShape: g.i64("tapwire.state_shape", [-1, d]),
    axis1: g.i64("tapwire.axis1", [1]),
    splitState: g.i64("tapwire.split_state", [dc, 1, 1]),
    split11: g.i64("tapwire.split_11", [1, 1]),
    D: (x: string) => g.op1("Cast", [x], { to: DataType.DOUBLE }),
    F: (x: string) => g.op1("Cast", [x], { to: DataType.FLOAT }),
    T: (x: string) => g.op1("Transpose", [x], { perm: [1, 0] }),
  };
}

/**
 * The state at this position: position 0 reads it from the last row (the read-out, unrolled in
 * the JavaScript head's order), later positions take the carried state.
 */
function stateAtPosition(b: Build): { is0: string; state0: string } {
  const { g, d, rd, D } = b;
  const is0 = g.op1("Equal", [Input.POSITION, b.zeroI]);
  // The read-out's weight rows, cast and split in the main graph (folded once at load).
  const readRows = g.op("Split", [D("backbone.read")], { axis: 0 }, rd);
  const rb = new GraphBuilder("r/");
  const D2 = (x: string) => rb.op1("Cast", [x], { to: DataType.DOUBLE });
  const F2 = (x: string) => rb.op1("Cast", [x], { to: DataType.FLOAT });
  const flat = rb.op1("Reshape", [Input.ROWS, b.rowShape]);
  const sel = rb.op1("Gather", [flat, "backbone.read_index"], { axis: 1 });
  const x = rb.op1("Gather", [b.table, rb.op1("Cast", [sel], { to: DataType.INT32 })], { axis: 0 });
  const xs = rb.op("Split", [D2(x)], { axis: 1 }, rd); // [B, 1] each
  // f32 accumulation in row order, each product exact in f64 (as the JavaScript head does).
  let s = F2(rb.op1("Add", [b.zeroD, rb.op1("Mul", [xs[0]!, readRows[0]!])])); // +0 + -0 = +0, as in JS
  // Then s = f32(s + x_i * read_i) as one Gemm with K = 1 (C = s, alpha = beta = 1): the product
  // of a bf16 value and a float32 weight is exact in float64, so `c + a * b` is the same single
  // float64 rounding as Mul then Add, in one pass instead of two (and no broadcast Mul, the
  // slowest kernel of this chain: the read-out's cost per entry falls by more than half).
  for (let i = 1; i < rd; i++) s = F2(rb.op1("Gemm", [xs[i]!, readRows[i]!, D2(s)]));
  const readout = rb.op1("Reshape", [s, b.stateShape]);
  const empty = rb.op1("Unsqueeze", [rb.op1("Equal", [Input.ROW_COUNT, b.zeroI]), b.axis1]);
  rb.op1("Where", [empty, "backbone.init_state", readout], {}, "r/state0");
  const thenBranch: OnnxNs.IGraphProto = {
    name: "from_rows",
    node: rb.nodes,
    output: [valueInfo("r/state0", DataType.FLOAT, ["batch", d])],
  };
  const elseBranch: OnnxNs.IGraphProto = {
    name: "carried",
    node: [{ opType: "Identity", input: [Input.STATE], output: ["c/state0"], name: "c/state0" }],
    output: [valueInfo("c/state0", DataType.FLOAT, ["batch", d])],
  };
  const state0 = g.op1("If", [is0], { then_branch: thenBranch, else_branch: elseBranch });
  return { is0, state0 };
}

/**
 * Backbone step j -> j + 1 (rank-r recurrence, clock rotation, anchor or mean embedding); writes
 * `next_state` and returns the pre-activation, the new content and the rotated clock (float32).
 */
function backboneStep(b: Build, is0: string, state0: string) {
  const { g, D, F, T } = b;
  const [content, c0, c1] = g.op("Split", [D(state0), b.splitState], { axis: 1 }, 3) as [
    string,
    string,
    string,
  ];
  const [rot0, rot1] = g.op("Split", [D("backbone.clock_rotation"), b.split11], { axis: 0 }, 2) as [
    string,
    string,
  ];
  const [cc0, cc1] = g.op("Split", [T(D("backbone.clock_coupling")), b.split11], { axis: 0 }, 2) as [
    string,
    string,
  ];
  const n0 = g.op1("Sub", [g.op1("Mul", [rot0, c0]), g.op1("Mul", [rot1, c1])]);
  const n1 = g.op1("Add", [g.op1("Mul", [rot1, c0]), g.op1("Mul", [rot0, c1])]);
  const emb = g.op1("Where", [
    is0,
    g.op1("Gather", [D("backbone.embed"), Input.ANCHOR_TOKEN], { axis: 0 }),
    D("backbone.embed_mean"),
  ]);
  let acc = g.op1("Add", [D("backbone.bias"), g.op1("Mul", [cc0, n0])]);
  acc = g.op1("Add", [acc, g.op1("Mul", [cc1, n1])]);
  acc = g.op1("Add", [acc, emb]);
  const low = D(F(g.op1("MatMul", [content, T(D("backbone.dyn_v"))])));
  acc = g.op1("Add", [acc, g.op1("MatMul", [low, T(D("backbone.dyn_u"))])]);
  const preF = F(acc);
  const newC = F(g.op1("Tanh", [acc]));
  const n0F = F(n0);
  const n1F = F(n1);
  g.op1("Concat", [newC, n0F, n1F], { axis: 1 }, Output.NEXT_STATE);
  return { preF, newC, n0F, n1F };
}

/**
 * The Markov head (positions >= 1: the previous draft's low-rank embedding offset), the LM head
 * (rank 16) with its top-k, and the confidence (calibrated temperature of this position).
 */
function heads(b: Build, is0: string, step: ReturnType<typeof backboneStep>): void {
  const { g, D, F, T } = b;
  const mv = g.op1("Gather", [D("markov.in"), Input.PREV_TOKEN], { axis: 0 });
  const corr = F(g.op1("Tanh", [g.op1("Add", [D(step.preF), g.op1("MatMul", [mv, T(D("markov.out"))])])]));
  const src = g.op1("Concat", [g.op1("Where", [is0, step.newC, corr]), step.n0F, step.n1F], { axis: 1 });

  const hv = D(F(g.op1("MatMul", [D(src), T(D("backbone.lm_m"))])));
  const logits = F(g.op1("Add", [g.op1("MatMul", [hv, T(D("backbone.lm_u"))]), D("backbone.lm_bias")]));
  g.op("TopK", [logits, Input.TOP_K], { axis: -1, largest: 1, sorted: 1 }, [
    Output.TOP_LOGITS,
    Output.TOP_IDS,
  ]);
  confidence(b, logits);
}

/**
 * `confidence = min(1 / z, 1)`, `z = sum_t exp((logit_t - l1) * inv)`: the JavaScript head's
 * confidence head (draft.ts `#readOut`), in float64 except for one step. The maximum `l1` is the
 * first of the sorted top-k (no `ReduceMax` pass); `inv = 1 / temperature[j]` is a float64
 * initializer computed exactly as the JavaScript head does (`1 / temps[j]`), so the argument `x`
 * is the head's, bit for bit (a `Div` by the temperature, which ONNX Runtime makes of a multiply
 * by a reciprocal, would not be). The exponential, the one costly pass over the vocabulary in
 * float64 (a scalar `exp` per logit), runs in float32 on `xf = float32(x)` and is corrected for
 * the rounding of its argument: `exp(x) = exp(xf) * exp(lo)` with `lo = x - xf` exact in
 * float64 and `|lo| <= 2^-24 |x|`, so `exp(lo) = 1 + lo` up to `lo^2 / 2` (below 1e-10 relative
 * for `|x| <= 200`). Each term is then within the float32 `Exp`'s own error of `exp(x)` (ONNX
 * Runtime's is faithful: 7.4e-8 relative at most, measured over [-88, 0]), and a sum of positive
 * terms keeps that relative bound: `z` is within 7.5e-8 of the float64 sum, the confidence (a
 * float32) within one float32 unit of the one from a float64 `Exp` and within the head's own
 * `expNonPositive` error (2e-7) of the head's. `x` is clamped at -200 first: a term below
 * `e^-200` (at most 2048 of them, against `z >= 1`) changes nothing, and the clamp keeps an
 * infinite `x` (a pathological temperature) from giving `0 * inf`. Ids, margins, supports and q
 * do not depend on the confidence.
 */
function confidence(b: Build, logits: string): void {
  const { g, D, F, one } = b;
  const l1 = g.op1("Slice", [Output.TOP_LOGITS, b.zeroI, b.oneI, b.axis1]);
  const inv = g.op1("Gather", [b.invTemp, Input.POSITION], { axis: 0 });
  const x = g.op1("Max", [g.op1("Mul", [g.op1("Sub", [D(logits), D(l1)]), inv]), b.expFloor]);
  const xf = F(x);
  const e = D(g.op1("Exp", [xf]));
  const lo = g.op1("Sub", [x, D(xf)]);
  const z = g.op1("ReduceSum", [g.op1("Add", [e, g.op1("Mul", [e, lo])]), b.axis1], { keepdims: 0 });
  g.op1("Cast", [g.op1("Min", [g.op1("Div", [one, z]), one])], { to: DataType.FLOAT }, Output.CONFIDENCE);
}

/** The model's metadata; its identities are computed from the graph's tensors and must equal the head's. */
function metadata(
  h: DraftHead,
  w: Map<string, SafetensorsTensor>,
  window: number,
  numSpec: number,
): Record<string, string> {
  const ids = modelIdentities(new Map(w), {
    drafterDomain: REFERENCE_DRAFTER_DOMAIN,
    markovDomain: REFERENCE_MARKOV_DOMAIN,
    markovPrefix: "markov.",
  });
  const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");
  if (
    hex(ids.drafterIdentity) !== hex(h.drafterIdentity) ||
    hex(ids.markovIdentity) !== hex(h.markovIdentity)
  ) {
    throw new OnnxDrafterError("ONNX_DRAFTER_BAD_HEAD", "exported identities differ from the head's");
  }
  return {
    [Meta.SIGNATURE]: SIGNATURE_VERSION,
    [Meta.WINDOW]: String(window),
    [Meta.NUM_SPEC]: String(numSpec),
    [Meta.VOCAB_SIZE]: String(h.vocabSize),
    [Meta.NUM_TAPS]: String(h.numTaps),
    [Meta.HIDDEN]: String(h.hidden),
    [Meta.DRAFTER_DOMAIN]: REFERENCE_DRAFTER_DOMAIN,
    [Meta.MARKOV_DOMAIN]: REFERENCE_MARKOV_DOMAIN,
    [Meta.MARKOV_PREFIX]: "markov.",
    [Meta.DRAFTER_IDENTITY]: hex(ids.drafterIdentity),
    [Meta.MARKOV_IDENTITY]: hex(ids.markovIdentity),
  };
}

/**
 * Exports a reference head (a `DraftHead`, or its safetensors bytes) as ONNX model bytes with
 * the head signature; its identities equal the head's (checked before returning).
 * @throws OnnxDrafterError `ONNX_DRAFTER_BAD_HEAD` for unreadable safetensors,
 *   `ONNX_DRAFTER_BAD_OPTION` for a bad window or num_spec.
 */
export function exportReferenceHead(head: DraftHead | Uint8Array, options: ExportOptions = {}): Uint8Array {
  const h = readHead(head);
  const window = intOpt("window", options.window, h.config.window, 1, 4096);
  const numSpec = intOpt("numSpec", options.numSpec, h.config.numSpec, 1, 32);
  const w = h.weights as Map<string, SafetensorsTensor>;
  const d = h.stateDim;
  const b = startGraph(w, d);
  const { is0, state0 } = stateAtPosition(b);
  heads(b, is0, backboneStep(b, is0, state0));
  const meta = metadata(h, w, window, numSpec);
  const g = b.g;
  const graph: OnnxNs.IGraphProto = {
    name: "tapwire_reference_head",
    node: g.nodes,
    initializer: g.initializers,
    input: [
      valueInfo(Input.ROWS, DataType.UINT16, ["batch", 1, h.numTaps, h.hidden]),
      valueInfo(Input.ROW_COUNT, DataType.INT64, ["batch"]),
      valueInfo(Input.ANCHOR_TOKEN, DataType.INT64, ["batch"]),
      valueInfo(Input.PREV_TOKEN, DataType.INT64, ["batch"]),
      valueInfo(Input.POSITION, DataType.INT64, [1]),
      valueInfo(Input.STATE, DataType.FLOAT, ["batch", d]),
      valueInfo(Input.TOP_K, DataType.INT64, [1]),
    ],
    output: [
      valueInfo(Output.TOP_LOGITS, DataType.FLOAT, ["batch", "k"]),
      valueInfo(Output.TOP_IDS, DataType.INT64, ["batch", "k"]),
      valueInfo(Output.CONFIDENCE, DataType.FLOAT, ["batch"]),
      valueInfo(Output.NEXT_STATE, DataType.FLOAT, ["batch", d]),
    ],
  };
  const model: OnnxNs.IModelProto = {
    irVersion: IR_VERSION,
    opsetImport: [{ domain: "", version: OPSET }],
    producerName: "tapwire-onnx-export",
    producerVersion: SIGNATURE_VERSION,
    docString: "tapwire reference draft head (DSpark-style: backbone + Markov head + confidence)",
    graph,
    metadataProps: Object.entries(meta).map(([key, value]) => ({ key, value })),
  };
  return onnx.ModelProto.encode(onnx.ModelProto.create(model)).finish();
}
