// CONTRACT 2–3: the bytes on a stream. framing-v1.json comes from an independent encoder written
// from the contract alone (byte-identical copy of ../shared/vectors/framing-v1.json). Both
// directions are checked against it: what our client and our server write must equal
// `stream_hex`, and our server and client must read `stream_hex` whole, one byte at a time and
// split at every offset. A mistake shared by our two ends (e.g. a big-endian prefix) fails here.
import { readFileSync } from "node:fs";
import * as net from "node:net";
import { dirname, join } from "node:path";
import * as tls from "node:tls";
import { fileURLToPath } from "node:url";
import { afterEach, describe, expect, test } from "vitest";
import { listen, makeClient, parseEndpoint, type RpcServer } from "../src/index.js";
import { type Case, caseOf, dataEventCases, sleep, tlsCreds } from "./helpers/env.js";
import { closed, rawConnect } from "./helpers/raw.js";

const here = dirname(fileURLToPath(import.meta.url));

interface FramingCase {
  name: string;
  message_hex?: string;
  messages_hex?: string[];
  stream_hex?: string;
  length?: string;
  prefix_hex?: string;
  expect?: string;
}
const vectors = JSON.parse(readFileSync(join(here, "fixtures/framing-v1.json"), "utf8")) as {
  contract: string;
  version: number;
  cases: FramingCase[];
};

const messageCases = vectors.cases.filter((c) => c.stream_hex !== undefined);
const prefixCases = vectors.cases.filter((c) => c.prefix_hex !== undefined);
const messagesOf = (c: FramingCase): Buffer[] =>
  (c.messages_hex ?? [c.message_hex ?? ""]).map((h) => Buffer.from(h, "hex"));
const STREAM_CASES: Case[] = [caseOf("tcp"), caseOf("unix"), caseOf("tls"), ...dataEventCases()];

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const f of cleanups.splice(0).reverse()) await f();
});

async function until(cond: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 2000 && !cond(); i++) await sleep(5);
  expect(cond(), what).toBe(true);
}

/** A stream server that records every byte a client writes and answers with `reply` bytes. */
async function capturingServer(
  t: Case,
): Promise<{ endpoint: string; bytes: () => Buffer; answer: (b: Buffer) => void }> {
  const got: Buffer[] = [];
  let sock: net.Socket | null = null;
  const onSock = (s: net.Socket): void => {
    sock = s;
    s.on("data", (d: Buffer) => got.push(Buffer.from(d)));
    s.on("error", () => {});
  };
  const ep = parseEndpoint(t.listen());
  const c = tlsCreds();
  const server =
    ep.scheme === "tls"
      ? tls.createServer({ cert: c.serverCert, key: c.serverKey, minVersion: "TLSv1.3" }, onSock)
      : net.createServer(onSock);
  await new Promise<void>((r) => {
    if ("path" in ep) server.listen(ep.path, r);
    else server.listen(0, "127.0.0.1", r);
  });
  cleanups.push(
    () =>
      new Promise<void>((r) => {
        (sock as net.Socket | null)?.destroy();
        server.close(() => r());
      }),
  );
  const endpoint =
    "path" in ep
      ? `${ep.scheme}://${ep.path}`
      : `${ep.scheme}://127.0.0.1:${(server.address() as net.AddressInfo).port}`;
  return {
    endpoint,
    bytes: () => Buffer.concat(got),
    answer: (b) => (sock as net.Socket | null)?.write(b),
  };
}

describe("framing-v1.json fixture", () => {
  test("is the shared file, byte for byte (when ../shared is present)", () => {
    const shared = join(here, "../../../../shared/vectors/framing-v1.json");
    let upstream: Buffer | null = null;
    try {
      upstream = readFileSync(shared);
    } catch {
      upstream = null; // a user's clone has no ../shared: the fixture stands alone
    }
    if (upstream !== null)
      expect(Buffer.compare(upstream, readFileSync(join(here, "fixtures/framing-v1.json")))).toBe(0);
    expect(vectors.contract).toMatch(/CONTRACT 2-3/);
    expect(messageCases.length).toBeGreaterThanOrEqual(10);
  });

  test.each(prefixCases)("prefix $name: u32 little-endian", (c) => {
    const b = Buffer.from(c.prefix_hex ?? "", "hex");
    expect(b.length).toBe(4);
    expect(b.readUInt32LE(0)).toBe(Number(c.length));
  });
});

describe.each(STREAM_CASES)("CONTRACT 3 framing vectors over $scheme", (t) => {
  test.each(messageCases)("the client writes exactly stream_hex: $name", async (c) => {
    const srv = await capturingServer(t);
    const cli = makeClient(srv.endpoint, t.client);
    cleanups.push(() => cli.close());
    await cli.connect(5000);
    const msgs = messagesOf(c);
    const want = Buffer.from(c.stream_hex ?? "", "hex");
    for (let i = 0; i < msgs.length; i++) {
      const m = msgs[i] as Buffer;
      const reply = Buffer.alloc(m.length + 16);
      // The first message goes as one buffer, the rest as scatter/gather parts: both framings.
      const p =
        i % 2 === 0
          ? cli.request(m, reply, 5000)
          : cli.requestParts([m.subarray(0, m.length >> 1), m.subarray(m.length >> 1)], reply, 5000);
      const upTo = msgs.slice(0, i + 1).reduce((n, x) => n + 4 + x.length, 0);
      await until(() => srv.bytes().length >= upTo, "request bytes arrived");
      // Answer with the same framed message (the vector's own bytes for this message).
      srv.answer(want.subarray(upTo - 4 - m.length, upTo));
      expect(await p).toBe(m.length);
      expect(Buffer.compare(reply.subarray(0, m.length), m)).toBe(0);
    }
    expect(srv.bytes().toString("hex")).toBe(c.stream_hex);
  });

  test.each(messageCases)(
    "the server reads stream_hex whole, byte at a time, split anywhere, and writes it back: $name",
    async (c) => {
      const seen: Buffer[] = [];
      const srv: RpcServer = await (t.listenFn ?? listen)(
        t.listen(),
        (req) => {
          seen.push(Buffer.from(req));
          return req.slice();
        },
        t.server,
      );
      cleanups.push(() => srv.close());
      const stream = Buffer.from(c.stream_hex ?? "", "hex");
      const msgs = messagesOf(c);
      // Whole, then one byte at a time, then split at a sample of offsets on fresh connections
      // (every offset for short streams; the long ones are covered at every byte by the 1-byte run).
      const splits: number[][] = [[], Array.from({ length: stream.length - 1 }, (_, i) => i + 1)];
      const step = stream.length > 80 ? Math.ceil(stream.length / 40) : 1;
      for (let k = 1; k < stream.length; k += step) splits.push([k]);
      for (const cuts of splits) {
        seen.length = 0;
        const raw = await rawConnect(srv.endpoint);
        raw.setNoDelay(true);
        const got: Buffer[] = [];
        raw.on("data", (d: Buffer) => got.push(Buffer.from(d)));
        let prev = 0;
        for (const cut of [...cuts, stream.length]) {
          raw.write(stream.subarray(prev, cut));
          prev = cut;
          if (cuts.length > 1) await sleep(0);
        }
        await until(() => Buffer.concat(got).length >= stream.length, `echo for cuts ${cuts.length}`);
        expect(seen.map((b) => b.toString("hex"))).toEqual(msgs.map((b) => b.toString("hex")));
        // What the server writes back is the same stream: its prefixes are little-endian too.
        expect(Buffer.concat(got).toString("hex")).toBe(c.stream_hex);
        raw.destroy();
        await closed(raw);
      }
    },
    60_000,
  );

  test("prefix_over_64MiB_refused: refused from the prefix, connection closed", async () => {
    const c = prefixCases.find((x) => x.expect !== undefined) as FramingCase;
    let calls = 0;
    const srv: RpcServer = await (t.listenFn ?? listen)(
      t.listen(),
      (req) => {
        calls++;
        return req.slice();
      },
      t.server,
    );
    cleanups.push(() => srv.close());
    const raw = await rawConnect(srv.endpoint);
    raw.on("error", () => {});
    raw.write(Buffer.from(c.prefix_hex ?? "", "hex"));
    raw.write(Buffer.alloc(1024));
    await closed(raw);
    expect(calls).toBe(0);
    // A big-endian reading of the same bytes would be 16 MiB + 4, under the limit: the close proves LE.
    expect(Buffer.from(c.prefix_hex ?? "", "hex").readUInt32BE(0)).toBeLessThan(64 * 1024 * 1024);
  });
});
