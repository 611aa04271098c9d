import { readFileSync } from "node:fs";
import { expect, test } from "vitest";

test("the README example is test/readme-example.test.ts (so it runs in this suite)", () => {
  const readme = readFileSync(new URL("../README.md", import.meta.url), "utf8");
  const code = /```ts\n([\s\S]*?)```/.exec(readme)?.[1];
  expect(code).toBeDefined();
  const file = readFileSync(new URL("./readme-example.test.ts", import.meta.url), "utf8");
  const body = file.slice(file.indexOf("\n") + 1);
  expect(body).toBe(code!.replace(`from "@tapwire/testing"`, `from "../src/index.js"`));
});
