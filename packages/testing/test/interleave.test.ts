import { expect, test } from "vitest";
import { interleaved } from "../src/index.js";

test("interleaved: whole rotations both ways, every variant in every slot and after every other equally often", async () => {
  const order: number[] = [];
  const n = 3;
  const variants = [0, 1, 2].map((k) => async () => {
    await Promise.resolve();
    order.push(k);
  });
  const rounds = await interleaved(variants, 7);
  expect(rounds).toBe(12); // 7 rounded up to a multiple of 2 x 3
  expect(order).toHaveLength(rounds * n);
  const slots = Array.from({ length: n }, () => new Array<number>(n).fill(0));
  const after = Array.from({ length: n }, () => new Array<number>(n).fill(0));
  for (let i = 0; i < order.length; i++) {
    slots[order[i]!]![i % n]!++;
    if (i % n > 0) after[order[i]!]![order[i - 1]!]!++;
  }
  for (const row of slots) expect(row).toEqual([4, 4, 4]);
  for (let a = 0; a < n; a++)
    for (let b = 0; b < n; b++) if (a !== b) expect(after[a]![b]).toBe(after[0]![1]);
  expect(await interleaved([], 5)).toBe(0);
});
