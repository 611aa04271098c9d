/**
 * Issue 23 (per-byte cost of the data plane): the same-host socket send buffer, the reader's
 * per-chunk CRC-32 over arbitrary chunkings (EC-CONTRACT 6.3), and the shm reader's CRC over the
 * bytes as they landed in the destination.
 */
import type * as net from "node:net";
import { Registry } from "@tapwire/stats";
import fc from "fast-check";
import { afterEach, describe, expect, it } from "vitest";
import { ShmDataReader, ShmReaderConn } from "../src/data/shm-reader.js";
import { shmMetrics } from "../src/data/shm-server.js";
import {
  DEFAULT_SEND_BUFFER_BYTES,
  sameHost,
  setSockbufKoffiForTest,
  TCP_SEND_BUFFER_HEADROOM_BYTES,
} from "../src/data/sockbuf.js";
import { crc32, EmbeddingCache, SocketDataTransport, syntheticEmbedding } from "../src/index.js";
import { silentLogger } from "../src/metrics.js";
import { socketPath, until } from "./helpers/proc.js";

const BB = 4096;
const te = new TextEncoder();
const open: SocketDataTransport[] = [];
afterEach(async () => {
  setSockbufKoffiForTest(null);
  for (const t of open.splice(0)) await t.close();
});

async function pair(listen: string, opts: { chunkBytes?: number; sendBufferBytes?: number } = {}) {
  const sCache = new EmbeddingCache({ numBlocks: 256, blockBytes: BB });
  const cCache = new EmbeddingCache({ numBlocks: 256, blockBytes: BB });
  const server = await SocketDataTransport.create({
    name: "p",
    region: sCache.region,
    numBlocks: 256,
    blockBytes: BB,
    listen,
    ...opts,
  });
  const reader = await SocketDataTransport.create({
    name: "c",
    region: cCache.region,
    numBlocks: 256,
    blockBytes: BB,
  });
  open.push(server, reader);
  const agent = reader.addRemotePeer(server.getAgentMetadata(), server.getMemDescriptor());
  let k = 0;
  const read = async (n: number, fault?: "corrupt") => {
    const h = `h${k++}`;
    sCache.allocate(h, n);
    sCache.write(h, 0, syntheticEmbedding(h, n));
    const e = sCache.markReady(h);
    server.grant(`s:${h}`, e.blocks, Number.POSITIVE_INFINITY, n);
    const local = cCache.allocate(h, n);
    if (fault !== undefined) reader.injectFault({ kind: fault });
    const x = reader.postRead(local, agent, e.blocks, te.encode(`s:${h}`), { nbytes: n, checksum: true });
    const state = await until(() =>
      reader.checkXferState(x) === "PROC" ? undefined : reader.checkXferState(x),
    );
    const crc = reader.getXferChecksum(x);
    reader.releaseXferHandle(x);
    cCache.free(h);
    sCache.free(h);
    return { state, crc, want: e.crc32 };
  };
  return { server, read };
}

describe("same-host socket send buffer (issue 23, src/data/sockbuf.ts)", () => {
  for (const [kind, listen] of [
    ["unix", () => `unix://${socketPath("bytes")}`],
    ["loopback tcp", () => "tcp://127.0.0.1:0"],
  ] as const) {
    it(`${kind}: the data server asks for ${DEFAULT_SEND_BUFFER_BYTES} bytes by default (Linux reports twice)`, async () => {
      const { server, read } = await pair(listen());
      expect(server.sendBufferBytes).toBe(-1); // no connection yet
      expect((await read(3 * BB + 1)).state).toBe("DONE");
      expect(server.sendBufferBytes).toBeGreaterThanOrEqual(DEFAULT_SEND_BUFFER_BYTES);
    });
  }

  it("loopback tcp: the send buffer holds 1 MiB plus its frame headers (headroom over twice the request)", async () => {
    // Without the headroom the kernel reports exactly 2 x 512 KiB, and a corked ACK + DATA + 1 MiB
    // writev leaves its tail behind for tcp's writable wakeup (issue 23, 2026-12-02).
    const { server, read } = await pair("tcp://127.0.0.1:0");
    expect((await read(3 * BB + 1)).state).toBe("DONE");
    expect(TCP_SEND_BUFFER_HEADROOM_BYTES).toBeGreaterThan(0);
    expect(server.sendBufferBytes).toBe(2 * (DEFAULT_SEND_BUFFER_BYTES + TCP_SEND_BUFFER_HEADROOM_BYTES));
    expect(server.sendBufferBytes).toBeGreaterThan(2 * DEFAULT_SEND_BUFFER_BYTES + 4096);
    // unix keeps the exact size
    const u = await pair(`unix://${socketPath("bytes")}`);
    expect((await u.read(BB)).state).toBe("DONE");
    expect(u.server.sendBufferBytes).toBe(2 * DEFAULT_SEND_BUFFER_BYTES);
  });

  it("sendBufferBytes 0 keeps the kernel's default; without koffi nothing is set and reads still work", async () => {
    const a = await pair(`unix://${socketPath("bytes")}`, { sendBufferBytes: 0 });
    expect((await a.read(BB)).state).toBe("DONE");
    expect(a.server.sendBufferBytes).toBe(-1);
    setSockbufKoffiForTest(() => {
      throw new Error("no koffi here");
    });
    const b = await pair(`unix://${socketPath("bytes")}`);
    const r = await b.read(2 * BB);
    expect(r.state).toBe("DONE");
    expect(r.crc).toBe(r.want);
    expect(b.server.sendBufferBytes).toBe(-1);
  });

  it("a remote tcp peer keeps autotuning (no fixed buffer across hosts)", () => {
    const fake = (remoteAddress: string | undefined, remoteFamily: string | undefined) =>
      ({ remoteAddress, remoteFamily }) as unknown as net.Socket;
    expect(sameHost(fake("10.1.2.3", "IPv4"))).toBe(false);
    expect(sameHost(fake("2001:db8::1", "IPv6"))).toBe(false);
    expect(sameHost(fake("127.0.0.1", "IPv4"))).toBe(true);
    expect(sameHost(fake("::1", "IPv6"))).toBe(true);
    expect(sameHost(fake(undefined, undefined))).toBe(true); // unix
  });

  it("an invalid sendBufferBytes is refused", async () => {
    const c = new EmbeddingCache({ numBlocks: 1, blockBytes: BB });
    await expect(
      SocketDataTransport.create({
        name: "x",
        region: c.region,
        numBlocks: 1,
        blockBytes: BB,
        sendBufferBytes: -1,
      }),
    ).rejects.toThrow(/sendBufferBytes/);
  });
});

describe("the reader's per-chunk CRC-32 (EC-CONTRACT 6.3)", () => {
  it("equals the whole-entry CRC over random sizes and server chunkings; a flipped first byte never matches", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 1, max: 200 * BB }),
        fc.integer({ min: 1, max: 64 * 1024 }),
        async (n, chunkBytes) => {
          const { read } = await pair("tcp://127.0.0.1:0", { chunkBytes });
          const ok = await read(n);
          expect(ok.state).toBe("DONE");
          expect(ok.crc).toBe(ok.want);
          const bad = await read(n, "corrupt");
          expect(bad.state).toBe("DONE");
          expect(bad.crc).not.toBe(bad.want);
          for (const t of open.splice(0)) await t.close();
        },
      ),
      { numRuns: 8 },
    );
  });
});

describe("shm reader: the CRC covers the bytes as they landed (docs/ec-protocol.md 3.4)", () => {
  it("a slot rewritten by the producer right after the copy does not pass the check", () => {
    const reader = new ShmDataReader({
      dir: "/dev/shm",
      metrics: shmMetrics(new Registry()),
      logger: silentLogger(),
    });
    const n = 3000;
    const ring = new Uint8Array(8192);
    const sent = syntheticEmbedding("x", n);
    ring.set(sent, 0);
    const st = new ShmReaderConn();
    st.state = "active";
    st.map = { bytes: ring } as unknown as ShmReaderConn["map"];
    st.slots = 2;
    st.slotBytes = 4096;
    st.body = true;
    // The destination's set() is the moment the copy happens: the slot then changes under it
    // (a producer that rewrites a slot it handed over), as if between a CRC of the ring and the copy.
    class Racy extends Uint8Array {
      override set(src: ArrayLike<number>, off?: number): void {
        ring[0] = (ring[0] as number) ^ 0xff;
        super.set(ring.subarray(0, src.length), off);
      }
    }
    const region = new Racy(8192);
    const r = {
      segStart: [0],
      segLen: [n],
      seg: 0,
      segOff: 0,
      nbytes: n,
      received: 0,
      checksum: true,
      crc: 0,
      src: null,
      srcMaxRuns: 1,
    };
    const sock = { write: () => true } as unknown as net.Socket;
    reader.chunk(st, sock, { op: "chunk", slot: 0, seq: 1, offset: 0, length: n }, r, region, false);
    expect(r.received).toBe(n);
    expect(r.crc).toBe(crc32(region.subarray(0, n)));
    expect(r.crc).not.toBe(crc32(sent));
  });
});
