/**
 * `@tapwire/worker`: the drafter server of the remote drafter link (CONTRACT 5, 6, 7, 8, 10, 11).
 * @packageDocumentation
 */
export { WorkerError, WorkerErrorCode } from "./errors.js";
export type { WindowSnapshot } from "./window-store.js";
export { GenerationCheck, WindowStore } from "./window-store.js";
