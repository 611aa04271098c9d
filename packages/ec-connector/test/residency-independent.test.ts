import { expect, it } from "vitest";
import { EcAdminClient } from "../src/index.js";
import type { ProducerProc } from "./helpers/proc.js";
import { spawnProducer, until } from "./helpers/proc.js";
// @ts-expect-error: a plain .mjs written without tapwire (no types on purpose)
import { IndependentSubscriber } from "./independent/subscriber.mjs";

/** The shape of test/independent/subscriber.mjs (it has no types: it is not tapwire code). */
interface Sub {
  incarnation: string;
  seq: number;
  set: Set<string>;
  trusted: boolean;
  stats: Record<string, number>;
  close(): void;
}

/** A small deterministic PRNG (mulberry32), so a failure replays. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}

const BLOCK = 1024;

function args(events: string, replay: string, prepopulate: string): string[] {
  return [
    "--num-blocks",
    "256",
    "--block-bytes",
    String(BLOCK),
    "--events-listen",
    events,
    "--replay-listen",
    replay,
    "--events-heartbeat-ms",
    "200",
    "--prepopulate",
    prepopulate,
    "--log-level",
    "warn",
  ];
}

function diff(a: ReadonlySet<string>, b: ReadonlySet<string>): number {
  let n = 0;
  for (const x of a) if (!b.has(x)) n++;
  for (const x of b) if (!a.has(x)) n++;
  return n;
}

it("EC-CONTRACT 10: a subscriber written from the contract alone reconstructs the resident set of the real bin under 10,000 churn operations, 5% loss, a restart and a late start (0 differences)", {
  timeout: 180_000,
}, async () => {
  const random = rng(22);
  let proc: ProducerProc = await spawnProducer(
    args("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "pre-a:3000,pre-b:100"),
  );
  const ready = () => proc.handle.readyLine.json!;
  const events = String(ready()["events"]);
  const replay = String(ready()["replay"]);
  expect(events).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
  expect(String(ready()["incarnation"])).toMatch(
    /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/,
  );
  let admin = new EcAdminClient(proc.admin);
  const lossy: Sub = new IndependentSubscriber(events, replay, { dropLive: 0.05, dropReply: 0.02, random });
  const subs: Sub[] = [lossy];
  const checkpoints: { round: number; diffs: number[]; seq: number; size: number; ms: number }[] = [];
  try {
    const ops = 10_000;
    const rounds = 20;
    for (let round = 0; round < rounds; round++) {
      if (round === 10) {
        // A restart: kill -9 and a new process on the same events/replay endpoints (new incarnation).
        admin.close();
        await proc.kill("SIGKILL");
        proc = await spawnProducer(args(events, replay, "post-a:2000,post-b:9000"));
        admin = new EcAdminClient(proc.admin);
      }
      if (round === 15) subs.push(new IndependentSubscriber(events, replay, {})); // a late start
      const t0 = performance.now();
      const batch: Promise<unknown>[] = [];
      for (let i = 0; i < ops / rounds; i++) {
        const h = `img-${Math.floor(random() * 700)}`;
        batch.push(
          random() < 0.6
            ? admin.encode(h, 1 + Math.floor(random() * 4 * BLOCK), 30_000)
            : admin.evict(h, 30_000),
        );
        if (batch.length >= 50) await Promise.all(batch.splice(0));
      }
      await Promise.all(batch);
      const truth = await admin.request("residents", {}, 30_000);
      expect(truth["truncated"]).toBe(false);
      const seq = Number(truth["seq"]);
      const want = new Set(truth["mm_hashes"] as string[]);
      const inc = String(proc.handle.readyLine.json!["incarnation"]);
      for (const s of subs) {
        await until(
          () => (s.trusted && s.incarnation === inc && s.seq >= seq ? true : undefined),
          60_000,
          `subscriber caught up at round ${round}`,
        );
      }
      checkpoints.push({
        round,
        diffs: subs.map((s) => diff(s.set, want)),
        seq,
        size: want.size,
        ms: Math.round(performance.now() - t0),
      });
    }
  } finally {
    admin.close();
    for (const s of subs) s.close();
    await proc.kill("SIGTERM");
  }
  for (const c of checkpoints)
    expect(
      c.diffs.every((d) => d === 0),
      JSON.stringify(c),
    ).toBe(true);
  expect(checkpoints).toHaveLength(20);
  expect(checkpoints.some((c) => c.size > 50)).toBe(true); // a real set, not an empty one
  // The loss really happened and was repaired by replays; the late start went through a snapshot.
  expect(lossy.stats["dropped"]).toBeGreaterThan(50);
  expect(lossy.stats["gaps"]).toBeGreaterThan(5);
  expect(lossy.stats["replays"]).toBeGreaterThan(5);
  expect(subs[1]!.stats["snapshots"]).toBeGreaterThanOrEqual(1);
  expect(lossy.stats["malformed"]).toBe(0);
});
