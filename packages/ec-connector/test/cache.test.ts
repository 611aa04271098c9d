import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { crc32, EcError, EmbeddingCache, syntheticEmbedding } from "../src/index.js";

function code(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    if (err instanceof EcError) return err.code;
    throw err;
  }
  return undefined;
}

function ready(c: EmbeddingCache, h: string, nbytes: number): readonly number[] {
  const blocks = c.allocate(h, nbytes);
  c.write(h, 0, syntheticEmbedding(h, nbytes));
  c.markReady(h);
  return blocks;
}

describe("EmbeddingCache (EC-CONTRACT 1)", () => {
  it("validates options naming the bad one", () => {
    expect(() => new EmbeddingCache({ numBlocks: 0, blockBytes: 4 })).toThrow(/numBlocks/);
    expect(() => new EmbeddingCache({ numBlocks: 4, blockBytes: 1.5 })).toThrow(/blockBytes/);
    expect(code(() => new EmbeddingCache({ numBlocks: 4, blockBytes: -1 }))).toBe("EC_BAD_OPTION");
  });

  it("allocates first fit: freed (cache-warm) blocks are reused before untouched ones", () => {
    const c = new EmbeddingCache({ numBlocks: 8, blockBytes: 16 });
    expect(c.allocate("a", 32)).toEqual([0, 1]);
    expect(c.allocate("b", 32)).toEqual([2, 3]);
    c.free("a");
    // the lowest free run that fits: a's blocks again, not the untouched 4..
    expect(c.allocate("c", 32)).toEqual([0, 1]);
    c.free("c");
    // a run that does not fit in the hole goes past it; a later small one fills the hole
    expect(c.allocate("d", 48)).toEqual([4, 5, 6]);
    expect(c.allocate("e", 16)).toEqual([0]);
    // no contiguous run left: the free blocks in order
    c.free("b");
    expect(c.allocate("f", 64)).toEqual([1, 2, 3, 7]);
    c.check();
  });

  it("allocates contiguous blocks, writes, views zero-copy and frees", () => {
    const c = new EmbeddingCache({ numBlocks: 8, blockBytes: 16 });
    const blocks = c.allocate("a", 40);
    expect(blocks).toEqual([0, 1, 2]);
    expect(c.freeBlocks).toBe(5);
    const data = syntheticEmbedding("a", 40);
    c.write("a", 0, data.subarray(0, 10));
    c.write("a", 10, data.subarray(10));
    expect(code(() => c.view("a"))).toBe("EC_CACHE_STATE"); // not ready
    const info = c.markReady("a");
    expect(info.crc32).toBe(crc32(data));
    const v = c.view("a");
    expect(v.buffer).toBe(c.region.buffer); // zero-copy
    expect(Buffer.from(v).equals(Buffer.from(data))).toBe(true);
    expect(c.blockViews("a").map((x) => x.length)).toEqual([16, 16, 8]);
    c.free("a");
    expect(c.freeBlocks).toBe(8);
    c.check();
  });

  it("copies out a non-contiguous entry and keeps the bytes right", () => {
    const c = new EmbeddingCache({ numBlocks: 4, blockBytes: 8 });
    ready(c, "x", 8); // block 0
    ready(c, "y", 8); // block 1
    ready(c, "z", 8); // block 2
    c.free("y");
    c.free("x");
    // blocks 0,1,3 free: cursor-based search cannot find 3 contiguous → scattered
    const blocks = c.allocate("w", 24);
    expect(new Set(blocks)).toEqual(new Set([0, 1, 3]));
    c.write("w", 0, syntheticEmbedding("w", 24));
    c.markReady("w");
    const v = c.view("w");
    expect(v.buffer).not.toBe(c.region.buffer);
    expect(Buffer.from(v).equals(Buffer.from(syntheticEmbedding("w", 24)))).toBe(true);
    c.check();
  });

  it("refuses duplicates, bad sizes and writes past the end", () => {
    const c = new EmbeddingCache({ numBlocks: 4, blockBytes: 8 });
    c.allocate("a", 8);
    expect(code(() => c.allocate("a", 8))).toBe("EC_CACHE_EXISTS");
    expect(code(() => c.allocate("b", 0))).toBe("EC_BAD_ARGUMENT");
    expect(code(() => c.allocate("b", 33))).toBe("EC_CACHE_FULL");
    expect(code(() => c.write("a", 4, new Uint8Array(5)))).toBe("EC_BAD_ARGUMENT");
    expect(code(() => c.write("nope", 0, new Uint8Array(1)))).toBe("EC_CACHE_MISSING");
  });

  it("pins only ready entries and releases each pin exactly once (EC-CONTRACT 4.2, 4.5)", () => {
    const c = new EmbeddingCache({ numBlocks: 4, blockBytes: 8 });
    expect(c.pinIfReady("a")).toBeUndefined();
    c.allocate("a", 8);
    expect(c.pinIfReady("a")?.ready).toBe(false);
    expect(c.get("a")?.pins).toBe(0);
    c.markReady("a");
    expect(c.pinIfReady("a")?.pins).toBe(1);
    expect(c.pinnedBlocks).toBe(1);
    expect(code(() => c.free("a"))).toBe("EC_CACHE_STATE");
    c.unpin("a");
    expect(code(() => c.unpin("a"))).toBe("EC_CACHE_STATE");
    c.free("a");
    c.check();
  });

  it("evicts unpinned ready entries in LRU order, never pinned or in-flight ones", () => {
    const evicted: string[] = [];
    const c = new EmbeddingCache({ numBlocks: 4, blockBytes: 8, onEvict: (h) => evicted.push(h) });
    ready(c, "a", 8);
    ready(c, "b", 8);
    ready(c, "c", 8);
    c.allocate("inflight", 8);
    c.view("a"); // a becomes most recently used: b is now the oldest
    c.pinIfReady("c");
    c.allocate("d", 8);
    expect(evicted).toEqual(["b"]);
    // only a is evictable now (c pinned, inflight and d not ready): 2 blocks cannot be found
    expect(code(() => c.allocate("e", 16))).toBe("EC_CACHE_FULL");
    expect(evicted).toEqual(["b"]); // nothing evicted by a failed allocation
    expect(c.has("a")).toBe(true);
    c.allocate("e", 8);
    expect(evicted).toEqual(["b", "a"]);
    expect(c.evictions).toBe(2);
    c.check();
  });

  it("detaches quarantined blocks so they are never reallocated, then frees or retires them", () => {
    const c = new EmbeddingCache({ numBlocks: 4, blockBytes: 8 });
    c.allocate("q", 16);
    const id = c.detach("q");
    expect(c.has("q")).toBe(false);
    expect(c.freeBlocks).toBe(2);
    expect(c.detachedBlocks).toBe(2);
    c.allocate("q", 16); // the key is reusable, the blocks are not
    expect(code(() => c.allocate("r", 8))).toBe("EC_CACHE_FULL");
    c.releaseDetached(id, false);
    expect(c.retiredBlocks).toBe(2);
    expect(c.freeBlocks).toBe(0);
    expect(code(() => c.releaseDetached(id, true))).toBe("EC_BAD_ARGUMENT");
    c.check();
    c.free("q");
    c.allocate("s", 8);
    const id2 = c.detach("s");
    c.releaseDetached(id2, true);
    expect(c.freeBlocks).toBe(2);
    c.check();
  });

  it("keeps its bookkeeping under random operations (model-based, EC-CONTRACT 8)", () => {
    const op = fc.oneof(
      fc.record({
        k: fc.constant("alloc" as const),
        h: fc.integer({ min: 0, max: 9 }),
        n: fc.integer({ min: 1, max: 40 }),
      }),
      fc.record({
        k: fc.constantFrom("ready", "pin", "unpin", "free", "detach", "view", "retire" as const),
        h: fc.integer({ min: 0, max: 9 }),
      }),
      fc.record({ k: fc.constant("release" as const), i: fc.nat(), reuse: fc.boolean() }),
    );
    fc.assert(
      fc.property(fc.array(op, { maxLength: 80 }), (ops) => {
        const c = new EmbeddingCache({ numBlocks: 12, blockBytes: 8 });
        const pins = new Map<string, number>();
        const held: number[] = [];
        for (const o of ops) {
          try {
            if (o.k === "alloc") {
              const before = c.freeBlocks;
              c.allocate(`h${o.h}`, o.n);
              expect(c.freeBlocks).toBeLessThanOrEqual(before + 12);
            } else if (o.k === "release") {
              if (held.length === 0) continue;
              const id = held.splice(o.i % held.length, 1)[0]!;
              c.releaseDetached(id, o.reuse);
            } else {
              const h = `h${o.h}`;
              if (o.k === "ready") c.markReady(h);
              else if (o.k === "pin") {
                if (c.pinIfReady(h)?.ready) pins.set(h, (pins.get(h) ?? 0) + 1);
              } else if (o.k === "unpin") {
                c.unpin(h);
                pins.set(h, (pins.get(h) ?? 0) - 1);
              } else if (o.k === "free") c.free(h);
              else if (o.k === "detach") held.push(c.detach(h));
              else if (o.k === "retire") c.retire(h);
              else c.view(h);
            }
          } catch (err) {
            if (!(err instanceof EcError)) throw err;
          }
          // a pinned entry is never evicted or freed
          for (const [h, n] of pins) if (n > 0) expect(c.get(h)?.pins).toBe(n);
          c.check();
        }
      }),
      { numRuns: 300 },
    );
  });
});

describe("crc32", () => {
  it("matches zlib's CRC-32 and runs incrementally", () => {
    expect(crc32(Buffer.from("123456789"))).toBe(3421780262);
    const data = new Uint8Array(2560);
    for (let i = 0; i < data.length; i++) data[i] = i & 0xff;
    expect(crc32(data)).toBe(3283626860);
    let c = 0;
    for (let i = 0; i < data.length; i += 333) c = crc32(data.subarray(i, i + 333), c);
    expect(c).toBe(3283626860);
  });
});

describe("syntheticEmbedding", () => {
  it("is deterministic, prefix-stable and computable at any offset", () => {
    const a = syntheticEmbedding("img-1", 1001);
    expect(Buffer.from(syntheticEmbedding("img-1", 1001)).equals(Buffer.from(a))).toBe(true);
    expect(Buffer.from(syntheticEmbedding("img-1", 10)).equals(Buffer.from(a.subarray(0, 10)))).toBe(true);
    expect(Buffer.from(syntheticEmbedding("img-2", 10)).equals(Buffer.from(a.subarray(0, 10)))).toBe(false);
  });
});
