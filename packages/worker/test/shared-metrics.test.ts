// CONTRACT 12.1 metrics on the bin's /metrics: sessions held/admitted/dropped, batch histograms,
// per-client counters labelled by client_name (escaped, bounded), and promtool accepts the text.
import { execFileSync } from "node:child_process";
import { FrameStatus } from "@tapwire/wire";
import { afterEach, describe, expect, test } from "vitest";
import { entry, helloFor, nullDrafter, Raw, Sess } from "./helpers.js";
import { children, spawnWorker } from "./spawn.js";

afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null) c.kill("SIGKILL");
});

describe("CONTRACT 12.1: a shared worker's metrics", () => {
  test("per-client rounds and entries, session and batch metrics, valid exposition", async () => {
    const w = await spawnWorker([
      "--drafter",
      "null",
      "--listen",
      "tcp://127.0.0.1:0",
      "--max-sessions",
      "2",
      "--metrics-listen",
      "tcp://127.0.0.1:0",
      "--num-taps",
      "2",
      "--hidden",
      "4",
      "--window",
      "8",
      "--num-spec",
      "4",
      "--vocab",
      "256",
      "--log-level",
      "warn",
    ]);
    const d = nullDrafter({ drafterIdentity: new Uint8Array(32), markovIdentity: new Uint8Array(32) });
    const ep = (w.listening.endpoints as string[])[0]!;
    const a = new Sess(await new Raw(ep).connect(), 5, d, helloFor(d, { clientName: 'eng"a' }));
    const b = new Sess(await new Raw(ep).connect(), 6, d, helloFor(d, { clientName: "eng-b" }));
    expect((await a.doHello()).status).toBe(FrameStatus.OK);
    expect((await b.doHello()).status).toBe(FrameStatus.OK);
    for (let i = 0; i < 3; i++) await a.step([entry({ slot: 0 }), entry({ slot: 1 })]);
    await b.step([entry({ slot: 0 })]);
    const text = await (await fetch(String(w.listening.metrics))).text();
    expect(text).toContain('tapwire_worker_client_rounds_total{client="eng\\"a"} 3');
    expect(text).toContain('tapwire_worker_client_entries_total{client="eng\\"a"} 6');
    expect(text).toContain('tapwire_worker_client_rounds_total{client="eng-b"} 1');
    expect(text).toContain("tapwire_worker_sessions_held 2");
    expect(text).toContain("tapwire_worker_sessions_admitted_total 2");
    expect(text).toContain("tapwire_worker_batch_steps_count 4");
    expect(text).toContain("tapwire_worker_batch_entries_sum 7");
    expect(text).toContain("tapwire_worker_batch_queue_seconds_count 4");
    expect(text).toContain("tapwire_worker_sessions_dropped_idle_total 0");
    execFileSync("promtool", ["check", "metrics"], { input: text });
    a.raw.close();
    b.raw.close();
  });
});
