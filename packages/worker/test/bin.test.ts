import { type ChildProcess, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { FrameStatus, frame, Op, ReqStatus } from "@tapwire/wire";
import { afterEach, describe, expect, test } from "vitest";
import { NullDrafter } from "../src/index.js";
import { entry, helloFor, Raw, Sess, uniqueSock } from "./helpers.js";

const BIN = join(dirname(fileURLToPath(import.meta.url)), "..", "dist", "bin", "worker.js");

interface Child {
  proc: ChildProcess;
  lines: Record<string, unknown>[];
  listening: Record<string, unknown>;
  exit: Promise<number | null>;
}

const children: ChildProcess[] = [];
afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null) c.kill("SIGKILL");
});

/** Spawns the built bin and waits for its pino "listening" line. */
export async function spawnWorker(args: string[], env: NodeJS.ProcessEnv = {}): Promise<Child> {
  if (!existsSync(BIN)) throw new Error(`${BIN} missing: run pnpm --filter @tapwire/worker build first`);
  const proc = spawn(process.execPath, [BIN, ...args], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, ...env },
  });
  children.push(proc);
  const exit = new Promise<number | null>((resolve) => proc.on("exit", (code) => resolve(code)));
  const lines: Record<string, unknown>[] = [];
  let stderr = "";
  proc.stderr!.on("data", (b: Buffer) => {
    stderr += b.toString();
  });
  const listening = await new Promise<Record<string, unknown>>((resolve, reject) => {
    const rl = createInterface({ input: proc.stdout! });
    rl.on("line", (l) => {
      let j: Record<string, unknown>;
      try {
        j = JSON.parse(l);
      } catch {
        return;
      }
      lines.push(j);
      if (j.msg === "listening") resolve(j);
    });
    void exit.then((code) => reject(new Error(`worker exited ${code} before listening: ${stderr}`)));
  });
  return { proc, lines, listening, exit };
}

describe("bin tapwire-worker", () => {
  test("--help prints the flags and exits 0", async () => {
    const proc = spawn(process.execPath, [BIN, "--help"], { stdio: ["ignore", "pipe", "pipe"] });
    children.push(proc);
    let out = "";
    proc.stdout!.on("data", (b: Buffer) => {
      out += b.toString();
    });
    const code = await new Promise((resolve) => proc.on("exit", resolve));
    expect(code).toBe(0);
    for (const flag of [
      "--listen",
      "--drafter",
      "--weights",
      "--token",
      "--takeover",
      "--max-slots",
      "--tls-cert",
    ]) {
      expect(out).toContain(flag);
    }
  });

  test("a bad flag exits 2 naming it", async () => {
    const proc = spawn(process.execPath, [BIN, "--takeover", "never"], { stdio: ["ignore", "pipe", "pipe"] });
    children.push(proc);
    let err = "";
    proc.stderr!.on("data", (b: Buffer) => {
      err += b.toString();
    });
    const code = await new Promise((resolve) => proc.on("exit", resolve));
    expect(code).toBe(2);
    expect(err).toContain("--takeover");
  });

  test("null drafter over tcp and unix: HELLO + STEP, token from the env, then SIGTERM exits 0", async () => {
    const sock = uniqueSock("bin");
    const c = await spawnWorker(
      [
        "--drafter",
        "null",
        "--listen",
        "tcp://127.0.0.1:0",
        "--listen",
        `unix://${sock}`,
        "--window",
        "8",
        "--hidden",
        "64",
        "--vocab",
        "512",
        "--name",
        "bin-test",
      ],
      { TAPWIRE_TOKEN: "tok" },
    );
    const eps = c.listening.endpoints as string[];
    expect(eps).toHaveLength(2);
    expect(eps[0]).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    expect(eps[1]).toBe(`unix://${sock}`);
    const d = new NullDrafter({ window: 8, hidden: 64, vocabSize: 512, numTaps: 3, numSpec: 4 });
    let seq = 0;
    for (const ep of eps) {
      const raw = await new Raw(ep).connect();
      const s = new Sess(raw, 0x77, d, helloFor(d), "tok");
      s.seq = seq;
      const h = await s.doHello();
      expect(h.status).toBe(FrameStatus.OK);
      expect(h.reply!.workerName).toBe("bin-test");
      const st = await s.step([entry({ slot: 0, generation: 1, anchorPos: 2, rowStart: 0, nRows: 2 })]);
      expect(st.status).toBe(FrameStatus.OK);
      expect(st.views!.status[0]).toBe(ReqStatus.OK);
      const bad = new Sess(raw, 0x78, d, helloFor(d), "wrong");
      expect((await bad.doHello()).status).toBe(FrameStatus.UNAUTHORIZED);
      expect((await raw.send(frame({ op: Op.PING, seq: 1, session: 0 }))).status).toBe(FrameStatus.OK);
      seq = s.seq;
      raw.close();
    }
    c.proc.kill("SIGTERM");
    expect(await c.exit).toBe(0);
    expect(c.lines.some((l) => l.msg === "closed")).toBe(true);
    expect(existsSync(sock)).toBe(false);
  });
});
