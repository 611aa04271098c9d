// The worker bin as the harness finds it (apps/harness/src/procs.ts): resolved through the
// installed @tapwire/worker package and its package.json `bin`, not a relative dist path.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";

const require = createRequire(import.meta.url);

/** Absolute path of bin `name` of the installed package `pkg`. */
export function binPath(pkg: string, name: string): string {
  const pj = require.resolve(`${pkg}/package.json`);
  const meta = JSON.parse(readFileSync(pj, "utf8")) as { bin?: string | Record<string, string> };
  const rel = typeof meta.bin === "string" ? meta.bin : meta.bin?.[name];
  if (!rel) throw new Error(`${pkg} has no bin "${name}"`);
  return join(dirname(pj), rel);
}

/** `tapwire-worker` of @tapwire/worker. */
export const WORKER_BIN = binPath("@tapwire/worker", "tapwire-worker");
