import { execFileSync } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { expect, test } from "vitest";

const pkg = join(dirname(fileURLToPath(import.meta.url)), "..");

test("the README example runs against the built package: same drafts as the JavaScript head, served", () => {
  const readme = readFileSync(join(pkg, "README.md"), "utf8");
  const block = /```ts\n([\s\S]*?)```/.exec(readme)?.[1];
  expect(block).toBeDefined();
  // Inside the package directory, "@tapwire/drafter-onnx" resolves to the package itself (dist).
  const file = join(pkg, `.readme-example-${process.pid}.mts`);
  writeFileSync(file, block!);
  try {
    const out = execFileSync(process.execPath, ["--import", "tsx", file], {
      cwd: pkg,
      encoding: "utf8",
      timeout: 60_000,
    });
    expect(out).toMatch(/drafter identity [0-9a-f]{64}/);
    expect(out).toMatch(/onnx drafts( \d+){8}/);
    expect(out).toContain("same as the JavaScript head: true");
    expect(out).toMatch(/serving on tcp:\/\/127\.0\.0\.1:\d+/);
  } finally {
    rmSync(file, { force: true });
  }
});
