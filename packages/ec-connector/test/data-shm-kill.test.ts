// The shm data plane across process boundaries (issue 23, docs/ec-protocol.md 3.4): nothing left
// in /dev/shm after SIGKILL of either side and a restart, and a too-small /dev/shm (a tmpfs in a
// mount namespace) gives a clear error naming the sizes and falls back to the socket.
import { spawn } from "node:child_process";
import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Registry } from "@tapwire/stats";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { EmbeddingCache, SocketDataTransport } from "../src/index.js";
import { type ProducerProc, socketPath, spawnProducer, until } from "./helpers/proc.js";
import { HandConn, handAttach } from "./helpers/shm-wire.js";

const here = dirname(fileURLToPath(import.meta.url));
const procs: ProducerProc[] = [];
const dirs: string[] = [];
afterEach(async () => {
  for (const p of procs.splice(0)) await p.kill("SIGKILL").catch(() => undefined);
});
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

const filesOf = (pid: number | undefined) =>
  readdirSync("/dev/shm").filter((n) => n.startsWith(`tapwire-${pid}-`));

async function start(sock: string): Promise<ProducerProc> {
  const p = await spawnProducer([
    "--data",
    `shm+unix://${sock}`,
    "--num-blocks",
    "16",
    "--block-bytes",
    "65536",
    "--log-level",
    "error",
  ]);
  procs.push(p);
  return p;
}

describe("shm data plane and SIGKILL (docs/ec-protocol.md 3.4)", () => {
  it("a producer killed with a ring not yet unlinked leaves a file that its restart sweeps", async () => {
    const sock = socketPath("shmk");
    const first = await start(sock);
    expect(first.data).toBe(`unix://${sock}`);
    const hc = new HandConn(sock);
    hc.write(handAttach()); // and never SHM_ATTACHED: the file keeps its name
    const offer = await until(() => hc.of("offer")[0]);
    expect(offer.status).toBe(0);
    const pid = first.child.pid;
    expect(filesOf(pid)).toEqual([offer.text]);
    await first.kill("SIGKILL");
    hc.destroy();
    expect(filesOf(pid)).toEqual([offer.text]); // what SIGKILL leaves
    const second = await start(sock);
    expect(filesOf(pid)).toEqual([]); // swept at the successor's start (its creator is dead)
    // and the successor serves rings; killing it with one mapped by a reader leaves nothing
    const hc2 = new HandConn(sock);
    hc2.write(handAttach());
    hc2.write(Buffer.from([4, 0, 0, 0, 0x09, 0, 0, 0])); // SHM_ATTACHED 0
    await until(() => hc2.of("offer")[0]);
    await until(() => (filesOf(second.child.pid).length === 0 ? true : undefined));
    await second.kill("SIGKILL");
    hc2.destroy();
    expect(filesOf(second.child.pid)).toEqual([]);
  });

  it("a reader killed with SIGKILL before it said SHM_ATTACHED: the producer unlinks the ring, maps nothing more", async () => {
    const dir = mkdtempSync("/dev/shm/ec-shm-kill-");
    dirs.push(dir);
    const cache = new EmbeddingCache({ numBlocks: 16, blockBytes: 65_536 });
    const registry = new Registry();
    const sock = socketPath("shmc");
    const server = await SocketDataTransport.create({
      name: "p",
      region: cache.region,
      numBlocks: 16,
      blockBytes: 65_536,
      listen: `shm+unix://${sock}`,
      shm: { dir },
      registry,
    });
    try {
      const script = `const s=require("net").connect(${JSON.stringify(sock)});s.write(Buffer.from([4,0,0,0,7,0,1,0]));s.on("data",()=>console.log("offered"));setInterval(()=>{},1000);`;
      const child = spawn(process.execPath, ["-e", script], { stdio: ["ignore", "pipe", "inherit"] });
      let out = "";
      child.stdout.on("data", (d: Buffer) => {
        out += d.toString();
      });
      await until(() => (out.includes("offered") ? true : undefined));
      expect(readdirSync(dir).length).toBe(1);
      child.kill("SIGKILL");
      await until(() => (readdirSync(dir).length === 0 ? true : undefined));
      await until(() => (registry.snapshot().gauges["data_shm_sessions"] === 0 ? true : undefined));
    } finally {
      await server.close();
    }
  });

  it("a /dev/shm smaller than a ring (64 KiB tmpfs, unshare -m): EC_SHM_SPACE names both sizes, the read falls back to the socket", async () => {
    const fixture = join(here, "fixtures", "shm-space-child.ts");
    const sock = socketPath("shms");
    const script = `mount -t tmpfs -o size=64k tmpfs /dev/shm && exec "${process.execPath}" --import tsx "${fixture}" "${sock}"`;
    const child = spawn("unshare", ["-m", "--propagation", "private", "sh", "-c", script], {
      cwd: join(here, ".."),
      stdio: ["ignore", "pipe", "pipe"],
    });
    const lines: Record<string, unknown>[] = [];
    let err = "";
    child.stderr.on("data", (d: Buffer) => {
      err += d.toString();
    });
    child.stdout.on("data", (d: Buffer) => {
      for (const l of d.toString().split("\n")) if (l.startsWith("{")) lines.push(JSON.parse(l));
    });
    try {
      await until(
        () => (lines.some((j) => j["msg"] === "read") || child.exitCode !== null ? true : undefined),
        60_000,
      );
      const offer = lines.find((j) => j["msg"] === "offer");
      expect(offer, err).toMatchObject({ status: 1 });
      expect(String(offer?.["text"])).toMatch(
        /\/dev\/shm has \d+ bytes free, a data-plane ring needs 8388608/,
      );
      expect(
        lines.find((j) => j["msg"] === "read"),
        err,
      ).toMatchObject({
        state: "DONE",
        crcOk: true,
        chunks: 0,
      });
      expect(Number(lines.find((j) => j["msg"] === "read")?.["fallbacks"])).toBeGreaterThanOrEqual(1);
    } finally {
      if (child.exitCode === null) child.kill("SIGKILL");
    }
  });
});
