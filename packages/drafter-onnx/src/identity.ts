import type { SafetensorsTensor } from "@tapwire/reference-model";
import { tensorsIdentity } from "@tapwire/reference-model";
import { OnnxDrafterError } from "./errors.js";
import { DataType, DTYPES, type OnnxNs } from "./onnx.js";
import {
  DEFAULT_DRAFTER_DOMAIN,
  DEFAULT_MARKOV_DOMAIN,
  DEFAULT_MARKOV_PREFIX,
  Meta,
  RESERVED_PREFIX,
} from "./signature.js";

/** How a model's identities are computed (from its metadata, docs/onnx-drafter.md). */
export interface IdentityRule {
  /** Domain tag of the drafter identity. */
  drafterDomain: string;
  /** Domain tag of the Markov identity. */
  markovDomain: string;
  /** Initializers whose names start with this make the Markov identity; the rest the drafter's. */
  markovPrefix: string;
}

/** The two identities of a model (CONTRACT 6.1), 32 bytes each. */
export interface ModelIdentities {
  /** SHA-256 of the drafter's initializers (HELLO `drafter_identity`). */
  drafterIdentity: Uint8Array;
  /** SHA-256 of the Markov head's initializers (HELLO `markov_identity`). */
  markovIdentity: Uint8Array;
}

/** The identity rule of a model's metadata (defaults for absent keys). */
export function identityRule(meta: ReadonlyMap<string, string>): IdentityRule {
  return {
    drafterDomain: meta.get(Meta.DRAFTER_DOMAIN) ?? DEFAULT_DRAFTER_DOMAIN,
    markovDomain: meta.get(Meta.MARKOV_DOMAIN) ?? DEFAULT_MARKOV_DOMAIN,
    markovPrefix: meta.get(Meta.MARKOV_PREFIX) ?? DEFAULT_MARKOV_PREFIX,
  };
}

function num(x: number | { toNumber(): number }): number {
  return typeof x === "number" ? x : x.toNumber();
}

/** Raw little-endian bytes of an initializer, from `raw_data` or the typed fields. */
function initializerBytes(t: OnnxNs.ITensorProto, name: string, count: number): Uint8Array {
  const dt = t.dataType ?? 0;
  const info = DTYPES[dt];
  if (info === undefined) {
    throw new OnnxDrafterError("ONNX_DRAFTER_BAD_MODEL", `initializer ${name}: unsupported data type ${dt}`);
  }
  if (t.dataLocation === 1) {
    throw new OnnxDrafterError(
      "ONNX_DRAFTER_BAD_MODEL",
      `initializer ${name}: external data is not supported (save the model with its weights inside)`,
    );
  }
  const bytes = count * info.size;
  if (t.rawData && t.rawData.length > 0) {
    if (t.rawData.length !== bytes) {
      throw new OnnxDrafterError(
        "ONNX_DRAFTER_BAD_MODEL",
        `initializer ${name}: raw_data has ${t.rawData.length} bytes, its shape needs ${bytes}`,
      );
    }
    return t.rawData;
  }
  const out = new Uint8Array(bytes);
  const v = new DataView(out.buffer);
  const need = (arr: ArrayLike<unknown> | null | undefined): void => {
    if ((arr?.length ?? 0) !== count) {
      throw new OnnxDrafterError(
        "ONNX_DRAFTER_BAD_MODEL",
        `initializer ${name}: ${arr?.length ?? 0} values, its shape needs ${count}`,
      );
    }
  };
  switch (dt) {
    case DataType.FLOAT:
      need(t.floatData);
      for (let i = 0; i < t.floatData!.length; i++) {
        const x = t.floatData![i]!;
        v.setFloat32(i * 4, x, true);
      }
      break;
    case DataType.DOUBLE:
      need(t.doubleData);
      for (let i = 0; i < t.doubleData!.length; i++) {
        const x = t.doubleData![i]!;
        v.setFloat64(i * 8, x, true);
      }
      break;
    case DataType.INT64:
      need(t.int64Data);
      for (let i = 0; i < t.int64Data!.length; i++) {
        const x = t.int64Data![i]!;
        v.setBigInt64(i * 8, BigInt(String(x)), true);
      }
      break;
    case DataType.UINT32:
    case DataType.UINT64:
      need(t.uint64Data);
      for (let i = 0; i < count; i++) {
        const x = t.uint64Data![i]!;
        if (info.size === 4) v.setUint32(i * 4, num(x), true);
        else v.setBigUint64(i * 8, BigInt(String(x)), true);
      }
      break;
    default:
      // int32_data carries INT32, INT16, INT8, UINT16, UINT8, BOOL, FLOAT16, BFLOAT16 (as bits).
      need(t.int32Data);
      for (let i = 0; i < count; i++) {
        const x = t.int32Data![i]!;
        if (info.size === 4) v.setInt32(i * 4, x, true);
        else if (info.size === 2) v.setUint16(i * 2, x & 0xffff, true);
        else v.setUint8(i, x & 0xff);
      }
  }
  return out;
}

/** The initializers of a graph as safetensors-style tensors (name, dtype name, shape, raw bytes). */
export function initializerTensors(graph: OnnxNs.IGraphProto): Map<string, SafetensorsTensor> {
  const out = new Map<string, SafetensorsTensor>();
  for (const t of graph.initializer ?? []) {
    const name = t.name ?? "";
    if (name === "") throw new OnnxDrafterError("ONNX_DRAFTER_BAD_MODEL", "an initializer has no name");
    if (out.has(name))
      throw new OnnxDrafterError("ONNX_DRAFTER_BAD_MODEL", `initializer ${name} appears twice`);
    const shape = (t.dims ?? []).map(num);
    let count = 1;
    for (const d of shape) {
      if (!Number.isSafeInteger(d) || d < 0) {
        throw new OnnxDrafterError("ONNX_DRAFTER_BAD_MODEL", `initializer ${name}: invalid dim ${d}`);
      }
      count *= d;
    }
    const dtype = DTYPES[t.dataType ?? 0]?.name ?? "";
    out.set(name, { dtype, shape, data: initializerBytes(t, name, count) });
  }
  return out;
}

/**
 * Identities of a model (CONTRACT 6.1): SHA-256, with `@tapwire/reference-model`'s canonical
 * byte string, over the main graph's initializers whose names do not start with `tapwire.`:
 * those starting with the Markov prefix make the Markov identity, the others the drafter's.
 */
export function modelIdentities(
  tensors: Map<string, SafetensorsTensor>,
  rule: IdentityRule,
): ModelIdentities {
  const counted = (n: string) => !n.startsWith(RESERVED_PREFIX);
  const markov = (n: string) => rule.markovPrefix !== "" && n.startsWith(rule.markovPrefix);
  return {
    drafterIdentity: tensorsIdentity(tensors, rule.drafterDomain, (n) => counted(n) && !markov(n)),
    markovIdentity: tensorsIdentity(tensors, rule.markovDomain, (n) => counted(n) && markov(n)),
  };
}
