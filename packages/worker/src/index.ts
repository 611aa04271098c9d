/**
 * `@tapwire/worker`: the drafter server of the remote drafter link (CONTRACT 5, 6, 7, 8, 10, 11):
 * one session, per-slot windows of tap rows, batched drafting through a {@link Drafter}.
 * @packageDocumentation
 */

export type { FrameConn, WorkerCoreOptions, WorkerLogger } from "./core.js";
export { StepPlacement, Takeover, WorkerCore } from "./core.js";
export type { DraftBatchEntry, Drafter, DraftOutput, NullDrafterOptions } from "./drafter.js";
export { checkDrafter, NullDrafter } from "./drafter.js";
export { WorkerError, WorkerErrorCode } from "./errors.js";
export { CORE_DEFAULTS } from "./options.js";
export type { ReferenceDrafterOptions } from "./reference-drafter.js";
export { ReferenceDrafter } from "./reference-drafter.js";
export type { RowPlacement, WindowSnapshot } from "./window-store.js";
export { GenerationCheck, WindowStore } from "./window-store.js";
export type { Worker, WorkerOptions } from "./worker.js";
export { createWorker, DEFAULT_LISTEN, WORKER_DEFAULTS } from "./worker.js";
