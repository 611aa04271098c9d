// CONTRACT 12.1 over real sockets: one shared worker (max_sessions 4), several clients at once,
// each checking every reply (helpers' Sess runs the client's 6.3/7.4/8 checks).
import { FrameStatus, Op } from "@tapwire/wire";
import { afterEach, describe, expect, test } from "vitest";
import type { Worker } from "../src/index.js";
import { createWorker } from "../src/index.js";
import { entry, helloFor, nullDrafter, Raw, Sess } from "./helpers.js";

const d = nullDrafter();
const open: { workers: Worker[]; raws: Raw[] } = { workers: [], raws: [] };
afterEach(async () => {
  for (const r of open.raws.splice(0)) r.close();
  await Promise.all(open.workers.splice(0).map((w) => w.close()));
});

async function waitFor(cond: () => boolean, what: string, ms = 20_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

async function client(w: Worker, id: number, name: string): Promise<Sess> {
  const r = await new Raw(w.endpoints[0]!).connect();
  open.raws.push(r);
  return new Sess(r, id, d, helloFor(d, { maxSlots: 8, clientName: name }));
}

async function statsOf(s: Sess): Promise<{ json: Record<string, unknown>; text: string }> {
  const a = await s.simple(Op.STATS);
  const text = Buffer.from(a.body).toString("utf8");
  return { json: JSON.parse(text) as Record<string, unknown>, text };
}

describe("CONTRACT 12.1: a shared worker over tcp with several clients", () => {
  test("four clients at once; a fifth is BUSY until one closes; STATS and RESET stay per session", async () => {
    const w = await createWorker({
      drafter: d,
      listen: ["tcp://127.0.0.1:0"],
      maxSlots: 8,
      // (a STATS reply must fit the largest message: rows of 16 bytes need room for it)
      maxRowsPerStep: 512,
      maxSessions: 4,
    });
    open.workers.push(w);
    const ids = [0x6001, 0x6002, 0x6003, 0x6004];
    const cs = await Promise.all(ids.map((id, k) => client(w, id, `engine-${k}`)));
    for (const c of cs) {
      const h = await c.doHello();
      expect(h.status).toBe(FrameStatus.OK);
      expect(h.reply!.capabilities & 8).toBe(8);
    }
    // Every client runs rounds at the same time; each keeps slot k's window at 3 rows + its round.
    await Promise.all(
      cs.map(async (c, k) => {
        for (let round = 1; round <= 6; round++) {
          const a = await c.step([entry({ slot: k, anchorPos: round, rowStart: round - 1, nRows: 1 })]);
          expect(a.status).toBe(FrameStatus.OK);
          expect(a.views!.windowRows[0]).toBe(Math.min(round, d.window));
        }
      }),
    );
    // A fifth is BUSY while all four are live.
    const fifth = await client(w, 0x6005, "engine-4");
    expect((await fifth.doHello()).status).toBe(FrameStatus.BUSY);
    // STATS on session 1's connection: its own id and seq, never another's.
    const s1 = await statsOf(cs[1]!);
    expect(s1.json.session).toBe(ids[1]);
    for (const other of [ids[0]!, ids[2]!, ids[3]!]) {
      expect(s1.text).not.toContain(String(other));
      expect(s1.text).not.toContain(other.toString(16));
    }
    // RESET of session 0 leaves the others' windows whole.
    expect((await cs[0]!.simple(Op.RESET)).status).toBe(FrameStatus.OK);
    expect(w.core.debugWindow(0, ids[0]).known).toBe(false);
    for (let k = 1; k < 4; k++) expect(w.core.debugWindow(k, ids[k]).nRows).toBe(6);
    // Client 2 closes its connection: its session became droppable, the fifth is admitted.
    cs[2]!.raw.close();
    await waitFor(() => (w.stats().worker as { sessions_held: number }).sessions_held === 4, "still 4 held");
    let ok = false;
    for (let i = 0; i < 200 && !ok; i++) {
      const a = await fifth.doHello();
      ok = a.status === FrameStatus.OK;
      if (!ok) {
        expect(a.status).toBe(FrameStatus.BUSY);
        await new Promise((r) => setTimeout(r, 10));
      }
    }
    expect(ok).toBe(true);
    expect(w.core.heldSessions.sort()).toEqual([0x6001, 0x6002, 0x6004, 0x6005]);
    const f = await fifth.step([entry({ slot: 2, anchorPos: 1, nRows: 1 })]);
    expect(f.status).toBe(FrameStatus.OK);
    // The survivors' windows were untouched by the drop.
    for (const k of [1, 3]) expect(w.core.debugWindow(k, ids[k]).nRows).toBe(6);
    // Per-client metrics (labelled by client_name) are on the metrics text, not in STATS.
    const prom = w.core.clientMetricsText();
    expect(prom).toContain('client_rounds_total{client="engine-1"} 6');
    expect(s1.text).not.toContain("engine-0");
  });
});
