// The background connect loop (CONTRACT 9.1) with a fake clock and in-memory transports: backoff
// timing, log cadence, counting, one loop at a time, HELLO checks (6.1), close().
import { FakeClock } from "@tapwire/testing";
import { TransportError } from "@tapwire/transport";
import { Capability, encodeHelloReply, FrameStatus } from "@tapwire/wire";
import { afterEach, describe, expect, test } from "vitest";
import { ClientError, RemoteDraftClient } from "../src/index.js";
import {
  captureLogger,
  clientOptions,
  DRAFTER_ID,
  hex,
  identity,
  MARKOV_ID,
  MemoryRpcClient,
  ScriptedWorker,
} from "./helpers.js";

const clients: RemoteDraftClient[] = [];
afterEach(async () => {
  for (const c of clients.splice(0)) await c.close();
});

function failingFactory(clock: FakeClock, attempts: number[]) {
  return (endpoint: string) => {
    const c = new MemoryRpcClient(
      endpoint,
      () => null,
      () => attempts.push(clock.now()),
    );
    c.failConnect = new TransportError("TRANSPORT_CONNECT", "connect ECONNREFUSED");
    return c;
  };
}

describe("connect loop (CONTRACT 9.1)", () => {
  test("exponential backoff from backoffMs to backoffMaxMs, on the injected clock", async () => {
    const clock = new FakeClock();
    const attempts: number[] = [];
    const client = new RemoteDraftClient(
      clientOptions("tcp://127.0.0.1:1", {
        clock,
        backoffMs: 100,
        backoffMaxMs: 400,
        transportFactory: failingFactory(clock, attempts),
      }),
    );
    clients.push(client);
    await clock.advanceAsync(0);
    expect(attempts).toEqual([0]);
    await clock.advanceAsync(99);
    expect(attempts).toEqual([0]);
    await clock.advanceAsync(1);
    expect(attempts).toEqual([0, 100]);
    await clock.advanceAsync(199);
    expect(attempts).toEqual([0, 100]);
    await clock.advanceAsync(1201);
    expect(attempts).toEqual([0, 100, 300, 700, 1100, 1500]);
    expect(client.snapshot().counters.connect_failures).toBe(6);
    expect(client.ready).toBe(false);
    // the engine path never waits for the loop
    const out = await client.step({ stepId: 1, entries: [], nRows: 0 });
    expect(out.reason).toBe("not_ready");
    expect(out.unknownApply).toBe(false);
  });

  test("logs the first failure of a run, then at most one line per 60 s; counts every failure", async () => {
    const clock = new FakeClock();
    const attempts: number[] = [];
    const { logger, lines } = captureLogger();
    const client = new RemoteDraftClient(
      clientOptions("tcp://127.0.0.1:1", {
        clock,
        logger,
        backoffMs: 10_000,
        backoffMaxMs: 10_000,
        transportFactory: failingFactory(clock, attempts),
      }),
    );
    clients.push(client);
    await clock.advanceAsync(185_000);
    expect(attempts.length).toBe(19); // 0, 10 s, ..., 180 s
    const warns = lines.filter((l) => l.level === 40);
    expect(warns.map((l) => (l.msg as string).includes("still failing"))).toEqual([false, true, true, true]);
    expect(warns[0]!.msg).toContain("ECONNREFUSED");
    expect(client.snapshot().counters.connect_failures).toBe(19);
    expect(client.lastError).toContain("ECONNREFUSED");
  });

  test("a successful HELLO installs the connection (epoch 1) and resets the backoff", async () => {
    const clock = new FakeClock();
    const worker = new ScriptedWorker();
    let fail = 2;
    const attempts: number[] = [];
    const { logger, lines } = captureLogger();
    const client = new RemoteDraftClient(
      clientOptions("tcp://127.0.0.1:1", {
        clock,
        logger,
        backoffMs: 100,
        backoffMaxMs: 1000,
        transportFactory: (ep) => {
          const c = new MemoryRpcClient(ep, worker.handle, () => attempts.push(clock.now()));
          if (fail-- > 0) c.failConnect = new TransportError("TRANSPORT_CONNECT", "refused");
          return c;
        },
      }),
    );
    clients.push(client);
    await clock.advanceAsync(300);
    expect(attempts).toEqual([0, 100, 300]);
    expect(client.ready).toBe(true);
    expect(client.connectionEpoch()).toBe(1);
    expect(client.workerInfo?.name).toBe("scripted");
    const info = lines.find((l) => l.level === 30);
    expect(info?.msg).toContain("after 2 failed connect attempts");
    // drop: the backoff starts again at backoffMs
    client.markFailed("test");
    expect(client.ready).toBe(false);
    await clock.advanceAsync(99);
    expect(attempts.length).toBe(3);
    await clock.advanceAsync(1);
    expect(attempts).toEqual([0, 100, 300, 400]);
    expect(client.connectionEpoch()).toBe(2);
    // newSession: no backoff, a new session id, epoch 3
    const before = client.sessionId;
    client.newSession("test");
    await clock.advanceAsync(0);
    expect(attempts.length).toBe(5);
    expect(client.sessionId).not.toBe(before);
    expect(worker.session).toBe(client.sessionId);
    expect(client.connectionEpoch()).toBe(3);
    const s = client.snapshot();
    expect(s.counters.hellos).toBe(3);
    expect(s.counters.new_sessions).toBe(1);
    expect(s.counters.disconnects).toBe(2);
  });

  test("HELLO reply mismatches disable the client, naming what differs (identities in hex)", async () => {
    const cases: [string, (w: ScriptedWorker) => void, string[]][] = [
      [
        "identity",
        (w) => {
          w.drafterIdentity = identity(9);
        },
        ["drafter identity", hex(identity(9)), hex(DRAFTER_ID)],
      ],
      [
        "markov",
        (w) => {
          w.markovIdentity = identity(8);
        },
        ["markov identity", hex(identity(8)), hex(MARKOV_ID)],
      ],
      [
        "window",
        (w) => {
          w.helloOverride = (_h, r) => {
            r.window = 3;
            return null;
          };
        },
        ["window: worker 3, ours 8"],
      ],
      [
        "margin capability",
        (w) => {
          w.capabilities = Capability.TAPS_BF16;
        },
        ["MARGIN"],
      ],
      [
        "max_slots",
        (w) => {
          w.helloOverride = (_h, r) => {
            r.maxSlots = 2;
            return null;
          };
        },
        ["max_slots: worker 2 < 8"],
      ],
    ];
    for (const [, setup, want] of cases) {
      const clock = new FakeClock();
      const worker = new ScriptedWorker();
      setup(worker);
      const client = new RemoteDraftClient(
        clientOptions("tcp://127.0.0.1:1", {
          clock,
          transportFactory: (ep) => new MemoryRpcClient(ep, worker.handle),
        }),
      );
      clients.push(client);
      await clock.advanceAsync(0);
      expect(client.disabled).toBe(true);
      for (const w of want) expect(client.disabledReason).toContain(w);
      expect(client.snapshot().info.disabled_reason).toBe(client.disabledReason);
      expect(client.snapshot().counters.remote_disabled).toBe(1);
      // a disabled client never reconnects and every round is target-only
      await clock.advanceAsync(10_000);
      expect(worker.hellos.length).toBe(1);
      expect((await client.step({ stepId: 1, entries: [], nRows: 0 })).reason).toBe("disabled");
    }
  });

  test("fatal HELLO statuses disable; IDENTITY_MISMATCH decodes the worker's HelloReply; BUSY retries", async () => {
    for (const status of [FrameStatus.IDENTITY_MISMATCH, FrameStatus.UNAUTHORIZED, FrameStatus.BUSY]) {
      const clock = new FakeClock();
      const worker = new ScriptedWorker();
      let n = 0;
      worker.helloOverride = (_h, reply) => {
        if (n++ > 0 && status === FrameStatus.BUSY) return null;
        reply.drafterIdentity = identity(7);
        return {
          status,
          body: status === FrameStatus.IDENTITY_MISMATCH ? encodeHelloReply(reply) : undefined,
        };
      };
      const client = new RemoteDraftClient(
        clientOptions("tcp://127.0.0.1:1", {
          clock,
          backoffMs: 50,
          transportFactory: (ep) => new MemoryRpcClient(ep, worker.handle),
        }),
      );
      clients.push(client);
      await clock.advanceAsync(0);
      if (status === FrameStatus.BUSY) {
        expect(client.disabled).toBe(false);
        expect(client.lastError).toContain("BUSY");
        await clock.advanceAsync(50);
        expect(client.ready).toBe(true);
      } else if (status === FrameStatus.IDENTITY_MISMATCH) {
        expect(client.disabledReason).toContain("IDENTITY_MISMATCH");
        expect(client.disabledReason).toContain(hex(identity(7)));
        expect(client.disabledReason).toContain(hex(DRAFTER_ID));
      } else {
        expect(client.disabledReason).toBe("HELLO refused: UNAUTHORIZED");
      }
    }
  });

  test("close() stops the loop; later calls are answered, nothing hangs", async () => {
    const clock = new FakeClock();
    const attempts: number[] = [];
    const client = new RemoteDraftClient(
      clientOptions("tcp://127.0.0.1:1", { clock, transportFactory: failingFactory(clock, attempts) }),
    );
    await clock.advanceAsync(0);
    await client.close();
    await clock.advanceAsync(100_000);
    expect(attempts.length).toBe(1);
    expect((await client.step({ stepId: 1, entries: [], nRows: 0 })).reason).toBe("not_ready");
    await expect(client.ping()).rejects.toThrow(ClientError);
    await expect(client.stats()).rejects.toMatchObject({ code: "CLIENT_CLOSED" });
    expect(await client.waitReady(10)).toBe(false);
  });

  test("autoStart false: nothing happens until start(); start() twice runs one loop", async () => {
    const clock = new FakeClock();
    const attempts: number[] = [];
    const client = new RemoteDraftClient(
      clientOptions("tcp://127.0.0.1:1", {
        clock,
        autoStart: false,
        backoffMs: 100,
        transportFactory: failingFactory(clock, attempts),
      }),
    );
    clients.push(client);
    await clock.advanceAsync(1000);
    expect(attempts.length).toBe(0);
    client.start();
    client.start();
    await clock.advanceAsync(0);
    expect(attempts.length).toBe(1);
    await clock.advanceAsync(100);
    expect(attempts.length).toBe(2);
  });
});
