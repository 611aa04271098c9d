// startEtcd (src/etcd.ts): a real etcd child whose data dir sits on tmpfs where there is one, so
// that a loaded machine's disk cannot stall its fsyncs (a lease revoke outlasting a 2 s timeout).
import { existsSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { expect, test } from "vitest";
import { startEtcd } from "../src/index.js";

const shmWritable = (() => {
  try {
    return statSync("/dev/shm").isDirectory();
  } catch {
    return false;
  }
})();

test("the data dir is on /dev/shm when it exists (else the temp dir), healthy, and removed by close", async () => {
  const e = await startEtcd();
  const dir = e.dataDir;
  try {
    expect(dir.startsWith(shmWritable ? "/dev/shm/tapwire-etcd-" : tmpdir())).toBe(true);
    const r = await fetch(`${e.endpoint.replace("etcd://", "http://")}/health`);
    expect(((await r.json()) as { health: string }).health).toBe("true");
    expect(existsSync(dir)).toBe(true);
  } finally {
    await e.close();
  }
  expect(existsSync(dir)).toBe(false);
});
