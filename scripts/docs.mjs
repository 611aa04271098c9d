#!/usr/bin/env node
// `pnpm run docs`: the API reference of every public package (every non-private package under
// packages/, from its src/index.ts) into docs/api/ with typedoc (typedoc.json holds the options).
// Every exported symbol must carry TSDoc: `validation.notDocumented` with
// `treatWarningsAsErrors`, so an undocumented export fails the run, naming it.
// docs/api/ is generated (gitignored). Writes .ci/results/docs.json for the CI summary.
// Flags: --only <folder,...> (a subset, for a quick look); any other flag goes to typedoc.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { publicPackages } from "./lib/readme.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const argv = process.argv.slice(2);
const onlyAt = argv.indexOf("--only");
const only = onlyAt >= 0 ? new Set(argv.splice(onlyAt, 2)[1]?.split(",")) : null;
const pkgs = publicPackages(root).filter(
  (p) => fs.existsSync(path.join(p.dir, "src/index.ts")) && (only === null || only.has(p.folder)),
);
const args = [
  "--options",
  path.join(root, "typedoc.json"),
  ...pkgs.flatMap((p) => ["--entryPoints", path.relative(root, p.dir)]),
  ...argv,
];
console.log(`typedoc: ${pkgs.map((p) => p.pkg.name).join(", ")}`);
const r = spawnSync(path.join(root, "node_modules/.bin/typedoc"), args, {
  cwd: root,
  encoding: "utf8",
  maxBuffer: 64 << 20,
});
// biome-ignore lint/suspicious/noControlCharactersInRegex: strips ANSI colours
const out = `${r.stdout}${r.stderr}`.replace(/\x1b\[[0-9;]*m/g, "");
process.stdout.write(out);
// One problem per "[warning]"/"[error]" line; the summary line ("Found N errors…") is not one.
const problems = out
  .split("\n")
  .filter((l) => /\[(warning|error)\]/.test(l) && !/^\[\w+\] Found \d+ errors?/.test(l));
const failed = r.status === 0 ? 0 : Math.max(1, problems.length);
const passed = r.status === 0 ? pkgs.length : 0;
fs.mkdirSync(path.join(root, ".ci/results"), { recursive: true });
fs.writeFileSync(
  path.join(root, ".ci/results/docs.json"),
  `${JSON.stringify({ name: "docs", passed, failed, problems }, null, 2)}\n`,
);
console.log(
  r.status === 0
    ? `docs/api: ${pkgs.length} packages documented`
    : `docs: typedoc exit ${r.status}, ${problems.length} problems`,
);
console.log(`${passed} passed, ${failed} failed`);
process.exit(r.status === 0 ? 0 : 1);
