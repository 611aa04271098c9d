import type { Readable } from "node:stream";
import { StatsError, StatsErrorCode } from "./errors.js";

/** Options of {@link watchParent}. */
export interface WatchParentOptions {
  /**
   * The stream whose end means the parent is gone. Default `process.stdin`: the supervisor starts
   * the bin with stdin a pipe it holds open and never closes; when the supervisor dies, whatever
   * signal killed it (SIGKILL included), the kernel closes its end and this side reads end-of-file.
   */
  input?: Readable;
}

/** What {@link watchParent} returns. */
export interface ParentWatch {
  /** Stops watching (the bin is closing for another reason); idempotent. */
  stop(): void;
}

/**
 * The `--exit-with-parent` rule of every tapwire bin (docs/operations.md "Exit codes and
 * supervisors"): calls `onGone` once when `input` (stdin by default) ends, errors or closes.
 * Whatever the parent writes is read and dropped. A parent-death signal (`prctl`) would need
 * native code and misses a parent that is a wrapper (`sh -c`, `pnpm exec`); polling the parent
 * pid cannot tell an unreaped zombie parent from a live one. A pipe end is closed by the kernel
 * in every case, through any `exec` wrapper that passes stdin on.
 *
 * @throws StatsError `STATS_BAD_OPTION` when `onGone` is not a function or `input` not readable.
 */
export function watchParent(onGone: (why: string) => void, options: WatchParentOptions = {}): ParentWatch {
  if (typeof onGone !== "function") {
    throw new StatsError(StatsErrorCode.BAD_OPTION, "watchParent: onGone must be a function");
  }
  const input = options.input ?? process.stdin;
  if (typeof input !== "object" || input === null || typeof input.on !== "function") {
    throw new StatsError(StatsErrorCode.BAD_OPTION, "watchParent: option input must be a readable stream");
  }
  let done = false;
  const fire = (why: string) => {
    if (done) return;
    done = true;
    detach();
    onGone(why);
  };
  const onEnd = () => fire("stdin closed: parent exited");
  const onError = (e: Error) => fire(`stdin error: ${e.message}`);
  const onData = () => {};
  const detach = () => {
    input.off("end", onEnd);
    input.off("close", onEnd);
    input.off("error", onError);
    input.off("data", onData);
    input.pause();
  };
  input.on("end", onEnd);
  input.on("close", onEnd);
  input.on("error", onError);
  input.on("data", onData);
  input.resume();
  return {
    stop() {
      if (done) return;
      done = true;
      detach();
      // A pipe left open keeps the event loop alive; the bin is exiting anyway.
      (input as { unref?: () => void }).unref?.();
    },
  };
}
