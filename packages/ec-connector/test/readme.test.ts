import { spawnSync } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { expect, it } from "vitest";

it("the README example runs against the built package and prints identical bytes", () => {
  const readme = readFileSync(new URL("../README.md", import.meta.url), "utf8");
  const code = /```ts\n([\s\S]*?)```/.exec(readme)![1]!;
  const file = fileURLToPath(new URL("../readme-example.tmp.mts", import.meta.url));
  writeFileSync(file, code);
  try {
    const r = spawnSync(process.execPath, ["--import", "tsx", file], { encoding: "utf8", timeout: 60_000 });
    expect(r.stderr).toBe("");
    expect(r.stdout).toMatch(/img-42: 4718592 bytes, identical: true/);
  } finally {
    rmSync(file, { force: true });
  }
});
