// Issue 23: a unix client connection asks for a send buffer that holds a whole request (up to
// 4 MiB), so a 1.5 MiB STEP leaves in one writev instead of one per 208 KiB the peer has read.
// koffi sets it (Node has no setsockopt for net.Socket); without koffi the socket keeps the
// kernel's default and works as before. CONTRACT 3 framing is unchanged either way.
import { readFileSync } from "node:fs";
import * as net from "node:net";
import { afterEach, describe, expect, test } from "vitest";
import { listen, makeClient, type RpcServer } from "../src/index.js";
import { setNativeKoffiForTest } from "../src/native.js";
import { socketBuffer } from "../src/sockopt.js";
import type { StreamClient } from "../src/stream-client.js";
import { pattern, uniqueSocketPath } from "./helpers/env.js";

const servers: RpcServer[] = [];
const clients: StreamClient[] = [];
afterEach(async () => {
  setNativeKoffiForTest(null);
  for (const c of clients.splice(0)) c.close();
  for (const s of servers.splice(0)) await s.close();
});

const FRAME = 64 * 24 * 1024 + 1792; // a 64 x 1 STEP of 24 KiB rows (client bench)

/** The kernel's default unix send buffer, as a plain node:net socket gets it. */
async function defaultSendBuffer(endpoint: string): Promise<number> {
  const path = endpoint.slice("unix://".length);
  const s = await new Promise<net.Socket>((resolve, reject) => {
    const c = net.connect({ path }, () => resolve(c));
    c.once("error", reject);
  });
  const n = socketBuffer(s, "send");
  s.destroy();
  return n;
}

async function echoServer(): Promise<RpcServer> {
  const srv = await listen(`unix://${uniqueSocketPath("tw-sndbuf")}`, (req) => [req, Buffer.from([7])], {
    maxMessageBytes: 8 << 20,
  });
  servers.push(srv);
  return srv;
}

async function roundTrips(c: StreamClient): Promise<void> {
  const reply = Buffer.alloc(FRAME + 1);
  for (let i = 0; i < 3; i++) {
    const msg = pattern(FRAME, i + 3);
    const parts = [msg.subarray(0, 1792)];
    for (let off = 1792; off < FRAME; off += 24 * 1024) parts.push(msg.subarray(off, off + 24 * 1024));
    expect(await c.requestParts(parts, reply, 20_000)).toBe(FRAME + 1);
    expect(Buffer.compare(reply.subarray(0, FRAME), msg)).toBe(0);
    expect(reply[FRAME]).toBe(7);
  }
}

describe("unix: the client's send buffer holds a whole request (issue 23)", () => {
  test("with koffi: SO_SNDBUF is raised to hold the request size (capped by net.core.wmem_max)", async () => {
    const srv = await echoServer();
    const before = await defaultSendBuffer(srv.endpoint);
    expect(before).toBeGreaterThan(0); // koffi is a devDependency here: getsockopt works
    const c = makeClient(srv.endpoint, { maxMessageBytes: 8 << 20 }) as StreamClient;
    clients.push(c);
    expect(c.sendBufferBytes).toBe(-1); // not connected
    await c.connect(5000);
    const wmemMax = Number(readFileSync("/proc/sys/net/core/wmem_max", "utf8").trim());
    // Linux stores twice the (capped) request: asked min(8 MiB + 4, 4 MiB).
    const want = 2 * Math.min(4 << 20, wmemMax);
    expect(c.sendBufferBytes).toBe(Math.max(before, want));
    if (want > before) expect(c.sendBufferBytes).toBeGreaterThan(before);
    await roundTrips(c);
  });

  test("a small maxMessageBytes asks for no more than a request needs", async () => {
    const srv = await echoServer();
    const before = await defaultSendBuffer(srv.endpoint);
    const c = makeClient(srv.endpoint, { maxMessageBytes: 1 << 20 }) as StreamClient;
    clients.push(c);
    await c.connect(5000);
    expect(c.sendBufferBytes).toBe(Math.max(before, 2 * ((1 << 20) + 4)));
  });

  test("without koffi: the kernel default is kept and requests still work", async () => {
    setNativeKoffiForTest(() => {
      throw new Error("Cannot find module 'koffi'");
    });
    const srv = await echoServer();
    const c = makeClient(srv.endpoint, { maxMessageBytes: 8 << 20 }) as StreamClient;
    clients.push(c);
    await c.connect(5000);
    expect(c.sendBufferBytes).toBe(-1);
    await roundTrips(c);
    setNativeKoffiForTest(null);
    // the socket really kept the default (measured with koffi back)
    expect(c.sendBufferBytes).toBe(await defaultSendBuffer(srv.endpoint));
  });

  test("tcp connections are left to the kernel's autotuning", async () => {
    const srv = await listen("tcp://127.0.0.1:0", (req) => req, { maxMessageBytes: 8 << 20 });
    servers.push(srv);
    const c = makeClient(srv.endpoint, { maxMessageBytes: 8 << 20 }) as StreamClient;
    clients.push(c);
    await c.connect(5000);
    const wmemMax = Number(readFileSync("/proc/sys/net/core/wmem_max", "utf8").trim());
    // SO_SNDBUF set explicitly would read 2 * min(request, wmem_max) and lock autotuning off
    expect(c.sendBufferBytes).not.toBe(2 * Math.min(4 << 20, wmemMax));
  });
});
