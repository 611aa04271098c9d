// waitReady(ms) in a script with nothing else to do (issue 15): it resolves false after ms
// (its timer holds the event loop; the client's other timers do not), and the client prints
// nothing without a logger. Run in a child process, where an unsettled top-level await would
// end the process with code 13 and no output.
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { expect, test } from "vitest";

const SRC = fileURLToPath(new URL("../src/index.ts", import.meta.url));

test("waitReady(ms) resolves false after ms in a child process that has nothing else to do; no log output", () => {
  const dir = mkdtempSync(join(tmpdir(), "twc-wait-"));
  const file = join(dir, "wait.mts");
  // nothing listens on the socket path: every connect fails at once, the backoff is a minute
  writeFileSync(
    file,
    `import { RemoteDraftClient } from ${JSON.stringify(SRC)};
const client = new RemoteDraftClient({
  endpoint: "unix://${join(dir, "nobody.sock")}",
  drafterIdentity: new Uint8Array(32),
  markovIdentity: new Uint8Array(32),
  window: 8, numSpec: 4, numTaps: 1, hidden: 8, vocabSize: 1000, maxSlots: 4, maxRowsPerStep: 32,
  backoffMs: 60_000, backoffMaxMs: 60_000,
});
const t0 = performance.now();
const ok = await client.waitReady(300);
process.stdout.write(\`waited \${ok} \${performance.now() - t0 >= 290} \${client.snapshot().counters.connect_failures}\\n\`);
await client.close();
`,
  );
  try {
    const r = spawnSync(process.execPath, ["--import", "tsx", file], {
      encoding: "utf8",
      timeout: 60_000,
      cwd: fileURLToPath(new URL("..", import.meta.url)),
    });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toBe("waited false true 1\n");
    // silent by default: the connect failure is counted, not logged
    expect(r.stderr).toBe("");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
