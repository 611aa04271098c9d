// Runs every package's benchmark one after another (never in parallel: the machines are small
// and noisy) and prints one JSON document: { "<package>": <that package's JSON report>, … }.
// Each package's report is also written to bench-results/<package>.json.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";

const only = new Set(process.argv.slice(2));
const results = {};
let failed = 0;
fs.mkdirSync("bench-results", { recursive: true });
for (const root of ["packages", "apps"]) {
  for (const name of fs.readdirSync(root).sort()) {
    const dir = path.join(root, name);
    const file = path.join(dir, "package.json");
    if (!fs.existsSync(file)) continue;
    const pkg = JSON.parse(fs.readFileSync(file, "utf8"));
    const script = pkg.scripts?.bench;
    if (!script || script.startsWith("node -e")) continue;
    if (only.size > 0 && !only.has(pkg.name) && !only.has(name)) continue;
    process.stderr.write(`bench: ${pkg.name} …\n`);
    const started = Date.now();
    const r = spawnSync("pnpm", ["--silent", "run", "bench"], {
      cwd: dir,
      encoding: "utf8",
      stdio: ["ignore", "pipe", "inherit"],
      maxBuffer: 256 * 1024 * 1024,
    });
    const out = r.stdout ?? "";
    let report;
    try {
      report = JSON.parse(out.slice(out.indexOf("{")));
    } catch {
      report = { error: `no JSON report (exit ${r.status})`, stdout_tail: out.slice(-2000) };
    }
    if (r.status !== 0) {
      failed += 1;
      report = { error: `bench exited ${r.status}`, report };
    }
    results[pkg.name] = report;
    fs.writeFileSync(path.join("bench-results", `${name}.json`), `${JSON.stringify(report, null, 2)}\n`);
    process.stderr.write(`bench: ${pkg.name} done in ${((Date.now() - started) / 1000).toFixed(1)} s\n`);
  }
}
process.stdout.write(`${JSON.stringify(results, null, 2)}\n`);
process.exit(failed > 0 ? 1 : 0);
