// Faults injected by a real byte-level TCP proxy (@tapwire/testing) between a real client and a
// real server: latency, stall, connections dropped after N bytes, corrupted bytes. CONTRACT 3.
// tls and zmq+tcp go through the same proxy: it forwards bytes and never terminates TLS.
import { type FaultProxy, startFaultProxy } from "@tapwire/testing";
import { afterEach, describe, expect, test } from "vitest";
import { listen, makeClient, type RpcClient, type RpcServer, TransportError } from "../src/index.js";
import { type Case, caseOf, pattern, sleep } from "./helpers/env.js";

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const f of cleanups.splice(0).reverse()) await f();
});

async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(TransportError);
    return (e as TransportError).code;
  }
  return "resolved";
}

async function until(cond: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 2000 && !cond(); i++) await sleep(5);
  expect(cond(), what).toBe(true);
}

interface Rig {
  srv: RpcServer;
  proxy: FaultProxy;
  /** A client connected through the proxy. */
  viaProxy: RpcClient;
  /** A client connected straight to the server (the "other clients" that must keep working). */
  direct: RpcClient;
  /** Lengths of the requests the handler saw. */
  seen: number[];
  counter(name: string): number;
}

/** An echo server, a fault proxy in front of it, one client through the proxy and one direct. */
async function rig(t: Case): Promise<Rig> {
  const seen: number[] = [];
  const srv = await listen(
    t.listen(),
    (req) => {
      seen.push(req.length);
      return Buffer.from(req);
    },
    { ...t.server, closeTimeoutMs: 200 },
  );
  cleanups.push(() => srv.close());
  const port = Number(/:(\d+)$/.exec(srv.endpoint)?.[1]);
  const proxy = await startFaultProxy({ host: "127.0.0.1", port });
  cleanups.push(() => proxy.close());
  const viaProxy = makeClient(`${t.scheme}://127.0.0.1:${proxy.port}`, t.client);
  const direct = makeClient(srv.endpoint, t.client);
  cleanups.push(
    () => viaProxy.close(),
    () => direct.close(),
  );
  await viaProxy.connect(10_000);
  await direct.connect(10_000);
  return {
    srv,
    proxy,
    viaProxy,
    direct,
    seen,
    counter: (name) => srv.registry.snapshot().counters[name] ?? 0,
  };
}

/** A request whose echo must come back intact. */
async function echoes(c: RpcClient, size: number, seed: number): Promise<void> {
  const msg = pattern(size, seed);
  const reply = Buffer.alloc(size);
  const n = await c.request(msg, reply, 20_000);
  expect(n).toBe(size);
  expect(Buffer.compare(reply, msg)).toBe(0);
}

const PROXIED = ["tcp", "tls", "zmq+tcp"] as const;

for (const scheme of PROXIED) {
  const t = caseOf(scheme);
  describe(`${scheme} through the fault proxy (CONTRACT 3)`, () => {
    test("latency: every request still succeeds, content intact", async () => {
      const r = await rig(t);
      r.proxy.setFault({ kind: "latency", ms: 20 });
      for (const [i, size] of [0, 1, 1000, 300_000].entries()) await echoes(r.viaProxy, size, i + 1);
      expect(r.proxy.stats.faults.latency).toBeGreaterThan(0);
      // A fresh connection (handshakes included) through the delaying proxy works too.
      r.viaProxy.close();
      await r.viaProxy.connect(10_000);
      await echoes(r.viaProxy, 5000, 9);
    });

    test("stall: TIMEOUT, then CLOSED at once, then a fresh connect works once the stall clears", async () => {
      const r = await rig(t);
      await echoes(r.viaProxy, 100, 1);
      r.proxy.setFault({ kind: "stall" });
      const reply = Buffer.alloc(1000);
      expect(await codeOf(r.viaProxy.request(pattern(1000, 2), reply, 200))).toBe("TRANSPORT_TIMEOUT");
      expect(r.viaProxy.connected).toBe(false);
      expect(await codeOf(r.viaProxy.request(pattern(10, 3), reply, 5000))).toBe("TRANSPORT_CLOSED");
      // Other clients of the server never noticed.
      await echoes(r.direct, 1000, 4);
      r.proxy.setFault(null);
      await r.viaProxy.connect(10_000);
      await echoes(r.viaProxy, 1000, 5);
      // The held request was released into a connection the client had already abandoned: its
      // echo never reaches the new connection (the answer above is the new request's).
      expect(r.proxy.stats.faults.stall).toBeGreaterThan(0);
    });

    for (const direction of ["up", "down"] as const) {
      // Byte counts land mid length-prefix, mid payload; for tls/zmq they fall inside a record/frame.
      for (const bytes of [2, 600]) {
        test(`drop after ${bytes} bytes ${direction}: TRANSPORT_CLOSED, not a hang; the server keeps serving`, async () => {
          const r = await rig(t);
          await echoes(r.viaProxy, 100, 1);
          r.proxy.setFault({ kind: "drop_after", bytes, direction, relative: true });
          const msg = pattern(2000, 2);
          const p = r.viaProxy.request(msg, Buffer.alloc(2000), 20_000);
          expect(await codeOf(p)).toBe("TRANSPORT_CLOSED");
          expect(r.viaProxy.connected).toBe(false);
          expect(r.proxy.stats.faults.drop_after).toBe(1);
          // A cut-off request never reaches the handler; every request it saw was whole.
          expect(r.seen.every((n) => n === 100 || n === 2000)).toBe(true);
          if (direction === "up") expect(r.seen).not.toContain(2000);
          await echoes(r.direct, 2000, 3);
          r.proxy.setFault(null);
          await r.viaProxy.connect(10_000);
          await echoes(r.viaProxy, 2000, 4);
        });
      }
    }
  });
}

describe("corrupted bytes through the fault proxy (CONTRACT 3: the transport frames, it does not checksum)", () => {
  const tcp = caseOf("tcp");
  const tlsCase = caseOf("tls");
  const zmqCase = caseOf("zmq+tcp");

  test("tcp: top byte of a request's length prefix flipped: oversize, refused from the prefix, others served", async () => {
    const r = await rig(tcp);
    await echoes(r.viaProxy, 1000, 1);
    // 1000 = 0x000003e8 -> 0xff0003e8 (4 GiB - 16 MiB), far above maxMessageBytes.
    r.proxy.setFault({ kind: "corrupt", offset: 3, direction: "up", relative: true });
    const p = r.viaProxy.request(pattern(1000, 2), Buffer.alloc(1000), 20_000);
    expect(await codeOf(p)).toBe("TRANSPORT_CLOSED");
    await until(() => r.counter("transport_server_too_large") === 1, "too_large counted");
    expect(r.seen).toEqual([1000]);
    await echoes(r.direct, 1000, 3);
    r.proxy.setFault(null);
    await r.viaProxy.connect(10_000);
    await echoes(r.viaProxy, 1000, 4);
  });

  test("tcp: top byte of a reply's length prefix flipped: TRANSPORT_TOO_LARGE, connection closed", async () => {
    const r = await rig(tcp);
    await echoes(r.viaProxy, 1000, 1);
    r.proxy.setFault({ kind: "corrupt", offset: 3, direction: "down", relative: true });
    const reply = Buffer.alloc(1000);
    expect(await codeOf(r.viaProxy.request(pattern(1000, 2), reply, 20_000))).toBe("TRANSPORT_TOO_LARGE");
    expect(r.viaProxy.connected).toBe(false);
    expect(r.viaProxy.registry.snapshot().counters["transport_client_errors"]).toBe(1);
    r.proxy.setFault(null);
    await r.viaProxy.connect(10_000);
    await echoes(r.viaProxy, 1000, 3);
  });

  test("tcp: low byte of a request's prefix raised (1000 -> 1016): the server waits, the client times out, the truncated frame is counted", async () => {
    const r = await rig(tcp);
    await echoes(r.viaProxy, 1000, 1);
    const errorsBefore = r.counter("transport_server_errors");
    r.proxy.setFault({ kind: "corrupt", offset: 0, mask: 0x10, direction: "up", relative: true });
    const p = r.viaProxy.request(pattern(1000, 2), Buffer.alloc(1016), 300);
    expect(await codeOf(p)).toBe("TRANSPORT_TIMEOUT");
    // The client closed mid-frame: the server drops the partial request and counts it.
    await until(() => r.counter("transport_server_errors") === errorsBefore + 1, "truncated frame counted");
    expect(r.seen).toEqual([1000]);
    await echoes(r.direct, 1000, 3);
  });

  test("tcp: low byte of a reply's prefix lowered (1000 -> 992): the short reply is delivered, the 8 extra bytes close the connection", async () => {
    const r = await rig(tcp);
    await echoes(r.viaProxy, 1000, 1);
    r.proxy.setFault({ kind: "corrupt", offset: 0, mask: 0x08, direction: "down", relative: true });
    const msg = pattern(1000, 2);
    const reply = Buffer.alloc(1000);
    expect(await r.viaProxy.request(msg, reply, 20_000)).toBe(992);
    expect(Buffer.compare(reply.subarray(0, 992), msg.subarray(0, 992))).toBe(0);
    // Bytes after a complete reply: the stream can no longer be trusted.
    await until(() => !r.viaProxy.connected, "client closed the desynchronised connection");
    expect(await codeOf(r.viaProxy.request(msg, reply, 5000))).toBe("TRANSPORT_CLOSED");
  });

  test("tcp: low byte of a reply's prefix raised beyond replyBuf: TRANSPORT_REPLY_TOO_LARGE", async () => {
    const r = await rig(tcp);
    await echoes(r.viaProxy, 1000, 1);
    r.proxy.setFault({ kind: "corrupt", offset: 0, mask: 0x10, direction: "down", relative: true });
    const reply = Buffer.alloc(1000);
    expect(await codeOf(r.viaProxy.request(pattern(1000, 2), reply, 20_000))).toBe(
      "TRANSPORT_REPLY_TOO_LARGE",
    );
    expect(r.viaProxy.connected).toBe(false);
  });

  for (const direction of ["up", "down"] as const) {
    test(`tcp: a payload byte flipped ${direction}: delivered corrupted at the right length, the connection stays in sync`, async () => {
      const r = await rig(tcp);
      await echoes(r.viaProxy, 1000, 1);
      // Byte 4 + 500 of the next message: payload byte 500.
      r.proxy.setFault({ kind: "corrupt", offset: 504, mask: 0x5a, direction, relative: true });
      const msg = pattern(1000, 2);
      const reply = Buffer.alloc(1000);
      expect(await r.viaProxy.request(msg, reply, 20_000)).toBe(1000);
      expect(reply[500]).toBe((msg[500] as number) ^ 0x5a);
      reply[500] = msg[500] as number;
      expect(Buffer.compare(reply, msg)).toBe(0);
      expect(r.proxy.stats.faults.corrupt).toBe(1);
      expect(r.seen).toEqual([1000, 1000]);
      // Framing is intact: later requests on the same connection are exact.
      for (let i = 0; i < 3; i++) await echoes(r.viaProxy, 700 + i, 10 + i);
      expect(r.viaProxy.connected).toBe(true);
    });
  }

  for (const direction of ["up", "down"] as const) {
    for (const offset of [3, 40]) {
      test(`tls: any flipped byte (${direction}, record byte ${offset}) fails authentication: TRANSPORT_CLOSED, nothing corrupted delivered`, async () => {
        const r = await rig(tlsCase);
        await echoes(r.viaProxy, 1000, 1);
        r.proxy.setFault({ kind: "corrupt", offset, direction, relative: true });
        const reply = Buffer.alloc(1000).fill(0xee);
        expect(await codeOf(r.viaProxy.request(pattern(1000, 2), reply, 20_000))).toBe("TRANSPORT_CLOSED");
        expect(r.viaProxy.connected).toBe(false);
        if (direction === "up") expect(r.seen).toEqual([1000]);
        expect(reply.every((b) => b === 0xee)).toBe(true);
        await echoes(r.direct, 1000, 3);
        r.proxy.setFault(null);
        await r.viaProxy.connect(10_000);
        await echoes(r.viaProxy, 1000, 4);
      });
    }
  }

  for (const direction of ["up", "down"] as const) {
    test(`zmq+tcp: the frame header's flags turned into a long frame (${direction}): libzmq drops the connection, TRANSPORT_CLOSED`, async () => {
      const r = await rig(zmqCase);
      await echoes(r.viaProxy, 200, 1);
      // ZMTP short frame: flags, 1-byte size, body. Flag 0x02 (LONG) makes the size 8 bytes:
      // the size byte plus 7 body bytes, an absurd length refused by ZMQ_MAXMSGSIZE.
      r.proxy.setFault({ kind: "corrupt", offset: 0, mask: 0x02, direction, relative: true });
      expect(await codeOf(r.viaProxy.request(pattern(200, 2), Buffer.alloc(200), 20_000))).toBe(
        "TRANSPORT_CLOSED",
      );
      expect(r.viaProxy.connected).toBe(false);
      if (direction === "up") expect(r.seen).toEqual([200]);
      await echoes(r.direct, 200, 3);
      r.proxy.setFault(null);
      await r.viaProxy.connect(10_000);
      await echoes(r.viaProxy, 200, 4);
    });

    test(`zmq+tcp: a payload byte flipped ${direction}: delivered corrupted at the right length, in sync`, async () => {
      const r = await rig(zmqCase);
      await echoes(r.viaProxy, 200, 1);
      // Short frame header (flags, size) then the body: body byte 100.
      r.proxy.setFault({ kind: "corrupt", offset: 102, mask: 0x5a, direction, relative: true });
      const msg = pattern(200, 2);
      const reply = Buffer.alloc(200);
      expect(await r.viaProxy.request(msg, reply, 20_000)).toBe(200);
      expect(reply[100]).toBe((msg[100] as number) ^ 0x5a);
      reply[100] = msg[100] as number;
      expect(Buffer.compare(reply, msg)).toBe(0);
      for (let i = 0; i < 3; i++) await echoes(r.viaProxy, 150 + i, 10 + i);
      expect(r.viaProxy.connected).toBe(true);
    });
  }
});
