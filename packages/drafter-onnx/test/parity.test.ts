/**
 * Parity (issue 14): for the same windows, OnnxDrafter on the exported reference head and
 * ReferenceDrafter give identical draft ids, sampled masks, support ids and dyadic q
 * (CONTRACT 8), and confidences and margins within 1e-5 relative (CONTRACT 6.3), over thousands
 * of random STEPs, greedy and TOP32. TAPWIRE_PARITY_STEPS raises the count (test:soak).
 */
import { createDefaultPair, Xoshiro128 } from "@tapwire/reference-model";
import { ReferenceDrafter } from "@tapwire/worker";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { exportReferenceHead, OnnxDrafter } from "../src/index.js";
import { defaultPair, makeOutput, randomStep, rowPool } from "./helpers.js";

const STEPS = Number(process.env["TAPWIRE_PARITY_STEPS"] ?? 1200);
/** Per-test timeout that grows with STEPS (test:soak), never below vitest's 60 s. */
const TIMEOUT = Math.max(60_000, STEPS * 50);

function close(a: number, b: number): boolean {
  return a === b || Math.abs(a - b) <= 1e-5 * Math.max(Math.abs(a), Math.abs(b));
}

describe("parity with ReferenceDrafter (default head: W 16, N 4, rows 3 x 1024, vocab 2048)", () => {
  let onnxDrafter: OnnxDrafter;
  let ref: ReferenceDrafter;
  beforeAll(async () => {
    const { head } = defaultPair();
    ref = new ReferenceDrafter(head);
    onnxDrafter = await OnnxDrafter.create(exportReferenceHead(head));
  });
  afterAll(async () => {
    await onnxDrafter.release();
  });

  it("has the reference head's identities and geometry", () => {
    expect(Buffer.from(onnxDrafter.drafterIdentity).toString("hex")).toBe(
      Buffer.from(ref.drafterIdentity).toString("hex"),
    );
    expect(Buffer.from(onnxDrafter.markovIdentity).toString("hex")).toBe(
      Buffer.from(ref.markovIdentity).toString("hex"),
    );
    for (const k of ["window", "numSpec", "vocabSize", "numTaps", "hidden", "capabilities"] as const) {
      expect(onnxDrafter[k], k).toBe(ref[k]);
    }
  });

  it("large batches in padded buckets (100 and 203 entries, then 3 again) give identical drafts", async () => {
    const rng = new Xoshiro128(0xb16);
    const rowBytes = ref.numTaps * ref.hidden * 2;
    const pool = rowPool(rng, rowBytes, 48);
    for (const n of [100, 203, 3]) {
      const geo = {
        maxBatch: 1,
        window: ref.window,
        numSpec: ref.numSpec,
        vocab: ref.vocabSize,
        rowBytes,
        sampled: true,
      };
      const batch = Array.from({ length: n }, (_, i) => ({
        ...randomStep(rng, geo, pool)[0]!,
        index: i,
        slot: i,
      }));
      const a = makeOutput(n, ref.numSpec, true);
      const b = makeOutput(n, ref.numSpec, true);
      ref.draft(batch, a);
      await onnxDrafter.draft(batch, b);
      expect(Array.from(b.draftIds), `${n} entries`).toEqual(Array.from(a.draftIds));
      expect(Array.from(b.proposalQ!), `${n} entries`).toEqual(Array.from(a.proposalQ!));
    }
  });

  for (const sampled of [false, true]) {
    it(
      `${sampled ? "TOP32" : "greedy"}: ${STEPS} random STEPs give identical drafts`,
      async () => {
        const rng = new Xoshiro128(sampled ? 0x70b32 : 0x9eed);
        const geo = {
          maxBatch: 12,
          window: ref.window,
          numSpec: ref.numSpec,
          vocab: ref.vocabSize,
          rowBytes: ref.numTaps * ref.hidden * 2,
          sampled,
        };
        const pool = rowPool(rng, geo.rowBytes, 96);
        let positions = 0;
        let sampledPositions = 0;
        let maxConfErr = 0;
        for (let s = 0; s < STEPS; s++) {
          const batch = randomStep(rng, geo, pool);
          const a = makeOutput(batch.length, ref.numSpec, sampled);
          const b = makeOutput(batch.length, ref.numSpec, sampled);
          ref.draft(batch, a);
          await onnxDrafter.draft(batch, b);
          const where = (i: number) =>
            `step ${s} entry ${Math.floor(i / ref.numSpec)} position ${i % ref.numSpec}`;
          expect(Array.from(b.failed!)).toEqual(Array.from(a.failed!));
          for (let i = 0; i < a.draftIds.length; i++) {
            if (a.draftIds[i] !== b.draftIds[i])
              expect.fail(`${where(i)}: id ${b.draftIds[i]} != ${a.draftIds[i]}`);
            if (!close(a.confidence[i]!, b.confidence[i]!)) {
              expect.fail(`${where(i)}: confidence ${b.confidence[i]} vs ${a.confidence[i]}`);
            }
            if (!close(a.margin![i]!, b.margin![i]!))
              expect.fail(`${where(i)}: margin ${b.margin![i]} vs ${a.margin![i]}`);
            if (a.confidence[i]! > 0) {
              positions++;
              maxConfErr = Math.max(
                maxConfErr,
                Math.abs(a.confidence[i]! - b.confidence[i]!) / a.confidence[i]!,
              );
            }
          }
          if (sampled) {
            for (let i = 0; i < a.sampledMask!.length; i++) {
              if (a.sampledMask![i] !== b.sampledMask![i]) expect.fail(`${where(i)}: sampled mask differs`);
              if (a.sampledMask![i] === 1) sampledPositions++;
            }
            for (let i = 0; i < a.proposalQ!.length; i++) {
              if (a.supportIds![i] !== b.supportIds![i] || a.proposalQ![i] !== b.proposalQ![i]) {
                expect.fail(
                  `${where(Math.floor(i / 32))} support ${i % 32}: (${b.supportIds![i]}, q ${b.proposalQ![i]}) != (${a.supportIds![i]}, q ${a.proposalQ![i]})`,
                );
              }
            }
          }
        }
        console.log(
          `parity ${sampled ? "TOP32" : "greedy"}: ${STEPS} STEPs, ${positions} positions (${sampledPositions} sampled), max confidence rel err ${maxConfErr.toExponential(2)}`,
        );
        expect(positions).toBeGreaterThan(STEPS * 4);
        if (sampled) expect(sampledPositions).toBeGreaterThan(STEPS * 2);
      },
      TIMEOUT,
    );
  }
});

describe("parity on another geometry (W 8, N 8, rows 2 x 64 read whole, vocab 512, ranks 20 and 4)", () => {
  const STEPS2 = Math.max(300, Math.round(STEPS / 4));
  const { head } = createDefaultPair({
    target: { vocabSize: 512, hidden: 64, numTaps: 2, seed: 3 },
    draft: { window: 8, numSpec: 8, readDims: 0, rank: 20, markovRank: 4, seed: 5 },
  });
  const ref = new ReferenceDrafter(head);
  let onnxDrafter: OnnxDrafter;
  beforeAll(async () => {
    onnxDrafter = await OnnxDrafter.create(exportReferenceHead(head), { graphOptimization: "basic" });
  });
  afterAll(() => onnxDrafter.release());

  it(
    `${STEPS2} greedy and ${STEPS2} TOP32 STEPs give identical drafts`,
    async () => {
      expect(onnxDrafter.numSpec).toBe(8);
      for (const sampled of [false, true]) {
        const rng = new Xoshiro128(sampled ? 77 : 78);
        const geo = { maxBatch: 10, window: 8, numSpec: 8, vocab: 512, rowBytes: 2 * 64 * 2, sampled };
        const pool = rowPool(rng, geo.rowBytes, 40);
        for (let s = 0; s < STEPS2; s++) {
          const batch = randomStep(rng, geo, pool);
          const a = makeOutput(batch.length, 8, sampled);
          const b = makeOutput(batch.length, 8, sampled);
          ref.draft(batch, a);
          await onnxDrafter.draft(batch, b);
          expect(Array.from(b.draftIds), `step ${s}`).toEqual(Array.from(a.draftIds));
          if (sampled) {
            expect(Array.from(b.proposalQ!), `step ${s}`).toEqual(Array.from(a.proposalQ!));
            expect(Array.from(b.supportIds!), `step ${s}`).toEqual(Array.from(a.supportIds!));
          }
          for (let i = 0; i < a.confidence.length; i++) {
            expect(close(a.confidence[i]!, b.confidence[i]!), `step ${s} conf ${i}`).toBe(true);
            expect(close(a.margin![i]!, b.margin![i]!), `step ${s} margin ${i}`).toBe(true);
          }
        }
      }
    },
    TIMEOUT,
  );
});
