import { describe, expect, test } from "vitest";
import { FakeClock } from "../src/index.js";

describe("FakeClock", () => {
  test("now() moves only when advanced; timers fire in due order, ties in creation order", () => {
    const clock = new FakeClock(1000);
    const log: string[] = [];
    clock.setTimeout(() => log.push(`c@${clock.now()}`), 30);
    clock.setTimeout(() => log.push(`a@${clock.now()}`), 10);
    clock.setTimeout(() => log.push(`b1@${clock.now()}`), 20);
    clock.setTimeout(() => log.push(`b2@${clock.now()}`), 20);
    expect(clock.now()).toBe(1000);
    expect(clock.advance(19)).toBe(1);
    expect(log).toEqual(["a@1010"]);
    expect(clock.now()).toBe(1019);
    expect(clock.advance(100)).toBe(3);
    expect(log).toEqual(["a@1010", "b1@1020", "b2@1020", "c@1030"]);
    expect(clock.now()).toBe(1119);
    expect(clock.pending).toBe(0);
  });

  test("timers scheduled by callbacks fire within the same advance when due", () => {
    const clock = new FakeClock();
    const log: number[] = [];
    const chain = (n: number) => {
      log.push(clock.now());
      if (n > 0) clock.setTimeout(() => chain(n - 1), 5);
    };
    clock.setTimeout(() => chain(10), 5);
    clock.advance(30);
    expect(log).toEqual([5, 10, 15, 20, 25, 30]);
    clock.advance(30);
    expect(log).toEqual([5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55]);
  });

  test("a zero-delay timer scheduled from a callback runs after the current one, in the same advance", () => {
    const clock = new FakeClock();
    const log: string[] = [];
    clock.setTimeout(() => {
      log.push("outer");
      clock.setTimeout(() => log.push("inner"), 0);
    }, 1);
    clock.advance(1);
    expect(log).toEqual(["outer"]);
    clock.advance(1);
    expect(log).toEqual(["outer", "inner"]);
  });

  test("clearTimeout cancels, also from inside another callback; null and unknown handles are ignored", () => {
    const clock = new FakeClock();
    const log: string[] = [];
    const b = clock.setTimeout(() => log.push("b"), 20);
    clock.setTimeout(() => {
      log.push("a");
      clock.clearTimeout(b);
    }, 10);
    const c = clock.setTimeout(() => log.push("c"), 30);
    clock.clearTimeout(+c);
    clock.clearTimeout(undefined);
    clock.clearTimeout(null);
    clock.clearTimeout({});
    clock.advance(100);
    expect(log).toEqual(["a"]);
  });

  test("intervals repeat, pass arguments, and can clear themselves", () => {
    const clock = new FakeClock();
    const seen: [number, string][] = [];
    const h = clock.setInterval(
      (tag: string) => {
        seen.push([clock.now(), tag]);
        if (seen.length === 3) clock.clearInterval(h);
      },
      100,
      "tick",
    );
    clock.advance(1000);
    expect(seen).toEqual([
      [100, "tick"],
      [200, "tick"],
      [300, "tick"],
    ]);
    expect(clock.pending).toBe(0);
  });

  test("handles have unref/ref/hasRef/refresh like Node timeouts", () => {
    const clock = new FakeClock();
    let fired = 0;
    const t = clock.setTimeout(() => fired++, 50);
    expect(t.unref()).toBe(t);
    expect(t.hasRef()).toBe(false);
    expect(t.ref().hasRef()).toBe(true);
    clock.advance(40);
    t.refresh(); // now due at 90
    clock.advance(40);
    expect(fired).toBe(0);
    clock.advance(10);
    expect(fired).toBe(1);
  });

  test("delays follow Node's rule: outside [1, 2^31-1] (or NaN) means 1 ms", () => {
    const clock = new FakeClock();
    const at: number[] = [];
    for (const d of [0, -5, Number.NaN, 2 ** 31, undefined]) clock.setTimeout(() => at.push(clock.now()), d);
    clock.advance(1);
    expect(at).toEqual([1, 1, 1, 1, 1]);
  });

  test("runAll fires everything in order and refuses to run an endless interval forever", () => {
    const clock = new FakeClock();
    const log: number[] = [];
    clock.setTimeout(() => log.push(clock.now()), 5000);
    clock.setTimeout(() => log.push(clock.now()), 7);
    expect(clock.runAll()).toBe(2);
    expect(log).toEqual([7, 5000]);
    expect(clock.now()).toBe(5000);
    clock.setInterval(() => {}, 1);
    expect(() => clock.runAll(100)).toThrow(expect.objectContaining({ code: "TESTING_CLOCK_RUNAWAY" }));
  });

  test("next() fires just the earliest timer", () => {
    const clock = new FakeClock();
    const log: string[] = [];
    clock.setTimeout(() => log.push("late"), 50);
    clock.setTimeout(() => log.push("early"), 5);
    expect(clock.next()).toBe(true);
    expect(log).toEqual(["early"]);
    expect(clock.now()).toBe(5);
    expect(clock.next()).toBe(true);
    expect(clock.next()).toBe(false);
  });

  test("advanceAsync lets promise chains between timers settle", async () => {
    const clock = new FakeClock();
    const sleep = (ms: number) => new Promise<void>((r) => clock.setTimeout(r, ms));
    const log: number[] = [];
    const task = (async () => {
      for (let i = 0; i < 3; i++) {
        await sleep(10);
        log.push(clock.now());
      }
    })();
    // plain advance fires the first sleep but cannot see the timers scheduled after each await
    expect(clock.advance(30)).toBe(1);
    expect(clock.pending).toBe(0);
    expect(log).toEqual([]);
    // the continuation runs at 30 and the next sleeps are then driven by advanceAsync
    expect(await clock.advanceAsync(30)).toBe(2);
    await task;
    expect(log).toEqual([30, 40, 50]);
    expect(clock.now()).toBe(60);
  });

  test("methods work detached and match a { now, setTimeout, clearTimeout } clock interface", () => {
    const clock = new FakeClock();
    const iface: {
      now(): number;
      setTimeout(fn: () => void, ms: number): unknown;
      clearTimeout(h: unknown): void;
    } = clock;
    const { setTimeout: st, clearTimeout: ct } = clock;
    let n = 0;
    st(() => n++, 1);
    ct(iface.setTimeout(() => n++, 1));
    clock.advance(1);
    expect(n).toBe(1);
    expect(() => clock.advance(-1)).toThrow(expect.objectContaining({ code: "TESTING_BAD_OPTION" }));
    expect(() => new FakeClock(Number.NaN)).toThrow(/startMs/);
  });
});
