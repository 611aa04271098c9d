// CONTRACT 12.1 "Batching" with @tapwire/drafter-onnx's OnnxDrafter (the reference head exported
// to ONNX, on ONNX Runtime): random interleavings of several sessions give every STEP the reply it
// gets drafted alone (except worker_us). drafter-onnx depends on this package, so it is loaded
// from its build (`pnpm build` builds it before the tests, as CI does).
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { createDefaultPair } from "@tapwire/reference-model";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import type { Drafter } from "../src/index.js";
import { interleavingProperty } from "./interleave.js";

const ONNX_DIST = join(
  fileURLToPath(new URL(".", import.meta.url)),
  "..",
  "..",
  "drafter-onnx",
  "dist",
  "index.js",
);

interface OnnxModule {
  exportReferenceHead(head: unknown): Uint8Array;
  OnnxDrafter: {
    create(model: Uint8Array, o?: Record<string, unknown>): Promise<Drafter & { release(): Promise<void> }>;
  };
}

let d: Drafter & { release(): Promise<void> };
beforeAll(async () => {
  const m = (await import(ONNX_DIST)) as OnnxModule;
  const { head } = createDefaultPair();
  d = await m.OnnxDrafter.create(m.exportReferenceHead(head), { intraOpThreads: 1 });
}, 60_000);
afterAll(async () => {
  await d?.release();
});

describe("CONTRACT 12.1: cross-session batching with the ONNX drafter", () => {
  test("random interleavings of 3 sessions (greedy and TOP32, margin or not) equal drafting each STEP alone", async () => {
    const p = interleavingProperty(d, 3, 4);
    await fc.assert(p.prop, { numRuns: 12, seed: 1203 });
    expect(p.merged()).toBeGreaterThan(0);
  }, 180_000);
});
