import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

export const PRODUCER_BIN = fileURLToPath(new URL("../../dist/bin/producer.js", import.meta.url));

export interface ProducerProc {
  child: ChildProcess;
  control: string;
  data: string;
  compatibilityHash: string;
  lines: Record<string, unknown>[];
  /** Resolves with the exit code/signal. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  kill(signal?: NodeJS.Signals): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

const live = new Set<ChildProcess>();
process.on("exit", () => {
  for (const c of live) c.kill("SIGKILL");
});

/** A unique unix socket path (short enough for sun_path). */
export function socketPath(tag: string): string {
  return join(tmpdir(), `ec-${tag}-${process.pid}-${randomBytes(4).toString("hex")}.sock`);
}

/** Spawns `tapwire-ec-producer` (or another script) and waits for its "listening" JSON line. */
export async function spawnProducer(
  args: string[],
  script = PRODUCER_BIN,
  timeoutMs = 20_000,
): Promise<ProducerProc> {
  const child = spawn(process.execPath, [script, ...args], { stdio: ["ignore", "pipe", "pipe"] });
  live.add(child);
  const lines: Record<string, unknown>[] = [];
  let stderr = "";
  child.stderr!.on("data", (d: Buffer) => {
    stderr += d.toString();
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    child.on("exit", (code, signal) => {
      live.delete(child);
      resolve({ code, signal });
    });
  });
  const listening = new Promise<Record<string, unknown>>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`no "listening" line in ${timeoutMs} ms; stderr: ${stderr}`)),
      timeoutMs,
    );
    createInterface({ input: child.stdout! }).on("line", (line) => {
      let obj: Record<string, unknown>;
      try {
        obj = JSON.parse(line) as Record<string, unknown>;
      } catch {
        return;
      }
      lines.push(obj);
      if (obj["msg"] === "listening") {
        clearTimeout(timer);
        resolve(obj);
      }
    });
    void exited.then((e) => {
      clearTimeout(timer);
      reject(new Error(`exited ${JSON.stringify(e)} before listening; stderr: ${stderr}`));
    });
  });
  const l = await listening;
  return {
    child,
    control: String(l["control"]),
    data: String(l["data"]),
    compatibilityHash: String(l["compatibilityHash"]),
    lines,
    exited,
    async kill(signal: NodeJS.Signals = "SIGTERM") {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      return exited;
    },
  };
}

/** Polls `fn` on the event loop until it returns a value other than undefined (or throws after timeoutMs). */
export async function until<T>(
  fn: () => T | undefined | Promise<T | undefined>,
  timeoutMs = 20_000,
  what = "condition",
): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}
