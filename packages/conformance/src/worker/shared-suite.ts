/** The worker mode's `--shared` run: the cases of CONTRACT 12.1 against a shared worker. */
import type { RunReport } from "../report.js";
import { makeReport } from "../report.js";
import type { CaseDef, RunOptions } from "../runner.js";
import { runCases } from "../runner.js";
import type { SharedCtx, SharedOptions } from "./cases-shared.js";
import { sharedCases } from "./cases-shared.js";
import type { WorkerSuiteOptions } from "./context.js";
import { WorkerCtx } from "./context.js";

export type { SharedOptions } from "./cases-shared.js";

/** Every case of `tapwire-conformance worker --shared`, in run order. */
export const SHARED_CASES: readonly CaseDef<SharedCtx>[] = sharedCases;

/**
 * Runs the CONTRACT 12.1 cases against the shared worker at `opts.endpoint` (its `max_sessions`
 * in `opts.maxSessions`, default 4) and returns the report. Geometry not given is discovered as
 * in {@link runWorkerSuite}.
 * @throws ConformanceError `CONFORMANCE_CONNECT` / `CONFORMANCE_DISCOVERY` when the worker cannot be reached or probed.
 */
export async function runWorkerSharedSuite(
  opts: WorkerSuiteOptions & SharedOptions,
  run: RunOptions = {},
): Promise<RunReport> {
  const started = new Date();
  const ctx = new WorkerCtx(opts) as SharedCtx;
  ctx.shared = {
    maxSessions: opts.maxSessions ?? 4,
    ...(opts.sessionIdleMs !== undefined ? { sessionIdleMs: opts.sessionIdleMs } : {}),
    ...(opts.maxWindowBytes !== undefined ? { maxWindowBytes: opts.maxWindowBytes } : {}),
  };
  await ctx.init();
  const results = await runCases(SHARED_CASES, ctx, { ...run, after: async () => ctx.closeAll() });
  return makeReport("worker", opts.endpoint, { ...ctx.describePeer(), shared: ctx.shared }, results, started);
}
