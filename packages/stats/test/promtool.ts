import { spawnSync } from "node:child_process";

/**
 * Runs the real `promtool check metrics` (Debian package `prometheus`) on an exposition. Throws
 * when promtool is missing: a test that needs it must fail, not skip (`.ci/run` installs it).
 */
export function promtoolCheck(text: string): { status: number; output: string } {
  const r = spawnSync("promtool", ["check", "metrics"], { input: text, encoding: "utf8", timeout: 30_000 });
  if (r.error) {
    throw new Error(`promtool did not run (${r.error.message}); install it: apt-get install -y prometheus`);
  }
  return { status: r.status ?? -1, output: `${r.stdout}${r.stderr}`.trim() };
}
