import type * as net from "node:net";
import { afterEach, describe, expect, test } from "vitest";
import { listen, makeClient, type RpcClient, type RpcServer, TransportError } from "../src/index.js";
import { matrix, pattern, sleep } from "./helpers/env.js";
import {
  closed,
  fakeZmtpRouter,
  rawConnect,
  rawRouter,
  rawStreamServer,
  rawZmtpConnect,
  spawnServer,
  zmtpLongFrameHeader,
} from "./helpers/raw.js";

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const f of cleanups.splice(0).reverse()) await f();
});
function client(endpoint: string, opts: Parameters<typeof makeClient>[1] = {}): RpcClient {
  const c = makeClient(endpoint, opts);
  cleanups.push(() => c.close());
  return c;
}
async function server(...args: Parameters<typeof listen>): Promise<RpcServer> {
  const s = await listen(...args);
  cleanups.push(() => s.close());
  return s;
}
async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(TransportError);
    return (e as TransportError).code;
  }
  return "resolved";
}
async function until(cond: () => boolean): Promise<void> {
  for (let i = 0; i < 2000 && !cond(); i++) await sleep(5);
  expect(cond()).toBe(true);
}
function mem(): number {
  const m = process.memoryUsage();
  return m.arrayBuffers + m.heapUsed;
}

for (const t of matrix()) {
  describe(`${t.scheme}: faults (CONTRACT 3)`, () => {
    test("a server that never answers: TIMEOUT, then CLOSED fast, then a fresh connect works", async () => {
      let n = 0;
      const srv = await server(
        t.listen(),
        (req) => (n++ === 0 ? new Promise<null>(() => {}) : Buffer.from(req)),
        { ...t.server, closeTimeoutMs: 100 },
      );
      const c = client(srv.endpoint, t.client);
      await c.connect(5000);
      const reply = Buffer.alloc(64);
      const err = await c.request(Buffer.from("first"), reply, 100).catch((e: TransportError) => e);
      expect((err as TransportError).code).toBe("TRANSPORT_TIMEOUT");
      expect((err as Error).stack).toContain("faults.test.ts");
      expect(c.connected).toBe(false);
      expect(await codeOf(c.request(Buffer.from("x"), reply, 5000))).toBe("TRANSPORT_CLOSED");
      await c.connect(5000);
      const k = await c.request(Buffer.from("second"), reply, 5000);
      expect(reply.subarray(0, k).toString()).toBe("second");
      expect(c.registry.snapshot().counters["transport_client_timeouts"]).toBe(1);
    });

    test("a server killed mid-request: CLOSED (not a timeout)", async () => {
      const child = await spawnServer(t);
      cleanups.push(() => child.child.kill("SIGKILL"));
      const c = client(child.endpoint, t.client);
      await c.connect(10_000);
      const p = c.request(Buffer.from("hang"), Buffer.alloc(16), 30_000);
      await child.hanging;
      void child.child.kill("SIGKILL");
      expect(await codeOf(p)).toBe("TRANSPORT_CLOSED");
      expect(c.connected).toBe(false);
    });

    test("a late answer is never read as the answer to the next request", async () => {
      let first = true;
      const onReq = (body: Buffer, answer: (b: Buffer) => void): void => {
        if (first) {
          first = false;
          setTimeout(() => answer(Buffer.from(body)), 300);
        } else answer(Buffer.from(body));
      };
      let endpoint: string;
      if (t.stream) {
        const raw = await rawStreamServer(t, ({ body, sock }) =>
          onReq(body, (b) => {
            if (sock.destroyed) return;
            const h = Buffer.alloc(4);
            h.writeUInt32LE(b.length);
            sock.write(Buffer.concat([h, b]));
          }),
        );
        cleanups.push(() => raw.close());
        endpoint = raw.endpoint;
      } else {
        const raw = await rawRouter(t, (body, send) => onReq(body, (b) => void send(b)));
        cleanups.push(() => raw.close());
        endpoint = raw.endpoint;
      }
      const c = client(endpoint, t.client);
      await c.connect(5000);
      const reply = Buffer.alloc(64);
      expect(await codeOf(c.request(Buffer.from("AAAA"), reply, 50))).toBe("TRANSPORT_TIMEOUT");
      await c.connect(5000);
      await sleep(400); // the late "AAAA" answer has been sent by now
      const n = await c.request(Buffer.from("BBBB"), reply, 5000);
      expect(reply.subarray(0, n).toString()).toBe("BBBB");
      const m = await c.request(Buffer.from("CCCC"), reply, 5000);
      expect(reply.subarray(0, m).toString()).toBe("CCCC");
    });

    test("a server answering twice: the extra answer closes the connection", async () => {
      const twice = (b: Buffer): Buffer[] => [Buffer.from(b), Buffer.from(`${b.toString()}-again`)];
      let endpoint: string;
      if (t.stream) {
        const raw = await rawStreamServer(t, ({ body, sock }) => {
          const out: Buffer[] = [];
          for (const b of twice(body)) {
            const h = Buffer.alloc(4);
            h.writeUInt32LE(b.length);
            out.push(h, b);
          }
          sock.write(Buffer.concat(out));
        });
        cleanups.push(() => raw.close());
        endpoint = raw.endpoint;
      } else {
        const raw = await rawRouter(t, (body, send) => {
          for (const b of twice(body)) void send(b);
        });
        cleanups.push(() => raw.close());
        endpoint = raw.endpoint;
      }
      const c = client(endpoint, t.client);
      await c.connect(5000);
      const reply = Buffer.alloc(64);
      const n = await c.request(Buffer.from("one"), reply, 5000);
      expect(reply.subarray(0, n).toString()).toBe("one");
      await until(() => !c.connected);
      expect(await codeOf(c.request(Buffer.from("two"), reply, 5000))).toBe("TRANSPORT_CLOSED");
    });

    test("a reply larger than replyBuf is REPLY_TOO_LARGE, the connection closes, reconnect works", async () => {
      const srv = await server(t.listen(), (req) => Buffer.from(req), t.server);
      const c = client(srv.endpoint, t.client);
      await c.connect(5000);
      const small = Buffer.alloc(10);
      expect(await codeOf(c.request(pattern(11, 1), small, 5000))).toBe("TRANSPORT_REPLY_TOO_LARGE");
      expect(small.every((b) => b === 0)).toBe(true);
      expect(await codeOf(c.request(pattern(1, 1), small, 5000))).toBe("TRANSPORT_CLOSED");
      await c.connect(5000);
      expect(await c.request(pattern(10, 1), small, 5000)).toBe(10);
    });

    test("maxMessageBytes: a request above the server's limit is refused and the connection closed", async () => {
      const srv = await server(t.listen(), (req) => Buffer.from(req.subarray(0, 1)), {
        ...t.server,
        maxMessageBytes: 1000,
      });
      const c = client(srv.endpoint, t.client);
      await c.connect(5000);
      const reply = Buffer.alloc(16);
      expect(await c.request(Buffer.alloc(1000, 1), reply, 5000)).toBe(1);
      const code = await codeOf(c.request(Buffer.alloc(1001, 1), reply, 2000));
      // Stream servers close the connection; a ROUTER cannot, libzmq drops the peer's pipe.
      expect(["TRANSPORT_CLOSED", "TRANSPORT_TIMEOUT"]).toContain(code);
      if (t.stream) expect(code).toBe("TRANSPORT_CLOSED");
      await until(
        () => (srv.registry.snapshot().counters["transport_server_too_large"] ?? 0) >= (t.stream ? 1 : 0),
      );
      await c.connect(5000);
      expect(await c.request(Buffer.alloc(10, 1), reply, 5000)).toBe(1);
    });

    test("maxMessageBytes: a request above the client's own limit is refused before sending", async () => {
      const srv = await server(t.listen(), (req) => Buffer.from(req.subarray(0, 1)), t.server);
      const c = client(srv.endpoint, { ...t.client, maxMessageBytes: 100 });
      await c.connect(5000);
      const reply = Buffer.alloc(16);
      expect(await codeOf(c.requestParts([Buffer.alloc(60), Buffer.alloc(41)], reply, 5000))).toBe(
        "TRANSPORT_TOO_LARGE",
      );
      expect(c.connected).toBe(true);
      expect(await c.request(Buffer.alloc(100), reply, 5000)).toBe(1);
    });

    test("a 4 GiB length announced to the server is refused without allocating it", async () => {
      const srv = await server(t.listen(), (req) => Buffer.from(req), t.server);
      const before = mem();
      let sock: net.Socket;
      if (t.stream) {
        sock = await rawConnect(srv.endpoint);
        // 0xffffffff = 4 GiB - 1, the largest u32 prefix.
        sock.write(Buffer.from([0xff, 0xff, 0xff, 0xff, 1, 2, 3]));
      } else {
        sock = await rawZmtpConnect(srv.endpoint);
        sock.write(Buffer.concat([zmtpLongFrameHeader(4n << 30n), Buffer.alloc(16)]));
      }
      await closed(sock);
      expect(mem() - before).toBeLessThan(32 * 1024 * 1024);
      if (t.stream) expect(srv.registry.snapshot().counters["transport_server_too_large"]).toBe(1);
      // The server still works.
      const c = client(srv.endpoint, t.client);
      await c.connect(5000);
      expect(await c.request(Buffer.from("ok"), Buffer.alloc(4), 5000)).toBe(2);
    });

    test("a 4 GiB length announced to the client is refused without allocating it", async () => {
      let endpoint: string;
      if (t.stream) {
        const raw = await rawStreamServer(t, ({ sock }) =>
          sock.write(Buffer.from([0xff, 0xff, 0xff, 0xff, 9, 9])),
        );
        cleanups.push(() => raw.close());
        endpoint = raw.endpoint;
      } else {
        const fake = await fakeZmtpRouter(t, zmtpLongFrameHeader(4n << 30n));
        cleanups.push(() => fake.close());
        endpoint = fake.endpoint;
      }
      const c = client(endpoint, t.client);
      await c.connect(5000);
      const before = mem();
      const code = await codeOf(c.request(Buffer.from("x"), Buffer.alloc(64), 10_000));
      // Stream clients see the prefix; libzmq refuses it itself (ZMQ_MAXMSGSIZE) and drops the connection.
      expect(code).toBe(t.stream ? "TRANSPORT_TOO_LARGE" : "TRANSPORT_CLOSED");
      expect(mem() - before).toBeLessThan(32 * 1024 * 1024);
      expect(c.connected).toBe(false);
    });

    test("close() while a request is in flight rejects it with CLOSED; connect() again works", async () => {
      let n = 0;
      const srv = await server(
        t.listen(),
        async (req) => {
          if (n++ === 0) await sleep(200);
          return Buffer.from(req);
        },
        t.server,
      );
      const c = client(srv.endpoint, t.client);
      await c.connect(5000);
      const reply = Buffer.alloc(16);
      const p = c.request(Buffer.from("a"), reply, 5000);
      c.close();
      expect(await codeOf(p)).toBe("TRANSPORT_CLOSED");
      await c.connect(5000);
      expect(await c.request(Buffer.from("bb"), reply, 5000)).toBe(2);
    });

    test("server close() lets the in-flight handler finish and deliver, then refuses", async () => {
      let started: () => void = () => {};
      const go = new Promise<void>((r) => {
        started = r;
      });
      const srv = await listen(
        t.listen(),
        async (req) => {
          started();
          await sleep(100);
          return Buffer.from(req);
        },
        // Far beyond the test timeout: the graceful close must finish on its own, not by deadline.
        { ...t.server, closeTimeoutMs: 600_000 },
      );
      const c = client(srv.endpoint, t.client);
      await c.connect(5000);
      const reply = Buffer.alloc(16);
      const p = c.request(Buffer.from("inflight"), reply, 5000);
      await go;
      const closing = srv.close();
      expect(await p).toBe(8);
      expect(reply.subarray(0, 8).toString()).toBe("inflight");
      await closing;
      const code = await codeOf(c.request(Buffer.from("after"), reply, 300));
      expect(["TRANSPORT_CLOSED", "TRANSPORT_TIMEOUT"]).toContain(code);
    });

    test("a throwing handler closes that connection only, and is counted", async () => {
      const errors: unknown[] = [];
      const srv = await server(
        t.listen(),
        (req) => {
          if (req[0] === 0x21) throw new Error("boom");
          return Buffer.from(req);
        },
        { ...t.server, onError: (e) => errors.push(e) },
      );
      const bad = client(srv.endpoint, t.client);
      const good = client(srv.endpoint, t.client);
      await bad.connect(5000);
      await good.connect(5000);
      const reply = Buffer.alloc(16);
      const code = await codeOf(bad.request(Buffer.from("!x"), reply, t.stream ? 5000 : 300));
      expect(code).toBe(t.stream ? "TRANSPORT_CLOSED" : "TRANSPORT_TIMEOUT");
      expect(errors.length).toBe(1);
      expect(srv.registry.snapshot().counters["transport_server_errors"]).toBe(1);
      expect(await good.request(Buffer.from("fine"), reply, 5000)).toBe(4);
    });
  });
}

for (const t of matrix().filter((c) => c.stream)) {
  describe(`${t.scheme}: idle timeout (server idleTimeoutMs)`, () => {
    // Conditions, not durations: under load a connection may sit idle past idleTimeoutMs between
    // connect() and its request, and is then rightly closed before its handler starts (the CI
    // "not connected" failure). That is the feature working, not the case under test, so setup
    // retries on a fresh connection until the condition holds; what is asserted is only judged
    // once it does (the slow handler runs, then the other connection was used and went idle).
    test("an idle connection is closed; one whose handler is still running is not", async () => {
      const running: number[] = []; // attempt tags of "s" requests whose handler has started
      let release = (): void => {};
      const gate = new Promise<void>((r) => {
        release = r;
      });
      const srv = await server(
        t.listen(),
        async (req) => {
          if (req[0] === 0x73) {
            // "s": runs until released, i.e. as long as the test needs, past any idle timeout
            running.push(req[1]!);
            await gate;
          }
          return Buffer.from(req);
        },
        { ...t.server, idleTimeoutMs: 100 },
      );
      const reply = Buffer.alloc(16);
      let slow: RpcClient | null = null;
      let slowReply: Promise<number> | null = null;
      for (let k = 0; k < 10 && slow === null; k++) {
        const c = client(srv.endpoint, t.client);
        if ((await codeOf(c.connect(5000))) !== "resolved") continue;
        let failed = false;
        const p = c.request(Buffer.from([0x73, k]), reply, 60_000);
        p.catch(() => {
          failed = true; // closed before its handler started: try a fresh connection
        });
        await until(() => running.includes(k) || failed);
        if (running.includes(k)) {
          slow = c;
          slowReply = p;
        }
      }
      if (slow === null || slowReply === null) throw new Error("no slow request ever reached its handler");
      // From here the slow connection's handler runs. The idle connection is opened and used only
      // now, so its last activity comes after the slow request's; both idle timers run for 100 ms
      // and Node fires equal timers in start order, so by the time the idle one closes, the slow
      // one's timer has expired too (and must have been ignored because its handler is running).
      let idle: RpcClient | null = null;
      for (let k = 0; k < 10 && idle === null; k++) {
        const c = client(srv.endpoint, t.client);
        if ((await codeOf(c.connect(5000))) !== "resolved") continue;
        const r = Buffer.alloc(16);
        if ((await codeOf(c.request(Buffer.from("x"), r, 5000))) === "resolved" && r[0] === 0x78) idle = c;
      }
      if (idle === null) throw new Error("no idle connection ever got its reply");
      // The idle connection is closed by the server.
      await until(() => !idle.connected);
      expect(await codeOf(idle.request(Buffer.from("y"), reply, 1000))).toBe("TRANSPORT_CLOSED");
      // The slow request outlived that idle timeout and still gets its reply.
      release();
      expect(await slowReply).toBe(2);
      expect(reply[0]).toBe(0x73);
      // Its timer, ignored while the handler ran, is re-armed: once idle, it is closed too.
      await until(() => !slow.connected);
      await until(() => srv.connections === 0);
    });
  });
}

for (const t of matrix().filter((c) => !c.stream)) {
  describe(`${t.scheme}: idle timeout (server idleTimeoutMs)`, () => {
    test("an idle peer's state is forgotten (ZeroMQ cannot close one ROUTER peer); it can come back", async () => {
      const closedPeers: number[] = [];
      const srv = await server(t.listen(), (req) => Buffer.from(req), {
        ...t.server,
        idleTimeoutMs: 100,
        onClose: (c) => closedPeers.push(c.id),
      });
      const c = client(srv.endpoint, t.client);
      await c.connect(5000);
      const reply = Buffer.alloc(16);
      expect(await c.request(Buffer.from("a"), reply, 5000)).toBe(1);
      expect(srv.connections).toBe(1);
      await until(() => srv.connections === 0);
      expect(closedPeers).toEqual([1]);
      expect(await c.request(Buffer.from("bb"), reply, 5000)).toBe(2);
      expect(srv.connections).toBe(1);
    });
  });
}
