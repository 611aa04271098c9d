import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import {
  DEFAULT_DRAFT_CONFIG,
  DraftHead,
  DYADIC_ONE,
  ReferenceModelError,
  readSafetensors,
  TargetModel,
  TOP_K_MAX,
  writeSafetensors,
} from "../src/index.js";

// A small geometry keeps distillation quick; the default geometry is covered in model.test.ts.
const target = TargetModel.create({ vocabSize: 512, stateDim: 24, numTaps: 2, hidden: 64, seed: 3 });
const cfg = { ...DEFAULT_DRAFT_CONFIG, rank: 16, markovRank: 6, readDims: 0, calibrationRounds: 64 };
const head = DraftHead.distill(target, cfg);
const dir = mkdtempSync(join(tmpdir(), "rm-head-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function hex(b: Uint8Array): string {
  return Buffer.from(b).toString("hex");
}

function windowRows(n: number): { rows: Uint8Array; anchor: number } {
  const logits = new Float32Array(target.config.vocabSize);
  const rows = new Uint8Array(n * target.rowBytes);
  const st = target.initialState();
  for (let i = 0; i < n; i++)
    target.forward(st, (i * 37) % 512, logits, rows.subarray(i * target.rowBytes), st);
  return { rows, anchor: target.argmax(logits) };
}

describe("identities (CONTRACT 6.1)", () => {
  test("are 32-byte digests, deterministic in (target, config), distinct for backbone and Markov", () => {
    expect(head.drafterIdentity.length).toBe(32);
    expect(head.markovIdentity.length).toBe(32);
    expect(hex(head.drafterIdentity)).not.toBe(hex(head.markovIdentity));
    const again = DraftHead.distill(target, cfg);
    expect(hex(again.drafterIdentity)).toBe(hex(head.drafterIdentity));
    expect(hex(again.markovIdentity)).toBe(hex(head.markovIdentity));
  });

  test("other noise seed changes both identities; other markov rank changes the Markov identity", () => {
    const other = DraftHead.distill(target, { ...cfg, seed: 8 });
    expect(hex(other.drafterIdentity)).not.toBe(hex(head.drafterIdentity));
    expect(hex(other.markovIdentity)).not.toBe(hex(head.markovIdentity));
    const m = DraftHead.distill(target, { ...cfg, markovRank: 5, calibrationRounds: 0 });
    expect(hex(m.markovIdentity)).not.toBe(hex(head.markovIdentity));
  });

  test("a single changed weight byte changes exactly the identity that covers it", () => {
    const bytes = head.toSafetensors();
    const tensors = readSafetensors(bytes);
    const md = new Map<string, string>();
    readSafetensors(bytes, { metadata: md });
    const flip = (name: string): DraftHead => {
      const copy = new Map([...tensors].map(([k, t]) => [k, { ...t, data: Uint8Array.from(t.data) }]));
      const t = copy.get(name)!;
      t.data[1] = t.data[1]! ^ 1;
      return DraftHead.fromSafetensors(writeSafetensors(copy, md));
    };
    const a = flip("backbone.lm_u");
    expect(hex(a.drafterIdentity)).not.toBe(hex(head.drafterIdentity));
    expect(hex(a.markovIdentity)).toBe(hex(head.markovIdentity));
    const b = flip("markov.in");
    expect(hex(b.drafterIdentity)).toBe(hex(head.drafterIdentity));
    expect(hex(b.markovIdentity)).not.toBe(hex(head.markovIdentity));
  });
});

test("the Markov head corrects positions >= 1 from the previous draft and leaves position 0 alone", () => {
  const bytes = head.toSafetensors();
  const md = new Map<string, string>();
  const tensors = readSafetensors(bytes, { metadata: md });
  const copy = new Map([...tensors].map(([k, t]) => [k, { ...t, data: Uint8Array.from(t.data) }]));
  copy.get("markov.out")!.data.fill(0); // no Markov correction at all
  const plain = DraftHead.fromSafetensors(writeSafetensors(copy, md));
  const v = target.config.vocabSize;
  let changedLater = 0;
  for (const n of [4, 9, 16]) {
    const { rows, anchor } = windowRows(n);
    const out = () => ({
      ids: new Int32Array(4),
      conf: new Float32Array(4),
      margin: new Float32Array(4),
      offset: 0,
    });
    const a = out();
    const b = out();
    head.draft(rows, n, anchor, 4, a);
    const la = Float32Array.from(head.lastLogits.subarray(0, 4 * v));
    plain.draft(rows, n, anchor, 4, b);
    const lb = plain.lastLogits.subarray(0, 4 * v);
    expect(lb.subarray(0, v)).toEqual(la.subarray(0, v)); // position 0: backbone only
    expect(b.ids[0]).toBe(a.ids[0]);
    for (let j = 1; j < 4; j++) {
      let diff = 0;
      for (let t = 0; t < v; t++) diff = Math.max(diff, Math.abs(la[j * v + t]! - lb[j * v + t]!));
      if (diff > 1e-3) changedLater++;
    }
  }
  expect(changedLater).toBe(9);
});

test("the default head config works on a small row (readDims is capped at the row size)", () => {
  const small = TargetModel.create({ vocabSize: 300, stateDim: 48, numTaps: 1, hidden: 100, seed: 9 });
  const h = DraftHead.distill(small, { ...DEFAULT_DRAFT_CONFIG, calibrationRounds: 16 });
  expect(h.config.readDims).toBe(100);
  expect(h.weights.get("backbone.read_index")!.shape).toEqual([100]);
  const back = DraftHead.fromSafetensors(h.toSafetensors(), small);
  expect(hex(back.drafterIdentity)).toBe(hex(h.drafterIdentity));
});

describe("save / load", () => {
  test("round trip preserves identities, config and drafts", () => {
    const path = join(dir, "head.safetensors");
    head.save(path);
    const loaded = DraftHead.load(path, target);
    expect(hex(loaded.drafterIdentity)).toBe(hex(head.drafterIdentity));
    expect(hex(loaded.markovIdentity)).toBe(hex(head.markovIdentity));
    expect(loaded.config).toEqual(head.config);
    const { rows, anchor } = windowRows(8);
    const a = { ids: new Int32Array(6), conf: new Float32Array(6), margin: new Float32Array(6), offset: 0 };
    const b = { ids: new Int32Array(6), conf: new Float32Array(6), margin: new Float32Array(6), offset: 0 };
    head.draft(rows, 8, anchor, 6, a);
    loaded.draft(rows, 8, anchor, 6, b);
    expect(b).toEqual(a);
  });

  test("refuses a file for another geometry, a foreign file, and missing tensors", () => {
    const other = TargetModel.create({ vocabSize: 256, stateDim: 24, numTaps: 2, hidden: 64, seed: 3 });
    const bytes = head.toSafetensors();
    expect(() => DraftHead.fromSafetensors(bytes, other)).toThrow(
      /vocabSize 512 does not match the target's 256/,
    );
    const foreign = writeSafetensors(new Map(), { format: "pt" });
    expect(() => DraftHead.fromSafetensors(foreign)).toThrow(ReferenceModelError);
    const md = new Map<string, string>();
    const tensors = readSafetensors(bytes, { metadata: md });
    tensors.delete("markov.out");
    try {
      DraftHead.fromSafetensors(writeSafetensors(tensors, md));
      expect.unreachable();
    } catch (e) {
      expect((e as ReferenceModelError).code).toBe("RM_BAD_WEIGHTS");
      expect((e as Error).message).toMatch(/markov.out/);
    }
    expect(() => DraftHead.fromSafetensors(bytes.subarray(0, 100))).toThrow(/safetensors/);
  });
});

describe("sampled drafting (CONTRACT 8, TOP32)", () => {
  const k = 4;
  function sampled(seed: number, topK: number, tempMilli: number, position = 0) {
    const { rows, anchor } = windowRows(6);
    const out = { ids: new Int32Array(k), conf: new Float32Array(k), margin: new Float32Array(k), offset: 0 };
    const supportIds = new Int32Array(k * TOP_K_MAX);
    const proposalQ = new Uint32Array(k * TOP_K_MAX);
    const sampledMask = new Uint8Array(k);
    head.draft(rows, 6, anchor, k, out, {
      seed,
      topK,
      tempMilli,
      supportIds,
      proposalQ,
      offset: 0,
      position,
      sampledMask,
    });
    return { out, supportIds, proposalQ, sampledMask };
  }

  test("each position: distinct support ids, q >= 1 summing to 2^24, draft id in the support, rest zero", () => {
    for (const topK of [1, 5, 32]) {
      const { out, supportIds, proposalQ, sampledMask } = sampled(123, topK, 1000);
      for (let j = 0; j < k; j++) {
        const ids = Array.from(supportIds.subarray(j * 32, j * 32 + topK));
        const q = Array.from(proposalQ.subarray(j * 32, j * 32 + topK));
        expect(new Set(ids).size).toBe(topK);
        expect(ids.every((x) => x >= 0 && x < 512)).toBe(true);
        expect(q.every((x) => x >= 1)).toBe(true);
        expect(q.reduce((a, b) => a + b, 0)).toBe(DYADIC_ONE);
        expect(ids).toContain(out.ids[j]);
        expect(Array.from(supportIds.subarray(j * 32 + topK, (j + 1) * 32)).every((x) => x === 0)).toBe(true);
        expect(Array.from(proposalQ.subarray(j * 32 + topK, (j + 1) * 32)).every((x) => x === 0)).toBe(true);
        expect(sampledMask[j]).toBe(1);
        expect(out.conf[j]).toBeGreaterThanOrEqual(0);
        expect(out.conf[j]).toBeLessThanOrEqual(1);
      }
    }
  });

  test("draws are deterministic in (seed, position) and vary with them", () => {
    const a = sampled(1, 32, 1500);
    expect(sampled(1, 32, 1500).out.ids).toEqual(a.out.ids);
    const seen = new Set<string>();
    for (let s = 0; s < 12; s++) seen.add(Array.from(sampled(s, 32, 1500).out.ids).join(","));
    for (let p = 0; p < 12; p++) seen.add(Array.from(sampled(1, 32, 1500, p).out.ids).join(","));
    expect(seen.size).toBeGreaterThan(6);
  });

  test("top_k 1 is greedy; tempMilli 0 leaves support, q and mask untouched", () => {
    const { rows, anchor } = windowRows(6);
    const g = { ids: new Int32Array(k), conf: new Float32Array(k), margin: new Float32Array(k), offset: 0 };
    head.draft(rows, 6, anchor, k, g);
    expect(sampled(9, 1, 700).out.ids).toEqual(g.ids);
    const z = sampled(9, 8, 0);
    expect(z.out.ids).toEqual(g.ids);
    expect(z.supportIds.every((x) => x === 0)).toBe(true);
    expect(z.proposalQ.every((x) => x === 0)).toBe(true);
    expect(z.sampledMask.every((x) => x === 0)).toBe(true);
  });

  test("refuses top_k outside 1..32 and short support/q arrays", () => {
    expect(() => sampled(1, 33, 1000)).toThrow(/top_k 33/);
    expect(() => sampled(1, 0, 1000)).toThrow(/top_k 0/);
    const out = { ids: new Int32Array(k), conf: new Float32Array(k), margin: null, offset: 0 };
    expect(() =>
      head.draft(new Uint8Array(0), 0, 1, k, out, {
        seed: 1,
        topK: 4,
        tempMilli: 1000,
        supportIds: new Int32Array(8),
        proposalQ: new Uint32Array(k * 32),
        offset: 0,
      }),
    ).toThrow(/supportIds/);
  });
});
