// Child process of shared-alloc.test.ts (issue 20, the unshared tax): heap bytes per STEP of one
// session alone on an unshared core (maxSessions 1) and on a shared one (maxSessions 4), the
// same frames (8 slots x 1 row of 4 x 1024 bf16, the bench's tax STEP). Run with --expose-gc,
// --no-concurrent-recompilation (warm is a count of STEPs, not wall time) and a young generation
// large enough that no scavenge runs inside a trial. Prints one JSON line: the fewest bytes per
// STEP over the trials, for each.
import {
  APP_HEADER_SIZE,
  encodeHello,
  FrameStatus,
  frame,
  HelloFlag,
  Op,
  RowDtype,
  rowsOffsetFor,
  SampleMode,
  stepRequestBodySize,
  writeStepPrefix,
} from "@tapwire/wire";
import { NullDrafter, WorkerCore } from "../dist/index.js";

if (typeof globalThis.gc !== "function") throw new Error("run with --expose-gc");
const G = { window: 8, numSpec: 4, vocabSize: 256, numTaps: 4, hidden: 1024 };
const ROW_BYTES = G.numTaps * G.hidden * 2;
const SLOTS = 8;
const WARM = 3000;
const TRIAL = 1000;
const TRIALS = 5;
const ident = (b) => new Uint8Array(32).fill(b);

function stepFrame(seq, session, round) {
  const entries = [];
  let nRows = 0;
  for (let slot = 0; slot < SLOTS; slot++) {
    const first = round === 0;
    const anchor = G.window + round;
    const n = first ? G.window : 1;
    nRows += n;
    entries.push({
      slot,
      generation: 1,
      anchorPos: anchor,
      anchorToken: (anchor * 31 + slot) % G.vocabSize,
      rowStart: anchor - n,
      nRows: n,
      nOut: 0,
      flags: first ? 3 : 1,
    });
  }
  const buf = new Uint8Array(APP_HEADER_SIZE + stepRequestBodySize(SLOTS, nRows, ROW_BYTES, false));
  const rows = APP_HEADER_SIZE + rowsOffsetFor(SLOTS, false);
  for (let i = rows; i < buf.length; i++) buf[i] = (i * 7) & 0xff;
  const len = writeStepPrefix(buf, {
    seq,
    session,
    stepId: 1,
    entries,
    sampleMeta: null,
    nRows,
    rowBytes: ROW_BYTES,
  });
  return buf.subarray(0, len);
}

async function probe(maxSessions) {
  const d = new NullDrafter({ ...G, drafterIdentity: ident(0xd1), markovIdentity: ident(0x3a) });
  const core = new WorkerCore({ drafter: d, maxSlots: 64, maxRowsPerStep: 1024, maxSessions });
  const conn = {};
  const session = 0x4002;
  const hello = {
    drafterIdentity: d.drafterIdentity,
    markovIdentity: d.markovIdentity,
    window: G.window,
    numSpec: G.numSpec,
    sampleMode: SampleMode.GREEDY,
    rowDtype: RowDtype.BF16,
    numTaps: G.numTaps,
    hidden: G.hidden,
    rowBytes: ROW_BYTES,
    vocabSize: G.vocabSize,
    maxSlots: SLOTS,
    maxRowsPerStep: 1024,
    helloFlags: HelloFlag.WANT_MARGIN,
    auth: new Uint8Array(32),
    clientName: "probe",
  };
  const a = await core.handle(frame({ op: Op.HELLO, seq: 1, session }, encodeHello(hello)), conn);
  if (a[7] !== FrameStatus.OK) throw new Error(`HELLO status ${a[7]}`);
  const frames = [];
  for (let r = 0; r < WARM + TRIALS * TRIAL; r++) frames.push(stepFrame(r + 2, session, r));
  let next = 0;
  // A lone session's first STEPs on a shared core wait for the event loop's turn (batcher.ts
  // LONE_RUN); once warm, every STEP is answered synchronously, as on the unshared core.
  for (let i = 0; i < WARM; i++) {
    const x = await core.handle(frames[next++], conn);
    if (x[7] !== FrameStatus.OK) throw new Error(`STEP status ${x[7]}`);
  }
  // (The session's tail of frames in flight clears a few microtasks after its last answer.)
  await new Promise((resolve) => setImmediate(resolve));
  const run = (n) => {
    for (let i = 0; i < n; i++) {
      const x = core.handle(frames[next++], conn);
      if (x instanceof Promise) throw new Error("a warm lone session is answered synchronously");
      if (x[7] !== FrameStatus.OK) throw new Error(`STEP status ${x[7]}`);
    }
  };
  const perStep = [];
  for (let t = 0; t < TRIALS; t++) {
    globalThis.gc();
    const before = process.memoryUsage().heapUsed;
    run(TRIAL);
    perStep.push((process.memoryUsage().heapUsed - before) / TRIAL);
  }
  return Math.min(...perStep.filter((x) => x >= 0));
}

const unshared = await probe(1);
const shared = await probe(4);
process.stdout.write(`${JSON.stringify({ unshared, shared })}\n`);
