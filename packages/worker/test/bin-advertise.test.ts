import { spawnSync } from "node:child_process";
import { FrameStatus, frame, Op } from "@tapwire/wire";
import { afterEach, describe, expect, test } from "vitest";
import { Raw } from "./helpers.js";
import { BIN, children, spawnWorker } from "./spawn.js";

// Issue 19: a worker bound to a wildcard announces an address peers can reach (the one rule of
// @tapwire/stats advertiseEndpoint), in its listening line (what supervisors and discovery read).
afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null) c.kill("SIGKILL");
});

describe("tapwire-worker --advertise (issue 19)", () => {
  test("bound to 0.0.0.0 with --advertise: the listening line names the bind and the advertised endpoint, which serves", async () => {
    // 127.0.0.2 is neither the bind address nor a wildcard; Linux routes all of 127/8 to lo.
    const c = await spawnWorker([
      "--drafter",
      "null",
      "--listen",
      "tcp://0.0.0.0:0",
      "--advertise",
      "127.0.0.2",
    ]);
    const bind = (c.listening.bind as string[])[0]!;
    const port = /^tcp:\/\/0\.0\.0\.0:(\d+)$/.exec(bind)?.[1];
    expect(port).toBeDefined();
    expect(c.listening.endpoints).toEqual([`tcp://127.0.0.2:${port}`]);
    const raw = await new Raw((c.listening.endpoints as string[])[0]!).connect();
    expect((await raw.send(frame({ op: Op.PING, seq: 1, session: 0 }))).status).toBe(FrameStatus.OK);
    raw.close();
  });

  test("bound to 0.0.0.0 without --advertise: never announces the wildcard", async () => {
    const c = await spawnWorker(["--drafter", "null", "--listen", "tcp://0.0.0.0:0"]);
    const ep = (c.listening.endpoints as string[])[0]!;
    expect(ep).not.toMatch(/0\.0\.0\.0/);
    // an interface was picked and logged (this machine has one besides lo) or the bind failed
    expect(
      c.lines.some((l) => String(l.msg).startsWith("advertising the first non-loopback interface")),
    ).toBe(true);
  });

  test("a bad --advertise, or a PORT with two network endpoints, exits 2 naming --advertise", () => {
    for (const args of [
      ["--advertise", "0.0.0.0"],
      ["--advertise", "h:99999"],
      ["--listen", "tcp://0.0.0.0:0", "--listen", "tcp://127.0.0.1:0", "--advertise", "10.1.1.1:5"],
    ]) {
      const r = spawnSync(process.execPath, [BIN, "--drafter", "null", ...args], {
        encoding: "utf8",
        timeout: 20_000,
      });
      expect(r.status, args.join(" ")).toBe(2);
      expect(r.stderr).toMatch(/--advertise/);
    }
  });
});
