/**
 * Reading a model file against the head signature (docs/onnx-drafter.md): metadata, inputs,
 * outputs, identities. Everything here runs before ONNX Runtime sees the model, so a model
 * that does not fit is refused with a message naming the first problem.
 */
import { OnnxDrafterError } from "./errors.js";
import { identityRule, initializerTensors, modelIdentities } from "./identity.js";
import { DataType, type OnnxNs, onnx } from "./onnx.js";
import { Input, Meta, Output, SIGNATURE_VERSION, TOP32 } from "./signature.js";

/** What a model declares, checked against the signature. */
export interface ModelInfo {
  /** `tapwire.window`. */
  window: number;
  /** `tapwire.num_spec`. */
  numSpec: number;
  /** `tapwire.vocab_size`. */
  vocabSize: number;
  /** `tapwire.num_taps`. */
  numTaps: number;
  /** `tapwire.hidden`. */
  hidden: number;
  /** Rows the model reads per entry (the static second dim of `rows`, at most `window`). */
  windowRows: number;
  /** Size of `state` / `next_state`, or 0 for a model without carried state. */
  stateSize: number;
  /** True when the model has the `top_k` input. */
  hasTopKInput: boolean;
  /** `"top"`: top_logits + top_ids; `"logits"`: full logits. */
  output: "top" | "logits";
  /** Static K of the top outputs when there is no `top_k` input (0 otherwise). */
  fixedK: number;
  /** True when the model can return 32 candidates per position (CONTRACT 8 TOP32). */
  top32: boolean;
  /** SHA-256 of the drafter's initializers (CONTRACT 6.1). */
  drafterIdentity: Uint8Array;
  /** SHA-256 of the Markov head's initializers. */
  markovIdentity: Uint8Array;
  /** All metadata entries. */
  metadata: Map<string, string>;
}

const ELEM_NAMES: Readonly<Record<number, string>> = {
  [DataType.FLOAT]: "float32",
  [DataType.UINT16]: "uint16",
  [DataType.INT64]: "int64",
  [DataType.INT32]: "int32",
  [DataType.DOUBLE]: "float64",
  [DataType.UINT8]: "uint8",
  [DataType.BFLOAT16]: "bfloat16",
  [DataType.FLOAT16]: "float16",
};

function sig(message: string): never {
  throw new OnnxDrafterError("ONNX_DRAFTER_BAD_SIGNATURE", message);
}

type Dim = number | string;

function tensorType(v: OnnxNs.IValueInfoProto, what: string): { elem: number; dims: Dim[] } {
  const tt = v.type?.tensorType;
  if (!tt) sig(`${what} ${v.name} is not a tensor`);
  const dims: Dim[] = (tt.shape?.dim ?? []).map((d) =>
    d.dimParam ? d.dimParam : d.dimValue !== undefined && d.dimValue !== null ? Number(d.dimValue) : "?",
  );
  if (!tt.shape) sig(`${what} ${v.name} has no shape`);
  return { elem: tt.elemType ?? 0, dims };
}

function expect(
  what: string,
  name: string,
  t: { elem: number; dims: Dim[] },
  elem: number,
  dims: (Dim | "batch" | "static" | "any")[],
): void {
  if (t.elem !== elem) {
    sig(
      `${what} ${name} is ${ELEM_NAMES[t.elem] ?? `type ${t.elem}`}, the signature needs ${ELEM_NAMES[elem]}`,
    );
  }
  if (t.dims.length !== dims.length) {
    sig(
      `${what} ${name} has rank ${t.dims.length} [${t.dims.join(", ")}], the signature needs rank ${dims.length}`,
    );
  }
  dims.forEach((want, i) => {
    const got = t.dims[i]!;
    if (want === "any") return;
    if (want === "batch") {
      if (typeof got === "number" && got !== -1)
        sig(`${what} ${name} dim ${i} must be the dynamic batch axis, is ${got}`);
      return;
    }
    if (want === "static") {
      if (typeof got !== "number" || got < 1) sig(`${what} ${name} dim ${i} must be a fixed size, is ${got}`);
      return;
    }
    if (got !== want) sig(`${what} ${name} dim ${i} is ${got}, expected ${want}`);
  });
}

function metaInt(meta: Map<string, string>, key: string, lo: number, hi: number): number {
  const s = meta.get(key);
  if (s === undefined) sig(`metadata ${key} is missing`);
  if (!/^\d+$/.test(s)) sig(`metadata ${key} = ${JSON.stringify(s)} is not a non-negative integer`);
  const n = Number(s);
  if (n < lo || n > hi) sig(`metadata ${key} = ${n} outside ${lo}..${hi}`);
  return n;
}

/** Decodes ONNX model bytes (no ONNX Runtime involved). */
export function decodeModel(bytes: Uint8Array): OnnxNs.ModelProto {
  let m: OnnxNs.ModelProto;
  try {
    m = onnx.ModelProto.decode(bytes);
  } catch (cause) {
    throw new OnnxDrafterError("ONNX_DRAFTER_BAD_MODEL", `not an ONNX model: ${(cause as Error).message}`, {
      cause,
    });
  }
  if (!m.graph) throw new OnnxDrafterError("ONNX_DRAFTER_BAD_MODEL", "not an ONNX model: no graph");
  return m;
}

type ValueInfos = Map<string, OnnxNs.IValueInfoProto>;

/** The signature's inputs (and the state pair): names, types and shapes against the geometry. */
function checkInputs(
  inputs: ValueInfos,
  outputs: ValueInfos,
  geo: { window: number; numTaps: number; hidden: number },
): { windowRows: number; hasTopKInput: boolean; stateSize: number } {
  const { window, numTaps, hidden } = geo;
  const known = new Set<string>(Object.values(Input));
  for (const name of inputs.keys())
    if (!known.has(name))
      sig(`unknown input ${JSON.stringify(name)} (the signature's inputs: ${[...known].join(", ")})`);
  for (const name of [Input.ROWS, Input.ROW_COUNT, Input.ANCHOR_TOKEN, Input.PREV_TOKEN, Input.POSITION]) {
    if (!inputs.has(name)) sig(`input ${name} is missing`);
  }
  const inT = (n: string) => tensorType(inputs.get(n)!, "input");
  const rows = inT(Input.ROWS);
  expect("input", Input.ROWS, rows, DataType.UINT16, ["batch", "static", numTaps, hidden]);
  const windowRows = rows.dims[1] as number;
  if (windowRows > window) sig(`input rows reads ${windowRows} rows, more than tapwire.window ${window}`);
  for (const n of [Input.ROW_COUNT, Input.ANCHOR_TOKEN, Input.PREV_TOKEN])
    expect("input", n, inT(n), DataType.INT64, ["batch"]);
  expect("input", Input.POSITION, inT(Input.POSITION), DataType.INT64, [1]);
  const hasTopKInput = inputs.has(Input.TOP_K);
  if (hasTopKInput) expect("input", Input.TOP_K, inT(Input.TOP_K), DataType.INT64, [1]);
  let stateSize = 0;
  if (inputs.has(Input.STATE)) {
    const st = inT(Input.STATE);
    expect("input", Input.STATE, st, DataType.FLOAT, ["batch", "static"]);
    stateSize = st.dims[1] as number;
    if (!outputs.has(Output.NEXT_STATE)) sig(`input state needs the output ${Output.NEXT_STATE}`);
    expect(
      "output",
      Output.NEXT_STATE,
      tensorType(outputs.get(Output.NEXT_STATE)!, "output"),
      DataType.FLOAT,
      ["batch", stateSize],
    );
  } else if (outputs.has(Output.NEXT_STATE)) {
    sig(`output ${Output.NEXT_STATE} needs the input ${Input.STATE}`);
  }
  return { windowRows, hasTopKInput, stateSize };
}

/** Which outputs the model drafts from: its top logits and ids (fixed K or the `top_k` input), or full logits. */
function readOutputKind(
  outputs: ValueInfos,
  hasTopKInput: boolean,
  vocabSize: number,
): { output: "top" | "logits"; fixedK: number; top32: boolean } {
  let output: "top" | "logits";
  let fixedK = 0;
  let top32: boolean;
  if (outputs.has(Output.TOP_LOGITS) || outputs.has(Output.TOP_IDS)) {
    if (!outputs.has(Output.TOP_LOGITS) || !outputs.has(Output.TOP_IDS)) {
      sig(`outputs ${Output.TOP_LOGITS} and ${Output.TOP_IDS} go together`);
    }
    output = "top";
    const tl = tensorType(outputs.get(Output.TOP_LOGITS)!, "output");
    const ti = tensorType(outputs.get(Output.TOP_IDS)!, "output");
    expect("output", Output.TOP_LOGITS, tl, DataType.FLOAT, ["batch", "any"]);
    expect("output", Output.TOP_IDS, ti, DataType.INT64, ["batch", "any"]);
    if (hasTopKInput) {
      top32 = vocabSize >= TOP32;
    } else {
      if (typeof tl.dims[1] !== "number")
        sig(`output ${Output.TOP_LOGITS} needs a fixed K (or the input ${Input.TOP_K})`);
      fixedK = tl.dims[1];
      if (fixedK < 2) sig(`output ${Output.TOP_LOGITS} has K ${fixedK}; margins need at least 2`);
      if (fixedK > vocabSize)
        sig(`output ${Output.TOP_LOGITS} has K ${fixedK} above the vocabulary ${vocabSize}`);
      top32 = fixedK >= TOP32;
    }
  } else if (outputs.has(Output.LOGITS)) {
    output = "logits";
    expect("output", Output.LOGITS, tensorType(outputs.get(Output.LOGITS)!, "output"), DataType.FLOAT, [
      "batch",
      vocabSize,
    ]);
    top32 = vocabSize >= TOP32;
  } else {
    sig(`outputs: need ${Output.LOGITS}, or ${Output.TOP_LOGITS} and ${Output.TOP_IDS}`);
  }
  return { output, fixedK, top32 };
}

/** The identities of the initializers; recorded identities in the metadata must equal them. */
function checkedIdentities(graph: OnnxNs.IGraphProto, meta: Map<string, string>) {
  const ids = modelIdentities(initializerTensors(graph), identityRule(meta));
  for (const [key, got, what] of [
    [Meta.DRAFTER_IDENTITY, ids.drafterIdentity, "drafter"],
    [Meta.MARKOV_IDENTITY, ids.markovIdentity, "Markov"],
  ] as const) {
    const rec = meta.get(key);
    if (rec === undefined) continue;
    const hex = Buffer.from(got).toString("hex");
    if (rec.toLowerCase() !== hex) {
      throw new OnnxDrafterError(
        "ONNX_DRAFTER_IDENTITY_MISMATCH",
        `metadata ${key} is ${rec}, but the ${what} initializers hash to ${hex}`,
      );
    }
  }
  return ids;
}

/**
 * Checks a decoded model against the head signature and computes its identities.
 * @throws OnnxDrafterError `ONNX_DRAFTER_BAD_SIGNATURE` naming the first mismatch,
 *   `ONNX_DRAFTER_IDENTITY_MISMATCH` when recorded identities differ from the weights',
 *   `ONNX_DRAFTER_BAD_MODEL` for unreadable initializers.
 */
export function inspectModel(m: OnnxNs.ModelProto): ModelInfo {
  const meta = new Map<string, string>();
  for (const p of m.metadataProps ?? []) meta.set(p.key ?? "", p.value ?? "");
  const version = meta.get(Meta.SIGNATURE);
  if (version !== SIGNATURE_VERSION) {
    sig(
      `metadata ${Meta.SIGNATURE} is ${version === undefined ? "missing" : JSON.stringify(version)}, expected "${SIGNATURE_VERSION}"`,
    );
  }
  const window = metaInt(meta, Meta.WINDOW, 1, 4096);
  const numSpec = metaInt(meta, Meta.NUM_SPEC, 1, 32);
  const vocabSize = metaInt(meta, Meta.VOCAB_SIZE, 2, 0x7fffffff);
  const numTaps = metaInt(meta, Meta.NUM_TAPS, 1, 0xffff);
  const hidden = metaInt(meta, Meta.HIDDEN, 1, 0x7fffffff);
  if (numTaps * hidden * 2 > 0xffffffff) sig(`num_taps ${numTaps} x hidden ${hidden} gives no u32 row_bytes`);

  const graph = m.graph!;
  const inits = new Set((graph.initializer ?? []).map((t) => t.name ?? ""));
  const inputs = new Map<string, OnnxNs.IValueInfoProto>();
  for (const v of graph.input ?? []) if (!inits.has(v.name ?? "")) inputs.set(v.name ?? "", v);
  const outputs = new Map<string, OnnxNs.IValueInfoProto>();
  for (const v of graph.output ?? []) outputs.set(v.name ?? "", v);
  const { windowRows, hasTopKInput, stateSize } = checkInputs(inputs, outputs, { window, numTaps, hidden });
  if (!outputs.has(Output.CONFIDENCE)) sig(`output ${Output.CONFIDENCE} is missing`);
  expect("output", Output.CONFIDENCE, tensorType(outputs.get(Output.CONFIDENCE)!, "output"), DataType.FLOAT, [
    "batch",
  ]);
  const { output, fixedK, top32 } = readOutputKind(outputs, hasTopKInput, vocabSize);

  const ids = checkedIdentities(graph, meta);
  return {
    window,
    numSpec,
    vocabSize,
    numTaps,
    hidden,
    windowRows,
    stateSize,
    hasTopKInput,
    output,
    fixedK,
    top32,
    drafterIdentity: ids.drafterIdentity,
    markovIdentity: ids.markovIdentity,
    metadata: meta,
  };
}
