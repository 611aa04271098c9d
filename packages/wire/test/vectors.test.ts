// CONTRACT 4-8 golden vectors (test/fixtures/wire-v1.json, a byte-identical copy of the shared file).
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, test } from "vitest";
import {
  checkReplyValues,
  decodeHeader,
  decodeHello,
  decodeHelloReply,
  decodeStepReply,
  decodeStepRequest,
  encodeHello,
  FrameStatus,
  frame,
  fromHex,
  helloAuth,
  peekStepReplyShape,
  runVectorCase,
  runVectors,
  splitFrame,
  toHex,
  WireError,
} from "../src/index.js";
import { FIXTURE, loadCases } from "./helpers.js";

const cases = loadCases();

describe("golden vectors: every case, both directions", () => {
  test("the fixture has the 60 cases of the shared file", () => {
    expect(cases.length).toBe(60);
    expect(cases.filter((c) => c.valid).length).toBe(27);
  });
  for (const c of cases) {
    test(c.name, () => {
      const r = runVectorCase(c);
      expect(r.problem).toBeUndefined();
      expect(r.ok).toBe(true);
    });
  }
  test("runVectors counts passes and failures", () => {
    const report = runVectors({ cases });
    expect(report.passed).toBe(60);
    expect(report.failed).toBe(0);
  });
});

describe("golden vectors: independent spot checks", () => {
  const byName = (n: string) => cases.find((c) => c.name === n)!;
  test("hello_request#1 decodes to its fields and its auth is the HMAC of the token (CONTRACT 6.1)", () => {
    const c = byName("hello_request#1");
    const { header, body } = splitFrame(fromHex(c.hex), undefined, { request: true });
    const h = decodeHello(body);
    const f = c.fields["hello"] as Record<string, unknown>;
    expect(h.window).toBe(f["window"]);
    expect(h.vocabSize).toBe(129280);
    expect(h.clientName).toBe("rank0-1");
    expect(toHex(h.auth)).toBe(f["auth"]);
    expect(toHex(helloAuth(c.fields["token"] as string, header.session, header.seq))).toBe(f["auth"]);
    expect(toHex(frame({ op: 1, seq: header.seq, session: header.session }, encodeHello(h)))).toBe(c.hex);
  });
  test("hello_reply_identity_mismatch#1 carries a HelloReply with status IDENTITY_MISMATCH", () => {
    const c = byName("hello_reply_identity_mismatch#1");
    const { header, body } = splitFrame(fromHex(c.hex));
    expect(header.status).toBe(FrameStatus.IDENTITY_MISMATCH);
    expect(decodeHelloReply(body).workerName).toBe("worker-1");
  });
  test("step_request_greedy#1: rows at 24 + 168, 64-aligned (CONTRACT 7.3)", () => {
    const c = byName("step_request_greedy#1");
    const msg = fromHex(c.hex);
    const { body } = splitFrame(msg);
    const r = decodeStepRequest(body, {
      sampled: false,
      rowBytes: 48,
      maxSlots: 64,
      maxRowsPerStep: 64,
      numSpec: 4,
    });
    expect(r.rowsOffset).toBe(168);
    expect((24 + r.rowsOffset) % 64).toBe(0);
    expect(r.entries.map((e) => e.slot)).toEqual([15, 42, 54]);
    expect(r.rows.buffer).toBe(msg.buffer);
  });
  test("step_reply_greedy#1: views decode the drafted values exactly", () => {
    const c = byName("step_reply_greedy#1");
    const { body } = splitFrame(fromHex(c.hex));
    const r = decodeStepReply(body, { nReq: 3, numSpec: 4, margin: true, sampled: false });
    expect(Array.from(r.draftIds)).toEqual(c.fields["draft_ids"]);
    expect(Array.from(r.confidence)).toEqual(c.fields["confidence"]);
    expect(r.workerUs).toBe(1234);
  });
  test("invalid header cases give the status the vector names", () => {
    for (const c of cases.filter((x) => !x.valid && !x.fields["request_context"])) {
      let err: unknown;
      try {
        decodeHeader(fromHex(c.hex));
      } catch (e) {
        err = e;
      }
      expect(err, c.name).toBeInstanceOf(WireError);
      expect(FrameStatus[c.expect as keyof typeof FrameStatus], c.name).toBe((err as WireError).status);
    }
  });
  test("invalid reply cases are refused by checkReplyValues naming the vector's slot/position", () => {
    for (const c of cases.filter((x) => !x.valid && x.fields["request_context"])) {
      const { body } = splitFrame(fromHex(c.hex));
      const r = decodeStepReply(body, peekStepReplyShape(body));
      const rc = c.fields["request_context"] as {
        vocab_size: number;
        window: number;
        entries: Record<string, number>[];
      };
      const entries = rc.entries.map((e) => ({
        slot: e["slot"]!,
        generation: e["generation"]!,
        anchorPos: e["anchor_pos"]!,
        nOut: e["n_out"]!,
        flags: e["flags"]!,
      }));
      let err: unknown;
      try {
        checkReplyValues(r, {
          stepId: r.stepId,
          vocabSize: rc.vocab_size,
          window: rc.window,
          numSpec: 2,
          entries,
        });
      } catch (e) {
        err = e;
      }
      expect(err, c.name).toBeInstanceOf(WireError);
      expect((err as WireError).message, c.name).toContain(c.expect);
      expect((err as WireError).code).toBe("WIRE_BAD_REPLY");
    }
  });
});

describe("runner refuses what it must", () => {
  test("a vector whose hex was changed fails, naming the mismatch", () => {
    const c = { ...cases.find((x) => x.name === "step_reply_greedy#1")! };
    c.hex = `${c.hex.slice(0, -2)}01`;
    const r = runVectorCase(c);
    expect(r.ok).toBe(false);
    expect(r.problem).toMatch(/margin|slot/);
  });
  test("an invalid vector that decodes fine fails", () => {
    const ping = cases.find((x) => x.name === "ping_request#1")!;
    const r = runVectorCase({ ...ping, valid: false, expect: "BAD_FRAME" });
    expect(r.ok).toBe(false);
    expect(r.problem).toContain("accepted");
  });
  test("a wrong expected status fails", () => {
    const c = cases.find((x) => x.name === "bad_magic#1")!;
    expect(runVectorCase({ ...c, expect: "BAD_VERSION" }).ok).toBe(false);
  });
});

describe("tapwire-wire-vectors bin", () => {
  const pkg = fileURLToPath(new URL("..", import.meta.url));
  const bin = join(pkg, "dist/bin/vectors.js");
  const run = (args: string[]) => spawnSync(process.execPath, [bin, ...args], { encoding: "utf8", cwd: pkg });
  test("is built (run `pnpm --filter @tapwire/wire build` first)", () => {
    expect(existsSync(bin)).toBe(true);
  });
  test("prints 60 passed, 0 failed for the fixture and exits 0", () => {
    const r = run([fileURLToPath(FIXTURE)]);
    expect(r.stdout.trim().split("\n").at(-1)).toBe("60 passed, 0 failed");
    expect(r.status).toBe(0);
  });
  test("prints per-case failures and exits 1 when cases fail", () => {
    const dir = mkdtempSync(join(tmpdir(), "wire-vectors-"));
    const file = join(dir, "v.json");
    const bad = cases.slice(0, 3).map((c) => ({ ...c }));
    bad[1]!.hex = bad[1]!.hex.replace(/^4453504b/, "4453504c");
    writeFileSync(file, JSON.stringify({ cases: bad }));
    const r = run([file]);
    expect(r.stdout).toContain(`FAIL ${bad[1]!.name}`);
    expect(r.stdout.trim().split("\n").at(-1)).toBe("2 passed, 1 failed");
    expect(r.status).toBe(1);
  });
  test("without a file it runs the shipped vectors/wire-v1.json (what `npx tapwire-wire-vectors` does)", () => {
    const r = run([]);
    expect(r.stdout.trim().split("\n").at(-1)).toBe("60 passed, 0 failed");
    expect(r.status).toBe(0);
  });
  test("usage error on an unknown flag or two files", () => {
    for (const args of [["--bogus"], ["a.json", "b.json"]]) {
      const r = run(args);
      expect(r.status).toBe(2);
      expect(r.stderr).toContain("usage");
    }
  });
});

// Issue 11 item 4: an npm user has no test/fixtures, so the tarball carries the vectors itself.
describe("the published tarball ships wire-v1.json", () => {
  const pkg = fileURLToPath(new URL("..", import.meta.url));
  const shipped = join(pkg, "vectors/wire-v1.json");
  test("vectors/wire-v1.json is byte-identical to test/fixtures/wire-v1.json", () => {
    expect(readFileSync(shipped).equals(readFileSync(FIXTURE))).toBe(true);
  });
  test("the packed file list holds vectors/wire-v1.json, exported as ./wire-v1.json", () => {
    const r = spawnSync("pnpm", ["pack", "--dry-run", "--json"], { encoding: "utf8", cwd: pkg });
    expect(r.status, r.stderr).toBe(0);
    const files = (JSON.parse(r.stdout) as { files: { path: string }[] }).files.map((f) => f.path);
    expect(files).toContain("vectors/wire-v1.json");
    expect(files).toContain("dist/bin/vectors.js");
    const manifest = JSON.parse(readFileSync(join(pkg, "package.json"), "utf8")) as {
      exports: Record<string, unknown>;
    };
    expect(manifest.exports["./wire-v1.json"]).toBe("./vectors/wire-v1.json");
  });
});
