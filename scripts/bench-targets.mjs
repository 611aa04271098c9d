// Checks the issue targets (issues 20, 21, 23: "every target holds in three interleaved runs on an
// otherwise idle machine, measured by the benches"). Runs the benches that carry a target,
// interleaved (run 1 of every bench, then run 2 of every bench, …), reads each one's JSON report,
// and prints one JSON document on stdout and a Markdown table on stderr; both are also written to
// bench-results/targets.json and bench-results/targets.md, each bench run's own report and stderr
// to bench-results/targets/<bench>-<run>.{json,err}.
//
//   node scripts/bench-targets.mjs [--runs N] [--only ec,client,...] [--quick] [--timeout-min M]
//
// A report, not a gate: exit 0 even when targets are missed; 1 when a bench run produced no JSON
// report (it failed, crashed or timed out); 2 on bad arguments. docs/benchmarks.md "Checking the
// targets".
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

// ---------------------------------------------------------------------------------------------
// The benches: command (run from the repo root), fixed env, and the env of `--quick` (fewer
// iterations: for trying this script out, not for checking targets).
const BENCHES = {
  ec: {
    cmd: ["pnpm", "--silent", "--filter", "@tapwire/ec-connector", "bench"],
    env: {},
    quick: { EC_BENCH_ROUNDS: "1" }, // only the shm row has a knob; the rest always runs in full
  },
  client: {
    cmd: ["pnpm", "--silent", "--filter", "@tapwire/client", "bench"],
    env: { BENCH_POOL: "0", BENCH_SHAPES: "0,1" },
    quick: { BENCH_ITERS: "200", BENCH_HEAP_ITERS: "20" },
  },
  pool: {
    cmd: ["pnpm", "--silent", "--filter", "@tapwire/client", "bench:pool"],
    env: {},
    quick: { BENCH_POOL_ITERS: "120", BENCH_POOL_REPS: "2" },
  },
  worker: {
    cmd: ["pnpm", "--silent", "--filter", "@tapwire/worker", "bench"],
    env: { TAPWIRE_BENCH_ONLY: "null" },
    quick: {}, // no knob
  },
  shm: {
    // packages/transport/bench/shm.ts alone (the full transport bench also reports it, as `shm`)
    cmd: ["pnpm", "--silent", "--filter", "@tapwire/transport", "exec", "tsx", "bench/shm.ts"],
    env: {},
    quick: { BENCH_ROUNDS: "2" },
  },
  shared: {
    cmd: ["pnpm", "--silent", "--filter", "@tapwire/worker", "bench:shared"],
    env: { TAPWIRE_BENCH_ONLY: "onnx,tax" },
    quick: { TAPWIRE_BENCH_QUICK: "1" },
  },
};

// The targets: one row each. `path` is where the value is in the bench's JSON report: dots between
// keys, `[k=v&k2=v2]` picks the first array element whose fields equal those values (compared as
// strings), `[3]` an index. `target` is "<op> <number>" (op: <=, >=, <, >). `targetPath`, where
// given, points at the bench's own target string; when that parses, it wins over `target` (the
// bench stays the single source), and the JSON says which one was used.
const MiB = 1024 * 1024;
const W4 = "of 3x4096 bf16, slot buffers of 4W rows";
const TARGETS = [
  ...["tcp", "unix"].flatMap((kind) =>
    [1, 4, 16].map((m) => ({
      id: `ec-crc-${kind}-${m}mib`,
      bench: "ec",
      label: `EC / raw throughput, CRC on, ${kind}, ${m} MiB (issue 23)`,
      path: `targets[kind=${kind}&bytes=${m * MiB}].ratio_crc_vs_raw`,
      targetPath: `targets[kind=${kind}&bytes=${m * MiB}].target`,
      target: m === 1 ? ">= 0.8" : ">= 0.9",
    })),
  ),
  ...["tcp", "unix"].map((kind) => ({
    id: `ec-1k-${kind}`,
    bench: "ec",
    label: `EC 1 KiB transfer / raw ZeroMQ round trip, ${kind}, p50 (issue 23)`,
    path: `targets[kind=${kind}&bytes=1024].ratio_ec_1k_to_raw_zmq`,
    targetPath: `targets[kind=${kind}&bytes=1024].target`,
    target: "<= 1.5",
  })),
  {
    id: "ec-shm-data-plane-16mib",
    bench: "ec",
    label: "EC data plane shm (shared region, --shm-share-region) / unix, 16 MiB (issue 23)",
    path: `shm_data_plane[bytes=${16 * MiB}].ratio_shm_vs_unix`,
    targetPath: `shm_data_plane[bytes=${16 * MiB}].target`,
    target: ">= 1.5",
  },
  {
    id: "ec-shm-data-plane-16mib-thread",
    bench: "ec",
    label: "the same, reader with checksumThread (the CRC beside the copy) / unix, 16 MiB (issue 23)",
    path: `shm_data_plane[bytes=${16 * MiB}].ratio_shm_checksum_thread_vs_unix`,
    target: ">= 1.5",
  },
  ...["tcp", "unix"].map((kind) => ({
    id: `client-64x1-${kind}`,
    bench: "client",
    label: `client round / raw, 64 x 1, ${kind}, p50 (issue 20)`,
    path: `results[transport=${kind}&shape=64 slots x 1 row].ring.round_p50_ratio`,
    target: "<= 1.2",
  })),
  {
    id: "pool-2-vs-1",
    bench: "pool",
    label: "pool round, 2 members / 1 member, one worker process (issue 21)",
    path: "one_process.pool2_vs_one_ratio",
    target: "<= 1.2",
  },
  ...[64, 256].map((slots) => ({
    id: `worker-${slots}x8`,
    bench: "worker",
    label: `worker µs per 8-row entry beyond the copy, ${slots} slots (issue 23)`,
    path: `results[case=null ${slots} slots x 8 rows ${W4}].overhead_us_per_entry`,
    target: "< 3",
  })),
  {
    id: "shm-step-p50",
    bench: "shm",
    label: "STEP 64 x 24 KiB, shm / unix round trip, p50 (issue 23)",
    path: "p50_ratio_shm_to_unix",
    targetPath: "targets.p50_ratio",
    target: "<= 0.5",
  },
  {
    id: "shm-step-p99",
    bench: "shm",
    label: "STEP 64 x 24 KiB, shm / unix round trip, p99 (issue 23)",
    path: "p99_ratio_shm_to_unix",
    targetPath: "targets.p99_ratio",
    target: "<= 1.0",
  },
  {
    id: "onnx-throughput",
    bench: "shared",
    label: "ONNX 8 sessions x 8, throughput batched / alone (issue 20)",
    path: "onnx.throughput_ratio_batched_vs_alone",
    target: ">= 2",
  },
  {
    id: "onnx-throughput-blocks",
    bench: "shared",
    label: "the same, median of the blocks (issue 20)",
    path: "onnx.throughput_ratio_median_of_blocks",
    target: ">= 2",
  },
  {
    id: "onnx-p99",
    bench: "shared",
    label: "ONNX p99 batched / 1 session x 64 (issue 20)",
    path: "onnx.p99_ratio_batched_vs_single",
    target: "<= 1.5",
  },
  {
    id: "tax-reference",
    bench: "shared",
    label: "unshared tax K=4 / K=1, mean STEP RTT, reference drafter (issue 20)",
    path: "unshared_tax_reference.ratio_mean",
    target: "<= 1.05",
  },
  {
    id: "tax-null",
    bench: "shared",
    label: "unshared tax K=4 / K=1, mean STEP RTT, null drafter, steady state (issue 20)",
    path: "unshared_tax_null.ratio_mean",
    target: "<= 1.05",
  },
  {
    id: "tax-null-cpu",
    bench: "shared",
    label:
      "unshared tax K=4 / K=1, worker CPU per STEP, null drafter, steady state, median of 8 blocks (issue 20)",
    path: "unshared_tax_null.ratio_cpu",
    target: "<= 1.05",
  },
];
// ---------------------------------------------------------------------------------------------

// Share of all CPUs busy over a 1-s sample (/proc/stat) above this at a bench run's start: not
// idle. The load average lags by a minute: after a bench it stays above 1 for a minute or more
// although the machine is idle, so it cannot tell a busy machine from one a bench just left.
const IDLE_BUSY = 0.1;
const SAMPLE_MS = 1000;

function usage(msg) {
  if (msg) process.stderr.write(`bench-targets: ${msg}\n`);
  process.stderr.write(
    `usage: node scripts/bench-targets.mjs [--runs N] [--only ${Object.keys(BENCHES).join(",")}] [--quick] [--timeout-min M] [--settle-s S]\n`,
  );
  process.exit(msg ? 2 : 0);
}

function parseArgs(argv) {
  const o = { runs: 3, only: Object.keys(BENCHES), quick: false, timeoutMin: 40, settleS: 30 };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => {
      const v = a.includes("=") ? a.slice(a.indexOf("=") + 1) : argv[++i];
      if (v === undefined) usage(`${a} needs a value`);
      return v;
    };
    const name = a.split("=")[0];
    if (a === "--")
      continue; // pnpm may pass it through
    else if (name === "--runs") o.runs = Number(value());
    else if (name === "--only") o.only = value().split(",").filter(Boolean);
    else if (name === "--timeout-min") o.timeoutMin = Number(value());
    else if (name === "--settle-s") o.settleS = Number(value());
    else if (a === "--quick") o.quick = true;
    else if (a === "--help" || a === "-h") usage();
    else usage(`unknown argument ${a}`);
  }
  if (!Number.isInteger(o.runs) || o.runs < 1) usage("--runs must be a positive integer");
  if (!(o.timeoutMin > 0)) usage("--timeout-min must be positive");
  if (!(o.settleS >= 0)) usage("--settle-s must be 0 or more");
  const unknown = o.only.filter((b) => !(b in BENCHES));
  if (unknown.length > 0 || o.only.length === 0) usage(`unknown bench ${unknown.join(",")}`);
  return o;
}

/** The 1, 5 and 15 minute load averages (null where /proc/loadavg does not exist). */
function loadavg() {
  try {
    return fs.readFileSync("/proc/loadavg", "utf8").trim().split(/\s+/).slice(0, 3).map(Number);
  } catch {
    return null;
  }
}

/** Busy and total CPU time of all CPUs so far, from /proc/stat (null where it does not exist). */
function cpuTimes() {
  try {
    const line = fs.readFileSync("/proc/stat", "utf8").split("\n", 1)[0];
    const v = line.trim().split(/\s+/).slice(1).map(Number); // user nice system idle iowait irq softirq steal …
    const total = v.slice(0, 8).reduce((a, b) => a + b, 0);
    return { busy: total - v[3] - (v[4] ?? 0), total };
  } catch {
    return null;
  }
}

/** Share of all CPUs busy over the next `ms` (null without /proc/stat). */
async function cpuBusy(ms) {
  const a = cpuTimes();
  await new Promise((r) => setTimeout(r, ms));
  const b = cpuTimes();
  if (a === null || b === null || b.total === a.total) return null;
  return (b.busy - a.busy) / (b.total - a.total);
}

/**
 * Waits for the machine to be idle before a bench run: samples the CPUs' busy share over 1 s
 * until it is at most IDLE_BUSY, for at most `settleS` seconds (the processes of the previous
 * bench run may still be exiting, and other work may be running). Returns the last sample and
 * the seconds waited.
 */
async function settle(settleS) {
  const t0 = Date.now();
  let busy = await cpuBusy(SAMPLE_MS);
  while (busy !== null && busy > IDLE_BUSY && Date.now() - t0 + SAMPLE_MS <= settleS * 1000) {
    busy = await cpuBusy(SAMPLE_MS);
  }
  return { busy, waited_s: Math.round((Date.now() - t0) / 100) / 10 };
}

/** Splits a field path at the dots outside brackets. */
function splitPath(p) {
  const parts = [];
  let cur = "";
  let depth = 0;
  for (const ch of p) {
    if (ch === "[") depth++;
    if (ch === "]") depth--;
    if (ch === "." && depth === 0) {
      parts.push(cur);
      cur = "";
    } else cur += ch;
  }
  parts.push(cur);
  return parts;
}

/** The value at `p` in `obj` (see TARGETS), or undefined when any step is missing. */
function get(obj, p) {
  let cur = obj;
  for (const part of splitPath(p)) {
    const m = /^([^[]*)(?:\[(.*)\])?$/.exec(part);
    if (m === null) return undefined;
    const [, key, sel] = m;
    if (key !== "") cur = cur !== null && typeof cur === "object" ? cur[key] : undefined;
    if (sel === undefined) continue;
    if (!Array.isArray(cur)) return undefined;
    if (/^\d+$/.test(sel)) cur = cur[Number(sel)];
    else {
      const conds = sel.split("&").map((c) => [c.slice(0, c.indexOf("=")), c.slice(c.indexOf("=") + 1)]);
      cur = cur.find(
        (el) => el !== null && typeof el === "object" && conds.every(([k, v]) => String(el[k]) === v),
      );
    }
  }
  return cur;
}

/** "<= 1.5" → { op, limit }, or null when it is not of that form. */
function parseTarget(s) {
  const m = typeof s === "string" ? /^\s*(<=|>=|<|>)\s*(-?\d+(?:\.\d+)?)\s*$/.exec(s) : null;
  return m === null ? null : { op: m[1], limit: Number(m[2]) };
}

function meets(v, { op, limit }) {
  if (op === "<=") return v <= limit;
  if (op === ">=") return v >= limit;
  if (op === "<") return v < limit;
  return v > limit;
}

/** Runs one bench; resolves with its parsed JSON report or an error, never rejects. */
function runBench(name, run, opts, logDir, idle) {
  const b = BENCHES[name];
  const env = { ...process.env, ...b.env, ...(opts.quick ? b.quick : {}) };
  const errFile = path.join(logDir, `${name}-${run}.err`);
  const errFd = fs.openSync(errFile, "w");
  const load_start = loadavg();
  const t0 = Date.now();
  return new Promise((resolve) => {
    // its own process group, so that a timeout ends the bench and the children it started
    const child = spawn(b.cmd[0], b.cmd.slice(1), { env, stdio: ["ignore", "pipe", errFd], detached: true });
    running = child;
    const chunks = [];
    child.stdout.on("data", (c) => chunks.push(c));
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      try {
        process.kill(-child.pid, "SIGTERM");
      } catch {}
    }, opts.timeoutMin * 60_000);
    const finish = (code, signal, spawnError) => {
      running = null;
      clearTimeout(timer);
      fs.closeSync(errFd);
      const out = Buffer.concat(chunks).toString("utf8");
      const res = {
        bench: name,
        run,
        command: `${Object.entries({ ...b.env, ...(opts.quick ? b.quick : {}) })
          .map(([k, v]) => `${k}=${v} `)
          .join("")}${b.cmd.join(" ")}`,
        seconds: Math.round((Date.now() - t0) / 100) / 10,
        cpu_busy_start: idle.busy === null ? null : Math.round(idle.busy * 1000) / 1000,
        settle_s: idle.waited_s,
        load_start,
        load_end: loadavg(),
        exit: code,
        ...(signal ? { signal } : {}),
        stderr_log: errFile,
      };
      const report = parseReport(out);
      if (report === null) {
        res.error = spawnError
          ? `could not start: ${spawnError.message}`
          : timedOut
            ? `timed out after ${opts.timeoutMin} min, no JSON report`
            : `no JSON report (exit ${code}${signal ? `, ${signal}` : ""})`;
        res.stdout_tail = out.slice(-1000);
        let tail = "";
        try {
          tail = fs.readFileSync(errFile, "utf8").slice(-1500);
        } catch {}
        res.stderr_tail = tail;
      } else {
        fs.writeFileSync(path.join(logDir, `${name}-${run}.json`), `${JSON.stringify(report, null, 2)}\n`);
        if (code !== 0) res.warning = `exited ${code}${signal ? ` (${signal})` : ""} after its JSON report`;
      }
      resolve({ res, report });
    };
    child.on("error", (e) => finish(null, null, e));
    child.on("close", (code, signal) => finish(code, signal, null));
  });
}

/** The bench's JSON report: from the first line that starts with "{" (or the first "{"), or null. */
function parseReport(out) {
  for (const start of [out.search(/^\{/m), out.indexOf("{")]) {
    if (start < 0) continue;
    try {
      const r = JSON.parse(out.slice(start));
      if (r !== null && typeof r === "object") return r;
    } catch {}
  }
  return null;
}

// The bench run in progress: it is in a process group of its own, so a Ctrl-C here does not reach
// it; end it (the group, by its id) before exiting.
let running = null;
for (const sig of ["SIGINT", "SIGTERM"]) {
  process.on(sig, () => {
    if (running !== null) {
      try {
        process.kill(-running.pid, "SIGTERM");
      } catch {}
    }
    process.stderr.write(`bench-targets: ${sig}, stopped\n`);
    process.exit(130);
  });
}

const fmtLoad = (l) => (l === null ? "?" : l[0].toFixed(2));
const fmtBusy = (b) => (b === null ? "?" : `${Math.round(b * 100)} %`);
const fmtDuration = (s) => (s < 120 ? `${s} s` : `${Math.round(s / 6) / 10} min`);
const fmtNum = (v) => (typeof v === "number" ? String(Math.round(v * 1000) / 1000) : "n/a");

function markdown(doc) {
  const runs = doc.runs;
  const head = [
    "target",
    "bench",
    ...Array.from({ length: runs }, (_, i) => `run ${i + 1} (busy at start; load start→end)`),
    "target",
    "met in every run",
  ];
  const lines = [
    `# Issue targets, ${doc.started} (${doc.commit}, ${doc.runs} interleaved run(s)${doc.quick ? ", --quick" : ""})`,
    "",
    `| ${head.join(" | ")} |`,
    `|${head.map(() => "---").join("|")}|`,
  ];
  for (const t of doc.targets) {
    const cells = t.runs.map((r) =>
      r.value === null
        ? `n/a (${t.bench})`
        : `${fmtNum(r.value)}${r.met ? "" : " ✗"} (${fmtBusy(r.cpu_busy_start)}; ${fmtLoad(r.load_start)}→${fmtLoad(r.load_end)})`,
    );
    const met = t.met_every_run === true ? "**yes**" : t.met_every_run === false ? "no" : "n/a";
    lines.push(`| ${t.label} | ${t.bench} | ${cells.join(" | ")} | ${t.target} | ${met} |`);
  }
  lines.push("");
  lines.push(
    `Met in every run: ${doc.summary.met} of ${doc.summary.targets}; missed: ${doc.summary.missed}; n/a: ${doc.summary.na}. ` +
      `Busy: share of all CPUs busy over the 1 s before that row's bench run started (/proc/stat; it waits up to ${doc.settle_s} s for at most ${Math.round(IDLE_BUSY * 100)} %). ` +
      `Load: 1-minute average from /proc/loadavg at the start and end of the run (it lags: a bench leaves it above 1 for a minute). Total ${fmtDuration(doc.seconds)}.`,
  );
  const byBench = new Map();
  for (const r of doc.bench_runs)
    byBench.set(r.bench, [...(byBench.get(r.bench) ?? []), Math.round(r.seconds)]);
  const times = [...byBench].map(([b, xs]) => `${b} ${xs.join(" / ")}`);
  lines.push("", `Seconds per bench run: ${times.join("; ")}.`);
  if (doc.warnings.length > 0) {
    lines.push("", "Warnings:", "");
    for (const w of doc.warnings) lines.push(`- ${w}`);
  }
  return `${lines.join("\n")}\n`;
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const outDir = "bench-results";
  const logDir = path.join(outDir, "targets");
  fs.mkdirSync(logDir, { recursive: true });
  const t0 = Date.now();
  const started = new Date().toISOString();
  const benchRuns = []; // { res, report } in the order run
  for (let run = 1; run <= opts.runs; run++) {
    for (const name of opts.only) {
      const idle = await settle(opts.settleS);
      process.stderr.write(
        `bench-targets: run ${run}/${opts.runs} ${name} (busy ${fmtBusy(idle.busy)} after ${idle.waited_s} s; load ${fmtLoad(loadavg())}) …\n`,
      );
      const r = await runBench(name, run, opts, logDir, idle);
      benchRuns.push(r);
      process.stderr.write(
        `bench-targets: run ${run}/${opts.runs} ${name} ${r.res.error ?? "done"} in ${r.res.seconds} s\n`,
      );
    }
  }
  const warnings = [];
  for (const name of opts.only) {
    const busy = benchRuns.filter(
      (r) => r.res.bench === name && r.res.cpu_busy_start !== null && r.res.cpu_busy_start > IDLE_BUSY,
    );
    if (busy.length > 0)
      warnings.push(
        `not idle: ${name} run ${busy.map((r) => r.res.run).join(", ")} started with ${busy.map((r) => fmtBusy(r.res.cpu_busy_start)).join(", ")} of the CPUs busy (> ${Math.round(IDLE_BUSY * 100)} % after waiting ${opts.settleS} s): its numbers are not the idle-machine ones`,
      );
  }
  for (const { res } of benchRuns) {
    if (res.error) warnings.push(`run ${res.run} of ${res.bench}: ${res.error} (log ${res.stderr_log})`);
    if (res.warning) warnings.push(`run ${res.run} of ${res.bench}: ${res.warning}`);
  }
  const targets = [];
  for (const t of TARGETS.filter((x) => opts.only.includes(x.bench))) {
    const mine = parseTarget(t.target);
    let used = mine;
    let source = "script";
    let targetText = t.target;
    const runs = [];
    const missing = [];
    for (const { res, report } of benchRuns.filter((r) => r.res.bench === t.bench)) {
      const fromBench = t.targetPath && report ? parseTarget(get(report, t.targetPath)) : null;
      if (fromBench !== null) {
        if (fromBench.op !== mine.op || fromBench.limit !== mine.limit)
          warnings.push(
            `${t.id}: the bench's target is ${fromBench.op} ${fromBench.limit}, the script's ${t.target}`,
          );
        used = fromBench;
        targetText = get(report, t.targetPath).trim();
        source = "bench";
      }
      const v = report ? get(report, t.path) : undefined;
      const value = typeof v === "number" && Number.isFinite(v) ? v : null;
      if (report && value === null) missing.push(res.run);
      runs.push({
        run: res.run,
        value,
        met: value === null ? null : meets(value, used),
        cpu_busy_start: res.cpu_busy_start,
        load_start: res.load_start,
        load_end: res.load_end,
      });
    }
    if (missing.length > 0)
      warnings.push(
        `${t.id}: no number at ${t.path} in ${t.bench}'s report (run ${missing.join(", ")}): field renamed? (TARGETS in the script)`,
      );
    const met_every_run = runs.some((r) => r.met === false)
      ? false
      : runs.length > 0 && runs.every((r) => r.met === true)
        ? true
        : null;
    targets.push({
      id: t.id,
      label: t.label,
      bench: t.bench,
      path: t.path,
      target: targetText,
      target_source: source,
      runs,
      met_every_run,
    });
  }
  const doc = {
    tool: "scripts/bench-targets.mjs",
    started,
    commit: gitCommit(),
    node: process.version,
    cpus: os.cpus().length,
    runs: opts.runs,
    quick: opts.quick,
    interleaved: "run 1 of every bench, then run 2 of every bench, …",
    idle_busy_threshold: IDLE_BUSY,
    settle_s: opts.settleS,
    seconds: Math.round((Date.now() - t0) / 1000),
    summary: {
      targets: targets.length,
      met: targets.filter((t) => t.met_every_run === true).length,
      missed: targets.filter((t) => t.met_every_run === false).length,
      na: targets.filter((t) => t.met_every_run === null).length,
    },
    targets,
    bench_runs: benchRuns.map((r) => r.res),
    warnings: [...new Set(warnings)],
  };
  const md = markdown(doc);
  fs.writeFileSync(path.join(outDir, "targets.json"), `${JSON.stringify(doc, null, 2)}\n`);
  fs.writeFileSync(path.join(outDir, "targets.md"), md);
  process.stdout.write(`${JSON.stringify(doc, null, 2)}\n`);
  process.stderr.write(`\n${md}`);
  process.exit(benchRuns.some((r) => r.res.error) ? 1 : 0);
}

/** The commit checked out, with "+dirty" when the tree has changes (the numbers are of that tree). */
function gitCommit() {
  const rev = spawnSync("git", ["rev-parse", "--short", "HEAD"], { encoding: "utf8" });
  if (rev.status !== 0) return "unknown";
  const dirty = spawnSync("git", ["status", "--porcelain", "--untracked-files=no"], { encoding: "utf8" });
  return `${rev.stdout.trim()}${dirty.stdout?.trim() ? "+dirty" : ""}`;
}

await main();
