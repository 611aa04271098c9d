import { spawnSync } from "node:child_process";
import { rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { spawnBin } from "@tapwire/testing";
import { expect, it } from "vitest";
import { EcAdminClient } from "../src/index.js";
import { PRODUCER_BIN } from "./helpers/proc.js";

it("tapwire-ec-producer: rejects a bad option with exit code 2 naming it", () => {
  const r = spawnSync(process.execPath, [PRODUCER_BIN, "--num-blocks", "zero"], {
    encoding: "utf8",
    timeout: 20_000,
  });
  expect(r.status).toBe(2);
  expect(r.stderr).toMatch(/--num-blocks: not a number: zero/);
  const r2 = spawnSync(process.execPath, [PRODUCER_BIN, "--block-bytes", "0"], {
    encoding: "utf8",
    timeout: 20_000,
  });
  expect(r2.status).toBe(2);
  expect(r2.stderr).toMatch(/option blockBytes/);
});

it("tapwire-ec-producer: prepopulates from a file, logs stats periodically, exits 0 on SIGINT", async () => {
  const file = join(tmpdir(), `ec-prepop-${process.pid}.txt`);
  writeFileSync(file, "# mm_hash nbytes\nimg-a 1000\nimg-b 70000\n");
  try {
    const child = await spawnBin(PRODUCER_BIN, ["--prepopulate-file", file, "--stats-interval-ms", "50"]);
    const listening = child.readyLine.json!;
    expect(listening["entries"]).toBe(2);
    expect(String(listening["control"])).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    expect(String(listening["data"])).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    await child.waitFor((l) => l.json?.["msg"] === "stats", 10_000);
    const admin = new EcAdminClient(String(listening["admin"]));
    expect(await admin.request("ping")).toEqual({ op: "pong" });
    expect(await admin.encode("img-c", 5000)).toBe("ready");
    expect(await admin.encode("img-c", 5000)).toBe("exists");
    expect(await admin.check()).toBeNull();
    admin.close();
    const exit = await child.kill("SIGINT");
    expect(exit.code).toBe(0);
    const closed = child.json.find((j) => j["msg"] === "closed")!;
    expect((closed["stats"] as { encodes: number }).encodes).toBe(3);
  } finally {
    rmSync(file, { force: true });
  }
});
