import type { WorkerErrorCode } from "./errors.js";
import { WorkerError } from "./errors.js";

/**
 * @internal The one integer-in-range option check of the package: `v` (or `dflt` when undefined)
 * when it is an integer in `[lo, hi]`, else a {@link WorkerError} (`WORKER_BAD_OPTION` unless
 * `code` says otherwise) naming the option.
 */
export function intOption(
  name: string,
  v: number | undefined,
  dflt: number,
  lo: number,
  hi: number,
  code: WorkerErrorCode = "WORKER_BAD_OPTION",
): number {
  const x = v ?? dflt;
  if (typeof x !== "number" || !Number.isInteger(x) || x < lo || x > hi) {
    throw new WorkerError(code, `option ${name} ${String(x)} is not an integer in ${lo}..${hi}`);
  }
  return x;
}
