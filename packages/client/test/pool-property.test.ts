// Property (CONTRACT 12.2): a RoundCore over a WorkerPool of three real in-process workers
// (createWorker, each behind its own fault proxy) under random member deaths (connections
// dropped, new ones refused), returns (same session, windows kept: RELEASE for slots that moved),
// blips and new sessions, interleaved with random engine rounds. Each worker's drafter tags its
// drafts (confidence = its tag) and records what it drafted per test round. Checked every round:
// - no slot is sent to, or drafted by, two members in one round;
// - every draft RoundCore hands out came from the member the slot was assigned to when the round
//   was built (slotEpoch), and that member received the slot's entry this round;
// - an entry sent to a member other than the slot's previous one carries RESYNC and the whole
//   ring (CONTRACT 7.5).
import { startFaultProxy } from "@tapwire/testing";
import { EntryFlag, type ReqEntry } from "@tapwire/wire";
import type { DraftBatchEntry, DraftOutput } from "@tapwire/worker";
import { createWorker, NullDrafter } from "@tapwire/worker";
import fc from "fast-check";
import { afterAll, beforeAll, expect, test } from "vitest";
import { RoundCore, type RoundRequest, type RoundResult, WorkerPool } from "../src/index.js";
import { clientOptions, DRAFTER_GEOMETRY, GEO, makeRows, until } from "./helpers.js";

const MEMBERS = 3;
const TAGS = [0.25, 0.5, 0.75];
let testRound = 0;

class TagDrafter extends NullDrafter {
  readonly tag: number;
  /** slot -> test rounds it was drafted in */
  readonly drafted = new Map<number, number[]>();
  constructor(tag: number) {
    super(DRAFTER_GEOMETRY);
    this.tag = tag;
  }
  override draft(batch: readonly DraftBatchEntry[], out: DraftOutput): void {
    super.draft(batch, out);
    for (const e of batch) {
      for (let j = 0; j < e.k; j++) out.confidence[e.index * out.numSpec + j] = this.tag;
      const l = this.drafted.get(e.slot) ?? [];
      l.push(testRound);
      this.drafted.set(e.slot, l);
    }
  }
}

type Worker = Awaited<ReturnType<typeof createWorker>>;
type Proxy = Awaited<ReturnType<typeof startFaultProxy>>;
const workers: Worker[] = [];
const drafters: TagDrafter[] = [];
const proxies: Proxy[] = [];

beforeAll(async () => {
  for (let i = 0; i < MEMBERS; i++) {
    const d = new TagDrafter(TAGS[i]!);
    const w = await createWorker({ drafter: d, listen: ["tcp://127.0.0.1:0"] });
    drafters.push(d);
    workers.push(w);
    proxies.push(await startFaultProxy({ host: "127.0.0.1", port: Number(new URL(w.endpoints[0]!).port) }));
  }
});
afterAll(async () => {
  for (const p of proxies) await p.close();
  for (const w of workers) await w.close();
});

const opArb = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({ op: fc.constant("accept" as const), n: fc.integer({ min: 0, max: 4 }) }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      op: fc.constant("start" as const),
      slot: fc.nat(GEO.maxSlots - 1),
      prompt: fc.integer({ min: 0, max: 20 }),
    }),
  },
  { weight: 1, arbitrary: fc.record({ op: fc.constant("finish" as const), slot: fc.nat(GEO.maxSlots - 1) }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant("die" as const), m: fc.nat(MEMBERS - 1) }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant("revive" as const), m: fc.nat(MEMBERS - 1) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant("blip" as const), m: fc.nat(MEMBERS - 1) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant("newSession" as const) }) },
);

interface Sent {
  member: number;
  entries: ReqEntry[];
}

const seen = { drafts: 0, failovers: 0, movedReleases: 0, resyncMoves: 0 };

test("random deaths, returns and reassignments: one member per slot per round, drafts only from it", async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.array(opArb, { minLength: 1, maxLength: 25 }),
      fc.constantFrom<"stage" | "parts">("stage", "parts"),
      async (ops, rowsMode) => {
        for (const p of proxies) p.setFault(null);
        const endpoints = proxies.map((p) => p.endpoint);
        const base = clientOptions(endpoints[0]!, {
          requestTimeoutMs: 300,
          connectTimeoutMs: 300,
          backoffMs: 1,
          backoffMaxMs: 3,
        });
        const { endpoint: _e, ...rest } = base;
        const pool = new WorkerPool({ ...rest, members: endpoints });
        // what each member's client sent this round (wrapped step: the pool's own members)
        let sent: Sent[] = [];
        for (let i = 0; i < MEMBERS; i++) {
          const c = pool.member(endpoints[i]!)!;
          const step = c.step.bind(c);
          c.step = (call) => {
            const n = call.nEntries ?? call.entries.length;
            sent.push({ member: i, entries: call.entries.slice(0, n).map((e) => ({ ...e })) });
            return step(call);
          };
        }
        // the member each slot was assigned to when the round was built
        let assigned = new Map<number, string | null>();
        const slotEpoch = pool.slotEpoch.bind(pool);
        pool.slotEpoch = (slot, fresh) => {
          const t = slotEpoch(slot, fresh);
          assigned.set(slot, pool.slotMember(slot));
          return t;
        };
        const core = new RoundCore({ client: pool, rowsMode });
        const dead = new Set<number>();
        const lastMember = new Map<number, { member: number; generation: number }>();
        const reqs = new Map<number, { gen: number; anchor: number; sent: number }>();
        let gen = 1;
        reqs.set(0, { gen: gen++, anchor: 11, sent: 0 });
        reqs.set(3, { gen: gen++, anchor: 2, sent: 0 });
        reqs.set(5, { gen: gen++, anchor: 30, sent: 0 });
        const input = (): RoundRequest[] =>
          [...reqs].map(([slot, r]) => {
            const n = r.anchor - r.sent;
            r.sent = r.anchor;
            return {
              slot,
              generation: r.gen,
              anchorPos: r.anchor,
              anchorToken: (r.anchor * 13) % GEO.vocabSize,
              newRows: n > 0 ? makeRows(slot + r.gen * 8, r.anchor - n, n) : null,
            };
          });
        const check = (res: RoundResult): void => {
          const bySlot = new Map<number, number>();
          for (const s of sent) {
            for (const e of s.entries) {
              // a RELEASE to the member a slot moved away from is no draft (CONTRACT 12.2)
              if (e.flags & EntryFlag.RELEASE) continue;
              expect(bySlot.has(e.slot), `slot ${e.slot} sent to two members in round ${testRound}`).toBe(
                false,
              );
              bySlot.set(e.slot, s.member);
              const prev = lastMember.get(e.slot);
              if (prev !== undefined && prev.generation === e.generation && prev.member !== s.member) {
                // moved: RESYNC and the whole ring (CONTRACT 7.5, 12.2)
                expect(e.flags & EntryFlag.RESYNC).toBe(EntryFlag.RESYNC);
                expect(e.nRows).toBe(Math.min(GEO.window, e.anchorPos));
                seen.resyncMoves++;
              }
              lastMember.set(e.slot, { member: s.member, generation: e.generation });
            }
          }
          for (const d of res.drafts) {
            if (d.k === 0) continue;
            seen.drafts++;
            const m = TAGS.indexOf(d.conf[0]!);
            expect(m, `draft of slot ${d.slot} has no member tag`).toBeGreaterThanOrEqual(0);
            expect(assigned.get(d.slot)).toBe(endpoints[m]);
            expect(bySlot.get(d.slot)).toBe(m);
          }
          // the workers' side: no slot drafted by two members in this round
          for (let slot = 0; slot < GEO.maxSlots; slot++) {
            const by = drafters.filter((dr) => dr.drafted.get(slot)?.includes(testRound));
            expect(
              by.length,
              `slot ${slot} drafted by ${by.length} members in round ${testRound}`,
            ).toBeLessThanOrEqual(1);
          }
        };
        try {
          expect(await pool.waitReady(10_000, MEMBERS)).toBe(true);
          let release: number[] = [];
          const round = async (): Promise<void> => {
            testRound++;
            sent = [];
            assigned = new Map();
            const res = await core.round({ requests: input(), release });
            release = [];
            check(res);
          };
          for (const o of ops) {
            if (o.op === "start") {
              reqs.set(o.slot, { gen: gen++, anchor: o.prompt, sent: 0 });
              release = release.filter((s) => s !== o.slot);
            } else if (o.op === "accept") {
              for (const r of reqs.values()) r.anchor += o.n;
            } else if (o.op === "finish") {
              if (reqs.delete(o.slot)) release.push(o.slot);
            } else if (o.op === "die") {
              proxies[o.m]!.setFault({ kind: "refuse" });
              proxies[o.m]!.dropAll();
              dead.add(o.m);
            } else if (o.op === "revive") {
              proxies[o.m]!.setFault(null);
              dead.delete(o.m);
            } else if (o.op === "blip") {
              proxies[o.m]!.dropAll();
            } else {
              pool.newSession("property");
            }
            await round();
          }
          // everyone back: within a bounded number of rounds every live slot drafts again
          for (const p of proxies) p.setFault(null);
          expect(await pool.waitReady(10_000, MEMBERS)).toBe(true);
          let all = false;
          for (let i = 0; i < 20 && !all; i++) {
            testRound++;
            sent = [];
            assigned = new Map();
            const res = await core.round({ requests: input(), release: [] });
            check(res);
            all = res.drafts.every((d) => d.k > 0);
            if (!all) await until(() => pool.ready, 5_000, "a ready member");
          }
          expect(all).toBe(true);
          for (const m of pool.members()) {
            seen.failovers += m.failoversOut;
            seen.movedReleases += m.movedReleases;
          }
        } finally {
          await pool.close();
        }
      },
    ),
    { numRuns: 20 },
  );
  // the runs exercised moves, resyncs and returns with windows kept
  expect(seen.drafts).toBeGreaterThan(0);
  expect(seen.failovers).toBeGreaterThan(0);
  expect(seen.resyncMoves).toBeGreaterThan(0);
  expect(seen.movedReleases).toBeGreaterThan(0);
}, 240_000);
