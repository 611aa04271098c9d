// tapwire-replay's command line and its failures across a process boundary (issue 24): usage
// errors exit 2 in one line; a file that is not a trace, an endpoint nobody listens on, and a
// hostile server answering garbage exit 3 with a TraceError code. The parity itself is tested
// against real workers in packages/client/test/trace-replay.test.ts and apps/harness/test/trace.test.ts.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { listen } from "@tapwire/transport";
import { afterAll, expect, test } from "vitest";
import { TraceWriter } from "../src/index.js";
import { frameOf, helloBody, stepBody } from "./frames.js";

const BIN = join(import.meta.dirname, "..", "dist", "bin", "replay.js");
const dir = mkdtempSync(join(tmpdir(), "tapwire-replay-bin-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function run(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const c = spawn(process.execPath, [BIN, ...args], { stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    c.stdout.on("data", (d: Buffer) => (stdout += d));
    c.stderr.on("data", (d: Buffer) => (stderr += d));
    c.on("exit", (code) => resolve({ code, stdout, stderr }));
  });
}

async function smallTrace(): Promise<string> {
  const path = join(dir, "small.trace");
  const w = new TraceWriter({ path });
  const h = frameOf(1, 0, 1, 5, helloBody());
  w.request(h, h.length);
  const s = frameOf(2, 0, 2, 5, stepBody(0, 0, 4, 4));
  w.request(s, s.length);
  await w.close();
  return path;
}

test("usage errors exit 2 with one line; --help exits 0", async () => {
  for (const [args, msg] of [
    [[], /--trace FILE is required/],
    [["--trace", "x"], /--endpoint URL is required/],
    [["--bogus"], /unknown flag --bogus/],
    [["--trace", "x", "--endpoint", "tcp://127.0.0.1:1", "--timeout-ms", "abc"], /--timeout-ms abc/],
    [["--fast=1"], /--fast takes no value/],
  ] as const) {
    const r = await run([...args]);
    expect(r.code, r.stderr).toBe(2);
    expect(r.stderr).toMatch(msg);
    expect(r.stderr.trim().split("\n").length).toBe(1);
  }
  const h = await run(["--help"]);
  expect(h.code).toBe(0);
  expect(h.stdout).toContain("--allow-diff");
});

test("not a trace, nobody listening, a hostile server: exit 3 with the error's code", async () => {
  const garbage = join(dir, "garbage.trace");
  writeFileSync(garbage, "TAPTRACX and then nothing useful");
  const a = await run(["--trace", garbage, "--endpoint", "tcp://127.0.0.1:1"]);
  expect(a.code).toBe(3);
  expect(a.stderr).toContain("TRACE_BAD_FILE");
  const trace = await smallTrace();
  const b = await run(["--trace", trace, "--endpoint", "tcp://127.0.0.1:1", "--timeout-ms", "2000"]);
  expect(b.code).toBe(3);
  expect(b.stderr).toContain("TRACE_REPLAY: cannot connect");
  // a server that answers every request with bytes that are no DSPK frame
  const srv = await listen("tcp://127.0.0.1:0", () => new Uint8Array(200).fill(0x5a));
  try {
    const c = await run(["--trace", trace, "--endpoint", srv.endpoint, "--timeout-ms", "2000"]);
    expect(c.code).toBe(3);
    expect(c.stderr).toContain("TRACE_REPLAY: HELLO refused");
  } finally {
    await srv.close();
  }
});
