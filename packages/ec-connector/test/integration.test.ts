import * as net from "node:net";
import { encode } from "@msgpack/msgpack";
import { Registry } from "@tapwire/stats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Dealer, Router } from "zeromq";
import {
  ConsumerConnector,
  crc32Info,
  decodeXferAck,
  EcAdminClient,
  encodeXferAck,
  encodeXferReq,
  nackAck,
  SocketDataTransport,
  XferStatus,
} from "../src/index.js";
import { Driver } from "./helpers/drive.js";
import type { ProducerProc } from "./helpers/proc.js";
import { socketPath, spawnProducer, until } from "./helpers/proc.js";

const BB = 65_536;
const KiB = 1024;
const MiB = 1024 * 1024;
const SIZES: [string, number][] = [
  ["s-1k", KiB],
  ["s-64k+1", 64 * KiB + 1],
  ["s-1m", MiB],
  ["s-16m", 16 * MiB],
  ["s-64m", 64 * MiB],
];

async function stats(admin: EcAdminClient) {
  const s = (await admin.stats()) as {
    metrics: { counters: Record<string, number>; gauges: Record<string, number> };
    cache: { freeBlocks: number; pinnedBlocks: number };
    grants: number;
    dataGrants: number;
  };
  return s;
}

function dataTarget(endpoint: string): net.NetConnectOpts {
  return endpoint.startsWith("unix://")
    ? { path: endpoint.slice("unix://".length) }
    : { host: "127.0.0.1", port: Number(endpoint.split(":").pop()) };
}

// shm (issue 23): the unix data server that also offers rings, read through them (docs/ec-protocol.md 3.3)
for (const kind of ["tcp", "unix", "shm"] as const) {
  describe(`tapwire-ec-producer + ConsumerConnector in separate processes, ZeroMQ + ${kind} data plane`, () => {
    let prod: ProducerProc;
    let admin: EcAdminClient;
    let conn: ConsumerConnector;
    let driver: Driver;
    let registry: Registry;
    let initialFree = 0;

    beforeAll(async () => {
      const data =
        kind === "tcp"
          ? "tcp://127.0.0.1:0"
          : `${kind === "shm" ? "shm+unix" : "unix"}://${socketPath("int")}`;
      prod = await spawnProducer([
        "--data",
        data,
        "--num-blocks",
        "1400",
        "--block-bytes",
        String(BB),
        "--pin-lease-ms",
        "1500",
        "--prepopulate",
        SIZES.map(([h, n]) => `${h}:${n}`).join(","),
        "--log-level",
        "warn",
      ]);
      admin = new EcAdminClient(prod.admin);
      registry = new Registry();
      conn = await ConsumerConnector.create({
        numBlocks: 1400,
        blockBytes: BB,
        compatibility: prod.compatibilityHash,
        registry,
        ...(kind === "shm" ? { dataShm: true } : {}),
      });
      initialFree = conn.cache.freeBlocks;
      driver = new Driver(conn).start();
    });

    afterAll(async () => {
      driver.stop();
      await conn.close();
      admin.close();
      expect((await prod.kill("SIGTERM")).code).toBe(0); // clean exit on SIGTERM
    });

    it(`transfers 1 KiB .. 64 MiB byte-identical, CRC-32 checked (EC-CONTRACT 5, 6.3, 8)`, async () => {
      expect(prod.data.startsWith(`${kind === "shm" ? "unix" : kind}://`)).toBe(true);
      for (const [h, n] of SIZES) {
        expect(await driver.fetch(h, prod.control, n)).toBe("loaded");
        // shm: the bytes came through the ring, not the socket (docs/ec-protocol.md 3.3)
        if (kind === "shm") expect(registry.snapshot().counters["data_shm_chunks"] ?? 0).toBeGreaterThan(0);
        expect(conn.cache.get(h)!.nbytes).toBe(n);
      }
      expect(driver.mismatched).toEqual([]);
      const c = registry.snapshot().counters;
      expect(c["consumer_reads_completed"]).toBe(SIZES.length);
      expect(c["consumer_checksum_failures"]).toBe(0);
      // completions reach the producer: every grant released, nothing pinned
      await until(async () => ((await stats(admin)).cache.pinnedBlocks === 0 ? true : undefined));
      const s = await stats(admin);
      expect(s.grants).toBe(0);
      expect(s.metrics.counters["producer_completions"]).toBe(SIZES.length);
      for (const [h] of SIZES) conn.free(h);
      expect(conn.cache.freeBlocks).toBe(initialFree);
      conn.cache.check();
    });

    it(`a byte corrupted on the wire is caught by the inline CRC-32 (${crc32Info.impl}) and never promoted (EC-CONTRACT 6.3, 8)`, async () => {
      const before = registry.snapshot().counters["consumer_checksum_failures"] ?? 0;
      (conn.data as SocketDataTransport).injectFault({ kind: "corrupt" });
      expect(await driver.fetch("s-1m", prod.control, MiB)).toMatch(/checksum/);
      expect(conn.cache.get("s-1m")).toBeUndefined();
      expect(registry.snapshot().counters["consumer_checksum_failures"]).toBe(before + 1);
      // the next (clean) read of the same entry is promoted byte-identical
      expect(await driver.fetch("s-1m", prod.control, MiB)).toBe("loaded");
      expect(driver.mismatched).toEqual([]);
      conn.free("s-1m");
    });

    it("a lost notification is cleaned up by the producer's lease (EC-CONTRACT 4.4)", async () => {
      const before = (await stats(admin)).metrics.counters["producer_lease_expiries"] ?? 0;
      (conn.data as SocketDataTransport).injectFault({ kind: "lost_notification" });
      expect(await driver.fetch("s-1m", prod.control, MiB)).toBe("loaded");
      expect((await stats(admin)).cache.pinnedBlocks).toBeGreaterThan(0);
      await until(
        async () => ((await stats(admin)).cache.pinnedBlocks === 0 ? true : undefined),
        10_000,
        "lease expiry",
      );
      const s = await stats(admin);
      expect(s.metrics.counters["producer_lease_expiries"]).toBe(before + 1);
      expect(s.dataGrants).toBe(0);
      conn.free("s-1m");
    });

    it("reads outside a grant are refused by the producer's data server (EC-CONTRACT 5.3)", async () => {
      const dealer = new Dealer({ linger: 0 });
      dealer.connect(prod.control);
      await dealer.send(
        encodeXferReq({
          mmHash: "s-1k",
          compatibilityHash: prod.compatibilityHash,
          sessionId: "probe",
          connectorVersion: 2,
        }),
      );
      const [raw] = await dealer.receive();
      const ack = decodeXferAck(raw!, 1400);
      expect(ack.status).toBe(XferStatus.OK);
      const reader = await SocketDataTransport.create({
        name: "probe",
        region: conn.cache.region,
        numBlocks: 1400,
        blockBytes: BB,
      });
      const agent = reader.addRemotePeer(ack.agentMetadata, ack.memDescriptor);
      const local = [1399];
      const key = new TextEncoder().encode("probe:s-1k");
      const tryRead = async (blocks: number[], k: Uint8Array) => {
        const h = reader.postRead(local, agent, blocks, k, { nbytes: KiB });
        return until(() => {
          const st = reader.checkXferState(h);
          return st === "PROC" ? undefined : st;
        });
      };
      const refusedBefore = (await stats(admin)).metrics.counters["data_reads_refused"] ?? 0;
      expect(await tryRead([ack.srcBlockIndices[0]! + 1], key)).toBe("ERR");
      expect(await tryRead(ack.srcBlockIndices, new TextEncoder().encode("other:s-1k"))).toBe("ERR");
      expect(await tryRead(ack.srcBlockIndices, key)).toBe("DONE");
      expect((await stats(admin)).metrics.counters["data_reads_refused"]).toBe(refusedBefore + 2);
      await reader.close();
      dealer.close();
      await until(async () => ((await stats(admin)).grants === 0 ? true : undefined));
    });

    it("malformed msgpack and random bytes on both planes never crash the producer", async () => {
      const before = (await stats(admin)).metrics.counters;
      const dealer = new Dealer({ linger: 0 });
      dealer.connect(prod.control);
      const garbage: (Uint8Array | Uint8Array[])[] = [
        new Uint8Array([0xc1]),
        new Uint8Array([0x92, 0x01]), // truncated array
        encode([1, 2, 3]),
        encode({ mm_hash: "x" }),
        encode({ mm_hash: "x", compatibility_hash: "y", session_id: "z", connector_version: true }),
        encode({ op: "nonsense" }),
        [encode({}), encode({})],
      ];
      for (let i = 0; i < 20; i++)
        garbage.push(Uint8Array.from({ length: 1 + ((i * 37) % 200) }, (_, k) => (k * 131 + i) & 0xff));
      for (const g of garbage) await dealer.send(Array.isArray(g) ? g : [g]);
      const sockGarbage = [
        Buffer.from("GET / HTTP/1.1\r\n\r\n"),
        Buffer.from([0, 0, 0, 3, 0xc1, 0xc1, 0xc1]),
        Buffer.alloc(64, 0xff),
      ];
      for (const g of sockGarbage) {
        const s = net.connect(dataTarget(prod.data));
        s.on("error", () => {});
        s.write(g);
        await new Promise((r) => s.on("close", r));
      }
      // still serving
      expect(await driver.fetch("s-64k+1", prod.control, 64 * KiB + 1)).toBe("loaded");
      conn.free("s-64k+1");
      const after = (await stats(admin)).metrics.counters;
      expect(
        after["producer_malformed_messages"]! - (before["producer_malformed_messages"] ?? 0),
      ).toBeGreaterThanOrEqual(25);
      expect(after["data_malformed_frames"]! - (before["data_malformed_frames"] ?? 0)).toBe(
        sockGarbage.length,
      );
      dealer.close();
      expect(await admin.check()).toBeNull();
    });
  });
}

describe("a consumer fed garbage by a fake producer (control plane)", () => {
  it("drops malformed acks, counts them, and still acts on the valid NACK", async () => {
    const router = new Router({ linger: 0 });
    await router.bind("tcp://127.0.0.1:0");
    const registry = new Registry();
    const conn = await ConsumerConnector.create({
      numBlocks: 16,
      blockBytes: BB,
      compatibility: "0".repeat(64),
      registry,
    });
    const driver = new Driver(conn).start();
    void (async () => {
      for await (const [id] of router) {
        for (const g of [
          new Uint8Array([0xc1]),
          encode("x"),
          encode({ mm_hash: "h", status: 99 }),
          new Uint8Array(300).fill(7),
        ]) {
          await router.send([id!, g]);
        }
        await router.send([id!, encodeXferAck(nackAck("h", XferStatus.NACK_MISSING))]);
      }
    })();
    expect(await driver.fetch("h", router.lastEndpoint!, 100)).toBe("NACK_MISSING");
    expect(registry.snapshot().counters["consumer_malformed_messages"]).toBe(4);
    driver.stop();
    await conn.close();
    router.close();
    expect(conn.cache.freeBlocks).toBe(16);
  });
});

describe("process faults", () => {
  it("producer killed mid-read and restarted: the read fails cleanly, a later one loads (re-registered)", async () => {
    const args = [
      "--num-blocks",
      "600",
      "--block-bytes",
      String(BB),
      "--prepopulate",
      `big:${16 * MiB}`,
      "--log-level",
      "warn",
    ];
    const p1 = await spawnProducer([...args, "--throttle-bps", String(8 * MiB)]);
    const registry = new Registry();
    const conn = await ConsumerConnector.create({
      numBlocks: 600,
      blockBytes: BB,
      compatibility: p1.compatibilityHash,
      registry,
    });
    const initialFree = conn.cache.freeBlocks;
    const driver = new Driver(conn).start();
    const outcome = driver.fetch("big", p1.control, 16 * MiB);
    await until(() => ((registry.snapshot().counters["data_received_bytes"] ?? 0) > MiB ? true : undefined));
    await p1.kill("SIGKILL");
    expect(await outcome).not.toBe("loaded");
    // EC-CONTRACT 8: once settled, the free count is back and nothing is detached
    await until(() =>
      conn.cache.freeBlocks === initialFree && conn.cache.detachedBlocks === 0 ? true : undefined,
    );
    conn.cache.check();
    // restart on the same endpoints: new instance id, same addresses
    const p2 = await spawnProducer([...args, "--control", p1.control, "--data", p1.data]);
    expect(p2.control).toBe(p1.control);
    expect(await driver.fetch("big", p2.control, 16 * MiB)).toBe("loaded");
    expect(driver.mismatched).toEqual([]);
    driver.stop();
    await conn.close();
    await p2.kill();
  });

  it("consumer killed mid-read: the producer's lease expiry unpins (EC-CONTRACT 4.4, 4.5)", async () => {
    const p = await spawnProducer([
      "--num-blocks",
      "600",
      "--block-bytes",
      String(BB),
      "--prepopulate",
      `big:${16 * MiB}`,
      "--throttle-bps",
      String(4 * MiB),
      "--pin-lease-ms",
      "800",
      "--log-level",
      "warn",
    ]);
    const admin = new EcAdminClient(p.admin);
    const child = await spawnProducer(
      [p.control, p.compatibilityHash, "big", String(16 * MiB)],
      new URL("./helpers/consumer-child.mjs", import.meta.url).pathname,
    );
    await until(async () => ((await stats(admin)).grants === 1 ? true : undefined), 20_000, "grant");
    await child.kill("SIGKILL");
    await until(
      async () => ((await stats(admin)).cache.pinnedBlocks === 0 ? true : undefined),
      20_000,
      "unpin",
    );
    const s = await stats(admin);
    expect(s.metrics.counters["producer_lease_expiries"]).toBe(1);
    expect(s.grants).toBe(0);
    expect(await admin.check()).toBeNull();
    admin.close();
    await p.kill();
  });

  it("a frozen producer is detected by ZeroMQ heartbeats: the read is quarantined, then settles", async () => {
    const p = await spawnProducer([
      "--num-blocks",
      "400",
      "--block-bytes",
      String(BB),
      "--prepopulate",
      `big:${8 * MiB}`,
      "--throttle-bps",
      String(4 * MiB),
      "--log-level",
      "warn",
    ]);
    const registry = new Registry();
    const conn = await ConsumerConnector.create({
      numBlocks: 400,
      blockBytes: BB,
      compatibility: p.compatibilityHash,
      registry,
      heartbeat: { intervalMs: 100, timeoutMs: 300, ttlMs: 1000 },
    });
    const initialFree = conn.cache.freeBlocks;
    const driver = new Driver(conn).start();
    const outcome = driver.fetch("big", p.control, 8 * MiB);
    await until(() => ((registry.snapshot().counters["data_received_bytes"] ?? 0) > 0 ? true : undefined));
    p.child.kill("SIGSTOP");
    const reason = await outcome;
    expect(reason).toMatch(/quarantined/);
    expect(registry.snapshot().counters["consumer_peer_down"]).toBeGreaterThanOrEqual(1);
    expect(conn.cache.detachedBlocks).toBe(128); // kept while the read may still land
    p.child.kill("SIGCONT");
    await until(() => (conn.cache.detachedBlocks === 0 ? true : undefined), 30_000, "settle");
    expect(registry.snapshot().counters["consumer_settles"]).toBe(1);
    expect(conn.cache.freeBlocks).toBe(initialFree);
    driver.stop();
    await conn.close();
    await p.kill();
  });
});
