import { describe, expect, it } from "vitest";
import { Backoff } from "../src/backoff.js";
import { ChecksumThread } from "../src/data/checksum.js";
import { decodeToReader, encodeFrame } from "../src/data/frame.js";
import { crc32Info, EcError } from "../src/index.js";

describe("package structure (issue 12)", () => {
  it("EcError: instanceof holds across two copies of the package (Symbol.for brand)", async () => {
    // The built copy: a second, separately loaded EcError class (what two installs would be).
    const dist = (await import(new URL("../dist/errors.js", import.meta.url).href)) as {
      EcError: typeof EcError;
    };
    const other = new dist.EcError("EC_DATA", "from the built copy");
    expect(dist.EcError).not.toBe(EcError);
    expect(other instanceof EcError).toBe(true);
    expect(new EcError("EC_DATA", "x") instanceof dist.EcError).toBe(true);
    expect(new Error("plain") instanceof EcError).toBe(false);
    expect({ code: "EC_DATA" } instanceof EcError).toBe(false);
  });

  it("Backoff: the client's shape; initial, grown by the multiplier, capped, reset", () => {
    const b = new Backoff({ initialMs: 10, maxMs: 50, multiplier: 2 });
    expect([b.next(), b.next(), b.next(), b.next()]).toEqual([10, 20, 40, 50]);
    expect(b.current).toBe(50);
    b.reset();
    expect(b.next()).toBe(10);
    // a ceiling below the first delay caps it too (the connector's formula did)
    expect(new Backoff({ initialMs: 10, maxMs: 5, multiplier: 2 }).next()).toBe(5);
  });

  it.each(["source", "dist"])(
    "the checksum thread (%s module) computes zlib's CRC-32 with this thread's implementation",
    async (which) => {
      const mod = (
        which === "dist"
          ? await import(new URL("../dist/data/checksum.js", import.meta.url).href)
          : { ChecksumThread }
      ) as {
        ChecksumThread: typeof ChecksumThread;
      };
      const region = new Uint8Array(new SharedArrayBuffer(16));
      region.set(new TextEncoder().encode("123456789"), 3);
      const got = await new Promise<number>((resolve, reject) => {
        const t = new mod.ChecksumThread(region, {
          done: (_id, crc) => {
            void t.terminate();
            resolve(crc);
          },
          failed: reject,
        });
        t.range(7, 3, 4, false);
        t.range(7, 7, 5, true);
      });
      expect(got).toBe(0xcbf43926);
      expect(crc32Info.impl).toBeTypeOf("string");
    },
  );

  it("an ERROR frame's message is cut to 1 024 bytes on a UTF-8 boundary", () => {
    // "a" then 2-byte characters: byte 1 024 is a continuation byte, so the cut backs off by one
    const f = encodeFrame({ op: "error", code: "no_grant", message: `a${"é".repeat(2000)}` });
    const back = decodeToReader(f.subarray(4));
    expect(back.op === "error" && back.message).toBe(`a${"é".repeat(511)}`);
  });
});
