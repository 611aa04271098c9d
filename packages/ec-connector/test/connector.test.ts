import { Registry } from "@tapwire/stats";
import { describe, expect, it } from "vitest";
import { setCrc32InlineGbpsForTest } from "../src/crc.js";
import type { ConnectorStepResults, ControlClient } from "../src/index.js";
import {
  CHECKSUM_THREAD_MAX_INLINE_GBPS,
  ConsumerConnector,
  EcError,
  EmbeddingCache,
  LoopbackDataTransport,
  LoopbackFabric,
  type SocketDataTransport,
  syntheticEmbedding,
} from "../src/index.js";
import type { FakeRouter, Producer } from "./helpers/loop.js";
import { BLOCK, Clock, COMPAT, makeProducer } from "./helpers/loop.js";

/** A fake DEALER wired to a producer's FakeRouter. */
class FakeDealer implements ControlClient {
  onPeerDown: ((why: string) => void) | null = null;
  onMessage: (() => void) | null = null;
  closed = false;
  dropSends = false;
  constructor(
    readonly router: FakeRouter,
    readonly identity: string,
  ) {}
  send(payload: Uint8Array): void {
    if (!this.dropSends && !this.closed)
      this.router.inbox.push({ identity: Buffer.from(this.identity), frames: [payload] });
  }
  poll(): Uint8Array[] {
    return this.router.take(this.identity);
  }
  close(): void {
    this.closed = true;
  }
}

function setup(entries: [string, number][] = [["img", 200]], producerExtra = {}) {
  const clock = new Clock();
  const fabric = new LoopbackFabric({ now: clock.now });
  const p = makeProducer(fabric, clock, entries, producerExtra);
  const cache = new EmbeddingCache({ numBlocks: 64, blockBytes: BLOCK });
  const data = new LoopbackDataTransport({
    fabric,
    name: "consumer",
    region: cache.region,
    numBlocks: 64,
    blockBytes: BLOCK,
  });
  const dealers: FakeDealer[] = [];
  const producers = new Map<string, Producer>([["tcp://encoder:1", p]]);
  const registry = new Registry();
  const conn = new ConsumerConnector({
    cache,
    data,
    compatibility: COMPAT,
    now: clock.now,
    readTimeoutMs: 1_000,
    quarantineTimeoutMs: 3_000,
    retry: { initialMs: 10, maxMs: 40 },
    idleCloseMs: 10_000,
    registry,
    connect: (addr) => {
      const d = new FakeDealer(producers.get(addr)!.router, `dealer-${dealers.length}`);
      dealers.push(d);
      return d;
    },
  });
  const step = (): ConnectorStepResults => {
    p.session.pollStep();
    return conn.poll();
  };
  return { clock, p, cache, data, conn, dealers, step, registry };
}

const ADDR = "tcp://encoder:1";

function same(cache: EmbeddingCache, h: string, n: number): boolean {
  return Buffer.from(cache.view(h)).equals(Buffer.from(syntheticEmbedding(h, n)));
}

describe("ConsumerConnector (EC-CONTRACT 7)", () => {
  it("validates options naming the bad one", () => {
    const cache = new EmbeddingCache({ numBlocks: 4, blockBytes: BLOCK });
    const data = new LoopbackDataTransport({
      fabric: new LoopbackFabric(),
      name: "x",
      region: cache.region,
      numBlocks: 4,
      blockBytes: BLOCK,
    });
    expect(() => new ConsumerConnector({ cache, data, compatibility: "nothex" })).toThrow(
      /option compatibility/,
    );
    expect(
      () =>
        new ConsumerConnector({
          cache,
          data,
          compatibility: { modelId: "m", dtype: "d", hiddenSize: 1, blockBytes: 7 },
        }),
    ).toThrow(/compatibility.blockBytes/);
    expect(() => new ConsumerConnector({ cache, data, compatibility: COMPAT, ackTimeoutMs: -1 })).toThrow(
      /ackTimeoutMs/,
    );
    expect(
      () => new ConsumerConnector({ cache, data, compatibility: COMPAT, retry: { multiplier: 0.5 } }),
    ).toThrow(/retry.multiplier/);
    expect(
      () => new ConsumerConnector({ cache, data, compatibility: COMPAT, heartbeat: { intervalMs: -5 } }),
    ).toThrow(/heartbeat.intervalMs/);
  });

  it("loads, promotes to a ready entry, and then answers 'ready' locally", () => {
    const { clock, conn, cache, step, p } = setup();
    expect(conn.request("img", ADDR, 200, clock.now() + 5_000)).toBe("pending");
    expect(conn.request("img", ADDR, 200, clock.now() + 5_000)).toBe("pending"); // joins
    const r = step();
    expect(r).toEqual({ loaded: ["img"], failed: [], pending: [] });
    expect(same(cache, "img", 200)).toBe(true);
    expect(conn.request("img", ADDR, 200, clock.now() + 5_000)).toBe("ready");
    p.session.pollStep();
    expect(p.cache.pinnedBlocks).toBe(0);
    conn.free("img");
    expect(cache.freeBlocks).toBe(64);
  });

  it("retries NOT_READY with backoff until the producer is ready", () => {
    const { clock, conn, cache, step, p, registry } = setup([]);
    p.cache.allocate("img", 200);
    conn.request("img", ADDR, 200, clock.now() + 5_000);
    expect(step().pending).toEqual(["img"]);
    clock.advance(5);
    expect(step().pending).toEqual(["img"]); // backoff 10 ms not over
    clock.advance(10);
    step(); // retry #1 sent
    clock.advance(1);
    step(); // NOT_READY again: backoff doubles to 20 ms
    clock.advance(10);
    step();
    expect(registry.snapshot().counters["connector_retries"]).toBe(1);
    p.cache.write("img", 0, syntheticEmbedding("img", 200));
    p.cache.markReady("img");
    clock.advance(10);
    step(); // retry #2 sent
    const r = step();
    expect(r.loaded).toEqual(["img"]);
    expect(same(cache, "img", 200)).toBe(true);
    expect(registry.snapshot().counters["connector_retries"]).toBe(2);
    expect(registry.snapshot().counters["consumer_nacks_not_ready"]).toBe(2);
  });

  it("bounds retries by the request deadline and frees the blocks", () => {
    const { clock, conn, cache, step, p } = setup([]);
    p.cache.allocate("img", 200); // never becomes ready
    conn.request("img", ADDR, 200, clock.now() + 100);
    let failed: ConnectorStepResults["failed"] = [];
    for (let i = 0; i < 50 && failed.length === 0; i++) {
      clock.advance(7);
      failed = step().failed;
    }
    expect(failed).toEqual([{ mmHash: "img", reason: "deadline passed (last: NACK_NOT_READY)" }]);
    expect(cache.freeBlocks).toBe(64);
    expect(conn.pendingCount).toBe(0);
  });

  it("fails MISSING at once; fails when the local cache cannot allocate", () => {
    const { clock, conn, step } = setup([]);
    conn.request("absent", ADDR, 200, clock.now() + 5_000);
    conn.request("huge", ADDR, 65 * BLOCK, clock.now() + 5_000);
    const r = step();
    expect(r.failed.map((f) => f.mmHash).sort()).toEqual(["absent", "huge"]);
    expect(r.failed.find((f) => f.mmHash === "huge")!.reason).toMatch(/allocation failed/);
  });

  it("quarantine: fails the request, keeps the blocks owned (detached) until the read settles", () => {
    const { clock, conn, cache, data, step } = setup();
    data.injectFault({ kind: "stuck" });
    conn.request("img", ADDR, 200, clock.now() + 5_000);
    step();
    clock.advance(1_001);
    const r = step();
    expect(r.failed).toEqual([
      { mmHash: "img", reason: "read timed out or producer went down mid-read (quarantined)" },
    ]);
    expect(cache.has("img")).toBe(false); // the key is free for a local recompute
    expect(cache.detachedBlocks).toBe(4);
    expect(cache.freeBlocks).toBe(60);
    data.unstick();
    step();
    expect(cache.detachedBlocks).toBe(0);
    expect(cache.freeBlocks).toBe(64);
    cache.check();
  });

  it("peer down: a read in flight is quarantined, a waiting request retries on a fresh session", () => {
    const { clock, conn, cache, data, dealers, step, p } = setup([
      ["a", 64],
      ["b", 64],
    ]);
    data.injectFault({ kind: "stuck" });
    conn.request("a", ADDR, 64, clock.now() + 5_000);
    step(); // a READING
    dealers[0]!.dropSends = true;
    conn.request("b", ADDR, 64, clock.now() + 5_000); // b WAITING_ACK (lost)
    dealers[0]!.onPeerDown!("disconnect");
    let r = step();
    expect(r.failed.map((f) => f.mmHash)).toEqual(["a"]);
    expect(r.pending).toEqual(["b"]);
    clock.advance(20);
    step(); // retry sent on a new session
    expect(dealers).toHaveLength(2);
    r = step();
    expect(r.loaded).toEqual(["b"]);
    data.unstick();
    step();
    expect(dealers[0]!.closed).toBe(true); // drained, then closed
    expect(cache.detachedBlocks).toBe(0);
    p.session.pollStep();
    clock.advance(6_000);
    p.session.pollStep();
    expect(p.cache.pinnedBlocks).toBe(0);
  });

  it("poll() does not throw when the engine frees entries the connector still owns", () => {
    const { clock, conn, cache, data, step, p } = setup([
      ["a", 64],
      ["b", 64],
    ]);
    p.cache.allocate("c", 64); // never ready: c keeps retrying
    conn.request("c", ADDR, 64, clock.now() + 5_000);
    data.injectFault({ kind: "stuck" });
    conn.request("a", ADDR, 64, clock.now() + 5_000);
    step();
    cache.free("a"); // misuse: freed while READING
    cache.free("c"); // misuse: freed while waiting to retry
    data.unstick();
    const failed = new Map<string, string>();
    for (let i = 0; i < 4; i++) {
      clock.advance(20);
      let r: ConnectorStepResults | undefined;
      expect(() => {
        r = step();
      }).not.toThrow();
      for (const f of r!.failed) failed.set(f.mmHash, f.reason);
    }
    expect(failed.get("a")).toBe("local entry vanished while the read was in flight");
    expect(failed.get("c")).toBe("local entry changed outside the connector");
    expect(conn.pendingCount).toBe(0);
  });

  it("closes idle sessions and close() releases everything", async () => {
    const { clock, conn, cache, dealers, step, data } = setup([
      ["img", 200],
      ["x", 64],
    ]);
    conn.request("img", ADDR, 200, clock.now() + 5_000);
    step();
    clock.advance(10_001);
    step();
    expect(dealers[0]!.closed).toBe(true);
    data.injectFault({ kind: "stuck" });
    conn.request("x", ADDR, 64, clock.now() + 5_000);
    step();
    await conn.close();
    expect(cache.freeBlocks + cache.get("img")!.blocks.length).toBe(64);
    expect(() => conn.request("y", ADDR, 1, 0)).toThrow(EcError);
    cache.check();
  });
});

describe("ConsumerConnector with real ZeroMQ (EC-CONTRACT 7)", () => {
  it("a malformed producer address fails the request and keeps no blocks", async () => {
    const conn = await ConsumerConnector.create({ numBlocks: 8, blockBytes: BLOCK, compatibility: COMPAT });
    expect(conn.request("h", "not-an-endpoint", 100, performance.now() + 1_000)).toBe("pending");
    const r = conn.poll();
    expect(r.failed).toHaveLength(1);
    expect(r.failed[0]!.reason).toMatch(/could not start/);
    expect(conn.cache.freeBlocks).toBe(8);
    await conn.close();
  });
});

describe("ConsumerConnector.create checksumThread (crc.ts checksumThreadUsed)", () => {
  it('true: a shared region and the thread only where the CRC-32 is slow, else an ordinary region and inline; "always": the thread', async () => {
    // [checksumThread, measured inline rate (GB/s), thread used]
    const cases: [boolean | "always", number, boolean][] = [
      [true, CHECKSUM_THREAD_MAX_INLINE_GBPS * 2, false],
      [true, CHECKSUM_THREAD_MAX_INLINE_GBPS / 2, true],
      ["always", CHECKSUM_THREAD_MAX_INLINE_GBPS * 2, true],
      [false, CHECKSUM_THREAD_MAX_INLINE_GBPS / 2, false],
    ];
    try {
      for (const [option, gbps, used] of cases) {
        setCrc32InlineGbpsForTest(gbps);
        const conn = await ConsumerConnector.create({
          numBlocks: 8,
          blockBytes: BLOCK,
          compatibility: COMPAT,
          checksumThread: option,
        });
        const shared = conn.cache.region.buffer instanceof SharedArrayBuffer;
        const inUse = (conn.data as SocketDataTransport).checksumThreadInUse;
        await conn.close();
        expect([option, gbps, shared, inUse]).toEqual([option, gbps, used, used]);
      }
    } finally {
      setCrc32InlineGbpsForTest(undefined);
    }
  });
});
