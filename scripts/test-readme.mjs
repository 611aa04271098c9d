#!/usr/bin/env node
// `pnpm test:readme`: every public package README, checked against the built workspace packages.
// - its "## Install" section has an `npm install …` line naming every package its examples import;
// - it has no relative links (npm shows the README without the repository around it);
// - every ts block compiles under `tsc --strict` as an ES module of a user's project.
// `pnpm test:pack` repeats the compile (and runs the first example) against the packed tarballs.
// Writes .ci/results/test-readme.json ({ passed, failed }) for the CI summary.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import {
  bareImports,
  codeBlocks,
  EXAMPLE_COMPILER_OPTIONS,
  installLine,
  publicPackages,
  relativeLinks,
} from "./lib/readme.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const results = [];
const record = (name, problem) => {
  results.push({ name, ok: problem === null, problem });
  console.log(problem === null ? `ok   ${name}` : `FAIL ${name}: ${problem}`);
};

const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "tapwire-readme-"));
try {
  const nm = path.join(scratch, "node_modules");
  fs.mkdirSync(path.join(nm, "@tapwire"), { recursive: true });
  fs.mkdirSync(path.join(nm, "@types"), { recursive: true });
  fs.symlinkSync(path.join(root, "node_modules/@types/node"), path.join(nm, "@types/node"));
  const pkgs = publicPackages(root);
  for (const p of pkgs) {
    if (!fs.existsSync(path.join(p.dir, "dist"))) {
      record(`${p.pkg.name} built`, "no dist/ (run pnpm build first)");
    }
    fs.symlinkSync(p.dir, path.join(nm, p.pkg.name));
  }
  fs.mkdirSync(path.join(scratch, "examples"));
  fs.writeFileSync(path.join(scratch, "package.json"), '{ "name": "readme-check", "type": "module" }\n');
  const files = new Map(); // example file -> "<pkg> README line N"
  for (const p of pkgs) {
    const readmeFile = path.join(p.dir, "README.md");
    if (!fs.existsSync(readmeFile)) {
      record(`${p.pkg.name} README`, "missing README.md");
      continue;
    }
    const md = fs.readFileSync(readmeFile, "utf8");
    const blocks = codeBlocks(md);
    const install = installLine(md);
    const imported = new Set(blocks.flatMap((b) => bareImports(b.code)));
    if (install === null) {
      record(`${p.pkg.name} README install line`, 'no "npm install …" line under "## Install"');
    } else {
      const missing = [...imported, p.pkg.name].filter((n) => !install.includes(n));
      record(
        `${p.pkg.name} README install line`,
        missing.length === 0 ? null : `"npm install ${install.join(" ")}" misses ${missing.join(", ")}`,
      );
    }
    const rel = relativeLinks(md);
    record(`${p.pkg.name} README links`, rel.length === 0 ? null : `relative links: ${rel.join(", ")}`);
    if (blocks.length === 0) record(`${p.pkg.name} README example`, "no ts code block");
    blocks.forEach((b, i) => {
      const file = `examples/${p.folder}-${i}.ts`;
      // `export {}` keeps a block without imports a module (top-level await, own scope).
      fs.writeFileSync(path.join(scratch, file), `${b.code}export {};\n`);
      files.set(file, `${p.pkg.name} README line ${b.line}`);
    });
  }
  fs.writeFileSync(
    path.join(scratch, "tsconfig.json"),
    JSON.stringify({ compilerOptions: { ...EXAMPLE_COMPILER_OPTIONS, noEmit: true }, include: ["examples"] }),
  );
  const tsc = path.join(root, "node_modules/typescript/bin/tsc");
  const r = spawnSync(process.execPath, [tsc, "-p", "tsconfig.json", "--pretty", "false"], {
    cwd: scratch,
    encoding: "utf8",
  });
  const errors = new Map();
  for (const line of `${r.stdout}${r.stderr}`.split("\n")) {
    const m = /^(examples\/[^(]+\.ts)\((\d+),\d+\): (.*)$/.exec(line);
    if (m) {
      const list = errors.get(m[1]) ?? [];
      list.push(`block line ${m[2]}: ${m[3]}`);
      errors.set(m[1], list);
    } else if (line.trim() !== "" && r.status !== 0 && !/^ /.test(line)) {
      const list = errors.get("(other)") ?? [];
      list.push(line);
      errors.set("(other)", list);
    }
  }
  for (const [file, where] of files) {
    const e = errors.get(file);
    record(`${where} tsc --strict`, e ? e.join("; ") : null);
  }
  if (errors.has("(other)")) record("tsc", errors.get("(other)").join("; "));
  if (r.status !== 0 && errors.size === 0) record("tsc", `exit ${r.status}: ${r.stdout}${r.stderr}`);
  checkDocs();
} finally {
  fs.rmSync(scratch, { recursive: true, force: true });
}

/**
 * The release and operator docs: their relative links point at files that exist, and every
 * `packages/…/file.ts:name` reference of docs/architecture.md names a file that exists and
 * contains that name (so moved or renamed code shows up here, not in a reader's confusion).
 */
function checkDocs() {
  for (const doc of ["docs/install.md", "docs/operations.md", "docs/architecture.md"]) {
    const file = path.join(root, doc);
    if (!fs.existsSync(file)) {
      record(`${doc}`, "missing");
      continue;
    }
    const md = fs.readFileSync(file, "utf8");
    const broken = relativeLinks(md)
      .map((l) => l.split("#")[0])
      .filter((l) => l !== "" && !fs.existsSync(path.resolve(path.dirname(file), l)));
    record(`${doc} links`, broken.length === 0 ? null : `missing: ${[...new Set(broken)].join(", ")}`);
  }
  const arch = path.join(root, "docs/architecture.md");
  if (!fs.existsSync(arch)) return;
  const md = fs.readFileSync(arch, "utf8");
  const problems = [];
  let refs = 0;
  for (const m of md.matchAll(/`((?:packages|apps)\/[^`\s:]+\.ts)(?::([^`\s]+))?`/g)) {
    refs += 1;
    const src = path.join(root, m[1]);
    if (!fs.existsSync(src)) {
      problems.push(`${m[1]} does not exist`);
      continue;
    }
    if (m[2] === undefined) continue;
    const text = fs.readFileSync(src, "utf8");
    for (const part of m[2].split(".")) {
      const name = part.replace(/^#/, "");
      if (!new RegExp(`(^|[^\\w$])#?${name.replace(/[$]/g, "\\$")}\\b`).test(text)) {
        problems.push(`${m[1]} has no ${part}`);
      }
    }
  }
  record(
    `docs/architecture.md references (${refs})`,
    problems.length === 0 ? null : [...new Set(problems)].join("; "),
  );
}

const passed = results.filter((r) => r.ok).length;
const failed = results.length - passed;
fs.mkdirSync(path.join(root, ".ci/results"), { recursive: true });
fs.writeFileSync(
  path.join(root, ".ci/results/test-readme.json"),
  `${JSON.stringify({ name: "test:readme", passed, failed, results }, null, 2)}\n`,
);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
