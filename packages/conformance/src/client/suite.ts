/** The client mode: a scripted worker that walks a rank-0 client through CONTRACT 9.2 and 9.3. */
import type { RunReport } from "../report.js";
import { makeReport } from "../report.js";
import type { CaseCheck, CaseDef, RunOptions } from "../runner.js";
import { runCases } from "../runner.js";
import { CLIENT_CASES as CASES, CLIENT_SUMMARY } from "./cases.js";
import type { ClientSuiteOptions } from "./context.js";
import { ClientCtx } from "./context.js";

export type { ClientSuiteOptions } from "./context.js";

/** Every client case, in run order. */
export const CLIENT_CASES: readonly CaseDef<ClientCtx>[] = [...CASES, CLIENT_SUMMARY];

/**
 * Listens on `opts.listen` and runs the client cases against whatever rank-0 client connects
 * (a client disabled by a fatal case must be replaced by a fresh one: `onNeedClient` says when).
 */
export async function runClientSuite(opts: ClientSuiteOptions, run: RunOptions = {}): Promise<RunReport> {
  const started = new Date();
  const ctx = new ClientCtx(opts);
  await ctx.listener.listen(opts.listen);
  opts.onListening?.(ctx.listener.endpoint);
  try {
    const defs = CLIENT_CASES.map(
      (d): CaseDef<ClientCtx> => ({
        ...d,
        async run(c: ClientCtx, t: CaseCheck) {
          c.violations = [];
          await d.run(c, t);
          t.must(
            c.violations.length === 0,
            "every request of the client valid (CONTRACT 4, 6.1, 6.2, 7.2, 7.3, 9.3)",
            () => c.violations.slice(0, 3).join("; "),
          );
        },
      }),
    );
    const results = await runCases(defs, ctx, { caseTimeoutMs: 60_000, ...run });
    return makeReport(
      "client",
      ctx.listener.endpoint,
      {
        window: ctx.W,
        num_spec: ctx.N,
        vocab: ctx.V,
        row_bytes: ctx.rowBytes,
        backoff_ms: opts.backoffMs ?? "unknown",
        sessions_seen: ctx.disabled.size + 1,
      },
      results,
      started,
    );
  } finally {
    await ctx.listener.close();
  }
}
