// Property (CONTRACT 7.5, 9.2): random rounds interleaved with random faults against a real
// in-process worker (createWorker + NullDrafter) behind the fault proxy. After the next
// successful round the worker's window of every live slot equals RoundCore's ring, and no draft
// that failed validation ever reaches the engine.
import { startFaultProxy } from "@tapwire/testing";
import { createWorker, NullDrafter } from "@tapwire/worker";
import fc from "fast-check";
import { afterAll, beforeAll, expect, test } from "vitest";
import {
  RemoteDraftClient,
  RoundCore,
  type RoundCore as RoundCoreT,
  type RoundRequest,
} from "../src/index.js";
import {
  checkOutcomesAgainstTable,
  clientOptions,
  DRAFTER_GEOMETRY,
  GEO,
  makeRows,
  ROW_BYTES,
  until,
} from "./helpers.js";

type Worker = Awaited<ReturnType<typeof createWorker>>;
type Proxy = Awaited<ReturnType<typeof startFaultProxy>>;
let worker: Worker;
let proxy: Proxy;

beforeAll(async () => {
  worker = await createWorker({
    drafter: new NullDrafter(DRAFTER_GEOMETRY),
    listen: ["tcp://127.0.0.1:0"],
  });
  proxy = await startFaultProxy({ host: "127.0.0.1", port: Number(new URL(worker.endpoints[0]!).port) });
});
afterAll(async () => {
  await proxy.close();
  await worker.close();
});

const faultArb = fc.constantFrom(
  { kind: "stall" } as const,
  { kind: "drop_after", bytes: 0, direction: "up" } as const,
  { kind: "drop_after", bytes: 0, direction: "down" } as const,
  { kind: "latency", ms: 400 } as const,
);
const opArb = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({ op: fc.constant("accept" as const), n: fc.integer({ min: 0, max: 5 }) }),
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
  { weight: 2, arbitrary: fc.record({ op: fc.constant("fault" as const), fault: faultArb }) },
  {
    weight: 1,
    arbitrary: fc.record({
      op: fc.constant("event" as const),
      ev: fc.constantFrom("markFailed", "newSession", "reset"),
    }),
  },
);

class Engine {
  reqs = new Map<number, { gen: number; anchor: number; sent: number }>();
  gen = 1;
  /** With `core`, rows of up to W positions are written in place through `core.rowsTarget`. */
  input(core?: RoundCoreT): RoundRequest[] {
    return [...this.reqs].map(([slot, r]) => {
      const n = r.anchor - r.sent;
      r.sent = r.anchor;
      if (core !== undefined && n > 0 && n <= GEO.window) {
        const src = makeRows(slot + r.gen * 8, r.anchor - n, n);
        let off = 0;
        for (const v of core.rowsTarget(slot, r.gen, r.anchor - n, n)) {
          v.set(src.subarray(off, off + v.length));
          off += v.length;
        }
        return {
          slot,
          generation: r.gen,
          anchorPos: r.anchor,
          anchorToken: (r.anchor * 13) % GEO.vocabSize,
          rowsInRing: n,
        };
      }
      return {
        slot,
        generation: r.gen,
        anchorPos: r.anchor,
        anchorToken: (r.anchor * 13) % GEO.vocabSize,
        newRows: n > 0 ? makeRows(slot + r.gen * 8, r.anchor - n, n) : null,
      };
    });
  }
}

function checkDrafts(res: Awaited<ReturnType<RoundCoreT["round"]>>): void {
  for (const d of res.drafts) {
    if (d.k === 0) continue;
    expect(res.outcome).toBe("ok");
    expect(["ok", "partial_window"]).toContain(d.reason);
    for (let j = 0; j < d.k; j++) {
      expect(d.ids[j]).toBeGreaterThanOrEqual(0);
      expect(d.ids[j]).toBeLessThan(GEO.vocabSize);
      expect(d.conf[j]).toBeGreaterThanOrEqual(0);
      expect(d.conf[j]).toBeLessThanOrEqual(1);
    }
  }
}

const outcomes = new Map<string, number>();

test("random rounds and faults: after a good round the worker's windows equal the rings", async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.array(opArb, { minLength: 1, maxLength: 20 }),
      fc.constantFrom<"stage" | "parts">("stage", "parts"),
      fc.boolean(),
      async (ops, rowsMode, inRing) => {
        proxy.setFault(null);
        const client = checkOutcomesAgainstTable(
          new RemoteDraftClient(
            clientOptions(proxy.endpoint, { requestTimeoutMs: 150, backoffMs: 2, backoffMaxMs: 5 }),
          ),
        );
        const core = new RoundCore({ client, rowsMode });
        try {
          expect(await client.waitReady(10_000)).toBe(true);
          const eng = new Engine();
          eng.reqs.set(0, { gen: eng.gen++, anchor: 11, sent: 0 });
          eng.reqs.set(3, { gen: eng.gen++, anchor: 2, sent: 0 });
          let release: number[] = [];
          for (const o of ops) {
            let faulted = false;
            if (o.op === "start") {
              eng.reqs.set(o.slot, { gen: eng.gen++, anchor: o.prompt, sent: 0 });
              release = release.filter((s) => s !== o.slot);
            } else if (o.op === "accept") {
              for (const r of eng.reqs.values()) r.anchor += o.n;
            } else if (o.op === "finish") {
              if (eng.reqs.delete(o.slot)) release.push(o.slot);
            } else if (o.op === "fault") {
              proxy.setFault(o.fault);
              faulted = true;
            } else if (o.ev === "markFailed") {
              client.markFailed("property");
            } else if (o.ev === "newSession") {
              client.newSession("property");
            } else if (client.ready) {
              await core.reset().catch(() => undefined);
            }
            const res = await core.round({ requests: eng.input(inRing ? core : undefined), release });
            release = [];
            checkDrafts(res);
            outcomes.set(res.outcome, (outcomes.get(res.outcome) ?? 0) + 1);
            if (faulted) {
              proxy.setFault(null);
              proxy.dropAll();
              await until(() => client.ready, 10_000, "ready after a fault");
            }
          }
          proxy.setFault(null);
          // rounds until one succeeds with nothing deferred and every slot synced
          let synced = false;
          for (let i = 0; i < 50 && !synced; i++) {
            await until(() => client.ready, 10_000, "ready");
            const res = await core.round({ requests: eng.input(inRing ? core : undefined), release });
            release = [];
            checkDrafts(res);
            synced =
              (res.outcome === "ok" || res.outcome === "idle") &&
              res.deferred === 0 &&
              [...eng.reqs.keys()].every((s) => !core.slotView(s).needResync);
          }
          expect(synced).toBe(true);
          for (const [slot, r] of eng.reqs) {
            const win = worker.debugWindow(slot);
            const ring = core.slotView(slot);
            const want = Math.min(GEO.window, r.anchor);
            expect(win.generation).toBe(r.gen);
            expect(win.nRows).toBe(want);
            if (want > 0) expect(win.firstPos + win.nRows).toBe(r.anchor);
            expect(Buffer.from(win.rows)).toEqual(
              Buffer.from(ring.rows.subarray(ring.rows.length - want * ROW_BYTES)),
            );
          }
        } finally {
          await client.close();
        }
      },
    ),
    { numRuns: 25 },
  );
  // the run exercised both sides: good rounds and rounds with an unknown outcome
  expect(outcomes.get("ok") ?? 0).toBeGreaterThan(0);
  expect((outcomes.get("timeout") ?? 0) + (outcomes.get("transport_error") ?? 0)).toBeGreaterThan(0);
});
