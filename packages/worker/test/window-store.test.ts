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

  test("slots advancing in lockstep compact on different appends (staggered buffer ends), windows intact", () => {
    const W = 8;
    const slots = 32;
    const s = new WindowStore(slots, W, RB); // 4W-row buffers: stagger over W rows
    const t = new WindowStore(slots, W, RB, 2); // 2W-row buffers: no room to stagger
    for (let slot = 0; slot < slots; slot++) {
      s.checkGeneration(slot, 1);
      t.checkGeneration(slot, 1);
    }
    let maxPerRound = 0;
    let maxPerRoundUnstaggered = 0;
    for (let pos = 0; pos < 12 * W; pos++) {
      const before = s.compactions;
      const beforeT = t.compactions;
      for (let slot = 0; slot < slots; slot++) {
        s.applyRows(slot, pos, 1, rowsFor(pos, 1), 0, false);
        t.applyRows(slot, pos, 1, rowsFor(pos, 1), 0, false);
      }
      maxPerRound = Math.max(maxPerRound, s.compactions - before);
      maxPerRoundUnstaggered = Math.max(maxPerRoundUnstaggered, t.compactions - beforeT);
      for (const slot of [0, 5, slots - 1]) {
        expect(positionsOf(s.debugWindow(slot).rows)).toEqual(range(Math.max(0, pos + 1 - W), pos + 1));
      }
    }
    // W distinct ends: at most ceil(slots / W) slots compact on one append round
    expect(s.compactions).toBeGreaterThan(slots);
    expect(maxPerRound).toBeLessThanOrEqual(Math.ceil(slots / W));
    expect(maxPerRoundUnstaggered).toBe(slots);
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

describe("WindowStore receive placement (docs/worker.md: rows received in place)", () => {
  test("property: placing then committing equals copying with applyRows (appends, gaps, RESYNC, resets, growth, compaction)", () => {
    const W = 6;
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            kind: fc.constantFrom("append", "append", "append", "gap", "resync", "reset", "release"),
            n: fc.integer({ min: 1, max: W }),
            gap: fc.integer({ min: 1, max: 9 }),
            slot: fc.nat(2),
          }),
          { minLength: 1, maxLength: 60 },
        ),
        fc.integer({ min: 2, max: 4 }),
        (ops, bw) => {
          const copied = new WindowStore(3, W, RB, bw);
          const placed = new WindowStore(3, W, RB, bw);
          const gen = [1, 1, 1];
          for (const s of [copied, placed]) for (let k = 0; k < 3; k++) s.checkGeneration(k, 1);
          for (const o of ops) {
            const k = o.slot;
            if (o.kind === "release") {
              copied.release(k);
              placed.release(k);
              continue;
            }
            const before = placed.debugWindow(k);
            const end = before.nRows > 0 ? before.firstPos + before.nRows : 0;
            const start = o.kind === "append" ? end : o.kind === "gap" ? end + o.gap : o.gap;
            const rows = rowsFor(start, o.n);
            const resync = o.kind === "resync";
            // Placement keeps the logical window (even when it compacts or grows the buffer).
            const p = placed.placeAfterWindow(k, o.n);
            expect(placed.debugWindow(k)).toEqual(before);
            p.view.set(rows);
            expect(placed.placementValid(k, p.version)).toBe(true);
            if (o.kind === "reset") {
              gen[k]!++;
              expect(copied.checkGeneration(k, gen[k]!)).toBe(GenerationCheck.RESET);
              expect(placed.checkGeneration(k, gen[k]!)).toBe(GenerationCheck.RESET);
            }
            copied.applyRows(k, start, o.n, rows, 0, resync);
            placed.commitPlaced(k, start, o.n, p.row, resync);
            expect(placed.debugWindow(k)).toEqual(copied.debugWindow(k));
            expect(placed.windowsHeld).toBe(copied.windowsHeld);
          }
        },
      ),
      { numRuns: 300 },
    );
  });

  test("guard: another write to the slot invalidates an outstanding placement, and its late bytes never reach the window", () => {
    const s = new WindowStore(2, 4, RB, 2);
    s.checkGeneration(0, 1);
    s.applyRows(0, 0, 2, rowsFor(0, 2), 0, false);
    const p = s.placeAfterWindow(0, 2); // frame A (say, of a connection taken over meanwhile)
    // Frame B appends to the same slot before A is complete.
    s.applyRows(0, 2, 2, rowsFor(2, 2), 0, false);
    expect(s.placementValid(0, p.version)).toBe(false);
    // A's late bytes land in the abandoned buffer: B's window is intact.
    p.view.fill(0xee);
    expect(positionsOf(s.debugWindow(0).rows)).toEqual([0, 1, 2, 3]);
    expect(s.debugWindow(0).rows.includes(0xee)).toBe(false);
    // A's apply finds the placement invalid and drops the window (the worker answers NEED_RESYNC).
    s.dropWindow(0);
    expect(s.debugWindow(0).nRows).toBe(0);
  });

  test("guard: a second placement on the slot invalidates the first and writes elsewhere", () => {
    const s = new WindowStore(2, 4, RB, 2);
    s.checkGeneration(0, 1);
    s.applyRows(0, 0, 3, rowsFor(0, 3), 0, false);
    const a = s.placeAfterWindow(0, 1);
    const b = s.placeAfterWindow(0, 1);
    expect(s.placementValid(0, a.version)).toBe(false);
    expect(s.placementValid(0, b.version)).toBe(true);
    expect(a.view.buffer).not.toBe(b.view.buffer);
    b.view.set(rowsFor(3, 1));
    a.view.fill(0xee);
    s.commitPlaced(0, 3, 1, b.row, false);
    expect(positionsOf(s.debugWindow(0).rows)).toEqual([0, 1, 2, 3]);
  });

  test("guard: RELEASE and resetAll never pool a buffer a placement still writes into; a cancelled placement costs nothing later", () => {
    const s = new WindowStore(3, 4, RB, 2);
    s.checkGeneration(0, 1);
    s.checkGeneration(1, 1);
    s.applyRows(0, 0, 4, rowsFor(0, 4), 0, false);
    const p = s.placeAfterWindow(0, 2);
    s.release(0);
    expect(s.placementValid(0, p.version)).toBe(false);
    // Slot 1 gets a buffer: never the one slot 0's placement may still write into.
    s.applyRows(1, 0, 4, rowsFor(0, 4), 0, false);
    p.view.fill(0xee);
    expect(positionsOf(s.debugWindow(1).rows)).toEqual([0, 1, 2, 3]);
    const q = s.placeAfterWindow(1, 1);
    s.resetAll();
    expect(s.placementValid(1, q.version)).toBe(false);
    // Cancelled: the next write to the slot keeps its buffer (no detach).
    s.checkGeneration(2, 1);
    s.applyRows(2, 0, 2, rowsFor(0, 2), 0, false);
    const r = s.placeAfterWindow(2, 1);
    s.cancelPlacement(2, r.version);
    const bytes = s.bytesAllocated;
    s.applyRows(2, 2, 1, rowsFor(2, 1), 0, false);
    expect(s.bytesAllocated).toBe(bytes);
    expect(positionsOf(s.debugWindow(2).rows)).toEqual([0, 1, 2]);
  });

  test("placement of more than W rows is refused (the worker copies such STEPs)", () => {
    const s = new WindowStore(1, 4, RB);
    expect(() => s.placeAfterWindow(0, 5)).toThrow(/outside 1..4/);
    expect(() => s.placeAfterWindow(0, 0)).toThrow(/outside/);
  });
});

describe("WindowStore compaction between STEPs (docs/worker.md: Compaction between STEPs)", () => {
  test("property: prepareAppends between operations changes no window, copied or placed, cancelled or not", () => {
    const W = 6;
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            kind: fc.constantFrom(
              "append",
              "append",
              "append",
              "append",
              "gap",
              "resync",
              "reset",
              "release",
            ),
            n: fc.integer({ min: 1, max: W }),
            gap: fc.integer({ min: 1, max: 9 }),
            slot: fc.nat(2),
            placed: fc.boolean(),
            cancel: fc.boolean(),
            prepare: fc.boolean(),
          }),
          { minLength: 1, maxLength: 80 },
        ),
        fc.integer({ min: 2, max: 4 }),
        (ops, bw) => {
          const plain = new WindowStore(3, W, RB, bw);
          const prepared = new WindowStore(3, W, RB, bw);
          const gen = [1, 1, 1];
          for (const s of [plain, prepared]) for (let k = 0; k < 3; k++) s.checkGeneration(k, 1);
          for (const o of ops) {
            const k = o.slot;
            if (o.prepare) prepared.prepareAppends();
            for (let j = 0; j < 3; j++) expect(prepared.debugWindow(j)).toEqual(plain.debugWindow(j));
            if (o.kind === "release") {
              plain.release(k);
              prepared.release(k);
              continue;
            }
            const before = prepared.debugWindow(k);
            const end = before.nRows > 0 ? before.firstPos + before.nRows : 0;
            const start = o.kind === "append" ? end : o.kind === "gap" ? end + o.gap : o.gap;
            const rows = rowsFor(start, o.n);
            const resync = o.kind === "resync";
            if (o.kind === "reset") {
              gen[k]!++;
              plain.checkGeneration(k, gen[k]!);
              prepared.checkGeneration(k, gen[k]!);
            }
            if (o.placed) {
              const p = prepared.placeAfterWindow(k, o.n);
              // The placement (after a shadow or after the window) leaves the window as it was.
              expect(prepared.debugWindow(k)).toEqual(plain.debugWindow(k));
              p.view.set(rows);
              if (o.cancel) {
                prepared.cancelPlacement(k, p.version);
                expect(prepared.debugWindow(k)).toEqual(plain.debugWindow(k));
                continue;
              }
              prepared.commitPlaced(k, start, o.n, p.row, resync);
            } else {
              prepared.applyRows(k, start, o.n, rows, 0, resync);
            }
            plain.applyRows(k, start, o.n, rows, 0, resync);
            expect(prepared.debugWindow(k)).toEqual(plain.debugWindow(k));
            expect(prepared.windowsHeld).toBe(plain.windowsHeld);
          }
        },
      ),
      { numRuns: 300 },
    );
  });

  test("lockstep multi-row appends compact only between STEPs once prepared (copied and placed)", () => {
    const W = 16;
    for (const placedPath of [false, true]) {
      const s = new WindowStore(4, W, RB, 4);
      for (let k = 0; k < 4; k++) s.checkGeneration(k, 1);
      const pos = [0, 0, 0, 0];
      let onStep = 0;
      for (let step = 0; step < 60; step++) {
        const before = s.compactions;
        for (let k = 0; k < 4; k++) {
          const rows = rowsFor(pos[k]!, 8);
          if (placedPath) {
            const p = s.placeAfterWindow(k, 8);
            p.view.set(rows);
            s.commitPlaced(k, pos[k]!, 8, p.row, false);
          } else {
            s.applyRows(k, pos[k]!, 8, rows, 0, false);
          }
          pos[k]! += 8;
          const w = s.debugWindow(k);
          expect(positionsOf(w.rows)).toEqual(range(pos[k]! - Math.min(W, pos[k]!), pos[k]!));
        }
        // After the first cycle every compaction happens in prepareAppends, none on the STEP.
        if (step > 8) onStep += s.compactions - before;
        s.prepareAppends();
      }
      expect(onStep).toBe(0);
      expect(s.shadowedAppends).toBeGreaterThan(0);
    }
  });
});
