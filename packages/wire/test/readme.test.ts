// The README example must run against the built package.
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { expect, test } from "vitest";

test("README example runs and prints the drafts", () => {
  const pkg = fileURLToPath(new URL("..", import.meta.url));
  const readme = readFileSync(join(pkg, "README.md"), "utf8");
  const code = /## Example[\s\S]*?```ts\n([\s\S]*?)```/.exec(readme)?.[1];
  expect(code).toBeDefined();
  const dist = pathToFileURL(join(pkg, "dist/index.js")).href;
  const file = join(mkdtempSync(join(tmpdir(), "wire-readme-")), "example.mjs");
  writeFileSync(file, code!.replace(`from "@tapwire/wire"`, `from ${JSON.stringify(dist)}`));
  const r = spawnSync(process.execPath, [file], { encoding: "utf8" });
  expect(r.stderr).toBe("");
  expect(r.stdout.trim()).toBe("[ 5, 6, 7, 8 ]");
  expect(r.status).toBe(0);
});
