import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import type { ChildHandle } from "@tapwire/testing";
import { killAllChildren } from "@tapwire/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CONFORMANCE_BIN, spawnWorker, startBrokenProxy } from "./helpers.js";

const run = promisify(execFile);

async function bin(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const r = await run(process.execPath, [CONFORMANCE_BIN, ...args], { maxBuffer: 16 << 20 });
    return { code: 0, stdout: r.stdout, stderr: r.stderr };
  } catch (e) {
    const x = e as { code: number; stdout: string; stderr: string };
    return { code: x.code, stdout: x.stdout, stderr: x.stderr };
  }
}

describe("tapwire-conformance --list", () => {
  it("worker: at least 150 numbered cases across CONTRACT 3-11, one per line, each with its sentence", async () => {
    const r = await bin(["worker", "--list"]);
    expect(r.code).toBe(0);
    const lines = r.stdout.trim().split("\n");
    expect(lines.length).toBeGreaterThanOrEqual(150);
    const ids = lines.map((l) => l.split(" ")[0]!);
    expect(new Set(ids).size).toBe(ids.length);
    // 3.shm.N: the shm+unix transport's own cases (issue 23, docs/transport.md "shm").
    for (const l of lines) expect(l).toMatch(/^\d+(\.(\d+|shm))+ .+ — .*CONTRACT \d/);
    expect(ids.filter((i) => i.startsWith("3.shm.")).length).toBe(25);
    const sections = new Set(ids.map((i) => i.split(".")[0]));
    for (const s of ["3", "4", "5", "6", "7", "8", "10", "11"]) expect(sections).toContain(s);
    expect(lines.find((l) => l.startsWith("6.2.3 "))).toMatch(/never said HELLO → NO_SESSION/);
  });
  it("--cases filters by glob", async () => {
    const r = await bin(["worker", "--list", "--cases", "7.2.*"]);
    const ids = r.stdout
      .trim()
      .split("\n")
      .map((l) => l.split(" ")[0]!);
    expect(ids.length).toBeGreaterThan(40);
    expect(ids.every((i) => i.startsWith("7.2."))).toBe(true);
  });
  it("ec-producer --events --list prints the EC-CONTRACT 10 cases (issue 22)", async () => {
    const r = await bin(["ec-producer", "--events", "tcp://127.0.0.1:1", "--list"]);
    expect(r.code).toBe(0);
    const ids = r.stdout
      .trim()
      .split("\n")
      .map((l) => l.split(" ")[0]!);
    expect(ids).toContain("10.1.3");
    expect(ids).toContain("10.2.22");
    expect(ids.every((i) => i.startsWith("10."))).toBe(true);
  });
  it("a bad flag is a usage error (exit 2)", async () => {
    const r = await bin(["worker", "tcp://127.0.0.1:1", "--sample-mode", "beam"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/--sample-mode beam/);
  });
  it.each([
    [["worker", "tcp://127.0.0.1:1", "--timeout-ms", "-1"], /--timeout-ms -1 is not a non-negative integer/],
    [["worker", "tcp://127.0.0.1:1", "--bogus", "1"], /unknown flag --bogus/],
    [["ec-producer", "tcp://127.0.0.1:1", "-x"], /unknown flag -x/],
    [["beam"], /mode beam is not worker/],
    [["ec-producer", "--events", "tcp://127.0.0.1:1"], /ec-producer --events needs --replay/],
  ])("usage error %j: one line naming it, exit 2", async (args, msg) => {
    const r = await bin(args);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(msg);
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
    expect(r.stderr).not.toMatch(/ambiguous|To specify a positional/);
  });
});

describe("tapwire-conformance worker", () => {
  let w: { child: ChildHandle; endpoints: Record<string, string> };
  beforeAll(async () => {
    w = await spawnWorker("null");
  });
  afterAll(async () => {
    await w?.child.kill("SIGTERM");
    await killAllChildren();
  });
  it("prints the report grouped by section, writes --json and --junit; exit 0 when nothing FAILED", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tapwire-conf-cli-"));
    const r = await bin([
      "worker",
      w.endpoints.tcp!,
      "--cases",
      "6.1.*,7.2.3*",
      "--json",
      join(dir, "r.json"),
      "--junit",
      join(dir, "r.xml"),
    ]);
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^CONTRACT 6\.1$/m);
    expect(r.stdout).toMatch(/^Summary by section$/m);
    expect(r.stdout).toMatch(/no case FAILED/);
    const j = JSON.parse(readFileSync(join(dir, "r.json"), "utf8"));
    expect(j.mode).toBe("worker");
    expect(j.totals.FAILED).toBe(0);
    expect(j.results.every((x: { id: string }) => x.id.startsWith("6.1.") || x.id.startsWith("7.2.3"))).toBe(
      true,
    );
    const x = readFileSync(join(dir, "r.xml"), "utf8");
    expect(x).toMatch(/<testsuites name="tapwire-conformance worker" tests="\d+" failures="0"/);
  });
  it("exits 1 and prints the failing expectation and what arrived for a broken worker", async () => {
    const port = Number(w.endpoints.tcp!.split(":").pop());
    const proxy = await startBrokenProxy(port, { consumeBadFrameSeq: true });
    try {
      const r = await bin(["worker", proxy.endpoint, "--cases", "5.1.2"]);
      expect(r.code).toBe(1);
      expect(r.stdout).toMatch(/FAILED\s+5\.1\.2/);
      expect(r.stdout).toMatch(/expected: the STEP answered OK/);
      expect(r.stdout).toMatch(/got:\s+STALE_SEQ/);
    } finally {
      await proxy.close();
    }
  });
  it("the README example runs (against this worker) and prints its summary line", async () => {
    const md = readFileSync(new URL("../README.md", import.meta.url), "utf8");
    const code = /```ts\n([\s\S]*?)```/.exec(md)![1]!;
    const dist = new URL("../dist/index.js", import.meta.url).href;
    const js = code.replace('"@tapwire/conformance"', JSON.stringify(dist));
    const dir = mkdtempSync(join(tmpdir(), "tapwire-conf-readme-"));
    writeFileSync(join(dir, "example.mjs"), js);
    // no fixed port (issue 19): the example reads the worker's bound endpoint from the environment
    const r = await run(process.execPath, [join(dir, "example.mjs")], {
      maxBuffer: 16 << 20,
      env: { ...process.env, TAPWIRE_ENDPOINT: w.endpoints.tcp! },
    });
    expect(r.stdout.split("\n")[0]).toMatch(/^\d+ cases, 0 FAILED$/);
    expect(r.stdout).toMatch(/^CONTRACT 7\.2$/m);
  });
  it("exits 3 when the worker cannot be reached", async () => {
    const r = await bin(["worker", "tcp://127.0.0.1:1", "--timeout-ms", "300"]);
    expect(r.code).toBe(3);
    expect(r.stderr).toMatch(/CONFORMANCE_CONNECT/);
  });
});
