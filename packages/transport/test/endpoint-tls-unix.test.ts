import { execFileSync } from "node:child_process";
import { existsSync, lstatSync, writeFileSync } from "node:fs";
import * as net from "node:net";
import fc from "fast-check";
import { describe, expect, test } from "vitest";
import { formatEndpoint, listen, makeClient, parseEndpoint, TransportError } from "../src/index.js";
import { tlsCreds, uniqueSocketPath } from "./helpers/env.js";

function code(f: () => unknown): string {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(TransportError);
    return (e as TransportError).code;
  }
  return "ok";
}

describe("endpoints (CONTRACT 3)", () => {
  test("valid forms parse and format back", () => {
    for (const ep of [
      "tcp://127.0.0.1:0",
      "tls://localhost:443",
      "zmq+tcp://[::1]:5555",
      "unix:///tmp/a.sock",
      "zmq+ipc:///tmp/b",
    ]) {
      expect(formatEndpoint(parseEndpoint(ep))).toBe(ep);
    }
  });
  test("bad forms are TRANSPORT_BAD_ENDPOINT naming the problem", () => {
    for (const ep of [
      "",
      "tcp:/x:1",
      "http://a:1",
      "tcp://a",
      "tcp://a:65536",
      "unix://rel",
      `unix:///${"x".repeat(200)}`,
      "tcp://*:1",
    ]) {
      expect(code(() => parseEndpoint(ep))).toBe("TRANSPORT_BAD_ENDPOINT");
      expect(code(() => makeClient(ep))).toBe("TRANSPORT_BAD_ENDPOINT");
    }
  });
  test("property: any string either parses to a formattable endpoint or throws TRANSPORT_BAD_ENDPOINT", () => {
    fc.assert(
      fc.property(
        fc.oneof(
          fc.string(),
          fc.constantFrom("tcp://", "unix://", "zmq+tcp://").chain((p) => fc.string().map((s) => p + s)),
        ),
        (s) => {
          try {
            const ep = parseEndpoint(s);
            expect(parseEndpoint(formatEndpoint(ep))).toEqual(ep);
          } catch (e) {
            expect((e as TransportError).code).toBe("TRANSPORT_BAD_ENDPOINT");
          }
        },
      ),
    );
  });
  test("options are validated by name", () => {
    expect(() => makeClient("tcp://127.0.0.1:1", { maxMessageBytes: -1 })).toThrow(/maxMessageBytes/);
    expect(() => makeClient("tcp://127.0.0.1:1", { connectTimeoutMs: 0 })).toThrow(/connectTimeoutMs/);
    const bad = (o: unknown) => o as never;
    expect(() => makeClient("tls://127.0.0.1:1", { tls: bad({ rejectUnauthorized: "no" }) })).toThrow(
      /tls.rejectUnauthorized/,
    );
    expect(() => makeClient("tls://127.0.0.1:1", { tls: bad({ ca: 42 }) })).toThrow(/tls.ca/);
    expect(() => makeClient("tls://127.0.0.1:1", { tls: bad({ cert: "x" }) })).toThrow(
      /tls.cert and tls.key/,
    );
    expect(() => makeClient("tls://127.0.0.1:1", { tls: bad({ servername: 1 }) })).toThrow(/tls.servername/);
  });

  test("server options are validated by name before anything is bound", async () => {
    const h = () => null;
    const refused = async (p: Promise<unknown>, re: RegExp) => {
      const e = await p.then(
        () => null,
        (x: unknown) => x,
      );
      expect(e).toBeInstanceOf(TransportError);
      expect((e as TransportError).code).toBe("TRANSPORT_BAD_OPTION");
      expect((e as Error).message).toMatch(re);
    };
    await refused(listen("tcp://127.0.0.1:0", h, { maxMessageBytes: 2 ** 32 }), /maxMessageBytes/);
    await refused(listen("tcp://127.0.0.1:0", h, { idleTimeoutMs: -1 }), /idleTimeoutMs/);
    await refused(listen("tcp://127.0.0.1:0", h, { closeTimeoutMs: 1.5 }), /closeTimeoutMs/);
    await refused(listen("tls://127.0.0.1:0", h), /option tls: required/);
    await refused(listen("tls://127.0.0.1:0", h, { tls: { cert: "x" } as never }), /tls.key: required/);
    await refused(
      listen("tls://127.0.0.1:0", h, { tls: { cert: "x", key: "y", requestCert: 1 } as never }),
      /tls.requestCert/,
    );
    await refused(listen("tcp://127.0.0.1:0", h, { onError: "log" } as never), /onError/);
    await refused(listen("zmq+tcp://127.0.0.1:0", h, { onConnection: 1 } as never), /onConnection/);
    await refused(listen("tcp://127.0.0.1:0", h, { onClose: {} } as never), /onClose/);
    await refused(listen("tcp://127.0.0.1:0", "nope" as never), /handler/);
  });
});

describe("tls", () => {
  test("a server certificate from the wrong CA is refused in connect()", async () => {
    const c = tlsCreds();
    const srv = await listen("tls://127.0.0.1:0", (r) => Buffer.from(r), {
      tls: { cert: c.cert, key: c.key },
    });
    const cl = makeClient(srv.endpoint, { tls: { ca: c.wrongCa } });
    const err = await cl.connect(5000).catch((e: TransportError) => e);
    expect((err as TransportError).code).toBe("TRANSPORT_CONNECT");
    expect(cl.connected).toBe(false);
    await srv.close();
  });
  test("client certificates: required ones are checked against the server's CA", async () => {
    const c = tlsCreds();
    const srv = await listen("tls://127.0.0.1:0", (r) => Buffer.from(r), {
      tls: { cert: c.cert, key: c.key, ca: c.ca, requestCert: true },
    });
    const reply = Buffer.alloc(8);
    const good = makeClient(srv.endpoint, { tls: { ca: c.ca, cert: c.clientCert, key: c.clientKey } });
    await good.connect(5000);
    expect(await good.request(Buffer.from("hi"), reply, 5000)).toBe(2);
    good.close();
    for (const creds of [{}, { cert: c.wrongClientCert, key: c.wrongClientKey }]) {
      const bad = makeClient(srv.endpoint, { tls: { ca: c.ca, ...creds } });
      // TLS 1.3: the refusal arrives after the client's handshake, at the latest on the first request.
      const r = await bad
        .connect(5000)
        .then(() => bad.request(Buffer.from("hi"), reply, 5000))
        .catch((e: TransportError) => e.code);
      expect(["TRANSPORT_CONNECT", "TRANSPORT_CLOSED"]).toContain(r);
      bad.close();
    }
    await srv.close();
  });
});

describe("unix socket files", () => {
  test("live socket refused, regular file refused, socket removed on close", async () => {
    const path = uniqueSocketPath("st");
    const a = await listen(`unix://${path}`, () => Buffer.alloc(0));
    expect(await listen(`unix://${path}`, () => null).catch((e: TransportError) => e.code)).toBe(
      "TRANSPORT_LISTEN",
    );
    await a.close();
    expect(existsSync(path)).toBe(false);
    const file = uniqueSocketPath("f");
    writeFileSync(file, "x");
    expect(await listen(`unix://${file}`, () => null).catch((e: TransportError) => e.code)).toBe(
      "TRANSPORT_LISTEN",
    );
    expect(existsSync(file)).toBe(true);
  });

  for (const scheme of ["unix", "zmq+ipc"] as const) {
    test(`${scheme}: a stale socket file left by a killed server (no listener) is removed and listen succeeds`, async () => {
      const path = uniqueSocketPath("stale");
      // A server SIGKILLed while listening leaves its socket file behind.
      const script = `require("node:net").createServer().listen(${JSON.stringify(path)}, () => process.kill(process.pid, "SIGKILL"))`;
      expect(() => execFileSync(process.execPath, ["-e", script], { stdio: "ignore" })).toThrow();
      expect(lstatSync(path).isSocket()).toBe(true);
      const refused = await new Promise<string>((resolve) => {
        const s = net.connect({ path });
        s.once("connect", () => {
          s.destroy();
          resolve("connected");
        });
        s.once("error", (e: NodeJS.ErrnoException) => resolve(e.code ?? "error"));
      });
      expect(refused).toBe("ECONNREFUSED");
      const srv = await listen(`${scheme}://${path}`, (r) => Buffer.from(r));
      const c = makeClient(srv.endpoint);
      await c.connect(5000);
      const reply = Buffer.alloc(8);
      expect(await c.request(Buffer.from("alive"), reply, 5000)).toBe(5);
      expect(reply.subarray(0, 5).toString()).toBe("alive");
      c.close();
      await srv.close();
      expect(existsSync(path)).toBe(false);
    });
  }
});
