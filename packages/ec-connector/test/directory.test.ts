import { afterEach, expect, it } from "vitest";
import type { DirectoryChange } from "../src/index.js";
import { ConsumerConnector, EcAdminClient, EcDirectory, EcProducer } from "../src/index.js";
import { until } from "./helpers/proc.js";

const open: { close(): unknown }[] = [];
afterEach(async () => {
  for (const o of open.splice(0).reverse()) await o.close();
});

async function producer(extra: Parameters<typeof EcProducer.start>[0] = {}): Promise<EcProducer> {
  const p = await EcProducer.start({
    numBlocks: 64,
    blockBytes: 1024,
    events: "tcp://127.0.0.1:0",
    replay: "tcp://127.0.0.1:0",
    eventsHeartbeatMs: 200,
    ...extra,
  });
  open.push(p);
  return p;
}

function record(p: EcProducer) {
  return { control: p.controlEndpoint, events: p.events!.eventsEndpoint, replay: p.events!.replayEndpoint };
}

function sameSet(d: EcDirectory, p: EcProducer): boolean {
  const v = d.view(p.controlEndpoint);
  if (v === undefined || !v.trusted || v.incarnation !== p.events!.incarnation) return false;
  const want = new Set(p.cache.keys().filter((h) => p.cache.isReady(h)));
  const got = d.residentSet(p.controlEndpoint);
  return got.size === want.size && [...want].every((h) => got.has(h));
}

it("EC-CONTRACT 10.3: a late directory gets the prepopulated set by snapshot, then follows stored/evicted in order", async () => {
  const p = await producer({
    prepopulate: [
      ["a", 1000],
      ["b", 3000],
    ],
  });
  const d = new EcDirectory({ producers: [record(p)] });
  open.push(d);
  const changes: DirectoryChange[] = [];
  d.onChange = (c) => changes.push(c);
  await until(() => (sameSet(d, p) ? true : undefined), 20_000, "snapshot");
  expect(d.holders("a")).toEqual([p.controlEndpoint]);
  expect(d.holders("zzz")).toEqual([]);
  p.encode("c", 500);
  expect(p.evict("a")).toBe("evicted");
  expect(p.evict("a")).toBe("missing");
  await until(() => (sameSet(d, p) && d.holders("c").length === 1 ? true : undefined), 20_000, "live");
  expect(d.holders("a")).toEqual([]);
  // The live changes arrived as a log: c stored before a evicted.
  const live = changes
    .filter((c) => c.kind === "stored" || c.kind === "evicted")
    .map((c) => `${c.kind}:${c.mmHashes[0]}`);
  expect(live.slice(-2)).toEqual(["stored:c", "evicted:a"]);
});

it("EC-CONTRACT 10.4: placement asks only trusted holders, most free blocks first, and reports not-resident at once", async () => {
  const p1 = await producer({ prepopulate: [["x", 1000]] });
  const p2 = await producer({
    prepopulate: [
      ["x", 1000],
      ["big", 40_000],
    ],
  });
  const d = new EcDirectory({ producers: [record(p1), record(p2)] });
  open.push(d);
  await until(() => (sameSet(d, p1) && sameSet(d, p2) ? true : undefined), 20_000, "both trusted");
  // p1 has more free blocks: it comes first.
  expect(d.holders("x")).toEqual([p1.controlEndpoint, p2.controlEndpoint]);
  const c = await ConsumerConnector.create({
    numBlocks: 64,
    blockBytes: 1024,
    compatibility: p1.compatibilityHash,
    placement: d,
  });
  open.push(c);
  expect(c.requestPlaced("nowhere", 1000, performance.now() + 10_000)).toBe("not-resident");
  expect(c.pendingCount).toBe(0);
  expect(c.requestPlaced("big", 40_000, performance.now() + 10_000)).toBe("pending");
  const loaded: string[] = [];
  await until(() => {
    loaded.push(...c.poll().loaded);
    return loaded.includes("big") ? true : undefined;
  });
  // Only the holder was asked (EC-CONTRACT 10.4: none that does not hold it).
  expect(p2.registry.counter("producer_requests").value).toBe(1);
  expect(p1.registry.counter("producer_requests").value).toBe(0);
});

it("EC-CONTRACT 10.5: admin evict answers evicted / missing / pinned and publishes the eviction", async () => {
  const p = await producer({ prepopulate: [["e1", 1000]] });
  const admin = new EcAdminClient(p.adminEndpoint);
  open.push(admin);
  const d = new EcDirectory({ producers: [record(p)] });
  open.push(d);
  await until(() => (sameSet(d, p) && d.holders("e1").length === 1 ? true : undefined), 20_000, "trusted");
  p.cache.pinIfReady("e1");
  expect(await admin.evict("e1")).toBe("pinned");
  p.cache.unpin("e1");
  expect(await admin.evict("e1")).toBe("evicted");
  expect(await admin.evict("e1")).toBe("missing");
  await until(() => (d.holders("e1").length === 0 ? true : undefined), 20_000, "evicted event");
});

it("EC-CONTRACT 10.3: a restarted producer (new incarnation) replaces the set; a silent one is gone after three heartbeats", async () => {
  const p = await producer({ prepopulate: [["old", 1000]], control: "tcp://127.0.0.1:0" });
  const rec = record(p);
  const d = new EcDirectory({ producers: [rec] });
  open.push(d);
  await until(() => (sameSet(d, p) ? true : undefined), 20_000, "trusted");
  const changes: DirectoryChange[] = [];
  d.onChange = (c) => changes.push(c);
  await p.close();
  await until(() => (changes.some((c) => c.kind === "gone") ? true : undefined), 20_000, "gone");
  expect(d.holders("old")).toEqual([]);
  expect(d.view(rec.control)?.gone).toBe(true);
  const p2 = await producer({ prepopulate: [["new", 1000]], events: rec.events, replay: rec.replay });
  await until(
    () =>
      d.view(rec.control)?.incarnation === p2.events!.incarnation && d.view(rec.control)?.trusted
        ? true
        : undefined,
    20_000,
    "new incarnation",
  );
  expect(d.holders("new")).toEqual([rec.control]);
  expect(d.holders("old")).toEqual([]);
});

it("EC-CONTRACT 10: bad events options are refused naming the option; a directory validates its records", async () => {
  await expect(EcProducer.start({ events: "tcp://127.0.0.1:0" })).rejects.toThrow(/option replay/);
  await expect(EcProducer.start({ eventsHeartbeatMs: 100 })).rejects.toThrow(/option eventsHeartbeatMs/);
  await expect(
    EcProducer.start({ events: "tcp://127.0.0.1:0", replay: "tcp://127.0.0.1:0", eventsRingMessages: 100 }),
  ).rejects.toThrow(/option eventsRingMessages/);
  await expect(EcProducer.start({ events: "nonsense", replay: "tcp://127.0.0.1:0" })).rejects.toThrow(
    /bind nonsense/,
  );
  expect(() => new EcDirectory({ producers: [{ control: "", events: "x", replay: "y" }] })).toThrow(
    /producers\[0\]\.control/,
  );
  expect(() => new EcDirectory({ producers: [], source: { watch: () => () => undefined } })).toThrow(
    /option source/,
  );
  expect(() => new EcDirectory({ tickMs: 0 })).toThrow(/option tickMs/);
});

it("EC-CONTRACT 10.3: a source delivers records; a removed producer's set leaves holders()", async () => {
  const p = await producer({ prepopulate: [["s1", 1000]] });
  let push: (r: readonly ReturnType<typeof record>[]) => void = () => undefined;
  const d = new EcDirectory({
    source: {
      watch(on) {
        push = on;
        on([record(p)]);
        return () => undefined;
      },
    },
  });
  open.push(d);
  await until(() => (d.holders("s1").length === 1 ? true : undefined), 20_000, "trusted from the source");
  push([]);
  expect(d.holders("s1")).toEqual([]);
  expect(d.views()).toEqual([]);
});
