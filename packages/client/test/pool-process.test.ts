// WorkerPool over several real `tapwire-worker` children on real sockets (CONTRACT 12.2): a
// SIGKILL of one member mid-run moves its slots to the others within 2 rounds of the first failed
// STEP; a stopped (SIGSTOP) member costs its own entries one timeout while the other members'
// entries get drafts in that same round (one STEP per member, concurrently, per-STEP outcomes);
// a member whose HELLO is refused with a fatal status leaves the pool, the pool stays enabled.
import { type ChildHandle, killAllChildren, spawnBin } from "@tapwire/testing";
import { afterEach, describe, expect, test } from "vitest";
import {
  type MemberSource,
  type PoolMemberInfo,
  RoundCore,
  type RoundRequest,
  type RoundResult,
  WorkerPool,
} from "../src/index.js";
import {
  captureLogger,
  clientOptions,
  DRAFTER_ID,
  GEO,
  hex,
  identity,
  MARKOV_ID,
  makeRows,
} from "./helpers.js";
import { WORKER_BIN } from "./worker-bin.js";

const open: { close(): unknown }[] = [];
afterEach(async () => {
  for (const o of open.splice(0).reverse()) await o.close();
  await killAllChildren();
});

async function spawnWorker(drafter = DRAFTER_ID): Promise<{ child: ChildHandle; endpoint: string }> {
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
    hex(drafter),
    "--markov-identity",
    hex(MARKOV_ID),
    "--log-level",
    "warn",
  ]);
  const eps = child.readyLine.json?.endpoints as string[];
  return { child, endpoint: eps[0]! };
}

/** A MemberSource the test drives by hand (what a discovery watch delivers). */
class ManualSource implements MemberSource {
  readonly dynamic = true;
  #on: ((m: readonly PoolMemberInfo[]) => void) | null = null;
  #list: readonly PoolMemberInfo[] = [];
  subscribe(on: (m: readonly PoolMemberInfo[]) => void): () => void {
    this.#on = on;
    on(this.#list);
    return () => {
      this.#on = null;
    };
  }
  set(list: readonly PoolMemberInfo[]): void {
    this.#list = list;
    this.#on?.(list);
  }
}

function pool(endpoints: string[] | MemberSource, requestTimeoutMs = 1500, extra = {}): WorkerPool {
  const { endpoint: _e, ...rest } = clientOptions("tcp://127.0.0.1:1", {
    requestTimeoutMs,
    connectTimeoutMs: 1000,
    backoffMs: 50,
    backoffMaxMs: 400,
    ...extra,
  });
  const p = new WorkerPool({ ...rest, members: endpoints });
  open.push(p);
  return p;
}

/** Every slot runs a request that accepts 2 tokens per round. */
class Engine {
  readonly reqs = new Map<number, { gen: number; anchor: number; sent: number }>();
  constructor(slots: number) {
    for (let s = 0; s < slots; s++) this.reqs.set(s, { gen: s + 1, anchor: 5 + s, sent: 0 });
  }
  input(): RoundRequest[] {
    return [...this.reqs].map(([slot, r]) => {
      const n = r.anchor - r.sent;
      r.sent = r.anchor;
      return {
        slot,
        generation: r.gen,
        anchorPos: r.anchor,
        anchorToken: (r.anchor * 13) % GEO.vocabSize,
        newRows: n > 0 ? makeRows(slot, r.anchor - n, n) : null,
      };
    });
  }
  advance(): void {
    for (const r of this.reqs.values()) r.anchor += 2;
  }
}

async function rounds(
  core: RoundCore,
  eng: Engine,
  n: number,
  each?: (res: RoundResult, i: number) => void,
): Promise<void> {
  for (let i = 0; i < n; i++) {
    const res = await core.round({ requests: eng.input() });
    each?.(res, i);
    eng.advance();
  }
}

describe("WorkerPool over tapwire-worker children", () => {
  test("SIGKILL of one of three: its slots draft at another member within 2 rounds of the first failed STEP", async () => {
    const ws = await Promise.all([spawnWorker(), spawnWorker(), spawnWorker()]);
    const p = pool(ws.map((w) => w.endpoint));
    expect(await p.waitReady(15_000, 3)).toBe(true);
    const core = new RoundCore({ client: p });
    const eng = new Engine(GEO.maxSlots);
    await rounds(core, eng, 5, (res) => expect(res.drafts.every((d) => d.k > 0)).toBe(true));
    // fewest first: 8 slots over 3 members
    const counts = p.members().map((m) => m.assigned);
    expect(Math.max(...counts) - Math.min(...counts)).toBeLessThanOrEqual(1);
    const victim = ws[1]!;
    const victimSlots = [...eng.reqs.keys()].filter((s) => p.slotMember(s) === victim.endpoint);
    expect(victimSlots.length).toBeGreaterThan(0);
    await victim.child.kill("SIGKILL");
    let firstFail = -1;
    const back = new Map<number, number>();
    const wall: number[] = [];
    for (let i = 0; i < 6; i++) {
      const t0 = performance.now();
      const res = await core.round({ requests: eng.input() });
      wall.push(performance.now() - t0);
      eng.advance();
      for (const d of res.drafts) {
        const wasVictim = victimSlots.includes(d.slot);
        if (!wasVictim) {
          // the other members' slots never lose a round
          expect(d.k, `slot ${d.slot} round ${i}`).toBeGreaterThan(0);
          continue;
        }
        if (d.k === 0 && firstFail < 0) {
          expect(["transport_error", "timeout"]).toContain(d.reason);
          firstFail = i;
        }
        if (d.k > 0 && firstFail >= 0 && !back.has(d.slot)) back.set(d.slot, i);
      }
    }
    expect(firstFail).toBe(0);
    for (const s of victimSlots) {
      expect(back.get(s), `slot ${s} drafts again`).toBeDefined();
      expect(back.get(s)! - firstFail).toBeLessThanOrEqual(2);
      expect(p.slotMember(s)).not.toBe(victim.endpoint);
    }
    const gaps = p.failoverRounds();
    expect(gaps.length).toBe(victimSlots.length);
    expect(Math.max(...gaps)).toBeLessThanOrEqual(2);
    const dead = p.members().find((m) => m.endpoint === victim.endpoint)!;
    expect(dead.stepsFailed).toBeGreaterThan(0);
    console.log(
      `pool SIGKILL: failover rounds ${JSON.stringify(gaps)}, round wall ms ${wall.map((w) => w.toFixed(1)).join(" ")}`,
    );
  });

  test("a stopped member times out alone: the others' entries draft in the same round", async () => {
    const ws = await Promise.all([spawnWorker(), spawnWorker()]);
    const p = pool(
      ws.map((w) => w.endpoint),
      400,
    );
    expect(await p.waitReady(15_000, 2)).toBe(true);
    const core = new RoundCore({ client: p });
    const eng = new Engine(4);
    await rounds(core, eng, 3, (res) => expect(res.drafts.every((d) => d.k > 0)).toBe(true));
    const stopped = ws[0]!;
    const its = [...eng.reqs.keys()].filter((s) => p.slotMember(s) === stopped.endpoint);
    expect(its.length).toBe(2);
    process.kill(stopped.child.pid, "SIGSTOP");
    try {
      const res = await core.round({ requests: eng.input() });
      eng.advance();
      expect(res.outcome).toBe("ok");
      for (const d of res.drafts) {
        if (its.includes(d.slot)) expect(d.reason).toBe("timeout");
        else expect(d.k).toBeGreaterThan(0);
      }
      // the next round moves them (the stopped member's connection was dropped)
      const res2 = await core.round({ requests: eng.input() });
      eng.advance();
      for (const d of res2.drafts) expect(d.k, `slot ${d.slot}`).toBeGreaterThan(0);
      expect(res2.resynced).toBe(2);
    } finally {
      process.kill(stopped.child.pid, "SIGCONT");
    }
  });

  test("a member refused with a fatal status leaves the pool; the pool serves on the others", async () => {
    const good = await spawnWorker();
    const bad = await spawnWorker(identity(99));
    const p = pool([good.endpoint, bad.endpoint]);
    expect(await p.waitReady(15_000, 1)).toBe(true);
    const core = new RoundCore({ client: p });
    const eng = new Engine(4);
    for (let i = 0; i < 50 && p.members().length > 1; i++) {
      await rounds(core, eng, 1);
      await new Promise((r) => setTimeout(r, 20));
    }
    expect(p.members().map((m) => m.endpoint)).toEqual([good.endpoint]);
    expect(p.disabled).toBe(false);
    await rounds(core, eng, 2, (res) => expect(res.drafts.every((d) => d.k > 0)).toBe(true));
  });

  test("a member its source stops listing is drained: slots move at the next round, no failed STEP", async () => {
    const ws = await Promise.all([spawnWorker(), spawnWorker()]);
    const src = new ManualSource();
    const log = captureLogger();
    const p = pool(src, 1500, { logger: log.logger });
    const compat = { drafterIdentity: hex(DRAFTER_ID), markovIdentity: hex(MARKOV_ID), window: GEO.window };
    src.set([
      { endpoint: ws[0]!.endpoint, incarnation: "a", compat },
      { endpoint: ws[1]!.endpoint, incarnation: "b", compat },
      // another model's worker: ignored, logged once
      { endpoint: "tcp://127.0.0.1:9", incarnation: "c", compat: { ...compat, window: GEO.window * 2 } },
    ]);
    expect(await p.waitReady(15_000, 2)).toBe(true);
    expect(p.members().length).toBe(2);
    const core = new RoundCore({ client: p });
    const eng = new Engine(4);
    await rounds(core, eng, 3, (res) => expect(res.drafts.every((d) => d.k > 0)).toBe(true));
    const leaving = ws[0]!.endpoint;
    expect([...eng.reqs.keys()].some((s) => p.slotMember(s) === leaving)).toBe(true);
    src.set([
      { endpoint: ws[1]!.endpoint, incarnation: "b", compat },
      { endpoint: "tcp://127.0.0.1:9", incarnation: "c", compat: { ...compat, window: GEO.window * 2 } },
    ]);
    await rounds(core, eng, 3, (res) => expect(res.drafts.every((d) => d.k > 0)).toBe(true));
    for (const s of eng.reqs.keys()) expect(p.slotMember(s)).toBe(ws[1]!.endpoint);
    expect(p.members().map((m) => m.endpoint)).toEqual([ws[1]!.endpoint]);
    expect(p.registry.snapshot().counters.member_steps_failed).toBe(0);
    const ignored = log.lines.filter((l) => String(l.msg).includes("ignored"));
    expect(ignored.length).toBe(1);
    expect(String(ignored[0]!.msg)).toContain("window");
  });
});
