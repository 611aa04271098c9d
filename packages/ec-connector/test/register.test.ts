// `tapwire-ec-producer --register` (issue 21) against a real etcd child: the producer keeps an
// `encoder` record (schema 1) under a lease while it runs and revokes it on a clean stop.
import { etcdMembers } from "@tapwire/discovery";
import { spawnBin, startEtcd, waitUntil } from "@tapwire/testing";
import { expect, it } from "vitest";
import { PRODUCER_BIN } from "./helpers/proc.js";

it("tapwire-ec-producer --register: an encoder record while running, revoked on SIGTERM", async () => {
  const etcd = await startEtcd();
  const src = etcdMembers({ etcd: etcd.endpoint, prefix: "/tapwire-ec-test/", kind: "encoder" });
  try {
    let last: readonly { endpoint: string; record?: { kind: string; capacity: Record<string, number> } }[] =
      [];
    src.subscribe((m) => {
      last = m;
    });
    const child = await spawnBin(PRODUCER_BIN, [
      "--register",
      etcd.endpoint,
      "--register-prefix",
      "/tapwire-ec-test/",
      "--register-ttl",
      "30",
    ]);
    const control = String(child.readyLine.json!["control"]);
    await waitUntil(() => last.length === 1, { timeoutMs: 15_000, what: "encoder record" });
    expect(last[0]!.endpoint).toBe(control);
    expect(last[0]!.record!.kind).toBe("encoder");
    expect(last[0]!.record!.capacity.num_blocks).toBeGreaterThan(0);
    expect((await child.kill("SIGTERM")).code).toBe(0);
    // revoked (its 30 s lease has not expired): gone at once
    await waitUntil(() => last.length === 0, { timeoutMs: 10_000, what: "record revoked" });
  } finally {
    await src.close();
    await etcd.close();
  }
});
