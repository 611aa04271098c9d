// The README example, run as written (only the endpoint is swapped for the spawned worker's)
// against the built package and a real worker with the NullDrafter in a child process.
import { spawnSync } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { endpointFor, killAllChildren, spawnBin } from "@tapwire/testing";
import { afterEach, expect, test } from "vitest";
import { WORKER_BIN } from "./worker-bin.js";

afterEach(async () => {
  await killAllChildren();
});

test("the README example runs against a real worker and prints drafts", async () => {
  const readme = readFileSync(new URL("../README.md", import.meta.url), "utf8");
  // the worker command line of the README, with its listen address swapped for a free one
  const cmd = /`tapwire-worker ([^`]+)`/.exec(readme.replace(/\n/g, " "))![1]!.split(/\s+/);
  const at = cmd.indexOf("--listen");
  const readmeEndpoint = cmd[at + 1]!;
  cmd[at + 1] = endpointFor("tcp");
  const child = await spawnBin(WORKER_BIN, cmd);
  const endpoint = (child.readyLine.json as { endpoints: string[] }).endpoints[0]!;
  const code = /```ts\n([\s\S]*?)```/.exec(readme)![1]!.replaceAll(readmeEndpoint, endpoint);
  const file = fileURLToPath(new URL("../readme-example.tmp.mts", import.meta.url));
  writeFileSync(file, code);
  try {
    const r = spawnSync(process.execPath, ["--import", "tsx", file], { encoding: "utf8", timeout: 60_000 });
    expect(r.status, r.stderr).toBe(0);
    // outcome ok, draft ok, the verified ids and the k confidences
    expect(r.stdout).toMatch(/^ok ok \[[\d, ]*\] Float32Array\(4\)/);
    // the zero-copy round (rowsTarget): 2 rows sent from the ring, drafts ok
    expect(r.stdout).toMatch(/\nok 2 ok\n/);
  } finally {
    rmSync(file, { force: true });
  }
});

test("the README example without a worker ends by itself: waitReady gives false, rounds are target-only (issue 15)", async () => {
  const readme = readFileSync(new URL("../README.md", import.meta.url), "utf8");
  const cmd = /`tapwire-worker ([^`]+)`/.exec(readme.replace(/\n/g, " "))![1]!.split(/\s+/);
  const readmeEndpoint = cmd[cmd.indexOf("--listen") + 1]!;
  // a unix socket nobody listens on: every connect fails at once
  const code = /```ts\n([\s\S]*?)```/.exec(readme)![1]!.replaceAll(readmeEndpoint, endpointFor("unix"));
  const file = fileURLToPath(new URL("../readme-example-noworker.tmp.mts", import.meta.url));
  writeFileSync(file, code);
  try {
    const r = spawnSync(process.execPath, ["--import", "tsx", file], { encoding: "utf8", timeout: 60_000 });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^not_ready not_ready \[\] Float32Array\(0\)/);
    expect(r.stdout).toMatch(/\nnot_ready 0 not_ready\n/);
    // silent without a logger
    expect(r.stderr).toBe("");
  } finally {
    rmSync(file, { force: true });
  }
});
