import { readFile } from "node:fs/promises";
import * as net from "node:net";
import { Registry } from "@tapwire/stats";
import { afterEach, describe, expect, it, vi } from "vitest";
import { EmbeddingCache, SocketDataTransport, syntheticEmbedding } from "../src/index.js";
import { until } from "./helpers/proc.js";
import type { HandFrame } from "./helpers/wire.js";
import { handNotif, handRead, parseServerFrame } from "./helpers/wire.js";

// docs/ec-protocol.md "Data plane wire format" (normative): frames built by hand from its byte
// tables, against the real data server.
const BB = 4096;
const open: SocketDataTransport[] = [];
afterEach(async () => {
  for (const t of open.splice(0)) await t.close();
});

async function server() {
  const cache = new EmbeddingCache({ numBlocks: 32, blockBytes: BB });
  const registry = new Registry();
  const t = await SocketDataTransport.create({
    name: "producer",
    region: cache.region,
    numBlocks: 32,
    blockBytes: BB,
    listen: "tcp://127.0.0.1:0",
    registry,
  });
  open.push(t);
  const put = (h: string, n: number) => {
    cache.allocate(h, n);
    cache.write(h, 0, syntheticEmbedding(h, n));
    return cache.markReady(h);
  };
  return { t, put, registry };
}

/** A raw client: collects bytes, parses frames by the tables. */
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
    /** The next frame and, for DATA, its body bytes. */
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

describe("data plane wire format (docs/ec-protocol.md, little-endian, EC-CONTRACT 5.3)", () => {
  it("the document's example READ equals the hand-built frame", async () => {
    const doc = await readFile(new URL("../../../docs/ec-protocol.md", import.meta.url), "utf8");
    const hex = /^`(20 00 00 00 01 [0-9a-f ]+)`/m.exec(doc)?.[1];
    expect(hex).toBeDefined();
    const hand = handRead({ key: "s:h", reader: "c/1", instance: "ab", blocks: [7], nbytes: 100 });
    expect(hand.toString("hex")).toBe(hex!.replaceAll(" ", ""));
  });

  it("a hand-built READ is served: DATA header, the block bytes, then a NOTIF completes the grant", async () => {
    const { t, put } = await server();
    const n = 2 * BB + 100; // three blocks, the last partly used
    const e = put("img", n);
    t.grant("sess:img", e.blocks, Number.POSITIVE_INFINITY);
    const c = rawClient(t.endpoint);
    c.s.write(
      handRead({ key: "sess:img", reader: "hand/1", instance: t.meta.instance, blocks: e.blocks, nbytes: n }),
    );
    const { f, body } = await c.next();
    expect(f).toEqual({ op: "data", nbytes: n, size: 16 });
    expect(body.equals(Buffer.from(syntheticEmbedding("img", n)))).toBe(true);
    c.s.write(handNotif("sess:img"));
    const notifs = await until(() => {
      const m = t.getNewNotifs();
      return m.size > 0 ? m : undefined;
    });
    expect([...notifs.keys()]).toEqual(["hand/1"]);
    expect(Buffer.from(notifs.get("hand/1")![0]!).toString()).toBe("sess:img");
    // the same connection serves the next READ
    c.s.write(
      handRead({ key: "sess:img", reader: "hand/1", instance: t.meta.instance, blocks: e.blocks, nbytes: n }),
    );
    expect((await c.next()).f.op).toBe("data");
    c.s.destroy();
  });

  it("refusals are ERROR frames with the table's codes, then the server closes", async () => {
    const { t, put, registry } = await server();
    const e = put("img", 100);
    t.grant("sess:img", e.blocks, Number.POSITIVE_INFINITY);
    const cases: [Parameters<typeof handRead>[0], number][] = [
      [{ key: "sess:img", reader: "r", instance: "other", blocks: e.blocks, nbytes: 100 }, 1],
      [{ key: "sess:none", reader: "r", instance: t.meta.instance, blocks: e.blocks, nbytes: 100 }, 2],
      [{ key: "sess:img", reader: "r", instance: t.meta.instance, blocks: [31], nbytes: 100 }, 4],
      [{ key: "sess:img", reader: "r", instance: t.meta.instance, blocks: e.blocks, nbytes: BB + 1 }, 5],
    ];
    for (const [read, code] of cases) {
      const c = rawClient(t.endpoint);
      c.s.write(handRead(read));
      const { f } = await c.next();
      expect(f.op === "error" && f.code).toBe(code);
      await until(() => c.closed || undefined);
    }
    expect(registry.snapshot().counters["data_reads_refused"]).toBe(cases.length);
  });

  it("a big-endian length prefix (the 1.0 format) is a malformed frame: closed and counted", async () => {
    const { t, put, registry } = await server();
    const e = put("img", 100);
    t.grant("sess:img", e.blocks, Number.POSITIVE_INFINITY);
    const f = handRead({
      key: "sess:img",
      reader: "r",
      instance: t.meta.instance,
      blocks: e.blocks,
      nbytes: 100,
    });
    f.writeUInt32BE(f.readUInt32LE(0), 0);
    const c = rawClient(t.endpoint);
    c.s.write(f);
    await until(() => c.closed || undefined);
    expect(registry.snapshot().counters["data_malformed_frames"]).toBe(1);
  });

  it("an allocation failure while buffering a frame closes that connection, counted; the server serves on (EC-CONTRACT 9.5)", async () => {
    const { t, put, registry } = await server();
    const e = put("img", 100);
    t.grant("sess:img", e.blocks, Number.POSITIVE_INFINITY);
    const f = handRead({
      key: "sess:img",
      reader: "r",
      instance: t.meta.instance,
      blocks: e.blocks,
      nbytes: 100,
    });
    const c = rawClient(t.endpoint);
    c.s.write(f.subarray(0, 10));
    await new Promise((r) => setTimeout(r, 50)); // the server holds the first 10 bytes
    const spy = vi.spyOn(Buffer, "concat").mockImplementationOnce(() => {
      throw new RangeError("Array buffer allocation failed");
    });
    try {
      c.s.write(f.subarray(10));
      await until(() => c.closed || undefined);
    } finally {
      spy.mockRestore();
    }
    expect(registry.snapshot().counters["data_alloc_failures"]).toBe(1);
    const ok = rawClient(t.endpoint);
    ok.s.write(f);
    expect((await ok.next()).f.op).toBe("data");
    ok.s.destroy();
  });
});
