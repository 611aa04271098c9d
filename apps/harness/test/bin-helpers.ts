/** Runs the harness bin as a real child process, line by line, for the operational tests. */
import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import type { Report } from "../src/report/report.js";

export const BIN = join(import.meta.dirname, "..", "dist", "bin", "harness.js");
export const ROOT = join(import.meta.dirname, "..", "..", "..");

export interface BinRun {
  child: ChildProcess;
  stdout: string[];
  stderr: string[];
  /** Resolves with the first stderr line matching `re` (seen or future); rejects after `ms` or on exit. */
  waitFor(re: RegExp, ms?: number): Promise<RegExpExecArray>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

export function startBin(args: string[], env: Record<string, string> = {}): BinRun {
  const child = spawn(process.execPath, [BIN, ...args], {
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const stdout: string[] = [];
  const stderr: string[] = [];
  const waiters = new Set<() => void>();
  createInterface({ input: child.stdout! }).on("line", (l) => stdout.push(l));
  createInterface({ input: child.stderr! }).on("line", (l) => {
    stderr.push(l);
    for (const w of [...waiters]) w();
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once("exit", (code, signal) => resolve({ code, signal })),
  );
  const waitFor = (re: RegExp, ms = 60_000) =>
    new Promise<RegExpExecArray>((resolve, reject) => {
      const check = () => {
        for (const l of stderr) {
          const m = re.exec(l);
          if (m) {
            waiters.delete(check);
            clearTimeout(timer);
            resolve(m);
            return;
          }
        }
      };
      const timer = setTimeout(() => {
        waiters.delete(check);
        reject(new Error(`no stderr line matching ${re} within ${ms} ms:\n${stderr.join("\n")}`));
      }, ms);
      waiters.add(check);
      void exited.then(() => {
        // lines may still be buffered in readline: give them a turn
        setTimeout(() => {
          if (!waiters.has(check)) return;
          check();
          if (!waiters.has(check)) return;
          waiters.delete(check);
          clearTimeout(timer);
          reject(new Error(`exited before a stderr line matching ${re}:\n${stderr.join("\n")}`));
        }, 50);
      });
      check();
    });
  return { child, stdout, stderr, waitFor, exited };
}

export function readReport(path: string): Report {
  return JSON.parse(readFileSync(path, "utf8")) as Report;
}

/** Small rows keep the suite quick on two busy cores; the protocol is the same at 3 x 4096. */
export const SMALL = ["--row", "2x512", "--seed", "5", "--progress", "lines"];
