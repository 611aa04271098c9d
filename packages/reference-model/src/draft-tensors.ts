// The draft head's tensors: building, reading and checking them (RM_BAD_WEIGHTS).
import { ReferenceModelError } from "./errors.js";
import { stddev } from "./linalg.js";
import type { Xoshiro128 } from "./prng.js";
import type { SafetensorsTensor } from "./safetensors.js";

/** The target geometry a head drafts for (from the target, or a head file's metadata). */
export interface Geometry {
  vocabSize: number;
  stateDim: number;
  numTaps: number;
  hidden: number;
  targetSeed: number;
}

export function f32Tensor(shape: number[], values: Float32Array): SafetensorsTensor {
  const data = new Uint8Array(values.length * 4);
  const view = new DataView(data.buffer);
  for (let i = 0; i < values.length; i++) view.setFloat32(i * 4, values[i]!, true);
  return { dtype: "F32", shape, data };
}

export function i32Tensor(shape: number[], values: Int32Array): SafetensorsTensor {
  const data = new Uint8Array(values.length * 4);
  const view = new DataView(data.buffer);
  for (let i = 0; i < values.length; i++) view.setInt32(i * 4, values[i]!, true);
  return { dtype: "I32", shape, data };
}

export function getTensor(
  tensors: Map<string, SafetensorsTensor>,
  name: string,
  dtype: string,
  shape: number[],
): DataView {
  const t = tensors.get(name);
  if (t === undefined) throw new ReferenceModelError("RM_BAD_WEIGHTS", `draft head: missing tensor ${name}`);
  if (t.dtype !== dtype || t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
    throw new ReferenceModelError(
      "RM_BAD_WEIGHTS",
      `draft head: tensor ${name} is ${t.dtype}[${t.shape.join(", ")}], expected ${dtype}[${shape.join(", ")}]`,
    );
  }
  return new DataView(t.data.buffer, t.data.byteOffset, t.data.byteLength);
}

export function readF32(
  tensors: Map<string, SafetensorsTensor>,
  name: string,
  shape: number[],
): Float32Array {
  const view = getTensor(tensors, name, "F32", shape);
  const out = new Float32Array(view.byteLength / 4);
  for (let i = 0; i < out.length; i++) {
    const v = view.getFloat32(i * 4, true);
    if (!Number.isFinite(v))
      throw new ReferenceModelError("RM_BAD_WEIGHTS", `draft head: ${name}[${i}] is not finite`);
    out[i] = v;
  }
  return out;
}

export function noisy(rng: Xoshiro128, x: Float32Array | Float64Array, rel: number): Float32Array {
  const out = Float32Array.from(x);
  if (rel <= 0) return out;
  const s = stddev(x) * rel;
  for (let i = 0; i < out.length; i++) out[i] = out[i]! + rng.nextGaussian() * s;
  return out;
}

/** Every tensor a head file holds; any other name is refused. */
export const KNOWN_TENSORS: ReadonlySet<string> = new Set([
  "backbone.read_index",
  "backbone.read",
  "backbone.init_state",
  "backbone.dyn_u",
  "backbone.dyn_v",
  "backbone.clock_coupling",
  "backbone.clock_rotation",
  "backbone.bias",
  "backbone.embed",
  "backbone.embed_mean",
  "backbone.lm_u",
  "backbone.lm_m",
  "backbone.lm_bias",
  "confidence.temperature",
  "markov.in",
  "markov.out",
]);
