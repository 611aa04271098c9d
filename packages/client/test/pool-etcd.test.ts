// WorkerPool over etcd discovery (CONTRACT 12.2) with real parts: an etcd child (startEtcd),
// `tapwire-worker --register` children, and @tapwire/discovery's etcdMembers as the pool's
// source. A worker started mid-run is discovered and given new slots; a worker stopped cleanly
// (SIGTERM: revoke, drain, close) leaves the pool without a failed STEP; etcd stopped for a
// while loses no member and changes no round; a SIGKILLed worker's record expires with its lease.
import { etcdMembers } from "@tapwire/discovery";
import { type ChildHandle, type EtcdChild, killAllChildren, spawnBin, startEtcd } from "@tapwire/testing";
import { afterAll, afterEach, beforeAll, describe, expect, test } from "vitest";
import { RoundCore, type RoundRequest, WorkerPool } from "../src/index.js";
import { clientOptions, DRAFTER_ID, GEO, hex, MARKOV_ID, makeRows, sleep } from "./helpers.js";
import { WORKER_BIN } from "./worker-bin.js";

const TTL = 3;
let etcd: EtcdChild;
const open: { close(): unknown }[] = [];
beforeAll(async () => {
  etcd = await startEtcd();
});
afterAll(async () => {
  await etcd?.close();
});
afterEach(async () => {
  for (const o of open.splice(0).reverse()) await o.close();
  await killAllChildren();
  await etcd.start();
});

let n = 0;
const prefix = () => `/tapwire-pool-${process.pid}-${++n}/`;

async function spawnWorker(p: string): Promise<{ child: ChildHandle; endpoint: string }> {
  const child = await spawnBin(WORKER_BIN, [
    "--drafter",
    "null",
    "--listen",
    "tcp://127.0.0.1:0",
    "--window",
    String(GEO.window),
    "--num-spec",
    String(GEO.numSpec),
    "--vocab",
    String(GEO.vocabSize),
    "--num-taps",
    String(GEO.numTaps),
    "--hidden",
    String(GEO.hidden),
    "--drafter-identity",
    hex(DRAFTER_ID),
    "--markov-identity",
    hex(MARKOV_ID),
    "--log-level",
    "info",
    "--register",
    etcd.endpoint,
    "--register-prefix",
    p,
    "--register-ttl",
    String(TTL),
    "--register-drain-ms",
    "500",
  ]);
  await child.waitFor((l) => String(l.json?.msg ?? "").includes("registered"), 15_000);
  const eps = child.readyLine.json?.endpoints as string[];
  return { child, endpoint: eps[0]! };
}

function poolOn(p: string): WorkerPool {
  const src = etcdMembers({ etcd: etcd.endpoint, prefix: p, backoffMs: 50, backoffMaxMs: 500 });
  const { endpoint: _e, ...rest } = clientOptions("tcp://127.0.0.1:1", {
    requestTimeoutMs: 1500,
    connectTimeoutMs: 1000,
    backoffMs: 50,
    backoffMaxMs: 400,
  });
  const pool = new WorkerPool({ ...rest, members: src });
  open.push(src, pool);
  return pool;
}

class Engine {
  readonly reqs = new Map<number, { gen: number; anchor: number; sent: number }>();
  gen = 1;
  start(slot: number): void {
    this.reqs.set(slot, { gen: this.gen++, anchor: 5 + slot, sent: 0 });
  }
  input(): RoundRequest[] {
    return [...this.reqs].map(([slot, r]) => {
      const k = r.anchor - r.sent;
      r.sent = r.anchor;
      return {
        slot,
        generation: r.gen,
        anchorPos: r.anchor,
        anchorToken: (r.anchor * 13) % GEO.vocabSize,
        newRows: k > 0 ? makeRows(slot, r.anchor - k, k) : null,
      };
    });
  }
  advance(): void {
    for (const r of this.reqs.values()) r.anchor += 1;
  }
}

describe("WorkerPool with etcd discovery and tapwire-worker --register", () => {
  test("a worker started mid-run gets new slots; a clean stop leaves without a failed STEP", async () => {
    const p = prefix();
    const [w1, w2] = await Promise.all([spawnWorker(p), spawnWorker(p)]);
    const pool = poolOn(p);
    expect(await pool.waitReady(15_000, 2)).toBe(true);
    const core = new RoundCore({ client: pool });
    const eng = new Engine();
    for (let s = 0; s < 4; s++) eng.start(s);
    const round = async () => {
      const res = await core.round({ requests: eng.input() });
      eng.advance();
      return res;
    };
    for (let i = 0; i < 3; i++) expect((await round()).drafts.every((d) => d.k > 0)).toBe(true);

    // a third worker registers: discovered (a watch event, not a poll), then new slots go to it
    const w3 = await spawnWorker(p);
    const t0 = Date.now();
    while (!pool.members().some((m) => m.endpoint === w3.endpoint && m.state === "READY")) {
      if (Date.now() - t0 > TTL * 1000 + 10_000) throw new Error("third worker not discovered");
      await round();
      await sleep(10);
    }
    const discoveredMs = Date.now() - t0;
    for (let s = 4; s < 6; s++) eng.start(s);
    for (let i = 0; i < 2; i++) expect((await round()).drafts.every((d) => d.k > 0)).toBe(true);
    expect(pool.slotMember(4)).toBe(w3.endpoint);
    expect(pool.slotMember(5)).toBe(w3.endpoint);

    // a clean stop of w1: revoke, drain, close; rounds keep running meanwhile
    const failedBefore = pool.registry.snapshot().counters.member_steps_failed;
    const w1Slots = [...eng.reqs.keys()].filter((s) => pool.slotMember(s) === w1.endpoint);
    expect(w1Slots.length).toBeGreaterThan(0);
    w1.child.child.kill("SIGTERM");
    const exited = w1.child.exited;
    let done = false;
    void exited.then(() => {
      done = true;
    });
    let rounds = 0;
    while (!done && rounds < 5_000) {
      const res = await round();
      rounds++;
      for (const d of res.drafts)
        expect(d.reason === "ok" || d.reason === "partial_window" || d.k === 0).toBe(true);
      await sleep(5);
    }
    expect(done).toBe(true);
    for (let i = 0; i < 2; i++) expect((await round()).drafts.every((d) => d.k > 0)).toBe(true);
    expect(pool.registry.snapshot().counters.member_steps_failed).toBe(failedBefore);
    expect(pool.members().map((m) => m.endpoint)).not.toContain(w1.endpoint);
    for (const s of w1Slots) expect([w2.endpoint, w3.endpoint]).toContain(pool.slotMember(s));
    console.log(
      `pool etcd: third worker discovered in ${discoveredMs} ms (TTL ${TTL} s); clean stop over ${rounds} rounds, 0 failed STEPs`,
    );
  });

  test("etcd stopped: no member lost, every round drafts; a SIGKILLed worker's record expires", async () => {
    const p = prefix();
    const [w1, w2] = await Promise.all([spawnWorker(p), spawnWorker(p)]);
    const pool = poolOn(p);
    expect(await pool.waitReady(15_000, 2)).toBe(true);
    const core = new RoundCore({ client: pool });
    const eng = new Engine();
    for (let s = 0; s < 4; s++) eng.start(s);
    await etcd.stop();
    const t0 = Date.now();
    let rounds = 0;
    while (Date.now() - t0 < 3_000) {
      const res = await core.round({ requests: eng.input() });
      eng.advance();
      rounds++;
      expect(res.drafts.every((d) => d.k > 0)).toBe(true);
      expect(pool.members().length).toBe(2);
      await sleep(10);
    }
    await etcd.start();
    // the workers' leases survived (kept alive again), the pool still has both
    await sleep(500);
    expect(
      pool
        .members()
        .map((m) => m.endpoint)
        .sort(),
    ).toEqual([w1.endpoint, w2.endpoint].sort());
    // SIGKILL w2: its slots fail over at once; its record disappears with its lease
    await w2.child.kill("SIGKILL");
    const t1 = Date.now();
    while (pool.members().some((m) => m.endpoint === w2.endpoint)) {
      if (Date.now() - t1 > TTL * 3000 + 10_000) throw new Error("record of the killed worker never expired");
      await core.round({ requests: eng.input() });
      eng.advance();
      await sleep(20);
    }
    const res = await core.round({ requests: eng.input() });
    expect(res.drafts.every((d) => d.k > 0)).toBe(true);
    console.log(
      `pool etcd: ${rounds} rounds with etcd down, all drafted; killed worker drained after ${Date.now() - t1} ms`,
    );
  });
});
