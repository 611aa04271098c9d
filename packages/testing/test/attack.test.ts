import { once } from "node:events";
import { readFileSync } from "node:fs";
import type { Server, Socket } from "node:net";
import { connect, createServer } from "node:net";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, test } from "vitest";
import {
  announce,
  attackTarget,
  fdCountOf,
  isAlive,
  killAllChildren,
  memoryOf,
  openMany,
  rssOf,
  slowloris,
  spawnBin,
  waitUntil,
  watchRss,
  withFdLimit,
} from "../src/index.js";

afterAll(killAllChildren);

const HOLD = fileURLToPath(new URL("./fixtures/hold-server.mjs", import.meta.url));

async function listen(onConn: (s: Socket) => void, configure?: (srv: Server) => void) {
  const received: Buffer[] = [];
  const conns = new Set<Socket>();
  const srv = createServer((s) => {
    conns.add(s);
    s.on("data", (d: Buffer) => received.push(d));
    s.on("error", () => {});
    s.on("close", () => conns.delete(s));
    onConn(s);
  });
  configure?.(srv);
  srv.listen(0, "127.0.0.1");
  await once(srv, "listening");
  const port = (srv.address() as { port: number }).port;
  return {
    endpoint: `tcp://127.0.0.1:${port}`,
    port,
    received,
    conns,
    close: () =>
      new Promise<void>((r) => {
        for (const c of conns) c.destroy();
        srv.close(() => r());
      }),
  };
}

describe("attack targets and prefixes", () => {
  test("announce is a little-endian u32 (CONTRACT 3)", () => {
    expect([...announce(96 << 20)]).toEqual([0x00, 0x00, 0x00, 0x06]);
    expect([...announce(1)]).toEqual([1, 0, 0, 0]);
    expect(() => announce(2 ** 32)).toThrow(/u32/);
  });

  test("attackTarget maps every tapwire scheme to a raw socket target", () => {
    expect(attackTarget("tcp://127.0.0.1:5")).toEqual({ host: "127.0.0.1", port: 5 });
    expect(attackTarget("zmq+tcp://127.0.0.1:5")).toEqual({ host: "127.0.0.1", port: 5 });
    expect(attackTarget("tls://[::1]:5")).toEqual({ host: "::1", port: 5, tls: true });
    expect(attackTarget("unix:///tmp/x.sock")).toEqual({ path: "/tmp/x.sock" });
    expect(attackTarget("zmq+ipc:///tmp/y")).toEqual({ path: "/tmp/y" });
    expect(() => attackTarget("http://x:1")).toThrow(/endpoint/);
  });
});

describe("openMany", () => {
  test("opens n connections that stay open, each sending the prefix once", async () => {
    const srv = await listen(() => {});
    const flood = await openMany(srv.endpoint, 200, { send: announce(96 << 20), concurrency: 32 });
    try {
      expect(flood.opened).toBe(200);
      expect(flood.failed).toEqual({});
      await waitUntil(() => srv.conns.size === 200 && Buffer.concat(srv.received).length === 800, {
        what: "200 connections and 800 bytes on the server",
      });
      expect(flood.open).toBe(200);
      expect(flood.closedByPeer).toBe(0);
    } finally {
      await flood.close();
    }
    await waitUntil(() => srv.conns.size === 0, { what: "server sees every connection closed" });
    expect(flood.closedByPeer).toBe(0);
    await srv.close();
  });

  test("counts connections the server closes, and refusals by code", async () => {
    const srv = await listen(
      () => {},
      (s) => {
        s.maxConnections = 10;
      },
    );
    const flood = await openMany(srv.endpoint, 30);
    try {
      expect(flood.opened + Object.values(flood.failed).reduce((a, b) => a + b, 0)).toBe(30);
      await flood.waitClosedByPeer(20 - (30 - flood.opened), 10_000);
      expect(flood.open).toBeLessThanOrEqual(10);
    } finally {
      await flood.close();
      await srv.close();
    }
    const refused = await openMany(srv.endpoint, 5);
    expect(refused.opened).toBe(0);
    expect(refused.failed).toEqual({ ECONNREFUSED: 5 });
  });

  test("bounds are enforced", async () => {
    await expect(openMany("tcp://127.0.0.1:1", 100_001)).rejects.toThrow(/option n/);
    await expect(openMany("tcp://127.0.0.1:1", 1, { timeoutMs: 10 ** 9 })).rejects.toThrow(
      /option timeoutMs/,
    );
    await expect(slowloris("tcp://127.0.0.1:1", { durationMs: 0 })).rejects.toThrow(/option durationMs/);
  });
});

describe("slowloris", () => {
  test("a server with a header deadline closes every dripping connection", async () => {
    const srv = await listen((s) => {
      // a careful server: the 4-byte prefix and body must arrive within 300 ms of the accept
      const t = setTimeout(() => s.destroy(), 300);
      s.on("close", () => clearTimeout(t));
    });
    const r = await slowloris(srv.endpoint, { connections: 20, intervalMs: 50, durationMs: 20_000 });
    expect(r.opened).toBe(20);
    expect(r.closedByPeer).toBe(20);
    expect(r.closeAfterMs).toHaveLength(20);
    expect(r.stillOpen).toBe(0);
    await srv.close();
  });

  test("a server that waits for whole messages keeps them; the drip is the payload then zeros", async () => {
    const srv = await listen(() => {});
    const r = await slowloris(srv.endpoint, {
      connections: 5,
      payload: announce(1000),
      bytesPerTick: 3,
      intervalMs: 20,
      durationMs: 300,
    });
    expect(r.opened).toBe(5);
    expect(r.closedByPeer).toBe(0);
    expect(r.stillOpen).toBe(5);
    await waitUntil(() => Buffer.concat(srv.received).length === r.bytesSent, { what: "every dripped byte" });
    expect(r.bytesSent % 15).toBe(0);
    await srv.close();
  });
});

describe("process probes and limits", () => {
  test("rssOf / memoryOf see a real child grow; isAlive and fdCountOf follow it", async () => {
    const child = await spawnBin(HOLD, []);
    const port = child.readyLine.json!.port as number;
    const before = rssOf(child.pid);
    const watch = watchRss(child.pid, { intervalMs: 10 });
    const s = connect({ host: "127.0.0.1", port });
    await once(s, "connect");
    s.write("ALLOC\n");
    await once(s, "data");
    const after = memoryOf(child.pid);
    expect(after.rssBytes - before).toBeGreaterThan(48 << 20);
    expect(after.peakRssBytes).toBeGreaterThanOrEqual(after.rssBytes);
    expect(after.vmBytes).toBeGreaterThan(after.rssBytes);
    await waitUntil(() => watch.peakBytes >= after.rssBytes - (4 << 20), {
      what: "the sampler sees the peak",
    });
    expect(watch.stop().samples).toBeGreaterThan(1);
    const fds = fdCountOf(child.pid);
    const flood = await openMany(`tcp://127.0.0.1:${port}`, 50);
    await waitUntil(() => fdCountOf(child.pid) >= fds + 50, { what: "50 more descriptors in the child" });
    await flood.close();
    s.destroy();
    expect(isAlive(child.pid)).toBe(true);
    await child.kill("SIGKILL");
    expect(isAlive(child.pid)).toBe(false);
    expect(() => rssOf(child.pid)).toThrow(/gone/);
  });

  test("withFdLimit lowers the child's descriptor limit; an idle flood then hits it", async () => {
    const child = await spawnBin(HOLD, [], withFdLimit(64));
    const limits = readFileSync(`/proc/${child.pid}/limits`, "utf8");
    expect(limits).toMatch(/Max open files\s+64\s+64/);
    expect(readFileSync(`/proc/${child.pid}/cmdline`, "utf8")).toContain("hold-server.mjs");
    const port = child.readyLine.json!.port as number;
    const flood = await openMany(`tcp://127.0.0.1:${port}`, 120, { connectTimeoutMs: 2000 });
    // the kernel completes every handshake (the rest wait in the backlog), the child cannot hold
    // them all: libuv closes one it cannot accept (EMFILE), which the flood sees as closed by peer
    await flood.waitClosedByPeer(1, 10_000);
    expect(fdCountOf(child.pid)).toBeLessThanOrEqual(66);
    expect(isAlive(child.pid)).toBe(true);
    await flood.close();
    await child.kill();
  });

  test("limits are validated", async () => {
    await expect(spawnBin(HOLD, [], withFdLimit(1))).rejects.toThrow(/limits.nofile/);
    await expect(spawnBin(HOLD, [], { limits: { addressSpaceBytes: 1024 } })).rejects.toThrow(
      /limits.addressSpaceBytes/,
    );
  });
});
