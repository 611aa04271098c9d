// CONTRACT 11 (1.1) limits in the servers, attacked as a hostile peer would: the unbound message
// limit and onOversize, many pre-bind giant prefixes with RSS checked flat, slowloris and idle
// floods against unboundIdleMs, maxConnections eviction and refusal, the receive budget with
// backpressure for bound connections, allocation failure, ZeroMQ peers, refused TLS handshakes.
// Each asserts the server stays up, a legitimate client is served during and after, and the
// counters name what was refused.
import type * as net from "node:net";
import * as v8 from "node:v8";
import * as vm from "node:vm";
import { afterEach, describe, expect, test } from "vitest";
import * as zmq from "zeromq";
import {
  type ConnInfo,
  listen,
  makeClient,
  type OnOversize,
  type RpcServer,
  type ServerOptions,
  type TlsFailureReason,
  type TransportError,
} from "../src/index.js";
import { type Case, caseOf, listenWithAllocator, pattern, sleep, tlsCreds } from "./helpers/env.js";
import { closed, rawConnect } from "./helpers/raw.js";

v8.setFlagsFromString("--expose-gc");
const gc = vm.runInNewContext("gc") as () => void;

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const f of cleanups.splice(0).reverse()) await f();
});

async function until(cond: () => boolean, what: string, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond() && Date.now() < end) await sleep(5);
  expect(cond(), what).toBe(true);
}

function prefix(n: number): Buffer {
  const h = Buffer.alloc(4);
  h.writeUInt32LE(n);
  return h;
}

function frame(body: Uint8Array): Buffer {
  return Buffer.concat([prefix(body.length), body]);
}

/** Reads everything a raw socket receives until it closes. */
function collect(s: net.Socket): { bytes(): Buffer; closed: Promise<void> } {
  const chunks: Buffer[] = [];
  s.on("data", (d: Buffer) => chunks.push(d));
  s.on("error", () => {});
  return { bytes: () => Buffer.concat(chunks), closed: closed(s) };
}

const BIND = Buffer.from("BIND");
const UNBIND = Buffer.from("UNBIND");
const UNBOUND_MAX = 4096;
const MAX = 1 << 20;

/** The oversize answer: "TOO_LARGE" + the frame header the hook got + the declared length. */
const oversize: OnOversize = (head, declared) =>
  Buffer.concat([Buffer.from("TOO_LARGE:"), head, Buffer.from(`:${declared}`)]);

/**
 * An echo server whose handler binds a connection on "BIND" and unbinds it on "UNBIND" (what
 * the worker does on an OK HELLO and when its session is replaced, CONTRACT 6.2).
 */
async function serve(
  t: Case,
  opts: ServerOptions = {},
  delay = 0,
): Promise<{ srv: RpcServer; counter(name: string): number; conns: ConnInfo[] }> {
  const conns: ConnInfo[] = [];
  const srv = await listen(
    t.listen(),
    async (req, conn) => {
      if (!conns.includes(conn)) conns.push(conn);
      if (Buffer.from(req).equals(BIND)) conn.bind();
      else if (Buffer.from(req).equals(UNBIND)) conn.unbind();
      const copy = Buffer.from(req);
      if (delay > 0) await sleep(delay);
      return copy;
    },
    {
      ...t.server,
      maxMessageBytes: MAX,
      unboundMaxMessageBytes: UNBOUND_MAX,
      onOversize: oversize,
      closeTimeoutMs: 200,
      ...opts,
    },
  );
  cleanups.push(() => srv.close());
  const counter = (name: string): number => srv.registry.snapshot().counters[name] ?? 0;
  return { srv, counter, conns };
}

/** A connected, bound client (its "BIND" echoed). */
async function boundClient(t: Case, endpoint: string) {
  const c = makeClient(endpoint, { ...t.client, maxMessageBytes: MAX });
  cleanups.push(() => c.close());
  await c.connect(10_000);
  const reply = Buffer.alloc(MAX);
  expect(await c.request(BIND, reply, 10_000)).toBe(4);
  return { c, reply };
}

const STREAM = [caseOf("tcp"), caseOf("unix"), caseOf("tls")];

for (const t of STREAM) {
  describe(`${t.scheme}: unbound limit and onOversize (CONTRACT 11 "Before HELLO")`, () => {
    test("an unbound prefix above 4 KiB gets the hook's reply for its 24-byte header, then close; bound ones carry up to maxMessageBytes", async () => {
      const s = await serve(t);
      const raw = await rawConnect(s.srv.endpoint);
      const got = collect(raw);
      const head = pattern(24, 3);
      raw.write(Buffer.concat([prefix(96 << 20), head, pattern(1000, 4)]));
      await got.closed;
      const expected = Buffer.concat([Buffer.from("TOO_LARGE:"), head, Buffer.from(`:${96 << 20}`)]);
      expect(got.bytes().equals(frame(expected))).toBe(true);
      expect(s.counter("transport_server_too_large")).toBe(1);
      expect(s.counter("transport_server_oversize_replies")).toBe(1);

      // 4096 exactly is accepted before binding; after bind() 1 MiB is.
      const { c, reply } = await boundClient(t, s.srv.endpoint);
      const big = pattern(MAX, 9);
      expect(await c.request(big, reply, 10_000)).toBe(MAX);
      expect(reply.equals(big)).toBe(true);
      // unbind(): the unbound limit again from the next message on.
      expect(await c.request(UNBIND, reply, 10_000)).toBe(6);
      await c.request(pattern(UNBOUND_MAX + 1, 2), reply, 10_000);
      expect(reply.subarray(0, 10).toString()).toBe("TOO_LARGE:");
      expect(s.counter("transport_server_too_large")).toBe(2);
      await until(() => !c.connected, "closed after the oversize reply");
      // A client not bound: 4096 passes, 4097 gets the hook's reply instead of its echo.
      const u = makeClient(s.srv.endpoint, t.client);
      cleanups.push(() => u.close());
      await u.connect(10_000);
      expect(await u.request(pattern(UNBOUND_MAX, 5), reply, 10_000)).toBe(UNBOUND_MAX);
      const n = await u.request(pattern(UNBOUND_MAX + 1, 6), reply, 10_000);
      expect(reply.subarray(0, 10).toString()).toBe("TOO_LARGE:");
      expect(
        reply
          .subarray(0, n)
          .toString()
          .endsWith(`:${UNBOUND_MAX + 1}`),
      ).toBe(true);
      await until(() => !u.connected, "closed after the oversize reply");
    });

    test("a bound connection above maxMessageBytes is closed without the hook", async () => {
      const s = await serve(t);
      const { c, reply } = await boundClient(t, s.srv.endpoint);
      const raw = await rawConnect(s.srv.endpoint);
      const got = collect(raw);
      raw.write(Buffer.concat([frame(BIND), prefix(MAX + 1), pattern(24, 1)]));
      await got.closed;
      expect(got.bytes().equals(frame(BIND))).toBe(true);
      expect(s.counter("transport_server_oversize_replies")).toBe(0);
      expect(s.counter("transport_server_too_large")).toBe(1);
      expect(await c.request(Buffer.from("ok"), reply, 10_000)).toBe(2);
    });

    test("an oversize prefix whose frame header never comes is closed without a reply", async () => {
      const s = await serve(t, { unboundIdleMs: 300 });
      const raw = await rawConnect(s.srv.endpoint);
      const got = collect(raw);
      raw.write(Buffer.concat([prefix(1 << 30), pattern(10, 1)]));
      await got.closed;
      expect(got.bytes().length).toBe(0);
      expect(s.counter("transport_server_oversize_replies")).toBe(0);
    });

    test("a throwing onOversize closes the connection, is reported and counted", async () => {
      const errors: unknown[] = [];
      const s = await serve(t, {
        onOversize: () => {
          throw new Error("hook failed");
        },
        onError: (e) => errors.push(e),
      });
      const raw = await rawConnect(s.srv.endpoint);
      const got = collect(raw);
      raw.write(Buffer.concat([prefix(1 << 20), pattern(24, 1)]));
      await got.closed;
      expect(got.bytes().length).toBe(0);
      expect((errors[0] as Error).message).toBe("hook failed");
      expect(s.counter("transport_server_errors")).toBe(1);
    });
  });
}

describe("tcp: attacks on the limits (CONTRACT 11)", () => {
  const t = caseOf("tcp");

  test("400 unbound connections announcing 96 MiB each (allowed once bound) and sending 256 KiB: RSS stays flat, a bound client is served throughout", async () => {
    // 96 MiB is within maxMessageBytes: without the unbound limit each connection would keep a
    // reassembly buffer for what it sent (400 x 256-512 KiB), and stay open.
    const s = await serve(t, { maxMessageBytes: 96 << 20 });
    const { c, reply } = await boundClient(t, s.srv.endpoint);
    gc();
    const rss0 = process.memoryUsage().rss;
    let served = 0;
    let stop = false;
    const bg = (async () => {
      while (!stop) {
        const m = pattern(2000, served);
        expect(await c.request(m, reply, 20_000)).toBe(2000);
        served++;
      }
    })();
    let maxRss = rss0;
    const body = pattern(256 << 10, 5);
    for (let wave = 0; wave < 8; wave++) {
      const socks = await Promise.all(Array.from({ length: 50 }, () => rawConnect(s.srv.endpoint)));
      const done = socks.map((r) => collect(r).closed);
      // The prefix and half a header: the hook needs 24 bytes, so each waits (up to 1 s) holding
      // nothing; then the rest of the header and 256 KiB of body, which are never buffered.
      for (const r of socks) r.write(Buffer.concat([prefix(96 << 20), pattern(12, 1)]));
      await sleep(20);
      for (const r of socks) r.write(Buffer.concat([pattern(12, 2), body]));
      await Promise.all(done);
      maxRss = Math.max(maxRss, process.memoryUsage().rss);
    }
    stop = true;
    await bg;
    expect(served).toBeGreaterThan(0);
    expect(s.counter("transport_server_oversize_replies")).toBe(400);
    // 400 x 96 MiB announced; well under one such message held at any time.
    expect(maxRss - rss0).toBeLessThan(64 << 20);
    expect(await c.request(Buffer.from("after"), reply, 10_000)).toBe(5);
  });

  test("slowloris: an unbound connection trickling one message is closed after unboundIdleMs; a bound idle one is not", async () => {
    const s = await serve(t, { unboundIdleMs: 300 });
    const { c, reply } = await boundClient(t, s.srv.endpoint);
    const raw = await rawConnect(s.srv.endpoint);
    const got = collect(raw);
    const msg = frame(pattern(200, 1));
    let sent = 0;
    const trickle = setInterval(() => {
      if (sent < msg.length && !raw.destroyed) raw.write(msg.subarray(sent, ++sent));
    }, 20);
    await got.closed;
    clearInterval(trickle);
    expect(sent).toBeLessThan(msg.length);
    expect(s.counter("transport_server_unbound_idle_closed")).toBe(1);
    // An unbound connection that keeps sending whole messages stays.
    const u = makeClient(s.srv.endpoint, t.client);
    cleanups.push(() => u.close());
    await u.connect(10_000);
    for (let i = 0; i < 6; i++) {
      expect(await u.request(Buffer.from("ping"), reply, 10_000)).toBe(4);
      await sleep(100);
    }
    expect(u.connected).toBe(true);
    await sleep(400);
    expect(await c.request(Buffer.from("bound"), reply, 10_000)).toBe(5);
    await until(() => !u.connected, "the idle unbound client is closed");
    expect(s.counter("transport_server_unbound_idle_closed")).toBe(2);
  });

  test("idle flood with maxConnections 8: at most 4 unbound held, oldest evicted, bound clients kept, then refusal", async () => {
    const s = await serve(t, { maxConnections: 8 });
    const bound = [];
    for (let i = 0; i < 3; i++) bound.push(await boundClient(t, s.srv.endpoint));
    const socks: net.Socket[] = [];
    for (let i = 0; i < 40; i++) {
      const r = await rawConnect(s.srv.endpoint);
      collect(r);
      socks.push(r);
      await sleep(2);
    }
    await until(() => s.srv.connections <= 7, "at most 3 bound + 4 unbound");
    await until(() => socks.filter((r) => !r.destroyed).length === 4, "the 4 newest unbound remain");
    expect(socks.slice(36).every((r) => !r.destroyed)).toBe(true);
    expect(s.counter("transport_server_connections_evicted")).toBe(36);
    for (const b of bound) expect(await b.c.request(Buffer.from("still"), b.reply, 10_000)).toBe(5);
    // Five bound + 3 unbound = 8: a new connection evicts an unbound one; with all 8 bound, refused.
    for (let i = 0; i < 5; i++) bound.push(await boundClient(t, s.srv.endpoint));
    await until(() => socks.every((r) => r.destroyed), "every idle unbound evicted for the bound ones");
    const late = await rawConnect(s.srv.endpoint);
    await closed(late);
    expect(s.counter("transport_server_connections_refused")).toBe(1);
    for (const b of bound) expect(await b.c.request(Buffer.from("ok"), b.reply, 10_000)).toBe(2);
  });

  test("receive budget: a bound connection waits (backpressure) and completes; an unbound one that does not fit is closed", async () => {
    // Budget = one maximal message. The handler takes 300 ms, so A's message holds the budget.
    const s = await serve(t, { maxBufferedBytes: MAX }, 300);
    const a = await boundClient(t, s.srv.endpoint);
    const b = await boundClient(t, s.srv.endpoint);
    const ma = pattern(MAX, 1);
    const mb = pattern(MAX - 100, 2);
    const pa = a.c.request(ma, a.reply, 20_000);
    await until(
      () => (s.srv.registry.snapshot().gauges.transport_server_buffered_bytes ?? 0) >= MAX,
      "A charged",
    );
    const pb = b.c.request(mb, b.reply, 20_000);
    await until(() => s.counter("transport_server_budget_waits") >= 1, "B paused for budget");
    // An unbound connection's incomplete message does not fit either: it is closed.
    const raw = await rawConnect(s.srv.endpoint);
    const got = collect(raw);
    raw.write(Buffer.concat([prefix(3000), pattern(10, 1)]));
    await got.closed;
    expect(s.counter("transport_server_budget_refused")).toBe(1);
    expect(await pa).toBe(MAX);
    expect(a.reply.equals(ma)).toBe(true);
    expect(await pb).toBe(MAX - 100);
    expect(b.reply.subarray(0, MAX - 100).equals(mb)).toBe(true);
    // Whole small messages need no budget: served while everything else waits.
    expect(await a.c.request(Buffer.from("small"), a.reply, 10_000)).toBe(5);
  });

  test("a receive buffer that cannot be allocated closes that connection, counted; the server goes on", async () => {
    const errors: unknown[] = [];
    const srv = await listenWithAllocator(
      "tcp://127.0.0.1:0",
      (req) => Buffer.from(req),
      { maxMessageBytes: 16 << 20, onError: (e) => errors.push(e) },
      (size) => {
        // What V8 throws when the pages are not there (a 2 GiB address-space cap, issue 13).
        if (size > 1 << 20) throw new RangeError("Array buffer allocation failed");
        return Buffer.allocUnsafe(size);
      },
    );
    cleanups.push(() => srv.close());
    const c = makeClient(srv.endpoint);
    cleanups.push(() => c.close());
    await c.connect(10_000);
    const reply = Buffer.alloc(4 << 20);
    expect(await c.request(pattern(1 << 20, 1), reply, 10_000)).toBe(1 << 20);
    const err = await c.request(pattern(4 << 20, 2), reply, 10_000).catch((e: TransportError) => e);
    expect((err as TransportError).code).toBe("TRANSPORT_CLOSED");
    const counters = srv.registry.snapshot().counters;
    expect(counters.transport_server_alloc_failures).toBe(1);
    expect((errors[0] as TransportError).cause).toBeInstanceOf(RangeError);
    await c.connect(10_000);
    expect(await c.request(Buffer.from("alive"), reply, 10_000)).toBe(5);
  });

  test("options are validated and named", async () => {
    const h = () => null;
    const bad = async (o: ServerOptions, re: RegExp) =>
      expect(await listen("tcp://127.0.0.1:0", h, o).catch((e: TransportError) => e.message)).toMatch(re);
    await bad({ maxMessageBytes: 100, unboundMaxMessageBytes: 101 }, /unboundMaxMessageBytes/);
    await bad({ maxMessageBytes: 100, maxBufferedBytes: 99 }, /maxBufferedBytes/);
    await bad({ maxConnections: -1 }, /maxConnections/);
    await bad({ unboundIdleMs: 1.5 }, /unboundIdleMs/);
    await bad({ onOversize: 3 } as never, /onOversize/);
    await bad({ onTlsError: "x" } as never, /onTlsError/);
  });
});

describe("tls: refused handshakes are reported with their reason (CONTRACT 11 tokens and TLS)", () => {
  test("no client certificate / a wrong one: connect() is TRANSPORT_CONNECT naming why; onTlsError and counters have the reason", async () => {
    const c = tlsCreds();
    const seen: [TlsFailureReason, string][] = [];
    const srv = await listen("tls://127.0.0.1:0", (r) => Buffer.from(r), {
      tls: { cert: c.cert, key: c.key, ca: c.ca, requestCert: true },
      onTlsError: (reason, remote) => seen.push([reason, remote]),
    });
    cleanups.push(() => srv.close());
    const none = makeClient(srv.endpoint, { tls: { ca: c.ca } });
    const e1 = (await none.connect(5000).catch((e: TransportError) => e)) as TransportError;
    expect(e1.code).toBe("TRANSPORT_CONNECT");
    expect(e1.message).toMatch(/requires a client certificate/);
    const wrong = makeClient(srv.endpoint, {
      tls: { ca: c.ca, cert: c.wrongClientCert, key: c.wrongClientKey },
    });
    const e2 = (await wrong.connect(5000).catch((e: TransportError) => e)) as TransportError;
    expect(e2.code).toBe("TRANSPORT_CONNECT");
    expect(e2.message).toMatch(/refused the client certificate/);
    await until(() => seen.length === 2, "both reported");
    expect(seen.map((x) => x[0])).toEqual(["no_certificate", "bad_certificate"]);
    expect(seen[0]?.[1]).toMatch(/^127\.0\.0\.1:\d+$/);
    const counters = srv.registry.snapshot().counters;
    expect(counters.transport_server_tls_failures).toBe(2);
    expect(counters.transport_server_tls_failures_no_certificate).toBe(1);
    expect(counters.transport_server_tls_failures_bad_certificate).toBe(1);
    // The right certificate still connects and is served.
    const good = makeClient(srv.endpoint, { tls: { ca: c.ca, cert: c.clientCert, key: c.clientKey } });
    cleanups.push(() => good.close());
    await good.connect(5000);
    expect(await good.request(Buffer.from("hi"), Buffer.alloc(8), 5000)).toBe(2);
  });

  test("maxConnections counts TLS handshakes; a handshake that never starts ends at unboundIdleMs", async () => {
    const t = caseOf("tls");
    const s = await serve(t, { maxConnections: 4, unboundIdleMs: 400 });
    const { c, reply } = await boundClient(t, s.srv.endpoint);
    // Plain TCP to the TLS port, no ClientHello: idle handshakes.
    const { connect } = await import("node:net");
    const port = Number(s.srv.endpoint.split(":").pop());
    const socks = Array.from({ length: 10 }, () => connect({ host: "127.0.0.1", port }));
    const done = socks.map((r) => collect(r).closed);
    await Promise.all(done);
    expect(s.counter("transport_server_connections_evicted")).toBeGreaterThanOrEqual(8);
    expect(await c.request(Buffer.from("ok"), reply, 10_000)).toBe(2);
  });
});

describe("zmq+tcp: peers (CONTRACT 11)", () => {
  const t = caseOf("zmq+tcp");

  async function dealer(endpoint: string): Promise<zmq.Dealer> {
    const d = new zmq.Dealer({ linger: 0 });
    d.connect(endpoint.replace("zmq+", ""));
    cleanups.push(() => d.close());
    return d;
  }

  test("an unbound peer's message above 4 KiB gets the hook's reply and the peer is forgotten; bound peers carry 1 MiB", async () => {
    const s = await serve(t);
    const d = await dealer(s.srv.endpoint);
    const head = pattern(24, 7);
    await d.send([head, pattern(10_000, 1)]);
    const [r] = await d.receive();
    expect(
      (r as Buffer).equals(Buffer.concat([Buffer.from("TOO_LARGE:"), head, Buffer.from(`:${10_024}`)])),
    ).toBe(true);
    await until(() => s.srv.connections === 0, "peer forgotten, nothing kept for its routing id");
    expect(s.counter("transport_server_oversize_replies")).toBe(1);
    const { c, reply } = await boundClient(t, s.srv.endpoint);
    const big = pattern(MAX, 3);
    expect(await c.requestParts([big.subarray(0, 1000), big.subarray(1000)], reply, 10_000)).toBe(MAX);
    expect(reply.equals(big)).toBe(true);
    expect(s.conns.at(-1)?.bound).toBe(true);
  });

  test("maxConnections evicts the idle-longest unbound peer; unboundIdleMs forgets silent ones", async () => {
    const s = await serve(t, { maxConnections: 4, unboundIdleMs: 300 });
    const { c, reply } = await boundClient(t, s.srv.endpoint);
    const ds = [];
    for (let i = 0; i < 6; i++) {
      const d = await dealer(s.srv.endpoint);
      await d.send(Buffer.from(`p${i}`));
      expect((await d.receive())[0]?.toString()).toBe(`p${i}`);
      ds.push(d);
    }
    // 1 bound + at most 2 unbound.
    expect(s.srv.connections).toBeLessThanOrEqual(3);
    expect(s.counter("transport_server_connections_evicted")).toBe(4);
    await until(() => s.srv.connections === 1, "silent unbound peers forgotten");
    expect(s.counter("transport_server_unbound_idle_closed")).toBe(2);
    expect(await c.request(Buffer.from("ok"), reply, 10_000)).toBe(2);
  });

  // A ROUTER never hears that a DEALER went away: without bound eviction, peers bound on DEALERs
  // since closed fill maxConnections and every new peer is dropped unanswered.
  test("maxConnections full of bound peers whose DEALERs closed: a new peer is served, the bound one idle longest forgotten", async () => {
    const closedPeers: ConnInfo[] = [];
    const s = await serve(t, { maxConnections: 4, onClose: (c) => closedPeers.push(c) });
    for (let i = 0; i < 4; i++) {
      const d = new zmq.Dealer({ linger: 0, receiveTimeout: 10_000 });
      d.connect(s.srv.endpoint.replace("zmq+", ""));
      await d.send(BIND);
      expect((await d.receive())[0]?.equals(BIND)).toBe(true);
      d.close();
    }
    expect(s.srv.connections).toBe(4);
    expect(s.conns.every((c) => c.bound)).toBe(true);
    const fresh = new zmq.Dealer({ linger: 0, receiveTimeout: 10_000 });
    cleanups.push(() => fresh.close());
    fresh.connect(s.srv.endpoint.replace("zmq+", ""));
    await fresh.send(Buffer.from("PING"));
    expect((await fresh.receive())[0]?.toString()).toBe("PING");
    expect(s.counter("transport_server_bound_evicted")).toBe(1);
    expect(s.counter("transport_server_connections_refused")).toBe(0);
    expect(closedPeers).toEqual([s.conns[0]]);
    expect(s.conns[0]?.bound).toBe(false);
    expect(s.srv.connections).toBe(4);
    // Further new peers that bind: the unbound PING peer goes first, then the dead bound ones.
    for (let i = 0; i < 3; i++) {
      const d = new zmq.Dealer({ linger: 0, receiveTimeout: 10_000 });
      cleanups.push(() => d.close());
      d.connect(s.srv.endpoint.replace("zmq+", ""));
      await d.send(BIND);
      expect((await d.receive())[0]?.equals(BIND)).toBe(true);
    }
    expect(s.counter("transport_server_connections_evicted")).toBe(1);
    expect(s.counter("transport_server_bound_evicted")).toBe(3);
    expect(closedPeers).toEqual([s.conns[0], s.conns[4], s.conns[1], s.conns[2]]);
    expect(s.srv.connections).toBe(4);
  });

  test("a live bound peer evicted at maxConnections reports unbound; its next message is a new, unbound peer", async () => {
    const closedPeers: ConnInfo[] = [];
    const s = await serve(t, { maxConnections: 4, onClose: (c) => closedPeers.push(c) });
    const clients = [];
    for (let i = 0; i < 4; i++) clients.push(await boundClient(t, s.srv.endpoint));
    // The first client is now the bound peer idle longest; the others spoke since.
    for (const k of clients.slice(1)) expect(await k.c.request(Buffer.from("x"), k.reply, 10_000)).toBe(1);
    const first = s.conns[0] as ConnInfo;
    expect(first.bound).toBe(true);
    const d = new zmq.Dealer({ linger: 0, receiveTimeout: 10_000 });
    cleanups.push(() => d.close());
    d.connect(s.srv.endpoint.replace("zmq+", ""));
    await d.send(Buffer.from("new"));
    expect((await d.receive())[0]?.toString()).toBe("new");
    expect(s.counter("transport_server_bound_evicted")).toBe(1);
    expect(closedPeers).toEqual([first]);
    expect(first.bound).toBe(false);
    // Same DEALER, same routing id: a new ConnInfo, unbound (the worker's NO_SESSION, then HELLO).
    const a = clients[0] as (typeof clients)[number];
    expect(await a.c.request(Buffer.from("again"), a.reply, 10_000)).toBe(5);
    const again = s.conns.at(-1) as ConnInfo;
    expect(again).not.toBe(first);
    expect(again.remote).toBe(first.remote);
    expect(again.bound).toBe(false);
    // Room for it came from the unbound "new" peer: unbound peers still go first.
    expect(s.counter("transport_server_connections_evicted")).toBe(1);
    expect(s.counter("transport_server_bound_evicted")).toBe(1);
  });

  test("budget: an unbound peer whose message does not fit is forgotten; a bound one waits and completes", async () => {
    const s = await serve(t, { maxBufferedBytes: MAX }, 300);
    const a = await boundClient(t, s.srv.endpoint);
    const b = await boundClient(t, s.srv.endpoint);
    const pa = a.c.request(pattern(MAX - 10, 1), a.reply, 20_000);
    await until(
      () => (s.srv.registry.snapshot().gauges.transport_server_buffered_bytes ?? 0) > 0,
      "A charged",
    );
    const pb = b.c.request(pattern(100_000, 2), b.reply, 20_000);
    await until(() => s.counter("transport_server_budget_waits") >= 1, "B waits");
    expect(await pa).toBe(MAX - 10);
    expect(await pb).toBe(100_000);
    expect(b.reply.subarray(0, 100_000).equals(pattern(100_000, 2))).toBe(true);
    gc();
  });
});
