import fc from "fast-check";
import { describe, expect, test } from "vitest";
import { GenerationCheck, WindowStore } from "../src/window-store.js";

const RB = 4; // row bytes for unit tests

/** Rows whose bytes encode their position, so a window can be checked row by row. */
function rowsFor(start: number, n: number): Uint8Array {
  const out = new Uint8Array(n * RB);
  for (let i = 0; i < n; i++) {
    const p = start + i;
    out[i * RB] = p & 0xff;
    out[i * RB + 1] = (p >> 8) & 0xff;
    out[i * RB + 2] = (p >> 16) & 0xff;
    out[i * RB + 3] = 0xa5;
  }
  return out;
}

function positionsOf(rows: Uint8Array): number[] {
  const out: number[] = [];
  for (let i = 0; i < rows.length; i += RB) out.push(rows[i]! | (rows[i + 1]! << 8) | (rows[i + 2]! << 16));
  return out;
}

function range(a: number, b: number): number[] {
  return Array.from({ length: Math.max(0, b - a) }, (_, i) => a + i);
}

describe("WindowStore (CONTRACT 7.1, 7.2)", () => {
  test("first entry of a slot takes its generation; newer resets; equal keeps; older is stale", () => {
    const s = new WindowStore(4, 8, RB);
    expect(s.checkGeneration(0, 5)).toBe(GenerationCheck.RESET);
    s.applyRows(0, 0, 3, rowsFor(0, 3), 0, false);
    expect(s.checkGeneration(0, 5)).toBe(GenerationCheck.SAME);
    expect(s.debugWindow(0).nRows).toBe(3);
    expect(s.checkGeneration(0, 4)).toBe(GenerationCheck.STALE);
    expect(s.debugWindow(0).nRows).toBe(3);
    expect(s.checkGeneration(0, 6)).toBe(GenerationCheck.RESET);
    expect(s.debugWindow(0)).toMatchObject({ generation: 6, nRows: 0 });
  });

  test("serial arithmetic across the 2^32 wrap (CONTRACT 2)", () => {
    const s = new WindowStore(1, 8, RB);
    s.checkGeneration(0, 0xffffffff);
    expect(s.isStale(0, 0)).toBe(false); // 0 is newer than 2^32-1
    expect(s.checkGeneration(0, 0)).toBe(GenerationCheck.RESET);
    expect(s.isStale(0, 0xffffffff)).toBe(true);
    expect(s.checkGeneration(0, 0xffffffff)).toBe(GenerationCheck.STALE);
    expect(s.checkGeneration(0, 0x7fffffff)).toBe(GenerationCheck.RESET); // 2^31-1 ahead: newer
    expect(s.checkGeneration(0, 0xffffffff)).toBe(GenerationCheck.STALE); // exactly 2^31 ahead: not newer
  });

  test("append keeps the last W rows contiguous, oldest first", () => {
    const W = 5;
    const s = new WindowStore(1, W, RB);
    s.checkGeneration(0, 1);
    let pos = 0;
    for (let round = 0; round < 40; round++) {
      const n = (round % 3) + 1;
      s.applyRows(0, pos, n, rowsFor(pos, n), 0, false);
      pos += n;
      const w = s.debugWindow(0);
      expect(positionsOf(w.rows)).toEqual(range(Math.max(0, pos - W), pos));
      expect(w.firstPos).toBe(Math.max(0, pos - W));
      expect(s.heldAt(0, pos)).toBe(Math.min(W, pos));
      expect(positionsOf(s.rowsView(0, s.heldAt(0, pos)))).toEqual(range(Math.max(0, pos - W), pos));
    }
    expect(s.bytesAllocated).toBeLessThanOrEqual(s.maxBufferRows * RB);
  });

  test("gap and overlap replace the window with the last W carried rows", () => {
    const s = new WindowStore(1, 4, RB);
    s.checkGeneration(0, 1);
    s.applyRows(0, 0, 3, rowsFor(0, 3), 0, false);
    s.applyRows(0, 5, 2, rowsFor(5, 2), 0, false); // gap
    expect(positionsOf(s.debugWindow(0).rows)).toEqual([5, 6]);
    s.applyRows(0, 4, 6, rowsFor(4, 6), 0, false); // overlap, more than W
    expect(positionsOf(s.debugWindow(0).rows)).toEqual([6, 7, 8, 9]);
    expect(s.heldAt(0, 10)).toBe(4);
    expect(s.heldAt(0, 11)).toBe(0);
  });

  test("rows at a non-zero position into an empty window replace it (a gap)", () => {
    const s = new WindowStore(1, 4, RB);
    s.checkGeneration(0, 1);
    s.applyRows(0, 7, 2, rowsFor(7, 2), 0, false);
    expect(s.debugWindow(0)).toMatchObject({ firstPos: 7, nRows: 2 });
  });

  test("RESYNC replaces even rows that would connect; RESYNC with no rows empties", () => {
    const s = new WindowStore(1, 4, RB);
    s.checkGeneration(0, 1);
    s.applyRows(0, 0, 3, rowsFor(0, 3), 0, false);
    s.applyRows(0, 3, 1, rowsFor(3, 1), 0, true);
    expect(positionsOf(s.debugWindow(0).rows)).toEqual([3]);
    s.applyRows(0, 4, 0, new Uint8Array(0), 0, true);
    expect(s.debugWindow(0).nRows).toBe(0);
    expect(s.windowsHeld).toBe(0);
  });

  test("release drops the window and its memory, keeps the generation", () => {
    const s = new WindowStore(8, 4, RB);
    for (let slot = 0; slot < 8; slot++) {
      s.checkGeneration(slot, 3);
      s.applyRows(slot, 0, 4, rowsFor(0, 4), 0, false);
    }
    expect(s.windowsHeld).toBe(8);
    const before = s.bytesAllocated;
    for (let slot = 0; slot < 8; slot++) s.release(slot);
    expect(s.windowsHeld).toBe(0);
    expect(s.bytesAllocated).toBeLessThan(before);
    expect(s.debugWindow(3)).toMatchObject({ known: true, generation: 3, nRows: 0 });
    s.resetAll();
    expect(s.bytesAllocated).toBe(0);
    expect(s.debugWindow(3)).toMatchObject({ known: false, nRows: 0 });
  });

  test("bufferWindows bounds the slot buffer and is validated", () => {
    const s = new WindowStore(1, 4, RB, 4);
    s.checkGeneration(0, 1);
    for (let p = 0; p < 100; p++) s.applyRows(0, p, 1, rowsFor(p, 1), 0, false);
    expect(s.bytesAllocated).toBe(16 * RB);
    expect(positionsOf(s.debugWindow(0).rows)).toEqual([96, 97, 98, 99]);
    expect(() => new WindowStore(1, 4, RB, 1)).toThrow("bufferWindows");
  });

  test("dropFrom forgets slots at and above the bound", () => {
    const s = new WindowStore(4, 4, RB);
    for (let slot = 0; slot < 4; slot++) {
      s.checkGeneration(slot, 1);
      s.applyRows(slot, 0, 1, rowsFor(0, 1), 0, false);
    }
    s.dropFrom(2);
    expect(s.windowsHeld).toBe(2);
    expect(s.debugWindow(2).known).toBe(false);
    expect(s.debugWindow(1).nRows).toBe(1);
  });

  test("steady appends stop allocating once the buffer reached 2W rows", () => {
    const W = 16;
    const s = new WindowStore(1, W, RB);
    s.checkGeneration(0, 1);
    let pos = 0;
    for (let i = 0; i < 100; i++) {
      s.applyRows(0, pos, 3, rowsFor(pos, 3), 0, false);
      pos += 3;
    }
    const allocated = s.bytesAllocated;
    for (let i = 0; i < 1000; i++) {
      s.applyRows(0, pos, 3, rowsFor(pos, 3), 0, false);
      pos += 3;
    }
    expect(s.bytesAllocated).toBe(allocated);
    expect(allocated).toBe(4 * W * RB);
  });

  test("property: the store equals a list model under random operations", () => {
    const op = fc.oneof(
      fc.record({
        kind: fc.constant("rows" as const),
        start: fc.nat(40),
        n: fc.nat(12),
        resync: fc.boolean(),
      }),
      fc.record({ kind: fc.constant("append" as const), n: fc.integer({ min: 1, max: 12 }) }),
      fc.record({ kind: fc.constant("release" as const) }),
      fc.record({ kind: fc.constant("gen" as const), d: fc.integer({ min: -2, max: 2 }) }),
    );
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 9 }),
        fc.integer({ min: 2, max: 5 }),
        fc.array(op, { maxLength: 60 }),
        (W, bw, ops) => {
          const s = new WindowStore(1, W, RB, bw);
          let gen = 100;
          s.checkGeneration(0, gen);
          let model: number[] = [];
          for (const o of ops) {
            if (o.kind === "release") {
              s.release(0);
              model = [];
            } else if (o.kind === "gen") {
              const g = gen + o.d;
              const r = s.checkGeneration(0, g);
              if (o.d > 0) {
                expect(r).toBe(GenerationCheck.RESET);
                gen = g;
                model = [];
              } else {
                expect(r).toBe(o.d === 0 ? GenerationCheck.SAME : GenerationCheck.STALE);
              }
            } else {
              const start =
                o.kind === "append" ? (model.length > 0 ? model[model.length - 1]! + 1 : 0) : o.start;
              const resync = o.kind === "rows" && o.resync;
              s.applyRows(0, start, o.n, rowsFor(start, o.n), 0, resync);
              const connects = model.length === 0 ? start === 0 : model[model.length - 1]! + 1 === start;
              const carried = range(start, start + o.n);
              model = resync || !connects ? carried : [...model, ...carried];
              model = model.slice(Math.max(0, model.length - W));
            }
            const w = s.debugWindow(0);
            expect(positionsOf(w.rows)).toEqual(model);
            if (model.length > 0) expect(w.firstPos).toBe(model[0]);
            expect(s.windowsHeld).toBe(model.length > 0 ? 1 : 0);
          }
        },
      ),
      { numRuns: 300 },
    );
  });
});
