// tapwire-worker as an operator meets it: help generated from the flag table (and the table's
// defaults are the real ones), one-line usage errors with exit 2, the metrics endpoint with
// /healthz and /readyz (checked by the real promtool), log lines in order.
import { spawn } from "node:child_process";
import { DEFAULT_DRAFT_CONFIG, DEFAULT_TARGET_CONFIG } from "@tapwire/reference-model";
import { freePort, parsePrometheus, promtoolCheck, scrape } from "@tapwire/testing";
import { FrameStatus, frame, Op } from "@tapwire/wire";
import { afterEach, describe, expect, test } from "vitest";
import { FLAGS, helpText, parseFlags, UsageError } from "../src/bin/flags.js";
import { CORE_DEFAULTS, WORKER_DEFAULTS } from "../src/index.js";
import { entry, helloFor, nullDrafter, Raw, Sess } from "./helpers.js";
import { BIN, children, spawnWorker } from "./spawn.js";

afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null) c.kill("SIGKILL");
});

function run(args: string[]): Promise<{ code: number | null; out: string; err: string }> {
  const proc = spawn(process.execPath, [BIN, ...args], { stdio: ["ignore", "pipe", "pipe"] });
  children.push(proc);
  let out = "";
  let err = "";
  proc.stdout!.on("data", (b: Buffer) => {
    out += b.toString();
  });
  proc.stderr!.on("data", (b: Buffer) => {
    err += b.toString();
  });
  return new Promise((resolve) => proc.on("exit", (code) => resolve({ code, out, err })));
}

describe("tapwire-worker --help and its defaults (issue 15)", () => {
  test("the flag table's defaults are the defaults the code uses", () => {
    expect(FLAGS["draft-noise"].default).toBe(DEFAULT_DRAFT_CONFIG.noise);
    expect(FLAGS["draft-markov-rank"].default).toBe(DEFAULT_DRAFT_CONFIG.markovRank);
    expect(FLAGS["draft-rank"].default).toBe(DEFAULT_DRAFT_CONFIG.rank);
    expect(FLAGS["draft-seed"].default).toBe(DEFAULT_DRAFT_CONFIG.seed);
    expect(FLAGS.window.default).toBe(DEFAULT_DRAFT_CONFIG.window);
    expect(FLAGS["num-spec"].default).toBe(DEFAULT_DRAFT_CONFIG.numSpec);
    expect(FLAGS.seed.default).toBe(DEFAULT_TARGET_CONFIG.seed);
    expect(FLAGS.vocab.default).toBe(DEFAULT_TARGET_CONFIG.vocabSize);
    expect(FLAGS["state-dim"].default).toBe(DEFAULT_TARGET_CONFIG.stateDim);
    expect(FLAGS["num-taps"].default).toBe(DEFAULT_TARGET_CONFIG.numTaps);
    expect(FLAGS.hidden.default).toBe(DEFAULT_TARGET_CONFIG.hidden);
    expect(FLAGS["max-slots"].default).toBe(CORE_DEFAULTS.maxSlots);
    expect(FLAGS["max-rows-per-step"].default).toBe(CORE_DEFAULTS.maxRowsPerStep);
    expect(FLAGS["session-lease-ms"].default).toBe(CORE_DEFAULTS.sessionLease);
    expect(FLAGS["max-connections"].default).toBe(WORKER_DEFAULTS.maxConnections);
    expect(FLAGS["unbound-idle-ms"].default).toBe(WORKER_DEFAULTS.unboundIdleMs);
  });

  test("--help states every flag with the table's default, and nothing else", async () => {
    const r = await run(["--help"]);
    expect(r.code).toBe(0);
    expect(r.out).toBe(helpText());
    const flat = r.out.replace(/\s+/g, " ");
    for (const [name, f] of Object.entries(FLAGS)) {
      expect(flat).toContain(`--${name}`);
      const d = "note" in f && f.note !== undefined ? f.note : "default" in f ? String(f.default) : undefined;
      if (d !== undefined) {
        const at = flat.indexOf(`--${name} `);
        const next = flat.indexOf(" --", at + 2);
        expect(flat.slice(at, next < 0 ? undefined : next), name).toContain(`(default ${d})`);
      }
    }
    expect(flat).toContain("--draft-noise X reference: distillation noise (default 0.2)");
    expect(flat).toContain("--draft-markov-rank N reference: Markov head rank (default 8)");
  });

  test("passing the stated defaults keeps the drafter identity (the client would refuse another)", async () => {
    const a = await spawnWorker(["--listen", "tcp://127.0.0.1:0"]);
    const b = await spawnWorker([
      "--listen",
      "tcp://127.0.0.1:0",
      "--draft-noise",
      String(FLAGS["draft-noise"].default),
      "--draft-markov-rank",
      String(FLAGS["draft-markov-rank"].default),
      "--draft-rank",
      String(FLAGS["draft-rank"].default),
    ]);
    expect(b.listening.drafterIdentity).toBe(a.listening.drafterIdentity);
    expect(b.listening.markovIdentity).toBe(a.listening.markovIdentity);
    a.proc.kill("SIGTERM");
    b.proc.kill("SIGTERM");
    expect(await a.exit).toBe(0);
    expect(await b.exit).toBe(0);
  });
});

describe("tapwire-worker usage errors exit 2 with one line", () => {
  test.each([
    [["--listen", "http://x"], "--listen http://x"],
    [["--log-level", "loud"], "--log-level loud"],
    [["--max-slots", "-1"], "--max-slots -1 is not an integer in 1..1048576"],
    [["--max-slots=abc"], "--max-slots abc"],
    [["--metrics-listen", "udp://x:1"], "--metrics-listen"],
    [["--frobnicate"], "unknown flag --frobnicate"],
    [["--window"], "--window needs a value"],
  ])("%j", async (args, text) => {
    const r = await run(args);
    expect(r.code).toBe(2);
    expect(r.err).toContain(text);
    expect(r.err.trimEnd().split("\n")).toHaveLength(1);
    expect(r.err.startsWith("tapwire-worker: ")).toBe(true);
  });

  test("parseFlags reads a value that starts with '-' as a value", () => {
    expect(() => parseFlags(["--max-slots", "-1"])).toThrow(UsageError);
    expect(parseFlags(["--draft-noise=0.5", "--listen", "tcp://a:1", "--listen", "unix:///x"])).toEqual({
      "draft-noise": "0.5",
      listen: ["tcp://a:1", "unix:///x"],
    });
  });
});

describe("tapwire-worker --metrics-listen", () => {
  test("/healthz, /readyz and Prometheus /metrics that promtool accepts; closing before closed", async () => {
    const port = await freePort();
    const c = await spawnWorker([
      "--drafter",
      "null",
      "--listen",
      "tcp://127.0.0.1:0",
      "--metrics-listen",
      `tcp://127.0.0.1:${port}`,
    ]);
    const base = `http://127.0.0.1:${port}`;
    expect(c.listening.metrics).toBe(`${base}/metrics`);
    expect(await scrape(`${base}/healthz`)).toEqual({ status: 200, text: "ok\n" });
    expect(await scrape(`${base}/readyz`)).toEqual({ status: 200, text: "ready\n" });
    // Some traffic, so that the histograms have samples.
    const d = nullDrafter({ vocabSize: 2048, numTaps: 3, hidden: 1024, window: 16, numSpec: 4 });
    const raw = await new Raw((c.listening.endpoints as string[])[0]!).connect();
    const s = new Sess(
      raw,
      0x77,
      d,
      helloFor(d, { drafterIdentity: new Uint8Array(32), markovIdentity: new Uint8Array(32) }),
    );
    expect((await s.doHello()).status).toBe(FrameStatus.OK);
    expect((await s.step([entry({ slot: 0 })])).status).toBe(FrameStatus.OK);
    expect((await raw.send(frame({ op: Op.PING, seq: 1, session: 0 }))).status).toBe(FrameStatus.OK);
    raw.close();
    const m = await scrape(`${base}/metrics`);
    expect(m.status).toBe(200);
    const check = promtoolCheck(m.text);
    expect(check.problems).toEqual([]);
    expect(check.ok).toBe(true);
    const fams = parsePrometheus(m.text);
    expect(fams.get("tapwire_worker_step_seconds")?.type).toBe("histogram");
    expect(fams.get("tapwire_worker_request_bytes_total")?.type).toBe("counter");
    expect(fams.get("tapwire_worker_frames_step_total")?.type).toBe("counter");
    expect(m.text).toContain('tapwire_worker_step_seconds_bucket{le="0.00002"}');
    c.proc.kill("SIGTERM");
    expect(await c.exit).toBe(0);
    const msgs = c.lines.map((l) => l.msg);
    expect(msgs.indexOf("closing")).toBeGreaterThan(-1);
    expect(msgs.indexOf("closing")).toBeLessThan(msgs.indexOf("closed"));
    // One pino setup: base fields once, no duplicates.
    expect(Object.keys(c.listening).filter((k) => k === "pid")).toHaveLength(1);
    expect(c.listening).toMatchObject({ name: "tapwire-worker", hostname: expect.any(String) });
  });

  test("/readyz is never 200 before the worker listens, and 200 once it does", async () => {
    const port = await freePort();
    // The reference drafter is distilled at start, synchronously: a probe that gets through
    // before the worker listens must read 503 "drafter loading".
    const proc = spawn(
      process.execPath,
      [BIN, "--listen", "tcp://127.0.0.1:0", "--metrics-listen", `tcp://127.0.0.1:${port}`],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    children.push(proc);
    let out = "";
    proc.stdout!.on("data", (b: Buffer) => {
      out += b.toString();
    });
    const early: { status: number; text: string }[] = [];
    while (!out.includes('"listening"') && proc.exitCode === null) {
      const before = out.includes('"listening"');
      try {
        const r = await scrape(`http://127.0.0.1:${port}/readyz`, 20_000);
        if (!before && !out.includes('"listening"')) early.push(r);
      } catch {
        await new Promise((r) => setTimeout(r, 20));
      }
    }
    for (const r of early) expect(r).toEqual({ status: 503, text: "not ready: drafter loading\n" });
    expect(await scrape(`http://127.0.0.1:${port}/healthz`)).toEqual({ status: 200, text: "ok\n" });
    expect(await scrape(`http://127.0.0.1:${port}/readyz`)).toEqual({ status: 200, text: "ready\n" });
    proc.kill("SIGTERM");
  });
});
