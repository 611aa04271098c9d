import type { ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import type { ChildHandle } from "@tapwire/testing";
import { spawnBin, uniqueSocketPath } from "@tapwire/testing";

export const PRODUCER_BIN = fileURLToPath(new URL("../../dist/bin/producer.js", import.meta.url));

export interface ProducerProc {
  handle: ChildHandle;
  child: ChildProcess;
  control: string;
  /** The admin socket (EC-CONTRACT 9.3). */
  admin: string;
  data: string;
  compatibilityHash: string;
  kill(signal?: NodeJS.Signals): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/** A unique unix socket path (short enough for sun_path). */
export function socketPath(tag: string): string {
  return uniqueSocketPath(`ec-${tag}`);
}

/** Spawns `tapwire-ec-producer` (or another script) with @tapwire/testing's spawnBin and reads its "listening" line. */
export async function spawnProducer(args: string[], script = PRODUCER_BIN): Promise<ProducerProc> {
  const handle = await spawnBin(script, args);
  const l = handle.readyLine.json ?? {};
  return {
    handle,
    child: handle.child,
    control: String(l["control"]),
    admin: String(l["admin"]),
    data: String(l["data"]),
    compatibilityHash: String(l["compatibilityHash"]),
    async kill(signal: NodeJS.Signals = "SIGTERM") {
      const e = await handle.kill(signal);
      return { code: e.code, signal: e.signal };
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
