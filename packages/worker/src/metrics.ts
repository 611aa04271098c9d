import type { Counter, Histogram, Registry } from "@tapwire/stats";
import { BUCKETS } from "@tapwire/stats";
import { FRAME_STATUS_NAMES, OP_NAMES, Op, REQ_STATUS_NAMES } from "@tapwire/wire";

/** Metric-name keys of a wire name table, indexed by code: `FRAME_STATUS_NAMES` → "no_session", ... */
function metricKeys(names: Readonly<Record<number, string>>): string[] {
  const out: string[] = [];
  for (let code = 0; names[code] !== undefined; code++) out.push(names[code]!.toLowerCase());
  return out;
}

/** Metric-name key of each op code ("hello", "step", ...). */
export const OP_KEYS: Readonly<Record<number, string>> = Object.fromEntries(
  Object.values(Op).map((op) => [op, OP_NAMES[op]!.toLowerCase()]),
);

/** @internal The counters and histograms of a {@link WorkerCore}, registered once. */
export interface CoreMetrics {
  /** Per op key, plus `unknown` and `unreadable`. */
  readonly frames: Readonly<Record<string, Counter>>;
  /** Per frame status code. */
  readonly replies: readonly Counter[];
  /** Per request status code. */
  readonly entries: readonly Counter[];
  readonly sessions: Counter;
  readonly takeovers: Counter;
  readonly rowsApplied: Counter;
  readonly rowsPlaced: Counter;
  readonly rowsCopied: Counter;
  readonly stepsPlaced: Counter;
  readonly placementsLost: Counter;
  readonly entriesDrafted: Counter;
  readonly drafterCalls: Counter;
  readonly drafterErrors: Counter;
  readonly drafterBadValues: Counter;
  readonly bytesIn: Counter;
  readonly bytesOut: Counter;
  readonly badHeaders: Counter;
  readonly internal: Counter;
  readonly windowsKept: Counter;
  readonly unbound: Counter;
  readonly unbinds: Counter;
  readonly oversizeUnbound: Counter;
  readonly drafterTime: Histogram;
  readonly stepTime: Histogram;
}

/** @internal Registers the worker's metrics in `r` (names documented in docs/worker.md). */
export function createCoreMetrics(r: Registry): CoreMetrics {
  const frames: Record<string, Counter> = {};
  for (const k of [...Object.values(OP_KEYS), "unknown", "unreadable"]) {
    frames[k] = r.counter(`frames_${k}`, `request frames with op ${k}`);
  }
  return {
    frames,
    replies: metricKeys(FRAME_STATUS_NAMES).map((k) =>
      r.counter(`replies_${k}`, `replies with frame status ${k}`),
    ),
    entries: metricKeys(REQ_STATUS_NAMES).map((k) => r.counter(`entries_${k}`, `STEP entries answered ${k}`)),
    sessions: r.counter("sessions", "sessions started by a HELLO (CONTRACT 6.2)"),
    takeovers: r.counter("session_takeovers", "sessions that replaced a live session"),
    rowsApplied: r.counter("rows_applied", "tap rows applied to slot windows"),
    rowsPlaced: r.counter(
      "rows_placed",
      "tap rows applied where the transport received them (no copy; part of rows_applied)",
    ),
    rowsCopied: r.counter(
      "rows_copied",
      "tap rows applied by copying them into the window (part of rows_applied)",
    ),
    stepsPlaced: r.counter("steps_placed", "STEP frames whose rows were received into slot buffers"),
    placementsLost: r.counter(
      "placements_lost",
      "placed entries found invalid at apply (another frame changed the slot meanwhile): window dropped, NEED_RESYNC",
    ),
    entriesDrafted: r.counter("entries_drafted", "entries handed to the drafter"),
    drafterCalls: r.counter("drafter_calls", "batched drafter calls"),
    drafterErrors: r.counter("drafter_errors", "drafter calls that threw (batch DRAFT_FAILED)"),
    drafterBadValues: r.counter("drafter_bad_values", "entries whose drafted values broke CONTRACT 6.3/8"),
    bytesIn: r.counter(
      "request_bytes",
      "request message bytes (CONTRACT 4 frames, length prefixes not included)",
    ),
    bytesOut: r.counter(
      "reply_bytes",
      "reply message bytes (CONTRACT 4 frames, length prefixes not included)",
    ),
    badHeaders: r.counter("unreadable_headers", "frames whose header could not be read (connection closed)"),
    internal: r.counter(
      "internal_errors",
      "unexpected internal failures: frames answered INTERNAL, or entries failed inside an applied STEP",
    ),
    windowsKept: r.counter("windows_kept", "slot windows kept across a re-HELLO of the same session"),
    unbound: r.counter(
      "unbound_refused",
      "STEP and RESET answered NO_SESSION because their connection is not bound to the current session (CONTRACT 6.2)",
    ),
    unbinds: r.counter(
      "connections_unbound",
      "connections unbound because a HELLO made another session current (CONTRACT 6.2)",
    ),
    oversizeUnbound: r.counter(
      "oversize_unbound",
      "messages refused unread on a connection not bound by HELLO: length prefix above 4 KiB (CONTRACT 11)",
    ),
    drafterTime: r.histogram("drafter_seconds", {
      help: "drafter time per STEP (one batched call)",
      unit: "seconds",
      buckets: BUCKETS.STEP_RTT_SECONDS,
    }),
    stepTime: r.histogram("step_seconds", {
      help: "STEP processing time in the worker (worker_us of the reply)",
      unit: "seconds",
      buckets: BUCKETS.STEP_RTT_SECONDS,
    }),
  };
}
