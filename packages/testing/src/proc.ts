import { readdirSync, readFileSync } from "node:fs";
import { TestingError, TestingErrorCode } from "./errors.js";

/** Memory of a process, from `/proc/<pid>/status` (Linux), in bytes. */
export interface ProcessMemory {
  /** Resident set size now (`VmRSS`). */
  rssBytes: number;
  /** Peak resident set size since the process started (`VmHWM`). */
  peakRssBytes: number;
  /** Virtual size now (`VmSize`), what an address-space limit (`ulimit -v`) caps. */
  vmBytes: number;
}

function checkPid(pid: number): void {
  if (!Number.isInteger(pid) || pid <= 0) {
    throw new TestingError(TestingErrorCode.BAD_OPTION, `pid ${pid} must be a positive integer`);
  }
}

function readProc(pid: number, file: string): string {
  checkPid(pid);
  try {
    return readFileSync(`/proc/${pid}/${file}`, "utf8");
  } catch (err) {
    throw new TestingError(TestingErrorCode.NO_PROCESS, `process ${pid} is gone (/proc/${pid}/${file})`, {
      cause: err,
    });
  }
}

/** Memory figures of `pid` (Linux `/proc`); throws `TESTING_NO_PROCESS` when it is gone. */
export function memoryOf(pid: number): ProcessMemory {
  const status = readProc(pid, "status");
  const kib = (key: string): number => {
    const m = new RegExp(`^${key}:\\s+(\\d+) kB$`, "m").exec(status);
    // a zombie has no Vm* lines: it holds no memory
    return m === null ? 0 : Number(m[1]) * 1024;
  };
  return { rssBytes: kib("VmRSS"), peakRssBytes: kib("VmHWM"), vmBytes: kib("VmSize") };
}

/** Resident set size of `pid` in bytes (`VmRSS`); throws `TESTING_NO_PROCESS` when it is gone. */
export function rssOf(pid: number): number {
  return memoryOf(pid).rssBytes;
}

/** Open file descriptors of `pid` (entries of `/proc/<pid>/fd`, sockets included). */
export function fdCountOf(pid: number): number {
  checkPid(pid);
  try {
    return readdirSync(`/proc/${pid}/fd`).length;
  } catch (err) {
    throw new TestingError(TestingErrorCode.NO_PROCESS, `process ${pid} is gone (/proc/${pid}/fd)`, {
      cause: err,
    });
  }
}

/**
 * True while `pid` is a live process: it exists in `/proc` and one of its threads is not a
 * zombie (`Z`) or dead (`X`). A process whose threads are all zombies has ended (its files are
 * closed); only its exit status waits to be reaped.
 */
export function isAlive(pid: number): boolean {
  checkPid(pid);
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return false;
  }
  if (running(stat)) return true;
  // The main thread is a zombie as soon as it is through exit_group, while other threads (e.g.
  // libzmq's I/O thread) may still be exiting and holding the process's files (listening
  // sockets): the process has ended only when no thread of it is left running.
  let tasks: string[];
  try {
    tasks = readdirSync(`/proc/${pid}/task`);
  } catch {
    return false;
  }
  for (const t of tasks) {
    try {
      if (running(readFileSync(`/proc/${pid}/task/${t}/stat`, "utf8"))) return true;
    } catch {
      // that thread is gone
    }
  }
  return false;
}

/** A /proc stat line's state is not Z (zombie) or X (dead). */
function running(stat: string): boolean {
  // "pid (comm) S ...": comm may hold spaces and parentheses, the state follows the last ")"
  const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
  return state !== "Z" && state !== "X";
}

/** Options of {@link waitUntil}. */
export interface WaitUntilOptions {
  /** Give up after this many ms (default 10000, at most 600000). */
  timeoutMs?: number;
  /** Poll period in ms (default 25). */
  intervalMs?: number;
  /** What is awaited, for the timeout message. */
  what?: string;
}

/**
 * Polls `pred` until it returns true (or a promise of true); throws `TESTING_TIMEOUT` naming
 * `what` after `timeoutMs`. Errors thrown by `pred` propagate.
 */
export async function waitUntil(
  pred: () => boolean | Promise<boolean>,
  opts: WaitUntilOptions = {},
): Promise<void> {
  const timeoutMs = opts.timeoutMs ?? 10_000;
  const intervalMs = opts.intervalMs ?? 25;
  if (!(timeoutMs > 0 && timeoutMs <= 600_000)) {
    throw new TestingError(
      TestingErrorCode.BAD_OPTION,
      `option timeoutMs ${timeoutMs} must be in (0, 600000]`,
    );
  }
  if (!(intervalMs > 0)) {
    throw new TestingError(TestingErrorCode.BAD_OPTION, `option intervalMs ${intervalMs} must be > 0`);
  }
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await pred()) return;
    if (Date.now() >= deadline) {
      throw new TestingError(
        TestingErrorCode.TIMEOUT,
        `${opts.what ?? "condition"} not reached within ${timeoutMs} ms`,
      );
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/** A running RSS sampler returned by {@link watchRss}. */
export interface RssWatch {
  /** Largest RSS seen so far, bytes. */
  readonly peakBytes: number;
  /** Samples taken so far. */
  readonly samples: number;
  /** Stops sampling (also stops by itself when the process is gone) and returns the figures. */
  stop(): { peakBytes: number; samples: number };
}

/**
 * Samples `rssOf(pid)` every `intervalMs` (default 20) until stopped, keeping the peak; for
 * "RSS stays under a bound during the attack". At most `maxSamples` (default 100000) samples.
 * `memoryOf(pid).peakRssBytes` (`VmHWM`) gives the lifetime peak without sampling.
 */
export function watchRss(pid: number, opts: { intervalMs?: number; maxSamples?: number } = {}): RssWatch {
  const intervalMs = opts.intervalMs ?? 20;
  const maxSamples = opts.maxSamples ?? 100_000;
  let peakBytes = rssOf(pid);
  let samples = 1;
  const timer = setInterval(() => {
    try {
      peakBytes = Math.max(peakBytes, rssOf(pid));
      samples++;
      if (samples >= maxSamples) clearInterval(timer);
    } catch {
      clearInterval(timer);
    }
  }, intervalMs);
  timer.unref();
  return {
    get peakBytes() {
      return peakBytes;
    },
    get samples() {
      return samples;
    },
    stop() {
      clearInterval(timer);
      return { peakBytes, samples };
    },
  };
}
