// The slot buffers start on a page once the shm transport has loaded koffi (copyTargetBytes in
// @tapwire/transport): the rows the shm server copies from the mapping into a window then never
// land 16 bytes ahead of their source mod 4096 (3-4x slower copies on AMD Zen, src/aligned.ts there).
import { createRequire } from "node:module";
import { bindLibc } from "@tapwire/transport";
import { describe, expect, test } from "vitest";
import { WindowStore } from "../src/window-store.js";

// koffi as @tapwire/transport resolves it (its optional peer; the worker never loads it itself).
const koffi = createRequire(createRequire(import.meta.url).resolve("@tapwire/transport"))("koffi") as {
  load(path: string): { func(decl: string): (...args: unknown[]) => unknown };
  address(p: unknown): bigint;
};
const memset = koffi.load("libc.so.6").func("void *memset(void *d, int c, size_t n)");
const addressOf = (v: Uint8Array): bigint => koffi.address(memset(v, 0, 0));

describe("WindowStore slot buffers with koffi loaded (docs/worker.md)", () => {
  test("rows placed after a window start on a page when the row size is a multiple of one", () => {
    bindLibc(koffi);
    const rowBytes = 3 * 4096 * 2; // 24 KiB: 3 taps x 4096 hidden x bf16
    const s = new WindowStore(4, 16, rowBytes);
    for (let slot = 0; slot < 4; slot++) {
      for (let round = 0; round < 3; round++) {
        const p = s.placeAfterWindow(slot, 1);
        expect(addressOf(p.view) % 4096n, `slot ${slot}, round ${round}`).toBe(0n);
        p.view.fill(slot + round);
        s.commitPlaced(slot, round, 1, p.row, false);
      }
      expect(s.debugWindow(slot).nRows).toBe(3);
    }
  });
});
