// `pnpm test:ops`, issue 19: docs/operations.md followed across two hosts. Two network namespaces
// joined by a veth pair (unique names, removed also on failure), addresses only inside them:
// "srv" holds tapwire-worker and tapwire-ec-producer started with the command lines of
// operations.md "A worker on another host" and "An encoder on another host" (their paths
// replaced by this run's files, 10.0.3.7 by the namespace's address); "eng" runs an engine that
// reaches them over the veth as the docs say: a RemoteDraftClient over tls:// with the private CA,
// a client certificate and the token, drafting one round, and a ConsumerConnector over CURVE and
// TLS loading an embedding from the producer. Needs root (CI is); without it the check fails.
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { startListening } from "./ops-checks.mjs";
import { codeBlocks } from "./readme.mjs";

const SRV_IP = "10.254.19.1";
const ENG_IP = "10.254.19.2";
const NBYTES = 256 * 3584 * 2; // an image of 256 tokens, hidden 3584 bf16 (the docs' geometry)

function ip(...args) {
  const r = spawnSync("ip", args, { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`ip ${args.join(" ")}: ${r.error?.message ?? r.stderr.trim()}`);
  return r.stdout;
}

/** The argv of the first `bin …` command of the sh block after `heading` (continuations joined). */
function documented(md, heading, bin) {
  const at = md.indexOf(heading);
  if (at < 0) throw new Error(`docs/operations.md has no "${heading}"`);
  const sh = codeBlocks(md.slice(at), ["sh"])[0]?.code ?? "";
  const line = sh
    .replace(/\\\n/g, " ")
    .split("\n")
    .find((l) => l.includes(bin));
  if (!line) throw new Error(`no ${bin} command after "${heading}"`);
  return line
    .slice(line.indexOf(bin) + bin.length)
    .trim()
    .split(/\s+/);
}

/** Runs `fn` with two namespaces joined by a veth; always removes them. */
async function withNamespaces(fn) {
  const id = `${process.pid % 100000}`;
  const ns = { srv: `tw19s-${id}`, eng: `tw19e-${id}` };
  const veth = { srv: `tw19s${id}`, eng: `tw19e${id}` };
  const cleanup = () => {
    for (const n of Object.values(ns)) spawnSync("ip", ["netns", "del", n], { stdio: "ignore" });
  };
  process.once("exit", cleanup);
  try {
    ip("netns", "add", ns.srv);
    ip("netns", "add", ns.eng);
    ip("link", "add", veth.srv, "type", "veth", "peer", "name", veth.eng);
    ip("link", "set", veth.srv, "netns", ns.srv);
    ip("link", "set", veth.eng, "netns", ns.eng);
    ip("-n", ns.srv, "addr", "add", `${SRV_IP}/24`, "dev", veth.srv);
    ip("-n", ns.eng, "addr", "add", `${ENG_IP}/24`, "dev", veth.eng);
    for (const side of ["srv", "eng"]) {
      ip("-n", ns[side], "link", "set", "lo", "up");
      ip("-n", ns[side], "link", "set", veth[side], "up");
    }
    return await fn(ns);
  } finally {
    cleanup();
    process.off("exit", cleanup);
  }
}

/** The engine side, run in the "eng" namespace: prints one JSON line of what it saw. */
const ENGINE = `
import { readFileSync } from "node:fs";
const cfg = JSON.parse(process.argv[2]);
const { RemoteDraftClient, RoundCore, DepthPolicy } = await import(cfg.client);
const { ConsumerConnector, syntheticEmbedding } = await import(cfg.ec);
const out = {};
const id = cfg.identities;
const client = new RemoteDraftClient({
  endpoint: cfg.worker,
  token: process.env.TAPWIRE_TOKEN,
  transportOptions: { tls: {
    ca: readFileSync(cfg.wcerts + "/ca.crt"), cert: readFileSync(cfg.wcerts + "/client.crt"),
    key: readFileSync(cfg.wcerts + "/client.key"), servername: "drafter-1.internal" } },
  drafterIdentity: Buffer.from(id.drafterIdentity, "hex"), markovIdentity: Buffer.from(id.markovIdentity, "hex"),
  window: id.window, numSpec: id.numSpec, numTaps: id.numTaps, hidden: id.hidden, vocabSize: id.vocabSize,
  maxSlots: 8, maxRowsPerStep: 64, requestTimeoutMs: 10000,
});
out.workerReady = await client.waitReady(30000);
out.workerWhy = client.disabledReason ?? client.lastError;
if (out.workerReady) {
  const core = new RoundCore({ client, depthPolicy: new DepthPolicy({ budget: 8 }) });
  const res = await core.round({ requests: [{ slot: 0, generation: 1, anchorPos: 5, anchorToken: 42,
    newRows: new Uint8Array(5 * id.numTaps * id.hidden * 2) }] });
  out.round = res.outcome;
  out.draft = res.drafts[0].reason;
}
await client.close();
const keys = JSON.parse(readFileSync(cfg.consumerKeys, "utf8"));
const consumer = await ConsumerConnector.create({
  numBlocks: 64, blockBytes: 65536, compatibility: cfg.compatibilityHash,
  curve: { publicKey: keys.publicKey, secretKey: keys.secretKey, serverKey: cfg.serverKey },
  tls: { cert: readFileSync(cfg.ecerts + "/client.crt"), key: readFileSync(cfg.ecerts + "/client.key"),
    ca: readFileSync(cfg.ecerts + "/ca.crt") },
});
consumer.request(cfg.mmHash, cfg.control, cfg.nbytes, performance.now() + 30000);
const end = Date.now() + 40000;
while (out.ec === undefined && Date.now() < end) {
  const { loaded, failed } = consumer.poll();
  for (const h of loaded) {
    out.ec = "loaded";
    out.identical = Buffer.from(consumer.cache.view(h)).equals(Buffer.from(syntheticEmbedding(h, cfg.nbytes)));
    consumer.free(h);
  }
  for (const f of failed) out.ec = "failed: " + f.reason;
  await new Promise((r) => setTimeout(r, 2));
}
await consumer.close();
process.stdout.write(JSON.stringify(out) + "\\n");
process.exit(0);
`;

/** The two-namespace operator check; `record(name, problem|null)`. */
export async function netnsCheck({ root, tmp, record, headFile }) {
  const NAME = "two network namespaces, as docs/operations.md tells an operator";
  if (process.getuid?.() !== 0) {
    record(NAME, "needs root (ip netns); CI runs test:ops as root");
    return;
  }
  const WORKER = path.join(root, "packages/worker/dist/bin/worker.js");
  const PRODUCER = path.join(root, "packages/ec-connector/dist/bin/producer.js");
  const md = fs.readFileSync(path.join(root, "docs/operations.md"), "utf8");
  const dir = path.join(tmp, "netns");
  fs.mkdirSync(dir);
  const certs = (sub, name) => {
    const d = path.join(dir, sub);
    const r = spawnSync("bash", [path.join(root, "scripts/make-certs.sh"), d, name, SRV_IP], {
      encoding: "utf8",
    });
    if (r.status !== 0) throw new Error(`make-certs ${sub}: ${r.stderr}`);
    return d;
  };
  const wcerts = certs("worker-certs", "drafter-1.internal");
  const ecerts = certs("ec-certs", "encoder-1.internal");
  const keygen = () => spawnSync(process.execPath, [PRODUCER, "keygen"], { encoding: "utf8" }).stdout.trim();
  const producerKeys = path.join(dir, "curve.json");
  const consumerKeys = path.join(dir, "consumer.json");
  fs.writeFileSync(producerKeys, `${keygen()}\n`);
  fs.writeFileSync(consumerKeys, `${keygen()}\n`);
  const allow = path.join(dir, "consumers.pub");
  fs.writeFileSync(allow, `${JSON.parse(fs.readFileSync(consumerKeys, "utf8")).publicKey}\n`);
  const TOKEN = "netns-token-of-the-operator-test";

  // the documented command lines, with this run's files and the namespace's address
  const sub = (args, certDir) =>
    args.map((a) =>
      a
        .replaceAll("/etc/tapwire/certs", certDir)
        .replaceAll("/etc/tapwire/curve.json", producerKeys)
        .replaceAll("/etc/tapwire/consumers.pub", allow)
        .replaceAll("/var/lib/tapwire/head.safetensors", headFile)
        .replaceAll("10.0.3.7", SRV_IP),
    );
  const workerArgs = sub(documented(md, "**2. The worker.**", "tapwire-worker"), wcerts);
  const producerArgs = sub(documented(md, "**An encoder on another host**", "tapwire-ec-producer"), ecerts);
  const mmHash = "img-netns-1";

  await withNamespaces(async (ns) => {
    record(`two namespaces (${SRV_IP}, ${ENG_IP}) joined by a veth`, null);
    const procs = [];
    try {
      const w = startListening(null, ["netns", "exec", ns.srv, process.execPath, WORKER, ...workerArgs], {
        cmd: "ip",
        env: { TAPWIRE_TOKEN: TOKEN },
      });
      procs.push(w);
      const wl = await w.listening;
      record(`worker in the server namespace: ${workerArgs.slice(0, 2).join(" ")} …, listening`, null);
      const p = startListening(
        null,
        [
          "netns",
          "exec",
          ns.srv,
          process.execPath,
          PRODUCER,
          ...producerArgs,
          "--prepopulate",
          `${mmHash}:${NBYTES}`,
        ],
        { cmd: "ip" },
      );
      procs.push(p);
      const pl = await p.listening;
      record(
        `producer in the server namespace announces its data server at ${SRV_IP}, not 0.0.0.0`,
        String(pl.data).includes(SRV_IP) ? null : `data ${pl.data}`,
      );
      const port = (ep) => /:(\d+)$/.exec(String(ep))?.[1];
      const cfg = {
        client: pathToFileURL(path.join(root, "packages/client/dist/index.js")).href,
        ec: pathToFileURL(path.join(root, "packages/ec-connector/dist/index.js")).href,
        worker: `tls://${SRV_IP}:${port(wl.bind?.[0] ?? wl.endpoints[0])}`,
        identities: {
          drafterIdentity: wl.drafterIdentity,
          markovIdentity: wl.markovIdentity,
          window: wl.window,
          numSpec: wl.numSpec,
          numTaps: Number(workerArgs[workerArgs.indexOf("--num-taps") + 1]),
          hidden: Number(workerArgs[workerArgs.indexOf("--hidden") + 1]),
          vocabSize: wl.vocabSize,
        },
        wcerts,
        ecerts,
        consumerKeys,
        serverKey: JSON.parse(fs.readFileSync(producerKeys, "utf8")).publicKey,
        compatibilityHash: pl.compatibilityHash,
        control: `tcp://${SRV_IP}:${port(pl.control)}`,
        mmHash,
        nbytes: NBYTES,
      };
      const script = path.join(dir, "engine.mjs");
      fs.writeFileSync(script, ENGINE);
      const eng = await new Promise((resolve) => {
        const c = spawn("ip", ["netns", "exec", ns.eng, process.execPath, script, JSON.stringify(cfg)], {
          stdio: ["ignore", "pipe", "pipe"],
          env: { ...process.env, TAPWIRE_TOKEN: TOKEN },
        });
        let out = "";
        let err = "";
        c.stdout.on("data", (d) => {
          out += d;
        });
        c.stderr.on("data", (d) => {
          err += d;
        });
        const t = setTimeout(() => c.kill("SIGKILL"), 120_000);
        c.on("exit", (code) => {
          clearTimeout(t);
          resolve({ code, out, err });
        });
      });
      let seen = null;
      try {
        seen = JSON.parse(eng.out.trim().split("\n").pop());
      } catch {}
      record(
        `engine in the other namespace: RemoteDraftClient over tls:// to ${cfg.worker} ready, a round drafts`,
        seen?.workerReady && seen.round === "ok" && seen.draft === "ok"
          ? null
          : `exit ${eng.code}: ${JSON.stringify(seen)} ${eng.err.slice(-800)}`,
      );
      record(
        `engine in the other namespace: ConsumerConnector over CURVE + TLS loads ${mmHash} from ${cfg.control}, bytes identical`,
        seen?.ec === "loaded" && seen.identical === true
          ? null
          : `exit ${eng.code}: ${JSON.stringify(seen)} ${eng.err.slice(-800)}`,
      );
    } finally {
      for (const p of procs.reverse()) await p.stop();
    }
  });
  const left = ip("netns", "list")
    .split("\n")
    .filter(
      (l) => l.startsWith(`tw19s-${process.pid % 100000}`) || l.startsWith(`tw19e-${process.pid % 100000}`),
    );
  record("the namespaces are removed", left.length === 0 ? null : left.join(", "));
}
