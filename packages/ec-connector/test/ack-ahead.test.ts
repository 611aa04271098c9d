import * as net from "node:net";
import * as zlib from "node:zlib";
import { decode, encode } from "@msgpack/msgpack";
import { Registry } from "@tapwire/stats";
import { afterEach, describe, expect, it } from "vitest";
import { Dealer } from "zeromq";
import {
  ConsumerConnector,
  ConsumerSession,
  EC_CONNECTOR_VERSION,
  EcProducer,
  EmbeddingCache,
  encodeXferAck,
  SocketDataTransport,
  syntheticEmbedding,
  XferStatus,
} from "../src/index.js";
import { Driver } from "./helpers/drive.js";
import { until } from "./helpers/proc.js";
import type { HandFrame } from "./helpers/wire.js";
import { handAck, handData, handNotif, handRead, handReadAhead, parseServerFrame } from "./helpers/wire.js";

// Issue 23 item 1, docs/ec-protocol.md 3.3 (ack-ahead): the XferAck of a read-ahead transfer
// travels as an ACK frame before DATA on the READ_AHEAD's connection, and then not on ZeroMQ; the
// request's `xfer_id` tells its ack from a late one; a READ_AHEAD never rides a grant whose
// notification arrived. Frames are built by hand from the tables (helpers/wire.ts); the server and
// the producer are the real ones.
const BB = 4096;
const NB = 32;
const open: { close(): Promise<void> | void }[] = [];
afterEach(async () => {
  for (const t of open.splice(0).reverse()) await t.close();
});

async function server() {
  const cache = new EmbeddingCache({ numBlocks: NB, blockBytes: BB });
  const registry = new Registry();
  const t = await SocketDataTransport.create({
    name: "producer",
    region: cache.region,
    numBlocks: NB,
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
  const counter = (name: string) => registry.snapshot().counters[name] ?? 0;
  return { t, put, counter };
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
  open.push({ close: () => void s.destroy() });
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

const ackOf = (mmHash: string, xferId: number) =>
  encodeXferAck({
    mmHash,
    status: XferStatus.OK,
    sessionId: "s",
    srcBlockIndices: [0],
    agentMetadata: new Uint8Array([1]),
    memDescriptor: new Uint8Array([2]),
    nbytes: 10,
    crc32: 0,
    xferId,
  });

describe("data server (docs/ec-protocol.md 3.3, frames from the tables)", () => {
  it("a waiting READ_AHEAD with ack_first gets ACK (the grant's ack bytes) then DATA, served by grantAck itself", async () => {
    const { t, put, counter } = await server();
    const n = BB + 77;
    const e = put("img", n);
    const c = rawClient(t.endpoint);
    c.s.write(
      handReadAhead({
        key: "s:img",
        reader: "r",
        instance: t.meta.instance,
        nbytes: n,
        waitMs: 5_000,
        flags: 1,
      }),
    );
    await until(() => (counter("data_read_ahead_waited") === 1 ? true : undefined));
    t.grant("s:img", e.blocks, Number.POSITIVE_INFINITY, n);
    const ack = ackOf("img", 7);
    // Served synchronously: the bytes are handed to the socket before grantAck returns.
    expect(t.grantAck("s:img", ack)).toBe(true);
    expect(counter("data_ack_frames")).toBe(1);
    const a = await c.next();
    expect(a.f.op).toBe("ack");
    expect(a.f.op === "ack" && Buffer.compare(a.f.ack, Buffer.from(ack))).toBe(0);
    const d = await c.next();
    expect(d.f).toMatchObject({ op: "data", nbytes: n });
    expect(Buffer.compare(d.body, Buffer.from(syntheticEmbedding("img", n)))).toBe(0);
  });

  it("without ack_first no ACK frame is sent and grantAck reports nothing delivered; unknown flag bits close the connection", async () => {
    const { t, put, counter } = await server();
    const n = 100;
    const e = put("img", n);
    const c = rawClient(t.endpoint);
    c.s.write(
      handReadAhead({ key: "s:img", reader: "r", instance: t.meta.instance, nbytes: n, waitMs: 5_000 }),
    );
    await until(() => (counter("data_read_ahead_waited") === 1 ? true : undefined));
    t.grant("s:img", e.blocks, Number.POSITIVE_INFINITY, n);
    expect(t.grantAck("s:img", ackOf("img", 1))).toBe(false);
    const d = await c.next();
    expect(d.f).toMatchObject({ op: "data", nbytes: n });
    expect(counter("data_ack_frames")).toBe(0);
    const bad = rawClient(t.endpoint);
    bad.s.write(
      handReadAhead({
        key: "s:img",
        reader: "r",
        instance: t.meta.instance,
        nbytes: n,
        waitMs: 5_000,
        flags: 2,
      }),
    );
    await until(() => bad.closed || undefined);
    expect(counter("data_malformed_frames")).toBe(1);
    expect(bad.pending).toBe(0);
  });

  it("a READ_AHEAD right behind the notification of its key's last read waits for the next grant (never served under the notified one)", async () => {
    const { t, put, counter } = await server();
    const n = 2 * BB + 5;
    const e = put("img", n);
    t.grant("s:img", e.blocks, Number.POSITIVE_INFINITY, n);
    const c = rawClient(t.endpoint);
    c.s.write(
      handRead({ key: "s:img", reader: "r", instance: t.meta.instance, blocks: e.blocks, nbytes: n }),
    );
    expect((await c.next()).f).toMatchObject({ op: "data", nbytes: n });
    // One segment: the notification of that read, and the next request's READ_AHEAD (same key).
    c.s.write(
      Buffer.concat([
        handNotif("s:img"),
        handReadAhead({
          key: "s:img",
          reader: "r",
          instance: t.meta.instance,
          nbytes: n,
          waitMs: 5_000,
          flags: 1,
        }),
      ]),
    );
    await until(() => (counter("data_read_ahead_waited") === 1 ? true : undefined));
    expect(counter("data_notifications")).toBe(1);
    expect(c.pending).toBe(0);
    // The producer's step ends the old grant and makes the next one: only now is it served.
    t.revoke("s:img");
    t.grant("s:img", e.blocks, Number.POSITIVE_INFINITY, n);
    expect(t.grantAck("s:img", ackOf("img", 2))).toBe(true);
    expect((await c.next()).f.op).toBe("ack");
    expect((await c.next()).f).toMatchObject({ op: "data", nbytes: n });
  });
});

/** A data server written from the tables: answers each READ_AHEAD as `answer` says. */
async function fakeServer(answer: (readAhead: Buffer, s: net.Socket) => void) {
  const seen: Buffer[] = [];
  const srv = net.createServer((s) => {
    let buf = Buffer.alloc(0);
    s.on("error", () => {});
    s.on("data", (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 4 && buf.length >= 4 + buf.readUInt32LE(0)) {
        const body = buf.subarray(4, 4 + buf.readUInt32LE(0));
        buf = buf.subarray(4 + body.length);
        if (body[0] === 0x05) {
          seen.push(Buffer.from(body));
          answer(Buffer.from(body), s);
        }
      }
    });
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  open.push({ close: () => new Promise<void>((r) => srv.close(() => r())) });
  const port = (srv.address() as net.AddressInfo).port;
  return { endpoint: `tcp://127.0.0.1:${port}`, seen };
}

async function reader(endpoint: string) {
  const region = new Uint8Array(NB * BB);
  const t = await SocketDataTransport.create({
    name: "consumer",
    region,
    numBlocks: NB,
    blockBytes: BB,
    listen: "tcp://127.0.0.1:0",
    registry: new Registry(),
  });
  open.push(t);
  const agent = t.addRemotePeer(
    encode({ name: "fake", instance: "00112233aabbccdd", endpoint }),
    encode({ num_blocks: NB, block_bytes: BB }),
  );
  return { t, region, agent };
}

describe("reader (docs/ec-protocol.md 3.3, a server built from the tables)", () => {
  const n = 300;
  const bytes = Buffer.alloc(n, 0x5a);

  it("asks with flags bit 0 and lands ACK + DATA: the ack is taken once, the bytes are in the blocks", async () => {
    const ack = Buffer.from("any xferack bytes");
    const f = await fakeServer((_ra, s) => s.write(Buffer.concat([handAck(ack), handData(n), bytes])));
    const { t, region, agent } = await reader(f.endpoint);
    const h = t.postReadAhead([3], agent, Buffer.from("s:x"), {
      nbytes: n,
      checksum: true,
      waitMs: 1_000,
      ackFirst: true,
    });
    await until(() => (t.checkXferState(h) === "DONE" ? true : undefined));
    expect(f.seen[0]![1]).toBe(1); // the flags byte of READ_AHEAD
    expect(Buffer.compare(Buffer.from(t.takeReadAheadAck(h)!), ack)).toBe(0);
    expect(t.takeReadAheadAck(h)).toBeNull();
    expect(t.getXferChecksum(h)).toBe(zlib.crc32(bytes));
    expect(Buffer.compare(Buffer.from(region.subarray(3 * BB, 3 * BB + n)), bytes)).toBe(0);
  });

  it("a next read posted from the completion's promise chain sends the owed NOTIF and its READ_AHEAD in one write", async () => {
    const f = await fakeServer((_ra, s) =>
      s.write(Buffer.concat([handAck(Buffer.from("k")), handData(n), bytes])),
    );
    const { t, agent } = await reader(f.endpoint);
    const port = Number(f.endpoint.split(":").pop());
    const writes: Buffer[] = [];
    const orig = net.Socket.prototype.write;
    net.Socket.prototype.write = function (this: net.Socket, chunk: unknown, ...rest: unknown[]) {
      // (the first write goes out while the socket still connects: no remote port yet)
      if (this.remotePort === port || this.remotePort === undefined)
        writes.push(Buffer.from(chunk as Uint8Array));
      return (orig as (...a: unknown[]) => boolean).call(this, chunk, ...rest);
    } as typeof orig;
    try {
      const post = () =>
        t.postReadAhead([5], agent, Buffer.from("s:x"), {
          nbytes: n,
          checksum: true,
          waitMs: 1_000,
          ackFirst: true,
        });
      let second: number | null = null;
      // As an engine that polls from onActivity: the next request two promise hops after the wake.
      t.onReadDone = () => {
        if (second === null) {
          second = -1;
          void Promise.resolve()
            .then(() => undefined)
            .then(() => {
              second = post();
            });
        }
      };
      const first = post();
      await until(() =>
        second !== null && second > 0 && t.checkXferState(second) === "DONE" ? true : undefined,
      );
      expect(t.checkXferState(first)).toBe("DONE");
      // READ_AHEAD; then NOTIF + READ_AHEAD together; then (an immediate later) the last NOTIF.
      await until(() => (writes.length >= 3 ? true : undefined));
      expect(writes[0]![4]).toBe(0x05);
      expect(writes[1]![4]).toBe(0x04);
      expect(writes[1]!.readUInt32LE(0) + 4).toBeLessThan(writes[1]!.length);
      expect(writes[1]![writes[1]!.readUInt32LE(0) + 8]).toBe(0x05);
      expect(writes.length).toBe(3);
    } finally {
      net.Socket.prototype.write = orig;
    }
  });

  it("an ACK it did not ask for, a second ACK, or an ACK over 64 KiB + 4: the read is ERR and nothing lands", async () => {
    const cases: [string, boolean, (s: net.Socket) => void][] = [
      ["unasked", false, (s) => s.write(Buffer.concat([handAck(Buffer.from("a")), handData(n), bytes]))],
      ["twice", true, (s) => s.write(Buffer.concat([handAck(Buffer.from("a")), handAck(Buffer.from("b"))]))],
      // body_len announces 65 541 (one over the largest ACK): refused before the body is buffered.
      ["oversize", true, (s) => s.write(handAck(Buffer.from("a"), 4 + 64 * 1024 + 1))],
    ];
    for (const [name, ackFirst, answer] of cases) {
      const f = await fakeServer((_ra, s) => answer(s));
      const { t, region, agent } = await reader(f.endpoint);
      const h = t.postReadAhead([1], agent, Buffer.from("s:x"), {
        nbytes: n,
        checksum: true,
        waitMs: 1_000,
        ackFirst,
      });
      await until(() => (t.checkXferState(h) === "ERR" ? true : undefined));
      expect(
        region.subarray(BB, BB + n).every((b) => b === 0),
        name,
      ).toBe(true);
      const taken = t.takeReadAheadAck(h);
      if (name === "twice") expect(Buffer.from(taken!).toString(), name).toBe("a");
      else expect(taken, name).toBeNull();
    }
  });
});

function dealerTo(endpoint: string): Dealer {
  const d = new Dealer({ linger: 0 });
  d.connect(endpoint);
  open.push({ close: () => d.close() });
  return d;
}

const req = (compat: string, o: Record<string, unknown>) =>
  encode({ compatibility_hash: compat, session_id: "s1", connector_version: EC_CONNECTOR_VERSION, ...o });

describe("producer (docs/ec-protocol.md 3.3, messages and frames from the tables)", () => {
  it("offers ack_ahead and echoes xfer_id; an ACK frame that reached a READ_AHEAD is the only copy of the ack", async () => {
    const n = 2 * BB + 11;
    const p = await EcProducer.start({ numBlocks: 64, blockBytes: BB, prepopulate: [["a", n]] });
    open.push(p);
    const d = dealerTo(p.controlEndpoint);
    const compat = p.compatibilityHash;
    // 1.1 request: no capability keys in the ack.
    await d.send(req(compat, { mm_hash: "a", session_id: "s0" }));
    const plain = decode((await d.receive())[0]!) as Record<string, unknown>;
    expect(plain["status"]).toBe(0);
    for (const k of ["ack_ahead", "xfer_id", "read_ahead"]) expect(Object.hasOwn(plain, k), k).toBe(false);
    // ack_ahead without read_ahead: not offered, but xfer_id echoed (also on a NACK).
    await d.send(req(compat, { mm_hash: "nope", ack_ahead: 1, xfer_id: 41 }));
    const nack = decode((await d.receive())[0]!) as Record<string, unknown>;
    expect(nack).toMatchObject({ status: XferStatus.NACK_MISSING, xfer_id: 41 });
    // An xfer_id that is not an integer 0 ... 2^32 - 1 is as if absent: answered, never malformed.
    for (const bad of [2 ** 32, -1, "7", 1.5]) {
      await d.send(req(compat, { mm_hash: "nope", ack_ahead: 1, xfer_id: bad }));
      const m = decode((await d.receive())[0]!) as Record<string, unknown>;
      expect(m["status"], String(bad)).toBe(XferStatus.NACK_MISSING);
      expect(Object.hasOwn(m, "xfer_id"), String(bad)).toBe(false);
    }
    expect(p.registry.snapshot().counters["producer_malformed_messages"] ?? 0).toBe(0);
    // No READ_AHEAD waiting: the ack comes on ZeroMQ, offering the capability.
    await d.send(req(compat, { mm_hash: "a", read_ahead: 1, ack_ahead: 1, xfer_id: 42 }));
    const offered = decode((await d.receive())[0]!) as Record<string, unknown>;
    expect(offered).toMatchObject({ status: 0, read_ahead: 1, ack_ahead: 1, xfer_id: 42 });
    // A READ_AHEAD (ack_first) waiting for session s2's grant: the ack arrives as its ACK frame.
    const c = rawClient(p.dataEndpoint);
    c.s.write(
      handReadAhead({
        key: "s2:a",
        reader: "r",
        instance: p.data.meta.instance,
        nbytes: n,
        waitMs: 5_000,
        flags: 1,
      }),
    );
    await until(() => (p.registry.snapshot().counters["data_read_ahead_waited"] === 1 ? true : undefined));
    await d.send(req(compat, { mm_hash: "a", session_id: "s2", read_ahead: 1, ack_ahead: 1, xfer_id: 43 }));
    const a = await c.next();
    expect(a.f.op).toBe("ack");
    const ack = decode(a.f.op === "ack" ? a.f.ack : Buffer.alloc(0)) as Record<string, unknown>;
    const want = Buffer.from(syntheticEmbedding("a", n));
    expect(ack).toMatchObject({
      status: 0,
      session_id: "s2",
      nbytes: n,
      xfer_id: 43,
      crc32: zlib.crc32(want),
    });
    const data = await c.next();
    expect(Buffer.compare(data.body, want)).toBe(0);
    c.s.write(handNotif("s2:a"));
    // Nothing more on ZeroMQ for xfer 43: the next message there answers the next request.
    await d.send(req(compat, { mm_hash: "nope", xfer_id: 44, ack_ahead: 1 }));
    expect(decode((await d.receive())[0]!)).toMatchObject({ status: XferStatus.NACK_MISSING, xfer_id: 44 });
    expect(p.registry.snapshot().counters["producer_data_acks"]).toBe(1);
  });
});

describe("consumer (EC-CONTRACT 6.2 with docs/ec-protocol.md 3.3)", () => {
  it("an ack whose xfer_id names another request is ignored and counted; its own one is taken", async () => {
    const { t } = await reader("tcp://127.0.0.1:1");
    const sent: Uint8Array[] = [];
    const registry = new Registry();
    const s = new ConsumerSession({
      addr: "tcp://127.0.0.1:2",
      send: (m) => sent.push(m),
      data: t,
      compatibilityHash: "c",
      numBlocks: NB,
      blockBytes: BB,
      readAhead: true,
      registry,
    });
    s.startXfer("h", [0], Number.POSITIVE_INFINITY, 10);
    const m = decode(sent[0]!) as Record<string, unknown>;
    expect(m).toMatchObject({ read_ahead: 1, ack_ahead: 1 });
    const id = m["xfer_id"] as number;
    expect(Number.isInteger(id)).toBe(true);
    const nack = (xferId: number) =>
      encodeXferAck({
        mmHash: "h",
        status: XferStatus.NACK_MISSING,
        sessionId: s.sessionId,
        srcBlockIndices: [],
        agentMetadata: new Uint8Array(0),
        memDescriptor: new Uint8Array(0),
        nbytes: 0,
        crc32: 0,
        xferId,
      });
    s.poll([nack(id + 1)], 0);
    expect(registry.snapshot().counters["consumer_stale_acks"]).toBe(1);
    expect(s.takeResults().tombstoned).toEqual([]);
    expect(s.hasInFlight()).toBe(true);
    s.poll([nack(id)], 0);
    expect(s.takeResults().tombstoned.map((x) => x.mmHash)).toEqual(["h"]);
    // The next request has another id.
    s.startXfer("h", [0], Number.POSITIVE_INFINITY, 10);
    expect((decode(sent[1]!) as Record<string, unknown>)["xfer_id"]).not.toBe(id);
    s.close();
  });

  it("a real consumer (default options but requests on ZeroMQ) takes its acks from the data plane after its first transfer; none arrive twice", async () => {
    const n = 3 * BB + 9;
    const p = await EcProducer.start({
      numBlocks: 64,
      blockBytes: BB,
      prepopulate: [
        ["a", n],
        ["b", n],
      ],
    });
    open.push(p);
    const conn = await ConsumerConnector.create({
      numBlocks: 64,
      blockBytes: BB,
      compatibility: p.compatibilityHash,
      registry: new Registry(),
      dataRequests: false, // 3.3 alone (3.5 has its own test: test/data-requests.test.ts)
    });
    open.push(conn);
    const d = new Driver(conn).start();
    open.push({ close: () => d.stop() });
    // The same hash again and again (each freed before the next): a late ack would be mistaken.
    for (let i = 0; i < 6; i++) {
      for (const h of ["a", "b"]) {
        expect(await d.fetch(h, p.controlEndpoint, n, 10_000)).toBe("loaded");
        conn.free(h);
      }
    }
    expect(d.mismatched).toEqual([]);
    const cc = conn.registry.snapshot().counters;
    expect(cc["consumer_data_acks"]).toBe(11); // the first transfer learns the offer
    expect(cc["consumer_acks_ok"]).toBe(12);
    expect(cc["consumer_stale_acks"] ?? 0).toBe(0);
    expect(cc["consumer_ignored_acks"] ?? 0).toBe(0);
    expect(p.registry.snapshot().counters["producer_data_acks"]).toBe(11);
  });
});
