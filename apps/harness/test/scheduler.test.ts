import { describe, expect, test } from "vitest";
import { ArrivalQueue, SlotScheduler, serialAdd, serialNewer } from "../src/engine/scheduler.js";

describe("SlotScheduler (continuous batching)", () => {
  test("admits FIFO up to S slots, lowest free slot first", () => {
    const s = new SlotScheduler<string>({ slots: 2 });
    for (const r of ["a", "b", "c", "d"]) s.submit(r);
    const first = s.admit();
    expect(first.map((p) => [p.req, p.slot])).toEqual([
      ["a", 0],
      ["b", 1],
    ]);
    expect(s.runningCount).toBe(2);
    expect(s.queued).toBe(2);
    expect(s.admit()).toEqual([]); // no free slot
    s.release(1);
    const next = s.admit();
    expect(next.map((p) => [p.req, p.slot])).toEqual([["c", 1]]);
    s.release(0);
    s.release(1);
    expect(s.admit().map((p) => [p.req, p.slot])).toEqual([["d", 0]]);
    expect(s.admitted).toBe(4);
  });

  test("a reused slot gets a newer generation each time (CONTRACT 7.1)", () => {
    const s = new SlotScheduler<number>({ slots: 1 });
    const gens: number[] = [];
    for (let i = 0; i < 5; i++) {
      s.submit(i);
      const [p] = s.admit();
      expect(p?.slot).toBe(0);
      gens.push(p!.generation);
      s.release(0);
    }
    expect(gens).toEqual([1, 2, 3, 4, 5]);
    for (let i = 1; i < gens.length; i++) expect(serialNewer(gens[i]!, gens[i - 1]!)).toBe(true);
  });

  test("generations wrap as u32 serial numbers (CONTRACT 2)", () => {
    const s = new SlotScheduler<number>({ slots: 2, initialGeneration: (slot) => 0xfffffffe + slot });
    const seen: Array<[number, number]> = [];
    for (let i = 0; i < 6; i++) s.submit(i);
    for (let round = 0; round < 3; round++) {
      for (const p of s.admit()) seen.push([p.slot, p.generation]);
      for (const p of s.running()) s.release(p.slot);
    }
    expect(seen).toEqual([
      [0, 0xffffffff],
      [1, 0],
      [0, 0],
      [1, 1],
      [0, 1],
      [1, 2],
    ]);
    expect(serialNewer(0, 0xffffffff)).toBe(true);
    expect(serialAdd(0xffffffff, 1)).toBe(0);
  });

  test("never more than S running under random arrivals and completions", () => {
    const S = 3;
    const s = new SlotScheduler<number>({ slots: S });
    let x = 12345;
    const rnd = () => {
      x = (Math.imul(x, 1103515245) + 12345) >>> 0;
      return x / 2 ** 32;
    };
    const lastGen = new Map<number, number>();
    const order: number[] = [];
    let submitted = 0;
    for (let t = 0; t < 2000; t++) {
      if (rnd() < 0.5) s.submit(submitted++);
      for (const p of s.admit()) {
        order.push(p.req);
        const prev = lastGen.get(p.slot);
        if (prev !== undefined) expect(serialNewer(p.generation, prev)).toBe(true);
        lastGen.set(p.slot, p.generation);
      }
      expect(s.runningCount).toBeLessThanOrEqual(S);
      const running = s.running();
      if (running.length > 0 && rnd() < 0.4) s.release(running[Math.floor(rnd() * running.length)]!.slot);
    }
    // FIFO: admitted in submission order
    expect(order).toEqual(order.slice().sort((a, b) => a - b));
    expect(order.length).toBeGreaterThan(100);
  });

  test("releasing a free slot is an error", () => {
    const s = new SlotScheduler<number>({ slots: 1 });
    expect(() => s.release(0)).toThrow(/free slot 0/);
    expect(() => new SlotScheduler({ slots: 0 })).toThrow(/slots/);
  });
});

describe("ArrivalQueue", () => {
  test("releases requests once their arrival time has come, in order", () => {
    const q = new ArrivalQueue([{ arrivalMs: 30 }, { arrivalMs: 10 }, { arrivalMs: 20 }]);
    expect(q.nextArrivalMs()).toBe(10);
    expect(q.due(5)).toEqual([]);
    expect(q.due(20).map((r) => r.arrivalMs)).toEqual([10, 20]);
    expect(q.remaining).toBe(1);
    expect(q.due(100).map((r) => r.arrivalMs)).toEqual([30]);
    expect(q.nextArrivalMs()).toBeNull();
  });
});
