import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { DraftHead, TargetModel } from "@tapwire/reference-model";
import { createDefaultPair } from "@tapwire/reference-model";
import type { ReqEntry } from "@tapwire/wire";
import {
  APP_HEADER_SIZE,
  Capability,
  checkReplyValues,
  decodeStepReply,
  FrameStatus,
  ReqStatus,
  rowsOffsetFor,
  SampleMode,
  stepRequestBodySize,
  validateSampled,
  writeStepPrefix,
} from "@tapwire/wire";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import type { Worker } from "../src/index.js";
import { createWorker, ReferenceDrafter } from "../src/index.js";
import { helloFor, Raw, Sess } from "./helpers.js";
import { children, spawnWorker } from "./spawn.js";

// A small target (rows of 3 x 128 bf16) keeps distillation quick; everything else is the default.
const HIDDEN = 128;
let target: TargetModel;
let head: DraftHead;
let drafter: ReferenceDrafter;
let worker: Worker;
let raw: Raw;

/** Greedy target sequence: tokens[0..n] and the tap row of each token. */
function sequence(n: number, prompt: number[]): { tokens: number[]; rows: Uint8Array } {
  const rb = target.rowBytes;
  const rows = new Uint8Array(n * rb);
  const logits = new Float32Array(target.config.vocabSize);
  const state = target.initialState([]);
  const tokens = [...prompt];
  for (let p = 0; p < n; p++) {
    target.forward(state, tokens[p]!, logits, rows.subarray(p * rb, (p + 1) * rb), state);
    if (p + 1 >= tokens.length) tokens.push(target.argmax(logits));
  }
  return { tokens, rows };
}

/** A STEP frame whose rows are real target rows. */
function refStep(
  s: Sess,
  entries: ReqEntry[],
  rowsOf: Uint8Array[],
  sampleMeta: { seed: number; topK: number; tempMilli: number }[] | null,
) {
  const rb = target.rowBytes;
  const nRows = entries.reduce((a, e) => a + e.nRows, 0);
  const buf = new Uint8Array(
    APP_HEADER_SIZE + stepRequestBodySize(entries.length, nRows, rb, sampleMeta !== null),
  );
  let off = APP_HEADER_SIZE + rowsOffsetFor(entries.length, sampleMeta !== null);
  for (const r of rowsOf) {
    buf.set(r, off);
    off += r.length;
  }
  s.seq++;
  const len = writeStepPrefix(buf, {
    seq: s.seq,
    session: s.session,
    stepId: 5,
    entries,
    sampleMeta,
    nRows,
    rowBytes: rb,
  });
  return buf.subarray(0, len);
}

beforeAll(async () => {
  const pair = createDefaultPair({ target: { hidden: HIDDEN } });
  target = pair.target;
  head = pair.head;
  drafter = new ReferenceDrafter(head);
  worker = await createWorker({ drafter, listen: ["tcp://127.0.0.1:0"], maxSlots: 8 });
  raw = await new Raw(worker.endpoints[0]!).connect();
});
afterAll(async () => {
  for (const c of children.splice(0)) if (c.exitCode === null) c.kill("SIGKILL");
  raw?.close();
  await worker?.close();
});

describe("ReferenceDrafter", () => {
  test("identities and geometry come from the head", () => {
    expect(drafter.drafterIdentity).toEqual(head.drafterIdentity);
    expect(drafter.markovIdentity).toEqual(head.markovIdentity);
    expect(drafter.window).toBe(head.config.window);
    expect(drafter.numSpec).toBe(head.config.numSpec);
    expect(drafter.vocabSize).toBe(target.config.vocabSize);
    expect(drafter.numTaps * drafter.hidden * 2).toBe(target.rowBytes);
    expect(drafter.capabilities).toBe(Capability.TAPS_BF16 | Capability.TOP32 | Capability.MARGIN);
  });

  test("greedy drafts over the link equal the head's own drafts from the same window", async () => {
    const s = new Sess(raw, 0x501, drafter, helloFor(drafter, { maxSlots: 8 }));
    expect((await s.doHello()).status).toBe(FrameStatus.OK);
    const W = drafter.window;
    const N = drafter.numSpec;
    const rb = target.rowBytes;
    const a = sequence(30, [5, 9, 2]);
    const b = sequence(6, [100]);
    const entries: ReqEntry[] = [
      // slot 0: the last W rows of 30; slot 1: all 6 rows; slot 2: anchor 0, no rows;
      // slot 3: an anchor token outside the vocabulary fails alone
      {
        slot: 0,
        generation: 1,
        anchorPos: 30,
        anchorToken: a.tokens[30]!,
        rowStart: 30 - W,
        nRows: W,
        nOut: 0,
        flags: 1,
      },
      {
        slot: 1,
        generation: 1,
        anchorPos: 6,
        anchorToken: b.tokens[6]!,
        rowStart: 0,
        nRows: 6,
        nOut: 2,
        flags: 1,
      },
      { slot: 2, generation: 1, anchorPos: 0, anchorToken: 17, rowStart: 0, nRows: 0, nOut: 0, flags: 1 },
      {
        slot: 3,
        generation: 1,
        anchorPos: 0,
        anchorToken: 0x7fffffff,
        rowStart: 0,
        nRows: 0,
        nOut: 0,
        flags: 1,
      },
    ];
    const ans = await raw.send(refStep(s, entries, [a.rows.subarray((30 - W) * rb), b.rows], null));
    expect(ans.status).toBe(FrameStatus.OK);
    const v = decodeStepReply(ans.body, { nReq: 4, numSpec: N, margin: true, sampled: false });
    checkReplyValues(v, { stepId: 5, vocabSize: drafter.vocabSize, window: W, numSpec: N, entries });
    expect(Array.from(v.status)).toEqual([ReqStatus.OK, ReqStatus.OK, ReqStatus.OK, ReqStatus.DRAFT_FAILED]);
    const ids = new Int32Array(N);
    const conf = new Float32Array(N);
    const margin = new Float32Array(N);
    head.draft(a.rows.subarray((30 - W) * rb), W, a.tokens[30]!, N, { ids, conf, margin, offset: 0 });
    expect(Array.from(v.draftIds.subarray(0, N))).toEqual(Array.from(ids));
    expect(Array.from(v.confidence.subarray(0, N))).toEqual(Array.from(conf));
    expect(Array.from(v.margin!.subarray(0, N))).toEqual(Array.from(margin));
    head.draft(b.rows, 6, b.tokens[6]!, 2, { ids, conf, margin, offset: 0 });
    expect(Array.from(v.draftIds.subarray(N, N + 2))).toEqual(Array.from(ids.subarray(0, 2)));
    // The head drafts something sensible: the first draft of the long sequence is usually the
    // target's next token; at least one of the first positions must be in the vocabulary and nonzero-confidence.
    expect(v.confidence[0]).toBeGreaterThan(0);
  });

  test("TOP32 session: sampled drafts pass validateSampled and match the head", async () => {
    const s = new Sess(raw, 0x502, drafter, helloFor(drafter, { maxSlots: 8, sampleMode: SampleMode.TOP32 }));
    expect((await s.doHello()).status).toBe(FrameStatus.OK);
    const W = drafter.window;
    const rb = target.rowBytes;
    const a = sequence(20, [3]);
    const entries: ReqEntry[] = [
      {
        slot: 0,
        generation: 1,
        anchorPos: 20,
        anchorToken: a.tokens[20]!,
        rowStart: 20 - W,
        nRows: W,
        nOut: 0,
        flags: 1,
      },
      {
        slot: 1,
        generation: 1,
        anchorPos: 20,
        anchorToken: a.tokens[20]!,
        rowStart: 20 - W,
        nRows: W,
        nOut: 0,
        flags: 1,
      },
    ];
    const sampleMeta = [
      { seed: 77, topK: 32, tempMilli: 800 },
      { seed: 78, topK: 4, tempMilli: 0 },
    ];
    const rows = a.rows.subarray((20 - W) * rb, 20 * rb);
    const ans = await raw.send(refStep(s, entries, [rows, rows], sampleMeta));
    expect(ans.status).toBe(FrameStatus.OK);
    const N = drafter.numSpec;
    const v = decodeStepReply(ans.body, { nReq: 2, numSpec: N, margin: true, sampled: true });
    const ctx = { stepId: 5, vocabSize: drafter.vocabSize, window: W, numSpec: N, entries, sampleMeta };
    checkReplyValues(v, ctx);
    validateSampled(v, ctx);
    expect(Array.from(v.sampledMask!)).toEqual([...new Array(N).fill(1), ...new Array(N).fill(0)]);
    const ids = new Int32Array(N);
    const conf = new Float32Array(N);
    const supportIds = new Int32Array(N * 32);
    const proposalQ = new Uint32Array(N * 32);
    head.draft(
      rows,
      W,
      a.tokens[20]!,
      N,
      { ids, conf, margin: null, offset: 0 },
      {
        seed: 77,
        topK: 32,
        tempMilli: 800,
        supportIds,
        proposalQ,
        offset: 0,
        position: 20,
      },
    );
    expect(Array.from(v.draftIds.subarray(0, N))).toEqual(Array.from(ids));
    expect(Array.from(v.proposalQ!.subarray(0, N * 32))).toEqual(Array.from(proposalQ));
  });
});

describe("bin --drafter reference", () => {
  test("builds the same head as the package defaults (same identities), and loads --weights", async () => {
    const c = await spawnWorker([
      "--drafter",
      "reference",
      "--hidden",
      String(HIDDEN),
      "--listen",
      "tcp://127.0.0.1:0",
    ]);
    expect(c.listening.drafterIdentity).toBe(Buffer.from(head.drafterIdentity).toString("hex"));
    expect(c.listening.markovIdentity).toBe(Buffer.from(head.markovIdentity).toString("hex"));
    const r = await new Raw((c.listening.endpoints as string[])[0]!).connect();
    const s = new Sess(r, 0x601, drafter, helloFor(drafter));
    expect((await s.doHello()).status).toBe(FrameStatus.OK);
    r.close();
    c.proc.kill("SIGTERM");
    expect(await c.exit).toBe(0);

    const dir = mkdtempSync(join(tmpdir(), "tw-worker-weights-"));
    try {
      const file = join(dir, "head.safetensors");
      head.save(file);
      const c2 = await spawnWorker([
        "--drafter",
        "reference",
        "--hidden",
        String(HIDDEN),
        "--weights",
        file,
        "--listen",
        "tcp://127.0.0.1:0",
      ]);
      expect(c2.listening.drafterIdentity).toBe(Buffer.from(head.drafterIdentity).toString("hex"));
      c2.proc.kill("SIGTERM");
      expect(await c2.exit).toBe(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
