import * as net from "node:net";
import { Registry } from "@tapwire/stats";
import { afterEach, describe, expect, it } from "vitest";
import { setCrc32InlineGbpsForTest } from "../src/crc.js";
import {
  CHECKSUM_THREAD_MAX_INLINE_GBPS,
  crc32,
  crc32Info,
  EcError,
  EmbeddingCache,
  SocketDataTransport,
  syntheticEmbedding,
} from "../src/index.js";
import { socketPath, until } from "./helpers/proc.js";
import { handData, handNotif, handRead } from "./helpers/wire.js";

const BB = 4096;
const KINDS = [
  ["tcp", () => "tcp://127.0.0.1:0"],
  ["unix", () => `unix://${socketPath("data")}`],
  // issue 23: a unix server that also offers shm rings, read through them (docs/ec-protocol.md 3.3)
  ["shm", () => `shm+unix://${socketPath("data")}`],
] as const;

const open: SocketDataTransport[] = [];
afterEach(async () => {
  for (const t of open.splice(0)) await t.close();
});

async function pair(listen: string, serverOpts: { throttleBytesPerSec?: number } = {}) {
  const sCache = new EmbeddingCache({ numBlocks: 128, blockBytes: BB });
  const cCache = new EmbeddingCache({ numBlocks: 128, blockBytes: BB });
  const sReg = new Registry();
  const server = await SocketDataTransport.create({
    name: "producer",
    region: sCache.region,
    numBlocks: 128,
    blockBytes: BB,
    listen,
    registry: sReg,
    chunkBytes: 8192,
    ...serverOpts,
  });
  const reader = await SocketDataTransport.create({
    name: "consumer",
    region: cCache.region,
    numBlocks: 128,
    blockBytes: BB,
    ...(listen.startsWith("shm+") ? { shm: true } : {}),
  });
  open.push(server, reader);
  const agent = reader.addRemotePeer(server.getAgentMetadata(), server.getMemDescriptor());
  const put = (h: string, n: number) => {
    sCache.allocate(h, n);
    sCache.write(h, 0, syntheticEmbedding(h, n));
    return sCache.markReady(h);
  };
  return { sCache, cCache, server, reader, agent, put, sReg };
}

const te = new TextEncoder();

async function settle(t: SocketDataTransport, h: number): Promise<string> {
  return until(() => {
    const s = t.checkXferState(h);
    return s === "PROC" ? undefined : s;
  });
}

for (const [kind, listen] of KINDS) {
  describe(`SocketDataTransport over ${kind} (EC-CONTRACT 5)`, () => {
    it("reads granted blocks byte-exact with an incremental CRC-32 and delivers the notification", async () => {
      const { sCache, cCache, server, reader, agent, put } = await pair(listen());
      expect(server.kind).toBe(kind);
      for (const n of [1, BB - 1, BB, BB + 1, 10 * BB + 17]) {
        const h = `h${n}`;
        const e = put(h, n);
        server.grant(`s:${h}`, e.blocks, Number.POSITIVE_INFINITY);
        const local = cCache.allocate(h, n);
        const handle = reader.postRead(local, agent, e.blocks, te.encode(`s:${h}`), {
          nbytes: n,
          checksum: true,
        });
        expect(await settle(reader, handle)).toBe("DONE");
        expect(reader.getXferChecksum(handle)).toBe(e.crc32);
        expect(reader.releaseXferHandle(handle)).toBe(true);
        cCache.markReady(h);
        expect(Buffer.from(cCache.view(h)).equals(Buffer.from(syntheticEmbedding(h, n)))).toBe(true);
        const notifs = await until(() => {
          const m = server.getNewNotifs();
          return m.size > 0 ? m : undefined;
        });
        expect([...notifs.values()].flat().map((b) => Buffer.from(b).toString())).toEqual([`s:${h}`]);
      }
      expect(sCache.get("h1")!.crc32).toBe(crc32(syntheticEmbedding("h1", 1)));
    });

    it("refuses reads outside a grant: unknown key, other blocks, expired grant, old instance (5.3)", async () => {
      const { cCache, server, reader, agent, put, sReg } = await pair(listen());
      const e = put("img", 3 * BB);
      server.grant("s:img", e.blocks, Number.POSITIVE_INFINITY);
      server.grant("s:old", e.blocks, 0); // already expired
      const local = cCache.allocate("img", 3 * BB);
      const tries: [readonly number[], string][] = [
        [e.blocks, "nobody:img"],
        [[e.blocks[0]!, e.blocks[1]!, e.blocks[2]! + 1], "s:img"],
        [[...e.blocks].reverse(), "s:img"],
        [e.blocks, "s:old"],
      ];
      for (const [blocks, key] of tries) {
        const h = reader.postRead(local, agent, blocks, te.encode(key));
        expect(await settle(reader, h)).toBe("ERR");
        expect(reader.getXferError(h)).toMatch(/^refused: /);
        reader.releaseXferHandle(h);
      }
      expect(sReg.snapshot().counters["data_reads_refused"]).toBe(4);
      // a restarted agent (new instance, same endpoint) refuses reads addressed to the old one
      const meta = { ...server.meta, instance: "0000000000000000" };
      const { encodeAgentMetadata } = await import("../src/index.js");
      const stale = reader.addRemotePeer(encodeAgentMetadata(meta), server.getMemDescriptor());
      const h = reader.postRead(local, stale, e.blocks, te.encode("s:img"));
      expect(await settle(reader, h)).toBe("ERR");
      expect(reader.getXferError(h)).toMatch(/instance_mismatch/);
      // the exact grant still works after all that
      const ok = reader.postRead(local, agent, e.blocks, te.encode("s:img"));
      expect(await settle(reader, ok)).toBe("DONE");
    });

    it("postRead validates its arguments", async () => {
      const { cCache, reader, agent, put } = await pair(listen());
      const e = put("img", 2 * BB);
      const local = cCache.allocate("img", 2 * BB);
      const bad = (fn: () => unknown) => expect(fn).toThrow(EcError);
      bad(() => reader.postRead(local, "nope/123", e.blocks, te.encode("k")));
      bad(() => reader.postRead(local.slice(1), agent, e.blocks, te.encode("k")));
      bad(() => reader.postRead([200, 201], agent, e.blocks, te.encode("k")));
      bad(() => reader.postRead(local, agent, e.blocks, te.encode("k"), { nbytes: BB }));
      bad(() => reader.checkXferState(999));
    });

    it("release on PROC aborts and guarantees no further writes; revoke stops a stream (5.2)", async () => {
      const { cCache, server, reader, agent, put } = await pair(listen(), { throttleBytesPerSec: 400_000 });
      const n = 100 * BB; // ~1 s at the throttle
      const e = put("big", n);
      server.grant("s:big", e.blocks, Number.POSITIVE_INFINITY);
      const local = cCache.allocate("big", n);
      const first = local[0]! * BB;
      cCache.region.fill(0xee, first, first + n);
      const h = reader.postRead(local, agent, e.blocks, te.encode("s:big"));
      // wait until some bytes landed
      await until(() => (cCache.region[first] !== 0xee ? true : undefined));
      expect(reader.checkXferState(h)).toBe("PROC");
      expect(reader.releaseXferHandle(h)).toBe(true);
      const snap = Buffer.from(cCache.region.subarray(first, first + n));
      await new Promise((r) => setTimeout(r, 150));
      expect(Buffer.from(cCache.region.subarray(first, first + n)).equals(snap)).toBe(true);
      expect(snap.includes(0xee)).toBe(true); // it really was cut short
      // revoke while streaming: the reader sees ERR
      const h2 = reader.postRead(local, agent, e.blocks, te.encode("s:big"));
      await until(() => (server.grantCount === 1 ? true : undefined));
      await new Promise((r) => setTimeout(r, 30));
      server.revoke("s:big");
      expect(await settle(reader, h2)).toBe("ERR");
    });

    it("a lost notification leaves the connection usable; garbage frames are dropped and counted", async () => {
      const { cCache, server, reader, agent, put, sReg } = await pair(listen());
      const e = put("img", BB);
      server.grant("s:img", e.blocks, Number.POSITIVE_INFINITY);
      const local = cCache.allocate("img", BB);
      reader.injectFault({ kind: "lost_notification" });
      const h1 = reader.postRead(local, agent, e.blocks, te.encode("s:img"));
      expect(await settle(reader, h1)).toBe("DONE");
      reader.releaseXferHandle(h1);
      const h2 = reader.postRead(local, agent, e.blocks, te.encode("s:img"));
      expect(await settle(reader, h2)).toBe("DONE");
      await until(() => (sReg.snapshot().counters["data_notifications"] === 1 ? true : undefined));
      // random bytes, bad lengths, malformed msgpack, unknown ops, and a notification for no read
      const target = server.endpoint.startsWith("unix://")
        ? { path: server.endpoint.slice(7) }
        : { host: "127.0.0.1", port: Number(server.endpoint.split(":").pop()) };
      const frame = (b: Uint8Array) => Buffer.concat([Buffer.from([b.length, 0, 0, 0]), Buffer.from(b)]);
      const beRead = handRead({ key: "s:img", blocks: e.blocks, nbytes: BB, reader: "x", instance: "y" });
      beRead.writeUInt32BE(beRead.readUInt32LE(0), 0);
      const garbage = [
        Buffer.from([0xff, 0xff, 0xff, 0xff, 1, 2, 3]),
        frame(new Uint8Array([0xc1, 0xc1])),
        frame(new Uint8Array([0x09, 0, 0, 0])), // unknown op
        handRead({ key: "", blocks: [0], nbytes: 1, reader: "x", instance: "y" }), // key_len 0
        handNotif("s:img"), // no finished read on this connection
        Buffer.from([0, 0, 0, 0]),
        beRead, // a 1.0-style big-endian length prefix
      ];
      for (const g of garbage) {
        const s = net.connect(target as net.NetConnectOpts);
        s.on("error", () => {});
        s.write(g);
        await new Promise((r) => s.on("close", r));
      }
      expect(sReg.snapshot().counters["data_malformed_frames"]).toBe(garbage.length);
      const h3 = reader.postRead(local, agent, e.blocks, te.encode("s:img"));
      expect(await settle(reader, h3)).toBe("DONE");
    });

    it("checksumThread: the worker's CRC-32 equals the producer's and catches corruption", async () => {
      const sCache = new EmbeddingCache({ numBlocks: 512, blockBytes: BB });
      const cCache = new EmbeddingCache({ numBlocks: 512, blockBytes: BB, shared: true });
      const server = await SocketDataTransport.create({
        name: "p",
        region: sCache.region,
        numBlocks: 512,
        blockBytes: BB,
        listen: listen(),
      });
      const reader = await SocketDataTransport.create({
        name: "c",
        region: cCache.region,
        numBlocks: 512,
        blockBytes: BB,
        checksumThread: "always",
      });
      open.push(server, reader);
      const agent = reader.addRemotePeer(server.getAgentMetadata(), server.getMemDescriptor());
      const n = 300 * BB + 5; // several batches of landed ranges
      sCache.allocate("big", n);
      sCache.write("big", 0, syntheticEmbedding("big", n));
      const e = sCache.markReady("big");
      server.grant("s:big", e.blocks, Number.POSITIVE_INFINITY);
      const local = cCache.allocate("big", n);
      const h = reader.postRead(local, agent, e.blocks, te.encode("s:big"), { nbytes: n, checksum: true });
      expect(await settle(reader, h)).toBe("DONE");
      expect(reader.getXferChecksum(h)).toBe(e.crc32);
      // the thread uses the same implementation as this thread (its first message says which)
      expect(reader.checksumThreadCrcImpl).toBe(crc32Info.impl);
      reader.injectFault({ kind: "corrupt" });
      const h2 = reader.postRead(local, agent, e.blocks, te.encode("s:big"), { nbytes: n, checksum: true });
      expect(await settle(reader, h2)).toBe("DONE");
      expect(reader.getXferChecksum(h2)).not.toBe(e.crc32);
      await expect(
        SocketDataTransport.create({
          name: "x",
          region: sCache.region,
          numBlocks: 512,
          blockBytes: BB,
          checksumThread: true,
        }),
      ).rejects.toThrow(/checksumThread/);
    });

    it('checksumThread: true takes the thread only while the CRC-32 runs below CHECKSUM_THREAD_MAX_INLINE_GBPS; "always" regardless', async () => {
      const sCache = new EmbeddingCache({ numBlocks: 512, blockBytes: BB });
      const server = await SocketDataTransport.create({
        name: "p",
        region: sCache.region,
        numBlocks: 512,
        blockBytes: BB,
        listen: listen(),
      });
      open.push(server);
      const n = 300 * BB + 5; // several batches of landed ranges
      sCache.allocate("big", n);
      sCache.write("big", 0, syntheticEmbedding("big", n));
      const e = sCache.markReady("big");
      server.grant("s:big", e.blocks, Number.POSITIVE_INFINITY);
      // [checksumThread, measured inline rate (GB/s), thread used]
      const cases: [true | "always", number, boolean][] = [
        [true, CHECKSUM_THREAD_MAX_INLINE_GBPS * 2, false],
        [true, CHECKSUM_THREAD_MAX_INLINE_GBPS / 2, true],
        ["always", CHECKSUM_THREAD_MAX_INLINE_GBPS * 2, true],
      ];
      try {
        for (const [option, gbps, used] of cases) {
          setCrc32InlineGbpsForTest(gbps);
          const cCache = new EmbeddingCache({ numBlocks: 512, blockBytes: BB, shared: true });
          const reader = await SocketDataTransport.create({
            name: "c",
            region: cCache.region,
            numBlocks: 512,
            blockBytes: BB,
            checksumThread: option,
          });
          open.push(reader);
          expect([option, gbps, reader.checksumThreadInUse]).toEqual([option, gbps, used]);
          const agent = reader.addRemotePeer(server.getAgentMetadata(), server.getMemDescriptor());
          const local = cCache.allocate("big", n);
          const h = reader.postRead(local, agent, e.blocks, te.encode("s:big"), {
            nbytes: n,
            checksum: true,
          });
          expect(await settle(reader, h)).toBe("DONE");
          expect(reader.getXferChecksum(h)).toBe(e.crc32);
          // the thread starts with the first range handed to it: never when the CRC stays inline
          expect([option, gbps, reader.checksumThreadCrcImpl !== null]).toEqual([option, gbps, used]);
          // inline, corruption is still caught
          reader.injectFault({ kind: "corrupt" });
          const h2 = reader.postRead(local, agent, e.blocks, te.encode("s:big"), {
            nbytes: n,
            checksum: true,
          });
          expect(await settle(reader, h2)).toBe("DONE");
          expect(reader.getXferChecksum(h2)).not.toBe(e.crc32);
        }
      } finally {
        setCrc32InlineGbpsForTest(undefined);
      }
      await expect(
        SocketDataTransport.create({
          name: "x",
          region: sCache.region,
          numBlocks: 512,
          blockBytes: BB,
          checksumThread: "always",
        }),
      ).rejects.toThrow(/checksumThread/);
    });

    it("the server reassembles a READ frame fed one byte at a time", async () => {
      const { server, put } = await pair(listen());
      const e = put("img", 100);
      server.grant("s:img", e.blocks, Number.POSITIVE_INFINITY);
      const frame = handRead({
        key: "s:img",
        blocks: e.blocks,
        nbytes: 100,
        reader: "raw",
        instance: server.meta.instance,
      });
      const target = server.endpoint.startsWith("unix://")
        ? { path: server.endpoint.slice(7) }
        : { host: "127.0.0.1", port: Number(server.endpoint.split(":").pop()) };
      const s = net.connect(target as net.NetConnectOpts);
      s.setNoDelay(true);
      const got: Buffer[] = [];
      s.on("data", (d: Buffer) => got.push(d));
      for (const b of frame) {
        s.write(Buffer.from([b]));
        await new Promise((r) => setTimeout(r, 1));
      }
      const all = await until(() => {
        const b = Buffer.concat(got);
        return b.length >= 4 && b.length >= 4 + b.readUInt32LE(0) + 100 ? b : undefined;
      });
      const hdr = 4 + all.readUInt32LE(0);
      expect(
        Buffer.from(all.subarray(hdr, hdr + 100)).equals(Buffer.from(syntheticEmbedding("img", 100))),
      ).toBe(true);
      s.destroy();
    });

    it("a reader fed garbage by a fake data server ends ERR without crashing", async () => {
      const cache = new EmbeddingCache({ numBlocks: 8, blockBytes: BB });
      const answers = [
        Buffer.from("HTTP/1.1 400 Bad Request\r\n\r\n"),
        Buffer.concat([Buffer.from([2, 0, 0, 0]), Buffer.from([0xc1, 0xc1])]),
        Buffer.concat([Buffer.from([3, 0, 0, 0]), Buffer.from([0x09, 0, 0])]), // unknown op
        handData(5), // wrong size
        Buffer.concat([Buffer.from([0, 0, 0, 12]), handData(100).subarray(4)]), // big-endian length
      ];
      let i = 0;
      const fake = net.createServer((s) => {
        s.on("error", () => {});
        s.once("data", () => s.end(answers[i++ % answers.length]!));
      });
      const path = socketPath("fake");
      const endpoint = kind !== "tcp" ? `unix://${path}` : "tcp://127.0.0.1:0";
      await new Promise<void>((r) =>
        kind !== "tcp" ? fake.listen(path, r) : fake.listen(0, "127.0.0.1", r),
      );
      const addr = fake.address();
      const ep = typeof addr === "object" && addr !== null ? `tcp://127.0.0.1:${addr.port}` : endpoint;
      const reader = await SocketDataTransport.create({
        name: "c",
        region: cache.region,
        numBlocks: 8,
        blockBytes: BB,
      });
      open.push(reader);
      const { encodeAgentMetadata, encodeMemDescriptor } = await import("../src/index.js");
      const agent = reader.addRemotePeer(
        encodeAgentMetadata({ name: "fake", instance: "1", endpoint: ep }),
        encodeMemDescriptor({ numBlocks: 8, blockBytes: BB }),
      );
      for (let k = 0; k < answers.length; k++) {
        const h = reader.postRead([k], agent, [0], te.encode("s:x"));
        expect(await settle(reader, h)).toBe("ERR");
        reader.releaseXferHandle(h);
      }
      await new Promise<void>((r) => fake.close(() => r()));
    });
  });
}
