import { spawn } from "node:child_process";
import * as net from "node:net";
import { decode, encode } from "@msgpack/msgpack";
import { Registry } from "@tapwire/stats";
import { afterEach, describe, expect, it } from "vitest";
import { Dealer } from "zeromq";
import { encodeXferReqFrame } from "../src/data/request-frame.js";
import {
  ConsumerConnector,
  EC_CONNECTOR_VERSION,
  EcAdminClient,
  type SocketDataTransport,
  syntheticEmbedding,
} from "../src/index.js";
import { Driver } from "./helpers/drive.js";
import type { ProducerProc } from "./helpers/proc.js";
import { spawnProducer, until } from "./helpers/proc.js";
import type { HandFrame } from "./helpers/wire.js";
import { handNotif, handRead, handXferReq, parseServerFrame35 } from "./helpers/wire.js";

// Issue 23 item 1, docs/ec-protocol.md 3.5 (requests on the data connection, capability
// `data_req`): a transfer is one raw round trip. The consumer writes an XFER_REQ (the XferReq map of
// EC-CONTRACT 3) on its data connection; the producer validates, pins and grants it exactly as a
// control-plane XferReq (EC-CONTRACT 4.2, 5.3, 9.1, 9.2) and answers there: ACK then DATA, or an
// ACK flagged `final` for a NACK. Frames are built by hand from the tables (helpers/wire.ts) and
// MessagePack by @msgpack/msgpack, sent to a real `tapwire-ec-producer` in its own process.
const BB = 4096;
const open: { close(): Promise<void> | void }[] = [];
afterEach(async () => {
  for (const t of open.splice(0).reverse()) await t.close();
});

interface Stats {
  metrics: { counters: Record<string, number>; gauges: Record<string, number> };
  cache: { freeBlocks: number; pinnedBlocks: number; numBlocks: number };
  grants: number;
}

async function producer(
  extra: string[] = [],
  blocks = 64,
): Promise<ProducerProc & { stats(): Promise<Stats> }> {
  const p = await spawnProducer([
    "--num-blocks",
    String(blocks),
    "--block-bytes",
    String(BB),
    "--data",
    "tcp://127.0.0.1:0",
    ...(extra.includes("--prepopulate") ? [] : ["--prepopulate", "a:10000,b:5000"]),
    "--log-level",
    "error",
    ...extra,
  ]);
  const admin = new EcAdminClient(p.admin);
  open.push({ close: () => void p.kill("SIGKILL") });
  open.push({ close: () => admin.close() });
  return Object.assign(p, { stats: async () => (await admin.stats()) as unknown as Stats });
}

/** An XferReq map in EC-CONTRACT 3's key order, plus the optional keys of 3.2, 3.3 and 3.5. */
function xferReq(p: ProducerProc, mmHash: string, sessionId: string, opt: Record<string, unknown> = {}) {
  return encode({
    mm_hash: mmHash,
    compatibility_hash: p.compatibilityHash,
    session_id: sessionId,
    connector_version: EC_CONNECTOR_VERSION,
    ...opt,
  });
}
const ALL = { read_ahead: 1, ack_ahead: 1, xfer_id: 7, data_req: 1 };

/** One XferReq over ZeroMQ: the raw ack bytes. */
async function controlAck(p: ProducerProc, req: Uint8Array): Promise<Buffer> {
  const d = new Dealer({ linger: 0 });
  d.connect(p.control);
  try {
    await d.send(req);
    const [ack] = await d.receive();
    return Buffer.from(ack!);
  } finally {
    d.close();
  }
}

/** The producer's data instance, from the ERROR 1 a READ naming another instance gets (no grant made). */
async function instanceOf(p: ProducerProc): Promise<string> {
  const c = rawClient(p.data);
  c.s.write(handRead({ key: "x:y", reader: "probe", instance: "?", blocks: [0], nbytes: 1 }));
  const { f } = await c.next();
  if (f.op !== "error" || f.code !== 1) throw new Error("expected ERROR 1");
  return /instance ([0-9a-f]+)/.exec(f.message)![1]!;
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
    async next(): Promise<{ f: HandFrame & { final?: boolean }; body: Buffer }> {
      const f = await until(() => parseServerFrame35(buf) ?? (closed ? null : undefined));
      if (f === null) throw new Error("connection closed");
      const need = f.size + (f.op === "data" ? f.nbytes : 0);
      await until(() => buf.length >= need || undefined);
      const body = Buffer.from(buf.subarray(f.size, need));
      buf = buf.subarray(need);
      return { f, body };
    },
  };
}

const OLD_ACK_KEYS = [
  "mm_hash",
  "status",
  "session_id",
  "src_block_indices",
  "agent_metadata",
  "mem_descriptor",
  "nbytes",
  "crc32",
];

describe("offer (docs/ec-protocol.md 3.5 negotiation)", () => {
  it("data_req is offered only to a request carrying read_ahead, ack_ahead and data_req; a 1.1 request gets exactly the old bytes", async () => {
    const p = await producer();
    const all = decode(await controlAck(p, xferReq(p, "a", "s1", ALL))) as Record<string, unknown>;
    expect(all).toMatchObject({ status: 0, read_ahead: 1, ack_ahead: 1, xfer_id: 7, data_req: 1 });
    // Without data_req (a 3.3 consumer): no data_req key.
    const noReq = decode(
      await controlAck(p, xferReq(p, "a", "s2", { read_ahead: 1, ack_ahead: 1, xfer_id: 8 })),
    ) as Record<string, unknown>;
    expect(Object.keys(noReq)).toEqual([...OLD_ACK_KEYS, "read_ahead", "ack_ahead", "xfer_id"]);
    // data_req alone (without ack-ahead) offers nothing either.
    const alone = decode(await controlAck(p, xferReq(p, "a", "s3", { data_req: 1 }))) as Record<
      string,
      unknown
    >;
    expect(Object.keys(alone)).toEqual(OLD_ACK_KEYS);
    // A 1.1 XferReq: the ack is byte for byte the EC-CONTRACT 3 map built from the table.
    const raw = await controlAck(p, xferReq(p, "a", "s4"));
    const m = decode(raw) as Record<string, unknown>;
    const expected = encode(Object.fromEntries(OLD_ACK_KEYS.map((k) => [k, m[k]])));
    expect(raw.equals(Buffer.from(expected))).toBe(true);
    expect(Object.keys(m)).toEqual(OLD_ACK_KEYS);
    const c = (await p.stats()).metrics.counters;
    expect(c["data_xfer_requests"] ?? 0).toBe(0);
  });

  it("--no-data-requests: the ack to a request with data_req is byte-identical to one without it, and XFER_REQ is an unknown op (connection closed)", async () => {
    const p = await producer(["--no-data-requests"]);
    const withKey = await controlAck(p, xferReq(p, "a", "s1", ALL));
    const { data_req: _drop, ...rest } = ALL;
    const without = await controlAck(p, xferReq(p, "a", "s1", rest));
    expect(withKey.equals(without)).toBe(true);
    expect(Object.keys(decode(withKey) as object)).not.toContain("data_req");
    const instance = await instanceOf(p);
    const c = rawClient(p.data);
    c.s.write(handXferReq({ reader: "t", instance, nbytes: 10000, req: xferReq(p, "a", "x", ALL) }));
    await until(() => c.closed || undefined);
    const counters = (await p.stats()).metrics.counters;
    expect(counters["data_malformed_frames"]).toBeGreaterThanOrEqual(1);
    expect(counters["producer_data_requests"] ?? 0).toBe(0);
  });
});

describe("XFER_REQ to a real tapwire-ec-producer (frames from the tables)", () => {
  it("the hex example of the table is what the encoder builds", () => {
    const req = encode({
      mm_hash: "h",
      compatibility_hash: "x",
      session_id: "s",
      connector_version: 2,
      read_ahead: 1,
      ack_ahead: 1,
      xfer_id: 7,
      data_req: 1,
    });
    const hex = (b: Uint8Array) => Buffer.from(b).toString("hex").replace(/(..)/g, "$1 ").trim();
    // docs/ec-protocol.md 3.5, the example: header, reader "c/1", instance "ab", nbytes 100.
    const doc =
      "7f 00 00 00 0c 00 03 00 02 00 6a 00 64 00 00 00 00 00 00 00 63 2f 31 61 62 " +
      "88 a7 6d 6d 5f 68 61 73 68 a1 68 b2 63 6f 6d 70 61 74 69 62 69 6c 69 74 79 5f 68 61 73 68 a1 78 " +
      "aa 73 65 73 73 69 6f 6e 5f 69 64 a1 73 b1 63 6f 6e 6e 65 63 74 6f 72 5f 76 65 72 73 69 6f 6e 02 " +
      "aa 72 65 61 64 5f 61 68 65 61 64 01 a9 61 63 6b 5f 61 68 65 61 64 01 a7 78 66 65 72 5f 69 64 07 " +
      "a8 64 61 74 61 5f 72 65 71 01";
    const hand = handXferReq({ reader: "c/1", instance: "ab", nbytes: 100, req });
    expect(hex(hand)).toBe(doc);
    expect(hex(encodeXferReqFrame({ reader: "c/1", instance: "ab", nbytes: 100, req }))).toBe(doc);
  });

  it("ACK then DATA (the entry's bytes), NOTIF ends the grant; a NACK is an ACK flagged final and the connection serves the next request", async () => {
    const p = await producer();
    const instance = await instanceOf(p);
    const c = rawClient(p.data);
    c.s.write(handXferReq({ reader: "t/1", instance, nbytes: 10000, req: xferReq(p, "a", "sess", ALL) }));
    const ack = await c.next();
    expect(ack.f.op).toBe("ack");
    expect(ack.f.final).toBeUndefined();
    const m = decode((ack.f as { ack: Buffer }).ack) as Record<string, unknown>;
    expect(m).toMatchObject({
      mm_hash: "a",
      status: 0,
      session_id: "sess",
      nbytes: 10000,
      xfer_id: 7,
      data_req: 1,
    });
    const data = await c.next();
    expect(data.f).toMatchObject({ op: "data", nbytes: 10000 });
    expect(data.body.equals(Buffer.from(syntheticEmbedding("a", 10000)))).toBe(true);
    expect((await p.stats()).grants).toBe(1);
    c.s.write(handNotif("sess:a"));
    await until(async () => ((await p.stats()).grants === 0 ? true : undefined));
    // NACK_MISSING: final ACK, no DATA; the connection stays open.
    c.s.write(handXferReq({ reader: "t/1", instance, nbytes: 10000, req: xferReq(p, "zz", "sess", ALL) }));
    const nack = await c.next();
    expect(nack.f).toMatchObject({ op: "ack", final: true });
    expect(decode((nack.f as { ack: Buffer }).ack)).toMatchObject({ mm_hash: "zz", status: 1, xfer_id: 7 });
    // Incompatible: NACK_INCOMPAT, same shape.
    c.s.write(
      handXferReq({
        reader: "t/1",
        instance,
        nbytes: 5000,
        req: encode({ mm_hash: "b", compatibility_hash: "nope", session_id: "sess", connector_version: 2 }),
      }),
    );
    const inc = await c.next();
    expect(inc.f).toMatchObject({ op: "ack", final: true });
    expect(decode((inc.f as { ack: Buffer }).ack)).toMatchObject({ mm_hash: "b", status: 3 });
    // No grant was made for "zz": a READ of its key is refused (EC-CONTRACT 5.3, ERROR 2).
    c.s.write(handXferReq({ reader: "t/1", instance, nbytes: 5000, req: xferReq(p, "b", "sess", ALL) }));
    expect((await c.next()).f.op).toBe("ack");
    expect((await c.next()).f).toMatchObject({ op: "data", nbytes: 5000 });
    c.s.write(handNotif("sess:b"));
    c.s.write(handRead({ key: "sess:zz", reader: "t/1", instance, blocks: [0], nbytes: 10 }));
    expect((await c.next()).f).toMatchObject({ op: "error", code: 2 });
    await until(() => c.closed || undefined);
    const s = await p.stats();
    expect(s.metrics.counters["producer_data_requests"]).toBe(4);
    expect(s.metrics.counters["producer_nacks_missing"]).toBe(1);
    expect(s.cache.pinnedBlocks).toBe(0);
  });
});

describe("hostile XFER_REQ (typed errors, bounded memory, the producer keeps serving)", () => {
  it("garbage, oversize, wrong instance, wrong nbytes, a nested or admin map: each closes only its connection", async () => {
    const p = await producer();
    const instance = await instanceOf(p);
    const closedBy = async (bytes: Buffer) => {
      const c = rawClient(p.data);
      c.s.write(bytes);
      await until(() => c.closed || undefined);
    };
    const good = { reader: "t", instance, nbytes: 10000, req: xferReq(p, "a", "h", ALL) };
    await closedBy(handXferReq({ ...good, reserved: 1 }));
    await closedBy(handXferReq({ ...good, bodyLen: 40 })); // shorter than its fields
    await closedBy(Buffer.from([0x00, 0x10, 0x00, 0x01, 0x0c, 0, 0, 0])); // body_len 16 MiB + 4 KiB: not buffered
    await closedBy(Buffer.concat([Buffer.from([5, 0, 0, 0, 0x0c]), Buffer.alloc(4, 0xff)]));
    await closedBy(handXferReq({ ...good, req: encode({ mm_hash: { nested: [1, [2]] } }) }));
    await closedBy(handXferReq({ ...good, req: encode({ op: "stats" }) }));
    await closedBy(handXferReq({ ...good, req: Buffer.from([0xc1, 0xc1]) }));
    let s = await p.stats();
    expect(s.metrics.counters["data_malformed_frames"]).toBeGreaterThanOrEqual(7);
    expect(s.metrics.counters["producer_malformed_messages"]).toBeGreaterThanOrEqual(3);
    expect(s.metrics.counters["producer_admin_refused"]).toBe(1);
    // Wrong instance: ERROR 1 (checked before the request is even decoded), then close.
    const w = rawClient(p.data);
    w.s.write(handXferReq({ ...good, instance: "0000000000000000" }));
    expect((await w.next()).f).toMatchObject({ op: "error", code: 1 });
    await until(() => w.closed || undefined);
    // nbytes not the entry's: ERROR 5 (bad_nbytes), nothing streamed.
    const n = rawClient(p.data);
    n.s.write(handXferReq({ ...good, nbytes: 9999 }));
    expect((await n.next()).f).toMatchObject({ op: "error", code: 5 });
    await until(() => n.closed || undefined);
    // Still serving.
    const ok = rawClient(p.data);
    ok.s.write(handXferReq({ ...good, req: xferReq(p, "a", "ok", ALL) }));
    expect((await ok.next()).f.op).toBe("ack");
    expect((await ok.next()).f).toMatchObject({ op: "data", nbytes: 10000 });
    ok.s.write(handNotif("ok:a"));
    s = await p.stats();
    expect(s.metrics.counters["producer_data_requests"]).toBeGreaterThanOrEqual(2);
  });

  it("the producer's fast XferReq decoder (issue 23, src/xfer-codec.ts) declines what is not canonical: the strict decoder then serves, NACKs or refuses it as before", async () => {
    const p = await producer();
    const instance = await instanceOf(p);
    const c = rawClient(p.data);
    const req = (m: Record<string, unknown>) =>
      handXferReq({ reader: "t", instance, nbytes: 10000, req: encode(m) });
    const base = {
      mm_hash: "a",
      compatibility_hash: p.compatibilityHash,
      session_id: "fp",
      connector_version: 2,
    };
    // Other key order, an unknown key, a flag that is `true` instead of 1 (EC-CONTRACT 3: ignored).
    const { mm_hash, compatibility_hash } = base;
    c.s.write(
      req({
        extra: 1.5,
        read_ahead: true,
        connector_version: 2,
        session_id: "fp",
        compatibility_hash,
        mm_hash,
      }),
    );
    const ack = await c.next();
    expect(ack.f.op).toBe("ack");
    const m = decode((ack.f as { ack: Buffer }).ack) as Record<string, unknown>;
    expect(m).toMatchObject({ mm_hash: "a", status: 0, session_id: "fp", nbytes: 10000 });
    expect(m).not.toHaveProperty("read_ahead");
    expect((await c.next()).f).toMatchObject({ op: "data", nbytes: 10000 });
    c.s.write(handNotif("fp:a"));
    // A negative connector_version (the fast path takes unsigned only): NACK_VERSION, as before.
    c.s.write(req({ ...base, connector_version: -2 }));
    const nack = await c.next();
    expect(nack.f).toMatchObject({ op: "ack", final: true });
    expect(decode((nack.f as { ack: Buffer }).ack)).toMatchObject({ mm_hash: "a", status: 4 });
    // Every contract key and an admin `op`: still an admin map on a data connection (EC-CONTRACT 9.3).
    const before = (await p.stats()).metrics.counters["producer_admin_refused"] ?? 0;
    c.s.write(req({ ...base, op: "evict" }));
    await until(() => c.closed || undefined);
    const s = await p.stats();
    expect(s.metrics.counters["producer_admin_refused"]).toBe(before + 1);
    expect(s.cache.pinnedBlocks).toBe(0);
  });

  it("a replayed XFER_REQ is a re-request: the old pin is released first, every pin ends exactly once", async () => {
    const p = await producer();
    const instance = await instanceOf(p);
    const c = rawClient(p.data);
    const f = handXferReq({ reader: "t", instance, nbytes: 10000, req: xferReq(p, "a", "rep", ALL) });
    c.s.write(Buffer.concat([f, f])); // the same frame twice, in one segment
    for (let i = 0; i < 2; i++) {
      expect((await c.next()).f.op).toBe("ack");
      expect((await c.next()).f).toMatchObject({ op: "data", nbytes: 10000 });
    }
    let s = await p.stats();
    expect(s.metrics.counters["producer_regrants"]).toBe(1);
    expect(s.grants).toBe(1);
    c.s.write(handNotif("rep:a"));
    await until(async () => ((await p.stats()).grants === 0 ? true : undefined));
    s = await p.stats();
    expect(s.cache.pinnedBlocks).toBe(0);
    // A replayed NOTIF (nothing streamed since) closes the connection.
    c.s.write(handNotif("rep:a"));
    await until(() => c.closed || undefined);
  });

  it("a flood of requests on many connections never pins more than the quotas allow; leases end them all", async () => {
    // 40 blocks: a (3) + b (2) + c (15) + d (15) pinned at once would pass max_pinned_fraction (30).
    const p = await producer(
      ["--pin-lease-ms", "2000", "--prepopulate", "a:10000,b:5000,c:60000,d:60000"],
      40,
    );
    const instance = await instanceOf(p);
    const clients = Array.from({ length: 60 }, () => rawClient(p.data));
    clients.forEach((c, i) => {
      const h = ["a", "b", "c", "d"][i % 4]!;
      const nb = { a: 10000, b: 5000, c: 60000, d: 60000 }[h]!;
      c.s.write(handXferReq({ reader: "f", instance, nbytes: nb, req: xferReq(p, h, `flood-${i}`, ALL) }));
    });
    // Each gets an answer (served or a NOT_READY from the quota) or is closed: none is left hanging.
    await Promise.all(clients.map((c) => c.next().catch(() => null)));
    const s = await p.stats();
    expect(s.cache.pinnedBlocks).toBeLessThanOrEqual(Math.floor(0.75 * s.cache.numBlocks));
    expect(s.metrics.counters["producer_grants_refused_quota"]).toBeGreaterThan(0); // NOT_READY, final ACK
    expect(s.metrics.gauges["data_server_connections"]).toBeLessThanOrEqual(256);
    await until(async () => ((await p.stats()).grants === 0 ? true : undefined));
    expect((await p.stats()).cache.pinnedBlocks).toBe(0);
  });

  it("kill -9 of a requesting peer mid-stream: the producer keeps serving and the lease unpins", async () => {
    const p = await producer(["--pin-lease-ms", "3000"]);
    const instance = await instanceOf(p);
    const frame = handXferReq({ reader: "k", instance, nbytes: 10000, req: xferReq(p, "a", "killed", ALL) });
    const port = Number(p.data.split(":").pop());
    // A child process that writes the request, reads until the first bytes arrive, then waits.
    const child = spawn(
      process.execPath,
      [
        "-e",
        `const s=require("net").connect(${port},"127.0.0.1",()=>s.write(Buffer.from("${frame.toString("hex")}","hex")));` +
          `s.once("data",()=>process.stdout.write("got\\n"));setInterval(()=>{},1000);`,
      ],
      { stdio: ["ignore", "pipe", "ignore"] },
    );
    open.push({ close: () => void child.kill("SIGKILL") });
    await new Promise<void>((resolve) => child.stdout!.once("data", () => resolve()));
    expect((await p.stats()).grants).toBe(1);
    child.kill("SIGKILL");
    await until(async () => ((await p.stats()).grants === 0 ? true : undefined));
    expect((await p.stats()).cache.pinnedBlocks).toBe(0);
  });
});

describe("a real consumer (EC-CONTRACT 6, 7 with docs/ec-protocol.md 3.5)", () => {
  it("after its first transfer every request is an XFER_REQ: one ZeroMQ request in all, bytes identical, no stale ack", async () => {
    const p = await producer();
    const conn = await ConsumerConnector.create({
      numBlocks: 64,
      blockBytes: BB,
      compatibility: p.compatibilityHash,
      registry: new Registry(),
    });
    open.push(conn);
    const d = new Driver(
      conn,
      new Map([
        ["a", 10000],
        ["b", 5000],
      ]),
    ).start();
    open.push({ close: () => d.stop() });
    for (let i = 0; i < 6; i++) {
      for (const [h, n] of [
        ["a", 10000],
        ["b", 5000],
      ] as const) {
        expect(await d.fetch(h, p.control, n, 10_000)).toBe("loaded");
        conn.free(h);
      }
    }
    expect(d.mismatched).toEqual([]);
    const cc = conn.registry.snapshot().counters;
    expect(cc["consumer_data_requests"]).toBe(11); // the first one learns the offer on ZeroMQ
    expect(cc["consumer_stale_acks"] ?? 0).toBe(0);
    const s = await p.stats();
    expect(s.metrics.counters["producer_requests"]).toBe(12);
    expect(s.metrics.counters["producer_data_requests"]).toBe(11); // one ZeroMQ XferReq in all
  });

  it("dataRequests: false never sends an XFER_REQ; against --no-data-requests a default consumer uses 3.3", async () => {
    for (const [extra, opt] of [
      [[], { dataRequests: false }],
      [["--no-data-requests"], {}],
    ] as const) {
      const p = await producer([...extra]);
      const conn = await ConsumerConnector.create({
        numBlocks: 64,
        blockBytes: BB,
        compatibility: p.compatibilityHash,
        registry: new Registry(),
        ...opt,
      });
      open.push(conn);
      const d = new Driver(conn, new Map([["a", 10000]])).start();
      open.push({ close: () => d.stop() });
      for (let i = 0; i < 3; i++) {
        expect(await d.fetch("a", p.control, 10000, 10_000)).toBe("loaded");
        conn.free("a");
      }
      expect(d.mismatched).toEqual([]);
      expect(conn.registry.snapshot().counters["consumer_data_requests"] ?? 0).toBe(0);
      expect(conn.registry.snapshot().counters["consumer_data_acks"]).toBe(2); // 3.3 still
      const c = (await p.stats()).metrics.counters;
      expect(c["data_xfer_requests"] ?? 0).toBe(0);
    }
  });

  it("kill -9 of the producer mid-transfer: the request fails (compute locally), every block comes back", async () => {
    // 16 MiB: more than loopback socket buffers hold, so most bytes are still at the producer.
    const big = 16 * 1024 * 1024;
    const p = await producer(["--prepopulate", `b:5000,big:${big}`, "--max-pinned-fraction", "1"], 4200);
    const conn = await ConsumerConnector.create({
      numBlocks: 4200,
      blockBytes: BB,
      compatibility: p.compatibilityHash,
      registry: new Registry(),
    });
    open.push(conn);
    const free = conn.cache.freeBlocks;
    const d = new Driver(conn).start();
    open.push({ close: () => d.stop() });
    expect(await d.fetch("b", p.control, 5000, 10_000)).toBe("loaded"); // learns data_req
    conn.free("b");
    (conn.data as SocketDataTransport).injectFault({ kind: "stall", ms: 1500 }); // after ACK + DATA header
    const pending = d.fetch("big", p.control, big, 10_000);
    await until(() => ((conn.registry.snapshot().counters["consumer_acks_ok"] ?? 0) >= 2 ? true : undefined));
    await p.kill("SIGKILL");
    expect(await pending).not.toBe("loaded");
    await until(() => (conn.cache.freeBlocks === free ? true : undefined));
    expect(conn.registry.snapshot().counters["consumer_data_requests"]).toBe(1);
  });
});
