#!/usr/bin/env node
// `pnpm test:pack`: proves the release before it ships (issue 15 item 5).
//   1. `pnpm -r pack` of every public package (every non-private package under packages/).
//   2. Each tarball: contents (LICENSE = the root LICENSE, CHANGELOG.md, README.md without relative
//      links, js maps embedding their sources, no declaration maps, no `workspace:` ranges, a real
//      repository with its directory), `publint --strict`, `attw --profile esm-only`.
//   3. Each package in a scratch project outside the workspace (mktemp under /tmp): `npm install`
//      of its README install line, with every @tapwire package coming from these tarballs
//      (overrides) and third-party ones from the registry, `--ignore-scripts` and then
//      `npm rebuild zeromq` (zeromq's script allowed, onnxruntime-node's not, docs/install.md);
//      its README ts blocks compiled with `tsc --strict`, the first one run, every bin's `--help`.
//   4. `changeset version` on a throwaway copy of the repository, with its CHANGELOGs checked.
// Prints the node_modules size of every scratch install, a summary and "N passed, N failed";
// writes .ci/results/test-pack.json; exits 1 on any failure.
// Flags: --keep (leave the temp folder), --only <folder,...> (scratch projects for these only).
import { spawn, spawnSync } from "node:child_process";
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
const argv = process.argv.slice(2);
const keep = argv.includes("--keep");
const onlyArg = argv.indexOf("--only");
const only = onlyArg >= 0 ? new Set((argv[onlyArg + 1] ?? "").split(",")) : null;
const started = Date.now();
const EXAMPLE_TIMEOUT_MS = 60_000;
const INSTALL_TIMEOUT_MS = 180_000;
const INSTALL_CONCURRENCY = 3;
const rootPkg = JSON.parse(fs.readFileSync(path.join(root, "package.json"), "utf8"));
const tsc = path.join(root, "node_modules/typescript/bin/tsc");
const bin = (name) => path.join(root, "node_modules/.bin", name);

/** The client README's "Start a worker (`tapwire-worker …`), then:" before its example. */
const PREREQ_RE = /Start a worker \(`(tapwire-worker[^`]*)`\)/;
const results = [];
const record = (group, name, problem, detail) => {
  results.push({ group, name, ok: problem === null, problem, detail });
  const line = problem === null ? `ok   ${group}: ${name}` : `FAIL ${group}: ${name}: ${problem}`;
  console.log(detail && problem === null ? `${line} (${detail})` : line);
};
const tail = (s, n = 1500) => (s.length > n ? `…${s.slice(-n)}` : s).trim();

/** Runs a command to completion (async, so scratch installs overlap), with a hard timeout. */
function run(cmd, args, { cwd, timeoutMs = 120_000, env } = {}) {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, {
      cwd,
      env: { ...process.env, ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    let err = "";
    child.stdout.on("data", (d) => {
      out += d;
    });
    child.stderr.on("data", (d) => {
      err += d;
    });
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill("SIGKILL");
    }, timeoutMs);
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, timedOut, stdout: out, stderr: err });
    });
    child.on("error", (e) => {
      clearTimeout(timer);
      resolve({ code: -1, signal: null, timedOut, stdout: out, stderr: `${err}${e.message}` });
    });
  });
}
const failure = (r) =>
  r.timedOut ? "timed out" : `exit ${r.code ?? r.signal}: ${tail(`${r.stdout}\n${r.stderr}`)}`;

async function pool(items, n, fn) {
  const queue = [...items];
  await Promise.all(
    Array.from({ length: Math.min(n, queue.length) }, async () => {
      while (queue.length > 0) await fn(queue.shift());
    }),
  );
}

const duKiB = (p) => {
  if (!fs.existsSync(p)) return 0;
  const r = spawnSync("du", ["-sk", p], { encoding: "utf8" });
  return Number.parseInt(r.stdout, 10) || 0;
};
const mib = (kib) => `${(kib / 1024).toFixed(1)} MiB`;

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tapwire-pack-"));
const tarballs = path.join(tmp, "tarballs");
fs.mkdirSync(tarballs);
const pkgs = publicPackages(root);
const byName = new Map(pkgs.map((p) => [p.pkg.name, p]));
const rootLicense = fs.readFileSync(path.join(root, "LICENSE"), "utf8");
const sizes = [];

try {
  // 1. pack
  const filters = pkgs.flatMap((p) => ["--filter", p.pkg.name]);
  const packed = await run("pnpm", ["-r", ...filters, "pack", "--pack-destination", tarballs], { cwd: root });
  record("pack", `pnpm -r pack (${pkgs.length} public packages)`, packed.code === 0 ? null : failure(packed));
  for (const p of pkgs) {
    p.tgz = path.join(tarballs, `${p.pkg.name.slice(1).replace("/", "-")}-${p.pkg.version}.tgz`);
    if (!fs.existsSync(p.tgz)) {
      record("pack", p.pkg.name, `no tarball ${path.basename(p.tgz)}`);
      p.tgz = null;
    }
  }

  // 2. tarball contents, publint, attw
  for (const p of pkgs.filter((q) => q.tgz)) {
    const x = path.join(tmp, "extract", p.folder);
    fs.mkdirSync(x, { recursive: true });
    spawnSync("tar", ["xzf", p.tgz, "-C", x]);
    const dir = path.join(x, "package");
    const files = fs.readdirSync(dir, { recursive: true }).map(String);
    const problems = [];
    for (const f of ["LICENSE", "CHANGELOG.md", "README.md", "package.json"]) {
      if (!files.includes(f)) problems.push(`no ${f}`);
    }
    if (files.includes("LICENSE") && fs.readFileSync(path.join(dir, "LICENSE"), "utf8") !== rootLicense) {
      problems.push("LICENSE differs from the root LICENSE");
    }
    const dmaps = files.filter((f) => f.endsWith(".d.ts.map"));
    if (dmaps.length > 0) problems.push(`declaration maps shipped (${dmaps[0]}, …)`);
    for (const f of files.filter((g) => g.endsWith(".js.map"))) {
      const map = JSON.parse(fs.readFileSync(path.join(dir, f), "utf8"));
      const sc = map.sourcesContent ?? [];
      if (sc.length !== map.sources.length || sc.some((s) => typeof s !== "string")) {
        problems.push(`${f} lacks sourcesContent for its sources`);
        break;
      }
    }
    const tpkg = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8"));
    for (const field of ["dependencies", "peerDependencies", "optionalDependencies"]) {
      for (const [dep, range] of Object.entries(tpkg[field] ?? {})) {
        if (String(range).startsWith("workspace:")) problems.push(`${field}.${dep} is ${range}`);
      }
    }
    const repo = tpkg.repository ?? {};
    if (!/^git\+https:\/\/github\.com\/[\w-]+\/[\w-]+\.git$/.test(repo.url ?? "")) {
      problems.push(`repository.url ${JSON.stringify(repo.url)}`);
    }
    if (repo.directory !== `packages/${p.folder}`) problems.push(`repository.directory ${repo.directory}`);
    if (tpkg.license !== "Apache-2.0") problems.push(`license ${tpkg.license}`);
    for (const [name, file] of Object.entries(tpkg.bin ?? {})) {
      if (!fs.existsSync(path.join(dir, file))) problems.push(`bin ${name} -> ${file} not in the tarball`);
    }
    if (files.includes("README.md")) {
      const rel = relativeLinks(fs.readFileSync(path.join(dir, "README.md"), "utf8"));
      if (rel.length > 0) problems.push(`README relative links: ${rel.join(", ")}`);
    }
    const kib = Math.ceil(fs.statSync(p.tgz).size / 1024);
    record("contents", p.pkg.name, problems.length === 0 ? null : problems.join("; "), `${kib} KiB packed`);
    p.tpkg = tpkg;
  }
  await pool(
    pkgs.filter((q) => q.tgz),
    2,
    async (p) => {
      const pl = await run(bin("publint"), ["run", p.tgz, "--strict"], { cwd: tmp });
      const plOut = `${pl.stdout}${pl.stderr}`;
      // publint exits 0 with suggestions; --strict turns warnings into errors (exit 1).
      record(
        "publint --strict",
        p.pkg.name,
        pl.code === 0 ? null : failure(pl),
        /Suggestions/.test(plOut) ? "suggestions printed" : undefined,
      );
      const at = await run(
        bin("attw"),
        [
          p.tgz,
          "--profile",
          "esm-only",
          "--no-definitely-typed",
          "--format",
          "ascii",
          "--no-color",
          "--no-emoji",
        ],
        { cwd: tmp },
      );
      record("attw --profile esm-only", p.pkg.name, at.code === 0 ? null : failure(at));
    },
  );

  // 3. scratch projects
  const closure = (name, seen = new Set()) => {
    if (seen.has(name)) return seen;
    seen.add(name);
    const p = byName.get(name);
    const deps = { ...(p?.pkg.dependencies ?? {}), ...(p?.pkg.peerDependencies ?? {}) };
    const optionalPeers = p?.pkg.peerDependenciesMeta ?? {};
    for (const dep of Object.keys(deps)) {
      if (dep.startsWith("@tapwire/") && !optionalPeers[dep]?.optional) closure(dep, seen);
    }
    return seen;
  };
  const knownRange = (dep) => {
    for (const p of pkgs) {
      for (const f of ["dependencies", "peerDependencies", "optionalDependencies"]) {
        const r = p.pkg[f]?.[dep];
        if (r && !r.startsWith("workspace:")) return r;
      }
    }
    return "latest";
  };
  // An example that needs a running worker (startPrerequisite) brings the worker's install along.
  if (only !== null) {
    for (const p of pkgs.filter((q) => only.has(q.folder))) {
      const f = path.join(p.dir, "README.md");
      if (fs.existsSync(f) && PREREQ_RE.test(fs.readFileSync(f, "utf8").replace(/\n/g, " ")))
        only.add("worker");
    }
  }
  const scratchPkgs = pkgs.filter((p) => p.tgz && (only === null || only.has(p.folder)));
  await pool(scratchPkgs, INSTALL_CONCURRENCY, async (p) => {
    try {
      await scratchProject(p);
    } catch (e) {
      record("install", p.pkg.name, e.stack ?? String(e));
    }
  });
  async function scratchProject(p) {
    const readmeFile = path.join(p.dir, "README.md");
    if (!fs.existsSync(readmeFile)) {
      record(
        "install",
        p.pkg.name,
        "no README.md (its install line and example are what this installs and runs)",
      );
      return;
    }
    const s = fs.mkdtempSync(path.join(os.tmpdir(), `tapwire-scratch-${p.folder}-`));
    p.scratch = s;
    const readme = fs.readFileSync(readmeFile, "utf8");
    const names = installLine(readme) ?? [p.pkg.name];
    const tap = new Set();
    for (const n of names) if (n.startsWith("@tapwire/")) for (const d of closure(n)) tap.add(d);
    const fileSpec = (n) => {
      const q = byName.get(n);
      if (!q?.tgz) throw new Error(`${n}: no tarball (not a public package under packages/)`);
      return `file:${q.tgz}`;
    };
    const dependencies = {};
    for (const n of names) dependencies[n] = n.startsWith("@tapwire/") ? fileSpec(n) : knownRange(n);
    const overrides = {};
    for (const n of tap) overrides[n] = fileSpec(n);
    const scratchJson = {
      name: `scratch-${p.folder}`,
      private: true,
      type: "module",
      dependencies,
      devDependencies: { "@types/node": rootPkg.devDependencies["@types/node"] },
      overrides,
    };
    fs.writeFileSync(path.join(s, "package.json"), `${JSON.stringify(scratchJson, null, 2)}\n`);
    const npmArgs = ["--no-audit", "--no-fund", "--loglevel=error"];
    const inst = await run("npm", ["install", "--ignore-scripts", ...npmArgs], {
      cwd: s,
      timeoutMs: INSTALL_TIMEOUT_MS,
    });
    if (inst.code !== 0) {
      record("install", p.pkg.name, failure(inst));
      return;
    }
    if (fs.existsSync(path.join(s, "node_modules/zeromq"))) {
      const rb = await run("npm", ["rebuild", "zeromq", ...npmArgs], {
        cwd: s,
        timeoutMs: INSTALL_TIMEOUT_MS,
      });
      if (rb.code !== 0) {
        record("install", p.pkg.name, `npm rebuild zeromq: ${failure(rb)}`);
        return;
      }
    }
    const lock = JSON.parse(fs.readFileSync(path.join(s, "package-lock.json"), "utf8"));
    const notFromTarball = Object.entries(lock.packages ?? {})
      .filter(([k]) => /(^|\/)node_modules\/@tapwire\//.test(k))
      .filter(([, v]) => !String(v.resolved ?? "").startsWith("file:") && !v.link)
      .map(([k, v]) => `${k} from ${v.resolved}`);
    const nm = path.join(s, "node_modules");
    const total = duKiB(nm);
    const types = duKiB(path.join(nm, "@types/node"));
    const zmq = duKiB(path.join(nm, "zeromq"));
    p.size = { total, withoutTypes: total - types, zeromq: zmq };
    sizes.push({ name: p.pkg.name, install: names.join(" "), ...p.size });
    record(
      "install",
      `${p.pkg.name} (npm install ${names.join(" ")})`,
      notFromTarball.length === 0 ? null : `not from the tarballs: ${notFromTarball.join(", ")}`,
      `node_modules ${mib(total)}, ${mib(total - types)} without @types/node${zmq ? `, zeromq ${mib(zmq)}` : ", no zeromq"}`,
    );
    p.installed = notFromTarball.length === 0;
    if (tap.has("@tapwire/transport") && zmq === 0) {
      // without zeromq a zmq+ endpoint must fail with the typed error naming the install command
      const probe =
        'import("@tapwire/transport").then(async (t) => { try { await t.makeClient("zmq+tcp://127.0.0.1:9").connect(500);' +
        ' console.log("connected"); } catch (e) { console.log(e.code, "|", e.message); } })';
      const pr = await run(process.execPath, ["--input-type=module", "-e", probe], {
        cwd: s,
        timeoutMs: 20_000,
      });
      const out = pr.stdout.trim();
      record(
        "zmq+ endpoint without zeromq",
        p.pkg.name,
        /^TRANSPORT_ZMQ_MISSING \|.*(npm i|npm install|pnpm add) zeromq/.test(out)
          ? null
          : `got: ${tail(out || pr.stderr)}`,
        "TRANSPORT_ZMQ_MISSING",
      );
    }
    // zeromq (33 MB) belongs in an install only when a package of it depends on it outright;
    // an optional peer (transport's) must not drag it in.
    const needsZmq = [...tap].some((n) => byName.get(n)?.tpkg?.dependencies?.zeromq !== undefined);
    const hasZmq = zmq > 0;
    record(
      "install without unneeded zeromq",
      p.pkg.name,
      needsZmq === hasZmq
        ? null
        : needsZmq
          ? "zeromq missing"
          : `zeromq installed (${mib(zmq)}) though nothing depends on it`,
      needsZmq ? "a dependency needs it" : "not installed",
    );
    // issue 23: koffi is transport's optional peer too; without it shm+unix:// falls back to the
    // socket with TRANSPORT_SHM_UNAVAILABLE naming the install command, and requests still work
    const koffi = duKiB(path.join(nm, "koffi"));
    if (tap.has("@tapwire/transport") && koffi === 0) {
      const sock = path.join(s, "shm.sock");
      const probe =
        'import("@tapwire/transport").then(async (t) => { const seen = []; const srv = await t.listen("shm+unix://' +
        sock +
        '", (r) => r); const c = t.makeClient(srv.endpoint, { onShmFallback: (e) => seen.push(e.code + " | " + e.message) });' +
        ' await c.connect(2000); const b = Buffer.alloc(64); const n = await c.request(Buffer.from("hi"), b, 2000);' +
        ' console.log(seen.join(";"), "|", b.subarray(0, n).toString()); c.close(); await srv.close(); })';
      const pr = await run(process.execPath, ["--input-type=module", "-e", probe], {
        cwd: s,
        timeoutMs: 20_000,
      });
      const out = pr.stdout.trim();
      record(
        "shm+ endpoint without koffi",
        p.pkg.name,
        /^TRANSPORT_SHM_UNAVAILABLE \|.*(npm i|pnpm add) koffi.*\| hi$/.test(out)
          ? null
          : `got: ${tail(out || pr.stderr)}`,
        "falls back to the socket",
      );
    }

    // README examples: every ts block compiled under --strict
    const blocks = codeBlocks(readme);
    p.blocks = blocks;
    fs.mkdirSync(path.join(s, "examples"));
    blocks.forEach((b, i) => {
      fs.writeFileSync(path.join(s, "examples", `example-${i}.ts`), `${b.code}export {};\n`);
    });
    const imported = blocks.flatMap((b) => bareImports(b.code));
    const missing = [...new Set(imported)].filter((n) => !names.includes(n));
    record(
      "README install line",
      p.pkg.name,
      missing.length === 0
        ? null
        : `the examples import ${missing.join(", ")}, not in "npm install ${names.join(" ")}"`,
    );
    if (blocks.length === 0) {
      record("README example", p.pkg.name, "no ts code block");
      return;
    }
    fs.writeFileSync(
      path.join(s, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: { ...EXAMPLE_COMPILER_OPTIONS, rootDir: "examples", outDir: "out" },
        include: ["examples"],
      }),
    );
    const tc = await run(process.execPath, [tsc, "-p", "tsconfig.json", "--pretty", "false"], { cwd: s });
    record(
      "README tsc --strict",
      `${p.pkg.name} (${blocks.length} block${blocks.length > 1 ? "s" : ""})`,
      tc.code === 0 ? null : failure(tc),
    );
    p.compiled = tc.code === 0;

    // our own declarations, every one checked (skipLibCheck off); errors in third-party
    // declarations are theirs and not counted here
    fs.writeFileSync(
      path.join(s, "types-check.ts"),
      `${names
        .filter((n) => n.startsWith("@tapwire/"))
        .map((n, i) => `import * as m${i} from "${n}";\nexport { m${i} };\n`)
        .join("")}`,
    );
    fs.writeFileSync(
      path.join(s, "tsconfig.types.json"),
      JSON.stringify({
        compilerOptions: { ...EXAMPLE_COMPILER_OPTIONS, skipLibCheck: false, noEmit: true },
        files: ["types-check.ts"],
      }),
    );
    const dt = await run(process.execPath, [tsc, "-p", "tsconfig.types.json", "--pretty", "false"], {
      cwd: s,
    });
    const own = `${dt.stdout}${dt.stderr}`
      .split("\n")
      .filter(
        (l) => /error TS/.test(l) && (/node_modules\/@tapwire\//.test(l) || l.startsWith("types-check.ts")),
      );
    const foreign =
      `${dt.stdout}${dt.stderr}`.split("\n").filter((l) => /error TS/.test(l)).length - own.length;
    record(
      "declarations (skipLibCheck off)",
      p.pkg.name,
      own.length === 0 ? null : tail(own.join("\n")),
      foreign > 0 ? `${foreign} errors in third-party declarations not counted` : undefined,
    );
  }

  // bins --help, then the first README example of each package (sequential: examples bind ports)
  for (const p of scratchPkgs.filter((q) => q.installed)) {
    for (const name of Object.keys(p.tpkg.bin ?? {})) {
      const h = await run(path.join(p.scratch, "node_modules/.bin", name), ["--help"], {
        cwd: p.scratch,
        timeoutMs: 30_000,
      });
      const ok = h.code === 0 && h.stdout.trim().length > 0;
      record(
        "bin --help",
        `${name} (${p.pkg.name})`,
        ok ? null : failure(h),
        ok ? `${h.stdout.split("\n").length} lines` : undefined,
      );
    }
  }
  // An npm user with @tapwire/worker alone asks for --drafter onnx: exit 2 (a usage error,
  // never retried by systemd) with the command that installs the drafter (issue 19).
  const workerAlone = scratchPkgs.find((q) => q.installed && q.pkg.name === "@tapwire/worker");
  if (workerAlone) {
    const r = await run(
      path.join(workerAlone.scratch, "node_modules/.bin/tapwire-worker"),
      ["--drafter", "onnx", "--model", "head.onnx", "--listen", "tcp://127.0.0.1:0"],
      { cwd: workerAlone.scratch, timeoutMs: 30_000 },
    );
    const ok = r.code === 2 && r.stderr.includes("npm install @tapwire/drafter-onnx");
    record(
      "bin usage",
      "tapwire-worker --drafter onnx without @tapwire/drafter-onnx",
      ok ? null : failure(r),
    );
  }
  // tapwire-make-certs ships in @tapwire/transport's tarball (issue 19): npm users make the
  // certificates of docs/operations.md without a clone of the repository.
  const transport = scratchPkgs.find((q) => q.installed && q.pkg.name === "@tapwire/transport");
  if (transport) {
    const out = path.join(transport.scratch, "certs");
    const mk = await run(
      path.join(transport.scratch, "node_modules/.bin/tapwire-make-certs"),
      [out, "localhost", "127.0.0.1"],
      { cwd: transport.scratch, timeoutMs: 60_000 },
    );
    const made = ["ca.crt", "server.crt", "server.key", "client.crt", "client.key"].filter((f) =>
      fs.existsSync(path.join(out, f)),
    );
    record(
      "tapwire-make-certs from the tarball",
      "@tapwire/transport",
      mk.code === 0 && made.length === 5 ? null : `${failure(mk)} (made: ${made.join(", ") || "nothing"})`,
    );
  }
  for (const p of scratchPkgs.filter((q) => q.compiled)) {
    const readme = fs.readFileSync(path.join(p.dir, "README.md"), "utf8");
    let service = null;
    try {
      service = await startPrerequisite(readme);
    } catch (e) {
      record("README example runs", p.pkg.name, `prerequisite: ${e.message}`);
      continue;
    }
    const ex = await run(process.execPath, [path.join(p.scratch, "out/example-0.js")], {
      cwd: p.scratch,
      timeoutMs: EXAMPLE_TIMEOUT_MS,
      // the worker bound port 0 (no fixed port, issue 19): its endpoint, as the README says
      ...(service ? { env: { TAPWIRE_ENDPOINT: service.endpoint } } : {}),
    });
    if (service) await service.stop();
    const firstLine = ex.stdout.trim().split("\n")[0] ?? "";
    record(
      "README example runs",
      `${p.pkg.name} (README line ${p.blocks[0].line}${service ? `, with ${service.what}` : ""})`,
      ex.code === 0 && !ex.timedOut ? null : failure(ex),
      firstLine ? `prints ${JSON.stringify(firstLine.slice(0, 80))}` : "prints nothing",
    );
  }

  // 4. changeset version on a throwaway copy
  await changesetDryRun();
} catch (e) {
  record("test:pack", "internal error", e.stack ?? String(e));
} finally {
  if (!keep) {
    fs.rmSync(tmp, { recursive: true, force: true });
    for (const p of pkgs) if (p.scratch) fs.rmSync(p.scratch, { recursive: true, force: true });
  } else {
    console.log(
      `kept ${tmp} and the scratch projects: ${pkgs
        .map((p) => p.scratch)
        .filter(Boolean)
        .join(" ")}`,
    );
  }
}

/**
 * An example that needs a running peer (the client README starts a worker first) gets it from
 * another scratch project's installed bin, with the command line the README gives.
 */
async function startPrerequisite(readme) {
  const m = PREREQ_RE.exec(readme.replace(/\n/g, " "));
  if (!m) return null;
  const worker = byName.get("@tapwire/worker");
  if (!worker?.installed) throw new Error("needs the @tapwire/worker scratch install (not run or failed)");
  const args = m[1].trim().split(/\s+/).slice(1);
  const listen = args[args.indexOf("--listen") + 1] ?? "";
  if (!/:0$/.test(listen)) throw new Error(`the README's worker listens on ${listen}: use port 0 (issue 19)`);
  const child = spawn(path.join(worker.scratch, "node_modules/.bin/tapwire-worker"), args, {
    cwd: worker.scratch,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  const endpoint = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`tapwire-worker ${args.join(" ")}: no "listening" line in 20 s: ${tail(out)}`));
    }, 20_000);
    const onData = (d) => {
      out += d;
      const line = out.split("\n").find((l) => l.includes('"msg":"listening"'));
      if (line !== undefined) {
        clearTimeout(timer);
        resolve(JSON.parse(line).endpoints[0]);
      }
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", (d) => {
      out += d;
    });
    child.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`tapwire-worker ${args.join(" ")} exited ${code}: ${tail(out)}`));
    });
  });
  return {
    what: "tapwire-worker from the worker's scratch install",
    endpoint,
    stop: () =>
      new Promise((resolve) => {
        if (child.exitCode !== null) return resolve();
        child.removeAllListeners("exit");
        child.once("exit", resolve);
        child.kill("SIGTERM");
        setTimeout(() => child.kill("SIGKILL"), 5000).unref();
      }),
  };
}

/** `changeset version` on a copy of the tracked files; checks the versions and CHANGELOGs. */
async function changesetDryRun() {
  const copy = path.join(tmp, "repo");
  const ls = spawnSync("git", ["ls-files", "-z"], { cwd: root, encoding: "utf8", maxBuffer: 64 << 20 });
  if (ls.status !== 0) {
    record("changeset version", "copy", `git ls-files: ${ls.stderr}`);
    return;
  }
  for (const f of ls.stdout.split("\0").filter(Boolean)) {
    const src = path.join(root, f);
    if (!fs.existsSync(src)) continue; // deleted in the working tree
    fs.mkdirSync(path.dirname(path.join(copy, f)), { recursive: true });
    fs.copyFileSync(src, path.join(copy, f));
  }
  fs.symlinkSync(path.join(root, "node_modules"), path.join(copy, "node_modules"));
  const csDir = path.join(copy, ".changeset");
  const config = JSON.parse(fs.readFileSync(path.join(csDir, "config.json"), "utf8"));
  const ignored = new Set(config.ignore ?? []);
  const changesets = [];
  for (const f of fs.readdirSync(csDir).filter((g) => g.endsWith(".md") && g !== "README.md")) {
    const text = fs.readFileSync(path.join(csDir, f), "utf8");
    const m = /^---\n([\s\S]*?)\n---\n([\s\S]*)$/.exec(text);
    if (!m) {
      record("changeset version", `.changeset/${f}`, "no frontmatter");
      continue;
    }
    const releases = {};
    for (const line of m[1].split("\n").filter((l) => l.trim())) {
      const r = /^\s*["']?(@?[^"':]+)["']?\s*:\s*(major|minor|patch)\s*$/.exec(line);
      if (!r) record("changeset version", `.changeset/${f}`, `bad frontmatter line ${JSON.stringify(line)}`);
      else releases[r[1]] = r[2];
    }
    changesets.push({ file: f, releases, firstLine: m[2].trim().split("\n")[0].trim() });
  }
  const before = new Map(pkgs.map((p) => [p.pkg.name, p.pkg.version]));
  const cs = await run(bin("changeset"), ["version"], { cwd: copy, timeoutMs: 120_000 });
  if (cs.code !== 0) {
    record("changeset version", "runs", failure(cs));
    return;
  }
  const problems = [];
  // A changeset naming only ignored packages (the private harness) stays for a later release.
  const onlyIgnored = new Set(
    changesets.filter((c) => Object.keys(c.releases).every((n) => ignored.has(n))).map((c) => c.file),
  );
  const left = fs
    .readdirSync(csDir)
    .filter((g) => g.endsWith(".md") && g !== "README.md" && !onlyIgnored.has(g));
  if (left.length > 0) problems.push(`changesets not consumed: ${left.join(", ")}`);
  const rank = { patch: 1, minor: 2, major: 3 };
  const bump = (v, type) => {
    const [maj, min, pat] = v.split(".").map(Number);
    if (type === "major") return maj === 0 ? `0.${min + 1}.0` : `${maj + 1}.0.0`;
    if (type === "minor") return `${maj}.${min + 1}.0`;
    return `${maj}.${min}.${pat + 1}`;
  };
  const cmp = (a, b) => {
    const x = a.split(".").map(Number);
    const y = b.split(".").map(Number);
    for (let i = 0; i < 3; i++) if (x[i] !== y[i]) return x[i] - y[i];
    return 0;
  };
  let checked = 0;
  for (const p of pkgs) {
    const own = changesets.filter((c) => c.releases[p.pkg.name]);
    if (!fs.existsSync(path.join(copy, "packages", p.folder, "package.json"))) {
      if (own.length > 0) problems.push(`${p.pkg.name}: changesets name it but it is not tracked by git`);
      continue;
    }
    const after = JSON.parse(fs.readFileSync(path.join(copy, "packages", p.folder, "package.json"), "utf8"));
    const clFile = path.join(copy, "packages", p.folder, "CHANGELOG.md");
    const cl = fs.existsSync(clFile) ? fs.readFileSync(clFile, "utf8") : "";
    for (const f of ["dependencies", "peerDependencies"]) {
      for (const [dep, r] of Object.entries(p.pkg[f] ?? {})) {
        if (r.startsWith("workspace:") && after[f]?.[dep] !== r) {
          problems.push(`${p.pkg.name} ${f}.${dep}: ${r} became ${after[f]?.[dep]}`);
        }
      }
    }
    if (own.length === 0) continue;
    checked += 1;
    const type = own.map((c) => c.releases[p.pkg.name]).sort((a, b) => rank[b] - rank[a])[0];
    const want = bump(before.get(p.pkg.name), type);
    if (cmp(after.version, want) < 0)
      problems.push(`${p.pkg.name} ${before.get(p.pkg.name)} -> ${after.version}, want >= ${want} (${type})`);
    if (!cl.startsWith(`# ${p.pkg.name}\n\n## ${after.version}\n`)) {
      problems.push(
        `${p.pkg.name} CHANGELOG.md does not start with "# ${p.pkg.name}" and "## ${after.version}"`,
      );
    }
    const heading = { major: "### Major Changes", minor: "### Minor Changes", patch: "### Patch Changes" }[
      type
    ];
    if (!cl.includes(heading)) problems.push(`${p.pkg.name} CHANGELOG.md has no "${heading}"`);
    for (const c of own) {
      if (!cl.includes(c.firstLine)) problems.push(`${p.pkg.name} CHANGELOG.md lacks .changeset/${c.file}`);
    }
    if (/undefined|\[object Object\]/.test(cl))
      problems.push(`${p.pkg.name} CHANGELOG.md contains undefined`);
  }
  for (const name of ignored) {
    const dir = ["packages", "apps"]
      .flatMap((r) =>
        fs.existsSync(path.join(copy, r))
          ? fs.readdirSync(path.join(copy, r)).map((d) => path.join(copy, r, d))
          : [],
      )
      .find((d) => {
        const f = path.join(d, "package.json");
        return fs.existsSync(f) && JSON.parse(fs.readFileSync(f, "utf8")).name === name;
      });
    if (
      dir &&
      fs.existsSync(path.join(dir, "CHANGELOG.md")) &&
      !fs.existsSync(path.join(root, path.relative(copy, dir), "CHANGELOG.md"))
    ) {
      problems.push(`ignored package ${name} got a CHANGELOG.md`);
    }
  }
  record(
    "changeset version",
    `dry run on a copy (${changesets.length} changesets)`,
    problems.length === 0 ? null : problems.join("; "),
    `${checked} CHANGELOGs checked`,
  );
}

const passed = results.filter((r) => r.ok).length;
const failed = results.length - passed;
const seconds = ((Date.now() - started) / 1000).toFixed(0);
console.log("\ninstall sizes (du -sk node_modules of each scratch project):");
for (const s of sizes.sort((a, b) => a.name.localeCompare(b.name))) {
  console.log(
    `  ${s.name.padEnd(28)} ${mib(s.total).padStart(10)}  (${mib(s.withoutTypes)} without @types/node; zeromq ${s.zeromq ? mib(s.zeromq) : "absent"})`,
  );
}
if (failed > 0) {
  console.log("\nfailures:");
  for (const r of results.filter((x) => !x.ok)) console.log(`  ${r.group}: ${r.name}: ${r.problem}`);
}
console.log(`\ntest:pack: ${pkgs.length} public packages, ${seconds} s`);
fs.mkdirSync(path.join(root, ".ci/results"), { recursive: true });
fs.writeFileSync(
  path.join(root, ".ci/results/test-pack.json"),
  `${JSON.stringify({ name: "test:pack", passed, failed, seconds: Number(seconds), sizes, results }, null, 2)}\n`,
);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
