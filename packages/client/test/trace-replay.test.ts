// Link capture and replay across process boundaries (issue 24): a RemoteDraftClient with a
// TraceWriter records a run against a real reference worker (tapwire-worker child process);
// tapwire-replay (its bin, a child process) replays the file against a freshly started reference
// worker, the ONNX drafter worker of the same head, and a worker whose head file was perturbed.
// A Python reader written from docs/trace.md alone parses the same file byte for byte.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { killAllChildren } from "@tapwire/testing";
import { parseTrace, RecordKind, readTrace, TraceWriter } from "@tapwire/trace";
import { APP_HEADER_SIZE, decodeStepReply, Op } from "@tapwire/wire";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { driveRun, headFiles, REF, runReplay, startWorker } from "./trace-link.js";
import { WORKER_BIN } from "./worker-bin.js";

let files: ReturnType<typeof headFiles>;
let tracePath: string;
let workerTracePath: string;
let run: { rounds: number; roundMs: number; drafted: number };
let tapNs = 0;

beforeAll(async () => {
  files = headFiles();
  tracePath = join(files.dir, "run.trace");
  workerTracePath = join(files.dir, "worker.trace");
  const w = await startWorker("reference", files.head, ["--trace", workerTracePath]);
  const writer = new TraceWriter({ path: tracePath, name: "trace-test" });
  run = await driveRun({ ...files, endpoint: w.endpoint, trace: writer, requests: 16, slots: 4 });
  const st = await writer.close();
  tapNs = st.tapNs;
  expect(st.dropped).toBe(0);
  await w.child.kill("SIGTERM");
}, 180_000);

afterAll(async () => {
  await killAllChildren();
  files?.remove();
});

interface Report {
  identical: boolean;
  steps: number;
  entriesCompared: number;
  entriesIdentical: number;
  entriesNotCompared: number;
  differenceCount: number;
  identity: { changed: boolean };
  first: {
    kind: string;
    step: number;
    entry: number;
    slot: number;
    position: number;
    trace: number;
    replay: number;
  } | null;
  rtt: { trace: { count: number }; replay: { count: number } };
}

function replayJson(
  endpoint: string,
  trace: string,
  extra: string[] = [],
): { code: number | null; report: Report; stderr: string } {
  const r = runReplay(["--trace", trace, "--endpoint", endpoint, "--fast", "--json", ...extra]);
  let report: Report;
  try {
    report = JSON.parse(r.stdout) as Report;
  } catch {
    throw new Error(`tapwire-replay printed no JSON (exit ${r.code}): ${r.stderr}`);
  }
  return { code: r.code, report, stderr: r.stderr };
}

describe("trace capture (docs/trace.md)", () => {
  test("the recorded file holds the HELLO and every STEP with its reply, exact frames", () => {
    const t = readTrace(tracePath);
    expect(t.complete).toBe(true);
    expect(t.dropped).toBe(0);
    expect(t.header.source).toBe("client");
    expect(t.header.hello.window).toBe(REF.window);
    expect(t.header.hello.rowBytes).toBe(REF.rowBytes);
    const steps = t.records.filter((r) => r.kind === RecordKind.REQUEST && r.stored[6] === Op.STEP);
    const replies = t.records.filter((r) => r.kind === RecordKind.REPLY && r.stored[6] === Op.STEP);
    expect(steps.length).toBe(run.rounds);
    expect(replies.length).toBe(run.rounds);
    // whole frames: body_len of each header matches what was stored
    for (const r of [...steps, ...replies]) {
      expect(r.stored.length).toBe(r.frameLen);
      expect(r.frameLen).toBe(
        APP_HEADER_SIZE + new DataView(r.stored.buffer, r.stored.byteOffset).getUint32(16, true),
      );
    }
    // the capture cost, as a share of the engine's round time (the bench has the same-run ratio)
    console.log(
      `trace capture: ${run.rounds} rounds, tap ${(tapNs / 1e6).toFixed(2)} ms of ${run.roundMs.toFixed(1)} ms round time (${((100 * tapNs) / 1e6 / run.roundMs).toFixed(2)} %)`,
    );
  });

  test("a Python 3 reader written from docs/trace.md alone parses it byte for byte", () => {
    const py = spawnSync("python3", [join(import.meta.dirname, "read_trace.py"), tracePath], {
      encoding: "utf8",
    });
    expect(py.status, py.stderr).toBe(0);
    const got = JSON.parse(py.stdout) as {
      header: Record<string, unknown>;
      records: { kind: string; seq?: number; op?: number; sha256?: string; frame_len?: number }[];
      complete: boolean;
    };
    const t = readTrace(tracePath);
    expect(got.complete).toBe(true);
    expect(got.header.row_bytes).toBe(REF.rowBytes);
    expect(got.header.hello_row_bytes).toBe(REF.rowBytes);
    expect(got.header.hello_window).toBe(REF.window);
    expect(got.header.hello_auth_zero).toBe(true);
    expect(got.header.writer_name).toBe("trace-test");
    const kinds = ["", "REQUEST", "REPLY", "GAP", "END"];
    expect(got.records.length).toBe(t.records.length + 1);
    t.records.forEach((r, i) => {
      const p = got.records[i]!;
      expect(p.kind).toBe(kinds[r.kind]);
      expect(p.seq).toBe(r.seq);
      expect(p.frame_len).toBe(r.frameLen);
      expect(p.sha256).toBe(createHash("sha256").update(r.stored).digest("hex"));
    });
    expect(got.records.at(-1)!.kind).toBe("END");
  });
});

describe("tapwire-worker --trace", () => {
  test("the worker's trace holds the same STEP frames as the client's, and replays identically", async () => {
    const c = readTrace(tracePath);
    const wt = readTrace(workerTracePath);
    expect(wt.complete).toBe(true);
    expect(wt.header.source).toBe("worker");
    const steps = (t: typeof c) =>
      t.records
        .filter((r) => r.stored[6] === Op.STEP)
        .map((r) => `${r.kind}:${createHash("sha256").update(r.stored).digest("hex")}`);
    expect(steps(wt)).toEqual(steps(c));
    const w = await startWorker("reference", files.head);
    const { code, report } = replayJson(w.endpoint, workerTracePath);
    expect(code).toBe(0);
    expect(report.steps).toBe(run.rounds);
    expect(report.entriesIdentical).toBe(report.entriesCompared);
    await w.child.kill("SIGTERM");
  }, 120_000);

  test("--trace-rows and an unwritable --trace are usage errors (exit 2) before serving", () => {
    const r = spawnSync(
      process.execPath,
      [WORKER_BIN, "--trace", join(files.dir, "x.trace"), "--trace-rows", "some"],
      {
        encoding: "utf8",
      },
    );
    expect(r.status).toBe(2);
    expect(r.stderr).toContain("--trace-rows some");
    const u = spawnSync(
      process.execPath,
      [
        WORKER_BIN,
        "--drafter",
        "null",
        "--listen",
        "tcp://127.0.0.1:0",
        "--trace",
        join(files.dir, "no", "x.trace"),
      ],
      { encoding: "utf8" },
    );
    expect(u.status).toBe(2);
    expect(u.stderr).toContain("cannot be written (ENOENT)");
  });
});

describe("tapwire-replay (parity report)", () => {
  test("against a freshly started reference worker: 0 differences", async () => {
    const w = await startWorker("reference", files.head);
    const { code, report } = replayJson(w.endpoint, tracePath);
    expect(code).toBe(0);
    expect(report.identical).toBe(true);
    expect(report.differenceCount).toBe(0);
    expect(report.identity.changed).toBe(false);
    expect(report.steps).toBe(run.rounds);
    expect(report.entriesCompared).toBeGreaterThan(run.rounds);
    expect(report.entriesIdentical).toBe(report.entriesCompared);
    expect(report.rtt.trace.count).toBe(run.rounds);
    expect(report.rtt.replay.count).toBe(run.rounds);
    await w.child.kill("SIGTERM");
  }, 120_000);

  test("against the ONNX drafter worker of the same head: 0 differences", async () => {
    const w = await startWorker("onnx", files.head);
    const { code, report, stderr } = replayJson(w.endpoint, tracePath);
    expect(code, stderr).toBe(0);
    expect(report.identical).toBe(true);
    expect(report.entriesCompared).toBeGreaterThan(run.rounds);
    await w.child.kill("SIGTERM");
  }, 120_000);

  test("against a worker with a perturbed head: the first differing slot and position are named", async () => {
    const w = await startWorker("reference", files.perturbed);
    const { code, report } = replayJson(w.endpoint, tracePath);
    expect(code).toBe(1);
    expect(report.identical).toBe(false);
    expect(report.identity.changed).toBe(true);
    expect(report.differenceCount).toBeGreaterThan(0);
    const f = report.first!;
    expect(f.kind).toBe("draft");
    expect(f.position).toBeGreaterThanOrEqual(0);
    // the named place is real: the trace's reply of that STEP holds that id for that slot
    const t = readTrace(tracePath);
    const reqs = t.records.filter((r) => r.kind === RecordKind.REQUEST && r.stored[6] === Op.STEP);
    const req = reqs[f.step]!;
    const rep = t.records.find((r) => r.kind === RecordKind.REPLY && r.seq === req.seq)!;
    const nReq = new DataView(req.stored.buffer, req.stored.byteOffset).getUint32(APP_HEADER_SIZE + 8, true);
    const slot = new DataView(req.stored.buffer, req.stored.byteOffset).getUint32(
      APP_HEADER_SIZE + 16 + 32 * f.entry,
      true,
    );
    expect(slot).toBe(f.slot);
    const views = decodeStepReply(rep.stored.slice(APP_HEADER_SIZE), {
      nReq,
      numSpec: REF.numSpec,
      margin: true,
      sampled: false,
    });
    expect(views.draftIds[f.entry * REF.numSpec + f.position]).toBe(f.trace);
    expect(f.replay).not.toBe(f.trace);
    // the text report names it too; --allow-diff exits 0
    const text = runReplay(["--trace", tracePath, "--endpoint", w.endpoint, "--fast", "--allow-diff"]);
    expect(text.code).toBe(0);
    expect(text.stdout).toContain(`slot ${f.slot} position ${f.position}: draft ${f.trace} -> ${f.replay}`);
    expect(text.stdout).toContain("identity: CHANGED");
    await w.child.kill("SIGTERM");
  }, 120_000);

  test("a 48-request trace with rows dropped is < 5 MiB; its replay compares what it can", async () => {
    const w = await startWorker("reference", files.head);
    const path = join(files.dir, "norows.trace");
    const writer = new TraceWriter({ path, rows: "none" });
    const r = await driveRun({
      ...files,
      endpoint: w.endpoint,
      trace: writer,
      requests: 48,
      slots: 8,
      seed: 11,
    });
    const st = await writer.close();
    // every STEP that carried rows (a RELEASE-only STEP has none to omit)
    expect(st.rowsOmitted).toBeGreaterThan(r.rounds / 2);
    expect(st.rowsOmitted).toBeLessThanOrEqual(r.rounds);
    const size = statSync(path).size;
    console.log(`48-request trace without rows: ${r.rounds} rounds, ${size} bytes`);
    expect(size).toBeLessThan(5 * 1024 * 1024);
    const t = parseTrace(new Uint8Array(fileBytes(path)));
    expect(t.header.rowsPolicy).toBe("none");
    const fresh = await startWorker("reference", files.head);
    const { code, report } = replayJson(fresh.endpoint, path, ["--allow-diff"]);
    expect(code).toBe(0);
    expect(report.steps).toBe(r.rounds);
    expect(report.entriesNotCompared).toBeGreaterThan(0);
    await w.child.kill("SIGTERM");
    await fresh.child.kill("SIGTERM");
  }, 180_000);
});

function fileBytes(path: string): Buffer {
  return readFileSync(path);
}
