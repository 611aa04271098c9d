import type { ChildProcess } from "node:child_process";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { TestingError, TestingErrorCode } from "./errors.js";

/** One output line of a spawned process; `json` is set when the line parses as a JSON object. */
export interface OutputLine {
  /** The stream the line came from. */
  stream: "stdout" | "stderr";
  /** The line without its newline. */
  text: string;
  /** The line parsed as a JSON object (pino logs), undefined when it is not one. */
  json: Record<string, unknown> | undefined;
}

/** Options of {@link spawnBin}. */
export interface SpawnBinOptions {
  /** Resolve once a line matches (default: a JSON line with `msg === "listening"`). */
  ready?: (line: OutputLine) => boolean;
  /** Give up waiting for `ready` after this many ms (default 20000); the child is killed. */
  timeoutMs?: number;
  /** Extra environment (merged over `process.env`). */
  env?: Record<string, string | undefined>;
  /** Working directory. */
  cwd?: string;
  /** Extra node flags placed before the script (e.g. `["--expose-gc"]`). */
  nodeArgs?: string[];
  /** Data written to stdin, which is then closed (default: stdin is ignored). */
  stdin?: string | Uint8Array;
  /** Resource limits set before node starts (see {@link ProcessLimits}). */
  limits?: ProcessLimits;
  /**
   * Run inside this network namespace (`ip netns exec <netns> …`, which keeps the pid; root only):
   * a namespace made by `createNamespace` or `createStarTopology`.
   */
  netns?: string;
  /**
   * Keep stdin open as a pipe (`handle.child.stdin`) instead of ignoring it; the child sees EOF
   * when this process dies, whatever killed it. Not with `stdin`.
   */
  openStdin?: boolean;
}

/**
 * Resource limits of a spawned process, set with `ulimit` in a `sh` that then `exec`s node (so
 * the pid is node's): what a server meets on a small host.
 */
export interface ProcessLimits {
  /** Open descriptors (`ulimit -n`, soft and hard): for idle floods at a lowered fd limit. */
  nofile?: number;
  /** Address space in bytes (`ulimit -v`): allocation failures surface as RangeError / OOM. */
  addressSpaceBytes?: number;
}

/** `opts` with an open-descriptor limit of `nofile` (`ulimit -n`) for {@link spawnBin}. */
export function withFdLimit(nofile: number, opts: SpawnBinOptions = {}): SpawnBinOptions {
  return { ...opts, limits: { ...opts.limits, nofile } };
}

function limitedCommand(argv: string[], limits: ProcessLimits): [string, string[]] {
  const sets: string[] = [];
  if (limits.nofile !== undefined) {
    if (!Number.isInteger(limits.nofile) || limits.nofile < 8 || limits.nofile > 1 << 20) {
      throw new TestingError(
        TestingErrorCode.BAD_OPTION,
        `option limits.nofile ${limits.nofile} must be an integer in [8, 2^20]`,
      );
    }
    sets.push(`ulimit -n ${limits.nofile}`);
  }
  if (limits.addressSpaceBytes !== undefined) {
    const kib = Math.floor(limits.addressSpaceBytes / 1024);
    if (!Number.isInteger(limits.addressSpaceBytes) || kib < 65536) {
      throw new TestingError(
        TestingErrorCode.BAD_OPTION,
        `option limits.addressSpaceBytes ${limits.addressSpaceBytes} must be an integer >= 64 MiB`,
      );
    }
    sets.push(`ulimit -v ${kib}`);
  }
  if (sets.length === 0) return [argv[0]!, argv.slice(1)];
  return ["/bin/sh", ["-c", `${sets.join(" && ")} && exec "$@"`, "sh", ...argv]];
}

/** How a spawned process ended. */
export interface ExitInfo {
  /** Exit code, null when a signal ended the process. */
  code: number | null;
  /** The signal that ended the process, null when it exited. */
  signal: NodeJS.Signals | null;
}

/** A running child process started by {@link spawnBin}. */
export interface ChildHandle {
  /** The underlying child process. */
  readonly child: ChildProcess;
  readonly pid: number;
  /** Every line so far, both streams, in arrival order. */
  readonly lines: OutputLine[];
  /** The parsed JSON objects among {@link ChildHandle.lines} (pino logs), in order. */
  readonly json: Record<string, unknown>[];
  /** The line that matched `ready`. */
  readonly readyLine: OutputLine;
  /** Settles when the process has exited. */
  readonly exited: Promise<ExitInfo>;
  /** Resolves with the first line (already seen or future) matching `pred`; rejects on exit or timeout. */
  waitFor(pred: (line: OutputLine) => boolean, timeoutMs?: number): Promise<OutputLine>;
  /** Sends `signal` (default SIGTERM) and waits for the exit. */
  kill(signal?: NodeJS.Signals): Promise<ExitInfo>;
  /** All output as text, for assertion messages. */
  output(): string;
}

const children = new Set<ChildHandleImpl>();
let exitHookInstalled = false;

/** Children still running when the test process exits are killed (installed on first spawn). */
function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.once("exit", () => {
    for (const c of children) c.child.kill("SIGKILL");
  });
}

const defaultReady = (l: OutputLine): boolean => l.json?.msg === "listening";

class ChildHandleImpl implements ChildHandle {
  readonly lines: OutputLine[] = [];
  readonly json: Record<string, unknown>[] = [];
  readyLine!: OutputLine;
  readonly exited: Promise<ExitInfo>;
  exitInfo: ExitInfo | undefined;
  private readonly waiters = new Set<{ pred: (l: OutputLine) => boolean; resolve(l: OutputLine): void }>();

  constructor(readonly child: ChildProcess) {
    this.exited = new Promise((resolve) => {
      child.once("exit", (code, signal) => {
        this.exitInfo = { code, signal };
        children.delete(this);
        resolve(this.exitInfo);
      });
      child.once("error", () => {
        // spawn failure: no 'exit' follows
        if (this.exitInfo === undefined) {
          this.exitInfo = { code: null, signal: null };
          children.delete(this);
          resolve(this.exitInfo);
        }
      });
    });
    for (const stream of ["stdout", "stderr"] as const) {
      const s = child[stream];
      if (s === null) continue;
      createInterface({ input: s, crlfDelay: Number.POSITIVE_INFINITY }).on("line", (text) =>
        this.push(stream, text),
      );
    }
  }

  get pid(): number {
    return this.child.pid ?? -1;
  }

  private push(stream: "stdout" | "stderr", text: string): void {
    let json: Record<string, unknown> | undefined;
    if (text.startsWith("{")) {
      try {
        const v: unknown = JSON.parse(text);
        if (typeof v === "object" && v !== null && !Array.isArray(v)) json = v as Record<string, unknown>;
      } catch {
        // not JSON: kept as text only
      }
    }
    const line: OutputLine = { stream, text, json };
    this.lines.push(line);
    if (json !== undefined) this.json.push(json);
    for (const w of [...this.waiters]) {
      if (w.pred(line)) {
        this.waiters.delete(w);
        w.resolve(line);
      }
    }
  }

  output(): string {
    return this.lines.map((l) => `[${l.stream}] ${l.text}`).join("\n");
  }

  waitFor(pred: (line: OutputLine) => boolean, timeoutMs = 20_000): Promise<OutputLine> {
    const seen = this.lines.find(pred);
    if (seen !== undefined) return Promise.resolve(seen);
    // created here so the stack names the waiting test
    const timeoutErr = new TestingError(TestingErrorCode.TIMEOUT, `no matching line within ${timeoutMs} ms`);
    return new Promise((resolve, reject) => {
      const w = {
        pred,
        resolve: (l: OutputLine) => {
          clearTimeout(timer);
          resolve(l);
        },
      };
      const timer = setTimeout(() => {
        this.waiters.delete(w);
        timeoutErr.message += `; output so far:\n${this.output()}`;
        reject(timeoutErr);
      }, timeoutMs);
      timer.unref();
      this.waiters.add(w);
      void this.exited.then((info) => {
        if (!this.waiters.delete(w)) return;
        clearTimeout(timer);
        reject(
          new TestingError(
            TestingErrorCode.SPAWN,
            `process ${this.pid} exited (code ${info.code}, signal ${info.signal}) before a matching line; output:\n${this.output()}`,
          ),
        );
      });
    });
  }

  kill(signal: NodeJS.Signals = "SIGTERM"): Promise<ExitInfo> {
    if (this.exitInfo === undefined) this.child.kill(signal);
    return this.exited;
  }
}

/**
 * Spawns `node [nodeArgs] <binPath> ...args` (stdin ignored unless given), collects stdout and
 * stderr line by line, parses JSON lines (pino logs), and resolves once a line matches `ready`
 * (default: a JSON line with `msg: "listening"`). Every child is tracked: {@link killAllChildren}
 * kills the remaining ones (call it in `afterEach`/`afterAll`), and any left at process exit get
 * SIGKILL.
 *
 * @throws TestingError `TESTING_SPAWN` if the process exits first, `TESTING_TIMEOUT` after
 *   `timeoutMs` (the child is killed in both cases); messages include the output so far.
 */
export async function spawnBin(
  binPath: string,
  args: readonly string[] = [],
  opts: SpawnBinOptions = {},
): Promise<ChildHandle> {
  if (typeof binPath !== "string" || binPath === "") {
    throw new TestingError(TestingErrorCode.BAD_OPTION, "binPath must be a non-empty string");
  }
  const timeoutMs = opts.timeoutMs ?? 20_000;
  if (!(Number.isFinite(timeoutMs) && timeoutMs > 0)) {
    throw new TestingError(TestingErrorCode.BAD_OPTION, `option timeoutMs ${timeoutMs} must be > 0`);
  }
  if (opts.openStdin === true && opts.stdin !== undefined) {
    throw new TestingError(TestingErrorCode.BAD_OPTION, "options stdin and openStdin exclude each other");
  }
  if (opts.netns !== undefined && (typeof opts.netns !== "string" || !/^[\w.-]+$/.test(opts.netns))) {
    throw new TestingError(
      TestingErrorCode.BAD_OPTION,
      `option netns ${JSON.stringify(opts.netns)} is not a namespace name`,
    );
  }
  installExitHook();
  const node = [process.execPath, ...(opts.nodeArgs ?? []), binPath, ...args];
  const [cmd0, argv0] = limitedCommand(node, opts.limits ?? {});
  const [cmd, argv] =
    opts.netns === undefined ? [cmd0, argv0] : ["ip", ["netns", "exec", opts.netns, cmd0, ...argv0]];
  const child = spawn(cmd, argv, {
    stdio: [opts.stdin === undefined && opts.openStdin !== true ? "ignore" : "pipe", "pipe", "pipe"],
    env: { ...process.env, ...opts.env },
    ...(opts.cwd === undefined ? {} : { cwd: opts.cwd }),
  });
  const handle = new ChildHandleImpl(child);
  children.add(handle);
  if (opts.stdin !== undefined && child.stdin !== null) child.stdin.end(opts.stdin);
  try {
    handle.readyLine = await handle.waitFor(opts.ready ?? defaultReady, timeoutMs);
  } catch (err) {
    await handle.kill("SIGKILL");
    throw err;
  }
  return handle;
}

/** Kills (SIGKILL) every child started by {@link spawnBin} that is still running and waits for them. */
export async function killAllChildren(): Promise<void> {
  await Promise.all([...children].map((c) => c.kill("SIGKILL")));
}
