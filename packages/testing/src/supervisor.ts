import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { TestingError, TestingErrorCode } from "./errors.js";
import { isAlive, waitUntil } from "./proc.js";

/** One bin the supervisor starts: `node bin ...args`. */
export interface SupervisedSpec {
  /** Path of the bin's JavaScript file. */
  bin: string;
  /** Its arguments. */
  args: readonly string[];
}

/** One child of the supervisor, once it logged its `"msg":"listening"` line. */
export interface SupervisedChild {
  /** Its pid (a grandchild of the test). */
  pid: number;
  /** Its parsed `listening` line. */
  listening: Record<string, unknown>;
  /** The file its stdout and stderr go to (not a pipe to the supervisor: its death must not EPIPE them). */
  logFile: string;
}

/** What {@link startSupervisor} returns. */
export interface Supervisor {
  /** The supervisor process (SIGKILL it to orphan the children). */
  proc: ChildProcess;
  /** Its children, in the order of the specs. */
  children: SupervisedChild[];
  /** The lines a child logged so far, parsed (non-JSON lines skipped). */
  linesOf(child: SupervisedChild): Record<string, unknown>[];
  /** SIGKILLs whatever is still alive (supervisor and children) and removes the log folder. */
  cleanup(): void;
}

// The supervisor: starts each bin with stdin a pipe it never writes nor closes (the
// `--exit-with-parent` contract of the tapwire bins) and stdout/stderr to a file, then idles.
const SUPERVISOR = `
const { spawn } = require("node:child_process");
const fs = require("node:fs");
const specs = JSON.parse(process.argv[1]);
const pids = specs.map((s) => {
  const fd = fs.openSync(s.logFile, "a");
  const c = spawn(process.execPath, [s.bin, ...s.args], { stdio: ["pipe", fd, fd] });
  fs.closeSync(fd);
  return c.pid;
});
process.stdout.write(JSON.stringify(pids) + "\\n");
setInterval(() => {}, 1 << 30);
`;

/**
 * Starts a small supervisor process that starts `specs` the way a supervisor asking for
 * `--exit-with-parent` does (stdin a pipe it holds open), and waits (bounded by `timeoutMs`) for
 * every child's `listening` line. For tests that kill the supervisor and check the children go.
 * @throws {TestingError} `TESTING_TIMEOUT` when a child does not listen in time (its log in the message).
 */
export async function startSupervisor(
  specs: readonly SupervisedSpec[],
  opts: { timeoutMs?: number } = {},
): Promise<Supervisor> {
  const dir = mkdtempSync(join(tmpdir(), "tapwire-supervisor-"));
  const files = specs.map((_, i) => join(dir, `child-${i}.log`));
  const proc = spawn(
    process.execPath,
    ["-e", SUPERVISOR, JSON.stringify(specs.map((s, i) => ({ ...s, logFile: files[i] })))],
    { stdio: ["ignore", "pipe", "inherit"] },
  );
  let pids: number[] = [];
  const cleanup = () => {
    for (const pid of [proc.pid, ...pids]) {
      if (pid !== undefined && isAlive(pid)) {
        try {
          process.kill(pid, "SIGKILL");
        } catch {
          // gone meanwhile
        }
      }
    }
    rmSync(dir, { recursive: true, force: true });
  };
  const read = (f: string) => {
    try {
      return readFileSync(f, "utf8");
    } catch {
      return "";
    }
  };
  const linesOf = (file: string) =>
    read(file)
      .split("\n")
      .flatMap((l) => {
        try {
          return [JSON.parse(l) as Record<string, unknown>];
        } catch {
          return [];
        }
      });
  try {
    let out = "";
    proc.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
    });
    await waitUntil(() => out.includes("\n") || proc.exitCode !== null, {
      timeoutMs: opts.timeoutMs ?? 30_000,
      what: "the supervisor to start its children",
    });
    if (proc.exitCode !== null) {
      throw new TestingError(TestingErrorCode.TIMEOUT, `the supervisor exited ${proc.exitCode}`);
    }
    pids = JSON.parse(out.split("\n")[0]!) as number[];
    const listening = (f: string) => linesOf(f).find((j) => j.msg === "listening");
    await waitUntil(() => files.every((f) => listening(f) !== undefined || !pids.every(isAlive)), {
      timeoutMs: opts.timeoutMs ?? 30_000,
      what: `listening lines in ${files.join(", ")}`,
    }).catch((e: unknown) => {
      throw new TestingError(
        TestingErrorCode.TIMEOUT,
        `${(e as Error).message}: ${files.map((f) => read(f).slice(-800)).join(" | ")}`,
      );
    });
    const children = files.map((f, i) => {
      const l = listening(f);
      if (l === undefined) {
        throw new TestingError(TestingErrorCode.TIMEOUT, `child ${i} exited before listening: ${read(f)}`);
      }
      return { pid: pids[i]!, listening: l, logFile: f };
    });
    return { proc, children, linesOf: (c) => linesOf(c.logFile), cleanup };
  } catch (e) {
    cleanup();
    throw e;
  }
}
