// The pool's round path (CONTRACT 12.2, issue 21 "pool round"): over two real in-process workers
// on real tcp sockets (each behind a fault proxy),
// - rows staged in the pool's sendBuffer (and rows given as parts) reach each slot's member byte
//   for byte while the round's shape changes every round (the pool's per-entry-position views of
//   sendBuffer are made again when an entry moves), and the round's result is the pool's own,
//   reused object (buffers sized once);
// - each member's smoothed RTT is fed by the RTT its client measured for each answered STEP
//   (gain 1/8) and not by a STEP that timed out;
// - an entry with no ready member gets the same `not_ready` outcome a RemoteDraftClient returns
//   (one owner: src/outcomes.ts).
import { startFaultProxy } from "@tapwire/testing";
import { EntryFlag, type ReqEntry } from "@tapwire/wire";
import { createWorker, NullDrafter } from "@tapwire/worker";
import { afterEach, beforeEach, describe, expect, test } from "vitest";
import {
  RemoteDraftClient,
  RoundCore,
  type RoundRequest,
  type StepOutcome,
  WorkerPool,
} from "../src/index.js";
import { NOT_READY } from "../src/outcomes.js";
import { clientOptions, DRAFTER_GEOMETRY, GEO, makeRows } from "./helpers.js";

type Worker = Awaited<ReturnType<typeof createWorker>>;
type Proxy = Awaited<ReturnType<typeof startFaultProxy>>;
let workers: Worker[] = [];
let proxies: Proxy[] = [];

// two fresh workers per test (a worker's debugWindow shows one session's windows)
beforeEach(async () => {
  workers = [];
  proxies = [];
  for (let i = 0; i < 2; i++) {
    const drafter = new NullDrafter(DRAFTER_GEOMETRY);
    const w = await createWorker({ drafter, listen: ["tcp://127.0.0.1:0"] });
    workers.push(w);
    proxies.push(await startFaultProxy({ host: "127.0.0.1", port: Number(new URL(w.endpoints[0]!).port) }));
  }
});
afterEach(async () => {
  for (const p of proxies) await p.close();
  for (const w of workers) await w.close();
});

function newPool(requestTimeoutMs = 2000): WorkerPool {
  const { endpoint: _e, ...rest } = clientOptions("tcp://127.0.0.1:1", {
    requestTimeoutMs,
    backoffMs: 5,
    backoffMaxMs: 20,
  });
  return new WorkerPool({ ...rest, members: proxies.map((p) => p.endpoint) });
}

// the worker behind a pool member's endpoint
function workerOf(pool: WorkerPool, slot: number): Worker {
  const ep = pool.slotMember(slot);
  const i = proxies.findIndex((p) => p.endpoint === ep);
  expect(i, `slot ${slot} has a member`).toBeGreaterThanOrEqual(0);
  return workers[i]!;
}

// a small deterministic PRNG (the shapes are the same in every run)
function prng(seed: number): () => number {
  let t = seed >>> 0;
  return () => {
    t = (t * 1664525 + 1013904223) >>> 0;
    return t / 4294967296;
  };
}

describe("WorkerPool round path (CONTRACT 12.2)", () => {
  for (const rowsMode of ["stage", "parts"] as const) {
    test(`${rowsMode} rows reach each slot's member byte for byte while the round's shape changes`, async () => {
      for (const p of proxies) p.setFault(null);
      const pool = newPool();
      try {
        expect(await pool.waitReady(10_000, 2)).toBe(true);
        const core = new RoundCore({ client: pool, rowsMode });
        const rnd = prng(rowsMode === "stage" ? 7 : 11);
        const anchor = new Map<number, number>();
        let firstOutcome: unknown = null;
        const step = pool.step.bind(pool);
        pool.step = async (call) => {
          const out = await step(call);
          firstOutcome ??= out;
          // the pool's own object, reused round after round
          expect(out).toBe(firstOutcome);
          return out;
        };
        for (let round = 0; round < 40; round++) {
          // a different set of slots and row counts every round: entry positions and their
          // offsets in the send buffer move
          const reqs: RoundRequest[] = [];
          for (let slot = 0; slot < GEO.maxSlots; slot++) {
            if (rnd() < 0.35) continue;
            const before = anchor.get(slot) ?? 0;
            const n = 1 + Math.floor(rnd() * 3);
            anchor.set(slot, before + n);
            reqs.push({
              slot,
              generation: slot + 1,
              anchorPos: before + n,
              anchorToken: (slot * 7 + before) % GEO.vocabSize,
              newRows: makeRows(slot, before, n),
            });
          }
          const res = await core.round({ requests: reqs });
          expect(res.outcome).toBe("ok");
          for (const r of reqs) {
            const end = r.anchorPos;
            const held = Math.min(GEO.window, end);
            const win = workerOf(pool, r.slot).debugWindow(r.slot);
            expect(win.known, `slot ${r.slot}`).toBe(true);
            expect(win.firstPos + win.nRows, `slot ${r.slot} window end`).toBe(end);
            expect(win.nRows, `slot ${r.slot} rows held`).toBe(held);
            expect(
              Buffer.from(win.rows).equals(Buffer.from(makeRows(r.slot, end - held, held))),
              `slot ${r.slot} round ${round}: the member holds the rows sent`,
            ).toBe(true);
          }
        }
        // both members served slots (the rows were split, not all sent to one)
        expect(pool.members().every((m) => m.entries > 0)).toBe(true);
      } finally {
        await pool.close();
      }
    });
  }

  test("each member's smoothed RTT follows its answered STEPs' measured RTT (gain 1/8), not a timeout", async () => {
    for (const p of proxies) p.setFault(null);
    const pool = newPool(300);
    try {
      expect(await pool.waitReady(10_000, 2)).toBe(true);
      expect(pool.members().map((m) => m.rttUs)).toEqual([0, 0]);
      // what each member's client measured, per STEP
      const measured = new Map<string, StepOutcome[]>();
      for (const p of proxies) {
        const c = pool.member(p.endpoint)!;
        const step = c.step.bind(c);
        c.step = async (call) => {
          const o = await step(call);
          const l = measured.get(p.endpoint) ?? [];
          l.push(o);
          measured.set(p.endpoint, l);
          return o;
        };
      }
      const expected = (ep: string): number => {
        let s = 0;
        for (const o of measured.get(ep) ?? []) {
          if (!o.ok) continue;
          s = s === 0 ? o.rttUs : s + (o.rttUs - s) / 8;
        }
        return s;
      };
      const core = new RoundCore({ client: pool });
      const reqs = (k: number): RoundRequest[] =>
        [0, 1, 2, 3].map((slot) => ({
          slot,
          generation: slot + 1,
          anchorPos: k + 1,
          anchorToken: 1,
          newRows: makeRows(slot, k, 1),
        }));
      // the second member's link is slower: its estimate must be its own
      proxies[1]!.setFault({ kind: "latency", ms: 20 });
      for (let k = 0; k < 6; k++) expect((await core.round({ requests: reqs(k) })).outcome).toBe("ok");
      for (const m of pool.members()) {
        expect((measured.get(m.endpoint) ?? []).length).toBeGreaterThan(0);
        expect(m.rttUs).toBeGreaterThan(0);
        expect(m.rttUs).toBeCloseTo(expected(m.endpoint), 6);
      }
      const [fast, slow] = pool.members();
      expect(slow!.rttUs).toBeGreaterThan(fast!.rttUs); // 20 ms injected on one side only
      // a STEP that times out does not feed the estimate (Karn's rule)
      const before = slow!.rttUs;
      const nBefore = measured.get(slow!.endpoint)!.length;
      proxies[1]!.setFault({ kind: "stall" });
      const res = await core.round({ requests: reqs(6) });
      const last = measured.get(slow!.endpoint)!;
      expect(last.length).toBe(nBefore + 1);
      expect(last.at(-1)!.reason).toBe("timeout");
      expect(res.drafts.some((d) => d.reason === "timeout")).toBe(true);
      expect(pool.members().find((m) => m.endpoint === slow!.endpoint)!.rttUs).toBe(before);
    } finally {
      for (const p of proxies) p.setFault(null);
      await pool.close();
    }
  });

  test("one member carrying every entry: its reply is the round's as it is; two: one merged reply, reused", async () => {
    const { endpoint: _e, ...rest } = clientOptions("tcp://127.0.0.1:1");
    const drafts = new Map<string, (number | string)[][]>([
      ["one", []],
      ["two", []],
    ]);
    // one pool after the other (a worker holds one session at a time)
    for (const which of ["one", "two"] as const) {
      const pool = which === "one" ? new WorkerPool({ ...rest, members: [proxies[0]!.endpoint] }) : newPool();
      try {
        expect(await pool.waitReady(10_000, which === "one" ? 1 : 2)).toBe(true);
        const replies: unknown[] = [];
        for (const m of pool.members()) {
          const c = pool.member(m.endpoint)!;
          const step = c.step.bind(c);
          c.step = async (call) => {
            const o = await step(call);
            replies.push(o.reply);
            return o;
          };
        }
        const core = new RoundCore({ client: pool });
        const step = pool.step.bind(pool);
        const outs: StepOutcome[] = [];
        pool.step = async (call) => {
          replies.length = 0;
          const o = await step(call);
          outs.push(o);
          if (which === "one")
            expect(o.reply).toBe(replies[0]); // the member's views, not a copy
          else expect(replies).not.toContain(o.reply); // merged: neither member's
          return o;
        };
        for (let k = 0; k < 4; k++) {
          const res = await core.round({
            requests: [0, 1, 2, 3].map((slot) => ({
              slot,
              generation: slot + 1,
              anchorPos: k + 1,
              anchorToken: (slot + k) % GEO.vocabSize,
              newRows: makeRows(slot, k, 1),
            })),
          });
          expect(res.outcome).toBe("ok");
          for (const d of res.drafts) {
            expect(d.k, `slot ${d.slot}`).toBeGreaterThan(0);
            drafts
              .get(which)!
              .push([d.slot, d.reason, ...d.ids.subarray(0, d.k), ...d.conf.subarray(0, d.k)]);
          }
        }
        if (which === "two") for (const o of outs) expect(o.reply).toBe(outs[0]!.reply);
      } finally {
        await pool.close();
      }
    }
    // the same rounds drafted the same way through the member's reply and through the merge
    expect(drafts.get("one")!.length).toBe(16);
    expect(drafts.get("one")).toEqual(drafts.get("two"));
  });

  test("an entry with no ready member gets the not_ready outcome a RemoteDraftClient returns (one owner)", async () => {
    const { endpoint: _e, ...rest } = clientOptions("tcp://127.0.0.1:1");
    // nothing listens at port 1: the member never becomes ready
    const pool = new WorkerPool({ ...rest, members: ["tcp://127.0.0.1:1"] });
    const client = new RemoteDraftClient(clientOptions("tcp://127.0.0.1:1"));
    try {
      const en: ReqEntry = {
        slot: 2,
        generation: 1,
        anchorPos: 1,
        anchorToken: 1,
        rowStart: 0,
        nRows: 0,
        nOut: 0,
        flags: EntryFlag.NEED_DRAFT,
      };
      const out = await pool.step({ stepId: 1, entries: [en], nRows: 0 });
      expect(out.ok).toBe(false);
      expect(out.reason).toBe("not_ready");
      expect(out.perEntry?.[0]).toBe(NOT_READY);
      expect(await client.step({ stepId: 1, entries: [en], nRows: 0 })).toBe(NOT_READY);
    } finally {
      await pool.close();
      await client.close();
    }
  });
});
