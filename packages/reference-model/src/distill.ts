// DraftHead.distill's tensors, phase by phase (read-out, recurrence, LM head, token statistics,
// Markov head): one seeded noise stream drawn in this order, so the result is deterministic in
// (target, config).
import { DRAFT_NOISE_SHAPE, type DraftConfig, MAX_DRAFT_POSITIONS } from "./draft-config.js";
import { f32Tensor, i32Tensor, noisy } from "./draft-tensors.js";
import { choleskySolve, symmetricEigen } from "./linalg.js";
import { mix32, Xoshiro128 } from "./prng.js";
import type { SafetensorsTensor } from "./safetensors.js";
import { TARGET_DYNAMICS, type TargetModel, type TargetWeights } from "./target.js";

const L = TARGET_DYNAMICS.readoutRank;

/** What every phase reads and adds to. */
interface Distillation {
  readonly target: TargetModel;
  readonly config: Required<DraftConfig>;
  readonly w: TargetWeights;
  readonly rng: Xoshiro128;
  readonly noise: number;
  readonly v: number;
  readonly d: number;
  readonly dc: number;
  readonly rowElems: number;
  readonly tensors: Map<string, SafetensorsTensor>;
}

/** The tensors of a head distilled from `target` (confidence temperatures all 1: not calibrated). */
export function distilTensors(
  target: TargetModel,
  config: Required<DraftConfig>,
): Map<string, SafetensorsTensor> {
  const { vocabSize: v, stateDim: d, numTaps, hidden } = target.config;
  const c: Distillation = {
    target,
    config,
    w: target.weights,
    rng: new Xoshiro128(mix32(config.seed ^ 0x5eed0d15)),
    noise: config.noise,
    v,
    d,
    dc: d - 2,
    rowElems: numTaps * hidden,
    tensors: new Map<string, SafetensorsTensor>(),
  };
  readOut(c);
  recurrence(c);
  const embed = lmHead(c);
  const mean = tokenStatistics(c);
  const ns = DRAFT_NOISE_SHAPE;
  c.tensors.set("backbone.embed_mean", f32Tensor([c.dc], noisy(c.rng, mean, c.noise * ns.bias)));
  markovHead(c, embed, mean);
  c.tensors.set(
    "confidence.temperature",
    f32Tensor([MAX_DRAFT_POSITIONS], new Float32Array(MAX_DRAFT_POSITIONS).fill(1)),
  );
  return c.tensors;
}

function readOut(c: Distillation): void {
  const { config, w, rng, noise, d, rowElems, tensors } = c;
  const ns = DRAFT_NOISE_SHAPE;
  // Read-out: least squares on the chosen row coordinates, pinv = (PᵀP + λI)⁻¹ Pᵀ.
  const rd = config.readDims === 0 ? rowElems : config.readDims;
  const readIndex = new Int32Array(rd);
  for (let i = 0; i < rd; i++) readIndex[i] = rd === rowElems ? i : Math.floor(((i + 0.5) * rowElems) / rd);
  const fan = w.p.length / rowElems;
  const pt = new Float64Array(d * rd);
  for (let i = 0; i < rd; i++) {
    const o = readIndex[i]! * fan;
    for (let f = 0; f < fan; f++) pt[w.pIdx[o + f]! * rd + i] = w.p[o + f]!;
  }
  const ptp = new Float64Array(d * d);
  for (let a = 0; a < d; a++)
    for (let b = 0; b < d; b++) {
      let acc = a === b ? 1e-6 : 0;
      for (let i = 0; i < rd; i++) acc += pt[a * rd + i]! * pt[b * rd + i]!;
      ptp[a * d + b] = acc;
    }
  const pinv = choleskySolve(ptp, d, pt, rd); // d x rd
  const readT = new Float64Array(rd * d);
  for (let i = 0; i < rd; i++) for (let a = 0; a < d; a++) readT[i * d + a] = pinv[a * rd + i]!;
  tensors.set("backbone.read_index", i32Tensor([rd], readIndex));
  tensors.set("backbone.read", f32Tensor([rd, d], noisy(rng, readT, noise * ns.read)));
  tensors.set("backbone.init_state", f32Tensor([d], Float32Array.from(w.s0)));
}

function recurrence(c: Distillation): void {
  const { config, w, rng, noise, dc, tensors } = c;
  const ns = DRAFT_NOISE_SHAPE;
  // Rank-r recurrence: A ≈ (A V_r) V_rᵀ with V_r the top right singular vectors.
  const ata = new Float64Array(dc * dc);
  for (let i = 0; i < dc; i++)
    for (let a = 0; a < dc; a++) {
      const x = w.a[i * dc + a]!;
      for (let b = 0; b < dc; b++) ata[a * dc + b] = ata[a * dc + b]! + x * w.a[i * dc + b]!;
    }
  const { vectors } = symmetricEigen(ata, dc);
  const r = config.rank;
  const dynU = new Float64Array(dc * r);
  const dynV = new Float64Array(r * dc);
  for (let k = 0; k < r; k++) for (let b = 0; b < dc; b++) dynV[k * dc + b] = vectors[b * dc + k]!;
  for (let i = 0; i < dc; i++)
    for (let k = 0; k < r; k++) {
      let acc = 0;
      for (let b = 0; b < dc; b++) acc += w.a[i * dc + b]! * dynV[k * dc + b]!;
      dynU[i * r + k] = acc;
    }
  tensors.set("backbone.dyn_u", f32Tensor([dc, r], noisy(rng, dynU, noise * ns.dynamics)));
  tensors.set("backbone.dyn_v", f32Tensor([r, dc], Float32Array.from(dynV)));
  tensors.set("backbone.clock_coupling", f32Tensor([dc, 2], noisy(rng, w.c, noise * ns.clock)));
  tensors.set("backbone.clock_rotation", f32Tensor([2], Float32Array.from(w.rot)));
  tensors.set("backbone.bias", f32Tensor([dc], noisy(rng, w.b, noise * ns.bias)));
}

/** The embedding and LM head tensors; returns the (noisy) embedding the Markov head starts from. */
function lmHead(c: Distillation): Float32Array {
  const { w, rng, noise, v, d, dc, tensors } = c;
  const ns = DRAFT_NOISE_SHAPE;
  const embed = noisy(rng, w.e, noise * ns.embed);
  tensors.set("backbone.embed", f32Tensor([v, dc], embed));
  tensors.set("backbone.lm_u", f32Tensor([v, L], noisy(rng, w.u, noise * ns.lmHead)));
  const lmM = noisy(rng, w.m, noise * ns.lmHead);
  tensors.set("backbone.lm_m", f32Tensor([L, d], lmM));
  tensors.set("backbone.lm_bias", f32Tensor([v], noisy(rng, w.z, noise * ns.lmHead)));
  return embed;
}

/** The mean consumed embedding over greedy rollouts of the target. */
function tokenStatistics(c: Distillation): Float64Array {
  const { target, config, w, v, dc } = c;
  // Token statistics from greedy rollouts of the target: the mean consumed embedding and the
  // mean tanh derivative, which linearise the effect of the previous token for the Markov head.
  const mean = new Float64Array(dc);
  const gain = new Float64Array(dc);
  const logits = new Float32Array(v);
  const simRng = new Xoshiro128(mix32(config.seed ^ 0x0a11ce));
  let count = 0;
  for (let seq = 0; seq < 16; seq++) {
    const st = target.initialState([simRng.nextInt(v), simRng.nextInt(v), simRng.nextInt(v)]);
    let tok = simRng.nextInt(v);
    for (let i = 0; i < 96; i++) {
      target.forward(st, tok, logits, null, st);
      for (let a = 0; a < dc; a++) {
        mean[a] = mean[a]! + w.e[tok * dc + a]!;
        gain[a] = gain[a]! + 1 - st.vector[a]! * st.vector[a]!;
      }
      count++;
      tok = target.argmax(logits);
    }
  }
  for (let a = 0; a < dc; a++) {
    mean[a] = mean[a]! / count;
    gain[a] = gain[a]! / count;
  }
  return mean;
}

function markovHead(c: Distillation, embed: Float32Array, mean: Float64Array): void {
  const { config, rng, noise, v, dc, tensors } = c;
  const ns = DRAFT_NOISE_SHAPE;
  // Markov head: the offset of each token's embedding from the mean, truncated to its top
  // principal directions: markov.out · markov.in[t] ≈ E[t] - mean.
  const rm = config.markovRank;
  const delta = new Float64Array(v * dc);
  const cov = new Float64Array(dc * dc);
  for (let t = 0; t < v; t++) {
    for (let a = 0; a < dc; a++) delta[t * dc + a] = embed[t * dc + a]! - mean[a]!;
    for (let a = 0; a < dc; a++) {
      const x = delta[t * dc + a]!;
      for (let b = 0; b < dc; b++) cov[a * dc + b] = cov[a * dc + b]! + x * delta[t * dc + b]!;
    }
  }
  const q = symmetricEigen(cov, dc).vectors;
  const mIn = new Float64Array(v * rm);
  const mOut = new Float64Array(dc * rm);
  for (let a = 0; a < dc; a++) for (let k = 0; k < rm; k++) mOut[a * rm + k] = q[a * dc + k]!;
  for (let t = 0; t < v; t++) {
    for (let k = 0; k < rm; k++) {
      let acc = 0;
      for (let a = 0; a < dc; a++) acc += q[a * dc + k]! * delta[t * dc + a]!;
      mIn[t * rm + k] = acc;
    }
  }
  tensors.set("markov.in", f32Tensor([v, rm], noisy(rng, mIn, noise * ns.markov)));
  tensors.set("markov.out", f32Tensor([dc, rm], noisy(rng, mOut, noise * ns.markov)));
}
