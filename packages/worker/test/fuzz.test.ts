import { connect, type Socket } from "node:net";
import { encodeHello, FrameStatus, frame, Op, SampleMode } from "@tapwire/wire";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import type { Worker } from "../src/index.js";
import { createWorker } from "../src/index.js";
import { entry, helloFor, nullDrafter, Raw, Sess, stepFrame } from "./helpers.js";

/** Fuzz time per test: short in `test`, longer with TAPWIRE_FUZZ_MS (test:soak). */
const FUZZ_MS = Number(process.env.TAPWIRE_FUZZ_MS ?? 1500);
/** Each fuzz test runs FUZZ_MS, then checks the worker is alive: its timeout leaves room for that. */
const FUZZ_TIMEOUT_MS = FUZZ_MS + 60_000;
const drafter = nullDrafter();

let worker: Worker;
let ep: string;
beforeAll(async () => {
  worker = await createWorker({ drafter, listen: ["tcp://127.0.0.1:0"], maxSlots: 16, maxRowsPerStep: 64 });
  ep = worker.endpoints[0]!;
});
afterAll(async () => {
  await worker.close();
});

/** The worker still answers, and a fresh session still works end to end. */
async function assertAlive(session: number): Promise<void> {
  const r = await new Raw(ep).connect();
  try {
    expect((await r.send(frame({ op: Op.PING, seq: 1, session: 0 }))).status).toBe(FrameStatus.OK);
    const s = new Sess(r, session, drafter, helloFor(drafter));
    expect((await s.doHello()).status).toBe(FrameStatus.OK);
    const st = await s.step([entry({ slot: 1, anchorPos: 2, nRows: 2 })]);
    expect(st.status).toBe(FrameStatus.OK);
  } finally {
    r.close();
  }
}

/** Valid frames of every op, to be truncated and mutated. */
function seeds(session: number): Uint8Array[] {
  const sampledHello = helloFor(drafter, { sampleMode: SampleMode.TOP32 });
  return [
    frame({ op: Op.HELLO, seq: 1, session }, encodeHello(helloFor(drafter))),
    frame({ op: Op.HELLO, seq: 2, session }, encodeHello(sampledHello)),
    stepFrame({
      seq: 3,
      session,
      entries: [
        entry({ slot: 0, anchorPos: 3, nRows: 3 }),
        entry({ slot: 2, anchorPos: 1, nRows: 1, flags: 3 }),
      ],
    }),
    stepFrame({
      seq: 4,
      session,
      entries: [entry({ slot: 0, anchorPos: 3, nRows: 3 })],
      sampleMeta: [{ seed: 5, topK: 8, tempMilli: 900 }],
    }),
    frame({ op: Op.PING, seq: 5, session: 0 }, new Uint8Array(17)),
    frame({ op: Op.STATS, seq: 6, session: 0 }),
    frame({ op: Op.RESET, seq: 7, session }),
  ];
}

const mutation = fc.record({
  seed: fc.nat(6),
  cut: fc.option(fc.nat(400)),
  flips: fc.array(fc.record({ at: fc.nat(400), v: fc.nat(255) }), { maxLength: 6 }),
  fixLen: fc.boolean(),
});

describe("fuzz: garbage never crashes the worker (CONTRACT 11)", () => {
  test("random bytes, truncated and mutated frames over a real connection", {
    timeout: FUZZ_TIMEOUT_MS,
  }, async () => {
    const deadline = Date.now() + FUZZ_MS;
    let r = await new Raw(ep).connect();
    let sent = 0;
    let closed = 0;
    const session = 0x0badf00d;
    // A live session makes mutated STEPs reach the deeper checks.
    await new Sess(r, session, drafter, helloFor(drafter)).doHello();
    while (Date.now() < deadline) {
      const msgs = fc.sample(
        fc.oneof(
          fc.uint8Array({ maxLength: 300 }).map((b) => ({ raw: b })),
          mutation.map((m) => ({ m })),
        ),
        50,
      );
      for (const x of msgs) {
        let msg: Uint8Array;
        if ("raw" in x) msg = x.raw;
        else {
          const base = seeds(session)[x.m.seed]!.slice();
          for (const f of x.m.flips) if (f.at < base.length) base[f.at] = f.v;
          msg = x.m.cut !== null ? base.subarray(0, Math.min(base.length, x.m.cut)) : base;
          if (x.m.fixLen && msg.length >= 20)
            new DataView(msg.buffer, msg.byteOffset).setUint32(16, msg.length - 24, true);
        }
        sent++;
        try {
          const a = await r.send(msg);
          expect(a.status).toBeLessThanOrEqual(FrameStatus.INTERNAL);
          expect(a.status).not.toBe(FrameStatus.INTERNAL);
        } catch {
          // The worker closed the connection (unreadable header): reconnect.
          closed++;
          r.close();
          r = await new Raw(ep).connect();
        }
      }
    }
    r.close();
    expect(sent).toBeGreaterThan(50);
    expect(closed).toBeGreaterThan(0);
    await assertAlive(0x600d);
    expect((worker.stats().counters as Record<string, number>).internal_errors).toBe(0);
  });

  test("raw stream garbage: bad length prefixes, partial messages, abrupt closes", {
    timeout: FUZZ_TIMEOUT_MS,
  }, async () => {
    const { port } = new URL(ep.replace("tcp://", "http://"));
    const deadline = Date.now() + FUZZ_MS;
    let n = 0;
    while (Date.now() < deadline) {
      const bytes = fc.sample(fc.uint8Array({ minLength: 1, maxLength: 200 }), 1)[0]!;
      const sock: Socket = connect(Number(port), "127.0.0.1");
      await new Promise<void>((resolve) => {
        sock.on("error", () => resolve());
        sock.on("close", () => resolve());
        sock.on("connect", () => {
          // Sometimes a huge length prefix (refused before buffering), sometimes random bytes.
          if (n % 3 === 0) sock.write(Uint8Array.of(0xff, 0xff, 0xff, 0x7f, 1, 2, 3));
          else sock.write(bytes);
          setTimeout(() => sock.destroy(), n % 2 === 0 ? 0 : 5);
        });
      });
      n++;
    }
    expect(n).toBeGreaterThan(5);
    await assertAlive(0x600e);
  });
});
