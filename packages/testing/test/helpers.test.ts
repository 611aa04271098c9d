import { X509Certificate } from "node:crypto";
import { once } from "node:events";
import { existsSync, statSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import type { TlsOptions } from "node:tls";
import { connect as tlsConnect, createServer as tlsCreateServer } from "node:tls";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, test } from "vitest";
import {
  endpointFor,
  freePort,
  killAllChildren,
  makeTlsCredentials,
  spawnBin,
  testTlsCredentials,
  transportMatrix,
  transportSchemes,
  uniqueSocketPath,
} from "../src/index.js";

afterAll(killAllChildren);

const FAKE_BIN = fileURLToPath(new URL("./fixtures/fake-bin.mjs", import.meta.url));

describe("socket paths and endpoints", () => {
  test("uniqueSocketPath is unique, under tmpdir, within 107 bytes, and listenable", async () => {
    const paths = new Set(Array.from({ length: 1000 }, (_, i) => uniqueSocketPath(`t${i % 3}`)));
    expect(paths.size).toBe(1000);
    const long = uniqueSocketPath("x".repeat(500));
    expect(Buffer.byteLength(long)).toBeLessThanOrEqual(107);
    expect(uniqueSocketPath("we/ird tag!")).toMatch(/\/tw-we_ird_tag_-/);
    for (const p of paths) expect(p.startsWith(tmpdir()) || p.startsWith("/tmp")).toBe(true);
    const path = uniqueSocketPath("listen");
    expect(existsSync(path)).toBe(false);
    const server = createServer();
    server.listen(path);
    await once(server, "listening");
    expect(statSync(path).isSocket()).toBe(true);
    await new Promise<void>((r) => server.close(() => r()));
  });

  test("endpointFor gives port 0 for tcp-like schemes and fresh paths for unix-like ones", () => {
    expect(transportSchemes).toEqual(["tcp", "unix", "tls", "zmq+tcp", "zmq+ipc", "shm+unix"]);
    expect(endpointFor("tcp")).toBe("tcp://127.0.0.1:0");
    expect(endpointFor("tls")).toBe("tls://127.0.0.1:0");
    expect(endpointFor("zmq+tcp")).toBe("zmq+tcp://127.0.0.1:0");
    const u = endpointFor("unix");
    expect(u).toMatch(/^unix:\/\/\/.+\.sock$/);
    expect(endpointFor("unix")).not.toBe(u);
    expect(endpointFor("zmq+ipc")).toMatch(/^zmq\+ipc:\/\/\/.+\.sock$/);
    expect(() => endpointFor("udp" as never)).toThrow(
      expect.objectContaining({ code: "TESTING_BAD_OPTION" }),
    );
    const m = transportMatrix();
    expect(m.map((e) => e.slice(0, e.indexOf("://")))).toEqual([...transportSchemes]);
  });

  test("freePort returns a port that can be bound", async () => {
    const port = await freePort();
    expect(port).toBeGreaterThan(0);
    const s = createServer();
    s.listen(port, "127.0.0.1");
    await once(s, "listening");
    await new Promise<void>((r) => s.close(() => r()));
  });
});

describe("makeTlsCredentials", () => {
  const creds = makeTlsCredentials();

  test("is cached per process and has the promised certificates", () => {
    expect(makeTlsCredentials()).toBe(creds);
    expect(testTlsCredentials()).toBe(creds);
    const ca = new X509Certificate(creds.ca);
    const server = new X509Certificate(creds.serverCert);
    const client = new X509Certificate(creds.clientCert);
    const wrongCa = new X509Certificate(creds.wrongCa);
    expect(ca.ca).toBe(true);
    expect(server.checkIssued(ca)).toBe(true);
    expect(server.verify(ca.publicKey)).toBe(true);
    expect(client.verify(ca.publicKey)).toBe(true);
    expect(server.checkIP("127.0.0.1")).toBe("127.0.0.1");
    expect(server.checkHost("localhost")).toBe("localhost");
    expect(server.verify(wrongCa.publicKey)).toBe(false);
    expect(new X509Certificate(creds.wrongServerCert).verify(wrongCa.publicKey)).toBe(true);
    expect(creds.cert).toBe(creds.serverCert);
    expect(creds.key).toBe(creds.serverKey);
  });

  /** Runs one TLS 1.3 handshake with mutual auth settings; resolves "ok" or the error code. */
  async function handshake(
    server: TlsOptions,
    client: { ca: string; cert?: string; key?: string; host?: string },
  ) {
    const srv = tlsCreateServer({ minVersion: "TLSv1.3", ...server }, (s) => {
      s.on("error", () => {});
      s.end("hi");
    });
    srv.on("tlsClientError", () => {});
    srv.listen(0, "127.0.0.1");
    await once(srv, "listening");
    const port = (srv.address() as { port: number }).port;
    try {
      return await new Promise<string>((resolve) => {
        const s = tlsConnect({ host: client.host ?? "127.0.0.1", port, ...client, servername: "" });
        let got = "";
        s.on("data", (d) => {
          got += String(d);
        });
        s.on("end", () => resolve(got === "hi" ? "ok" : `got ${got}`));
        s.on("error", (e: NodeJS.ErrnoException) => resolve(e.code ?? e.message));
      });
    } finally {
      await new Promise<void>((r) => srv.close(() => r()));
    }
  }

  test("a real TLS 1.3 handshake works with the CA and fails with the wrong one", async () => {
    const server = { cert: creds.serverCert, key: creds.serverKey };
    expect(await handshake(server, { ca: creds.ca })).toBe("ok");
    expect(await handshake(server, { ca: creds.wrongCa })).toMatch(/UNABLE_TO_VERIFY|SELF_SIGNED|unable/i);
    expect(
      await handshake({ cert: creds.wrongServerCert, key: creds.wrongServerKey }, { ca: creds.ca }),
    ).toMatch(/UNABLE_TO_VERIFY|unable/i);
  });

  test("client certificates: the CA-signed one is accepted, the wrong one and none are refused", async () => {
    const server = {
      cert: creds.serverCert,
      key: creds.serverKey,
      ca: creds.ca,
      requestCert: true,
      rejectUnauthorized: true,
    };
    expect(await handshake(server, { ca: creds.ca, cert: creds.clientCert, key: creds.clientKey })).toBe(
      "ok",
    );
    expect(
      await handshake(server, { ca: creds.ca, cert: creds.wrongClientCert, key: creds.wrongClientKey }),
    ).not.toBe("ok");
    expect(await handshake(server, { ca: creds.ca })).not.toBe("ok");
  });
});

describe("spawnBin", () => {
  test("waits for the listening line and collects text and JSON lines", async () => {
    const child = await spawnBin(FAKE_BIN, ["serve", "--x", "1"]);
    expect(child.readyLine.json).toMatchObject({ msg: "listening", endpoints: ["tcp://127.0.0.1:1234"] });
    expect(child.json.map((j) => j.msg)).toEqual(["starting", "listening"]);
    expect(child.json[0]).toMatchObject({ args: ["--x", "1"] });
    expect(
      child.lines.some((l) => l.stream === "stdout" && l.text === "not json {" && l.json === undefined),
    ).toBe(true);
    expect(child.lines.some((l) => l.stream === "stderr" && l.text === "plain stderr line")).toBe(true);
    const exit = await child.kill();
    expect(exit).toEqual({ code: 0, signal: null });
    expect(child.json.at(-1)).toMatchObject({ msg: "stopping" });
    expect(await child.exited).toEqual(exit);
  });

  test("waitFor sees past and future lines; stdin is passed", async () => {
    const child = await spawnBin(FAKE_BIN, ["serve-stdin"], { stdin: "hello" });
    expect((await child.waitFor((l) => l.json?.msg === "starting")).json).toMatchObject({ msg: "starting" });
    expect((await child.waitFor((l) => l.json?.msg === "stdin")).json).toMatchObject({ text: "hello" });
    await child.kill("SIGKILL");
  });

  test("a process that exits before it is ready rejects with its output", async () => {
    const err = await spawnBin(FAKE_BIN, ["crash"]).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: "TESTING_SPAWN" });
    expect(String((err as Error).message)).toMatch(/code 3[\s\S]*boom: cannot bind/);
  });

  test("a process that never gets ready times out and is killed", async () => {
    const err = await spawnBin(FAKE_BIN, ["silent"], { timeoutMs: 300 }).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: "TESTING_TIMEOUT" });
    // the output may or may not include the first line yet (process start-up time varies)
    expect(String((err as Error).message)).toMatch(/no matching line within 300 ms; output so far:/);
  });

  test("killAllChildren kills every child still running", async () => {
    const a = await spawnBin(FAKE_BIN, ["serve"]);
    const b = await spawnBin(FAKE_BIN, ["serve"]);
    await killAllChildren();
    expect((await a.exited).signal).toBe("SIGKILL");
    expect((await b.exited).signal).toBe("SIGKILL");
    expect(() => process.kill(a.pid, 0)).toThrow();
  });

  test("bad options are refused", async () => {
    await expect(spawnBin("", [])).rejects.toMatchObject({ code: "TESTING_BAD_OPTION" });
    await expect(spawnBin(FAKE_BIN, [], { timeoutMs: 0 })).rejects.toThrow(/option timeoutMs/);
  });
});
