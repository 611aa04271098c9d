import { spawnSync } from "node:child_process";
import { Registry } from "@tapwire/stats";
import { makeTlsCredentials } from "@tapwire/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { CurveKeyPair } from "../src/index.js";
import { ConsumerConnector, EcError, EcProducer, newCurveKeyPair, syntheticEmbedding } from "../src/index.js";
import { Driver } from "./helpers/drive.js";
import { PRODUCER_BIN, until } from "./helpers/proc.js";

// EC-CONTRACT 9.4: CURVE on the control plane (ZAP allow list), TLS on the data plane.
const BB = 4096;
const N = 20_000;

describe("CURVE control plane and tls:// data plane (EC-CONTRACT 9.4)", () => {
  let server: CurveKeyPair;
  let allowed: CurveKeyPair;
  let stranger: CurveKeyPair;
  // A test CA: the producer's certificate and an allowed client certificate signed by it, and a
  // client certificate of an unrelated CA (not in the allow list).
  const tls = makeTlsCredentials();
  const pCert = { cert: tls.serverCert, key: tls.serverKey };
  const cCert = { cert: tls.clientCert, key: tls.clientKey };
  const otherCert = { cert: tls.wrongClientCert, key: tls.wrongClientKey };
  type TestCert = typeof cCert;
  let producer: EcProducer;
  const open: ConsumerConnector[] = [];

  beforeAll(async () => {
    server = newCurveKeyPair();
    allowed = newCurveKeyPair();
    stranger = newCurveKeyPair();
    producer = await EcProducer.start({
      numBlocks: 64,
      blockBytes: BB,
      data: "tls://127.0.0.1:0",
      curve: { ...server, allow: [allowed.publicKey] },
      tls: { cert: pCert.cert, key: pCert.key, ca: tls.ca },
      prepopulate: [["img", N]],
      heartbeat: { intervalMs: 200, timeoutMs: 1000, ttlMs: 2000 },
    });
  });
  afterAll(async () => {
    for (const c of open) await c.close();
    await producer.close();
  });

  async function consumer(keys: CurveKeyPair | null, cert: TestCert) {
    const c = await ConsumerConnector.create({
      numBlocks: 64,
      blockBytes: BB,
      compatibility: producer.compatibilityHash,
      registry: new Registry(),
      ackTimeoutMs: 300,
      tls: { cert: cert.cert, key: cert.key, ca: tls.ca },
      ...(keys === null ? {} : { curve: { ...keys, serverKey: server.publicKey } }),
    });
    open.push(c);
    return c;
  }

  const counter = (name: string) => producer.registry.snapshot().counters[name] ?? 0;

  it("an allowed key with an allowed certificate loads byte-identical over tls://", async () => {
    expect(producer.dataEndpoint).toMatch(/^tls:\/\/127\.0\.0\.1:\d+$/);
    const c = await consumer(allowed, cCert);
    const d = new Driver(c).start();
    try {
      expect(await d.fetch("img", producer.controlEndpoint, N, 10_000)).toBe("loaded");
      expect(d.mismatched).toEqual([]);
      expect(counter("data_reads_served")).toBeGreaterThanOrEqual(1);
    } finally {
      d.stop();
    }
    expect(Buffer.from(syntheticEmbedding("img", N)).length).toBe(N);
  });

  it("a key not in the allow list is refused at the handshake and counted; nothing is answered", async () => {
    const before = counter("producer_curve_handshakes_refused");
    const requestsBefore = counter("producer_requests");
    const c = await consumer(stranger, cCert);
    const d = new Driver(c).start();
    try {
      expect(await d.fetch("img", producer.controlEndpoint, N, 1_500)).toMatch(/deadline|ack/);
    } finally {
      d.stop();
    }
    expect(counter("producer_curve_handshakes_refused")).toBeGreaterThan(before);
    expect(counter("producer_requests")).toBe(requestsBefore);
  });

  it("a consumer without CURVE keys gets nothing from a CURVE producer", async () => {
    const requestsBefore = counter("producer_requests");
    const c = await consumer(null, cCert);
    const d = new Driver(c).start();
    try {
      expect(await d.fetch("img", producer.controlEndpoint, N, 1_000)).toMatch(/deadline|ack/);
    } finally {
      d.stop();
    }
    expect(counter("producer_requests")).toBe(requestsBefore);
  });

  it("a client certificate outside the allow list is refused by the data server and counted", async () => {
    const before = counter("data_tls_handshakes_refused");
    const c = await consumer(allowed, otherCert);
    const d = new Driver(c).start();
    try {
      expect(await d.fetch("img", producer.controlEndpoint, N, 5_000)).not.toBe("loaded");
    } finally {
      d.stop();
    }
    await until(() => (counter("data_tls_handshakes_refused") > before ? true : undefined), 5_000);
    // the producer still serves the allowed consumer afterwards
    const ok = await consumer(allowed, cCert);
    const d2 = new Driver(ok).start();
    try {
      expect(await d2.fetch("img", producer.controlEndpoint, N, 10_000)).toBe("loaded");
    } finally {
      d2.stop();
    }
  });

  it("keys require a tls:// data plane; bad keys are refused naming the option", async () => {
    await expect(EcProducer.start({ curve: { ...server, allow: [allowed.publicKey] } })).rejects.toThrow(
      /tls:\/\//,
    );
    const err = await EcProducer.start({
      data: "tls://127.0.0.1:0",
      tls: { cert: pCert.cert, key: pCert.key, ca: tls.ca },
      curve: { ...server, allow: ["not-a-key"] },
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(EcError);
    expect((err as Error).message).toMatch(/curve\.allow\[0\]/);
  });

  it("tapwire-ec-producer keygen prints a fresh Z85 key pair", () => {
    const r = spawnSync(process.execPath, [PRODUCER_BIN, "keygen"], { encoding: "utf8", timeout: 20_000 });
    expect(r.status).toBe(0);
    const k = JSON.parse(r.stdout) as CurveKeyPair;
    expect(k.publicKey).toMatch(/^.{40}$/);
    expect(k.secretKey).toMatch(/^.{40}$/);
    expect(k.publicKey).not.toBe(server.publicKey);
  });

  it("several CURVE producers in one process share the ZAP handler, each with its own allow list", async () => {
    const other = newCurveKeyPair();
    const keysB = newCurveKeyPair();
    const start = (keys: CurveKeyPair, allow: string[]) =>
      EcProducer.start({
        numBlocks: 64,
        blockBytes: BB,
        data: "tls://127.0.0.1:0",
        curve: { ...keys, allow },
        tls: { cert: pCert.cert, key: pCert.key, ca: tls.ca },
        prepopulate: [["img", N]],
      });
    const fetchFrom = async (prod: EcProducer, keys: CurveKeyPair, serverKey: string, ms: number) => {
      const c = await ConsumerConnector.create({
        numBlocks: 64,
        blockBytes: BB,
        compatibility: prod.compatibilityHash,
        registry: new Registry(),
        ackTimeoutMs: 300,
        tls: { cert: cCert.cert, key: cCert.key, ca: tls.ca },
        curve: { ...keys, serverKey },
      });
      const d = new Driver(c).start();
      try {
        return await d.fetch("img", prod.controlEndpoint, N, ms);
      } finally {
        d.stop();
        await c.close();
      }
    };
    const b = await start(keysB, [other.publicKey]);
    try {
      // `allowed` gets into the suite's producer, not into b; `other` only into b
      expect(await fetchFrom(b, allowed, keysB.publicKey, 1_000)).not.toBe("loaded");
      expect(await fetchFrom(b, other, keysB.publicKey, 10_000)).toBe("loaded");
      expect(await fetchFrom(producer, other, server.publicKey, 1_000)).not.toBe("loaded");
    } finally {
      await b.close();
    }
    // the handler outlives b (the suite's producer still has its domain)
    expect(await fetchFrom(producer, allowed, server.publicKey, 10_000)).toBe("loaded");
  });
});
