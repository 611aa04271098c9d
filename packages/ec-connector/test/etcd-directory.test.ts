// Issue 22 x issue 21: an EcDirectory (EC-CONTRACT 10.3) fed from etcd. Real etcd child (Debian
// etcd 3.4, @tapwire/testing startEtcd), real `tapwire-ec-producer` bins started with
// `--register … --events-listen … --replay-listen …`: the directory learns each producer's
// residency endpoints from its `encoder` record, holds its resident set, follows producers that
// start later, drops one that stops cleanly (revoked) or is SIGKILLed (lease expiry), keeps the
// last producers while etcd is down, and placement through it (EC-CONTRACT 10.4) fetches an item
// from its holder with equal bytes.
import {
  type EncoderDirectoryRecord,
  type EncoderDirectorySource,
  type EtcdDirectorySource,
  etcdDirectorySource,
} from "@tapwire/discovery";
import { type EtcdChild, startEtcd } from "@tapwire/testing";
import { afterAll, afterEach, beforeAll, expect, it } from "vitest";
import type { DirectorySource, ProducerRecord } from "../src/index.js";
import { ConsumerConnector, EcAdminClient, EcDirectory, syntheticEmbedding } from "../src/index.js";
import { type ProducerProc, spawnProducer, until } from "./helpers/proc.js";

// Compile-time check: discovery's structural shapes and ec-connector's types are assignable both
// ways (discovery does not import ec-connector; a drift fails `tsc -p tsconfig.test.json`).
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
const recordShapesMatch: Same<EncoderDirectoryRecord, ProducerRecord> = true;
const sourceShapesMatch: [EncoderDirectorySource] extends [DirectorySource] ? true : false = true;

let etcd: EtcdChild;
const open: { close(): unknown }[] = [];
const procs: ProducerProc[] = [];
beforeAll(async () => {
  etcd = await startEtcd();
});
afterAll(async () => {
  await etcd?.close();
});
afterEach(async () => {
  for (const o of open.splice(0).reverse()) await o.close();
  for (const p of procs.splice(0))
    if (p.child.exitCode === null && p.child.signalCode === null) await p.kill("SIGKILL");
});

const PREFIX = `/tapwire-ec-dir-${process.pid}/`;

async function producer(ttl: number, prepopulate: string): Promise<ProducerProc & { incarnation: string }> {
  const p = await spawnProducer([
    "--num-blocks",
    "64",
    "--block-bytes",
    "1024",
    "--prepopulate",
    prepopulate,
    "--events-listen",
    "tcp://127.0.0.1:0",
    "--replay-listen",
    "tcp://127.0.0.1:0",
    "--events-heartbeat-ms",
    "200",
    "--register",
    etcd.endpoint,
    "--register-prefix",
    PREFIX,
    "--register-ttl",
    String(ttl),
  ]);
  procs.push(p);
  return { ...p, incarnation: String(p.handle.readyLine.json!["incarnation"]) };
}

function holds(d: EcDirectory, control: string, hashes: string[]): boolean {
  const v = d.view(control);
  if (v === undefined || !v.trusted) return false;
  const set = d.residentSet(control);
  return set.size === hashes.length && hashes.every((h) => set.has(h) && d.holders(h).includes(control));
}

it("issue 22: a directory fed from etcd follows registered producers: sets, late start, etcd down, clean stop, SIGKILL, placement", async () => {
  expect(recordShapesMatch && sourceShapesMatch).toBe(true);
  const a = await producer(30, "a1:1000,a2:2000");
  const src: EtcdDirectorySource = etcdDirectorySource({
    etcd: etcd.endpoint,
    prefix: PREFIX,
    backoffMs: 50,
    backoffMaxMs: 200,
  });
  open.push(src);
  const d = new EcDirectory({ source: src });
  open.push(d);
  await until(() => (holds(d, a.control, ["a1", "a2"]) ? true : undefined), 30_000, "A's prepopulated set");
  // The record carries what the bin's listening line names (issue 22 record fields).
  const recA = src.records().find((r) => r.control === a.control)!;
  expect(recA).toEqual({
    control: a.control,
    events: String(a.handle.readyLine.json!["events"]),
    replay: String(a.handle.readyLine.json!["replay"]),
    incarnation: a.incarnation,
  });
  expect(d.view(a.control)!.incarnation).toBe(a.incarnation);

  // an item encoded through the admin socket (EC-CONTRACT 9.3) enters the view
  const admin = new EcAdminClient(a.admin);
  open.push(admin);
  expect(await admin.encode("a3", 1500)).toMatch(/ready|encoding/);
  await until(() => (holds(d, a.control, ["a1", "a2", "a3"]) ? true : undefined), 30_000, "a3 stored");

  // etcd down: the last known producers stay (no record removal while the watch is lost)
  await etcd.stop();
  for (let i = 0; i < 15; i++) {
    expect(d.view(a.control)).toBeDefined();
    expect(d.holders("a1")).toEqual([a.control]);
    await new Promise((r) => setTimeout(r, 100));
  }
  await etcd.start();

  // a producer started later appears with its set
  const b = await producer(2, "b1:3000");
  await until(() => (holds(d, b.control, ["b1"]) ? true : undefined), 30_000, "late producer B");
  expect(
    d
      .views()
      .map((v) => v.producer)
      .sort(),
  ).toEqual([a.control, b.control].sort());

  // a filter on another ec_compat lists none of them
  const other = etcdDirectorySource({ etcd: etcd.endpoint, prefix: PREFIX, ecCompat: "00" });
  open.push(other);
  let otherLists = 0;
  let otherLast: readonly ProducerRecord[] = [{ control: "x", events: "x", replay: "x" }];
  const stopOther = other.watch((r) => {
    otherLists += 1;
    otherLast = r;
  });
  open.push({ close: stopOther });
  await until(() => (otherLists > 0 ? true : undefined), 30_000, "filtered listing");
  expect(otherLast).toEqual([]);

  // EC-CONTRACT 10.4: placement through the etcd-fed directory fetches from the holder, bytes equal
  const c = await ConsumerConnector.create({
    numBlocks: 64,
    blockBytes: 1024,
    compatibility: a.compatibilityHash,
    placement: d,
  });
  open.push(c);
  expect(c.requestPlaced("nowhere", 1000, performance.now() + 10_000)).toBe("not-resident");
  for (const [h, n] of [
    ["b1", 3000],
    ["a3", 1500],
  ] as const) {
    expect(c.requestPlaced(h, n, performance.now() + 20_000)).toBe("pending");
    await until(() => (c.poll().loaded.includes(h) ? true : undefined), 30_000, `${h} loaded`);
    expect(Buffer.from(c.cache.view(h)).equals(Buffer.from(syntheticEmbedding(h, n)))).toBe(true);
  }

  // clean stop: the record is revoked at once (30 s TTL not expired), the producer leaves the directory
  expect((await a.kill("SIGTERM")).code).toBe(0);
  await until(() => (d.view(a.control) === undefined ? true : undefined), 15_000, "A removed");
  expect(d.holders("a1")).toEqual([]);
  expect(d.view(b.control)).toBeDefined();

  // SIGKILL: no revoke; the producer leaves when its 2 s lease expires
  await b.kill("SIGKILL");
  await until(
    () => (d.view(b.control) === undefined ? true : undefined),
    30_000,
    "B removed at lease expiry",
  );
  expect(d.holders("b1")).toEqual([]);
  expect(src.records()).toEqual([]);
});
