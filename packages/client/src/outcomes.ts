import type { StepReplyViews } from "@tapwire/wire";
import { FATAL_FRAME_STATUS, FRAME_STATUS_NAMES } from "@tapwire/wire";

/**
 * The rows of CONTRACT 9.2: for each STEP outcome, whether the worker applied the frame, what
 * the client did, and the `reaction` that drives it (`use`, `none`, `drop_backoff`: drop the
 * connection and wait the backoff, `reconnect`: reconnect without backoff, `disable`).
 * `frame_<status>` covers every non-OK frame status (lower-case name).
 */
export const STEP_OUTCOMES = {
  ok: { applied: "yes", action: "use the drafts of consumed entries", reaction: "use" },
  disabled: { applied: "no", action: "nothing", reaction: "none" },
  not_ready: { applied: "no", action: "nothing", reaction: "none" },
  reconnected: { applied: "no", action: "nothing sent", reaction: "none" },
  timeout: {
    applied: "unknown",
    action: "drop connection (backoff); resync the STEP's slots",
    reaction: "drop_backoff",
  },
  transport_error: {
    applied: "unknown",
    action: "drop connection (backoff); resync the STEP's slots",
    reaction: "drop_backoff",
  },
  bad_reply: {
    applied: "unknown",
    action: "drop connection (backoff); resync; record the first violation",
    reaction: "drop_backoff",
  },
  frame_no_session: { applied: "no", action: "reconnect without backoff", reaction: "reconnect" },
  frame_stale_seq: { applied: "no", action: "reconnect without backoff", reaction: "reconnect" },
  frame_bad_frame: { applied: "no", action: "disable", reaction: "disable" },
  frame_bad_version: { applied: "no", action: "disable", reaction: "disable" },
  frame_identity_mismatch: { applied: "no", action: "disable", reaction: "disable" },
  frame_config_mismatch: { applied: "no", action: "disable", reaction: "disable" },
  frame_unknown_op: { applied: "no", action: "disable", reaction: "disable" },
  frame_unauthorized: { applied: "no", action: "disable", reaction: "disable" },
  frame_too_large: { applied: "no", action: "disable", reaction: "disable" },
  frame_busy: { applied: "no", action: "reconnect with backoff", reaction: "drop_backoff" },
  frame_internal: { applied: "no", action: "reconnect with backoff", reaction: "drop_backoff" },
} as const;

/** An outcome reason of `RemoteDraftClient.step` (CONTRACT 9.2). */
export type StepOutcomeReason = keyof typeof STEP_OUTCOMES;

/** How the client reacts to an outcome (the `reaction` column of {@link STEP_OUTCOMES}). */
export type OutcomeReaction = (typeof STEP_OUTCOMES)[StepOutcomeReason]["reaction"];

/** The result of one STEP (CONTRACT 9.2). */
export interface StepOutcome {
  /** True exactly when `reason` is `"ok"`. */
  readonly ok: boolean;
  /** The 9.2 row. */
  readonly reason: StepOutcomeReason;
  /**
   * True when the worker may have applied the frame but its result is unknown (timeout,
   * transport error, bad reply): every slot of the STEP must resync (CONTRACT 7.5).
   */
  readonly unknownApply: boolean;
  /** Round-trip time in microseconds (0 when nothing was sent or no reply came). */
  readonly rttUs: number;
  /**
   * The validated reply (6.3, 7.4, 8) when ok; views into the client's reply buffer, valid until
   * the next request on this client.
   */
  readonly reply: StepReplyViews | null;
  /** Why it failed (the first violation, the transport error), or null. */
  readonly error: string | null;
  /**
   * A pool's round (CONTRACT 12.2): entry `k`'s own outcome (the outcome of the STEP of the
   * member that carried it; `reply` rows of failed entries are zero). Absent for one client:
   * every entry has the outcome itself.
   */
  readonly perEntry?: readonly StepOutcome[];
}

// The outcomes of a STEP that is not sent (CONTRACT 9.2 `not_ready`, `disabled`, `reconnected`):
// one frozen object each, owned here and shared by RemoteDraftClient and WorkerPool (internal,
// not exported from the package).
/** No ready connection (a pool: the slot's member is not ready): nothing sent. @internal */
export const NOT_READY: StepOutcome = Object.freeze({
  ok: false,
  reason: "not_ready",
  unknownApply: false,
  rttUs: 0,
  reply: null,
  error: null,
});
/** The client is disabled (CONTRACT 9.3): nothing sent. @internal */
export const DISABLED: StepOutcome = Object.freeze({ ...NOT_READY, reason: "disabled" as const });
/** Built for an older connection (CONTRACT 7.5): nothing sent. @internal */
export const RECONNECTED: StepOutcome = Object.freeze({ ...NOT_READY, reason: "reconnected" as const });

/** What a non-OK frame status means to the client (CONTRACT 5, 9.2). */
export interface FrameStatusRow {
  /** The status name (CONTRACT 5). */
  readonly name: string;
  /** Its 9.2 outcome reason, `frame_<name>`. */
  readonly reason: StepOutcomeReason;
  /** `disable`, `reconnect` (no backoff) or `drop_backoff`. */
  readonly reaction: OutcomeReaction;
}

// one row per known non-OK status, from the 9.2 table; the table must cover every fatal status
const FRAME_ROWS: (FrameStatusRow | undefined)[] = [];
for (const [code, name] of Object.entries(FRAME_STATUS_NAMES)) {
  const status = Number(code);
  if (status === 0) continue;
  const reason = `frame_${name.toLowerCase()}` as StepOutcomeReason;
  const row = STEP_OUTCOMES[reason];
  if (row === undefined) continue;
  if (FATAL_FRAME_STATUS.has(status) !== (row.reaction === "disable")) {
    throw new Error(`CONTRACT 5 and 9.2 disagree on ${name}`);
  }
  FRAME_ROWS[status] = { name, reason, reaction: row.reaction };
}

/** The 9.2 row of a non-OK frame status, or null for a status CONTRACT 5 does not name. */
export function frameStatusRow(status: number): FrameStatusRow | null {
  return FRAME_ROWS[status] ?? null;
}

/** The name of a frame status, or `STATUS_<n>` for an unknown one. */
export function statusName(status: number): string {
  return FRAME_STATUS_NAMES[status] ?? `STATUS_${status}`;
}

/**
 * The echo check every reply gets (CONTRACT 4: a reply echoes op, seq and session): null when
 * the header echoes the request, else what it echoes and what was sent.
 */
export function echoProblem(
  got: { readonly op: number; readonly seq: number; readonly session: number },
  op: number,
  seq: number,
  session: number,
): string | null {
  if (got.op === op && got.seq === seq && got.session === session) return null;
  return `reply echoes op=${got.op} seq=${got.seq} session=0x${got.session.toString(16)} (sent op=${op} seq=${seq} session=0x${session.toString(16)})`;
}

/** Message text of any thrown value. */
export function errText(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
