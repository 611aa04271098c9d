// Issue 20, the unshared tax: one session alone on a shared worker (K = 4) must cost no more than
// on an unshared one (K = 1). The allocations per STEP are a cost a loaded machine cannot hide
// (the collector's work, and cache lines): measured in a child whose optimising compiler runs
// synchronously and whose young generation holds a whole trial (test/shared-alloc-probe.mjs),
// the best of several trials counts. Before the shared path stopped allocating closure contexts,
// a Set's tables, a drafter output and histogram observations per call, K = 4 took 700-870 bytes
// per STEP more than K = 1; now 140-240.
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { describe, expect, test } from "vitest";

describe("issue 20: the shared path allocates what the unshared one does", () => {
  test("heap bytes per STEP of a lone session, K = 4 against K = 1", () => {
    const probe = fileURLToPath(new URL("./shared-alloc-probe.mjs", import.meta.url));
    const r = spawnSync(
      process.execPath,
      ["--expose-gc", "--no-concurrent-recompilation", "--min-semi-space-size=64", probe],
      { encoding: "utf8", timeout: 120_000 },
    );
    expect(r.status, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout.trim()) as { unshared: number; shared: number };
    expect(out.unshared).toBeGreaterThan(0);
    expect(out.shared - out.unshared).toBeLessThan(400);
  });
});
