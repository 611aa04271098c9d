/**
 * The ONNX drafter behind the real worker over real sockets (CONTRACT 6, 7): HELLO announces the
 * reference head's identities, STEP drafts equal ReferenceDrafter's for the same windows (greedy
 * and TOP32), a model that throws answers DRAFT_FAILED for that STEP and the next one works;
 * and `tapwire-worker --drafter onnx` as a child process, with the package installed in the
 * user's project and without it (exit 2 naming the install command).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdirSync, symlinkSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { Xoshiro128 } from "@tapwire/reference-model";
import { FrameStatus, ReqStatus } from "@tapwire/wire";
import { createWorker, type DraftBatchEntry, ReferenceDrafter, type Worker } from "@tapwire/worker";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { exportReferenceHead, OnnxDrafter } from "../src/index.js";
import { defaultPair, makeOutput, rowPool, tempDir } from "./helpers.js";
import { Link, type LinkEntry } from "./link.js";
import { TOY, toyModel } from "./toy.js";

const PKG = join(dirname(fileURLToPath(import.meta.url)), "..");
const require = createRequire(import.meta.url);
const WORKER_BIN = join(dirname(require.resolve("@tapwire/worker/package.json")), "dist/bin/worker.js");

const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");

/** The entries of a STEP as the worker hands them to a drafter (windows = the rows sent). */
function asBatch(
  list: LinkEntry[],
  rowBytes: number,
  meta: { seed: number; topK: number; tempMilli: number }[] | null,
): DraftBatchEntry[] {
  return list.map((e, i) => ({
    index: i,
    slot: e.slot,
    anchorPos: e.anchorPos,
    anchorToken: e.anchorToken,
    k: e.nOut || 4,
    rows: e.rows,
    nRows: e.rows.length / rowBytes,
    sample: meta?.[i] ?? null,
  }));
}

function entriesFrom(rng: Xoshiro128, pool: Uint8Array, rb: number, n: number): LinkEntry[] {
  return Array.from({ length: n }, (_, i) => {
    const nRows = 1 + rng.nextInt(16);
    const start = rng.nextInt(pool.length / rb - nRows + 1);
    return {
      slot: i,
      anchorPos: nRows,
      anchorToken: rng.nextInt(2048),
      rows: pool.slice(start * rb, (start + nRows) * rb),
    };
  });
}

describe("behind the real worker (in process)", () => {
  let worker: Worker;
  let drafter: OnnxDrafter;
  const { head } = defaultPair();
  const ref = new ReferenceDrafter(head);
  const rb = head.numTaps * head.hidden * 2;
  beforeAll(async () => {
    drafter = await OnnxDrafter.create(exportReferenceHead(head));
    worker = await createWorker({ drafter, listen: ["tcp://127.0.0.1:0"] });
  });
  afterAll(async () => {
    await worker.close();
    await drafter.release();
  });

  for (const sampled of [false, true]) {
    it(`${sampled ? "TOP32" : "greedy"}: HELLO OK with the reference identities; STEP drafts equal ReferenceDrafter's`, async () => {
      const link = await new Link(worker.endpoints[0]!, drafter).connect();
      try {
        const h = await link.hello(ref, sampled);
        expect(h.status).toBe(FrameStatus.OK);
        expect(hex(h.reply!.drafterIdentity)).toBe(hex(head.drafterIdentity));
        expect(hex(h.reply!.markovIdentity)).toBe(hex(head.markovIdentity));
        const rng = new Xoshiro128(sampled ? 11 : 12);
        const pool = rowPool(rng, rb, 40);
        for (let s = 0; s < 8; s++) {
          const list = entriesFrom(rng, pool, rb, 1 + rng.nextInt(10));
          const meta = sampled
            ? list.map(() => ({
                seed: rng.nextU32(),
                topK: 1 + rng.nextInt(32),
                tempMilli: rng.nextInt(3) * 700,
              }))
            : null;
          const r = await link.step(list, meta);
          expect(r.status).toBe(FrameStatus.OK);
          const v = r.views!;
          const want = makeOutput(list.length, 4, sampled);
          ref.draft(asBatch(list, rb, meta), want);
          expect(Array.from(v.status)).toEqual(list.map(() => ReqStatus.OK));
          expect(Array.from(v.draftIds)).toEqual(Array.from(want.draftIds));
          if (sampled) {
            expect(Array.from(v.proposalQ!)).toEqual(Array.from(want.proposalQ!));
            expect(Array.from(v.supportIds!)).toEqual(Array.from(want.supportIds!));
          }
          for (let i = 0; i < want.confidence.length; i++) {
            expect(Math.abs(v.confidence[i]! - want.confidence[i]!)).toBeLessThanOrEqual(
              1e-5 * want.confidence[i]!,
            );
          }
        }
      } finally {
        link.close();
      }
    });
  }

  it("a HELLO with other identities is IDENTITY_MISMATCH", async () => {
    const link = await new Link(worker.endpoints[0]!, drafter).connect();
    try {
      const h = await link.hello(
        { drafterIdentity: new Uint8Array(32), markovIdentity: head.markovIdentity },
        false,
      );
      expect(h.status).toBe(FrameStatus.IDENTITY_MISMATCH);
    } finally {
      link.close();
    }
  });
});

describe("a model that throws, behind the real worker", () => {
  it("answers DRAFT_FAILED for that STEP's entries and keeps serving", async () => {
    const drafter = await OnnxDrafter.create(toyModel({ throwAfterPosition0: true }));
    const worker = await createWorker({ drafter, listen: ["tcp://127.0.0.1:0"] });
    const link = await new Link(worker.endpoints[0]!, drafter).connect();
    try {
      expect((await link.hello(drafter, false)).status).toBe(FrameStatus.OK);
      const rb = TOY.numTaps * TOY.hidden * 2;
      const list = [0, 1].map((slot) => ({
        slot,
        anchorPos: 2,
        anchorToken: 5 + slot,
        rows: new Uint8Array(2 * rb).fill(1),
      }));
      const bad = await link.step(list);
      expect(bad.status).toBe(FrameStatus.OK);
      expect(Array.from(bad.views!.status)).toEqual([ReqStatus.DRAFT_FAILED, ReqStatus.DRAFT_FAILED]);
      expect(Array.from(bad.views!.draftIds).every((x) => x === 0)).toBe(true);
      const good = await link.step(list.map((e) => ({ ...e, nOut: 1 })));
      expect(Array.from(good.views!.status)).toEqual([ReqStatus.OK, ReqStatus.OK]);
      expect(good.views!.draftIds[0]).toBe((5 * 5 + 1) % TOY.vocab);
    } finally {
      link.close();
      await worker.close();
      await drafter.release();
    }
  });
});

const children: ChildProcess[] = [];
afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null) c.kill("SIGKILL");
});

function runWorker(args: string[], cwd: string) {
  // No NODE_PATH: the package runner's NODE_PATH (pnpm's hoisted store) is not a user's environment.
  const env = { ...process.env };
  delete env["NODE_PATH"];
  const proc = spawn(process.execPath, [WORKER_BIN, ...args], {
    cwd,
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.push(proc);
  let stderr = "";
  proc.stderr!.on("data", (b: Buffer) => {
    stderr += b.toString();
  });
  const exit = new Promise<number | null>((resolve) => proc.once("exit", (code) => resolve(code)));
  const listening = new Promise<Record<string, unknown>>((resolve, reject) => {
    createInterface({ input: proc.stdout! }).on("line", (l) => {
      try {
        const j = JSON.parse(l) as Record<string, unknown>;
        if (j["msg"] === "listening") resolve(j);
      } catch {
        // not a pino line
      }
    });
    void exit.then((code) => reject(new Error(`worker exited ${code}: ${stderr}`)));
  });
  listening.catch(() => {});
  return { proc, exit, listening, stderr: () => stderr };
}

describe("tapwire-worker --drafter onnx (child process)", () => {
  const { head } = defaultPair();
  const t = tempDir();
  const model = join(t.dir, "head.onnx");
  // A user's project that installed both packages: node_modules/@tapwire/drafter-onnx.
  const project = join(t.dir, "project");
  beforeAll(() => {
    writeFileSync(model, exportReferenceHead(head));
    mkdirSync(join(project, "node_modules", "@tapwire"), { recursive: true });
    writeFileSync(join(project, "package.json"), '{ "name": "user-project", "private": true }\n');
    symlinkSync(PKG, join(project, "node_modules", "@tapwire", "drafter-onnx"), "dir");
  });
  afterAll(() => t.remove());

  it("serves the exported head: the listening line and HELLO carry the reference identities; STEP drafts", async () => {
    const w = runWorker(
      ["--drafter", "onnx", "--model", model, "--listen", "tcp://127.0.0.1:0", "--onnx-threads", "1"],
      project,
    );
    const line = await w.listening;
    expect(line).toMatchObject({
      drafter: "OnnxDrafter",
      drafterIdentity: hex(head.drafterIdentity),
      markovIdentity: hex(head.markovIdentity),
      window: 16,
      numSpec: 4,
      vocabSize: 2048,
    });
    const link = await new Link((line["endpoints"] as string[])[0]!, new ReferenceDrafter(head)).connect();
    try {
      expect((await link.hello(head, false)).status).toBe(FrameStatus.OK);
      const rb = head.numTaps * head.hidden * 2;
      const list = [{ slot: 0, anchorPos: 3, anchorToken: 42, rows: new Uint8Array(3 * rb).fill(0x3c) }];
      const r = await link.step(list);
      const want = makeOutput(1, 4, false);
      new ReferenceDrafter(head).draft(asBatch(list, rb, null), want);
      expect(Array.from(r.views!.draftIds)).toEqual(Array.from(want.draftIds));
    } finally {
      link.close();
    }
    w.proc.kill("SIGTERM");
    expect(await w.exit).toBe(0);
  });

  it("a reference head's safetensors is served through ONNX Runtime too (--model head.safetensors)", async () => {
    const st = join(t.dir, "head.safetensors");
    head.save(st);
    const w = runWorker(["--drafter", "onnx", "--model", st, "--listen", "tcp://127.0.0.1:0"], project);
    expect(await w.listening).toMatchObject({
      drafter: "OnnxDrafter",
      drafterIdentity: hex(head.drafterIdentity),
    });
    w.proc.kill("SIGTERM");
    expect(await w.exit).toBe(0);
  });

  it("from a folder outside any project, in the workspace: the workspace's drafter is found (issue 19)", async () => {
    // An npm user without the package gets exit 2 and the npm command: test:pack checks that on
    // the worker installed alone from its tarball (scripts/test-pack.mjs "bin usage").
    const empty = join(t.dir, "empty");
    mkdirSync(empty, { recursive: true });
    const w = runWorker(["--drafter", "onnx", "--model", model, "--listen", "tcp://127.0.0.1:0"], empty);
    try {
      await w.listening;
    } finally {
      w.proc.kill("SIGTERM");
    }
    expect(await w.exit).toBe(0);
  });

  it("a model that does not fit: exit 2 naming the problem (a configuration error, docs/operations.md)", async () => {
    const bad = join(t.dir, "bad.onnx");
    writeFileSync(bad, new Uint8Array(64).fill(0xff));
    const w = runWorker(["--drafter", "onnx", "--model", bad, "--listen", "tcp://127.0.0.1:0"], project);
    expect(await w.exit).toBe(2);
    expect(w.stderr()).toContain("ONNX_DRAFTER_BAD_MODEL");
  });

  it("--drafter onnx without --model: exit 2", async () => {
    const w = runWorker(["--drafter", "onnx", "--listen", "tcp://127.0.0.1:0"], project);
    expect(await w.exit).toBe(2);
    expect(w.stderr()).toContain("--model");
  });
});
