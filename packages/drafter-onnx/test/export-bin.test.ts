/** `tapwire-onnx-export` as a child process: export, --check (text and JSON), bad input, usage. */
import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { defaultPair, tempDir } from "./helpers.js";
import { toyModel } from "./toy.js";

const BIN = join(dirname(fileURLToPath(import.meta.url)), "..", "dist", "bin", "export.js");
const run = (args: string[]) =>
  spawnSync(process.execPath, [BIN, ...args], { encoding: "utf8", timeout: 60_000 });
const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");

describe("tapwire-onnx-export", () => {
  const t = tempDir();
  afterAll(() => t.remove());
  const { head } = defaultPair();

  it("exports a reference head; --check validates it and prints the reference drafter's identities", () => {
    const st = join(t.dir, "head.safetensors");
    const model = join(t.dir, "head.onnx");
    head.save(st);
    const e = run([st, "-o", model, "--num-spec", "8"]);
    expect(e.status, e.stderr).toBe(0);
    expect(e.stdout).toMatch(/wrote .*head\.onnx \(\d+ bytes\)/);
    const c = run(["--check", model]);
    expect(c.status, c.stderr).toBe(0);
    expect(c.stdout).toContain("signature OK");
    expect(c.stdout).toContain("num_spec 8");
    expect(c.stdout).toContain(`drafter_identity ${hex(head.drafterIdentity)}`);
    expect(c.stdout).toContain(`markov_identity  ${hex(head.markovIdentity)}`);
    const j = run(["--check", model, "--json"]);
    const report = JSON.parse(j.stdout) as Record<string, unknown>;
    expect(report).toMatchObject({
      signature: "ok",
      window: 16,
      numSpec: 8,
      vocabSize: 2048,
      rowBytes: 6144,
      windowRows: 1,
      stateSize: 48,
      top32: true,
      drafterIdentity: hex(head.drafterIdentity),
      markovIdentity: hex(head.markovIdentity),
    });
  });

  it("--check of a hand-built model (full logits, no state)", () => {
    const model = join(t.dir, "toy.onnx");
    writeFileSync(model, toyModel());
    const c = run(["--check", model, "--json"]);
    expect(c.status, c.stderr).toBe(0);
    expect(JSON.parse(c.stdout)).toMatchObject({
      outputs: "logits",
      stateSize: 0,
      windowRows: 2,
      vocabSize: 64,
    });
  });

  it("--check of a model that does not fit exits 1 naming the problem", () => {
    const model = join(t.dir, "bad.onnx");
    writeFileSync(model, toyModel({ edit: (m) => void m.graph!.output!.splice(1, 1) }));
    const c = run(["--check", model]);
    expect(c.status).toBe(1);
    expect(c.stderr).toContain("ONNX_DRAFTER_BAD_SIGNATURE: output confidence is missing");
  });

  it("exporting something that is not a head exits 1; bad usage exits 2", () => {
    const junk = join(t.dir, "junk.safetensors");
    writeFileSync(junk, new Uint8Array(100));
    const e = run([junk, "-o", join(t.dir, "x.onnx")]);
    expect(e.status).toBe(1);
    expect(e.stderr).toContain("ONNX_DRAFTER_BAD_HEAD");
    expect(run([junk]).status).toBe(2);
    expect(run(["--num-spec", "40", junk, "-o", "x"]).stderr).toContain("--num-spec 40 outside 1..32");
    expect(run(["--nope"]).status).toBe(2);
  });
});
