// docs/ec-protocol.md 3.4 "Shared region": the reader's record of where a read's chunks came from,
// and the consumer's check of it against the ack's blocks (src/data/source-runs.ts).
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { recordSourceRun, type SourceRuns, sourceRunsMatch } from "../src/data/source-runs.js";

const fresh = (): SourceRuns => ({ runs: [], overflow: false });

/** The chunks a correct producer sends: the item's bytes in order, cut at `cuts` and at block edges. */
function chunksOf(blocks: number[], bb: number, nbytes: number, cuts: number[]): [number, number][] {
  const out: [number, number][] = [];
  let i = 0;
  let c = 0;
  while (i < nbytes) {
    const blockEnd = (Math.floor(i / bb) + 1) * bb;
    const cut = cuts[c++ % Math.max(1, cuts.length)] ?? nbytes;
    const end = Math.min(nbytes, blockEnd, i + Math.max(1, cut));
    out.push([blocks[Math.floor(i / bb)]! * bb + (i % bb), end - i]);
    i = end;
  }
  return out;
}

describe("source runs (docs/ec-protocol.md 3.4)", () => {
  it("merges adjacent chunks; matches the ack's blocks, contiguous or not, the last block trimmed", () => {
    const s = fresh();
    recordSourceRun(s, 3 * 64, 64, 4);
    recordSourceRun(s, 4 * 64, 30, 4); // continues block 3
    recordSourceRun(s, 4 * 64 + 30, 34, 4);
    recordSourceRun(s, 9 * 64, 10, 4);
    expect(s.runs).toEqual([192, 128, 576, 10]);
    expect(sourceRunsMatch(s, [3, 4, 9], 64, 138)).toBe(true);
    expect(sourceRunsMatch(s, [3, 4, 9], 64, 139)).toBe(false); // a byte short
    expect(sourceRunsMatch(s, [3, 4, 8], 64, 138)).toBe(false); // another block
    expect(sourceRunsMatch(s, [4, 3, 9], 64, 138)).toBe(false); // another order
    expect(sourceRunsMatch(s, [3, 4], 64, 128)).toBe(false); // more bytes than the item
    expect(sourceRunsMatch(fresh(), [3], 64, 1)).toBe(false); // nothing recorded
  });

  it("past the item's block count it overflows: memory bounded, never a match", () => {
    const s = fresh();
    for (let i = 0; i < 1000; i++) recordSourceRun(s, i * 128, 1, 3);
    expect(s.overflow).toBe(true);
    expect(s.runs.length).toBe(0);
    expect(sourceRunsMatch(s, [0, 2, 4], 1, 3)).toBe(false);
  });

  it("property: a correct producer's chunks (any cut) always match; one chunk moved never does", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 5 }).map((k) => 1 << k), // block bytes 2..32
        fc.uniqueArray(fc.integer({ min: 0, max: 40 }), { minLength: 1, maxLength: 8 }),
        fc.array(fc.integer({ min: 1, max: 40 }), { maxLength: 6 }),
        fc.integer({ min: 0, max: 31 }),
        fc.nat(),
        fc.integer({ min: 1, max: 64 }),
        (bb, blocks, cuts, trim, which, shift) => {
          const nbytes = Math.max(1, blocks.length * bb - (trim % bb));
          const chunks = chunksOf(blocks, bb, nbytes, cuts);
          const ok = fresh();
          for (const [o, n] of chunks) recordSourceRun(ok, o, n, blocks.length);
          expect(sourceRunsMatch(ok, blocks, bb, nbytes)).toBe(true);
          // the same chunks with one of them moved elsewhere in the region
          const k = which % chunks.length;
          const moved = chunks.map(([o, n], i): [number, number] => (i === k ? [o + shift, n] : [o, n]));
          const bad = fresh();
          for (const [o, n] of moved) recordSourceRun(bad, o, n, blocks.length);
          // a moved chunk can only match if every byte still maps to the same place: never here
          expect(sourceRunsMatch(bad, blocks, bb, nbytes)).toBe(false);
        },
      ),
      { numRuns: 500 },
    );
  });
});
