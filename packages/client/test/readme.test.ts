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
  // as written: port 0, the bound endpoint read back from the listening line (issue 19)
  expect(cmd[cmd.indexOf("--listen") + 1]).toBe("tcp://127.0.0.1:0");
  const child = await spawnBin(WORKER_BIN, cmd);
  const endpoint = (child.readyLine.json as { endpoints: string[] }).endpoints[0]!;
  const code = /```ts\n([\s\S]*?)```/.exec(readme)![1]!;
  const file = fileURLToPath(new URL("../readme-example.tmp.mts", import.meta.url));
  writeFileSync(file, code);
  try {
    const r = spawnSync(process.execPath, ["--import", "tsx", file], {
      encoding: "utf8",
      timeout: 60_000,
      env: { ...process.env, TAPWIRE_ENDPOINT: endpoint },
    });
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
  // a unix socket nobody listens on: every connect fails at once
  const nobody = endpointFor("unix");
  const code = /```ts\n([\s\S]*?)```/.exec(readme)![1]!;
  const file = fileURLToPath(new URL("../readme-example-noworker.tmp.mts", import.meta.url));
  writeFileSync(file, code);
  try {
    const r = spawnSync(process.execPath, ["--import", "tsx", file], {
      encoding: "utf8",
      timeout: 60_000,
      env: { ...process.env, TAPWIRE_ENDPOINT: nobody },
    });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^not_ready not_ready \[\] Float32Array\(0\)/);
    expect(r.stdout).toMatch(/\nnot_ready 0 not_ready\n/);
    // the client logs nothing without a logger; the example says why it is not ready (issue 19)
    expect(r.stderr).toMatch(new RegExp(`^not ready: connect: connect to ${nobody} failed: [^\\n]*ENOENT`));
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
  } finally {
    rmSync(file, { force: true });
  }
});
