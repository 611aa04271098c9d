/** Stable codes of {@link WorkerError}. */
export const WorkerErrorCode = {
  /** An option of `createWorker`, `WorkerCore` or a drafter is invalid; the message names it. */
  BAD_OPTION: "WORKER_BAD_OPTION",
  /** A drafter broke the Drafter contract (geometry, identities). */
  BAD_DRAFTER: "WORKER_BAD_DRAFTER",
} as const;
export type WorkerErrorCode = (typeof WorkerErrorCode)[keyof typeof WorkerErrorCode];

/** The one error class of `@tapwire/worker`; `code` is stable, the message names the first problem. */
export class WorkerError extends Error {
  readonly code: WorkerErrorCode;
  constructor(code: WorkerErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "WorkerError";
    this.code = code;
  }
}
