// Every constructor validates its options and names the bad one (EC_BAD_OPTION); an async
// factory that fails on an option releases what it already built.
import { afterEach, describe, expect, it, vi } from "vitest";
import {
  ConsumerConnector,
  ConsumerSession,
  EcError,
  EcProducer,
  EmbeddingCache,
  LoopbackDataTransport,
  LoopbackFabric,
  ProducerSession,
  SocketDataTransport,
} from "../src/index.js";
import { BLOCK, COMPAT } from "./helpers/loop.js";

afterEach(() => {
  vi.restoreAllMocks();
});

function badOption(f: () => unknown, name: string): void {
  let err: unknown;
  try {
    f();
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(EcError);
  expect((err as EcError).code).toBe("EC_BAD_OPTION");
  expect((err as EcError).message).toContain(`option ${name}`);
}

async function badOptionAsync(f: () => Promise<unknown>, name: string): Promise<void> {
  const err = await f().then(
    () => null,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(EcError);
  expect((err as EcError).code).toBe("EC_BAD_OPTION");
  expect((err as EcError).message).toContain(`option ${name}`);
}

function parts() {
  const cache = new EmbeddingCache({ numBlocks: 4, blockBytes: BLOCK });
  const data = new LoopbackDataTransport({
    fabric: new LoopbackFabric(),
    name: "x",
    region: cache.region,
    numBlocks: 4,
    blockBytes: BLOCK,
  });
  return { cache, data };
}

describe("options are validated naming the bad one", () => {
  it("ConsumerSession", () => {
    const { data } = parts();
    const ok = {
      addr: "tcp://127.0.0.1:1",
      send: () => {},
      data,
      compatibilityHash: COMPAT,
      numBlocks: 4,
      blockBytes: BLOCK,
    };
    const cases: [Record<string, unknown>, string][] = [
      [{ addr: 1 }, "addr"],
      [{ send: "x" }, "send"],
      [{ data: null }, "data"],
      [{ compatibilityHash: 5 }, "compatibilityHash"],
      [{ numBlocks: 0 }, "numBlocks"],
      [{ blockBytes: 1.5 }, "blockBytes"],
      [{ readTimeoutMs: -1 }, "readTimeoutMs"],
      [{ quarantineTimeoutMs: Number.NaN }, "quarantineTimeoutMs"],
      [{ verifyChecksum: "yes" }, "verifyChecksum"],
      [{ readAhead: "yes" }, "readAhead"],
      [{ sessionId: "a:b" }, "sessionId"],
    ];
    for (const [o, name] of cases) {
      badOption(() => new ConsumerSession({ ...ok, ...o } as never), name);
    }
    expect(new ConsumerSession(ok).sessionId).toMatch(/^[0-9a-f-]{36}$/);
  });

  it("ProducerSession", () => {
    const { cache, data } = parts();
    const control = { endpoint: "x", poll: () => [], send: () => {}, close: async () => {} };
    const ok = { control, data, cache, compatibilityHash: COMPAT };
    const cases: [Record<string, unknown>, string][] = [
      [{ control: null }, "control"],
      [{ data: 3 }, "data"],
      [{ cache: undefined }, "cache"],
      [{ compatibilityHash: null }, "compatibilityHash"],
      [{ pinLeaseMs: -5 }, "pinLeaseMs"],
      [{ now: 5 }, "now"],
      [{ onMiss: "encode" }, "onMiss"],
    ];
    for (const [o, name] of cases) {
      badOption(() => new ProducerSession({ ...ok, ...o } as never), name);
    }
  });

  it("LoopbackDataTransport", () => {
    const region = new Uint8Array(4 * BLOCK);
    const ok = { fabric: new LoopbackFabric(), name: "a", region, numBlocks: 4, blockBytes: BLOCK };
    const cases: [Record<string, unknown>, string][] = [
      [{ fabric: {} }, "fabric"],
      [{ numBlocks: -1 }, "numBlocks"],
      [{ blockBytes: 0 }, "blockBytes"],
      [{ region: new Uint8Array(3) }, "region"],
      [{ name: "" }, "name"],
    ];
    for (const [o, name] of cases) {
      badOption(() => new LoopbackDataTransport({ ...ok, ...o } as never), name);
    }
  });

  it("SocketDataTransport.create", async () => {
    const region = new Uint8Array(4 * BLOCK);
    const ok = { name: "a", region, numBlocks: 4, blockBytes: BLOCK };
    const cases: [Record<string, unknown>, string][] = [
      [{ name: "" }, "name"],
      [{ numBlocks: 0 }, "numBlocks"],
      [{ blockBytes: -1 }, "blockBytes"],
      [{ region: new Uint8Array(8) }, "region"],
      [{ now: 1 }, "now"],
      [{ chunkBytes: 0 }, "chunkBytes"],
      [{ throttleBytesPerSec: -1 }, "throttleBytesPerSec"],
      [{ maxIdlePerPeer: 0.5 }, "maxIdlePerPeer"],
      [{ checksumThread: 1 }, "checksumThread"],
      [{ checksumThread: "sometimes" }, "checksumThread"],
    ];
    for (const [o, name] of cases) {
      await badOptionAsync(() => SocketDataTransport.create({ ...ok, ...o } as never), name);
    }
  });

  it("EcProducer.start", async () => {
    const cases: [Record<string, unknown>, string][] = [
      [{ numBlocks: 0 }, "numBlocks"],
      [{ blockBytes: 2.5 }, "blockBytes"],
      [{ hiddenSize: -1 }, "hiddenSize"],
      [{ modelId: "" }, "modelId"],
      [{ dtype: 7 }, "dtype"],
      [{ missNbytes: 0 }, "missNbytes"],
      [{ encodeDelayMs: -1 }, "encodeDelayMs"],
      [{ stepIntervalMs: 0 }, "stepIntervalMs"],
      [{ pinLeaseMs: Number.POSITIVE_INFINITY }, "pinLeaseMs"],
    ];
    for (const [o, name] of cases) {
      await badOptionAsync(() => EcProducer.start(o as never), name);
    }
  });

  it("ConsumerConnector.create closes the data plane it built when an option is bad", async () => {
    const close = vi.spyOn(SocketDataTransport.prototype, "close");
    await badOptionAsync(
      () =>
        ConsumerConnector.create({
          numBlocks: 4,
          blockBytes: BLOCK,
          compatibility: COMPAT,
          dataListen: "tcp://127.0.0.1:0",
          ackTimeoutMs: -1,
        }),
      "ackTimeoutMs",
    );
    expect(close).toHaveBeenCalledTimes(1);
    await badOptionAsync(
      () =>
        ConsumerConnector.create({ numBlocks: 4, blockBytes: BLOCK, compatibility: COMPAT, now: 3 } as never),
      "now",
    );
    expect(close).toHaveBeenCalledTimes(2);
  });
});
