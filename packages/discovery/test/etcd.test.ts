// register() and etcdMembers() against a real etcd (Debian etcd 3.4) started as a child on
// loopback (@tapwire/testing startEtcd): a clean stop revokes the record at once; a registered
// process killed with SIGKILL disappears when its lease expires; etcd stopped for a while loses
// no member and the watch comes back (a record registered after the restart is seen).
import { createHash } from "node:crypto";
import { fileURLToPath } from "node:url";
import { type EtcdChild, killAllChildren, spawnBin, startEtcd, waitUntil } from "@tapwire/testing";
import { Etcd3 } from "etcd3";
import { afterAll, afterEach, beforeAll, describe, expect, test } from "vitest";
import {
  type EtcdMemberSource,
  etcdMembers,
  type MemberInfo,
  type Registration,
  register,
} from "../src/index.js";

let etcd: EtcdChild;
const open: { close(): Promise<unknown> }[] = [];
beforeAll(async () => {
  etcd = await startEtcd();
});
afterAll(async () => {
  await etcd?.close();
});
afterEach(async () => {
  for (const o of open.splice(0).reverse()) await o.close();
  await killAllChildren();
  await etcd.start(); // a test that stopped it leaves it running for the next
});

let n = 0;
const prefix = () => `/tapwire-test-${process.pid}-${++n}/`;

function reg(p: string, endpoint: string, ttlSeconds = 10): Registration {
  const r = register({
    etcd: etcd.endpoint,
    prefix: p,
    ttlSeconds,
    record: { kind: "worker", endpoints: [endpoint] },
    backoffMs: 50,
    backoffMaxMs: 200,
  });
  open.push(r);
  return r;
}

function watch(p: string): { src: EtcdMemberSource; last: () => readonly MemberInfo[] } {
  const src = etcdMembers({ etcd: etcd.endpoint, prefix: p, backoffMs: 50, backoffMaxMs: 200 });
  open.push(src);
  let last: readonly MemberInfo[] = [];
  src.subscribe((m) => {
    last = m;
  });
  return { src, last: () => last };
}

const eps = (l: readonly MemberInfo[]) => l.map((m) => m.endpoint).sort();

describe("discovery over a real etcd", () => {
  test("register, watch, clean stop revokes at once", async () => {
    const p = prefix();
    const { last } = watch(p);
    const a = reg(p, "tcp://127.0.0.1:7001", 30);
    const b = reg(p, "tcp://127.0.0.1:7002");
    await a.ready;
    await b.ready;
    await waitUntil(() => last().length === 2, { timeoutMs: 10_000, what: "two members" });
    expect(eps(last())).toEqual(["tcp://127.0.0.1:7001", "tcp://127.0.0.1:7002"]);
    expect(last()[0]!.incarnation).toMatch(/^[0-9a-f]{32}$/);
    const t0 = Date.now();
    await a.close();
    await waitUntil(() => last().length === 1, { timeoutMs: 5_000, what: "revoked record gone" });
    // gone through the revoke: its 30 s lease could not have expired yet
    expect(Date.now() - t0).toBeLessThan(29_000);
    expect(eps(last())).toEqual(["tcp://127.0.0.1:7002"]);
  });

  test("SIGKILL of a registered process: its record goes when the lease expires", async () => {
    const p = prefix();
    const { last } = watch(p);
    const child = await spawnBin(fileURLToPath(new URL("./fixtures/register-child.mjs", import.meta.url)), [
      etcd.endpoint,
      p,
      "2",
    ]);
    await waitUntil(() => last().length === 1, { timeoutMs: 10_000, what: "child registered" });
    await child.kill("SIGKILL");
    await waitUntil(() => last().length === 0, { timeoutMs: 20_000, what: "lease expiry" });
  });

  test("etcd stopped for a while: no member lost, the watch and the lease come back", async () => {
    const p = prefix();
    const { src, last } = watch(p);
    const a = reg(p, "tcp://127.0.0.1:7101");
    await a.ready;
    await waitUntil(() => last().length === 1, { timeoutMs: 10_000, what: "member" });
    const listings = src.listings;
    await etcd.stop();
    const seenDown: number[] = [];
    for (let i = 0; i < 30; i++) {
      seenDown.push(last().length);
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(seenDown.every((x) => x === 1)).toBe(true);
    await etcd.start();
    const b = reg(p, "tcp://127.0.0.1:7102");
    await b.ready;
    await waitUntil(() => last().length === 2, { timeoutMs: 20_000, what: "watch back" });
    expect(eps(last())).toEqual(["tcp://127.0.0.1:7101", "tcp://127.0.0.1:7102"]);
    expect(src.listings).toBeGreaterThanOrEqual(listings);
    expect(a.registered).toBe(true);
  });

  test("hostile records under the prefix (written by hand, not by register) are ignored, a hand-made valid one is listed", async () => {
    const p = prefix();
    const { src, last } = watch(p);
    const raw = new Etcd3({ hosts: etcd.clientUrl });
    try {
      const identities = { drafter: "11".repeat(32), markov: "22".repeat(32) };
      const geometry = { window: 8, num_spec: 4 };
      const canon = `{"geometry":{"num_spec":4,"window":8},"identities":{"drafter":"${identities.drafter}","markov":"${identities.markov}"}}`;
      const good = JSON.stringify({
        schema: 1,
        kind: "worker",
        incarnation: "a".repeat(32),
        started_at: "2026-12-02T01:00:00Z",
        endpoints: ["tcp://127.0.0.1:7201"],
        identities,
        geometry,
        compat: createHash("sha256").update(canon).digest("hex"),
        capacity: { max_slots: 8 },
        extra: { from: "a router in another language" },
      });
      await raw.put(`${p}worker/garbage`).value(Buffer.from([0xff, 0x00, 0x7b]));
      await raw.put(`${p}worker/huge`).value("x".repeat(64 * 1024));
      await raw.put(`${p}worker/nested`).value(`${"[".repeat(10_000)}${"]".repeat(10_000)}`);
      await raw
        .put(`${p}worker/wrong-compat`)
        .value(good.replace(/"compat":"[0-9a-f]+"/, `"compat":"${"0".repeat(64)}"`));
      await raw.put(`${p}worker/good`).value(good);
      await waitUntil(() => last().length === 1, { timeoutMs: 10_000, what: "the one valid record" });
      expect(last()[0]!.endpoint).toBe("tcp://127.0.0.1:7201");
      expect(last()[0]!.compat).toMatchObject({ drafterIdentity: identities.drafter, window: 8, numSpec: 4 });
      // a flood of puts to one bad key: still one valid member, the source keeps working
      for (let i = 0; i < 200; i++) await raw.put(`${p}worker/garbage`).value(`{"schema":${i}}`);
      await raw.delete().key(`${p}worker/good`);
      await waitUntil(() => last().length === 0, { timeoutMs: 10_000, what: "the valid record deleted" });
      expect(src.records().size).toBe(0);
    } finally {
      raw.close();
    }
  });
});
