/**
 * shm+unix:// outside-in (issue 23, docs/transport.md "shm"): the tester's own doorbell client
 * against the real tapwire-worker bin. A planted defect (a proxy that shifts every doorbell's
 * region offsets by 64 bytes) must fail exactly the cases that read the mapping; SIGKILL of the
 * tester and of the worker must leave nothing in /dev/shm, and a session file of a dead pid is
 * swept by the next process that creates one.
 */
import { spawn } from "node:child_process";
import { closeSync, existsSync, openSync, readdirSync } from "node:fs";
import * as net from "node:net";
import type { ChildHandle } from "@tapwire/testing";
import { killAllChildren, spawnBin, uniqueSocketPath } from "@tapwire/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseEndpoint } from "../src/conn.js";
import { runWorkerSuite } from "../src/index.js";
import { connectShm, ShmKind } from "../src/shm.js";
import { binPath, CONFORMANCE_BIN, GEOMETRY } from "./helpers.js";

const WORKER = binPath("@tapwire/worker", "tapwire-worker");
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const filesOf = (pid: number) => readdirSync("/dev/shm").filter((n) => n.startsWith(`tapwire-${pid}-`));

async function spawnShmWorker(): Promise<{ child: ChildHandle; endpoint: string; path: string }> {
  const path = uniqueSocketPath("conf-shm-only");
  const child = await spawnBin(
    WORKER,
    ["--drafter", "null", "--listen", `shm+unix://${path}`, "--log-level", "error", ...GEOMETRY],
    { timeoutMs: 30_000 },
  );
  return { child, endpoint: `shm+unix://${path}`, path };
}

/**
 * A unix proxy in front of the worker's socket that adds `shift` to every region offset of every
 * BELL (docs/transport.md "shm" table: kind u32, seq u32, total u32, count u16, 0 u16, then
 * `offset` u32, `length` u32 each), except on its first connection. Replies pass unchanged.
 */
function shiftProxy(target: string, shift: number): Promise<{ path: string; close(): void }> {
  const path = uniqueSocketPath("conf-shm-shift");
  let conns = 0;
  const server = net.createServer((down) => {
    // The first connection is the tester's geometry discovery: left alone so the run starts.
    const k = shift === 0 || conns++ === 0 ? 0 : shift;
    const up = net.connect({ path: target });
    let buf = Buffer.alloc(0);
    down.on("data", (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 4) {
        const len = buf.readUInt32LE(0);
        if (buf.length < 4 + len) break;
        const m = Buffer.from(buf.subarray(0, 4 + len));
        buf = buf.subarray(4 + len);
        if (len >= 16 && m.readUInt32LE(4) === ShmKind.BELL) {
          const n = m.readUInt16LE(4 + 12);
          for (let i = 0; i < n && 4 + 16 + 8 * i + 8 <= m.length; i++) {
            const at = 4 + 16 + 8 * i;
            m.writeUInt32LE((m.readUInt32LE(at) + k) >>> 0, at);
          }
        }
        up.write(m);
      }
    });
    up.on("data", (d) => down.write(d));
    const end = () => {
      down.destroy();
      up.destroy();
    };
    down.on("close", end);
    up.on("close", end);
    down.on("error", end);
    up.on("error", end);
  });
  return new Promise((resolve) => server.listen(path, () => resolve({ path, close: () => server.close() })));
}

afterAll(async () => {
  await killAllChildren();
});

describe("tapwire-conformance over shm+unix:// (issue 23)", () => {
  let w: { child: ChildHandle; endpoint: string; path: string };
  beforeAll(async () => {
    w = await spawnShmWorker();
  });
  afterAll(async () => {
    await w?.child.kill("SIGTERM");
  });

  it("a planted defect (doorbell offsets shifted by 64) fails exactly the cases that read the mapping", async () => {
    const cases = "3.shm.1,3.shm.2,3.shm.3,3.shm.6,3.shm.7,3.shm.12,3.shm.13,3.shm.23,6.1.1";
    const clean = await runWorkerSuite({ endpoint: w.endpoint }, { cases });
    const px = await shiftProxy(w.path, 64);
    try {
      const bad = await runWorkerSuite({ endpoint: `shm+unix://${px.path}` }, { cases });
      const v = (rs: typeof bad.results) => Object.fromEntries(rs.map((r) => [r.id, r.verdict]));
      // Through the worker's own socket every case passes.
      expect(v(clean.results)).toEqual({
        "3.shm.1": "OK",
        "3.shm.2": "OK",
        "3.shm.3": "OK",
        "3.shm.6": "OK",
        "3.shm.7": "OK",
        "3.shm.12": "OK",
        "3.shm.13": "OK",
        "3.shm.23": "OK",
        "6.1.1": "OK",
      });
      // Shifted: every request read from the mapping is garbage (6.1.1's HELLO too, and the
      // fresh-connection PING with which 3.shm.12 and 3.shm.13 end); the refused ATTACHes and
      // their inline doorbells (3.shm.6, 3.shm.7) are untouched.
      expect(v(bad.results)).toEqual({
        "3.shm.1": "FAILED",
        "3.shm.2": "FAILED",
        "3.shm.3": "FAILED",
        "3.shm.6": "OK",
        "3.shm.7": "OK",
        "3.shm.12": "FAILED",
        "3.shm.13": "FAILED",
        "3.shm.23": "FAILED",
        "6.1.1": "FAILED",
      });
    } finally {
      px.close();
    }
    expect(w.child.child.exitCode).toBeNull();
  });

  it("SIGKILL of the tester mid-run leaves no session file; a dead pid's file is swept by the next creator", async () => {
    const t = spawn(process.execPath, [CONFORMANCE_BIN, "worker", w.endpoint], { stdio: "ignore" });
    const pid = t.pid!;
    const gone = new Promise((r) => t.once("exit", r));
    await sleep(800); // usually inside the run (hundreds of connections made and dropped); the checks hold either way
    t.kill("SIGKILL");
    await gone;
    // Unlinked at each ATTACH answer: at most a file made in the microseconds before one.
    expect(filesOf(pid).length).toBeLessThanOrEqual(1);
    // Plant the file a SIGKILL between create and unlink would leave, for the dead pid.
    const planted = `/dev/shm/tapwire-${pid}-00000000deadbeef`;
    closeSync(openSync(planted, "wx", 0o600));
    // A new tester process sweeps it the first time it creates a session file, and the worker
    // still serves after losing its peer to SIGKILL.
    const again = await new Promise<number>((resolve) => {
      const c = spawn(process.execPath, [CONFORMANCE_BIN, "worker", w.endpoint, "--cases", "3.shm.1"], {
        stdio: "ignore",
      });
      c.once("exit", (code) => resolve(code ?? -1));
    });
    expect(again).toBe(0);
    expect(existsSync(planted)).toBe(false);
    expect(filesOf(pid)).toEqual([]);
  });

  it("SIGKILL of the worker while attached leaves nothing in /dev/shm", async () => {
    const k = await spawnShmWorker();
    const c = await connectShm(parseEndpoint(k.endpoint), 4000);
    expect(c.attached).toBe(true);
    expect(existsSync(c.file!.path)).toBe(false);
    await k.child.kill("SIGKILL");
    expect(await c.waitClosed(4000)).toBe(true);
    c.close();
    expect(filesOf(process.pid)).toEqual([]);
    expect(filesOf(k.child.pid)).toEqual([]);
  });
});
