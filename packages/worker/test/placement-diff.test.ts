// Differential property: a worker receiving rows in place and one copying them (receiveInPlace:
// false) must answer every frame byte for byte alike (but for worker_us) and hold identical
// windows, for random STEP sequences with random corruption of the head (prefix, entries,
// header fields), stale seqs and foreign sessions: the placement hook declines anything odd and
// the normal path answers it, exactly as before (CONTRACT 4, 5, 6.2, 7.1, 7.2).
import { uniqueSocketPath } from "@tapwire/testing";
import { makeClient, type RpcClient } from "@tapwire/transport";
import type { ReqEntry } from "@tapwire/wire";
import {
  APP_HEADER_SIZE,
  EntryFlag,
  encodeHello,
  FrameStatus,
  frame,
  Op,
  rowsOffsetFor,
} from "@tapwire/wire";
import fc from "fast-check";
import { afterAll, beforeAll, expect, test } from "vitest";
import type { Worker } from "../src/index.js";
import { createWorker } from "../src/index.js";
import { helloFor, nullDrafter, stepFrame } from "./helpers.js";

const W = 4;
const SLOTS = 6;
// 2 taps x 8192 bf16 = 32 KiB rows: every STEP with 2 rows or more spans reads (placed).
const drafter = nullDrafter({ window: W, numTaps: 2, hidden: 8192 });
const RB = 2 * 8192 * 2;

let placed: Worker;
let copied: Worker;
const clients: RpcClient[] = [null as unknown as RpcClient, null as unknown as RpcClient];
const replyBufs = [new Uint8Array(1 << 20), new Uint8Array(1 << 20)];

async function connect(i: number): Promise<void> {
  clients[i]?.close();
  const w = i === 0 ? placed : copied;
  const c = makeClient(w.endpoints[0]!);
  await c.connect(5000);
  clients[i] = c;
}

beforeAll(async () => {
  placed = await createWorker({ drafter, listen: [`unix://${uniqueSocketPath("wd")}`], maxSlots: 8 });
  copied = await createWorker({
    drafter,
    listen: [`unix://${uniqueSocketPath("we")}`],
    maxSlots: 8,
    receiveInPlace: false,
  });
  await connect(0);
  await connect(1);
});
afterAll(async () => {
  for (const c of clients) c.close();
  await placed.close();
  await copied.close();
});

/** Sends `msg` to both workers; returns both replies (worker_us zeroed), reconnecting after a close. */
async function both(msg: Uint8Array): Promise<[Uint8Array, Uint8Array]> {
  const out: Uint8Array[] = [];
  for (let i = 0; i < 2; i++) {
    const n = await clients[i]!.request(msg, replyBufs[i]!, 20_000);
    const r = replyBufs[i]!.slice(0, n);
    if (r[6] === Op.STEP && r[7] === FrameStatus.OK && r.length >= APP_HEADER_SIZE + 16) {
      r.fill(0, APP_HEADER_SIZE + 12, APP_HEADER_SIZE + 16); // worker_us
    }
    out.push(r);
  }
  for (let i = 0; i < 2; i++) if (!clients[i]!.connected) await connect(i);
  return [out[0]!, out[1]!];
}

const entryArb = (slot: number) =>
  fc.record({
    slot: fc.constant(slot),
    genDelta: fc.constantFrom(0, 0, 0, 0, 1, -1),
    kind: fc.constantFrom("append", "append", "append", "random", "none", "release"),
    n: fc.nat(W + 1),
    start: fc.nat(20),
    resync: fc.boolean(),
  });
const stepArb = fc.record({
  entries: fc
    .uniqueArray(fc.nat(SLOTS - 1), { minLength: 1, maxLength: SLOTS })
    .chain((slots) => fc.tuple(...slots.map((s) => entryArb(s)))),
  // What goes wrong with the frame: nothing mostly; a corrupted head byte (avoiding magic and
  // body_len, which close the connection); a stale seq; another session.
  fault: fc.constantFrom("none", "none", "none", "corrupt", "stale", "session"),
  at: fc.nat(4000),
  value: fc.nat(255),
});

test("property: placed and copied workers answer alike and hold identical windows", async () => {
  let session = 0x900;
  const gens: number[] = [];
  const ends: number[] = [];
  await fc.assert(
    fc.asyncProperty(fc.array(stepArb, { minLength: 1, maxLength: 10 }), async (steps) => {
      session++;
      let seq = 1;
      const hello = frame(
        { op: Op.HELLO, seq, session },
        encodeHello(helloFor(drafter, { maxSlots: 8, maxRowsPerStep: 64 })),
      );
      const [h0, h1] = await both(hello);
      expect(h0[7]).toBe(FrameStatus.OK);
      expect(Buffer.compare(Buffer.from(h0), Buffer.from(h1))).toBe(0);
      gens.length = 0;
      ends.length = 0;
      for (let k = 0; k < SLOTS; k++) {
        gens.push(1);
        ends.push(0);
      }
      for (const st of steps) {
        const entries: ReqEntry[] = st.entries.map((x) => {
          const generation = (gens[x.slot]! + x.genDelta) >>> 0;
          let rowStart = 0;
          let nRows = 0;
          let anchorPos = x.start;
          let flags = EntryFlag.NEED_DRAFT | (x.resync ? EntryFlag.RESYNC : 0);
          if (x.kind === "append") {
            rowStart = ends[x.slot]!;
            nRows = x.n;
            anchorPos = rowStart + x.n;
          } else if (x.kind === "random") {
            rowStart = x.start;
            nRows = x.n;
            anchorPos = x.start + x.n;
          } else if (x.kind === "release") {
            flags = EntryFlag.RELEASE;
          }
          return { slot: x.slot, generation, anchorPos, anchorToken: 1, rowStart, nRows, nOut: 0, flags };
        });
        const nextSeq = st.fault === "stale" ? seq : seq + 1;
        const msg = stepFrame({
          seq: nextSeq,
          session: st.fault === "session" ? session + 1000 : session,
          entries,
          rowBytes: RB,
          salt: nextSeq,
        });
        if (st.fault === "corrupt") {
          const headEnd = APP_HEADER_SIZE + rowsOffsetFor(entries.length, false);
          const at = 4 + (st.at % (headEnd - 4));
          if (at < 16 || at >= 20) msg[at] = st.value;
        }
        const [r0, r1] = await both(msg);
        expect(Buffer.from(r0).toString("hex")).toBe(Buffer.from(r1).toString("hex"));
        if (r0[7] === FrameStatus.OK) {
          seq = nextSeq;
          for (const e of entries) {
            gens[e.slot] = e.generation;
            if (e.nRows > 0) ends[e.slot] = e.rowStart + e.nRows;
          }
        }
        for (let s = 0; s < 8; s++) {
          const a = placed.debugWindow(s);
          const b = copied.debugWindow(s);
          expect({ ...a, rows: null }).toEqual({ ...b, rows: null });
          expect(Buffer.compare(Buffer.from(a.rows), Buffer.from(b.rows))).toBe(0);
        }
      }
    }),
    { numRuns: 100 },
  );
  const p = placed.stats().counters as Record<string, number>;
  const c = copied.stats().counters as Record<string, number>;
  expect(p.rows_placed).toBeGreaterThan(0);
  expect(c.rows_placed ?? 0).toBe(0);
  expect(p.rows_applied).toBe(c.rows_applied);
  expect(p.placements_lost).toBe(0);
}, 180_000);
