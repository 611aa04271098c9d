// Issue 19, what an operator hit: one exit code policy (2 usage/config, 75 bind failure that may
// clear, 1 other), every message naming the flag and the file, --print-identities giving what the
// engine's HELLO needs, and --drafter onnx found from any working directory of the workspace.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createDefaultPair } from "@tapwire/reference-model";
import { afterAll, afterEach, beforeAll, describe, expect, test } from "vitest";
import { BIN, children, spawnWorker } from "./spawn.js";

afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null) c.kill("SIGKILL");
});

let dir = "";
let head = "";
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "tapwire-bin-ops-"));
  head = join(dir, "head.safetensors");
  // docs/operations.md "Exporting a head": the geometry is chosen at export.
  createDefaultPair({
    target: { numTaps: 2, hidden: 64, vocabSize: 512 },
    draft: { window: 8, numSpec: 3 },
  }).head.save(head);
  writeFileSync(
    join(dir, "ca.crt"),
    "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n",
  );
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function run(args: string[], cwd?: string): Promise<{ code: number | null; out: string; err: string }> {
  const proc = spawn(process.execPath, [BIN, ...args], { stdio: ["ignore", "pipe", "pipe"], cwd });
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

/** A TCP port held by this test process until `close`. */
async function heldPort(): Promise<{ port: number; close: () => Promise<void> }> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  return { port: (s.address() as net.AddressInfo).port, close: () => new Promise((r) => s.close(() => r())) };
}

const NULL = ["--drafter", "null", "--num-taps", "1", "--hidden", "8"];

describe("exit codes (docs/operations.md: 2 usage, 75 bind, 1 other)", () => {
  test("--listen on a port in use exits 75 naming --listen and the address", async () => {
    const held = await heldPort();
    try {
      const r = await run([...NULL, "--listen", `tcp://127.0.0.1:${held.port}`]);
      expect(r.code).toBe(75);
      expect(r.err).toContain(`--listen: listen on tcp://127.0.0.1:${held.port} failed: EADDRINUSE`);
    } finally {
      await held.close();
    }
  });

  test("--metrics-listen on a port in use exits 75 naming the flag", async () => {
    const held = await heldPort();
    try {
      const at = `tcp://127.0.0.1:${held.port}`;
      const r = await run([...NULL, "--listen", "tcp://127.0.0.1:0", "--metrics-listen", at]);
      expect(r.code).toBe(75);
      expect(r.err).toContain(`--metrics-listen ${at}: cannot bind (EADDRINUSE)`);
    } finally {
      await held.close();
    }
  });

  test("--weights ca.crt exits 2 naming the flag and the file", async () => {
    const file = join(dir, "ca.crt");
    const r = await run(["--weights", file, "--listen", "tcp://127.0.0.1:0"]);
    expect(r.code).toBe(2);
    expect(r.err.split("\n")[0]).toMatch(
      new RegExp(
        `^tapwire-worker: --weights ${file.replace(/[.]/g, "\\.")}: not a draft head safetensors file`,
      ),
    );
  });

  test("--weights of a missing file, --tls-cert of a missing file: exit 2 naming both", async () => {
    const missing = join(dir, "nope.safetensors");
    const a = await run(["--weights", missing]);
    expect(a.code).toBe(2);
    expect(a.err).toContain(`--weights ${missing}: cannot read it (ENOENT)`);
    const b = await run([
      ...NULL,
      "--listen",
      "tls://127.0.0.1:0",
      "--tls-cert",
      missing,
      "--tls-key",
      missing,
    ]);
    expect(b.code).toBe(2);
    expect(b.err).toContain(`--tls-cert ${missing}: cannot read it (ENOENT)`);
  });

  test("--weights with a flag that disagrees with the head exits 2 naming it", async () => {
    const r = await run(["--weights", head, "--hidden", "4096"]);
    expect(r.code).toBe(2);
    expect(r.err).toContain(`--hidden 4096 differs from the head's 64 (--weights ${head})`);
  });
});

describe("--print-identities", () => {
  test("prints the identities and geometry of --weights, the same the listening worker announces", async () => {
    const r = await run(["--print-identities", "--weights", head]);
    expect(r.code).toBe(0);
    const id = JSON.parse(r.out.trim()) as Record<string, unknown>;
    expect(id).toMatchObject({
      window: 8,
      numSpec: 3,
      numTaps: 2,
      hidden: 64,
      vocabSize: 512,
      rowBytes: 256,
    });
    const w = await spawnWorker(["--weights", head, "--listen", "tcp://127.0.0.1:0"]);
    expect(id.drafterIdentity).toBe(w.listening.drafterIdentity);
    expect(id.markovIdentity).toBe(w.listening.markovIdentity);
    expect(id.drafterIdentity).not.toBe("0".repeat(64));
    w.proc.kill("SIGTERM");
    expect(await w.exit).toBe(0);
  });

  test("without --weights: the default head's identities; nothing is bound", async () => {
    const r = await run(["--print-identities", "--listen", "tcp://127.0.0.1:1"]);
    expect(r.code).toBe(0);
    const id = JSON.parse(r.out.trim()) as Record<string, unknown>;
    expect(id.drafter).toBe("ReferenceDrafter");
    expect(String(id.drafterIdentity)).toMatch(/^[0-9a-f]{64}$/);
  });
});

describe("--drafter onnx from any working directory (issue 19)", () => {
  test("from a folder outside the workspace the workspace's @tapwire/drafter-onnx is found", async () => {
    // A reference head .safetensors is a model the ONNX drafter accepts (docs/onnx-drafter.md).
    const w = await spawnWorkerIn(dir, [
      "--drafter",
      "onnx",
      "--model",
      head,
      "--listen",
      "tcp://127.0.0.1:0",
    ]);
    expect(w.drafter).toBe("OnnxDrafter");
  }, 60_000);

  test("TAPWIRE_DRAFTER_ONNX naming no package: exit 2 naming the variable", async () => {
    const proc = spawn(process.execPath, [BIN, "--drafter", "onnx", "--model", head], {
      cwd: dir,
      env: { ...process.env, TAPWIRE_DRAFTER_ONNX: join(dir, "missing") },
      stdio: ["ignore", "pipe", "pipe"],
    });
    children.push(proc);
    let err = "";
    proc.stderr!.on("data", (b: Buffer) => {
      err += b.toString();
    });
    const code = await new Promise((r) => proc.on("exit", r));
    expect(code).toBe(2);
    expect(err).toContain(`TAPWIRE_DRAFTER_ONNX=${join(dir, "missing")}: not @tapwire/drafter-onnx's folder`);
  });
});

/** spawnWorker with another cwd; resolves the listening line. */
async function spawnWorkerIn(cwd: string, args: string[]): Promise<Record<string, unknown>> {
  const proc = spawn(process.execPath, [BIN, ...args], { cwd, stdio: ["ignore", "pipe", "pipe"] });
  children.push(proc);
  let out = "";
  let err = "";
  proc.stderr!.on("data", (b: Buffer) => {
    err += b.toString();
  });
  return new Promise((resolve, reject) => {
    proc.stdout!.on("data", (b: Buffer) => {
      out += b.toString();
      const line = out.split("\n").find((l) => l.includes('"msg":"listening"'));
      if (line !== undefined) {
        resolve(JSON.parse(line) as Record<string, unknown>);
        proc.kill("SIGTERM");
      }
    });
    proc.on("exit", (code) => reject(new Error(`worker exited ${code} before listening: ${err}`)));
  });
}
