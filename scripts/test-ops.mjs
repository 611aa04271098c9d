#!/usr/bin/env node
// `pnpm test:ops`: the operator guide's artefacts work.
// - docs/systemd/*.service pass `systemd-analyze verify` (with the bins of this workspace in
//   ExecStart) and every flag in their ExecStart is one the bin's `--help` lists;
// - scripts/make-certs.sh makes certificates that work for the setup of
// docs/operations.md "A worker on another host": a real `tapwire-worker` on tls:// with
// --tls-cert/--tls-key/--tls-ca (client certificates required) and --token, and a real
// RemoteDraftClient that verifies the worker by the private CA and the server name. Also checks
// the refusals: a client without a certificate, a client trusting another CA, a wrong server
// name, a wrong token. Needs the workspace built. Writes .ci/results/test-ops.json.
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { opsChecks } from "./lib/ops-checks.mjs";
import { netnsCheck } from "./lib/ops-netns.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const { RemoteDraftClient } = await import(path.join(root, "packages/client/dist/index.js"));
const { makeClient } = await import(path.join(root, "packages/transport/dist/index.js"));

const results = [];
const record = (name, problem) => {
  results.push({ name, ok: problem === null, problem });
  console.log(problem === null ? `ok   ${name}` : `FAIL ${name}: ${problem}`);
};
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tapwire-certs-"));
const certs = path.join(tmp, "certs");
const other = path.join(tmp, "other");
const TOKEN = "s3cret-token-for-the-test";
let worker = null;

try {
  checkUnits();
  const mk = spawnSync("bash", [path.join(root, "scripts/make-certs.sh"), certs, "localhost", "127.0.0.1"], {
    encoding: "utf8",
  });
  record("make-certs.sh writes a CA, server and client certificate", mk.status === 0 ? null : `${mk.stderr}`);
  const again = spawnSync("bash", [path.join(root, "scripts/make-certs.sh"), certs, "localhost"], {
    encoding: "utf8",
  });
  record("make-certs.sh refuses to overwrite", again.status === 1 ? null : `exit ${again.status}`);
  const mode = (fs.statSync(path.join(certs, "server.key")).mode & 0o777).toString(8);
  record("keys are mode 600", mode === "600" ? null : `server.key mode ${mode}`);
  const ext = spawnSync(
    "openssl",
    ["x509", "-in", path.join(certs, "server.crt"), "-noout", "-ext", "subjectAltName"],
    {
      encoding: "utf8",
    },
  );
  record(
    "server certificate names localhost and 127.0.0.1",
    /DNS:localhost/.test(ext.stdout) && /IP Address:127\.0\.0\.1/.test(ext.stdout)
      ? null
      : ext.stdout + ext.stderr,
  );
  spawnSync("bash", [path.join(root, "scripts/make-certs.sh"), other, "localhost"], { encoding: "utf8" });
  const read = (dir, f) => fs.readFileSync(path.join(dir, f));

  // A worker as docs/operations.md runs it, on a tls:// endpoint of port 0.
  worker = spawn(
    process.execPath,
    [
      path.join(root, "packages/worker/dist/bin/worker.js"),
      "--drafter",
      "null",
      "--listen",
      "tls://127.0.0.1:0",
      "--tls-cert",
      path.join(certs, "server.crt"),
      "--tls-key",
      path.join(certs, "server.key"),
      "--tls-ca",
      path.join(certs, "ca.crt"),
      "--token",
      TOKEN,
      "--num-taps",
      "1",
      "--hidden",
      "8",
      "--window",
      "8",
      "--num-spec",
      "4",
      "--vocab",
      "1000",
    ],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  let log = "";
  const endpoint = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no listening line in 20 s: ${log}`)), 20_000);
    worker.stdout.on("data", (d) => {
      log += d;
      const line = log.split("\n").find((l) => l.includes('"msg":"listening"'));
      if (line) {
        clearTimeout(timer);
        resolve(JSON.parse(line).endpoints[0]);
      }
    });
    worker.stderr.on("data", (d) => {
      log += d;
    });
    worker.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`worker exited ${code}: ${log}`));
    });
  });
  record(`worker listens on ${endpoint}`, endpoint.startsWith("tls://") ? null : endpoint);

  const clientWith = (tls, token = TOKEN) =>
    new RemoteDraftClient({
      endpoint,
      drafterIdentity: new Uint8Array(32),
      markovIdentity: new Uint8Array(32),
      window: 8,
      numSpec: 4,
      numTaps: 1,
      hidden: 8,
      vocabSize: 1000,
      maxSlots: 64,
      maxRowsPerStep: 256,
      token,
      transportOptions: { tls },
      backoffMs: 60_000,
    });
  const goodTls = {
    ca: read(certs, "ca.crt"),
    cert: read(certs, "client.crt"),
    key: read(certs, "client.key"),
    servername: "localhost",
  };

  const good = clientWith(goodTls);
  const ready = await good.waitReady(10_000);
  let stats = null;
  if (ready) stats = await good.stats().catch((e) => e);
  await good.close();
  record(
    "client with the CA, its certificate and the token: ready, STATS answers",
    ready && stats && !(stats instanceof Error) ? null : `ready ${ready}, ${good.lastError ?? stats}`,
  );

  const wrongToken = clientWith(goodTls, "not-the-token");
  const wt = await wrongToken.waitReady(3_000);
  const disabled = wrongToken.disabled;
  const why = wrongToken.disabledReason;
  await wrongToken.close();
  record(
    "client with a wrong token: disabled (UNAUTHORIZED, CONTRACT 9.3)",
    wt === false && disabled && /unauthori[sz]ed/i.test(String(why))
      ? null
      : `ready ${wt}, disabled ${disabled}: ${why}`,
  );

  // The TLS refusals, on the transport alone (no HELLO involved).
  const tryConnect = async (tls) => {
    const c = makeClient(endpoint, { tls });
    try {
      await c.connect(5_000);
      // A server refusing a missing client certificate may only say so after the handshake.
      const buf = new Uint8Array(1024);
      await c.request(new Uint8Array(24), buf, 5_000);
      return "connected";
    } catch (e) {
      return e.code ?? String(e);
    } finally {
      c.close();
    }
  };
  const noCert = await tryConnect({ ca: goodTls.ca, servername: "localhost" });
  record("client without a certificate: refused", noCert !== "connected" ? null : noCert);
  const otherCa = await tryConnect({ ...goodTls, ca: read(other, "ca.crt") });
  record("client trusting another CA: TRANSPORT_CONNECT", otherCa === "TRANSPORT_CONNECT" ? null : otherCa);
  const otherClient = await tryConnect({
    ...goodTls,
    cert: read(other, "client.crt"),
    key: read(other, "client.key"),
  });
  record("client certificate from another CA: refused", otherClient !== "connected" ? null : otherClient);
  const wrongName = await tryConnect({ ...goodTls, servername: "drafter.example" });
  record("wrong server name: TRANSPORT_CONNECT", wrongName === "TRANSPORT_CONNECT" ? null : wrongName);
  // issue 19: the operator's defects (scripts/lib/ops-checks.mjs) and the two-namespace setup
  await opsChecks({ root, tmp, record });
  await netnsCheck({ root, tmp, record, headFile: path.join(tmp, "head", "head.safetensors") });
} catch (e) {
  record("test-certs", e.stack ?? String(e));
} finally {
  if (worker && worker.exitCode === null) {
    const exited = new Promise((r) => worker.once("exit", r));
    worker.kill("SIGTERM");
    await Promise.race([exited, new Promise((r) => setTimeout(r, 5000))]);
    if (worker.exitCode === null) worker.kill("SIGKILL");
  }
  fs.rmSync(tmp, { recursive: true, force: true });
}

/** docs/systemd units: systemd-analyze verify, and their flags against the bins' --help. */
function checkUnits() {
  const bins = {
    "tapwire-worker": path.join(root, "packages/worker/dist/bin/worker.js"),
    "tapwire-ec-producer": path.join(root, "packages/ec-connector/dist/bin/producer.js"),
  };
  const dir = path.join(root, "docs/systemd");
  const units = fs.readdirSync(dir).filter((f) => f.endsWith(".service"));
  record("docs/systemd has the worker and producer units", units.length >= 2 ? null : units.join(", "));
  const scratch = path.join(tmp, "units");
  fs.mkdirSync(scratch);
  for (const unit of units) {
    const text = fs.readFileSync(path.join(dir, unit), "utf8");
    const exec = /^ExecStart=((?:.*\\\n)*.*)$/m.exec(text)?.[1].replace(/\\\n/g, " ") ?? "";
    const [cmd, ...args] = exec.trim().split(/\s+/);
    const name = path.basename(cmd ?? "");
    if (!bins[name]) {
      record(`${unit} ExecStart`, `runs ${cmd}, not a tapwire bin`);
      continue;
    }
    const help = spawnSync(process.execPath, [bins[name], "--help"], { encoding: "utf8" });
    const listed = new Set(`${help.stdout}${help.stderr}`.match(/--[a-z][a-z0-9-]*/g) ?? []);
    const unknown = args.filter((a) => a.startsWith("--") && !listed.has(a));
    record(
      `${unit}: every ExecStart flag is in ${name} --help`,
      unknown.length === 0 ? null : unknown.join(", "),
    );
    // verify wants an executable ExecStart and an EnvironmentFile it can read: point both here
    // (a wrapper, since a fresh build leaves dist/bin/*.js without the exec bit; npm sets it).
    const wrapper = path.join(scratch, name);
    fs.writeFileSync(wrapper, `#!/bin/sh\nexec "${process.execPath}" "${bins[name]}" "$@"\n`, {
      mode: 0o755,
    });
    const local = text.replace(cmd, wrapper).replace(/^EnvironmentFile=(?!-)/m, "EnvironmentFile=-");
    fs.writeFileSync(path.join(scratch, unit), local);
    const v = spawnSync("systemd-analyze", ["verify", path.join(scratch, unit)], { encoding: "utf8" });
    const said = `${v.stdout}${v.stderr}`.trim();
    record(
      `${unit}: systemd-analyze verify`,
      v.error ? v.error.message : v.status === 0 && said === "" ? null : said || `exit ${v.status}`,
    );
  }
}

const passed = results.filter((r) => r.ok).length;
const failed = results.length - passed;
fs.mkdirSync(path.join(root, ".ci/results"), { recursive: true });
fs.writeFileSync(
  path.join(root, ".ci/results/test-ops.json"),
  `${JSON.stringify({ name: "test:ops", passed, failed, results }, null, 2)}\n`,
);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
