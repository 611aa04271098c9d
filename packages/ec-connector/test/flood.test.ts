import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { Registry } from "@tapwire/stats";
import { isAlive, rssOf, watchRss } from "@tapwire/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ConsumerConnector, EcAdminClient } from "../src/index.js";
import { Driver } from "./helpers/drive.js";
import type { ProducerProc } from "./helpers/proc.js";
import { spawnProducer, until } from "./helpers/proc.js";

// Issue 19 item 2 (EC-CONTRACT 9): a flood of well-formed XferReqs from many DEALERs in another
// process, half of them never reading their replies, ended abruptly by SIGKILL of that process.
// The producer's RSS stays within 64 MiB of its own idle RSS (VmRSS of the child), it never aborts
// (libzmq 4.3.5 `!_io_error (stream_engine_base.cpp:310)` when its own PING timer fired on a
// connection stopped at its receive high-water mark and then reset), and a legitimate consumer is
// served during and after every flood.
const FLOOD = fileURLToPath(new URL("./helpers/flood-child.mjs", import.meta.url));
const MiB = 1024 * 1024;
const BB = 4096;
const ENTRY = 4 * BB;
const ENTRIES = 40;
/** Requests the producer handles per flood before it is killed: the condition, not a duration. */
const PER_FLOOD = 30_000;

interface Flood {
  kill(): Promise<void>;
}

/** Starts the flooding child and resolves once every DEALER has sent. */
async function flood(control: string, compat: string, dealers: number): Promise<Flood> {
  const child = spawn(process.execPath, [FLOOD, control, compat, String(dealers), "e1,e2,e3,absent"], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on("data", (b: Buffer) => {
      if (b.toString().includes('"flooding"')) resolve();
    });
    void exited.then(() => reject(new Error("flood child exited before flooding")));
  });
  return {
    async kill() {
      child.kill("SIGKILL"); // abruptly: every connection reset at once
      await exited;
    },
  };
}

describe("tapwire-ec-producer under a flood of XferReqs (issue 19, EC-CONTRACT 9)", () => {
  let p: ProducerProc;
  let admin: EcAdminClient;
  let legit: ConsumerConnector;
  let driver: Driver;
  let n = 0;

  beforeAll(async () => {
    p = await spawnProducer([
      "--num-blocks",
      "256",
      "--block-bytes",
      String(BB),
      "--prepopulate",
      Array.from({ length: ENTRIES }, (_, i) => `e${i}:${ENTRY}`).join(","),
      "--pin-lease-ms",
      "2000",
      "--log-level",
      "error",
    ]);
    admin = new EcAdminClient(p.admin);
    legit = await ConsumerConnector.create({
      numBlocks: 64,
      blockBytes: BB,
      compatibility: p.compatibilityHash,
      registry: new Registry(),
    });
    driver = new Driver(legit).start();
  });
  afterAll(async () => {
    driver.stop();
    await legit.close();
    admin.close();
    await p.kill();
  });

  async function served(): Promise<void> {
    const h = `e${10 + (n++ % (ENTRIES - 10))}`;
    expect(await driver.fetch(h, p.control, ENTRY, 60_000)).toBe("loaded");
    legit.free(h);
  }

  async function counter(name: string): Promise<number> {
    const s = (await admin.stats()) as { metrics: { counters: Record<string, number> } };
    return s.metrics.counters[name] ?? 0;
  }

  async function flooded(dealers: number, requests: number): Promise<void> {
    const before = await counter("producer_requests");
    const f = await flood(p.control, p.compatibilityHash, dealers);
    try {
      await until(
        async () => ((await counter("producer_requests")) - before >= requests ? true : undefined),
        120_000,
        `${requests} flooded requests`,
      );
      await served(); // during
    } finally {
      await f.kill(); // abruptly: every connection of the flood reset at once
    }
    expect(isAlive(p.child.pid!), `after the flood of ${dealers}`).toBe(true);
    await served(); // after: the abrupt end left the producer serving
  }

  it("64 then 256 DEALERs, half never reading: RSS within 64 MiB of the producer's idle RSS", async () => {
    for (let i = 0; i < 5; i++) await served();
    const idle = rssOf(p.child.pid!);
    const rss = watchRss(p.child.pid!);
    await flooded(64, PER_FLOOD);
    const after64 = rss.peakBytes;
    await flooded(256, PER_FLOOD);
    const peak = rss.stop().peakBytes;
    console.log(
      `producer flood: RSS idle ${(idle / MiB).toFixed(1)} MiB; peak under 64 DEALERs +${((after64 - idle) / MiB).toFixed(1)} MiB, ` +
        `under 256 +${((peak - idle) / MiB).toFixed(1)} MiB`,
    );
    expect(peak - idle).toBeLessThan(64 * MiB);
  }, 300_000);

  it("floods of 256 DEALERs ended by SIGKILL, again and again: the producer never aborts and keeps serving", async () => {
    for (let i = 0; i < 3; i++) await flooded(256, PER_FLOOD / 3);
    expect(p.child.exitCode).toBeNull();
    expect(p.child.signalCode).toBeNull();
    expect(await counter("producer_requests")).toBeGreaterThan(PER_FLOOD);
  }, 300_000);
});
