/**
 * Child processes of the harness (the drafter worker and the encoder): spawned from their
 * packages' bins, ready once they print their pino `"listening"` line, killed and restarted on
 * demand by the fault schedule.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { HarnessError, HarnessErrorCode } from "../errors.js";

const require = createRequire(import.meta.url);

// Children never outlive the harness, whatever ends it: on exit they are killed here; on SIGKILL
// of the harness they see their stdin pipe end (`exitWithParent`, issue 19) and exit themselves.
const live = new Set<ChildProcess>();
process.once("exit", () => {
  for (const c of live) c.kill("SIGKILL");
});

/** Set by {@link stopAllChildren}: the exits that follow were asked for. */
let stoppingAll = false;

/** Child processes running now (for the harness's signal handler). */
export function liveChildren(): number {
  return live.size;
}

/**
 * Stops every running child: SIGTERM, then SIGKILL for those still running after `graceMs`, and
 * resolves once each has exited (been reaped), so none outlives the caller. Bounded: gives up
 * waiting `graceMs + 2000` ms after the SIGKILL.
 */
export async function stopAllChildren(graceMs = 2000): Promise<void> {
  stoppingAll = true;
  const children = [...live];
  if (children.length === 0) return;
  const exited = children.map(
    (c) =>
      new Promise<void>((resolve) => {
        if (c.exitCode !== null || c.signalCode !== null) resolve();
        else c.once("exit", () => resolve());
      }),
  );
  for (const c of children) c.kill(graceMs > 0 ? "SIGTERM" : "SIGKILL");
  const all = Promise.all(exited);
  const timeout = (ms: number) => new Promise<"timeout">((r) => setTimeout(() => r("timeout"), ms).unref());
  if (graceMs > 0 && (await Promise.race([all, timeout(graceMs)])) === "timeout") {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  }
  await Promise.race([all, timeout(2000)]);
}

/** How a child process ended. */
export interface ChildExit {
  /** The service ("worker", "encoder"). */
  name: string;
  pid: number;
  /** Exit code, null when a signal ended it. */
  code: number | null;
  /** The signal that ended it, null when it exited. */
  signal: NodeJS.Signals | null;
  /** When, ms since the epoch (the report turns it into ms since the run started). */
  atEpochMs: number;
  /** False when nobody asked for it: no kill() of the harness (not a `--faults` action, not the end). */
  expected: boolean;
}

/** Absolute path of bin `name` of workspace package `pkg` (from its package.json `bin`). */
export function binPath(pkg: string, name: string): string {
  let pj: string;
  try {
    pj = require.resolve(`${pkg}/package.json`);
  } catch (e) {
    throw new HarnessError(HarnessErrorCode.PROCESS, `${pkg} is not installed (run pnpm install)`, {
      cause: e,
    });
  }
  const meta = JSON.parse(readFileSync(pj, "utf8")) as { bin?: string | Record<string, string> };
  const rel = typeof meta.bin === "string" ? meta.bin : meta.bin?.[name];
  if (!rel) throw new HarnessError(HarnessErrorCode.PROCESS, `${pkg} has no bin "${name}"`);
  return join(dirname(pj), rel);
}

/** Options of {@link ChildService}. */
export interface ChildOptions {
  /** Name used in logs and errors ("worker", "encoder"). */
  name: string;
  /** The JS file to run with node. */
  script: string;
  /** Arguments (without the script). */
  args: string[];
  /** ms to wait for the listening line (default 20000). */
  readyTimeoutMs?: number;
  /** Where the child's stderr and non-JSON stdout go (default: dropped). */
  log?: (line: string) => void;
  /**
   * Start it with `--exit-with-parent` and stdin a pipe this process holds (issue 19): the child
   * exits when the harness dies, whatever signal killed it (SIGKILL included). Only for bins
   * whose `--help` lists the flag.
   */
  exitWithParent?: boolean;
  /** Environment added to the harness's own (e.g. `TAPWIRE_DRAFTER_ONNX`). */
  env?: Record<string, string>;
  /** Run inside this network namespace (`ip netns exec`, same pid; `--topology netns`). */
  netns?: string;
}

/** A parsed pino line: every JSON object the child prints on stdout. */
export type LogLine = Record<string, unknown>;

/**
 * One child service. `start()` resolves with the listening line (its `endpoints` etc.);
 * `kill()` and `start()` again restart it with the same arguments.
 */
export class ChildService {
  private child: ChildProcess | null = null;
  private exited: Promise<number | null> = Promise.resolve(null);
  private expectedExit = false;
  /** Starts of the service so far. */
  starts = 0;
  /** Exits nobody asked for. */
  unexpectedExits = 0;
  /** Every exit of the service's processes so far, in order. */
  readonly exits: ChildExit[] = [];
  /** Pids of every process started so far, in order. */
  readonly pids: number[] = [];
  /** Called on each exit nobody asked for (a crash, an outside kill). */
  onUnexpectedExit: ((e: ChildExit) => void) | null = null;
  /** Last listening line. */
  listening: LogLine | null = null;
  /** Called with each JSON line the child prints (after the listening one too). */
  onLine: ((l: LogLine) => void) | null = null;

  constructor(private opts: ChildOptions) {}

  /** Replaces the arguments used by the next start (e.g. to pin a port chosen by the first start). */
  setArgs(args: string[]): void {
    this.opts = { ...this.opts, args };
  }

  /** The JS file the service runs. */
  get script(): string {
    return this.opts.script;
  }

  /** The arguments of the next start. */
  get args(): readonly string[] {
    return this.opts.args;
  }

  /** True while the process runs. */
  get running(): boolean {
    return this.child !== null;
  }

  /** The pid of the running process, or null. */
  get pid(): number | null {
    return this.child?.pid ?? null;
  }

  /** Spawns the process and waits for its `"listening"` log line. */
  start(): Promise<LogLine> {
    if (this.child)
      return Promise.reject(new HarnessError(HarnessErrorCode.PROCESS, `${this.opts.name} already running`));
    const { name, script, args } = this.opts;
    const parentPipe = this.opts.exitWithParent === true;
    const argv = [process.execPath, script, ...args, ...(parentPipe ? ["--exit-with-parent"] : [])];
    const [cmd, ...rest] =
      this.opts.netns === undefined ? argv : ["ip", "netns", "exec", this.opts.netns, ...argv];
    const child = spawn(cmd!, rest, {
      // the stdin pipe is never closed (written only by send(), to a child that reads it): its end is the harness's death (issue 19);
      // `ip netns exec` execs the bin, which keeps the pipe as its stdin
      stdio: [parentPipe ? "pipe" : "ignore", "pipe", "pipe"],
      ...(this.opts.env !== undefined ? { env: { ...process.env, ...this.opts.env } } : {}),
    });
    // an EPIPE on a pipe nobody writes is not the harness's concern
    child.stdin?.on("error", () => {});
    this.child = child;
    live.add(child);
    this.expectedExit = false;
    this.starts++;
    if (child.pid !== undefined) this.pids.push(child.pid);
    const log = this.opts.log;
    const tail: string[] = [];
    const remember = (line: string) => {
      tail.push(line);
      if (tail.length > 20) tail.shift();
    };
    createInterface({ input: child.stderr! }).on("line", (l) => {
      remember(l);
      log?.(`[${name}] ${l}`);
    });
    this.exited = new Promise((resolve) => {
      child.once("exit", (code, signal) => {
        live.delete(child);
        if (this.child === child) this.child = null;
        const exit: ChildExit = {
          name,
          pid: child.pid ?? -1,
          code,
          signal,
          atEpochMs: Date.now(),
          expected: this.expectedExit || stoppingAll,
        };
        this.exits.push(exit);
        if (!exit.expected) {
          this.unexpectedExits++;
          log?.(`[${name}] exited unexpectedly (code ${code}, signal ${signal})`);
          this.onUnexpectedExit?.(exit);
        }
        resolve(code);
      });
    });
    return new Promise<LogLine>((resolve, reject) => {
      let done = false;
      const timer = setTimeout(() => {
        if (done) return;
        done = true;
        this.kill("SIGKILL").catch(() => {});
        reject(
          new HarnessError(
            HarnessErrorCode.PROCESS,
            `${name} did not report listening within ${this.opts.readyTimeoutMs ?? 20000} ms; last output:\n${tail.join("\n")}`,
          ),
        );
      }, this.opts.readyTimeoutMs ?? 20000);
      child.once("error", (e) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        reject(
          new HarnessError(HarnessErrorCode.PROCESS, `${name} failed to spawn: ${e.message}`, { cause: e }),
        );
      });
      child.once("exit", (code, signal) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        reject(
          new HarnessError(
            HarnessErrorCode.PROCESS,
            `${name} exited (code ${code}, signal ${signal}) before listening; last output:\n${tail.join("\n")}`,
          ),
        );
      });
      createInterface({ input: child.stdout! }).on("line", (l) => {
        let obj: LogLine | null = null;
        if (l.startsWith("{")) {
          try {
            obj = JSON.parse(l) as LogLine;
          } catch {
            obj = null;
          }
        }
        if (!obj) {
          remember(l);
          log?.(`[${name}] ${l}`);
          return;
        }
        remember(l);
        if (!done && obj["msg"] === "listening") {
          done = true;
          clearTimeout(timer);
          this.listening = obj;
          resolve(obj);
        }
        this.onLine?.(obj);
        log?.(`[${name}] ${l}`);
      });
    });
  }

  /**
   * Writes one line to the child's stdin pipe (`exitWithParent` children only; issue 21: the
   * engine processes of a multi-instance run read their commands there). False when not running.
   */
  send(line: string): boolean {
    const stdin = this.child?.stdin;
    if (stdin === null || stdin === undefined || !stdin.writable) return false;
    stdin.write(`${line}\n`);
    return true;
  }

  /** Sends `signal` and waits for the exit (SIGKILL after `graceMs` for other signals). */
  async kill(signal: NodeJS.Signals = "SIGTERM", graceMs = 3000): Promise<void> {
    const child = this.child;
    if (!child) return;
    this.expectedExit = true;
    child.kill(signal);
    if (signal !== "SIGKILL") {
      const t = setTimeout(() => child.kill("SIGKILL"), graceMs);
      await this.exited;
      clearTimeout(t);
    } else {
      await this.exited;
    }
  }
}
