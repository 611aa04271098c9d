import * as net from "node:net";
import * as zlib from "node:zlib";
import { Registry } from "@tapwire/stats";
import { afterEach, describe, expect, it } from "vitest";
import { Dealer } from "zeromq";
import { decodeFlatMap } from "../src/flat-msgpack.js";
import {
  ConsumerConnector,
  EcProducer,
  EmbeddingCache,
  encodeXferReq,
  SocketDataTransport,
  syntheticEmbedding,
} from "../src/index.js";
import { Driver } from "./helpers/drive.js";
import { until } from "./helpers/proc.js";
import type { HandFrame } from "./helpers/wire.js";
import { handNotif, handRead, handReadAhead, handReadRawInstance, parseServerFrame } from "./helpers/wire.js";

// Issue 23 item 4: every point an outside reader of docs/ec-protocol.md 3.1 had to guess, decided
// there and proven here with frames built by hand from the tables (helpers/wire.ts), against the
// real data server; and the read-ahead capability of 3.2 (frames from its table, then a real
// producer and consumer).
const BB = 4096;
const NB = 32;
const open: SocketDataTransport[] = [];
afterEach(async () => {
  for (const t of open.splice(0)) await t.close();
});

async function server(now?: () => number) {
  const cache = new EmbeddingCache({ numBlocks: NB, blockBytes: BB });
  const registry = new Registry();
  const t = await SocketDataTransport.create({
    name: "producer",
    region: cache.region,
    numBlocks: NB,
    blockBytes: BB,
    listen: "tcp://127.0.0.1:0",
    registry,
    ...(now === undefined ? {} : { now }),
  });
  open.push(t);
  const put = (h: string, n: number) => {
    cache.allocate(h, n);
    cache.write(h, 0, syntheticEmbedding(h, n));
    return cache.markReady(h);
  };
  return { t, put, registry };
}

function rawClient(endpoint: string) {
  const s = net.connect({ host: "127.0.0.1", port: Number(endpoint.split(":").pop()) });
  s.on("error", () => {});
  let buf = Buffer.alloc(0);
  let closed = false;
  s.on("data", (d: Buffer) => {
    buf = Buffer.concat([buf, d]);
  });
  s.on("close", () => {
    closed = true;
  });
  return {
    s,
    get closed() {
      return closed;
    },
    get pending() {
      return buf.length;
    },
    async next(): Promise<{ f: HandFrame; body: Buffer }> {
      const f = await until(() => parseServerFrame(buf));
      const need = f.size + (f.op === "data" ? f.nbytes : 0);
      await until(() => buf.length >= need || undefined);
      const body = Buffer.from(buf.subarray(f.size, need));
      buf = buf.subarray(need);
      return { f, body };
    },
  };
}

async function refusedWith(endpoint: string, frame: Buffer): Promise<number> {
  const c = rawClient(endpoint);
  c.s.write(frame);
  const { f } = await c.next();
  await until(() => c.closed || undefined);
  return f.op === "error" ? f.code : -1;
}

describe("docs/ec-protocol.md 3.1 as an outsider reads it (issue 23)", () => {
  it("CRC-32 (zlib) covers exactly the DATA's nbytes bytes and equals the ack's crc32 (the entry's)", async () => {
    const { t, put } = await server();
    const n = 2 * BB + 77;
    const e = put("img", n);
    t.grant("s:img", e.blocks, Number.POSITIVE_INFINITY, n);
    const c = rawClient(t.endpoint);
    c.s.write(
      handRead({ key: "s:img", reader: "r", instance: t.meta.instance, blocks: e.blocks, nbytes: n }),
    );
    const { f, body } = await c.next();
    expect(f).toMatchObject({ op: "data", nbytes: n });
    expect(zlib.crc32(body)).toBe(e.crc32);
    c.s.destroy();
  });

  it("READ nbytes is the ack's nbytes: a whole-block read of the same blocks is refused with ERROR 5", async () => {
    const { t, put } = await server();
    const e = put("img", BB + 10);
    t.grant("s:img", e.blocks, Number.POSITIVE_INFINITY, BB + 10);
    const read = { key: "s:img", reader: "r", instance: t.meta.instance, blocks: e.blocks };
    expect(await refusedWith(t.endpoint, handRead({ ...read, nbytes: 2 * BB }))).toBe(5);
  });

  it("nbytes 0 is refused with ERROR 5 (bad_nbytes), not a silent close", async () => {
    const { t, put } = await server();
    const e = put("img", 100);
    t.grant("s:img", e.blocks, Number.POSITIVE_INFINITY, 100);
    const read = { key: "s:img", reader: "r", instance: t.meta.instance, blocks: e.blocks };
    expect(await refusedWith(t.endpoint, handRead({ ...read, nbytes: 0 }))).toBe(5);
  });

  it("instance is the 16 hex characters; the 8 raw bytes get ERROR 1 (instance_mismatch)", async () => {
    const { t, put } = await server();
    const e = put("img", 100);
    t.grant("s:img", e.blocks, Number.POSITIVE_INFINITY, 100);
    expect(t.meta.instance).toMatch(/^[0-9a-f]{16}$/);
    const raw = Buffer.from(t.meta.instance, "hex");
    const f = handReadRawInstance({
      key: "s:img",
      reader: "r",
      instance: raw,
      blocks: e.blocks,
      nbytes: 100,
    });
    expect(await refusedWith(t.endpoint, f)).toBe(1);
  });

  it("ERROR 3 (expired) for a lapsed grant not yet swept; ERROR 2 (no_grant) once the sweep revoked it", async () => {
    let clock = 1_000;
    const { t, put } = await server(() => clock);
    const e = put("img", 100);
    t.grant("s:img", e.blocks, 1_500, 100);
    clock = 2_000;
    const read = handRead({
      key: "s:img",
      reader: "r",
      instance: t.meta.instance,
      blocks: e.blocks,
      nbytes: 100,
    });
    expect(await refusedWith(t.endpoint, read)).toBe(3);
    t.revoke("s:img"); // what the producer's sweep does to a lapsed lease (EC-CONTRACT 4.4)
    expect(await refusedWith(t.endpoint, read)).toBe(2);
  });

  it("reader is a free-form label (0..512 UTF-8 bytes): notifications are reported under it as sent", async () => {
    const { t, put } = await server();
    const e = put("img", 100);
    t.grant("s:img", e.blocks, Number.POSITIVE_INFINITY, 100);
    const c = rawClient(t.endpoint);
    const label = "not name/instance at all ✓";
    c.s.write(
      handRead({ key: "s:img", reader: label, instance: t.meta.instance, blocks: e.blocks, nbytes: 100 }),
    );
    expect((await c.next()).f.op).toBe("data");
    c.s.write(handNotif("s:img"));
    const notifs = await until(() => {
      const m = t.getNewNotifs();
      return m.size > 0 ? m : undefined;
    });
    expect([...notifs.keys()]).toEqual([label]);
    c.s.destroy();
  });

  it("a READ longer than the server's own largest READ (here body_len 1 048 576) is closed without an ERROR, counted", async () => {
    const { t, registry } = await server();
    const c = rawClient(t.endpoint);
    const head = Buffer.alloc(8);
    head.writeUInt32LE(1_048_576, 0);
    head[4] = 0x01;
    c.s.write(head);
    await until(() => c.closed || undefined);
    expect(c.pending).toBe(0); // no ERROR frame
    expect(registry.snapshot().counters["data_malformed_frames"]).toBe(1);
  });

  it("NOTIF follows the last byte, before the reader's CRC check: a corrupted read still ends the lease", async () => {
    const { t, put } = await server();
    const cCache = new EmbeddingCache({ numBlocks: NB, blockBytes: BB });
    const reader = await SocketDataTransport.create({
      name: "consumer",
      region: cCache.region,
      numBlocks: NB,
      blockBytes: BB,
    });
    open.push(reader);
    const agent = reader.addRemotePeer(t.getAgentMetadata(), t.getMemDescriptor());
    const e = put("img", 3000);
    t.grant("s:img", e.blocks, Number.POSITIVE_INFINITY, 3000);
    reader.injectFault({ kind: "corrupt" }, 1);
    const h = reader.postRead([5], agent, e.blocks, Buffer.from("s:img"), { nbytes: 3000, checksum: true });
    await until(() => (reader.checkXferState(h) === "DONE" ? true : undefined));
    expect(reader.getXferChecksum(h)).not.toBe(e.crc32); // the reader's check fails…
    const notifs = await until(() => {
      const m = t.getNewNotifs();
      return m.size > 0 ? m : undefined;
    });
    expect([...notifs.values()].flat().map((b) => Buffer.from(b).toString())).toEqual(["s:img"]); // …the lease ends
    reader.releaseXferHandle(h);
  });
});

describe("read-ahead (docs/ec-protocol.md 3.2), frames from its table", () => {
  it("a READ_AHEAD before the grant waits, and is served with the grant's blocks once it exists", async () => {
    const { t, put, registry } = await server();
    const n = BB + 500;
    const e = put("img", n);
    const c = rawClient(t.endpoint);
    c.s.write(
      handReadAhead({ key: "s:img", reader: "r", instance: t.meta.instance, nbytes: n, waitMs: 5_000 }),
    );
    await until(() => (registry.snapshot().counters["data_read_ahead_waited"] === 1 ? true : undefined));
    expect(c.pending).toBe(0); // nothing served without a grant (EC-CONTRACT 5.3)
    t.grant("s:img", e.blocks, Number.POSITIVE_INFINITY, n);
    const { f, body } = await c.next();
    expect(f).toMatchObject({ op: "data", nbytes: n });
    expect(body.equals(Buffer.from(syntheticEmbedding("img", n)))).toBe(true);
    c.s.write(handNotif("s:img"));
    await until(() => (t.getNewNotifs().size > 0 ? true : undefined));
    c.s.destroy();
  });

  it("refusals as for READ: other instance 1, no grant within wait_ms 2, nbytes not the grant's 5; a frame while waiting closes", async () => {
    const { t, put, registry } = await server();
    const e = put("img", 100);
    const ra = (o: Partial<Parameters<typeof handReadAhead>[0]>) =>
      handReadAhead({
        key: "s:img",
        reader: "r",
        instance: t.meta.instance,
        nbytes: 100,
        waitMs: 5_000,
        ...o,
      });
    expect(await refusedWith(t.endpoint, ra({ instance: "0000000000000000" }))).toBe(1);
    expect(await refusedWith(t.endpoint, ra({ key: "s:none", waitMs: 30 }))).toBe(2);
    t.grant("s:img", e.blocks, Number.POSITIVE_INFINITY, 100);
    expect(await refusedWith(t.endpoint, ra({ nbytes: BB }))).toBe(5);
    const c = rawClient(t.endpoint);
    c.s.write(ra({ key: "s:later" }));
    c.s.write(handNotif("s:later"));
    await until(() => c.closed || undefined);
    expect(registry.snapshot().counters["data_malformed_frames"]).toBe(1);
    expect(registry.snapshot().counters["data_read_ahead_served"] ?? 0).toBe(0);
  });

  it("a real consumer reads ahead after its first ack; a 1.1 XferReq (no read_ahead) gets an ack without the key", async () => {
    const n = 3 * BB + 9;
    const producer = await EcProducer.start({
      numBlocks: 64,
      blockBytes: BB,
      data: "tcp://127.0.0.1:0",
      prepopulate: [
        ["a", n],
        ["b", n],
        ["c", n],
      ],
    });
    const conn = await ConsumerConnector.create({
      numBlocks: 64,
      blockBytes: BB,
      compatibility: producer.compatibilityHash,
      registry: new Registry(),
      readAhead: true,
      dataRequests: false, // 3.2 / 3.3 (3.5: test/data-requests.test.ts)
    });
    const d = new Driver(conn).start();
    const old = new Dealer({ linger: 0 });
    try {
      for (const h of ["a", "b", "c"])
        expect(await d.fetch(h, producer.controlEndpoint, n, 10_000)).toBe("loaded");
      expect(d.mismatched).toEqual([]);
      const cc = conn.registry.snapshot().counters;
      expect(cc["consumer_read_aheads"]).toBe(2); // the first transfer learns the capability
      expect(cc["consumer_read_ahead_fallbacks"] ?? 0).toBe(0);
      expect(producer.registry.snapshot().counters["data_read_ahead_served"]).toBe(2);
      old.connect(producer.controlEndpoint);
      await old.send(
        encodeXferReq({
          mmHash: "a",
          compatibilityHash: producer.compatibilityHash,
          sessionId: "old",
          connectorVersion: 2,
        }),
      );
      const [ack] = await old.receive();
      const m = decodeFlatMap(ack!, "ack", { arrays: new Set(["src_block_indices"]) });
      expect(m["status"]).toBe(0);
      expect(Object.hasOwn(m, "read_ahead")).toBe(false);
    } finally {
      old.close();
      d.stop();
      await conn.close();
      await producer.close();
    }
  });

  it("consumer side: a NACK releases the read-ahead (blocks back, no byte lands); a failed read-ahead falls back to a READ once", async () => {
    const n = 2 * BB + 3;
    const producer = await EcProducer.start({
      numBlocks: 64,
      blockBytes: BB,
      data: "tcp://127.0.0.1:0",
      prepopulate: [
        ["a", n],
        ["b", n],
        ["c", n],
      ],
    });
    const conn = await ConsumerConnector.create({
      numBlocks: 16,
      blockBytes: BB,
      compatibility: producer.compatibilityHash,
      registry: new Registry(),
      readAhead: true,
      dataRequests: false, // 3.2 / 3.3 (3.5: test/data-requests.test.ts)
    });
    const d = new Driver(conn).start();
    try {
      expect(await d.fetch("a", producer.controlEndpoint, n, 10_000)).toBe("loaded"); // learns the offer
      const free = conn.cache.freeBlocks;
      // NACK_MISSING while a READ_AHEAD for it waits at the producer: released, blocks freed.
      expect(await d.fetch("missing", producer.controlEndpoint, n, 10_000)).toMatch(/MISSING|missing/);
      expect(conn.cache.freeBlocks).toBe(free);
      expect(conn.registry.snapshot().counters["consumer_read_aheads"]).toBe(1);
      // A read-ahead that breaks (aborted before its first byte) is replaced by a READ after the ack.
      (conn.data as SocketDataTransport).injectFault({ kind: "abort" }, 1);
      expect(await d.fetch("b", producer.controlEndpoint, n, 10_000)).toBe("loaded");
      expect(conn.registry.snapshot().counters["consumer_read_ahead_fallbacks"]).toBe(1);
      expect(await d.fetch("c", producer.controlEndpoint, n, 10_000)).toBe("loaded");
      expect(d.mismatched).toEqual([]);
      conn.cache.check();
    } finally {
      d.stop();
      await conn.close();
      await producer.close();
    }
  });
});
