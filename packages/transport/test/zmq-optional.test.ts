// zeromq is an optional peer dependency (issue 15 item 4): loaded only for zmq+ endpoints, and a
// missing one is a TRANSPORT_ZMQ_MISSING error naming the install command.
import { execFile } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterEach, describe, expect, test } from "vitest";
import { listen, makeClient, type TransportError } from "../src/index.js";
import { setZmqLoader, ZMQ_MISSING_MESSAGE } from "../src/zmq-loader.js";

const here = dirname(fileURLToPath(import.meta.url));

function expectInstallHint(message: string): void {
  expect(message).toContain("npm i zeromq");
  expect(message).toContain("pnpm add zeromq");
  expect(message).toContain("allowBuilds: { zeromq: true }");
}

describe("zeromq optional", () => {
  afterEach(() => setZmqLoader(() => import("zeromq")));

  test("a process where zeromq cannot be resolved: tcp works, zmq+ endpoints are TRANSPORT_ZMQ_MISSING", async () => {
    const { stdout } = await promisify(execFile)(
      process.execPath,
      [
        "--import",
        "tsx",
        "--import",
        join(here, "fixtures", "no-zeromq-hooks.mjs"),
        join(here, "fixtures", "no-zeromq-child.ts"),
      ],
      { cwd: join(here, ".."), timeout: 30_000 },
    );
    const out = JSON.parse(stdout.trim()) as {
      tcp: string;
      client: { code: string; message: string };
      server: { code: string; message: string };
    };
    expect(out.tcp).toBe("tcp ok");
    expect(out.client.code).toBe("TRANSPORT_ZMQ_MISSING");
    expect(out.server.code).toBe("TRANSPORT_ZMQ_MISSING");
    expectInstallHint(out.client.message);
    expectInstallHint(out.server.message);
  });

  test("an injected loader that fails: the error keeps its cause; a later load that works connects", async () => {
    const missing = Object.assign(new Error("Cannot find package 'zeromq'"), {
      code: "ERR_MODULE_NOT_FOUND",
    });
    setZmqLoader(() => Promise.reject(missing));
    const e = (await listen("zmq+tcp://127.0.0.1:0", () => null).catch(
      (x: TransportError) => x,
    )) as TransportError;
    expect(e.code).toBe("TRANSPORT_ZMQ_MISSING");
    expect(e.message).toBe(ZMQ_MISSING_MESSAGE);
    expect(e.cause).toBe(missing);
    const c = makeClient("zmq+tcp://127.0.0.1:1");
    expect(((await c.connect(1000).catch((x: TransportError) => x)) as TransportError).code).toBe(
      "TRANSPORT_ZMQ_MISSING",
    );
    // Installed afterwards (the loader is retried, not the failure cached).
    setZmqLoader(() => import("zeromq"));
    const srv = await listen("zmq+tcp://127.0.0.1:0", (r) => Buffer.from(r));
    const d = makeClient(srv.endpoint);
    await d.connect(5000);
    const reply = Buffer.alloc(8);
    expect(await d.request(Buffer.from("zmq"), reply, 5000)).toBe(3);
    d.close();
    await srv.close();
  });

  test("close() during the first load rejects connect() with TRANSPORT_CLOSED", async () => {
    let release: () => void = () => {};
    setZmqLoader(
      () =>
        new Promise((resolve) => {
          release = () => resolve(import("zeromq"));
        }),
    );
    const c = makeClient("zmq+tcp://127.0.0.1:1");
    const p = c.connect(5000).catch((x: TransportError) => x.code);
    c.close();
    release();
    expect(await p).toBe("TRANSPORT_CLOSED");
  });
});
