import { createRequire } from "node:module";
import * as zlib from "node:zlib";
import { Registry } from "@tapwire/stats";
import { spawnBin } from "@tapwire/testing";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { crc32Table, setCrc32InlineGbpsForTest } from "../src/crc.js";
import {
  ConsumerConnector,
  CRC32_ENV,
  CRC32_IMPLS,
  crc32,
  crc32Info,
  crc32InlineGbps,
  EcAdminClient,
  ISAL_MIN_BYTES,
  loadCrc32,
} from "../src/index.js";
import { consumerMetrics, producerMetrics } from "../src/metrics.js";
import { Driver } from "./helpers/drive.js";
import { PRODUCER_BIN, spawnProducer } from "./helpers/proc.js";

const CONSUMER_CHILD = new URL("./helpers/consumer-child.mjs", import.meta.url).pathname;

const zlibCrc = (zlib as unknown as { crc32: (d: Uint8Array, v?: number) => number }).crc32;

/** The native module, straight (not through this package), or null when it does not load here. */
function nativeModule(): { crc32: (d: Uint8Array, v?: number) => number } | null {
  try {
    return createRequire(import.meta.url)("@node-rs/crc32") as {
      crc32: (d: Uint8Array, v?: number) => number;
    };
  } catch {
    return null;
  }
}

/** Splits `data` at the given cut points (as views, like socket reads landing in a block). */
function chunks(data: Uint8Array, cuts: number[]): Uint8Array[] {
  const at = [...new Set(cuts.map((c) => c % (data.length + 1)))].sort((a, b) => a - b);
  const out: Uint8Array[] = [];
  let prev = 0;
  for (const c of [...at, data.length]) {
    out.push(data.subarray(prev, c));
    prev = c;
  }
  return out;
}

const fallbackInfo = loadCrc32(() => {
  throw new Error("Cannot find module '@node-rs/crc32-linux-x64-gnu'");
}, null);

/** ISA-L's crc32_gzip_refl bound straight (not through this package), or null when it does not load here. */
function isalModule(): ((init: number, buf: Uint8Array, len: number) => number) | null {
  try {
    const koffi = createRequire(import.meta.url)("koffi") as {
      load(p: string): { func(d: string): (init: number, buf: Uint8Array, len: number) => number };
    };
    return koffi.load("libisal.so.2").func("uint32_t crc32_gzip_refl(uint32_t, const uint8_t *, uint64_t)");
  } catch {
    return null;
  }
}

/** A crc32_gzip_refl stand-in built on node:zlib, counting its calls. */
function fakeIsal(calls: number[]): (init: number, buf: Uint8Array, len: number) => number {
  return (init, buf, len) => {
    calls.push(len);
    return zlibCrc(buf.subarray(0, len), init);
  };
}

describe("crc32InlineGbps (the checksum thread's decision, crc.ts CHECKSUM_THREAD_MAX_INLINE_GBPS)", () => {
  it("measures the in-use CRC-32 once: a positive finite rate, remembered; the test hook replaces it", () => {
    setCrc32InlineGbpsForTest(undefined);
    const g = crc32InlineGbps();
    expect(Number.isFinite(g) && g > 0).toBe(true);
    expect(crc32InlineGbps()).toBe(g);
    setCrc32InlineGbpsForTest(1.5);
    expect(crc32InlineGbps()).toBe(1.5);
    setCrc32InlineGbpsForTest(undefined);
    expect(crc32InlineGbps()).toBeGreaterThan(0);
  });
});

describe("CRC-32 implementation choice", () => {
  it("uses the fastest implementation that loads here (ISA-L over @node-rs/crc32), and says so", () => {
    const native = nativeModule();
    const isal = isalModule();
    if (process.env[CRC32_ENV] === undefined && isal !== null && native !== null) {
      expect(crc32Info.impl).toBe(CRC32_IMPLS.isal);
      expect(crc32Info.smallImpl).toBe(CRC32_IMPLS.native);
      expect(crc32Info.fallbackReason).toBeNull();
    } else if (process.env[CRC32_ENV] === undefined && native !== null) {
      expect(crc32Info.impl).toBe(CRC32_IMPLS.native);
      expect(crc32Info.fallbackReason).toMatch(/^libisal: /);
    } else {
      expect(crc32Info.fallbackReason).not.toBeNull();
    }
    // the metrics say which implementation is in use
    const r = new Registry();
    consumerMetrics(r);
    expect(r.snapshot().info["crc_impl"]).toBe(crc32Info.impl);
    const p = new Registry();
    producerMetrics(p);
    expect(p.snapshot().info["crc_impl"]).toBe(crc32Info.impl);
  });

  it("falls back to node:zlib when the native package is missing, broken or wrong", () => {
    expect(fallbackInfo.impl).toBe(CRC32_IMPLS.zlib);
    expect(fallbackInfo.fallbackReason).toMatch(/did not load: Cannot find module/);
    const empty = loadCrc32(() => ({}), null);
    expect(empty.impl).toBe(CRC32_IMPLS.zlib);
    expect(empty.fallbackReason).toMatch(/no crc32 function/);
    // a module whose crc32 computes something else (here: CRC-32C) fails the self-check
    const native = nativeModule() as { crc32c?: unknown } | null;
    const wrong = loadCrc32(() => ({ crc32: native?.crc32c ?? ((d: Uint8Array) => d.length) }), null);
    expect(wrong.impl).toBe(CRC32_IMPLS.zlib);
    expect(wrong.fallbackReason).toMatch(/self-check/);
    // ignoring the initial value also fails it
    const noInit = loadCrc32(() => ({ crc32: (d: Uint8Array) => zlibCrc(d) }), null);
    expect(noInit.fallbackReason).toMatch(/self-check/);
    // a loader handing back a good implementation is used
    const good = loadCrc32(() => ({ crc32: (d: Uint8Array, v?: number) => zlibCrc(d, v ?? 0) }), null);
    expect(good.impl).toBe(CRC32_IMPLS.native);
    expect(good.smallImpl).toBe(CRC32_IMPLS.native);
    expect(fallbackInfo.fn(Buffer.from("123456789"))).toBe(0xcbf43926);
  });

  it("ISA-L takes chunks of ISAL_MIN_BYTES and more, the small implementation the rest; a missing or wrong libisal falls back and says why", () => {
    const goodNative = () => ({ crc32: (d: Uint8Array, v?: number) => zlibCrc(d, v ?? 0) });
    const calls: number[] = [];
    const hybrid = loadCrc32(goodNative, () => fakeIsal(calls));
    expect(hybrid.impl).toBe(CRC32_IMPLS.isal);
    expect(hybrid.smallImpl).toBe(CRC32_IMPLS.native);
    expect(hybrid.fallbackReason).toBeNull();
    calls.length = 0;
    const long = new Uint8Array(ISAL_MIN_BYTES + 3).fill(5);
    expect(hybrid.fn(long, 7)).toBe(zlibCrc(long, 7) >>> 0);
    expect(hybrid.fn(long.subarray(0, ISAL_MIN_BYTES - 1), 7)).toBe(
      zlibCrc(long.subarray(0, ISAL_MIN_BYTES - 1), 7) >>> 0,
    );
    expect(hybrid.fn(long.subarray(0, ISAL_MIN_BYTES))).toBe(zlibCrc(long.subarray(0, ISAL_MIN_BYTES)) >>> 0);
    expect(calls).toEqual([ISAL_MIN_BYTES + 3, ISAL_MIN_BYTES]);
    // over the zlib fallback when @node-rs/crc32 is missing too
    const overZlib = loadCrc32(
      () => {
        throw new Error("gone");
      },
      () => fakeIsal([]),
    );
    expect(overZlib.impl).toBe(CRC32_IMPLS.isal);
    expect(overZlib.smallImpl).toBe(CRC32_IMPLS.zlib);
    // libisal.so.2 or koffi missing: the small implementation, and the reason
    const missing = loadCrc32(goodNative, () => {
      throw new Error("libisal.so.2 did not load");
    });
    expect(missing.impl).toBe(CRC32_IMPLS.native);
    expect(missing.fallbackReason).toBe("libisal: libisal.so.2 did not load");
    expect(loadCrc32(goodNative, () => 42).fallbackReason).toMatch(/^libisal: .*no function/);
    // wrong values: ignores the initial value; right only on short input; CRC-32C; throws
    const noInit = loadCrc32(
      goodNative,
      () => (_i: number, b: Uint8Array, n: number) => zlibCrc(b.subarray(0, n)),
    );
    expect(noInit.impl).toBe(CRC32_IMPLS.native);
    expect(noInit.fallbackReason).toMatch(/^libisal: failed the CRC-32 self-check/);
    const shortOnly = loadCrc32(
      goodNative,
      () => (i: number, b: Uint8Array, n: number) => (n < 1000 ? zlibCrc(b.subarray(0, n), i) : 0),
    );
    expect(shortOnly.fallbackReason).toMatch(/self-check/);
    const native = nativeModule() as { crc32c?: (d: Uint8Array, v?: number) => number } | null;
    if (native?.crc32c !== undefined) {
      const c = native.crc32c;
      const castagnoli = loadCrc32(
        goodNative,
        () => (i: number, b: Uint8Array, n: number) => c(b.subarray(0, n), i),
      );
      expect(castagnoli.fallbackReason).toMatch(/self-check/);
    }
    const throws = loadCrc32(goodNative, () => () => {
      throw new TypeError("bad pointer");
    });
    expect(throws.fallbackReason).toMatch(/^libisal: failed the CRC-32 self-check/);
  });

  const isal = isalModule();
  it("property: ISA-L, native, fallback, table and zlib agree; incremental over any chunking == one-shot (EC-CONTRACT 3, 6.3)", () => {
    fc.assert(
      fc.property(
        fc.uint8Array({ maxLength: 70_000 }),
        fc.array(fc.nat(), { maxLength: 12 }),
        fc.nat({ max: 0xffffffff }),
        fc.nat({ max: 16 }),
        (body, cuts, init, pad) => {
          // a view at an arbitrary offset into a larger buffer, like a block inside the cache region
          const backing = new Uint8Array(body.length + pad + 3);
          backing.set(body, pad);
          const data = backing.subarray(pad, pad + body.length);
          const want = zlibCrc(data, init) >>> 0;
          expect(crc32(data, init)).toBe(want);
          expect(fallbackInfo.fn(data, init)).toBe(want);
          if (data.length <= 4096) expect(crc32Table(data, init)).toBe(want);
          let c = init;
          let f = init;
          for (const part of chunks(data, cuts)) {
            c = crc32(part, c);
            f = fallbackInfo.fn(part, f);
          }
          expect(c).toBe(want);
          expect(f).toBe(want);
          const native = nativeModule();
          if (native !== null) expect(native.crc32(data, init) >>> 0).toBe(want);
          if (isal !== null) expect(isal(init, data, data.length) >>> 0).toBe(want);
        },
      ),
      { numRuns: 300 },
    );
  });

  it("a large buffer (16 MiB, the benchmark size) chunked like socket reads matches zlib", () => {
    const data = new Uint8Array(16 * 1024 * 1024);
    for (let i = 0; i < data.length; i += 4096) data[i] = (i * 2654435761) >>> 24;
    const want = zlibCrc(data) >>> 0;
    expect(crc32(data)).toBe(want);
    let c = 0;
    for (let off = 0; off < data.length; off += 65_536 + 7)
      c = crc32(data.subarray(off, off + 65_536 + 7), c);
    expect(c).toBe(want);
  });
});

it(`a producer forced onto the node:zlib fallback (${CRC32_ENV}=zlib) and a consumer on ${crc32Info.impl} agree over a real transfer`, async () => {
  const child = await spawnBin(
    PRODUCER_BIN,
    ["--prepopulate", "img-z:3000000", "--log-level", "warn", "--num-blocks", "64", "--block-bytes", "65536"],
    { env: { [CRC32_ENV]: "zlib" } },
  );
  const listening = child.readyLine.json!;
  expect(listening["crcImpl"]).toBe(CRC32_IMPLS.zlib);
  expect(listening["crcFallback"]).toBe(`${CRC32_ENV}=zlib`);
  const admin = new EcAdminClient(String(listening["admin"]));
  const registry = new Registry();
  const conn = await ConsumerConnector.create({
    numBlocks: 64,
    blockBytes: 65_536,
    compatibility: String(listening["compatibilityHash"]),
    registry,
  });
  const driver = new Driver(conn).start();
  try {
    expect(await driver.fetch("img-z", String(listening["control"]), 3_000_000)).toBe("loaded");
    expect(driver.mismatched).toEqual([]);
    const snap = registry.snapshot();
    expect(snap.counters["consumer_reads_completed"]).toBe(1);
    expect(snap.counters["consumer_checksum_failures"]).toBe(0);
    expect(snap.info["crc_impl"]).toBe(crc32Info.impl);
    const s = (await admin.stats()) as { metrics: { info: Record<string, string> } };
    expect(s.metrics.info["crc_impl"]).toBe(CRC32_IMPLS.zlib);
  } finally {
    driver.stop();
    await conn.close();
    admin.close();
    await child.kill("SIGTERM");
  }
}, 60_000);

it(`${CRC32_ENV} picks the producer's implementation (node-rs, table; unset: ${crc32Info.impl}) and its listening line says which and why`, async () => {
  const want: [string | undefined, string, string | undefined][] = [
    ["node-rs", CRC32_IMPLS.native, `${CRC32_ENV}=node-rs`],
    ["table", CRC32_IMPLS.table, `${CRC32_ENV}=table`],
    [undefined, crc32Info.impl, crc32Info.fallbackReason ?? undefined],
  ];
  for (const [value, impl, why] of want) {
    const child = await spawnBin(
      PRODUCER_BIN,
      ["--log-level", "warn", "--num-blocks", "16", "--block-bytes", "65536"],
      {
        env: value === undefined ? {} : { [CRC32_ENV]: value },
      },
    );
    try {
      const listening = child.readyLine.json!;
      expect(listening["crcImpl"]).toBe(impl);
      expect(listening["crcFallback"]).toBe(why);
    } finally {
      await child.kill("SIGTERM");
    }
  }
}, 60_000);

it(`a consumer forced onto the node:zlib fallback (${CRC32_ENV}=zlib) verifies a producer's ${crc32Info.impl} CRC-32 over a real transfer`, async () => {
  const prod = await spawnProducer([
    "--prepopulate",
    "img-n:3000001",
    "--log-level",
    "warn",
    "--num-blocks",
    "64",
    "--block-bytes",
    "65536",
  ]);
  try {
    const child = await spawnBin(CONSUMER_CHILD, [prod.control, prod.compatibilityHash, "img-n", "3000001"], {
      env: { [CRC32_ENV]: "zlib" },
    });
    try {
      const res = await child.waitFor((l) => l.json?.["msg"] === "result", 30_000);
      // loaded = the read's CRC-32 (node:zlib in the child) equalled the ack's (EC-CONTRACT 6.3)
      expect(res.json!["loaded"]).toEqual(["img-n"]);
      expect(res.json!["failed"]).toEqual([]);
    } finally {
      await child.kill("SIGKILL");
    }
  } finally {
    await prod.kill("SIGTERM");
  }
}, 60_000);
