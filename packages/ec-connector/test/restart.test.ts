import { Registry } from "@tapwire/stats";
import { afterEach, describe, expect, it } from "vitest";
import { ConsumerConnector, EcAdminClient } from "../src/index.js";
import { Driver } from "./helpers/drive.js";
import type { ProducerProc } from "./helpers/proc.js";
import { spawnProducer, until } from "./helpers/proc.js";

// Issue 19 item 2 (docs/ec-protocol.md "A restarted producer"): requests a consumer made while its
// producer was down never reach the producer's successor on the same address, so the successor
// holds no pin and no grant for them. A real producer child is killed by SIGKILL while requests
// and reads are in flight, and another is started on the same control address.
const BB = 4096;
const BLOCKS = 8;
const ENTRY = BLOCKS * BB;
const ENTRIES = 24;
const procs: ProducerProc[] = [];

afterEach(async () => {
  for (const p of procs.splice(0)) await p.kill("SIGKILL").catch(() => undefined);
});

function start(control: string, extra: string[] = []): Promise<ProducerProc> {
  return spawnProducer([
    "--control",
    control,
    "--num-blocks",
    "512",
    "--block-bytes",
    String(BB),
    "--prepopulate",
    Array.from({ length: ENTRIES }, (_, i) => `img-${i}:${ENTRY}`).join(","),
    "--log-level",
    "error",
    ...extra,
  ]).then((p) => {
    procs.push(p);
    return p;
  });
}

describe("a producer restarted on the same address (issue 19)", () => {
  it("SIGKILL mid-transfer, successor on the same address: every transfer loads, the successor holds 0 pins and 0 grants", async () => {
    // slow reads on the first producer so transfers are in flight when it dies
    const first = await start("tcp://127.0.0.1:0", ["--throttle-bps", String(2 * ENTRY)]);
    const control = first.control;
    const registry = new Registry();
    const ackTimeouts = () => registry.snapshot().counters["consumer_ack_timeouts"] ?? 0;
    const conn = await ConsumerConnector.create({
      numBlocks: 1024,
      blockBytes: BB,
      compatibility: first.compatibilityHash,
      registry,
    });
    const d = new Driver(conn).start();
    try {
      const half = ENTRIES / 2;
      const before = Array.from({ length: half }, (_, i) => d.fetch(`img-${i}`, control, ENTRY, 30_000));
      // wait until the first producer has granted some (reads in flight), then kill it
      const admin1 = new EcAdminClient(first.admin);
      await until(async () => (((await admin1.stats()) as { grants: number }).grants > 0 ? true : undefined));
      admin1.close();
      await first.kill("SIGKILL");
      // requests made while nobody listens on the address, for longer than the consumer's ack
      // timeout (2 s): its retries happen during the outage too
      const during = Array.from({ length: half }, (_, i) =>
        d.fetch(`img-${half + i}`, control, ENTRY, 30_000),
      );
      const t = Date.now();
      await until(() => (Date.now() - t > 4_500 ? true : undefined), 10_000);
      const second = await start(control);
      expect(second.control).toBe(control);
      const timeoutsAtStart = ackTimeouts();
      // EC-CONTRACT 6.4: a read in flight when its producer died fails (the engine computes
      // locally); every request made during the outage loads from the successor; none runs out
      // its deadline
      const early = await Promise.all(before);
      const late = await Promise.all(during);
      expect(
        early.filter((r) => r !== "loaded" && !r.startsWith("read_error") && !r.includes("down mid-read")),
        early.join(","),
      ).toEqual([]);
      expect(
        late.filter((r) => r !== "loaded"),
        late.join(","),
      ).toEqual([]);
      expect(d.mismatched).toEqual([]);
      // the successor holds nothing for requests made before it ran (well inside its 30 s lease)
      const admin2 = new EcAdminClient(second.admin);
      const held = await until(
        async () => {
          const s = (await admin2.stats()) as { grants: number; cache: { pinnedBlocks: number } };
          return s.grants === 0 && s.cache.pinnedBlocks === 0 ? s : undefined;
        },
        5_000,
        "0 grants and 0 pinned blocks on the successor",
      ).catch(async () => admin2.stats());
      const c = (held as { metrics: { counters: Record<string, number> } }).metrics.counters;
      console.log(
        `successor: requests ${c["producer_requests"]}, grants ${c["producer_grants"]}, regrants ${c["producer_regrants"]}, ` +
          `lease expiries ${c["producer_lease_expiries"] ?? 0}, NACKs ${Object.entries(c)
            .filter(([k]) => k.startsWith("producer_nacks_"))
            .map(([k, v]) => `${k.slice(15)} ${v}`)
            .join(" ")}; consumer: ${late.length} requested during the outage`,
      );
      admin2.close();
      // every copy the consumer sent while the address was dead was dropped, not delivered: the
      // successor saw each request once (a copy would have been a regrant of a held pin). The
      // only regrants allowed are retries of requests the successor itself answered after the
      // consumer's ack timeout (a loaded machine: its acks can take longer than 2 s), one per
      // ack timeout counted after it started.
      const lateRetries = ackTimeouts() - timeoutsAtStart;
      expect(
        c["producer_regrants"] ?? 0,
        `regrants ${c["producer_regrants"]}, ack timeouts after the successor started ${lateRetries}`,
      ).toBeLessThanOrEqual(lateRetries);
      // A request the successor NACKed (e.g. NOT_READY while its prepopulation still runs on a
      // loaded machine, EC-CONTRACT 4.2) is retried by the consumer: a new request, not a copy.
      // Every request that was not NACKed is a distinct entry's.
      const nacks = Object.entries(c)
        .filter(([k]) => k.startsWith("producer_nacks_"))
        .reduce((a, [, v]) => a + v, 0);
      expect(
        (c["producer_requests"] ?? 0) - nacks,
        `requests ${c["producer_requests"]}, NACKs ${nacks}`,
      ).toBeLessThanOrEqual(ENTRIES);
      expect(c["producer_grants"]).toBeLessThanOrEqual(ENTRIES);
      expect(held).toMatchObject({ grants: 0, cache: { pinnedBlocks: 0 } });
    } finally {
      d.stop();
      await conn.close();
    }
  }, 120_000);
});
