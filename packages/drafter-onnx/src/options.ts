/**
 * The options of {@link OnnxDrafter}: execution provider, threads, graph optimisation, and their
 * validation (naming the first bad option).
 */
import { OnnxDrafterError } from "./errors.js";

/** Execution providers {@link OnnxDrafter} can run on. */
export const ExecutionProvider = { CPU: "cpu", CUDA: "cuda" } as const;
/** One of {@link ExecutionProvider}. */
export type ExecutionProvider = (typeof ExecutionProvider)[keyof typeof ExecutionProvider];

/** ONNX Runtime graph optimisation levels. */
export const GraphOptimization = {
  DISABLED: "disabled",
  BASIC: "basic",
  EXTENDED: "extended",
  ALL: "all",
} as const;
/** One of {@link GraphOptimization}. */
export type GraphOptimization = (typeof GraphOptimization)[keyof typeof GraphOptimization];

/** Options of {@link OnnxDrafter.create}. */
export interface OnnxDrafterOptions {
  /** Window `W` announced in the HelloReply (1..4096, at least the rows the model reads; default `tapwire.window`). */
  window?: number;
  /** `N` (1..32, at most `tapwire.num_spec`: the positions the head was made for; default `tapwire.num_spec`). */
  numSpec?: number;
  /** ONNX Runtime intra-op threads (1..64; default 1: the worker's thread drafts). */
  intraOpThreads?: number;
  /** ONNX Runtime inter-op threads (1..64; default 1). */
  interOpThreads?: number;
  /** `cpu` (default) or `cuda` (needs onnxruntime-node's CUDA binaries and a GPU). */
  executionProvider?: ExecutionProvider;
  /** CUDA device id (0..255; default 0), with `executionProvider: "cuda"`. */
  cudaDeviceId?: number;
  /** Graph optimisation level (default `all`). */
  graphOptimization?: GraphOptimization;
}

/** {@link OnnxDrafterOptions} checked, with their defaults. */
export interface Resolved {
  window: number | undefined;
  numSpec: number | undefined;
  intraOpThreads: number;
  interOpThreads: number;
  executionProvider: ExecutionProvider;
  cudaDeviceId: number;
  graphOptimization: GraphOptimization;
}

/** Throws `ONNX_DRAFTER_BAD_OPTION` with `message`. */
export function bad(message: string): never {
  throw new OnnxDrafterError("ONNX_DRAFTER_BAD_OPTION", message);
}

function intOpt(
  name: string,
  v: unknown,
  dflt: number | undefined,
  lo: number,
  hi: number,
): number | undefined {
  if (v === undefined) return dflt;
  if (typeof v !== "number" || !Number.isInteger(v) || v < lo || v > hi)
    bad(`${name} ${String(v)} outside ${lo}..${hi}`);
  return v;
}

/** Validates {@link OnnxDrafterOptions}, naming the first bad option. */
export function resolveOptions(o: OnnxDrafterOptions): Resolved {
  if (o === null || typeof o !== "object") bad("options must be an object");
  const known = new Set([
    "window",
    "numSpec",
    "intraOpThreads",
    "interOpThreads",
    "executionProvider",
    "cudaDeviceId",
    "graphOptimization",
  ]);
  for (const k of Object.keys(o)) if (!known.has(k)) bad(`unknown option ${k}`);
  const ep = o.executionProvider ?? "cpu";
  if (!Object.values(ExecutionProvider).includes(ep))
    bad(`executionProvider ${String(ep)} is not cpu or cuda`);
  const go = o.graphOptimization ?? "all";
  if (!Object.values(GraphOptimization).includes(go)) {
    bad(`graphOptimization ${String(go)} is not one of ${Object.values(GraphOptimization).join(", ")}`);
  }
  if (o.cudaDeviceId !== undefined && ep !== "cuda") bad("cudaDeviceId needs executionProvider cuda");
  return {
    window: intOpt("window", o.window, undefined, 1, 4096),
    numSpec: intOpt("numSpec", o.numSpec, undefined, 1, 32),
    intraOpThreads: intOpt("intraOpThreads", o.intraOpThreads, 1, 1, 64)!,
    interOpThreads: intOpt("interOpThreads", o.interOpThreads, 1, 1, 64)!,
    executionProvider: ep,
    cudaDeviceId: intOpt("cudaDeviceId", o.cudaDeviceId, 0, 0, 255)!,
    graphOptimization: go,
  };
}
