// Sums vitest JSON reports of every workspace package, and the reports of the root-level checks
// named on the command line, into one plain summary line.
import fs from "node:fs";
import path from "node:path";

let passed = 0;
let failed = 0;
let missing = 0;
for (const root of ["packages", "apps"]) {
  if (!fs.existsSync(root)) continue;
  for (const name of fs.readdirSync(root).sort()) {
    const dir = path.join(root, name);
    if (!fs.existsSync(path.join(dir, "package.json"))) continue;
    const pkg = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8"));
    if (!pkg.scripts?.test) continue;
    const file = path.join(dir, "test-results.json");
    if (!fs.existsSync(file)) {
      console.log(`${pkg.name}: no test report (the suite did not run or crashed)`);
      missing += 1;
      continue;
    }
    const r = JSON.parse(fs.readFileSync(file, "utf8"));
    const p = r.numPassedTests ?? 0;
    const f = (r.numFailedTests ?? 0) + (r.numRuntimeErrorTestSuites ?? 0);
    const skipped = (r.numPendingTests ?? 0) + (r.numTodoTests ?? 0);
    console.log(`${pkg.name}: ${p} passed, ${f} failed${skipped ? `, ${skipped} skipped` : ""}`);
    passed += p;
    failed += f;
    if (r.success === false && f === 0) failed += 1;
  }
}
// Root-level checks run by .ci/run (release checks), each reporting { passed, failed }.
for (const name of process.argv.slice(2)) {
  const file = path.join(".ci/results", `${name}.json`);
  if (!fs.existsSync(file)) {
    console.log(`${name}: no report (the check did not run or crashed)`);
    missing += 1;
    continue;
  }
  const r = JSON.parse(fs.readFileSync(file, "utf8"));
  console.log(`${name}: ${r.passed} passed, ${r.failed} failed`);
  passed += r.passed;
  failed += r.failed;
}
failed += missing;
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed > 0 ? 1 : 0);
