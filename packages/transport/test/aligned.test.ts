// copyTargetBytes (src/aligned.ts): receive buffers that start on a page once koffi is loaded, so
// copies from a page-aligned shm mapping do not land 16 bytes ahead of their source mod 4096.
import { createRequire } from "node:module";
import { describe, expect, test } from "vitest";
import { bindLibc, copyTargetBytes } from "../src/index.js";
import { setKoffiLoader } from "../src/shm.js";

const koffi = createRequire(import.meta.url)("koffi") as {
  load(path: string): { func(decl: string): (...args: unknown[]) => unknown };
  address(p: unknown): bigint;
};
const memset = koffi.load("libc.so.6").func("void *memset(void *d, int c, size_t n)");
const addressOf = (v: Uint8Array): bigint => koffi.address(memset(v, 0, 0));

describe("copyTargetBytes", () => {
  test("without koffi loaded: a plain array (never loads koffi itself)", () => {
    setKoffiLoader(() => import("koffi")); // forgets a loaded binding
    const b = copyTargetBytes(1536 * 1024);
    expect(b.length).toBe(1536 * 1024);
    expect(b.byteOffset).toBe(0);
    expect(b.buffer.byteLength).toBe(1536 * 1024);
  });

  test("with koffi loaded: zeroed, exactly n bytes, starting on a page; small ones plain", () => {
    bindLibc(createRequire(import.meta.url)("koffi"));
    for (const n of [16 * 1024, 24 * 1024 + 1, 1536 * 1024, 8 * 1024 * 1024]) {
      const b = copyTargetBytes(n);
      expect(b.length).toBe(n);
      expect(addressOf(b) % 4096n, `${n} bytes`).toBe(0n);
      expect(b.buffer.byteLength - n).toBeLessThanOrEqual(4096);
      expect(b.every((x) => x === 0)).toBe(true);
      // an ordinary buffer (not resizable: full-speed element access)
      expect((b.buffer as ArrayBuffer & { resizable?: boolean }).resizable ?? false).toBe(false);
    }
    const small = copyTargetBytes(1000);
    expect(small.byteOffset).toBe(0);
    expect(small.length).toBe(1000);
  });
});
