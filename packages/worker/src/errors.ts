/** Stable codes of {@link WorkerError}. */
export const WorkerErrorCode = {
  /** An option of `createWorker`, `WorkerCore` or a drafter is invalid; the message names it. */
  BAD_OPTION: "WORKER_BAD_OPTION",
  /** A drafter broke the Drafter contract (geometry, identities). */
  BAD_DRAFTER: "WORKER_BAD_DRAFTER",
} as const;
export type WorkerErrorCode = (typeof WorkerErrorCode)[keyof typeof WorkerErrorCode];

// Branded with a registry symbol so that `instanceof` holds across two installed copies of the
// package (the undici `lib/core/errors.js` pattern): the brand, not the prototype, decides.
const kWorkerError: unique symbol = Symbol.for("tapwire.worker.WorkerError");

/**
 * The one error class of `@tapwire/worker`; `code` is stable, the message names the first problem.
 * `instanceof WorkerError` is true for a WorkerError of any installed copy of the package.
 */
export class WorkerError extends Error {
  /** True for any value branded by a WorkerError constructor of any copy of this package. */
  static override [Symbol.hasInstance](value: unknown): boolean {
    return (
      typeof value === "object" && value !== null && (value as Record<symbol, unknown>)[kWorkerError] === true
    );
  }

  /** Stable machine-readable code. */
  readonly code: WorkerErrorCode;

  constructor(code: WorkerErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "WorkerError";
    this.code = code;
    Object.defineProperty(this, kWorkerError, { value: true });
  }
}
