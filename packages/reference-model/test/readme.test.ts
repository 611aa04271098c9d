import { execFileSync } from "node:child_process";
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { expect, test } from "vitest";

const pkg = join(dirname(fileURLToPath(import.meta.url)), "..");

test("the README example runs against the built package and reaches the acceptance range", () => {
  const readme = readFileSync(join(pkg, "README.md"), "utf8");
  const block = /```ts\n([\s\S]*?)```/.exec(readme)?.[1];
  expect(block).toBeDefined();
  expect(existsSync(join(pkg, "dist", "index.js"))).toBe(true);
  // Inside the package directory, "@tapwire/reference-model" resolves to the package itself.
  const file = join(pkg, `.readme-example-${process.pid}.mjs`);
  writeFileSync(file, block!);
  try {
    const out = execFileSync(process.execPath, [file], { cwd: pkg, encoding: "utf8", timeout: 60_000 });
    expect(out).toMatch(/\d+ tokens in \d+ rounds/);
    const mal = Number(/mean accepted length (\S+)/.exec(out)?.[1]);
    expect(mal).toBeGreaterThanOrEqual(1.8);
    expect(mal).toBeLessThanOrEqual(3.0);
    expect(out).toMatch(/drafter identity [0-9a-f]{64}/);
  } finally {
    rmSync(file, { force: true });
  }
});
