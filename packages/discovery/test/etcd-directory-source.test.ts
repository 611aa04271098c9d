// Issue 22: etcdDirectorySource against a real etcd child (Debian etcd 3.4, @tapwire/testing
// startEtcd), with records written by hand (bytes this package did not produce, the way a router
// or an encoder in another language would): only encoder records with a valid `residency` enter
// the directory list, one per control endpoint (the newest wins), an `ecCompat` filter keeps one
// compatibility hash, hostile values under the prefix are ignored, deletes remove producers.
import { createHash } from "node:crypto";
import { type EtcdChild, startEtcd, waitUntil } from "@tapwire/testing";
import { Etcd3 } from "etcd3";
import { afterAll, beforeAll, expect, test } from "vitest";
import { type EncoderDirectoryRecord, etcdDirectorySource } from "../src/index.js";

let etcd: EtcdChild;
beforeAll(async () => {
  etcd = await startEtcd();
});
afterAll(async () => {
  await etcd?.close();
});

const COMPAT_A = "aa".repeat(32);
const COMPAT_B = "bb".repeat(32);

/** An encoder record as JSON, built from the README's table (not with makeRecord). */
function encoderJson(o: {
  inc: string;
  control: string;
  startedAt: string;
  ecCompat?: string;
  residency?: unknown;
}): string {
  const identities = { ec_compat: o.ecCompat ?? COMPAT_A };
  const geometry = { data_kind: "tcp" };
  const canon = `{"geometry":{"data_kind":"tcp"},"identities":{"ec_compat":"${identities.ec_compat}"}}`;
  return JSON.stringify({
    schema: 1,
    kind: "encoder",
    incarnation: o.inc,
    started_at: o.startedAt,
    endpoints: [o.control, "tcp://127.0.0.1:9999"],
    identities,
    geometry,
    compat: createHash("sha256").update(canon).digest("hex"),
    capacity: { num_blocks: 64, block_bytes: 1024 },
    ...(o.residency === undefined ? {} : { residency: o.residency }),
  });
}

test("issue 22: hand-written encoder records: residency required, newest per control, ecCompat, hostile values ignored, deletes", async () => {
  const p = `/tapwire-dirsrc-${process.pid}/`;
  const raw = new Etcd3({ hosts: etcd.clientUrl });
  const src = etcdDirectorySource({ etcd: etcd.endpoint, prefix: p, backoffMs: 50, backoffMaxMs: 200 });
  const onlyB = etcdDirectorySource({ etcd: etcd.endpoint, prefix: p, ecCompat: COMPAT_B });
  let last: readonly EncoderDirectoryRecord[] = [];
  let lastB: readonly EncoderDirectoryRecord[] = [];
  const stop = src.watch((r) => {
    last = r;
  });
  const stopB = onlyB.watch((r) => {
    lastB = r;
  });
  const res = (n: number, incarnation = `stream-${n}`) => ({
    events: `tcp://127.0.0.1:${7000 + n}`,
    replay: `tcp://127.0.0.1:${7100 + n}`,
    incarnation,
  });
  try {
    const old = "1".repeat(32);
    const fresh = "2".repeat(32);
    // two records of one control endpoint: a restarted producer whose old lease has not expired
    await raw.put(`${p}encoder/${old}`).value(
      encoderJson({
        inc: old,
        control: "tcp://127.0.0.1:6001",
        startedAt: "2026-12-02T01:00:00Z",
        residency: res(1, "old"),
      }),
    );
    await raw.put(`${p}encoder/${fresh}`).value(
      encoderJson({
        inc: fresh,
        control: "tcp://127.0.0.1:6001",
        startedAt: "2026-12-02T02:00:00Z",
        residency: res(2, "new"),
      }),
    );
    // another compat, and one without residency (started without --events-listen)
    await raw.put(`${p}encoder/${"3".repeat(32)}`).value(
      encoderJson({
        inc: "3".repeat(32),
        control: "tcp://127.0.0.1:6003",
        startedAt: "2026-12-02T01:00:00Z",
        ecCompat: COMPAT_B,
        residency: { events: "tcp://127.0.0.1:7003", replay: "tcp://127.0.0.1:7103", incarnation: "" },
      }),
    );
    await raw.put(`${p}encoder/${"4".repeat(32)}`).value(
      encoderJson({
        inc: "4".repeat(32),
        control: "tcp://127.0.0.1:6004",
        startedAt: "2026-12-02T01:00:00Z",
      }),
    );
    // hostile residency values
    for (const [i, bad] of [
      { ...res(5), events: "not a url" },
      { ...res(6), replay: ["tcp://x:1"] },
      { ...res(7), incarnation: "x".repeat(10_000) },
      "tcp://127.0.0.1:1",
    ].entries()) {
      const inc = `${5 + i}`.repeat(32);
      await raw.put(`${p}encoder/${inc}`).value(
        encoderJson({
          inc,
          control: `tcp://127.0.0.1:${6100 + i}`,
          startedAt: "2026-12-02T01:00:00Z",
          residency: bad,
        }),
      );
    }
    await waitUntil(() => last.length === 2 && lastB.length === 1, {
      timeoutMs: 15_000,
      what: "two producers",
    });
    expect([...last].sort((a, b) => a.control.localeCompare(b.control))).toEqual([
      { control: "tcp://127.0.0.1:6001", ...res(2, "new") },
      { control: "tcp://127.0.0.1:6003", events: "tcp://127.0.0.1:7003", replay: "tcp://127.0.0.1:7103" },
    ]);
    expect(lastB.map((r) => r.control)).toEqual(["tcp://127.0.0.1:6003"]);
    expect(src.records()).toEqual(last);
    // the newest record goes: the older one of that control endpoint takes its place
    await raw.delete().key(`${p}encoder/${fresh}`);
    await waitUntil(() => last.some((r) => r.incarnation === "old"), {
      timeoutMs: 15_000,
      what: "older record",
    });
    await raw.delete().key(`${p}encoder/${old}`);
    await waitUntil(() => last.length === 1, { timeoutMs: 15_000, what: "6001 removed" });
    expect(last[0]!.control).toBe("tcp://127.0.0.1:6003");
  } finally {
    stop();
    stopB();
    await src.close();
    await onlyB.close();
    raw.close();
  }
});
