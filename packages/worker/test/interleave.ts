// CONTRACT 12.1 "Batching": the check shared by the reference (shared-batching.test.ts) and the
// ONNX (packages/drafter-onnx/test/shared-batching.test.ts) property tests. Several sessions'
// STEP scripts are run on one shared WorkerCore in a random interleaving (a wave of STEPs of
// several sessions handed over in one tick, so they meet in the batcher), and each session's
// script alone on a 1.1 core (K = 1): every reply must be byte-identical except worker_us.
import type { Hello, ReqEntry, SampleMeta } from "@tapwire/wire";
import { EntryFlag, encodeHello, FrameStatus, frame, HelloFlag, Op, SampleMode } from "@tapwire/wire";
import fc from "fast-check";
import type { Drafter, FrameConn } from "../src/index.js";
import { WorkerCore } from "../src/index.js";
import { helloFor, stepFrame } from "./helpers.js";

/** One session's script: its HELLO shape and its STEPs. */
export interface Script {
  session: number;
  sampled: boolean;
  margin: boolean;
  steps: { entries: ReqEntry[]; sampleMeta: SampleMeta[] | null; salt: number }[];
}

const SLOTS = 6;

/** A fast-check arbitrary of one session's script for drafter `d`. */
export function scriptArb(d: Drafter, session: number, maxSteps: number): fc.Arbitrary<Script> {
  const W = d.window;
  const stepArb = fc.array(
    fc.record({
      slot: fc.integer({ min: 0, max: SLOTS - 1 }),
      advance: fc.integer({ min: 0, max: W + 2 }),
      carry: fc.integer({ min: 0, max: W }),
      resync: fc.boolean(),
      draft: fc.integer({ min: 0, max: 9 }),
      nOut: fc.integer({ min: 0, max: d.numSpec }),
      token: fc.integer({ min: 0, max: d.vocabSize - 1 }),
      seed: fc.integer({ min: 0, max: 0xffffffff }),
      topK: fc.integer({ min: 1, max: 32 }),
      temp: fc.constantFrom(0, 500, 1000, 1500),
    }),
    { minLength: 1, maxLength: 4 },
  );
  return fc
    .record({
      sampled: fc.boolean(),
      margin: fc.boolean(),
      raw: fc.array(fc.tuple(stepArb, fc.integer({ min: 0, max: 255 })), {
        minLength: 1,
        maxLength: maxSteps,
      }),
    })
    .map(({ sampled, margin, raw }) => {
      const pos = new Array<number>(SLOTS).fill(0);
      const steps = raw.map(([es, salt]) => {
        const seen = new Set<number>();
        const entries: ReqEntry[] = [];
        const meta: SampleMeta[] = [];
        for (const e of es) {
          if (seen.has(e.slot)) continue;
          seen.add(e.slot);
          const anchor = pos[e.slot]! + e.advance;
          pos[e.slot] = anchor;
          const nRows = Math.min(e.carry, anchor);
          entries.push({
            slot: e.slot,
            generation: 1,
            anchorPos: anchor,
            anchorToken: e.token,
            rowStart: anchor - nRows,
            nRows,
            nOut: e.nOut,
            flags: (e.draft > 0 ? EntryFlag.NEED_DRAFT : 0) | (e.resync ? EntryFlag.RESYNC : 0),
          });
          meta.push({ seed: e.seed, topK: e.topK, tempMilli: e.temp });
        }
        return { entries, sampleMeta: sampled ? meta : null, salt };
      });
      return { session, sampled, margin, steps };
    });
}

function helloOf(d: Drafter, s: Script): Hello {
  return helloFor(d, {
    maxSlots: SLOTS,
    maxRowsPerStep: 4 * d.window,
    sampleMode: s.sampled ? SampleMode.TOP32 : SampleMode.GREEDY,
    helloFlags: s.margin ? HelloFlag.WANT_MARGIN : 0,
    clientName: `s${s.session}`,
  });
}

/** The reply with worker_us (body offset 12 of a STEP reply, CONTRACT 7.4) zeroed. */
function normal(r: Uint8Array): string {
  const c = r.slice();
  if (c[6] === Op.STEP && c[7] === FrameStatus.OK && c.length >= 40) c.fill(0, 36, 40);
  return Buffer.from(c).toString("hex");
}

function stepMsg(d: Drafter, s: Script, i: number): Uint8Array {
  const st = s.steps[i]!;
  return stepFrame({
    seq: i + 2,
    session: s.session,
    stepId: i + 1,
    entries: st.entries,
    sampleMeta: st.sampleMeta,
    rowBytes: d.numTaps * d.hidden * 2,
    salt: st.salt,
  });
}

/** Each script alone on a K = 1 core: its replies, in order. */
export async function soloReplies(d: Drafter, s: Script): Promise<string[]> {
  const core = new WorkerCore({ drafter: d, maxSlots: SLOTS, maxRowsPerStep: 4 * d.window });
  const c: FrameConn = {};
  const h = await core.handle(
    frame({ op: Op.HELLO, seq: 1, session: s.session }, encodeHello(helloOf(d, s))),
    c,
  );
  if (h[7] !== FrameStatus.OK) throw new Error(`solo HELLO status ${h[7]}`);
  const out: string[] = [];
  for (let i = 0; i < s.steps.length; i++) out.push(normal(await core.handle(stepMsg(d, s, i), c)));
  return out;
}

/**
 * The scripts interleaved on one shared core: `waves` picks, per wave, which sessions send their
 * next STEP together (handed over in one tick). Returns each session's replies and the number of
 * drafter calls that drafted more than one STEP.
 */
export async function sharedReplies(
  d: Drafter,
  scripts: Script[],
  waves: number[][],
): Promise<{ replies: string[][]; merged: number }> {
  const core = new WorkerCore({
    drafter: d,
    maxSlots: SLOTS,
    maxRowsPerStep: 4 * d.window,
    maxSessions: Math.max(2, scripts.length),
  });
  const conns: FrameConn[] = scripts.map(() => ({}));
  for (let k = 0; k < scripts.length; k++) {
    const s = scripts[k]!;
    const h = await core.handle(
      frame({ op: Op.HELLO, seq: 1, session: s.session }, encodeHello(helloOf(d, s))),
      conns[k],
    );
    if (h[7] !== FrameStatus.OK) throw new Error(`shared HELLO status ${h[7]}`);
  }
  const next = scripts.map(() => 0);
  const replies: string[][] = scripts.map(() => []);
  const pending = (): number[] =>
    scripts.map((s, k) => (next[k]! < s.steps.length ? k : -1)).filter((k) => k >= 0);
  let w = 0;
  while (pending().length > 0) {
    const wave = waves.length > 0 ? waves[w++ % waves.length]! : [];
    let ks = pending().filter((k) => wave.includes(k));
    if (ks.length === 0) ks = pending();
    // Every STEP of the wave is handed over before any reply is awaited.
    const inflight = ks.map((k) => {
      const i = next[k]!++;
      return Promise.resolve(core.handle(stepMsg(d, scripts[k]!, i), conns[k])).then((r) => {
        replies[k]!.push(normal(r));
      });
    });
    await Promise.all(inflight);
  }
  const merged = (core.stats().counters as Record<string, number>).drafter_calls_merged ?? 0;
  return { replies, merged };
}

/** fast-check property: for every interleaving, shared replies equal solo replies. */
export function interleavingProperty(d: Drafter, nSessions: number, maxSteps: number) {
  const scripts = fc.tuple(
    ...Array.from({ length: nSessions }, (_, k) => scriptArb(d, 0x1000 + k, maxSteps)),
  );
  const waves = fc.array(
    fc.subarray(
      Array.from({ length: nSessions }, (_, k) => k),
      { minLength: 1 },
    ),
    {
      minLength: 1,
      maxLength: 8,
    },
  );
  let mergedTotal = 0;
  const prop = fc.asyncProperty(scripts, waves, async (ss, ws) => {
    const list = [...ss];
    const shared = await sharedReplies(d, list, ws);
    mergedTotal += shared.merged;
    for (let k = 0; k < list.length; k++) {
      const solo = await soloReplies(d, list[k]!);
      if (shared.replies[k]!.length !== solo.length) throw new Error(`session ${k}: reply count`);
      for (let i = 0; i < solo.length; i++) {
        if (shared.replies[k]![i] !== solo[i]) {
          throw new Error(
            `session ${k} STEP ${i}: shared reply differs from solo\n${shared.replies[k]![i]}\n${solo[i]}`,
          );
        }
      }
    }
  });
  return { prop, merged: () => mergedTotal };
}
