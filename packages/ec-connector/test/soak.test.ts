import * as net from "node:net";
import { Registry } from "@tapwire/stats";
import { expect, it } from "vitest";
import { Dealer } from "zeromq";
import type { SocketDataTransport } from "../src/index.js";
import { ConsumerConnector, EcAdminClient } from "../src/index.js";
import { Driver } from "./helpers/drive.js";
import { socketPath, spawnProducer, until } from "./helpers/proc.js";

/** `pnpm test:soak` runs 5,000 transfers; the normal suite a bounded 300. */
const N = process.env["EC_SOAK"] === "1" ? 5_000 : 300;
const SEED = Number(process.env["EC_SOAK_SEED"] ?? 20_260_601);
const BB = 16_384;
const CONCURRENCY = 8;
const POOL = 64;
const MISS_NBYTES = 20_000;

function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

interface ProducerStats {
  metrics: { counters: Record<string, number>; gauges: Record<string, number> };
  cache: { freeBlocks: number; pinnedBlocks: number };
  grants: number;
}

it(`soak: ${N} transfers with random faults end with the invariants of EC-CONTRACT 8 (seed ${SEED})`, {
  timeout: 600_000,
}, async () => {
  const rnd = mulberry32(SEED);
  const sizes = new Map<string, number>();
  for (let i = 0; i < POOL; i++) sizes.set(`pool-${i}`, 1 + Math.floor(rnd() * 256 * 1024));
  const common = ["--block-bytes", String(BB), "--pin-lease-ms", "400", "--log-level", "error"];
  // A: tcp data plane, encodes requested-but-missing hashes after a delay (NOT_READY, then OK).
  const a = await spawnProducer([
    ...common,
    "--num-blocks",
    "4096",
    "--encode-on-miss",
    "--miss-nbytes",
    String(MISS_NBYTES),
    "--encode-delay-ms",
    "5",
  ]);
  // B: unix data plane, a fixed pool; anything else is NACK_MISSING.
  const b = await spawnProducer([
    ...common,
    "--num-blocks",
    "1200",
    "--data",
    `unix://${socketPath("soak")}`,
    "--prepopulate",
    [...sizes].map(([h, n]) => `${h}:${n}`).join(","),
  ]);
  expect(a.compatibilityHash).toBe(b.compatibilityHash);
  const adminA = new EcAdminClient(a.admin);
  const adminB = new EcAdminClient(b.admin);
  const initialFreeB = ((await adminB.stats()) as unknown as ProducerStats).cache.freeBlocks;

  const registry = new Registry();
  const conn = await ConsumerConnector.create({
    numBlocks: 256, // 4 MiB: small enough that LRU eviction runs
    blockBytes: BB,
    compatibility: a.compatibilityHash,
    ackTimeoutMs: 300,
    readTimeoutMs: 150,
    quarantineTimeoutMs: 400,
    registry,
  });
  const data = conn.data as SocketDataTransport;
  const initialFree = conn.cache.freeBlocks;

  // EC-CONTRACT 8: a block a read may still write (its handle is PROC and not released) is never
  // reallocated. Checked after every poll of the run, not only at the end: every read posted is
  // recorded with its local blocks until its handle is released, and no cache entry other than
  // the read's own allocation may hold one of those blocks while the read is PROC.
  const inflight = new Map<number, { mmHash: string; blocks: readonly number[] }>();
  const postRead = data.postRead.bind(data);
  data.postRead = (local, agent, remote, notif, options) => {
    const h = postRead(local, agent, remote, notif, options);
    const key = new TextDecoder().decode(notif);
    inflight.set(h, { mmHash: key.slice(key.indexOf(":") + 1), blocks: [...local] });
    return h;
  };
  // Issue 23: read-ahead is the default, so most reads are posted here (docs/ec-protocol.md 3.2).
  const postReadAhead = data.postReadAhead.bind(data);
  data.postReadAhead = (local, agent, notif, options) => {
    const h = postReadAhead(local, agent, notif, options);
    const key = new TextDecoder().decode(notif);
    inflight.set(h, { mmHash: key.slice(key.indexOf(":") + 1), blocks: [...local] });
    return h;
  };
  // docs/ec-protocol.md 3.5: with requests on the data connection (the default), most reads are here.
  const postRequest = data.postRequest.bind(data);
  data.postRequest = (local, agent, notif, options) => {
    const h = postRequest(local, agent, notif, options);
    const key = new TextDecoder().decode(notif);
    inflight.set(h, { mmHash: key.slice(key.indexOf(":") + 1), blocks: [...local] });
    return h;
  };
  const releaseHandle = data.releaseXferHandle.bind(data);
  data.releaseXferHandle = (h) => {
    inflight.delete(h);
    return releaseHandle(h);
  };
  const violations: string[] = [];
  let detachedProcSeen = 0;
  const checkInflight = (): void => {
    for (const [h, r] of inflight) {
      if (data.checkXferState(h) !== "PROC") continue;
      const mine = new Set(r.blocks);
      let underItsKey = false;
      for (const k of conn.cache.keys()) {
        const held = conn.cache.get(k)!.blocks;
        const same =
          k === r.mmHash && held.length === r.blocks.length && held.every((b, i) => b === r.blocks[i]);
        if (same) underItsKey = true;
        else if (held.some((b) => mine.has(b)))
          violations.push(`${k} holds a block of the PROC read of ${r.mmHash}`);
      }
      if (!underItsKey) detachedProcSeen++;
    }
  };
  const connPoll = conn.poll.bind(conn);
  conn.poll = (now?: number) => {
    const r = now === undefined ? connPoll() : connPoll(now);
    checkInflight();
    return r;
  };
  const driver = new Driver(conn).start(1);
  const garbageDealer = new Dealer({ linger: 0 });
  garbageDealer.connect(b.control);

  // at least one of each kind of garbage, whatever the dice say
  await garbageDealer.send(new Uint8Array([0xc1, 0x00]));
  await new Promise<void>((resolve) => {
    const s = net.connect({ path: b.data.slice("unix://".length) });
    s.on("error", () => {});
    s.on("close", () => resolve());
    s.end(Buffer.from([0, 0, 0, 3, 0xc1, 0xc1, 0xc1]));
  });

  let issued = 0;
  const outcomes = { loaded: 0, failed: 0 };
  const worker = async (w: number) => {
    for (;;) {
      const i = issued++;
      if (i >= N) return;
      const r = rnd();
      // random faults on the consumer's next read, and garbage on both of B's planes
      if (r < 0.1) data.injectFault({ kind: "lost_notification" });
      else if (r < 0.14)
        data.injectFault({ kind: "stall", ms: 300 }); // > read timeout: quarantine, then settle
      else if (r < 0.16)
        data.injectFault({ kind: "stall", ms: 900 }); // > quarantine timeout: released
      else if (r < 0.2) data.injectFault({ kind: "abort" });
      else if (r < 0.24) data.injectFault({ kind: "corrupt" });
      else if (r < 0.26)
        void garbageDealer.send(Uint8Array.from({ length: 1 + (i % 50) }, (_, k) => (k * 7 + i) & 0xff));
      else if (r < 0.27) {
        const s = net.connect({ path: b.data.slice("unix://".length) });
        s.on("error", () => {});
        s.end(Buffer.from([0, 0, 0, 3, 0xc1, 0xc1, 0xc1]));
      }
      let h: string;
      let producer: string;
      let n: number;
      const pick = rnd();
      if (pick < 0.3) {
        h = `miss-${i}`;
        producer = a.control;
        n = MISS_NBYTES;
      } else if (pick < 0.35) {
        h = `absent-${i}`;
        producer = b.control;
        n = 1000;
      } else {
        const k = w + CONCURRENCY * Math.floor(rnd() * (POOL / CONCURRENCY)); // disjoint per worker
        h = `pool-${k}`;
        producer = b.control;
        n = sizes.get(h)!;
      }
      driver.sizes.set(h, n);
      const out = await driver.fetch(h, producer, n, 3_000);
      if (out === "loaded") {
        outcomes.loaded++;
        // keep some entries so the small cache has to evict (LRU) for later allocations
        if (rnd() < 0.5 && conn.cache.isReady(h) && (conn.cache.get(h)?.pins ?? 0) === 0) conn.free(h);
      } else {
        outcomes.failed++;
      }
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, (_, w) => worker(w)));
  // At least one corrupted read that carries bytes, whatever the dice say: a queued fault goes to
  // the next read of any worker, and a miss or an absent item (a final NACK, docs/ec-protocol.md
  // 3.5) can take it; under load all of them sometimes did (CI, 2026-12-02).
  for (
    let tries = 0;
    tries < 5 && (registry.snapshot().counters["consumer_checksum_failures"] ?? 0) === 0;
    tries++
  ) {
    const h = `pool-${tries}`;
    if (conn.cache.isReady(h) && (conn.cache.get(h)?.pins ?? 0) === 0) conn.free(h);
    data.injectFault({ kind: "corrupt" });
    driver.sizes.set(h, sizes.get(h)!);
    await driver.fetch(h, b.control, sizes.get(h)!, 3_000);
  }

  // Let quarantined reads settle and leases expire, then check EC-CONTRACT 8 on both sides.
  await until(
    () => (conn.pendingCount === 0 && conn.cache.detachedBlocks === 0 ? true : undefined),
    30_000,
    "drain",
  );
  driver.stop();
  for (const k of conn.cache.keys()) conn.free(k);
  conn.cache.check();
  expect(conn.cache.retiredBlocks).toBe(0); // socket releases always guarantee no further writes
  expect(conn.cache.freeBlocks).toBe(initialFree);
  expect(violations).toEqual([]);
  expect(driver.mismatched).toEqual([]);
  expect(detachedProcSeen).toBeGreaterThan(0); // quarantined reads still PROC were really checked
  expect(outcomes.loaded + outcomes.failed).toBe(N);
  for (const admin of [adminA, adminB]) {
    await until(
      async () => {
        const s = (await admin.stats()) as unknown as ProducerStats;
        return s.grants === 0 && s.cache.pinnedBlocks === 0 ? true : undefined;
      },
      10_000,
      "producer pins released",
    );
    expect(await admin.check()).toBeNull();
  }
  const sb = (await adminB.stats()) as unknown as ProducerStats;
  expect(sb.cache.freeBlocks).toBe(initialFreeB);
  conn.poll(); // refresh the gauges after the frees above
  const snap = registry.snapshot();
  const c = snap.counters;
  // the stats the issue lists, on both sides: they exist and agree with the end state
  for (const name of [
    "consumer_requests",
    "consumer_nacks_missing",
    "consumer_nacks_not_ready",
    "consumer_nacks_incompat",
    "consumer_nacks_version",
    "consumer_nacks_internal",
    "consumer_ack_timeouts",
    "consumer_reads",
    "consumer_read_bytes",
    "consumer_quarantines",
    "consumer_settles",
    "consumer_evictions",
    "consumer_malformed_messages",
  ]) {
    expect(c, name).toHaveProperty(name);
  }
  expect(snap.histograms["consumer_read_seconds"]?.count).toBe(c["consumer_reads_completed"]);
  expect(snap.gauges["consumer_free_blocks"]).toBe(initialFree);
  expect(snap.gauges["consumer_pinned_blocks"]).toBe(0);
  for (const name of [
    "producer_requests",
    "producer_grants",
    "producer_nacks_missing",
    "producer_nacks_not_ready",
    "producer_nacks_incompat",
    "producer_nacks_version",
    "producer_nacks_internal",
    "producer_lease_expiries",
    "producer_evictions",
    "producer_malformed_messages",
    "data_reads_served",
    "data_sent_bytes",
  ]) {
    expect(sb.metrics.counters, name).toHaveProperty(name);
  }
  expect(sb.metrics.gauges["producer_pinned_blocks"]).toBe(0);
  expect(sb.metrics.gauges["producer_free_blocks"]).toBe(initialFreeB);
  // the faults really happened
  expect(c["consumer_checksum_failures"]).toBeGreaterThan(0);
  expect(c["consumer_quarantines"]).toBeGreaterThan(0);
  expect(c["consumer_nacks_not_ready"]).toBeGreaterThan(0);
  expect(c["consumer_nacks_missing"]).toBeGreaterThan(0);
  expect(c["consumer_evictions"]).toBeGreaterThan(0);
  expect(sb.metrics.counters["producer_lease_expiries"]).toBeGreaterThan(0);
  expect(sb.metrics.counters["producer_malformed_messages"]).toBeGreaterThan(0);
  expect(sb.metrics.counters["data_malformed_frames"]).toBeGreaterThan(0);
  console.log(
    JSON.stringify(
      { soak: { n: N, seed: SEED, ...outcomes, consumer: c, producerB: sb.metrics.counters } },
      null,
      0,
    ),
  );

  garbageDealer.close();
  adminA.close();
  adminB.close();
  await conn.close();
  expect((await a.kill()).code).toBe(0);
  expect((await b.kill()).code).toBe(0);
});
