/**
 * Issue 19: children die with their parent. SIGKILL of the harness (nothing of it runs after)
 * must not leave its worker and encoder running and holding their ports: they were started with
 * `--exit-with-parent` and a stdin pipe, and exit when it ends. The temp dir the killed run
 * could not remove is removed by the next harness to start (it is marked with its owner's pid).
 */
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isAlive, waitUntil } from "@tapwire/testing";
import { afterAll, describe, expect, test } from "vitest";
import { type BinRun, SMALL, startBin } from "./bin-helpers.js";

// A TMPDIR of this test's own: the run dirs it looks at are only the harness runs it started.
const base = mkdtempSync(join(tmpdir(), "tapwire-orphans-"));
const runs: BinRun[] = [];
const pids: number[] = [];
afterAll(() => {
  for (const r of runs) if (r.child.exitCode === null) r.child.kill("SIGKILL");
  for (const p of pids) if (isAlive(p)) process.kill(p, "SIGKILL");
  rmSync(base, { recursive: true, force: true });
});

function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once("error", () => resolve(false));
    s.listen(port, "127.0.0.1", () => s.close(() => resolve(true)));
  });
}

const runDirs = () => readdirSync(base).filter((n) => n.startsWith("tapwire-harness-"));

describe("SIGKILL of the harness (issue 19)", () => {
  test("its worker and encoder exit and free their ports; the next start removes its temp dir", async () => {
    const run = startBin([...SMALL, "--requests", "400", "--rate", "20", "--mm-share", "0.5"], {
      TMPDIR: base,
    });
    runs.push(run);
    const w = await run.waitFor(/^\[harness\] worker pid (\d+) listening on tcp:\/\/127\.0\.0\.1:(\d+)/);
    const e = await run.waitFor(/^\[harness\] encoder pid (\d+) listening on tcp:\/\/127\.0\.0\.1:(\d+)/);
    await run.waitFor(/^\[harness\] decoding \d+ requests/);
    const worker = Number(w[1]);
    const encoder = Number(e[1]);
    pids.push(worker, encoder);
    const ports = [Number(w[2]), Number(e[2])];
    for (const port of ports) expect(await portFree(port)).toBe(false);
    const [dir] = runDirs();
    expect(dir).toBeDefined();
    const owner = JSON.parse(readFileSync(join(base, dir!, "owner.json"), "utf8")) as { pid: number };
    expect(owner.pid).toBe(run.child.pid);

    run.child.kill("SIGKILL");
    await run.exited;
    await waitUntil(() => !isAlive(worker) && !isAlive(encoder), {
      timeoutMs: 30_000,
      what: `worker ${worker} and encoder ${encoder} to exit after the harness's SIGKILL`,
    });
    for (const port of ports) expect(await portFree(port), `port ${port}`).toBe(true);
    // SIGKILL ran no cleanup: the dir is still there until the next start
    expect(existsSync(join(base, dir!))).toBe(true);

    const next = startBin([...SMALL, "--requests", "2", "--rate", "50"], { TMPDIR: base });
    runs.push(next);
    await next.waitFor(new RegExp(`^\\[harness\\] removed the temp dir of a dead run: .*${dir}`));
    expect(existsSync(join(base, dir!))).toBe(false);
    const { code } = await next.exited;
    expect(code).toBe(0);
    // and the finished run removed its own
    expect(runDirs()).toEqual([]);
  }, 180_000);
});
