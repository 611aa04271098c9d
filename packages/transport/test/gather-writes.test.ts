// Issue 23: with koffi installed, a tcp/unix client writes a request of many parts (a STEP's
// prefix and its row views) with one writev(2) straight from the caller's buffers, and whatever
// the kernel did not take through the socket's ordinary writes, in order. The bytes on the wire
// must be exactly the CONTRACT 3 frame (u32 little-endian length, then the parts), also when the
// kernel takes only part of them (a 16 MiB request), and without koffi nothing changes.
import { createHash } from "node:crypto";
import { afterEach, describe, expect, test } from "vitest";
import { listen, makeClient, type RpcClient, type RpcServer } from "../src/index.js";
import { setNativeKoffiForTest } from "../src/native.js";
import { caseOf, pattern } from "./helpers/env.js";

const servers: RpcServer[] = [];
const clients: RpcClient[] = [];
afterEach(async () => {
  setNativeKoffiForTest(null);
  for (const c of clients.splice(0)) c.close();
  for (const s of servers.splice(0)) await s.close();
});

/** A server answering the SHA-256 of each request body (what arrived, byte for byte). */
async function hashServer(scheme: "tcp" | "unix"): Promise<RpcServer> {
  const srv = await listen(caseOf(scheme).listen(), (req) => createHash("sha256").update(req).digest(), {
    maxMessageBytes: 32 << 20,
  });
  servers.push(srv);
  return srv;
}

function split(msg: Buffer, head: number, parts: number): Buffer[] {
  const out = [msg.subarray(0, head)];
  const size = Math.ceil((msg.length - head) / parts);
  for (let off = head; off < msg.length; off += size)
    out.push(msg.subarray(off, Math.min(msg.length, off + size)));
  // an empty part in the middle is skipped on the wire
  out.splice(3, 0, Buffer.alloc(0));
  return out;
}

const counter = (c: RpcClient, name: string) => c.registry.snapshot().counters[name] ?? 0;

for (const scheme of ["tcp", "unix"] as const) {
  describe(`${scheme}: gathered writes of many parts (issue 23, CONTRACT 3)`, () => {
    for (const size of [64 * 24 * 1024 + 1792, 16 << 20]) {
      test(`with koffi: a ${size}-byte request of 65 parts arrives exactly (one writev, the rest in order)`, async () => {
        const srv = await hashServer(scheme);
        const c = makeClient(srv.endpoint, { maxMessageBytes: 32 << 20 });
        clients.push(c);
        await c.connect(5000);
        const reply = Buffer.alloc(32);
        for (let k = 0; k < 3; k++) {
          const msg = pattern(size, k + 20);
          expect(await c.requestParts(split(msg, 1792, 64), reply, 30_000)).toBe(32);
          expect(reply.toString("hex")).toBe(createHash("sha256").update(msg).digest("hex"));
        }
        expect(counter(c, "transport_client_gathered_writes")).toBe(3);
        // few parts (below 8) and whole messages take the ordinary writes
        const small = pattern(5000, 3);
        expect(await c.requestParts(split(small, 100, 2), reply, 10_000)).toBe(32);
        expect(reply.toString("hex")).toBe(createHash("sha256").update(small).digest("hex"));
        expect(await c.request(small, reply, 10_000)).toBe(32);
        expect(counter(c, "transport_client_gathered_writes")).toBe(3);
      });
    }

    test("parts in small (in-heap) buffers fall back to the ordinary writes and arrive the same", async () => {
      const srv = await hashServer(scheme);
      const c = makeClient(srv.endpoint, {});
      clients.push(c);
      await c.connect(5000);
      const parts = Array.from({ length: 20 }, (_, i) => new Uint8Array([i, i + 1, i + 2]));
      const reply = Buffer.alloc(32);
      expect(await c.requestParts(parts, reply, 10_000)).toBe(32);
      expect(reply.toString("hex")).toBe(createHash("sha256").update(Buffer.concat(parts)).digest("hex"));
      expect(counter(c, "transport_client_gathered_writes")).toBe(0);
    });

    test("without koffi: the same request takes the socket's writes and arrives the same", async () => {
      setNativeKoffiForTest(() => {
        throw new Error("Cannot find module 'koffi'");
      });
      const srv = await hashServer(scheme);
      const c = makeClient(srv.endpoint, { maxMessageBytes: 32 << 20 });
      clients.push(c);
      await c.connect(5000);
      const msg = pattern(16 << 20, 9);
      const reply = Buffer.alloc(32);
      expect(await c.requestParts(split(msg, 1792, 64), reply, 30_000)).toBe(32);
      expect(reply.toString("hex")).toBe(createHash("sha256").update(msg).digest("hex"));
      expect(counter(c, "transport_client_gathered_writes")).toBe(0);
    });
  });
}
