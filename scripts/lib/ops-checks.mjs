// The operator checks of issue 19 for `pnpm test:ops` (scripts/test-ops.mjs): what an operator
// reads in docs/operations.md and the units is what the bins do. Each check records one line.
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { codeBlocks } from "./readme.mjs";

/** A TCP port on 127.0.0.1 held until `close()`. */
async function heldPort() {
  const s = net.createServer();
  await new Promise((r) => s.listen(0, "127.0.0.1", r));
  return { port: s.address().port, close: () => new Promise((r) => s.close(r)) };
}

/** A port nothing listens on (bound, read back, released). */
async function closedPort() {
  const h = await heldPort();
  await h.close();
  return h.port;
}

/** Runs `node args` to its end (bounded), with its output. */
function node(args, opts = {}) {
  return new Promise((resolve) => {
    const c = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"], ...opts });
    let out = "";
    let err = "";
    c.stdout.on("data", (d) => {
      out += d;
    });
    c.stderr.on("data", (d) => {
      err += d;
    });
    const t = setTimeout(() => c.kill("SIGKILL"), opts.timeoutMs ?? 60_000);
    c.on("exit", (code) => {
      clearTimeout(t);
      resolve({ code, out, err });
    });
  });
}

/** Starts a bin and resolves its parsed listening line (and a stop function). */
export function startListening(bin, args, opts = {}) {
  const c = spawn(opts.cmd ?? process.execPath, opts.cmd ? args : [bin, ...args], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, ...opts.env },
  });
  let log = "";
  const stop = () =>
    new Promise((resolve) => {
      if (c.exitCode !== null || c.signalCode !== null) return resolve(c.exitCode);
      c.removeAllListeners("exit");
      c.once("exit", (code) => resolve(code));
      c.kill("SIGTERM");
      setTimeout(() => c.kill("SIGKILL"), 5000).unref();
    });
  const listening = new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`no listening line in 60 s: ${log.slice(-1500)}`)),
      60_000,
    );
    c.stdout.on("data", (d) => {
      log += d;
      const line = log.split("\n").find((l) => l.includes('"msg":"listening"'));
      if (line) {
        clearTimeout(timer);
        resolve(JSON.parse(line));
      }
    });
    c.stderr.on("data", (d) => {
      log += d;
    });
    c.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`exited ${code} before listening: ${log.slice(-1500)}`));
    });
  });
  return { child: c, listening, stop, log: () => log };
}

/** The ts block that follows `heading` in a markdown text. */
function blockAfter(md, heading) {
  const at = md.indexOf(heading);
  if (at < 0) return null;
  return codeBlocks(md.slice(at))[0]?.code ?? null;
}

/** The `sh` block lines of the first `tapwire-worker` command after `heading`, as argv. */
function commandAfter(md, heading, bin) {
  const at = md.indexOf(heading);
  if (at < 0) return null;
  const sh = codeBlocks(md.slice(at), ["sh"])[0]?.code ?? "";
  const cmd = sh.replace(/\\\n/g, " ");
  const words = cmd.slice(cmd.indexOf(bin)).split("\n")[0].trim().split(/\s+/);
  return words.slice(1);
}

/** Every issue-19 operator check; `record(name, problem|null)`. */
export async function opsChecks({ root, tmp, record }) {
  const WORKER = path.join(root, "packages/worker/dist/bin/worker.js");
  const PRODUCER = path.join(root, "packages/ec-connector/dist/bin/producer.js");
  const ops = fs.readFileSync(path.join(root, "docs/operations.md"), "utf8");
  const NULL = ["--drafter", "null", "--num-taps", "1", "--hidden", "8"];
  const guard = async (name, fn) => {
    try {
      await fn();
    } catch (e) {
      record(name, e.stack ?? String(e));
    }
  };

  // 1. Exporting a head, as docs/operations.md shows it, then --print-identities and a worker.
  await guard("exporting a head (docs/operations.md)", async () => {
    const code = blockAfter(ops, "### Exporting a head");
    if (code === null) return record("operations.md has an 'Exporting a head' example", "missing");
    const dir = path.join(tmp, "head");
    fs.mkdirSync(dir);
    const rm = pathToFileURL(path.join(root, "packages/reference-model/dist/index.js")).href;
    fs.writeFileSync(
      path.join(dir, "export.mjs"),
      code.replaceAll('"@tapwire/reference-model"', JSON.stringify(rm)),
    );
    const ex = await node([path.join(dir, "export.mjs")], { cwd: dir, timeoutMs: 180_000 });
    const file = path.join(dir, "head.safetensors");
    record(
      "the documented head export writes head.safetensors",
      ex.code === 0 && fs.existsSync(file) ? null : `exit ${ex.code}: ${ex.err.slice(-800)}`,
    );
    // the worker command of "### A worker", its drafter part: --weights and the geometry flags
    const argv = commandAfter(ops, "### A worker", "tapwire-worker") ?? [];
    const keep = ["--weights", "--window", "--num-spec", "--num-taps", "--hidden", "--vocab"];
    const flags = [];
    for (let i = 0; i < argv.length; i++) {
      if (keep.includes(argv[i])) flags.push(argv[i], argv[i] === "--weights" ? file : argv[i + 1]);
    }
    const pr = await node([WORKER, "--print-identities", ...flags], { cwd: dir });
    let id = null;
    try {
      id = JSON.parse(pr.out.trim());
    } catch {}
    const geo = (n) => flags[flags.indexOf(n) + 1];
    record(
      "tapwire-worker --print-identities --weights head.safetensors with the documented flags: identities and geometry",
      pr.code === 0 &&
        id &&
        /^[0-9a-f]{64}$/.test(id.drafterIdentity) &&
        id.drafterIdentity !== "0".repeat(64) &&
        String(id.hidden) === geo("--hidden") &&
        String(id.numTaps) === geo("--num-taps") &&
        String(id.vocabSize) === geo("--vocab") &&
        String(id.window) === geo("--window")
        ? null
        : `exit ${pr.code}: ${pr.out}${pr.err}`,
    );
    const w = startListening(WORKER, [...flags, "--listen", "tcp://127.0.0.1:0"]);
    try {
      const l = await w.listening;
      record(
        "a worker serves the exported head with the documented flags, announcing the printed identities",
        id && l.drafterIdentity === id.drafterIdentity && l.markovIdentity === id.markovIdentity
          ? null
          : `${l.drafterIdentity} vs ${id?.drafterIdentity}`,
      );
    } finally {
      await w.stop();
    }
    const def = await node([WORKER, "--print-identities"], { cwd: dir });
    record(
      "tapwire-worker --print-identities without --weights: the default head",
      def.code === 0 && /"drafter":"ReferenceDrafter"/.test(def.out) ? null : `exit ${def.code}: ${def.err}`,
    );
  });

  // 2. One exit code policy: 2 usage/config, 75 bind failure, 1 other (docs/operations.md).
  await guard("exit codes", async () => {
    const held = await heldPort();
    try {
      const at = `tcp://127.0.0.1:${held.port}`;
      const a = await node([WORKER, ...NULL, "--listen", at]);
      record(
        "worker: --listen on a port in use exits 75 naming --listen and the address",
        a.code === 75 && a.err.includes(`--listen: listen on ${at} failed: EADDRINUSE`)
          ? null
          : `exit ${a.code}: ${a.err}`,
      );
      const b = await node([WORKER, ...NULL, "--listen", "tcp://127.0.0.1:0", "--metrics-listen", at]);
      record(
        "worker: --metrics-listen on a port in use exits 75 naming --metrics-listen",
        b.code === 75 && b.err.includes(`--metrics-listen ${at}: cannot bind (EADDRINUSE)`)
          ? null
          : `exit ${b.code}: ${b.err}`,
      );
      const c = await node([PRODUCER, "--control", at, "--data", "tcp://127.0.0.1:0"]);
      record(
        "producer: --control on a port in use exits 75 (systemd retries)",
        c.code === 75 ? null : `exit ${c.code}: ${c.err}`,
      );
    } finally {
      await held.close();
    }
    const ca = path.join(tmp, "certs", "ca.crt");
    const d = await node([WORKER, "--weights", ca, "--listen", "tcp://127.0.0.1:0"]);
    record(
      "worker: --weights ca.crt exits 2 naming the flag and the file, not a header length",
      d.code === 2 && d.err.startsWith(`tapwire-worker: --weights ${ca}: not a draft head safetensors file`)
        ? null
        : `exit ${d.code}: ${d.err}`,
    );
    const e = await node([WORKER, "--max-slots", "0"]);
    record(
      "worker: a bad value exits 2 naming the flag",
      e.code === 2 && /--max-slots 0/.test(e.err) ? null : `exit ${e.code}: ${e.err}`,
    );
    record(
      "operations.md documents exit codes 2, 75 and 1",
      /## Exit codes and supervisors/.test(ops) &&
        /\| 75 \|/.test(ops) &&
        /\| 2 \|/.test(ops) &&
        /\| 1 \|/.test(ops)
        ? null
        : "no exit code table",
    );
  });

  // 3. The takeover default: docs, help and the worker agree.
  await guard("takeover default", async () => {
    const help = spawnSync(process.execPath, [WORKER, "--help"], { encoding: "utf8" }).stdout.replace(
      /\s+/g,
      " ",
    );
    const helpSays = /--takeover POLICY .*?\(default refuse with a token, else allow\)/.test(help);
    const docsWrong = /--takeover allow`?\s*\(default\)/.test(ops.replace(/\s+/g, " "));
    const docsRight = /default is `--takeover refuse`\s+when a token is set/.test(ops);
    record(
      "takeover default: --help and operations.md say refuse with a token, else allow",
      helpSays && docsRight && !docsWrong
        ? null
        : `help ${helpSays}, docs right ${docsRight}, docs wrong ${docsWrong}`,
    );
  });

  // 4. The units: metrics on loopback, exit 2 not restarted.
  await guard("units", async () => {
    const dir = path.join(root, "docs/systemd");
    for (const unit of fs.readdirSync(dir).filter((f) => f.endsWith(".service"))) {
      const text = fs.readFileSync(path.join(dir, unit), "utf8");
      const m = /--metrics-listen\s+tcp:\/\/(\[[^\]]+\]|[^:\s]+):\d+/.exec(text);
      record(
        `${unit}: metrics on loopback, as the docs say`,
        m && (m[1] === "127.0.0.1" || m[1] === "[::1]") ? null : `--metrics-listen host ${m?.[1] ?? "none"}`,
      );
      record(
        `${unit}: Restart=on-failure and RestartPreventExitStatus=2`,
        /^Restart=on-failure$/m.test(text) && /^RestartPreventExitStatus=2$/m.test(text) ? null : "missing",
      );
    }
  });

  // 5. tapwire-make-certs is in @tapwire/transport's tarball (test:pack runs it from one).
  await guard("make-certs packaged", async () => {
    const pkg = JSON.parse(fs.readFileSync(path.join(root, "packages/transport/package.json"), "utf8"));
    const binRel = pkg.bin?.["tapwire-make-certs"];
    const shipped = binRel && pkg.files.some((f) => binRel.replace(/^\.\//, "").startsWith(f));
    record(
      "@tapwire/transport ships tapwire-make-certs (bin, in files)",
      shipped && fs.existsSync(path.join(root, "packages/transport", binRel))
        ? null
        : JSON.stringify(pkg.bin),
    );
  });

  // 6. The client README example against a wrong endpoint says why it is not ready.
  await guard("client example, wrong endpoint", async () => {
    const readme = fs.readFileSync(path.join(root, "packages/client/README.md"), "utf8");
    const code = codeBlocks(readme)[0]?.code ?? "";
    const client = pathToFileURL(path.join(root, "packages/client/dist/index.js")).href;
    const file = path.join(tmp, "client-example.mts");
    fs.writeFileSync(file, code.replaceAll('"@tapwire/client"', JSON.stringify(client)));
    const port = await closedPort();
    const ep = `tcp://127.0.0.1:${port}`;
    const r = await node(["--import", "tsx", file], {
      cwd: root,
      env: { ...process.env, TAPWIRE_ENDPOINT: ep },
    });
    record(
      "client README example against a closed port: says not ready, connection refused, and the address",
      r.code === 0 &&
        r.err.includes(`not ready: connect: connect to ${ep} failed`) &&
        r.err.includes("ECONNREFUSED")
        ? null
        : `exit ${r.code}: ${r.err.slice(-600)} ${r.out.slice(0, 200)}`,
    );
  });
}
