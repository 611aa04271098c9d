import { createRequire } from "node:module";
import { describe, expect, it } from "vitest";
import { EmbeddingCache } from "../src/index.js";

// koffi (a dev dependency here, an optional peer for users) tells a view's address: memset with
// a length of 0 returns its first argument, the view's first byte.
const koffi = createRequire(import.meta.url)("koffi") as {
  load(path: string): { func(decl: string): (...args: unknown[]) => unknown };
  address(p: unknown): bigint;
};
const memset = koffi.load("libc.so.6").func("void *memset(void *d, int c, size_t n)");
const addressOf = (v: Uint8Array): bigint => koffi.address(memset(v, 0, 0));

describe("EmbeddingCache region alignment (README, docs/benchmarks/ec-connector.md)", () => {
  it("starts its region on a page, plain and shared, at sizes malloc would offset by its header", () => {
    for (const shared of [false, true]) {
      for (const [numBlocks, blockBytes] of [
        [64, 65536],
        [3, 4096],
        [1, 1],
      ] as const) {
        const c = new EmbeddingCache({ numBlocks, blockBytes, shared });
        expect(c.region.length).toBe(numBlocks * blockBytes);
        expect(addressOf(c.region) % 4096n, `shared ${shared}, ${numBlocks} x ${blockBytes}`).toBe(0n);
        expect(c.region.buffer instanceof SharedArrayBuffer).toBe(shared);
        expect(c.region.every((b) => b === 0)).toBe(true);
      }
    }
  });

  it("keeps a caller's own region as given (the producer's shared mapping)", () => {
    const own = new Uint8Array(8192 + 16).subarray(16);
    const c = new EmbeddingCache({ numBlocks: 2, blockBytes: 4096, region: own });
    expect(addressOf(c.region)).toBe(addressOf(own));
  });

  it("never changes length: the region's views stay valid (its maximum is its size)", () => {
    const c = new EmbeddingCache({ numBlocks: 4, blockBytes: 1024 });
    const buf = c.region.buffer as ArrayBuffer & { resizable?: boolean; maxByteLength?: number };
    expect(buf.maxByteLength ?? buf.byteLength).toBe(4096);
    const v = c.region.subarray(1024, 2048);
    c.allocate("a".repeat(64), 4096);
    expect(v.length).toBe(1024);
  });
});
