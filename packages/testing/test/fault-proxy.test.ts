import { randomBytes } from "node:crypto";
import { once } from "node:events";
import type { AddressInfo, Socket } from "node:net";
import { connect, createServer } from "node:net";
import { connect as tlsConnect, createServer as tlsCreateServer } from "node:tls";
import { afterEach, describe, expect, test } from "vitest";
import type { FaultProxy } from "../src/index.js";
import { makeTlsCredentials, startEchoServer, startFaultProxy, uniqueSocketPath } from "../src/index.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()!();
});

/** A target server that records what it receives per connection and echoes it back. */
async function recordingEcho(): Promise<{ target: { host: string; port: number }; conns: Buffer[][] }> {
  const conns: Buffer[][] = [];
  const sockets = new Set<Socket>();
  const server = createServer({ allowHalfOpen: true }, (s) => {
    const got: Buffer[] = [];
    conns.push(got);
    sockets.add(s);
    s.on("data", (d: Buffer) => {
      got.push(Buffer.from(d));
      s.write(d);
    });
    s.on("end", () => s.end());
    s.on("error", () => {});
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  cleanups.push(
    () =>
      new Promise<void>((r) => {
        server.close(() => r());
        for (const s of sockets) s.destroy();
      }),
  );
  return { target: { host: "127.0.0.1", port: (server.address() as AddressInfo).port }, conns };
}

async function proxyTo(target: { host: string; port: number } | { path: string }): Promise<FaultProxy> {
  const p = await startFaultProxy(target);
  cleanups.push(() => p.close());
  return p;
}

/** A real client: collects everything it receives and remembers how the connection ended. */
async function client(p: FaultProxy) {
  const s = connect({ host: "127.0.0.1", port: p.port });
  const chunks: Buffer[] = [];
  let ended = false;
  let error: Error | undefined;
  s.on("data", (d: Buffer) => chunks.push(d));
  s.on("end", () => {
    ended = true;
  });
  s.on("error", (e) => {
    error = e;
  });
  const closed = new Promise<void>((r) => s.once("close", () => r()));
  await once(s, "connect");
  cleanups.push(() => {
    s.destroy();
  });
  return {
    s,
    closed,
    received: () => Buffer.concat(chunks),
    get ended() {
      return ended;
    },
    get error() {
      return error;
    },
    /** Resolves once at least `n` bytes arrived. */
    async receive(n: number): Promise<Buffer> {
      while (Buffer.concat(chunks).length < n) await once(s, "data");
      return Buffer.concat(chunks);
    },
  };
}

async function until(cond: () => boolean): Promise<void> {
  while (!cond()) await new Promise((r) => setImmediate(r));
}

/** Writes `data` in `step`-byte writes. */
function writeInSteps(s: Socket, data: Buffer, step: number): void {
  for (let o = 0; o < data.length; o += step) s.write(data.subarray(o, o + step));
}

describe("fault proxy, no fault", () => {
  test("forwards bytes both ways unchanged (tcp target) and counts them", async () => {
    const echo = await startEchoServer();
    cleanups.push(() => echo.close());
    const p = await proxyTo(echo.target);
    expect(p.endpoint).toBe(`tcp://127.0.0.1:${p.port}`);
    const c = await client(p);
    const data = randomBytes(1 << 20);
    writeInSteps(c.s, data, 65536);
    expect((await c.receive(data.length)).equals(data)).toBe(true);
    expect(p.stats.connections).toBe(1);
    expect(p.stats.active).toBe(1);
    expect(p.stats.bytesUp).toBe(data.length);
    expect(p.stats.bytesDown).toBe(data.length);
    expect(p.stats.faults).toEqual({ latency: 0, stall: 0, drop_after: 0, corrupt: 0, refuse: 0 });
    c.s.end();
    await c.closed;
    await until(() => p.stats.active === 0);
  });

  test("forwards to a unix socket target and passes half-close through", async () => {
    const path = uniqueSocketPath("echo");
    const echo = await startEchoServer(path);
    cleanups.push(() => echo.close());
    const p = await proxyTo({ path });
    const c = await client(p);
    c.s.end(Buffer.from("hello over unix"));
    await c.closed;
    expect(c.received().toString()).toBe("hello over unix");
    expect(c.ended).toBe(true);
  });

  test("a target that is down closes the client connection", async () => {
    const echo = await startEchoServer();
    const target = echo.target;
    await echo.close();
    const p = await proxyTo(target);
    const c = await client(p);
    await c.closed;
    expect(c.received().length).toBe(0);
    await until(() => p.stats.active === 0);
  });
});

describe("fault: latency", () => {
  test("delays every chunk by at least ms and keeps the stream in order", async () => {
    const { target, conns } = await recordingEcho();
    const p = await proxyTo(target);
    const c = await client(p);
    p.setFault({ kind: "latency", ms: 60, direction: "up" });
    const data = randomBytes(20_000);
    const t0 = performance.now();
    writeInSteps(c.s, data, 100);
    await until(() => p.stats.faults.latency > 0);
    // the proxy has the bytes but the target has none yet
    expect(conns[0]?.length ?? 0).toBe(0);
    const got = await c.receive(data.length);
    // a lower bound, never an upper one: forwarding earlier than the delay would be the bug
    expect(performance.now() - t0).toBeGreaterThanOrEqual(59);
    expect(got.equals(data)).toBe(true);
    expect(p.stats.faults.latency).toBeGreaterThan(0);
  });

  test("applies to each direction, and clearing it lets queued chunks out at their time", async () => {
    const echo = await startEchoServer();
    cleanups.push(() => echo.close());
    const p = await proxyTo(echo.target);
    const c = await client(p);
    p.setFault({ kind: "latency", ms: 30 });
    const t0 = performance.now();
    c.s.write("ping");
    const got = await c.receive(4);
    expect(performance.now() - t0).toBeGreaterThanOrEqual(59); // 30 up + 30 down
    expect(got.toString()).toBe("ping");
    p.setFault(null);
    c.s.write("pong");
    expect((await c.receive(8)).toString()).toBe("pingpong");
  });
});

describe("fault: stall", () => {
  test("holds bytes until cleared, then releases them in order", async () => {
    const { target, conns } = await recordingEcho();
    const p = await proxyTo(target);
    const c = await client(p);
    c.s.write("a");
    await c.receive(1);
    p.setFault({ kind: "stall" });
    const data = randomBytes(50_000);
    writeInSteps(c.s, data, 1000);
    // every chunk the proxy read is counted as held; wait until it has read all of them
    await until(() => p.stats.faults.stall > 0);
    await new Promise((r) => setTimeout(r, 50));
    expect(Buffer.concat(conns[0]!).length).toBe(1);
    expect(c.received().length).toBe(1);
    expect(p.stats.bytesUp).toBe(1);
    p.setFault(null);
    const got = await c.receive(1 + data.length);
    expect(got.subarray(1).equals(data)).toBe(true);
  });

  test("a down-only stall lets requests reach the target but holds the replies", async () => {
    const { target, conns } = await recordingEcho();
    const p = await proxyTo(target);
    const c = await client(p);
    p.setFault({ kind: "stall", direction: "down" });
    c.s.write("request");
    await until(() => (conns[0] !== undefined ? Buffer.concat(conns[0]).length === 7 : false));
    await until(() => p.stats.faults.stall > 0);
    expect(c.received().length).toBe(0);
    p.setFault({ kind: "latency", ms: 0 });
    expect((await c.receive(7)).toString()).toBe("request");
  });
});

describe("fault: drop_after", () => {
  test("up: the target gets exactly N bytes, then both sides are closed", async () => {
    const { target, conns } = await recordingEcho();
    const p = await proxyTo(target);
    p.setFault({ kind: "drop_after", bytes: 1234, direction: "up" });
    const c = await client(p);
    const data = randomBytes(10_000);
    writeInSteps(c.s, data, 500);
    await c.closed;
    await until(() => p.stats.active === 0 && conns.length === 1);
    await until(() => Buffer.concat(conns[0]!).length >= 1234);
    await new Promise((r) => setTimeout(r, 20));
    expect(Buffer.concat(conns[0]!).equals(data.subarray(0, 1234))).toBe(true);
    expect(p.stats.bytesUp).toBe(1234);
    expect(p.stats.faults.drop_after).toBe(1);
  });

  test("down: the client gets exactly the first N bytes of the reply stream, then the end", async () => {
    const echo = await startEchoServer();
    cleanups.push(() => echo.close());
    const p = await proxyTo(echo.target);
    p.setFault({ kind: "drop_after", bytes: 777, direction: "down" });
    const c = await client(p);
    const data = randomBytes(5000);
    writeInSteps(c.s, data, 100);
    await c.closed;
    expect(c.received().equals(data.subarray(0, 777))).toBe(true);
    expect(c.ended).toBe(true);
    expect(p.stats.faults.drop_after).toBe(1);
  });

  test("counts per connection: every new connection gets its own N bytes; 0 drops at the first byte", async () => {
    const echo = await startEchoServer();
    cleanups.push(() => echo.close());
    const p = await proxyTo(echo.target);
    p.setFault({ kind: "drop_after", bytes: 10, direction: "down" });
    for (let i = 0; i < 3; i++) {
      const c = await client(p);
      c.s.write(Buffer.alloc(100, i));
      await c.closed;
      expect(c.received().equals(Buffer.alloc(10, i))).toBe(true);
    }
    p.setFault({ kind: "drop_after", bytes: 0 });
    const c = await client(p);
    c.s.write("x");
    await c.closed;
    expect(c.received().length).toBe(0);
    expect(p.stats.faults.drop_after).toBe(4);
  });
});

describe("fault: corrupt", () => {
  test("down: flips exactly the byte at the absolute offset, whatever the chunking", async () => {
    const echo = await startEchoServer();
    cleanups.push(() => echo.close());
    const p = await proxyTo(echo.target);
    p.setFault({ kind: "corrupt", offset: 70_001, direction: "down" });
    const c = await client(p);
    const data = randomBytes(100_000);
    writeInSteps(c.s, data, 999);
    const got = await c.receive(data.length);
    const diff = [...got.keys()].filter((i) => got[i] !== data[i]);
    expect(diff).toEqual([70_001]);
    expect(got[70_001]).toBe(data[70_001]! ^ 0xff);
    expect(p.stats.faults.corrupt).toBe(1);
  });

  test("up with a mask: the target sees the flipped byte; each new connection is corrupted again", async () => {
    const { target, conns } = await recordingEcho();
    const p = await proxyTo(target);
    p.setFault({ kind: "corrupt", offset: 3, direction: "up", mask: 0x01 });
    for (let i = 0; i < 2; i++) {
      const c = await client(p);
      c.s.write(Buffer.from([0, 1, 2, 3, 4, 5]));
      const got = await c.receive(6);
      expect([...got]).toEqual([0, 1, 2, 2, 4, 5]);
      expect([...Buffer.concat(conns[i]!)]).toEqual([0, 1, 2, 2, 4, 5]);
    }
    expect(p.stats.faults.corrupt).toBe(2);
  });

  test("both directions (the default) flip the byte twice through an echo", async () => {
    const { target, conns } = await recordingEcho();
    const p = await proxyTo(target);
    p.setFault({ kind: "corrupt", offset: 1 });
    const c = await client(p);
    c.s.write("abc");
    expect((await c.receive(3)).toString()).toBe("abc");
    expect(Buffer.concat(conns[0]!)[1]).toBe("b".charCodeAt(0) ^ 0xff);
    expect(p.stats.faults.corrupt).toBe(2);
  });

  test("relative offsets count from each open connection's position when the fault is set", async () => {
    const echo = await startEchoServer();
    cleanups.push(() => echo.close());
    const p = await proxyTo(echo.target);
    const c = await client(p);
    c.s.write(Buffer.alloc(1000, 1));
    await c.receive(1000);
    p.setFault({ kind: "corrupt", offset: 5, direction: "down", relative: true });
    c.s.write(Buffer.alloc(10, 2));
    const got = (await c.receive(1010)).subarray(1000);
    expect([...got]).toEqual([2, 2, 2, 2, 2, 2 ^ 0xff, 2, 2, 2, 2]);
    // a new connection counts from its own start
    const d = await client(p);
    d.s.write(Buffer.alloc(10, 3));
    expect([...(await d.receive(10))]).toEqual([3, 3, 3, 3, 3, 3 ^ 0xff, 3, 3, 3, 3]);
    // drop_after relative: 4 more bytes down, then the end
    p.setFault({ kind: "drop_after", bytes: 4, direction: "down", relative: true });
    c.s.write(Buffer.alloc(10, 4));
    await c.closed;
    expect([...c.received().subarray(1010)]).toEqual([4, 4, 4, 4]);
  });

  test("a corrupted TLS record is rejected by the peer", async () => {
    const creds = makeTlsCredentials();
    const server = tlsCreateServer({ cert: creds.serverCert, key: creds.serverKey }, (s) => {
      s.on("data", (d) => s.write(d));
      s.on("error", () => {});
    });
    server.listen(0, "127.0.0.1");
    await once(server, "listening");
    cleanups.push(() => new Promise<void>((r) => server.close(() => r())));
    const p = await proxyTo({ host: "127.0.0.1", port: (server.address() as AddressInfo).port });
    const tlsClient = async () => {
      const s = tlsConnect({ host: "127.0.0.1", port: p.port, ca: creds.ca });
      cleanups.push(() => {
        s.destroy();
      });
      await once(s, "secureConnect");
      return s;
    };
    // clean path first: TLS through the proxy works
    const ok = await tlsClient();
    ok.write("hello");
    expect(((await once(ok, "data"))[0] as Buffer).toString()).toBe("hello");
    ok.destroy();
    // then, on a new connection, flip a byte inside the reply's application-data record
    const downBefore = p.stats.bytesDown;
    const c = await tlsClient();
    await new Promise((r) => setTimeout(r, 20)); // let session tickets pass too
    const handshakeDown = p.stats.bytesDown - downBefore;
    expect(handshakeDown).toBeGreaterThan(0);
    expect(handshakeDown).toBeLessThan(4000); // so offset 4000 (per connection) lands in the reply
    p.setFault({ kind: "corrupt", offset: 4000, direction: "down" });
    const errored = once(c, "error").then(
      (e) => e[0] as Error,
      (e: unknown) => e as Error,
    );
    c.write(Buffer.alloc(8000, 7));
    const err = await errored;
    expect(String((err as { code?: string }).code ?? err.message)).toMatch(
      /DECRYPT|BAD_RECORD_MAC|bad record mac/i,
    );
  });
});

describe("fault: refuse, dropAll, close", () => {
  test("refuse resets new connections, keeps existing ones, and is undone by clearing", async () => {
    const echo = await startEchoServer();
    cleanups.push(() => echo.close());
    const p = await proxyTo(echo.target);
    const old = await client(p);
    p.setFault({ kind: "refuse" });
    const s = connect({ host: "127.0.0.1", port: p.port });
    const err = await new Promise<Error | undefined>((resolve) => {
      s.on("error", (e) => resolve(e));
      s.on("close", () => resolve(undefined));
    });
    expect(err === undefined || /ECONNRESET/.test(String((err as { code?: string }).code))).toBe(true);
    expect(p.stats.faults.refuse).toBe(1);
    expect(echo.connections()).toBe(1);
    old.s.write("still up");
    expect((await old.receive(8)).toString()).toBe("still up");
    p.setFault(null);
    const fresh = await client(p);
    fresh.s.write("new");
    expect((await fresh.receive(3)).toString()).toBe("new");
  });

  test("dropAll closes every open connection; new connections still work", async () => {
    const echo = await startEchoServer();
    cleanups.push(() => echo.close());
    const p = await proxyTo(echo.target);
    const a = await client(p);
    const b = await client(p);
    a.s.write("x");
    b.s.write("y");
    await a.receive(1);
    await b.receive(1);
    p.dropAll();
    await Promise.all([a.closed, b.closed]);
    expect(p.stats.active).toBe(0);
    const c = await client(p);
    c.s.write("z");
    expect((await c.receive(1)).toString()).toBe("z");
  });

  test("close leaves no timer or socket behind, even with delayed bytes in flight", async () => {
    const echo = await startEchoServer();
    cleanups.push(() => echo.close());
    const resources = () =>
      process.getActiveResourcesInfo().filter((r) => r === "Timeout" || r === "TCPSocketWrap");
    const before = resources().length;
    const p = await startFaultProxy(echo.target, { fault: { kind: "latency", ms: 10_000 } });
    const c = await client(p);
    c.s.write("never delivered");
    await until(() => p.stats.faults.latency > 0);
    await p.close();
    await c.closed;
    await until(() => resources().length <= before);
    expect(resources().length).toBeLessThanOrEqual(before);
    expect(c.received().length).toBe(0);
    await expect(client(p)).rejects.toThrow(/ECONNREFUSED/);
  });

  test("bad faults and options are refused naming the problem", async () => {
    const echo = await startEchoServer();
    cleanups.push(() => echo.close());
    const p = await proxyTo(echo.target);
    const bad = [
      { kind: "latency", ms: -1 },
      { kind: "drop_after", bytes: 1.5 },
      { kind: "corrupt", offset: -2 },
      { kind: "corrupt", offset: 0, mask: 0 },
      { kind: "stall", direction: "sideways" },
      { kind: "explode" },
    ];
    for (const f of bad) {
      expect(() => p.setFault(f as never)).toThrow(expect.objectContaining({ code: "TESTING_BAD_OPTION" }));
    }
    expect(p.fault).toBe(null);
    await expect(startFaultProxy({ host: "127.0.0.1", port: 0 })).rejects.toMatchObject({
      code: "TESTING_BAD_OPTION",
    });
    await expect(startFaultProxy(echo.target, { port: 70_000 })).rejects.toThrow(/option port/);
  });
});
