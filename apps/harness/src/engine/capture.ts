/**
 * `--trace FILE` (issue 24, docs/trace.md): the engine's RemoteDraftClient hands every OK HELLO
 * and every STEP request and reply to a TraceWriter, closed (and its counters noted) after the
 * client at the end of the run.
 */
import { TraceWriter } from "@tapwire/trace";
import { traceRowsOf } from "../cli/cli.js";
import type { RunScope } from "../procs/children.js";

/** The client option `trace` for `--trace`, or nothing. */
export function traceOption(scope: RunScope): { trace?: TraceWriter } {
  const path = scope.cfg.trace;
  if (path === null) return {};
  const writer = new TraceWriter({ path, rows: traceRowsOf(scope.cfg.traceRows), name: "tapwire-harness" });
  // cleanups run in reverse: this one after the client's close, which is pushed later
  scope.cleanups.push(async () => {
    const st = await writer.close();
    scope.note(
      `trace ${path}: ${st.records} records, ${st.bytesWritten} bytes, ${st.rowsOmitted} STEPs without rows, ${st.dropped} dropped`,
    );
  });
  return { trace: writer };
}
