/**
 * Where `tapwire-worker --drafter onnx` finds `@tapwire/drafter-onnx` (issue 19). That package
 * depends on this one, so it cannot be a dependency of the worker: it is looked up at run time,
 * in this order, and the first place that has it wins:
 *
 * 1. `TAPWIRE_DRAFTER_ONNX`: the package folder or its entry file (a supervisor such as the
 *    harness resolves it from its own dependencies and passes it on);
 * 2. next to this worker (`npm install @tapwire/worker @tapwire/drafter-onnx` in one project);
 * 3. the project of the current directory (its `node_modules`, walking up);
 * 4. the pnpm workspace this worker is part of (a clone of the tapwire repository: the worker
 *    and the drafter are both workspace packages, whatever the current directory).
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { UsageError } from "./flags.js";

/** The package looked for. */
export const ONNX_PACKAGE = "@tapwire/drafter-onnx";

/** The environment variable naming the package folder or entry (rule 1). */
export const ONNX_ENV = "TAPWIRE_DRAFTER_ONNX";

/** One place looked at, for the error message. */
interface Tried {
  where: string;
  why: string;
}

function resolveFrom(base: string): string {
  return createRequire(base).resolve(ONNX_PACKAGE);
}

/** The entry file of a package folder (its package.json `main`/`exports["."]`) or a file as given. */
function entryOf(pathGiven: string): string {
  const p = resolve(pathGiven);
  if (statSync(p).isDirectory()) return createRequire(join(p, "package.json")).resolve(p);
  return p;
}

/** The root of the pnpm workspace holding `from` (a folder with pnpm-workspace.yaml), or null. */
function workspaceRoot(from: string): string | null {
  let dir = from;
  for (;;) {
    if (existsSync(join(dir, "pnpm-workspace.yaml"))) return dir;
    const up = dirname(dir);
    if (up === dir) return null;
    dir = up;
  }
}

/** The folder of the workspace package named {@link ONNX_PACKAGE}, from the `packages:` globs `dir/*`. */
function workspacePackage(root: string): string | null {
  const yaml = readFileSync(join(root, "pnpm-workspace.yaml"), "utf8");
  const section = /^packages:\s*\n((?:[ \t]+-.*\n?)*)/m.exec(yaml)?.[1] ?? "";
  for (const m of section.matchAll(/-\s*["']?([^"'\n#]+?)\/\*["']?\s*$/gm)) {
    const parent = join(root, m[1]!);
    let names: string[];
    try {
      names = readdirSync(parent);
    } catch {
      continue;
    }
    for (const name of names) {
      const pkg = join(parent, name, "package.json");
      try {
        if ((JSON.parse(readFileSync(pkg, "utf8")) as { name?: unknown }).name === ONNX_PACKAGE) {
          return join(parent, name);
        }
      } catch {
        // not a package folder
      }
    }
  }
  return null;
}

/**
 * The path of `@tapwire/drafter-onnx`'s entry file by the rules above.
 * @throws {UsageError} naming every place looked at and what to do (npm or workspace).
 */
export function locateOnnxDrafter(env: NodeJS.ProcessEnv = process.env, cwd = process.cwd()): string {
  const tried: Tried[] = [];
  const fromEnv = env[ONNX_ENV];
  if (fromEnv !== undefined && fromEnv !== "") {
    try {
      return entryOf(fromEnv);
    } catch (e) {
      throw new UsageError(
        `${ONNX_ENV}=${fromEnv}: not ${ONNX_PACKAGE}'s folder or entry file (${(e as Error).message.split("\n")[0]})`,
      );
    }
  }
  const self = fileURLToPath(import.meta.url);
  for (const [where, base] of [
    ["next to tapwire-worker", import.meta.url],
    [`the project of the current directory ${cwd}`, pathToFileURL(join(cwd, "package.json")).href],
  ] as const) {
    try {
      return resolveFrom(base);
    } catch (e) {
      tried.push({ where, why: (e as { code?: string }).code ?? "not found" });
    }
  }
  const root = workspaceRoot(dirname(self));
  if (root !== null) {
    const dir = workspacePackage(root);
    if (dir !== null) {
      try {
        return entryOf(dir);
      } catch {
        throw new UsageError(
          `--drafter onnx: ${ONNX_PACKAGE} is in the workspace at ${dir} but not built; run: pnpm --filter ${ONNX_PACKAGE} build (or pnpm build)`,
        );
      }
    }
    tried.push({ where: `the workspace ${root}`, why: "no such package" });
  }
  throw new UsageError(
    `--drafter onnx needs ${ONNX_PACKAGE}, not found (${tried.map((t) => `${t.where}: ${t.why}`).join("; ")}); ` +
      `install it beside the worker (npm install ${ONNX_PACKAGE}), or in a clone of the tapwire workspace build it (pnpm build), ` +
      `or set ${ONNX_ENV} to its folder`,
  );
}
