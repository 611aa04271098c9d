#!/usr/bin/env node
// `pnpm test:loaded` (issue 19): the test suite on a busy machine. Starts two busy-looping
// processes (`node -e 'for(;;){}'`), runs `pnpm test` beside them, and kills them afterwards
// (also on SIGINT/SIGTERM and when the suite fails). `node scripts/test-loaded.mjs -- CMD ARGS`
// runs another command under the same load (e.g. one package's vitest run). Exits with the
// command's code. A suite that needs an idle machine is a suite users stop running.
import { spawn } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const BUSY = 2;
const sep = process.argv.indexOf("--");
const [cmd, ...args] = sep >= 0 ? process.argv.slice(sep + 1) : ["pnpm", "test"];
if (cmd === undefined) {
  console.error("test-loaded: nothing to run after --");
  process.exit(2);
}

const loops = Array.from({ length: BUSY }, () =>
  spawn(process.execPath, ["-e", "for(;;){}"], { stdio: "ignore" }),
);
const stopLoops = () => {
  for (const l of loops) if (l.exitCode === null && l.signalCode === null) l.kill("SIGKILL");
};
process.on("exit", stopLoops);
console.log(
  `test-loaded: ${BUSY} busy loops (pids ${loops.map((l) => l.pid).join(", ")}) beside: ${[cmd, ...args].join(" ")}`,
);

const started = Date.now();
const child = spawn(cmd, args, { cwd: root, stdio: "inherit" });
for (const sig of ["SIGINT", "SIGTERM"]) {
  process.on(sig, () => {
    child.kill(sig);
    stopLoops();
    process.exit(130);
  });
}
child.on("error", (e) => {
  console.error(`test-loaded: cannot run ${cmd}: ${e.message}`);
  stopLoops();
  process.exit(1);
});
child.on("exit", (code, signal) => {
  stopLoops();
  const s = ((Date.now() - started) / 1000).toFixed(0);
  console.log(
    `test-loaded: ${[cmd, ...args].join(" ")} exited ${code ?? signal} after ${s} s under ${BUSY} busy loops`,
  );
  process.exit(code ?? 1);
});
