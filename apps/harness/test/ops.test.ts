/**
 * The harness as an operator meets it (issue 15 item 2, issue 13 item 5): signals, exit codes,
 * pre-run checks, usage errors through `pnpm start`, and honest reports when a child dies.
 */
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isAlive } from "@tapwire/testing";
import { afterAll, describe, expect, test } from "vitest";
import { BIN, ROOT, readReport, SMALL, startBin } from "./bin-helpers.js";

const dir = mkdtempSync(join(tmpdir(), "tapwire-harness-ops-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("signals", () => {
  test("SIGTERM ends the harness with 143 after its worker and encoder have exited", async () => {
    const run = startBin([...SMALL, "--requests", "400", "--rate", "20", "--mm-share", "0.5"]);
    const worker = Number((await run.waitFor(/^\[harness\] worker pid (\d+) listening/))[1]);
    const encoder = Number((await run.waitFor(/^\[harness\] encoder pid (\d+) listening/))[1]);
    await run.waitFor(/^\[harness\] decoding \d+ requests/);
    expect(isAlive(worker)).toBe(true);
    expect(isAlive(encoder)).toBe(true);
    run.child.kill("SIGTERM");
    const { code, signal } = await run.exited;
    // checked the moment the harness is gone: no child outlives it, not even by a second
    const survivors = [worker, encoder].filter((p) => isAlive(p));
    expect({ code, signal, survivors }).toEqual({ code: 143, signal: null, survivors: [] });
    expect(run.stderr.join("\n")).toContain("SIGTERM, stopping the child processes");
    expect(run.stdout).toEqual([]);
  });
});

describe("pre-run checks and usage errors", () => {
  test("an unwritable --json path fails before the run with exit 2 and one line", () => {
    mkdirSync(join(dir, "a-folder"));
    for (const [path, why] of [
      [join(dir, "missing", "report.json"), "its folder does not exist"],
      [join(dir, "a-folder"), "is a directory"],
    ] as const) {
      const r = spawnSync(process.execPath, [BIN, "--json", path], { encoding: "utf8", timeout: 30_000 });
      expect(r.status).toBe(2);
      expect(r.stdout).toBe("");
      expect(r.stderr).toBe(`tapwire-harness: --json ${path}: ${why}\n`);
    }
    // a writable path is left as it was found (created and removed by the check)
    const ok = join(dir, "fresh.json");
    const help = spawnSync(process.execPath, [BIN, "--json", ok, "--slots", "0"], { encoding: "utf8" });
    expect(help.status).toBe(2);
    expect(existsSync(ok)).toBe(false);
  });

  test("a bad --metrics-listen is a usage error naming the flag", () => {
    const r = spawnSync(process.execPath, [BIN, "--metrics-listen", "http://0.0.0.0:9464"], {
      encoding: "utf8",
    });
    expect(r.status).toBe(2);
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
    expect(r.stderr).toMatch(
      /^tapwire-harness: --metrics-listen: metrics listen address "http:\/\/0\.0\.0\.0:9464" has no tcp:\/\/ scheme/,
    );
  });

  test("through `pnpm start` a usage error keeps exit 2 and its one line; the report stream stays clean", () => {
    const r = spawnSync("pnpm", ["--silent", "start", "--slots", "0"], {
      cwd: ROOT,
      encoding: "utf8",
      timeout: 120_000,
      env: { ...process.env, FORCE_COLOR: "0" },
    });
    expect(r.status).toBe(2);
    expect(r.stdout).toBe("");
    // pnpm adds its own "[ELIFECYCLE] Command failed with exit code 2." after ours
    const ours = r.stderr.split("\n").filter((l) => l !== "" && !l.includes("ELIFECYCLE"));
    expect(ours).toEqual(["tapwire-harness: --slots: 0 outside [1, 1024]"]);
    const help = spawnSync("pnpm", ["--silent", "start", "--", "--help"], {
      cwd: ROOT,
      encoding: "utf8",
      timeout: 120_000,
    });
    expect(help.status).toBe(0);
    expect(help.stdout).toMatch(/^tapwire-harness: /);
  });
});

describe("honest reports", () => {
  test("a worker and an encoder killed from outside: the report names each, when and by which signal; leaks unknown", async () => {
    const json = join(dir, "deaths.json");
    const run = startBin([
      ...SMALL,
      "--requests",
      "24",
      "--rate",
      "12",
      "--mm-share",
      "1",
      "--ec-deadline-ms",
      "300",
      "--json",
      json,
    ]);
    const worker = Number((await run.waitFor(/^\[harness\] worker pid (\d+) listening/))[1]);
    const encoder = Number((await run.waitFor(/^\[harness\] encoder pid (\d+) listening/))[1]);
    await run.waitFor(/^\[harness\] decoding \d+ requests/);
    process.kill(encoder, "SIGKILL");
    process.kill(worker, "SIGUSR2");
    const { code } = await run.exited;
    const rep = readReport(json);
    expect(code).toBe(3);
    expect(rep.ok).toBe(false);
    const deaths = [...rep.processes.unexpectedExits].sort((a, b) => a.name.localeCompare(b.name));
    expect(deaths.map((d) => ({ name: d.name, pid: d.pid, signal: d.signal }))).toEqual([
      { name: "encoder", pid: encoder, signal: "SIGKILL" },
      { name: "worker", pid: worker, signal: "SIGUSR2" },
    ]);
    for (const d of deaths) {
      expect(d.atMs).toBeGreaterThanOrEqual(0);
      expect(d.atMs).toBeLessThan(rep.throughput.wallSeconds * 1000 + 1000);
    }
    expect(rep.processes.worker.pids).toEqual([worker]);
    // the producer could not be asked: unknown, not zeros it never saw
    expect(rep.leaks.status).toBe("unknown");
    expect(rep.leaks.producerPinnedBlocks).toBeNull();
    expect(rep.leaks.producerGrants).toBeNull();
    // the consumer side is in-process: measured (whatever it holds after a producer died)
    expect(typeof rep.leaks.consumerPinnedBlocks).toBe("number");
    expect(rep.leaks.notes.join("\n")).toMatch(/producer side not measured/);
    const table = run.stdout.join("\n");
    expect(table).toContain(`DIED: worker pid ${worker}`);
    expect(table).toContain(`DIED: encoder pid ${encoder}`);
    expect(table).toMatch(/leaks\s+UNKNOWN: .*producer pinned unknown, grants unknown/);
    expect(table).not.toContain("LEAKED");
  });

  test("a run without the encoder cache says n/a for leaks, not zeros", async () => {
    const json = join(dir, "no-ec.json");
    const run = startBin([...SMALL, "--requests", "4", "--mm-share", "0", "--json", json]);
    expect((await run.exited).code).toBe(0);
    const rep = readReport(json);
    expect(rep.leaks.status).toBe("not_applicable");
    expect(rep.leaks.producerGrants).toBeNull();
    expect(rep.processes.encoder).toBeNull();
    expect(rep.processes.unexpectedExits).toEqual([]);
  });
});
