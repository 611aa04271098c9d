// The shm data plane (issue 23, docs/ec-protocol.md 3.4): real unix sockets, real /dev/shm
// mappings through koffi, hand-built frames from the tables for the outsider and hostile cases.
import {
  chmodSync,
  closeSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import * as net from "node:net";
import { join } from "node:path";
import { Registry } from "@tapwire/stats";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { setKoffiRequire } from "../src/data/shm-map.js";
import {
  crc32,
  decodeAgentMetadata,
  EmbeddingCache,
  encodeAgentMetadata,
  encodeMemDescriptor,
  SocketDataTransport,
  syntheticEmbedding,
} from "../src/index.js";
import { socketPath, until } from "./helpers/proc.js";
import { HandConn, handAttach, handAttached, handChunk, handOffer, handRelease } from "./helpers/shm-wire.js";
import { handData, handNotif, handRead } from "./helpers/wire.js";

const BB = 64 * 1024;
const BLOCKS = 64;
const SLOT = 64 * 1024;
/** A read of two blocks, the last one cut (the fake producer's chunks must fit it exactly). */
const N = SLOT + 100;
const te = new TextEncoder();
const dirs: string[] = [];
const open: { close(): unknown }[] = [];

function shmDir(): string {
  const d = mkdtempSync("/dev/shm/ec-shm-test-");
  dirs.push(d);
  return d;
}

afterEach(async () => {
  for (const t of open.splice(0).reverse()) await t.close();
});
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function ringFiles(dir: string): string[] {
  return readdirSync(dir).filter((n) => n.startsWith("tapwire-"));
}

async function producer(dir: string, extra: { maxSessions?: number; slots?: number } = {}) {
  const cache = new EmbeddingCache({ numBlocks: BLOCKS, blockBytes: BB });
  const registry = new Registry();
  const server = await SocketDataTransport.create({
    name: "producer",
    region: cache.region,
    numBlocks: BLOCKS,
    blockBytes: BB,
    listen: `shm+unix://${socketPath("shm")}`,
    shm: { dir, slots: extra.slots ?? 2, slotBytes: SLOT, ...extra },
    registry,
  });
  open.push(server);
  const put = (h: string, n: number, fill?: number) => {
    cache.allocate(h, n);
    const bytes = fill === undefined ? syntheticEmbedding(h, n) : new Uint8Array(n).fill(fill);
    cache.write(h, 0, bytes);
    return { entry: cache.markReady(h), bytes };
  };
  const counter = (name: string) => registry.snapshot().counters[name] ?? 0;
  const gauge = (name: string) => registry.snapshot().gauges[name] ?? 0;
  return { cache, server, put, counter, gauge, path: server.endpoint.slice("unix://".length) };
}

async function consumer(dir: string | null) {
  const cache = new EmbeddingCache({ numBlocks: BLOCKS, blockBytes: BB });
  const registry = new Registry();
  const reader = await SocketDataTransport.create({
    name: "consumer",
    region: cache.region,
    numBlocks: BLOCKS,
    blockBytes: BB,
    registry,
    ...(dir === null ? {} : { shm: { dir } }),
  });
  open.push(reader);
  const counter = (name: string) => registry.snapshot().counters[name] ?? 0;
  return { cache, reader, counter };
}

async function settle(t: SocketDataTransport, h: number): Promise<string> {
  return until(() => {
    const s = t.checkXferState(h);
    return s === "PROC" ? undefined : s;
  });
}

describe("shm data plane (docs/ec-protocol.md 3.4)", () => {
  it("reads granted blocks byte-exact through a 2-slot ring (chunked, CRC of the bytes as received, NOTIF) and unlinks the ring once both hold it", async () => {
    const dir = shmDir();
    const p = await producer(dir);
    const c = await consumer(dir);
    expect(p.server.kind).toBe("shm");
    // advertised as the unix endpoint it also is, plus the metadata key shm = 1
    expect(p.server.endpoint.startsWith("unix://")).toBe(true);
    expect(decodeAgentMetadata(p.server.getAgentMetadata()).shm).toBe(true);
    const agent = c.reader.addRemotePeer(p.server.getAgentMetadata(), p.server.getMemDescriptor());
    for (const n of [1, SLOT - 1, SLOT, 5 * SLOT + 17, 12 * BB]) {
      const h = `h${n}`;
      const { entry, bytes } = p.put(h, n);
      p.server.grant(`s:${h}`, entry.blocks, Number.POSITIVE_INFINITY, n);
      const local = c.cache.allocate(h, n);
      const handle = c.reader.postRead(local, agent, entry.blocks, te.encode(`s:${h}`), {
        nbytes: n,
        checksum: true,
      });
      expect(await settle(c.reader, handle)).toBe("DONE");
      expect(c.reader.getXferChecksum(handle)).toBe(crc32(bytes));
      expect(
        Buffer.from(c.cache.region.subarray(local[0]! * BB, local[0]! * BB + n)).equals(Buffer.from(bytes)),
      ).toBe(true);
      c.reader.releaseXferHandle(handle);
      // EC-CONTRACT 5.2: the notification of the grant's read arrives
      const notifs = await until(() => {
        const m = p.server.getNewNotifs();
        return m.size > 0 ? m : undefined;
      });
      expect([...notifs.values()].flat().map((x) => Buffer.from(x).toString())).toEqual([`s:${h}`]);
    }
    // 1 + 1 + 1 + 6 + 12 chunks of one slot each went through the ring, none over the socket
    expect(c.counter("data_shm_chunks")).toBe(21);
    expect(p.counter("data_shm_chunks")).toBe(21);
    expect(p.gauge("data_shm_sessions")).toBe(1);
    // unlinked once the reader said SHM_ATTACHED: only the two mappings hold it
    expect(ringFiles(dir)).toEqual([]);
  });

  it("a 1.1 reader (no shm) reads from the same server over the socket and never sees an shm frame", async () => {
    const dir = shmDir();
    const p = await producer(dir);
    const { entry, bytes } = p.put("img", 3 * BB + 5);
    p.server.grant("s:img", entry.blocks, Number.POSITIVE_INFINITY, bytes.length);
    // the package's reader without the capability
    const c = await consumer(null);
    const agent = c.reader.addRemotePeer(p.server.getAgentMetadata(), p.server.getMemDescriptor());
    const local = c.cache.allocate("img", bytes.length);
    const h = c.reader.postRead(local, agent, entry.blocks, te.encode("s:img"), {
      nbytes: bytes.length,
      checksum: true,
    });
    expect(await settle(c.reader, h)).toBe("DONE");
    expect(c.reader.getXferChecksum(h)).toBe(crc32(bytes));
    expect(p.counter("data_shm_chunks")).toBe(0);
    // and a reader written from section 3.1 alone: DATA then the raw bytes
    p.server.grant("s:img2", entry.blocks, Number.POSITIVE_INFINITY, bytes.length);
    const meta = p.server.getAgentMetadata();
    const instance = /[0-9a-f]{16}/.exec(Buffer.from(meta).toString("latin1"))![0];
    const hc = new HandConn(p.path);
    open.push({ close: () => hc.destroy() });
    hc.write(
      handRead({ key: "s:img2", reader: "old/1", instance, blocks: entry.blocks, nbytes: bytes.length }),
    );
    await until(() => (hc.of("raw").reduce((a, f) => a + f.bytes, 0) === bytes.length ? true : undefined));
    expect(hc.frames[0]).toEqual({ op: "data", nbytes: bytes.length });
    expect(hc.frames.some((f) => f.op === "offer" || f.op === "chunk")).toBe(false);
    expect(ringFiles(dir)).toEqual([]);
  });

  it("a reader written from the tables sees in its ring only the granted bytes, and the producer never writes a slot not released", async () => {
    const dir = shmDir();
    const p = await producer(dir);
    const granted = p.put("mine", 4 * SLOT); // 4 chunks through a 2-slot ring
    p.put("theirs", 8 * BB, 0xab); // never granted to this reader
    p.server.grant("s:mine", granted.entry.blocks, Number.POSITIVE_INFINITY, granted.bytes.length);
    const meta = Buffer.from(p.server.getAgentMetadata()).toString("latin1");
    const instance = /[0-9a-f]{16}/.exec(meta)![0];
    const hc = new HandConn(p.path);
    open.push({ close: () => hc.destroy() });
    hc.write(handAttach());
    const offer = (await until(() => hc.of("offer")[0]))!;
    expect(offer).toMatchObject({ status: 0, slots: 2, slotBytes: SLOT });
    // the ring is a per-connection file of slots x slot bytes, not the producer's cache region
    const path = join(dir, offer.text);
    expect(statSync(path).size).toBe(2 * SLOT);
    expect(statSync(path).mode & 0o777).toBe(0o600);
    const fd = openSync(path, "r");
    const ring = Buffer.alloc(2 * SLOT);
    const readRing = () => readSync(fd, ring, 0, ring.length, 0);
    try {
      hc.ring = true;
      hc.write(handAttached(0));
      await until(() => (ringFiles(dir).length === 0 ? true : undefined)); // unlinked
      // a READ of another key: refused (EC-CONTRACT 5.3), nothing enters the ring
      hc.write(handRead({ key: "s:theirs", reader: "x", instance, blocks: [4], nbytes: BB }));
      // ... and the connection closes: reconnect for the granted read
      await until(() => (hc.closed ? true : undefined));
      expect(hc.of("error")[0]).toMatchObject({ code: 2 });
      readRing();
      expect(ring.every((b) => b === 0)).toBe(true);

      const hc2 = new HandConn(p.path);
      open.push({ close: () => hc2.destroy() });
      hc2.write(handAttach());
      const offer2 = (await until(() => hc2.of("offer")[0]))!;
      const fd2 = openSync(join(dir, offer2.text), "r");
      try {
        hc2.ring = true;
        hc2.write(handAttached(0));
        hc2.write(
          handRead({
            key: "s:mine",
            reader: "x",
            instance,
            blocks: granted.entry.blocks,
            nbytes: granted.bytes.length,
          }),
        );
        // two slots: two chunks, then the producer waits for a release
        await until(() => (hc2.of("chunk").length === 2 ? true : undefined));
        await new Promise((r) => setTimeout(r, 150));
        expect(hc2.of("chunk").length).toBe(2);
        const r2 = Buffer.alloc(2 * SLOT);
        readSync(fd2, r2, 0, r2.length, 0);
        expect(r2.subarray(0, SLOT).equals(Buffer.from(granted.bytes.subarray(0, SLOT)))).toBe(true);
        expect(r2.subarray(SLOT).equals(Buffer.from(granted.bytes.subarray(SLOT, 2 * SLOT)))).toBe(true);
        expect(hc2.of("chunk")).toEqual([
          { op: "chunk", slot: 0, seq: 1, offset: 0, length: SLOT },
          { op: "chunk", slot: 1, seq: 2, offset: SLOT, length: SLOT },
        ]);
        // releasing chunk 1 frees slot 0 only
        hc2.write(handRelease(0, 1));
        await until(() => (hc2.of("chunk").length === 3 ? true : undefined));
        readSync(fd2, r2, 0, r2.length, 0);
        expect(r2.subarray(0, SLOT).equals(Buffer.from(granted.bytes.subarray(2 * SLOT, 3 * SLOT)))).toBe(
          true,
        );
        expect(r2.subarray(SLOT).equals(Buffer.from(granted.bytes.subarray(SLOT, 2 * SLOT)))).toBe(true);
        hc2.write(handRelease(1, 2));
        await until(() => (hc2.of("chunk").length === 4 ? true : undefined));
        hc2.write(handRelease(0, 3));
        hc2.write(handRelease(1, 4));
        hc2.write(handNotif("s:mine"));
        await until(() => (p.server.getNewNotifs().size > 0 ? true : undefined));
        // never a byte of the ungranted entry in the ring
        readSync(fd2, r2, 0, r2.length, 0);
        expect(r2.includes(Buffer.alloc(64, 0xab))).toBe(false);
      } finally {
        closeSync(fd2);
      }
    } finally {
      closeSync(fd);
    }
  });

  const hostile: [string, (instance: string, blocks: readonly number[]) => Buffer[]][] = [
    ["garbage op 0x0c", () => [Buffer.from([4, 0, 0, 0, 0x0c, 0, 0, 0])]],
    [
      "an SHM_RELEASE of a chunk never posted (replay)",
      () => [handAttach(), handAttached(0), handRelease(0, 1)],
    ],
    ["SHM_ATTACH twice", () => [handAttach(), handAttach()]],
    [
      "a READ before SHM_ATTACHED",
      (instance, blocks) => [
        handAttach(),
        handRead({ key: "s:g", reader: "x", instance, blocks, nbytes: BB }),
      ],
    ],
    [
      "SHM_ATTACH after a READ",
      (instance, blocks) => [
        handRead({ key: "s:g", reader: "x", instance, blocks, nbytes: BB }),
        handAttach(),
      ],
    ],
    ["SHM_ATTACHED without an offer", () => [handAttached(0)]],
    [
      "an SHM_RELEASE with a bad body length",
      () => [handAttach(), handAttached(0), Buffer.from([4, 0, 0, 0, 0x0b, 0, 0, 0])],
    ],
    ["an oversize frame", () => [Buffer.from([0xff, 0xff, 0xff, 0x7f, 0x07])]],
  ];
  for (const [what, frames] of hostile) {
    it(`a doorbell with ${what} closes that connection (data_malformed_frames), unlinks its ring, and the server keeps serving`, async () => {
      const dir = shmDir();
      const p = await producer(dir);
      const { entry, bytes } = p.put("g", BB);
      p.server.grant("s:g", entry.blocks, Number.POSITIVE_INFINITY, BB);
      const instance = /[0-9a-f]{16}/.exec(Buffer.from(p.server.getAgentMetadata()).toString("latin1"))![0];
      const hc = new HandConn(p.path);
      for (const f of frames(instance, entry.blocks)) hc.write(f);
      await until(() => (hc.closed ? true : undefined));
      expect(p.counter("data_malformed_frames")).toBe(1);
      await until(() => (p.gauge("data_shm_sessions") === 0 ? true : undefined));
      expect(ringFiles(dir)).toEqual([]);
      const c = await consumer(dir);
      const agent = c.reader.addRemotePeer(p.server.getAgentMetadata(), p.server.getMemDescriptor());
      p.server.grant("s:g2", entry.blocks, Number.POSITIVE_INFINITY, BB);
      const h = c.reader.postRead(c.cache.allocate("g", BB), agent, entry.blocks, te.encode("s:g2"), {
        checksum: true,
      });
      expect(await settle(c.reader, h)).toBe("DONE");
      expect(c.reader.getXferChecksum(h)).toBe(crc32(bytes));
    });
  }

  it("a flood of SHM_ATTACHes beyond maxSessions is refused in an offer (status 1, the socket serves), memory bounded", async () => {
    const dir = shmDir();
    const p = await producer(dir, { maxSessions: 2 });
    const conns = Array.from({ length: 6 }, () => new HandConn(p.path));
    for (const hc of conns) {
      open.push({ close: () => hc.destroy() });
      hc.write(handAttach());
    }
    const offers = await until(() => {
      const o = conns.map((c) => c.of("offer")[0]);
      return o.every((x) => x !== undefined) ? o : undefined;
    });
    expect(offers.filter((o) => o!.status === 0).length).toBe(2);
    const refused = offers.filter((o) => o!.status === 1);
    expect(refused.length).toBe(4);
    expect(refused[0]!.text).toMatch(/2 rings mapped, limit 2/);
    expect(ringFiles(dir).length).toBe(2);
    expect(p.gauge("data_shm_sessions")).toBe(2);
    for (const hc of conns) hc.destroy();
    await until(() => (p.gauge("data_shm_sessions") === 0 && ringFiles(dir).length === 0 ? true : undefined));
  });
});

describe("shm data plane, reader side against a producer written from the tables (docs/ec-protocol.md 3.4)", () => {
  async function fakeProducer(dir: string, script: (s: net.Socket, name: string) => void) {
    const path = socketPath("fake");
    const name = `tapwire-${process.pid}-${"0123456789abcdef"}`;
    writeFileSync(join(dir, name), Buffer.alloc(2 * SLOT, 7), { mode: 0o600 });
    const srv = net.createServer((s) => {
      s.on("error", () => undefined);
      let sawAttach = false;
      s.on("data", (d: Buffer) => {
        if (!sawAttach && d[4] === 0x07) {
          sawAttach = true;
          script(s, name);
        }
      });
    });
    await new Promise<void>((r) => srv.listen(path, r));
    open.push({ close: () => new Promise<void>((r) => srv.close(() => r())) });
    const meta = encodeAgentMetadata({
      name: "fake",
      instance: "00112233445566aa",
      endpoint: `unix://${path}`,
      shm: true,
    });
    return { meta, desc: encodeMemDescriptor({ numBlocks: BLOCKS, blockBytes: BB }) };
  }

  const bad: [string, (s: net.Socket, name: string) => void][] = [
    [
      "a chunk replayed (seq 1 twice)",
      (s, name) => {
        s.write(handOffer(0, 2, SLOT, name));
        s.write(Buffer.concat([handData(N), handChunk(0, 1, 0, SLOT), handChunk(0, 1, 0, SLOT)]));
      },
    ],
    [
      "a chunk outside its slot",
      (s, name) => {
        s.write(handOffer(0, 2, SLOT, name));
        s.write(Buffer.concat([handData(N), handChunk(0, 1, SLOT, SLOT)]));
      },
    ],
    [
      "a chunk longer than what is left",
      (s, name) => {
        s.write(handOffer(0, 2, SLOT, name));
        s.write(Buffer.concat([handData(N), handChunk(0, 1, 0, SLOT), handChunk(1, 2, SLOT, SLOT)]));
      },
    ],
    [
      "a chunk before DATA",
      (s, name) => {
        s.write(handOffer(0, 2, SLOT, name));
        s.write(handChunk(0, 1, 0, 100));
      },
    ],
    ["an offer of an absurd ring", (s, name) => s.write(handOffer(0, 9999, 12345, name))],
    ["garbage", (s) => s.write(Buffer.from([5, 0, 0, 0, 0x0a, 1, 2, 3, 4]))],
  ];
  for (const [what, script] of bad) {
    it(`${what}: the read is ERR, the connection closed, its ring unmapped, no abort`, async () => {
      const dir = shmDir();
      const f = await fakeProducer(dir, script);
      const c = await consumer(dir);
      const agent = c.reader.addRemotePeer(f.meta, f.desc);
      const h = c.reader.postRead(c.cache.allocate("x", N), agent, [0, 1], te.encode("s:x"), {
        nbytes: N,
        checksum: true,
      });
      expect(await settle(c.reader, h)).toBe("ERR");
      expect(c.reader.getXferError(h)).toMatch(/shm data frame|frame length/);
    });
  }

  it("an offered file that is not private (mode 0644) is declined: SHM_ATTACHED 1, the READ goes out, the socket carries the bytes", async () => {
    const dir = shmDir();
    const got: Buffer[] = [];
    const f = await fakeProducer(dir, (s, name) => {
      s.on("data", (d: Buffer) => got.push(d));
      s.write(handOffer(0, 2, SLOT, name));
    });
    // the fake's file was created 0600; make it 0644 before the offer is read
    const c = await consumer(dir);
    const agent = c.reader.addRemotePeer(f.meta, f.desc);
    const name = ringFiles(dir)[0]!;
    chmodSync(join(dir, name), 0o644);
    c.reader.postRead(c.cache.allocate("x", 100), agent, [0], te.encode("s:x"), { nbytes: 100 });
    const all = await until(() => {
      const b = Buffer.concat(got);
      return b.length >= 8 + 4 ? b : undefined;
    });
    expect([...all.subarray(0, 8)]).toEqual([4, 0, 0, 0, 0x09, 1, 0, 0]);
    expect(all[12]).toBe(0x01); // then the READ
    expect(c.counter("data_shm_fallbacks")).toBe(1);
  });
});

describe("shm data plane fallbacks", () => {
  it("without koffi the producer advertises no shm and the reader reads over the socket (EC_SHM_UNAVAILABLE logged once)", async () => {
    const dir = shmDir();
    setKoffiRequire(() => {
      throw new Error("Cannot find module 'koffi'");
    });
    try {
      const p = await producer(dir);
      const c = await consumer(dir);
      expect(decodeAgentMetadata(p.server.getAgentMetadata()).shm).toBeUndefined();
      const { entry, bytes } = p.put("k", 2 * BB);
      p.server.grant("s:k", entry.blocks, Number.POSITIVE_INFINITY, bytes.length);
      const agent = c.reader.addRemotePeer(p.server.getAgentMetadata(), p.server.getMemDescriptor());
      const h = c.reader.postRead(
        c.cache.allocate("k", bytes.length),
        agent,
        entry.blocks,
        te.encode("s:k"),
        {
          checksum: true,
        },
      );
      expect(await settle(c.reader, h)).toBe("DONE");
      expect(c.reader.getXferChecksum(h)).toBe(crc32(bytes));
      expect(p.counter("data_shm_fallbacks")).toBe(1);
      expect(p.counter("data_shm_chunks")).toBe(0);
    } finally {
      setKoffiRequire();
    }
  });
});
