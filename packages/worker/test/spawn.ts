import { type ChildProcess, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

export const BIN = join(dirname(fileURLToPath(import.meta.url)), "..", "dist", "bin", "worker.js");

export interface Child {
  proc: ChildProcess;
  lines: Record<string, unknown>[];
  listening: Record<string, unknown>;
  exit: Promise<number | null>;
}

/** Children spawned by a test; the test file kills leftovers after each test. */
export const children: ChildProcess[] = [];

/** Spawns the built bin and waits for its pino "listening" line. */
export async function spawnWorker(args: string[], env: NodeJS.ProcessEnv = {}): Promise<Child> {
  if (!existsSync(BIN)) throw new Error(`${BIN} missing: run pnpm --filter @tapwire/worker build first`);
  const proc = spawn(process.execPath, [BIN, ...args], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, ...env },
  });
  children.push(proc);
  const exit = new Promise<number | null>((resolve) => proc.on("exit", (code) => resolve(code)));
  const lines: Record<string, unknown>[] = [];
  let stderr = "";
  proc.stderr!.on("data", (b: Buffer) => {
    stderr += b.toString();
  });
  const listening = await new Promise<Record<string, unknown>>((resolve, reject) => {
    const rl = createInterface({ input: proc.stdout! });
    rl.on("line", (l) => {
      let j: Record<string, unknown>;
      try {
        j = JSON.parse(l);
      } catch {
        return;
      }
      lines.push(j);
      if (j.msg === "listening") resolve(j);
    });
    void exit.then((code) => reject(new Error(`worker exited ${code} before listening: ${stderr}`)));
  });
  return { proc, lines, listening, exit };
}
