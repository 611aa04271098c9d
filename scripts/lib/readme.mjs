// What the release checks read from a package README: its ts code blocks, the packages its
// "## Install" line names, and the bare imports of its examples.
import fs from "node:fs";
import path from "node:path";

/** Public (non-private) packages under packages/, sorted by folder name. */
export function publicPackages(root) {
  const dir = path.join(root, "packages");
  const out = [];
  for (const name of fs.readdirSync(dir).sort()) {
    const file = path.join(dir, name, "package.json");
    if (!fs.existsSync(file)) continue;
    const pkg = JSON.parse(fs.readFileSync(file, "utf8"));
    if (pkg.private) continue;
    out.push({ dir: path.join(dir, name), folder: name, pkg });
  }
  return out;
}

/** Fenced code blocks of one language, with their first line number (1-based). */
export function codeBlocks(markdown, langs = ["ts", "typescript"]) {
  const blocks = [];
  const lines = markdown.split("\n");
  let open = null;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    if (open === null) {
      const m = /^```(\w+)\s*$/.exec(line);
      if (m) open = { lang: m[1], line: i + 2, body: [] };
    } else if (/^```\s*$/.test(line)) {
      if (langs.includes(open.lang)) blocks.push({ line: open.line, code: `${open.body.join("\n")}\n` });
      open = null;
    } else {
      open.body.push(line);
    }
  }
  return blocks;
}

/** The package names of the `npm install …` line in the README's "## Install" section. */
export function installLine(markdown) {
  const section = /^## Install\s*$([\s\S]*?)(?=^## )/m.exec(markdown);
  if (!section) return null;
  const m = /^npm install ([^\n]+)$/m.exec(section[1]);
  if (!m) return null;
  return m[1]
    .trim()
    .split(/\s+/)
    .filter((w) => !w.startsWith("-"));
}

/** Bare module specifiers imported by a block (node: built-ins excluded), as package names. */
export function bareImports(code) {
  const names = new Set();
  for (const m of code.matchAll(/\bfrom\s+"([^"]+)"|\bimport\s*\(\s*"([^"]+)"\s*\)|^import\s+"([^"]+)"/gm)) {
    const spec = m[1] ?? m[2] ?? m[3];
    if (!spec || spec.startsWith("node:") || spec.startsWith(".") || spec.startsWith("/")) continue;
    const parts = spec.split("/");
    names.add(spec.startsWith("@") ? parts.slice(0, 2).join("/") : parts[0]);
  }
  return [...names];
}

/** Relative markdown links (they break on npm, which shows the README without the repo). */
export function relativeLinks(markdown) {
  return [...markdown.matchAll(/\]\(((?!https?:|mailto:|#)[^)]+)\)/g)].map((m) => m[1]);
}

/**
 * Compiler options the README examples must pass: a user's `tsc --strict` ES module project as
 * `tsc --init` writes it (`skipLibCheck` on: third-party declarations such as onnx-proto's need
 * types their packages do not ship). `pnpm test:pack` checks our own declarations with
 * `skipLibCheck` off separately.
 */
export const EXAMPLE_COMPILER_OPTIONS = {
  strict: true,
  target: "ES2023",
  lib: ["ES2023"],
  module: "NodeNext",
  moduleResolution: "NodeNext",
  types: ["node"],
  skipLibCheck: true,
  noEmitOnError: true,
};
