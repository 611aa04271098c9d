import { describe, expect, test } from "vitest";
import { BACKOFF_DEFAULTS, Backoff, ClientError, clampDelay, MAX_TIMER_DELAY_MS } from "../src/index.js";

describe("Backoff (CONTRACT 9.1)", () => {
  test("doubles from initialMs up to maxMs and resets", () => {
    const b = new Backoff({ initialMs: 100, maxMs: 700 });
    expect([b.next(), b.next(), b.next(), b.next(), b.next()]).toEqual([100, 200, 400, 700, 700]);
    b.reset();
    expect(b.next()).toBe(100);
    expect(b.current).toBe(200);
  });

  test("defaults", () => {
    const b = new Backoff();
    expect(b.initialMs).toBe(BACKOFF_DEFAULTS.initialMs);
    expect(b.maxMs).toBe(BACKOFF_DEFAULTS.maxMs);
  });

  test("validates", () => {
    expect(() => new Backoff({ initialMs: -1 })).toThrow(ClientError);
    expect(() => new Backoff({ initialMs: 10, maxMs: 5 })).toThrow("backoffMaxMs");
    expect(() => new Backoff({ multiplier: 0.5 })).toThrow("multiplier");
  });

  test("delays clamp to the timer range", () => {
    expect(clampDelay(-5)).toBe(0);
    expect(clampDelay(Number.NaN)).toBe(0);
    expect(clampDelay(12)).toBe(12);
    expect(clampDelay(2 ** 40)).toBe(MAX_TIMER_DELAY_MS);
  });
});
