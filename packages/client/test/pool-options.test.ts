// WorkerPool options (CONTRACT 12.2) are validated in the constructor, naming the bad one; a pool
// over a static list of members that all refuse is disabled, one over a dynamic source is not.
import { describe, expect, test } from "vitest";
import { ClientError, type MemberSource, staticMembers, WorkerPool } from "../src/index.js";
import { clientOptions, MemoryRpcClient, ScriptedWorker } from "./helpers.js";

const { endpoint: _e, ...base } = clientOptions("tcp://127.0.0.1:1");

function bad(f: () => unknown, re: RegExp): void {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(ClientError);
    expect((e as ClientError).code).toBe("CLIENT_BAD_OPTION");
    expect((e as Error).message).toMatch(re);
    return;
  }
  throw new Error("no error");
}

describe("WorkerPool options", () => {
  test("bad members, geometry and counters are named", () => {
    bad(() => new WorkerPool({ ...base, members: [] }), /members/);
    bad(
      () => new WorkerPool({ ...base, members: ["tcp://127.0.0.1:1", 7 as unknown as string] }),
      /members\[1\]/,
    );
    bad(() => new WorkerPool({ ...base, members: {} as unknown as MemberSource }), /members/);
    bad(() => new WorkerPool({ ...base, members: ["tcp://127.0.0.1:1"], window: 0 }), /window/);
    bad(
      () => new WorkerPool({ ...base, members: ["tcp://127.0.0.1:1"], maxFailoverSamples: 0 }),
      /maxFailoverSamples/,
    );
    bad(() => staticMembers(["" as string]), /members\[0\]/);
  });

  test("members refused with a fatal status: a static pool is disabled, a dynamic one is not", async () => {
    // in-memory members that answer every HELLO with other identities (IDENTITY_MISMATCH, fatal)
    const mkFactory = () => (endpoint: string) => {
      const w = new ScriptedWorker();
      w.drafterIdentity = new Uint8Array(32).fill(9);
      return new MemoryRpcClient(endpoint, w.handle);
    };
    const eps = ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"];
    const fixed = new WorkerPool({ ...base, members: eps, transportFactory: mkFactory() });
    const dynamic: MemberSource = {
      dynamic: true,
      subscribe: (on) => {
        on(eps.map((endpoint) => ({ endpoint })));
        return () => {};
      },
    };
    const pool2 = new WorkerPool({ ...base, members: dynamic, transportFactory: mkFactory() });
    try {
      const t0 = Date.now();
      while (!(fixed.disabled && pool2.members().length === 0) && Date.now() - t0 < 10_000) {
        fixed.connectionEpoch();
        pool2.connectionEpoch();
        await new Promise((r) => setTimeout(r, 10));
      }
      expect(fixed.disabled).toBe(true);
      expect(fixed.disabledReason).toMatch(/every member left/);
      expect(pool2.members()).toEqual([]);
      expect(pool2.disabled).toBe(false);
      expect(pool2.connectionEpoch()).toBeNull();
    } finally {
      await fixed.close();
      await pool2.close();
    }
  });
});
