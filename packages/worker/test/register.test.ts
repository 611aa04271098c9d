// `tapwire-worker --register` (issue 21, CONTRACT 12.2) against a real etcd child: the record
// (schema 1) names the endpoint the bin reports, its identities, geometry and capacity; SIGTERM
// revokes it first and the worker keeps serving for --register-drain-ms before it closes; bad
// discovery flags are usage errors (exit 2) before anything is bound.
import { spawnSync } from "node:child_process";
import { etcdMembers, type MemberInfo } from "@tapwire/discovery";
import { killAllChildren, spawnBin, startEtcd, waitUntil } from "@tapwire/testing";
import { afterEach, expect, test } from "vitest";
import { BIN } from "./spawn.js";

afterEach(async () => {
  await killAllChildren();
});

test("bad --register / --register-prefix: exit 2, one line naming the flag", () => {
  for (const [args, re] of [
    [["--register", "http://127.0.0.1:2379"], /--register http/],
    [["--register", "etcd://127.0.0.1:2379", "--register-prefix", "tapwire"], /--register-prefix tapwire/],
  ] as const) {
    const r = spawnSync(process.execPath, [BIN, "--drafter", "null", ...args], {
      encoding: "utf8",
      timeout: 20_000,
    });
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(re);
  }
});

test("--register: the record while serving, revoked on SIGTERM before the close", async () => {
  const etcd = await startEtcd();
  const src = etcdMembers({ etcd: etcd.endpoint, prefix: "/tapwire-worker-test/" });
  let last: readonly MemberInfo[] = [];
  src.subscribe((m) => {
    last = m;
  });
  try {
    const child = await spawnBin(BIN, [
      "--drafter",
      "null",
      "--listen",
      "tcp://127.0.0.1:0",
      "--window",
      "8",
      "--num-spec",
      "4",
      "--vocab",
      "1000",
      "--num-taps",
      "1",
      "--hidden",
      "8",
      "--max-sessions",
      "3",
      "--register",
      etcd.endpoint,
      "--register-prefix",
      "/tapwire-worker-test/",
      "--register-ttl",
      "30",
      "--register-drain-ms",
      "1500",
    ]);
    const ep = (child.readyLine.json?.endpoints as string[] | undefined)?.[0];
    await waitUntil(() => last.length === 1, { timeoutMs: 15_000, what: "the record" });
    const m = last[0]!;
    expect(m.endpoint).toBe(ep);
    expect(m.record!.kind).toBe("worker");
    expect(m.record!.identities.drafter).toBe(String(child.readyLine.json?.drafterIdentity));
    expect(m.record!.geometry).toMatchObject({ window: 8, num_spec: 4, vocab_size: 1000, row_bytes: 16 });
    expect(m.record!.capacity).toMatchObject({ max_sessions: 3 });
    child.child.kill("SIGTERM");
    // gone from etcd while the process still serves its drain (30 s lease: not an expiry)
    await waitUntil(() => last.length === 0, { timeoutMs: 10_000, what: "revoked" });
    expect(child.child.exitCode).toBeNull();
    expect((await child.exited).code).toBe(0);
  } finally {
    await src.close();
    await etcd.close();
  }
});
