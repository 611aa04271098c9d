/** The worker mode: every case of CONTRACT 3–11 against a worker endpoint. */
import type { RunReport } from "../report.js";
import { makeReport } from "../report.js";
import type { CaseDef, RunOptions } from "../runner.js";
import { runCases } from "../runner.js";
import { framingCases, headerCases } from "./cases-framing.js";
import { helloCases, statusCases, statusSummaryCase } from "./cases-hello.js";
import { miscCases } from "./cases-misc.js";
import { sessionCases } from "./cases-session.js";
import { shmCases } from "./cases-shm.js";
import { stepCases } from "./cases-step.js";
import type { WorkerSuiteOptions } from "./context.js";
import { WorkerCtx } from "./context.js";

/** Every worker case, in run order (the 5.1.15 summary runs last). */
export const WORKER_CASES: readonly CaseDef<WorkerCtx>[] = [
  ...framingCases,
  ...headerCases,
  ...statusCases,
  ...helloCases,
  ...sessionCases,
  ...stepCases,
  ...miscCases,
  ...shmCases,
  statusSummaryCase,
];

/**
 * Runs the worker cases against `opts.endpoint` and returns the report. Geometry not given in
 * `opts` is discovered from the HelloReply of a deliberately mismatched HELLO.
 * @throws ConformanceError `CONFORMANCE_CONNECT` / `CONFORMANCE_DISCOVERY` when the worker cannot be reached or probed.
 */
export async function runWorkerSuite(opts: WorkerSuiteOptions, run: RunOptions = {}): Promise<RunReport> {
  const started = new Date();
  const ctx = new WorkerCtx(opts);
  await ctx.init();
  const results = await runCases(WORKER_CASES, ctx, {
    ...run,
    after: async () => ctx.closeAll(),
  });
  return makeReport("worker", opts.endpoint, ctx.describePeer(), results, started);
}
