import { Registry } from "@tapwire/stats";
import { DEFAULT_BATCH_GATHER_US } from "./batcher.js";
import type { Drafter } from "./drafter.js";
import { checkDrafter } from "./drafter.js";
import { WorkerError } from "./errors.js";
import { intOption } from "./int-option.js";

/** Minimal logger shape (pino's). */
export interface WorkerLogger {
  /** Session events (new session, RESET, HELLO answered BUSY); `obj` holds the structured fields. */
  info(obj: object, msg?: string): void;
  /** Refused input and connection trouble the worker survives (HELLO refused, STEP refused, TLS). */
  warn(obj: object, msg?: string): void;
  /** Faults inside the worker (a drafter or the row apply that threw; the batch or window is dropped). */
  error(obj: object, msg?: string): void;
  /** Per-frame detail, off in production loggers (pino level `debug`). */
  debug(obj: object, msg?: string): void;
}

/** Session takeover policy (CONTRACT 6.2, 11). */
export const Takeover = { ALLOW: "allow", REFUSE: "refuse" } as const;
export type Takeover = (typeof Takeover)[keyof typeof Takeover];

/** Options of {@link WorkerCore}. */
export interface WorkerCoreOptions {
  /** The drafting backend; its identities and geometry are what HELLOs must match. */
  drafter: Drafter;
  /** Largest `max_slots` a session may ask (default 256). */
  maxSlots?: number;
  /** Largest `max_rows_per_step` a session may ask (default 4096). */
  maxRowsPerStep?: number;
  /** Shared token: when set, a HELLO without the right auth is UNAUTHORIZED (CONTRACT 6.1, 11). */
  token?: string | Uint8Array | null;
  /**
   * `refuse`: a HELLO of another session while the current one is leased is BUSY. Default
   * `refuse` when a token is set (CONTRACT 11: a captured HELLO can be replayed), else `allow`.
   */
  takeover?: Takeover;
  /** Lease of the current session after its last OK frame, in ms (default 10 000). */
  sessionLease?: number;
  /** `worker_name` of the HelloReply (default "tapwire-worker", at most 32 UTF-8 bytes). */
  name?: string;
  /** Stats registry (default a new one with prefix `tapwire_worker_`). */
  registry?: Registry;
  /** Logger (default silent). */
  logger?: WorkerLogger | null;
  /** Monotonic clock in ms for the session lease (default `performance.now`). */
  now?: () => number;
  /**
   * A slot's row buffer holds up to this many windows (2..16, default 4; 2 when `maxSessions` > 1,
   * so a shared worker's slot memory stays within 2x `maxWindowBytes`). The last W rows stay
   * contiguous by compacting when the buffer end is reached; more windows mean fewer
   * compactions (cheaper multi-row appends) for more memory.
   */
  slotBufferWindows?: number;
  /**
   * CONTRACT 12.1: sessions held at once (default 1: one current session, 6.2 unchanged). Above 1
   * the worker is shared: it sets capability bit 3 SHARED, admits sessions against
   * `maxWindowBytes` and drafts the STEPs of several sessions together (see docs/worker.md).
   */
  maxSessions?: number;
  /**
   * CONTRACT 12.1: bytes of window reservations (`max_slots * W * row_bytes` per held session)
   * the shared worker admits. Default `maxSessions * maxSlots * W * row_bytes`. Only with K > 1.
   */
  maxWindowBytes?: number;
  /** CONTRACT 12.1: a held session idle this long (ms) is dropped (default 60 000). Only with K > 1. */
  sessionIdleMs?: number;
  /**
   * CONTRACT 12.1: most entries in one cross-session drafter call (0, the default: no bound but
   * the held sessions' `max_slots`). A STEP is never split: a larger one is drafted alone. Only
   * with K > 1.
   */
  maxBatchEntries?: number;
  /**
   * Bound of the batch gather in µs (default 2000; 0 turns it off): a drafter call waits at most
   * this long, and never longer than a mean call, for the next STEP of sessions the previous call
   * answered, so closed-loop sessions meet in one call; a lone session is never delayed (see
   * docs/worker.md "Batch gather"). Only with K > 1.
   */
  batchGatherUs?: number;
}

/**
 * @internal The default `slotBufferWindows` of a shared worker (`maxSessions` > 1): slot memory at
 * most 2x the reservations (CONTRACT 12.1 memory; docs/worker.md "Sizing a shared worker").
 */
export const SHARED_SLOT_BUFFER_WINDOWS = 2;

/** Defaults of {@link WorkerCoreOptions} (also what `tapwire-worker --help` states). */
export const CORE_DEFAULTS = {
  maxSlots: 256,
  maxRowsPerStep: 4096,
  sessionLease: 10_000,
  name: "tapwire-worker",
  slotBufferWindows: 4,
  maxSessions: 1,
  sessionIdleMs: 60_000,
  maxBatchEntries: 0,
  batchGatherUs: DEFAULT_BATCH_GATHER_US,
} as const;

const U32_MAX = 0xffffffff;

/** @internal {@link WorkerCoreOptions} checked, with every default applied. */
export interface CoreConfig {
  readonly drafter: Drafter;
  readonly maxSlots: number;
  readonly maxRowsPerStep: number;
  readonly token: string | Uint8Array | null;
  readonly takeover: Takeover;
  readonly leaseMs: number;
  readonly name: string;
  readonly registry: Registry;
  readonly log: WorkerLogger;
  readonly now: () => number;
  readonly slotBufferWindows: number;
  /** `num_taps * hidden * 2` of the drafter. */
  readonly rowBytes: number;
  /** CONTRACT 12.1 `max_sessions` (1: not shared). */
  readonly maxSessions: number;
  /** CONTRACT 12.1 `max_window_bytes`. */
  readonly maxWindowBytes: number;
  /** CONTRACT 12.1 `session_idle_ms`. */
  readonly sessionIdleMs: number;
  /** CONTRACT 12.1 `max_batch_entries` (0: no bound). */
  readonly maxBatchEntries: number;
  /** Bound of the batch gather, µs (0: off). */
  readonly batchGatherUs: number;
}

/** A logger that drops everything. */
export const silentLogger: WorkerLogger = { info() {}, warn() {}, error() {}, debug() {} };

/**
 * @internal Validates {@link WorkerCoreOptions} in the order they are documented, naming the bad
 * option (`WORKER_BAD_OPTION`; a drafter breaking its contract is `WORKER_BAD_DRAFTER`).
 */
export function resolveCoreOptions(options: WorkerCoreOptions): CoreConfig {
  if (options === null || typeof options !== "object") {
    throw new WorkerError("WORKER_BAD_OPTION", "options must be an object");
  }
  const d = options.drafter;
  if (d === null || typeof d !== "object")
    throw new WorkerError("WORKER_BAD_OPTION", "option drafter is missing");
  checkDrafter(d);
  const maxSlots = intOption("maxSlots", options.maxSlots, CORE_DEFAULTS.maxSlots, 1, 1 << 20);
  const maxRowsPerStep = intOption(
    "maxRowsPerStep",
    options.maxRowsPerStep,
    CORE_DEFAULTS.maxRowsPerStep,
    0,
    U32_MAX,
  );
  const leaseMs = intOption("sessionLease", options.sessionLease, CORE_DEFAULTS.sessionLease, 0, 2 ** 31 - 1);
  const token = options.token ?? null;
  if (token !== null && !(typeof token === "string" || token instanceof Uint8Array)) {
    throw new WorkerError("WORKER_BAD_OPTION", "option token must be a string or bytes");
  }
  if (token !== null && token.length === 0)
    throw new WorkerError("WORKER_BAD_OPTION", "option token is empty");
  // CONTRACT 11: the token decides who may HELLO but a captured HELLO can be replayed, so with a
  // token a live session is not taken over unless the operator says so.
  const takeover = options.takeover ?? (token !== null ? Takeover.REFUSE : Takeover.ALLOW);
  if (takeover !== Takeover.ALLOW && takeover !== Takeover.REFUSE) {
    throw new WorkerError(
      "WORKER_BAD_OPTION",
      `option takeover ${String(takeover)} is not "allow" or "refuse"`,
    );
  }
  const name = options.name ?? CORE_DEFAULTS.name;
  if (typeof name !== "string" || Buffer.byteLength(name, "utf8") > 32 || name.includes("\0")) {
    throw new WorkerError("WORKER_BAD_OPTION", "option name must be at most 32 UTF-8 bytes without NUL");
  }
  // Duck-typed, not instanceof: a Registry from another copy of @tapwire/stats is fine.
  const reg = options.registry as unknown as Record<string, unknown> | undefined;
  if (
    reg !== undefined &&
    (reg === null ||
      typeof reg !== "object" ||
      typeof reg.counter !== "function" ||
      typeof reg.histogram !== "function" ||
      typeof reg.snapshot !== "function")
  ) {
    throw new WorkerError("WORKER_BAD_OPTION", "option registry must be a @tapwire/stats Registry");
  }
  const logger = options.logger ?? null;
  if (logger !== null) {
    for (const m of ["info", "warn", "error", "debug"] as const) {
      if (typeof (logger as unknown as Record<string, unknown>)[m] !== "function") {
        throw new WorkerError("WORKER_BAD_OPTION", `option logger has no ${m}() method`);
      }
    }
  }
  if (options.now !== undefined && typeof options.now !== "function") {
    throw new WorkerError("WORKER_BAD_OPTION", "option now must be a function returning ms");
  }
  // CONTRACT 12.1: a shared worker (K > 1) and its admission budget.
  const maxSessions = intOption("maxSessions", options.maxSessions, CORE_DEFAULTS.maxSessions, 1, 4096);
  const rowBytes = d.numTaps * d.hidden * 2;
  const maxWindowBytes = intOption(
    "maxWindowBytes",
    options.maxWindowBytes,
    Math.min(Number.MAX_SAFE_INTEGER, maxSessions * maxSlots * d.window * rowBytes),
    1,
    Number.MAX_SAFE_INTEGER,
  );
  const sessionIdleMs = intOption(
    "sessionIdleMs",
    options.sessionIdleMs,
    CORE_DEFAULTS.sessionIdleMs,
    1,
    2 ** 31 - 1,
  );
  const maxBatchEntries = intOption(
    "maxBatchEntries",
    options.maxBatchEntries,
    CORE_DEFAULTS.maxBatchEntries,
    0,
    U32_MAX,
  );
  const batchGatherUs = intOption(
    "batchGatherUs",
    options.batchGatherUs,
    CORE_DEFAULTS.batchGatherUs,
    0,
    1_000_000,
  );
  return {
    maxSessions,
    maxWindowBytes,
    sessionIdleMs,
    maxBatchEntries,
    batchGatherUs,
    drafter: d,
    maxSlots,
    maxRowsPerStep,
    token,
    takeover,
    leaseMs,
    name,
    registry: options.registry ?? new Registry({ prefix: "tapwire_worker_" }),
    log: logger ?? silentLogger,
    now: options.now ?? (() => performance.now()),
    slotBufferWindows: intOption(
      "slotBufferWindows",
      options.slotBufferWindows,
      // CONTRACT 12.1 memory: a shared worker's slot memory stays near max_window_bytes.
      maxSessions > 1 ? SHARED_SLOT_BUFFER_WINDOWS : CORE_DEFAULTS.slotBufferWindows,
      2,
      16,
    ),
    rowBytes,
  };
}
