import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { FrameStatus, frame, Op, ReqStatus } from "@tapwire/wire";
import { afterEach, describe, expect, test } from "vitest";
import { NullDrafter } from "../src/index.js";
import { entry, helloFor, Raw, Sess, uniqueSock } from "./helpers.js";
import { BIN, children, spawnWorker } from "./spawn.js";

afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null) c.kill("SIGKILL");
});

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
      "--receive-in-place",
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

  test("--receive-in-place takes yes or no only", async () => {
    const proc = spawn(process.execPath, [BIN, "--receive-in-place", "maybe"], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    children.push(proc);
    let err = "";
    proc.stderr!.on("data", (b: Buffer) => {
      err += b.toString();
    });
    const code = await new Promise((resolve) => proc.on("exit", resolve));
    expect(code).toBe(2);
    expect(err).toContain("--receive-in-place");
  });

  test("SIGINT closes the servers, logs pino lines and exits 0", async () => {
    const c = await spawnWorker(["--drafter", "null", "--listen", "tcp://127.0.0.1:0", "--hidden", "8"]);
    const ep = (c.listening.endpoints as string[])[0]!;
    expect(ep).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    // pino lines: numeric level, time, pid, the worker's name.
    expect(c.listening).toMatchObject({ level: 30, name: "tapwire-worker", msg: "listening" });
    expect(typeof c.listening.time).toBe("number");
    const raw = await new Raw(ep).connect();
    expect((await raw.send(frame({ op: Op.PING, seq: 1, session: 0 }))).status).toBe(FrameStatus.OK);
    raw.close();
    c.proc.kill("SIGINT");
    expect(await c.exit).toBe(0);
    expect(c.lines.map((l) => l.msg)).toEqual(expect.arrayContaining(["closing", "closed"]));
    expect(c.lines.find((l) => l.msg === "closing")).toMatchObject({ signal: "SIGINT" });
  });

  test("the listening line is printed at any --log-level (supervisors wait for it)", async () => {
    const c = await spawnWorker([
      "--drafter",
      "null",
      "--listen",
      "tcp://127.0.0.1:0",
      "--hidden",
      "8",
      "--log-level",
      "silent",
    ]);
    expect(c.listening).toMatchObject({ msg: "listening" });
    expect((c.listening.endpoints as string[])[0]).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    c.proc.kill("SIGTERM");
    expect(await c.exit).toBe(0);
    // other info lines stay quiet at that level
    expect(c.lines.map((l) => l.msg)).not.toContain("closing");
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
