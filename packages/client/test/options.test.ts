import { describe, expect, test } from "vitest";
import { ClientError, RemoteDraftClient, type RemoteDraftClientOptions } from "../src/index.js";
import { clientOptions } from "./helpers.js";

describe("RemoteDraftClient options are validated in the constructor, naming the bad one", () => {
  const bad: [Partial<Record<keyof RemoteDraftClientOptions, unknown>>, string][] = [
    [{ endpoint: "http://x" }, "endpoint"],
    [{ endpoint: 5 }, "endpoint"],
    [{ connectTimeoutMs: 0 }, "connectTimeoutMs"],
    [{ requestTimeoutMs: Number.NaN }, "requestTimeoutMs"],
    [{ backoffMs: -1 }, "backoffMs"],
    [{ backoffMs: 100, backoffMaxMs: 50 }, "backoffMaxMs"],
    [{ window: 0 }, "window"],
    [{ window: 4097 }, "window"],
    [{ numSpec: 33 }, "numSpec"],
    [{ sampleMode: "nucleus" }, "sampleMode"],
    [{ numTaps: 0 }, "numTaps"],
    [{ hidden: 1.5 }, "hidden"],
    [{ vocabSize: 0 }, "vocabSize"],
    [{ sampleMode: "top32", vocabSize: 31 }, "vocabSize"],
    [{ maxSlots: 0 }, "maxSlots"],
    [{ maxRowsPerStep: -1 }, "maxRowsPerStep"],
    [{ drafterIdentity: new Uint8Array(31) }, "drafterIdentity"],
    [{ markovIdentity: "abc" }, "markovIdentity"],
    [{ wantMargin: 1 }, "wantMargin"],
    [{ token: "" }, "token"],
    [{ clientName: "x".repeat(33) }, "clientName"],
    [{ sessionId: 0 }, "sessionId"],
    [{ sessionId: 2 ** 32 }, "sessionId"],
    [{ initialSeq: -1 }, "initialSeq"],
    [{ transportFactory: 3 }, "transportFactory"],
    [{ clock: { now: () => 0 } }, "clock"],
    [{ logger: {} }, "logger"],
    [{ registry: {} }, "registry"],
    [{ autoStart: "yes" }, "autoStart"],
  ];
  test.each(bad)("%o", (o, name) => {
    const make = () =>
      new RemoteDraftClient({ ...clientOptions("tcp://127.0.0.1:1"), ...o } as RemoteDraftClientOptions);
    expect(make).toThrow(ClientError);
    expect(make).toThrow(new RegExp(`^${name} `));
  });

  test("defaults: random non-zero session per instance, buffers sized once from the HELLO limits", async () => {
    const a = new RemoteDraftClient({ ...clientOptions("tcp://127.0.0.1:1"), autoStart: false });
    const b = new RemoteDraftClient({ ...clientOptions("tcp://127.0.0.1:1"), autoStart: false });
    expect(a.sessionId).toBeGreaterThan(0);
    expect(a.sessionId).toBeLessThanOrEqual(0xffffffff);
    expect(a.sessionId).not.toBe(b.sessionId);
    expect(a.options.rowBytes).toBe(16);
    expect(a.options.requestTimeoutMs).toBe(2000);
    expect(a.sendBuffer.length).toBeGreaterThanOrEqual(24 + 64 * 16);
    expect(a.rowsOffset(1) % 64).toBe(0);
    const c = new RemoteDraftClient({
      ...clientOptions("tcp://127.0.0.1:1"),
      autoStart: false,
      sessionId: 7,
    });
    expect(c.sessionId).toBe(7);
    await Promise.all([a.close(), b.close(), c.close()]);
  });
});
