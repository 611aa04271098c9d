import { afterEach, describe, expect, test } from "vitest";
import { listen, makeClient, type RpcClient, type RpcServer, TransportError } from "../src/index.js";
import { matrix, pattern } from "./helpers/env.js";

const open: { servers: RpcServer[]; clients: RpcClient[] } = { servers: [], clients: [] };
afterEach(async () => {
  for (const c of open.clients.splice(0)) c.close();
  for (const s of open.servers.splice(0)) await s.close();
});

for (const t of matrix()) {
  describe(`${t.scheme}: round trips (CONTRACT 3)`, () => {
    test("echo of 0 B .. 16 MiB with content checks", async () => {
      // Echo with a trailer so a reply can never be mistaken for the request bytes left in a buffer.
      const srv = await listen(t.listen(), (req) => [req, Buffer.from([req.length & 0xff])], {
        ...t.server,
      });
      open.servers.push(srv);
      const c = makeClient(srv.endpoint, t.client);
      open.clients.push(c);
      await c.connect(5000);
      const reply = Buffer.alloc(16 * 1024 * 1024 + 1);
      const sizes = [0, 1, 3, 4, 5, 100, 4096, 65535, 65536, 65537, 96 * 1024, 768 * 1024, 4 << 20, 16 << 20];
      for (const [i, size] of sizes.entries()) {
        const msg = pattern(size, i + 1);
        reply.fill(0xee);
        const n = await c.request(msg, reply, 20_000);
        expect(n).toBe(size + 1);
        expect(Buffer.compare(reply.subarray(0, size), msg)).toBe(0);
        expect(reply[size]).toBe(size & 0xff);
      }
    });

    test("the server reports its bound endpoint (port 0 resolved)", async () => {
      const srv = await listen(t.listen(), () => new Uint8Array(0), t.server);
      open.servers.push(srv);
      expect(srv.endpoint.startsWith(`${t.scheme}://`)).toBe(true);
      expect(srv.endpoint).not.toMatch(/:0$/);
    });

    test("requestParts sends the concatenation of parts of many shapes", async () => {
      const srv = await listen(t.listen(), (req) => Buffer.from(req), t.server);
      open.servers.push(srv);
      const c = makeClient(srv.endpoint, t.client);
      open.clients.push(c);
      await c.connect(5000);
      const whole = pattern(300_000, 9);
      const reply = Buffer.alloc(whole.length);
      const shapes: number[][] = [
        [],
        [0],
        [0, 0, 0],
        [1],
        [7, 0, 9],
        [65536, 1],
        [1, 65536],
        [150_000, 150_000],
        [3, 5, 7, 11, 13],
      ];
      for (const shape of shapes) {
        const parts: Uint8Array[] = [];
        let off = 0;
        for (const len of shape) {
          parts.push(new Uint8Array(whole.buffer, whole.byteOffset + off, len));
          off += len;
        }
        const n = await c.requestParts(parts, reply, 10_000);
        expect(n).toBe(off);
        expect(Buffer.compare(reply.subarray(0, n), whole.subarray(0, off))).toBe(0);
      }
    });

    test("64 concurrent clients each get their own replies", async () => {
      const srv = await listen(
        t.listen(),
        async (req) => {
          await new Promise((r) => setImmediate(r));
          return Buffer.from(req);
        },
        t.server,
      );
      open.servers.push(srv);
      const clients = Array.from({ length: 64 }, () => makeClient(srv.endpoint, t.client));
      open.clients.push(...clients);
      await Promise.all(clients.map((c) => c.connect(10_000)));
      await Promise.all(
        clients.map(async (c, i) => {
          const reply = Buffer.alloc(2048);
          for (let k = 0; k < 5; k++) {
            const msg = pattern(1000 + i, i * 100 + k);
            const n = await c.request(msg, reply, 20_000);
            expect(n).toBe(msg.length);
            expect(Buffer.compare(reply.subarray(0, n), msg)).toBe(0);
          }
        }),
      );
    });

    test("a second concurrent request is TRANSPORT_BUSY and leaves the first intact", async () => {
      let release: (() => void) | null = null;
      const srv = await listen(
        t.listen(),
        async (req) => {
          await new Promise<void>((r) => {
            release = r;
          });
          return Buffer.from(req);
        },
        t.server,
      );
      open.servers.push(srv);
      const c = makeClient(srv.endpoint, t.client);
      open.clients.push(c);
      await c.connect(5000);
      const reply = Buffer.alloc(16);
      const first = c.request(Buffer.from("one"), reply, 10_000);
      const err = await c.request(Buffer.from("two"), Buffer.alloc(16), 10_000).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(TransportError);
      expect((err as TransportError).code).toBe("TRANSPORT_BUSY");
      while (release === null) await new Promise((r) => setImmediate(r));
      (release as () => void)();
      expect(await first).toBe(3);
      expect(reply.subarray(0, 3).toString()).toBe("one");
    });
  });
}
