/**
 * The slice of `onnx-proto` this package uses (a CommonJS protobufjs module), and a small
 * graph builder for the exporter.
 */
import { createRequire } from "node:module";
import type { onnx as OnnxNs } from "onnx-proto";

const require = createRequire(import.meta.url);
/** The protobufjs `onnx` namespace (ModelProto, GraphProto, TensorProto, ...). */
export const onnx: typeof OnnxNs = (require("onnx-proto") as { onnx: typeof OnnxNs }).onnx;
export type { OnnxNs };

/** ONNX `TensorProto.DataType` values used here. */
export const DataType = {
  FLOAT: 1,
  UINT8: 2,
  INT8: 3,
  UINT16: 4,
  INT16: 5,
  INT32: 6,
  INT64: 7,
  STRING: 8,
  BOOL: 9,
  FLOAT16: 10,
  DOUBLE: 11,
  UINT32: 12,
  UINT64: 13,
  BFLOAT16: 16,
} as const;

/** ONNX data type -> safetensors dtype name (used for identities, CONTRACT 6.1) and byte size. */
export const DTYPES: Readonly<Record<number, { name: string; size: number }>> = {
  [DataType.FLOAT]: { name: "F32", size: 4 },
  [DataType.UINT8]: { name: "U8", size: 1 },
  [DataType.INT8]: { name: "I8", size: 1 },
  [DataType.UINT16]: { name: "U16", size: 2 },
  [DataType.INT16]: { name: "I16", size: 2 },
  [DataType.INT32]: { name: "I32", size: 4 },
  [DataType.INT64]: { name: "I64", size: 8 },
  [DataType.BOOL]: { name: "BOOL", size: 1 },
  [DataType.FLOAT16]: { name: "F16", size: 2 },
  [DataType.DOUBLE]: { name: "F64", size: 8 },
  [DataType.UINT32]: { name: "U32", size: 4 },
  [DataType.UINT64]: { name: "U64", size: 8 },
  [DataType.BFLOAT16]: { name: "BF16", size: 2 },
};

/** Attribute value accepted by {@link GraphBuilder.op}. */
export type Attr = number | number[] | OnnxNs.IGraphProto | { f: number };

/** Builds one (sub)graph: nodes with generated value names, initializers. */
export class GraphBuilder {
  readonly nodes: OnnxNs.INodeProto[] = [];
  readonly initializers: OnnxNs.ITensorProto[] = [];
  private n = 0;

  constructor(private readonly prefix: string) {}

  /** Adds a node and returns its output names (`outputs` of them, or the given names). */
  op(
    type: string,
    inputs: string[],
    attrs: Record<string, Attr> = {},
    outputs: number | string[] = 1,
  ): string[] {
    const outs =
      typeof outputs === "number"
        ? Array.from({ length: outputs }, () => `${this.prefix}${this.n++}`)
        : outputs;
    const attribute: OnnxNs.IAttributeProto[] = [];
    for (const [name, v] of Object.entries(attrs)) {
      if (typeof v === "number") attribute.push({ name, type: 2, i: v });
      else if (Array.isArray(v)) attribute.push({ name, type: 7, ints: v });
      else if ("f" in v && typeof v.f === "number") attribute.push({ name, type: 1, f: v.f });
      else attribute.push({ name, type: 5, g: v as OnnxNs.IGraphProto });
    }
    this.nodes.push({ opType: type, input: inputs, output: outs, attribute, name: outs[0]! });
    return outs;
  }

  /** One-output {@link op}. */
  op1(type: string, inputs: string[], attrs: Record<string, Attr> = {}, output?: string): string {
    return this.op(type, inputs, attrs, output === undefined ? 1 : [output])[0]!;
  }

  /** Adds an initializer with raw little-endian bytes. */
  init(name: string, dataType: number, dims: number[], raw: Uint8Array): string {
    this.initializers.push({ name, dataType, dims, rawData: raw });
    return name;
  }

  /** An int64 constant initializer. */
  i64(name: string, values: number[]): string {
    const b = new Uint8Array(values.length * 8);
    const v = new DataView(b.buffer);
    for (let i = 0; i < values.length; i++) {
      const x = values[i]!;
      v.setBigInt64(i * 8, BigInt(x), true);
    }
    return this.init(name, DataType.INT64, [values.length], b);
  }

  /** A float64 constant initializer. */
  f64(name: string, values: number[], dims: number[] = [values.length]): string {
    const b = new Uint8Array(values.length * 8);
    const v = new DataView(b.buffer);
    for (let i = 0; i < values.length; i++) {
      const x = values[i]!;
      v.setFloat64(i * 8, x, true);
    }
    return this.init(name, DataType.DOUBLE, dims, b);
  }
}

/** A `ValueInfoProto` of a tensor; string dims are symbolic (dim_param). */
export function valueInfo(name: string, elemType: number, dims: (number | string)[]): OnnxNs.IValueInfoProto {
  return {
    name,
    type: {
      tensorType: {
        elemType,
        shape: { dim: dims.map((d) => (typeof d === "string" ? { dimParam: d } : { dimValue: d })) },
      },
    },
  };
}
