// The README example (TypeScript, run through tsx) must run against the built package
// (`pnpm --filter @tapwire/stats build`).
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { expect, test } from "vitest";

test("README example runs and prints the snapshot, the exposition, the metrics URL and the health answers", () => {
  const pkg = fileURLToPath(new URL("..", import.meta.url));
  const readme = readFileSync(join(pkg, "README.md"), "utf8");
  const code = /## Example[\s\S]*?```ts\n([\s\S]*?)```/.exec(readme)?.[1];
  expect(code).toBeDefined();
  const dist = pathToFileURL(join(pkg, "dist/index.js")).href;
  const file = join(mkdtempSync(join(tmpdir(), "stats-readme-")), "example.mts");
  writeFileSync(file, code!.replace(`from "@tapwire/stats"`, `from ${JSON.stringify(dist)}`));
  const r = spawnSync(process.execPath, ["--import", "tsx", file], { encoding: "utf8", cwd: pkg });
  expect(r.stderr).toBe("");
  expect(r.status).toBe(0);
  const lines = r.stdout.split("\n");
  const snap = JSON.parse(lines[0]!) as {
    counters: Record<string, number>;
    gauges: Record<string, number>;
    info: Record<string, string>;
    histograms: Record<string, { count: number; unit: string }>;
  };
  expect(snap.counters).toEqual({ steps: 1000 });
  expect(snap.gauges).toEqual({ inflight: 0 });
  expect(snap.info).toEqual({ disabled_reason: "" });
  expect(snap.histograms.step_rtt?.count).toBe(1000);
  expect(snap.histograms.step_rtt?.unit).toBe("seconds");
  expect(r.stdout).toContain("# TYPE tapwire_client_steps_total counter\ntapwire_client_steps_total 1000\n");
  expect(r.stdout).toContain("# TYPE tapwire_client_step_rtt_seconds histogram\n");
  expect(r.stdout).toContain("tapwire_client_step_rtt_seconds_count 1000\n");
  expect(r.stdout).toContain('tapwire_client_step_rtt_seconds_bucket{le="0.00002"} ');
  expect(r.stdout).toMatch(/metrics on http:\/\/127\.0\.0\.1:\d+\/metrics\n200 503\n200\n$/);
});
