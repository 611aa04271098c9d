// Over 500 lines on purpose: generated families of numbered cases (7.2 structure, the window
// oracle, reply values) over one shared STEP builder; splitting would separate each family from
// the builder it varies.
/** Worker cases of CONTRACT 6.3, 7.1–7.4 and 8: STEP structure, the window model (oracle), reply values. */
import type { EntryFields } from "../frames.js";
import { w32 } from "../frames.js";
import type { CaseCheck, CaseDef } from "../runner.js";
import { stepLimit } from "./cases-session.js";
import type { Bound, WorkerCtx } from "./context.js";

type W = CaseDef<WorkerCtx>;
type E = Partial<EntryFields> & { slot: number; anchorPos: number };

const STRUCT =
  "CONTRACT 7.2: structural checks first; any failure answers BAD_FRAME and applies nothing: body size matches (7.3); n_req <= max_slots; n_rows <= max_rows_per_step; every slot < max_slots; no slot twice; sum(entry.n_rows) == n_rows; n_out <= N; when n_rows > 0, row_start + n_rows == anchor_pos; unknown flag bits are 0; every entry's reserved is 0; RELEASE comes alone; step_flags is 0; in TOP32 sessions every top_k is in 1..32.";
const MODEL =
  "CONTRACT 7.2 steps 1-6 (window model): status OK when held == min(W, anchor_pos), PARTIAL_WINDOW when 0 < held < expected, NEED_RESYNC when held == 0 < expected; window_rows = held.";
const VALUES =
  "CONTRACT 6.3: positions < k: id in [0, vocab), confidence finite in [0, 1], margin finite >= 0; positions >= k and entries not consumed: exactly 0, 0.0, 0.0.";

/** A sequence of STEPs (each a list of entries) that must all be OK and match the oracle. */
function walk(
  id: string,
  title: string,
  cite: string,
  steps: (ctx: WorkerCtx) => E[][],
  shape: { sampled?: boolean; margin?: boolean } = {},
): W {
  return {
    id,
    title,
    cite,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t, shape);
      for (const s of steps(ctx))
        await ctx.stepOk(
          t,
          b,
          s.map((e) => ctx.entry(b, e)),
        );
    },
  };
}

interface Bad {
  entries: (ctx: WorkerCtx, b: Bound) => EntryFields[];
  mutate?: (m: Uint8Array, ctx: WorkerCtx, b: Bound) => Uint8Array;
  opts?: { stepFlags?: number; nReq?: number; nRows?: number };
  shape?: { sampled?: boolean; maxSlots?: number; maxRowsPerStep?: number };
  status?: number;
}

/** A structurally broken STEP: BAD_FRAME (or TOO_LARGE where its size is above the limit), applies nothing, seq not consumed. */
function structural(id: string, title: string, bad: Bad): W {
  return {
    id,
    title,
    cite: STRUCT,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t, { ...(bad.shape ?? {}) });
      if (bad.shape?.sampled === true && !b.sampled) t.unimplemented("TOP32");
      const pre = Math.min(3, b.maxRowsPerStep);
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: pre, nRows: pre, flags: 3 })]);
      const entries = bad.entries(ctx, b);
      let m = ctx.stepMsg(b, entries, bad.opts ?? {});
      if (bad.mutate !== undefined) m = bad.mutate(m, ctx, b);
      const want = bad.status ?? (m.length - 24 > stepLimit(ctx, b) ? 9 : 3);
      await ctx.refused(t, b.peer, m, want, title);
      // Applies nothing and keeps the seq: the same seq continues slot 0 as before.
      await ctx.stepOk(t, b, [ctx.entry(b, { slot: 0, anchorPos: pre })]);
    },
  };
}

/** Resizes a message's body by `delta` bytes (body_len updated so that the header stays readable). */
function resize(m: Uint8Array, delta: number): Uint8Array {
  const out = new Uint8Array(m.length + delta);
  out.set(m.subarray(0, Math.min(m.length, out.length)));
  w32(out, 16, out.length - 24);
  return out;
}

const e1 = (ctx: WorkerCtx, b: Bound, e: E) => ctx.entry(b, e);

export const stepCases: W[] = [
  // 6.3 reply values.
  walk("6.3.1", "n_out 0 drafts k = N positions, each valid", VALUES, () => [
    [{ slot: 0, anchorPos: 3, nRows: 3, flags: 3, nOut: 0 }],
  ]),
  walk("6.3.2", "n_out 1: position 0 drafted, positions 1.. exactly zero", VALUES, () => [
    [{ slot: 0, anchorPos: 3, nRows: 3, flags: 3, nOut: 1 }],
  ]),
  walk("6.3.3", "n_out = N drafts every position", VALUES, (c) => [
    [{ slot: 0, anchorPos: 2, nRows: 2, flags: 3, nOut: c.g.numSpec }],
  ]),
  walk("6.3.4", "an entry without NEED_DRAFT gets exactly zero values", VALUES, () => [
    [{ slot: 0, anchorPos: 3, nRows: 3, flags: 2 }],
  ]),
  walk("6.3.5", "a NEED_RESYNC entry with NEED_DRAFT gets exactly zero values", VALUES, () => [
    [{ slot: 0, anchorPos: 5, flags: 1 }],
  ]),
  walk("6.3.6", "a STALE_GENERATION entry with NEED_DRAFT gets exactly zero values", VALUES, () => [
    [{ slot: 0, anchorPos: 2, nRows: 2, flags: 3, generation: 9 }],
    [{ slot: 0, anchorPos: 2, flags: 1, generation: 8 }],
  ]),
  walk("6.3.7", "a RELEASE entry gets exactly zero values and window_rows 0", VALUES, () => [
    [{ slot: 0, anchorPos: 2, nRows: 2, flags: 3 }],
    [{ slot: 0, anchorPos: 0, flags: 4 }],
  ]),
  walk("6.3.8", "a PARTIAL_WINDOW entry with NEED_DRAFT is consumed: drafted and valid", VALUES, (c) => [
    [{ slot: 0, anchorPos: c.g.window + 5, nRows: 1, flags: 3 }],
  ]),
  walk("6.3.9", "a batch of eight slots with mixed n_out: every value valid", VALUES, (c) => [
    Array.from({ length: 8 }, (_, i) => ({
      slot: i,
      anchorPos: 1 + i,
      nRows: Math.min(1 + i, c.g.window),
      flags: 3,
      nOut: i % (c.g.numSpec + 1),
    })),
  ]),
  walk(
    "6.3.10",
    "values in a session without WANT_MARGIN: no margin array, drafts valid",
    VALUES,
    () => [[{ slot: 0, anchorPos: 2, nRows: 2, flags: 3 }]],
    { margin: false },
  ),
  walk("6.3.11", "an anchor at position 0 with no rows (empty prompt): OK, drafted", VALUES, () => [
    [{ slot: 0, anchorPos: 0, flags: 1 }],
  ]),

  // 7.1 generations.
  walk(
    "7.1.1",
    "a newer generation resets the slot: its old window is gone (NEED_RESYNC)",
    "CONTRACT 7.1: an entry whose generation is newer than the slot's resets the slot (empty window, new generation).",
    () => [
      [{ slot: 0, anchorPos: 3, nRows: 3, flags: 3, generation: 1 }],
      [{ slot: 0, anchorPos: 3, generation: 2 }],
    ],
  ),
  walk(
    "7.1.2",
    "an older generation is STALE_GENERATION, window_rows 0, and changes nothing",
    "CONTRACT 7.1: an entry whose generation is older is STALE_GENERATION and changes nothing.",
    () => [
      [{ slot: 0, anchorPos: 3, nRows: 3, flags: 3, generation: 7 }],
      [{ slot: 0, anchorPos: 5, nRows: 2, flags: 3, generation: 6 }],
      [{ slot: 0, anchorPos: 3, generation: 7 }],
    ],
  ),
  walk(
    "7.1.3",
    "the same generation continues the window",
    "CONTRACT 7.1: the worker keeps per slot a generation and a window.",
    () => [
      [{ slot: 0, anchorPos: 2, nRows: 2, flags: 3, generation: 3 }],
      [{ slot: 0, anchorPos: 3, nRows: 1, generation: 3 }],
    ],
  ),
  walk(
    "7.1.4",
    "generations wrap: 0 is newer than 0xffffffff",
    "CONTRACT 2: generations are u32 compared as serial numbers (RFC 1982).",
    () => [
      [{ slot: 0, anchorPos: 2, nRows: 2, flags: 3, generation: 0xffffffff }],
      [{ slot: 0, anchorPos: 2, generation: 0 }],
      [{ slot: 0, anchorPos: 2, flags: 1, generation: 0xffffffff }],
    ],
  ),
  walk(
    "7.1.5",
    "generation + 2^31 + 1 is older (serial arithmetic): STALE_GENERATION",
    "CONTRACT 2, 7.1: older in serial arithmetic is STALE_GENERATION.",
    () => [
      [{ slot: 0, anchorPos: 2, nRows: 2, flags: 3, generation: 10 }],
      [{ slot: 0, anchorPos: 2, flags: 1, generation: (10 + 2 ** 31 + 1) >>> 0 }],
    ],
  ),
  walk(
    "7.1.6",
    "a STALE_GENERATION entry's rows are not applied while the other entries of the STEP are",
    "CONTRACT 7.1, 7.2: for each entry in order; a stale entry changes nothing.",
    () => [
      [{ slot: 0, anchorPos: 2, nRows: 2, flags: 3, generation: 4 }],
      [
        { slot: 0, anchorPos: 4, nRows: 2, flags: 3, generation: 3 },
        { slot: 1, anchorPos: 2, nRows: 2, flags: 3 },
      ],
      [
        { slot: 0, anchorPos: 2, generation: 4 },
        { slot: 1, anchorPos: 2 },
      ],
    ],
  ),
  walk(
    "7.1.7",
    "a RELEASE keeps the generation: an older one after it is STALE_GENERATION",
    "CONTRACT 7.2 step 4: RELEASE: the window is dropped (the generation is kept).",
    () => [
      [{ slot: 0, anchorPos: 2, nRows: 2, flags: 3, generation: 20 }],
      [{ slot: 0, anchorPos: 0, flags: 4, generation: 20 }],
      [{ slot: 0, anchorPos: 1, nRows: 1, flags: 3, generation: 19 }],
    ],
  ),

  // 7.2 structural checks.
  structural("7.2.1", "body shorter than the 16-byte prefix → BAD_FRAME", {
    entries: () => [],
    mutate: (m) => resize(m, -(m.length - 24 - 8)),
  }),
  structural("7.2.2", "body one byte short of its rows → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 2, nRows: 2, flags: 3 })],
    mutate: (m) => resize(m, -1),
  }),
  structural("7.2.3", "body one byte longer than 7.3 gives → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 2, nRows: 2, flags: 3 })],
    mutate: (m) => resize(m, 1),
  }),
  structural("7.2.4", "n_rows 0 but the body lacks the padding to rows_offset_for(n_req) → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 0 })],
    mutate: (m, _c, b) => resize(m, -(m.length - 24 - 16 - 32 - (b.sampled ? 8 : 0))),
  }),
  structural("7.2.5", "n_req above the session's max_slots → BAD_FRAME", {
    shape: { maxSlots: 2 },
    entries: (c, b) => [0, 1, 2].map((s) => e1(c, b, { slot: s, anchorPos: 0 })),
  }),
  structural(
    "7.2.6",
    "n_req larger than the entries the body holds (body sized for 1, n_req 3) → BAD_FRAME",
    { entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 0 })], opts: { nReq: 3 } },
  ),
  structural("7.2.7", "n_rows above max_rows_per_step → BAD_FRAME (TOO_LARGE by size)", {
    shape: { maxSlots: 8, maxRowsPerStep: 3 },
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 4, nRows: 4, flags: 3 })],
  }),
  structural("7.2.8", "a slot equal to max_slots → BAD_FRAME", {
    shape: { maxSlots: 4 },
    entries: (c, b) => [e1(c, b, { slot: 4, anchorPos: 0 })],
  }),
  structural("7.2.9", "slot 0xffffffff → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 0xffffffff, anchorPos: 0 })],
  }),
  structural("7.2.10", "the same slot twice → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 0 }), e1(c, b, { slot: 1, anchorPos: 0 })],
  }),
  structural("7.2.11", "sum of the entries' n_rows below the prefix's n_rows → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 2, nRows: 2, flags: 3 })],
    opts: { nRows: 3 },
    mutate: (m, c) => resize(m, c.g.rowBytes),
  }),
  structural("7.2.12", "sum of the entries' n_rows above the prefix's n_rows → BAD_FRAME", {
    entries: (c, b) => [
      e1(c, b, { slot: 1, anchorPos: 2, nRows: 2, flags: 3 }),
      e1(c, b, { slot: 2, anchorPos: 1, nRows: 1, flags: 3 }),
    ],
    opts: { nRows: 2 },
    mutate: (m, c) => resize(m, -c.g.rowBytes),
  }),
  structural("7.2.13", "n_out = N + 1 → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 0, nOut: c.g.numSpec + 1 })],
  }),
  structural("7.2.14", "n_out = 0xffff → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 0, nOut: 0xffff })],
  }),
  structural("7.2.15", "row_start + n_rows < anchor_pos → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 5, nRows: 2, rowStart: 2, flags: 3 })],
  }),
  structural("7.2.16", "row_start + n_rows > anchor_pos → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 3, nRows: 2, rowStart: 2, flags: 3 })],
  }),
  structural("7.2.17", "row_start + n_rows wraps 2^32 to equal anchor_pos → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 1, nRows: 2, rowStart: 0xffffffff, flags: 3 })],
  }),
  structural("7.2.18", "entry flag bit 3 → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 0, flags: 1 | 8 })],
  }),
  structural("7.2.19", "entry flag bit 15 → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 0, flags: 0x8000 })],
  }),
  structural("7.2.20", "an entry's reserved = 1 → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 0, reserved: 1 })],
  }),
  structural("7.2.21", "RELEASE with NEED_DRAFT → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 0, flags: 5 })],
  }),
  structural("7.2.22", "RELEASE with RESYNC → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 0, flags: 6 })],
  }),
  structural("7.2.23", "RELEASE with rows → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 1, nRows: 1, flags: 4 })],
  }),
  structural("7.2.24", "step_flags = 1 → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 0 })],
    opts: { stepFlags: 1 },
  }),
  structural("7.2.25", "step_flags = 0x80000000 → BAD_FRAME", {
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 0 })],
    opts: { stepFlags: 0x80000000 },
  }),
  structural("7.2.26", "TOP32: top_k 0 → BAD_FRAME", {
    shape: { sampled: true },
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 0, topK: 0 })],
  }),
  structural("7.2.27", "TOP32: top_k 33 → BAD_FRAME", {
    shape: { sampled: true },
    entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 0, topK: 33 })],
  }),
  structural(
    "7.2.28",
    "a body above rows_offset_for(max_slots) + max_rows_per_step * row_bytes → TOO_LARGE",
    {
      shape: { maxSlots: 2, maxRowsPerStep: 2 },
      entries: (c, b) => [e1(c, b, { slot: 1, anchorPos: 2, nRows: 2, flags: 3 })],
      mutate: (m, c, b) => resize(m, stepLimit(c, b) + 1 - (m.length - 24)),
      status: 9,
    },
  ),
  structural("7.2.29", "a broken last entry: the valid entries before it are not applied either", {
    entries: (c, b) => [
      e1(c, b, { slot: 0, anchorPos: 5, nRows: 2, flags: 1, rowStart: 3 }),
      e1(c, b, { slot: 1, anchorPos: 0, flags: 0x10 }),
    ],
  }),
  {
    id: "7.2.30",
    title: "TOP32: top_k 1 and top_k 32 (the bounds) are accepted",
    cite: STRUCT,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t, { sampled: true });
      await ctx.stepOk(t, b, [
        ctx.entry(b, { slot: 0, anchorPos: 1, nRows: 1, flags: 3, topK: 1 }),
        ctx.entry(b, { slot: 1, anchorPos: 1, nRows: 1, flags: 3, topK: 32 }),
      ]);
    },
  },
  walk(
    "7.2.31",
    "a STEP with n_req 0 → OK with an empty reply",
    "CONTRACT 7.3, 7.4: n_req u32 (0 allowed: a round without requests).",
    () => [[]],
  ),
  // 7.2 status outcomes (oracle).
  walk(
    "7.2.32",
    "a new slot resynced with anchor_pos rows (< W) → OK, window_rows = anchor_pos",
    MODEL,
    () => [[{ slot: 0, anchorPos: 3, nRows: 3, flags: 3 }]],
  ),
  walk("7.2.33", "rows that start where the window ends are appended → OK", MODEL, () => [
    [{ slot: 0, anchorPos: 2, nRows: 2, flags: 3 }],
    [{ slot: 0, anchorPos: 3, nRows: 1 }],
    [{ slot: 0, anchorPos: 5, nRows: 2 }],
  ]),
  walk("7.2.34", "appending past W drops the oldest rows: window_rows stays W, OK", MODEL, (c) => [
    [{ slot: 0, anchorPos: c.g.window, nRows: c.g.window, flags: 3 }],
    [{ slot: 0, anchorPos: c.g.window + 2, nRows: 2 }],
    [{ slot: 0, anchorPos: c.g.window + 3, nRows: 1 }],
  ]),
  walk("7.2.35", "anchor_pos beyond W with the last W rows resynced → OK, window_rows W", MODEL, (c) => [
    [{ slot: 0, anchorPos: c.g.window * 3, nRows: c.g.window, flags: 3 }],
  ]),
  walk(
    "7.2.36",
    "carried rows with a gap replace the window → PARTIAL_WINDOW (fewer than expected)",
    "CONTRACT 7.2 step 3: carried rows that do not connect (a gap or an overlap) replace the window; step 5 then decides the status from what is held.",
    (c) => [
      [{ slot: 0, anchorPos: Math.min(3, c.g.window), nRows: Math.min(3, c.g.window), flags: 3 }],
      [{ slot: 0, anchorPos: c.g.window + 10, nRows: 1 }],
    ],
  ),
  walk(
    "7.2.37",
    "carried rows that overlap the window replace it",
    "CONTRACT 7.2 step 3: carried rows that do not connect (a gap or an overlap) replace the window.",
    () => [[{ slot: 0, anchorPos: 4, nRows: 4, flags: 3 }], [{ slot: 0, anchorPos: 5, nRows: 3 }]],
  ),
  walk("7.2.38", "no rows, window ends at the anchor → OK (drafting again at the same anchor)", MODEL, () => [
    [{ slot: 0, anchorPos: 3, nRows: 3, flags: 3 }],
    [{ slot: 0, anchorPos: 3 }],
  ]),
  walk("7.2.39", "no rows, the anchor moved on → NEED_RESYNC, window_rows 0", MODEL, () => [
    [{ slot: 0, anchorPos: 3, nRows: 3, flags: 3 }],
    [{ slot: 0, anchorPos: 5 }],
  ]),
  walk("7.2.40", "RESYNC with fewer rows than min(W, anchor_pos) → PARTIAL_WINDOW", MODEL, (c) => [
    [{ slot: 0, anchorPos: c.g.window + 4, nRows: 1, flags: 3 }],
  ]),
  walk(
    "7.2.41",
    "RESYNC with more than W rows keeps the last W → OK",
    "CONTRACT 7.2 step 2: RESYNC: the window becomes the carried rows (the last W of them).",
    (c) => [[{ slot: 0, anchorPos: c.g.window + 3, nRows: c.g.window + 3, flags: 3 }]],
  ),
  walk("7.2.42", "RESYNC with zero rows at anchor 0 → OK, window_rows 0", MODEL, () => [
    [{ slot: 0, anchorPos: 0, flags: 3 }],
  ]),
  walk("7.2.43", "RESYNC with zero rows at anchor 5 empties the window → NEED_RESYNC", MODEL, () => [
    [{ slot: 0, anchorPos: 5, nRows: 5, flags: 3 }],
    [{ slot: 0, anchorPos: 5, flags: 3 }],
  ]),
  walk(
    "7.2.44",
    "RELEASE → OK, window_rows 0; the slot then holds nothing (NEED_RESYNC)",
    "CONTRACT 7.2 step 4: RELEASE flag: the window is dropped (the generation is kept); status OK, window_rows 0.",
    () => [
      [{ slot: 0, anchorPos: 3, nRows: 3, flags: 3 }],
      [{ slot: 0, anchorPos: 0, flags: 4 }],
      [{ slot: 0, anchorPos: 3 }],
    ],
  ),
  walk("7.2.45", "RESYNC replaces a longer window with a shorter one", "CONTRACT 7.2 step 2.", (c) => [
    [{ slot: 0, anchorPos: c.g.window, nRows: c.g.window, flags: 3 }],
    [{ slot: 0, anchorPos: c.g.window, nRows: 1, flags: 3 }],
  ]),
  walk(
    "7.2.46",
    "an empty window at position 0 takes rows from 0 without RESYNC → OK",
    "CONTRACT 7.2 step 3: carried rows that start where the window ends (or at 0 for an empty window at position 0) are appended.",
    () => [[{ slot: 0, anchorPos: 2, nRows: 2, flags: 1 }]],
  ),
  walk(
    "7.2.47",
    "a new slot given rows not starting at 0 without RESYNC → window replaced, status by what is held",
    "CONTRACT 7.2 step 3.",
    (c) => [[{ slot: 0, anchorPos: c.g.window + 6, nRows: 2, flags: 1 }]],
  ),
  walk(
    "7.2.48",
    "every status outcome in one STEP (OK, PARTIAL_WINDOW, NEED_RESYNC, STALE_GENERATION, RELEASE)",
    MODEL,
    (c) => [
      [
        { slot: 0, anchorPos: 2, nRows: 2, flags: 3, generation: 5 },
        { slot: 3, anchorPos: 2, nRows: 2, flags: 3 },
      ],
      [
        { slot: 0, anchorPos: 2, flags: 1, generation: 4 },
        { slot: 1, anchorPos: 2, nRows: 2, flags: 3 },
        { slot: 2, anchorPos: c.g.window + 3, nRows: 1, flags: 3 },
        { slot: 3, anchorPos: 0, flags: 4 },
        { slot: 4, anchorPos: 7, flags: 1 },
      ],
    ],
  ),
  {
    id: "7.2.49",
    title: "a random walk of 40 valid STEPs over 6 slots: every status and window_rows as the oracle gives",
    cite: MODEL,
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      const W = ctx.g.window;
      const slots = Math.min(6, b.maxSlots);
      const pos = new Array<number>(slots).fill(0);
      const gen = new Array<number>(slots).fill(1);
      for (let i = 0; i < 40; i++) {
        const es: EntryFields[] = [];
        let rows = 0;
        for (let s = 0; s < slots; s++) {
          if (ctx.rng.int(3) === 0) continue;
          const roll = ctx.rng.int(10);
          let e: E;
          if (roll === 0) {
            gen[s] = gen[s]! + 1;
            pos[s] = ctx.rng.int(2 * W + 2);
            const n = Math.min(pos[s]!, ctx.rng.int(W + 2));
            e = { slot: s, anchorPos: pos[s]!, nRows: n, flags: 3, generation: gen[s]! };
          } else if (roll === 1) {
            e = { slot: s, anchorPos: 0, flags: 4, generation: gen[s]! };
            pos[s] = 0;
          } else if (roll === 2) {
            e = { slot: s, anchorPos: pos[s]!, flags: 1, generation: gen[s]! - 1 };
          } else {
            const adv = ctx.rng.int(4);
            const skip = roll === 3 ? 1 + ctx.rng.int(3) : 0; // a gap sometimes
            const start = pos[s]! + skip;
            pos[s] = start + adv;
            e = {
              slot: s,
              anchorPos: pos[s]!,
              nRows: adv,
              rowStart: adv > 0 ? start : pos[s]!,
              flags: ctx.rng.int(2) === 0 ? 1 : 0,
              generation: gen[s]!,
              nOut: ctx.rng.int(ctx.g.numSpec + 1),
            };
          }
          if (rows + (e.nRows ?? 0) > b.maxRowsPerStep) continue;
          rows += e.nRows ?? 0;
          es.push(ctx.entry(b, e));
        }
        await ctx.stepOk(t, b, es);
      }
    },
  },
  walk("7.2.50", "max_slots entries in one STEP → OK, each as the oracle gives", MODEL, (c) => [
    Array.from({ length: Math.min(16, c.g.maxSlots) }, (_, i) => ({
      slot: i,
      anchorPos: 1,
      nRows: 1,
      flags: 3,
    })),
  ]),
  walk("7.2.51", "PARTIAL_WINDOW followed by a full RESYNC → OK", MODEL, (c) => [
    [{ slot: 0, anchorPos: c.g.window + 2, nRows: 1, flags: 3 }],
    [{ slot: 0, anchorPos: c.g.window + 2, nRows: c.g.window, flags: 3 }],
  ]),
  walk("7.2.52", "rows that connect after a PARTIAL_WINDOW keep it partial until a resync", MODEL, (c) => [
    [{ slot: 0, anchorPos: c.g.window + 2, nRows: 1, flags: 3 }],
    [{ slot: 0, anchorPos: c.g.window + 3, nRows: 1 }],
  ]),

  // 7.3 layout.
  ...[1, 2, 3, 5, 7].map((n, i) =>
    walk(
      `7.3.${i + 1}`,
      `rows at rows_offset_for(${n}) (64-byte aligned to the frame start) with ${n} entries are read as the entries' rows`,
      "CONTRACT 7.3: rows_offset_for(n_req) is the smallest offset at or after the end of the entries such that 24 + offset is a multiple of 64.",
      () => [
        Array.from({ length: n }, (_, s) => ({
          slot: s,
          anchorPos: 1 + (s % 3),
          nRows: 1 + (s % 3),
          flags: 3,
        })),
      ],
    ),
  ),
  walk(
    "7.3.6",
    "TOP32: sample meta before the entries shifts them and the rows (3 entries)",
    "CONTRACT 7.3: sample meta 8 * n_req, only in TOP32 sessions, then the entries.",
    () => [[0, 1, 2].map((s) => ({ slot: s, anchorPos: 2, nRows: 2, flags: 3 }))],
    { sampled: true },
  ),
  walk(
    "7.3.7",
    "a STEP with entries and no rows: the body is exactly rows_offset_for(n_req) → OK",
    "CONTRACT 7.3: padding to rows_offset_for(n_req), then n_rows * row_bytes.",
    () => [
      [
        { slot: 0, anchorPos: 0 },
        { slot: 1, anchorPos: 0 },
      ],
    ],
  ),
  {
    id: "7.3.8",
    title: "rows are applied entry by entry in entry order (the second entry's rows are its own)",
    cite: "CONTRACT 7.3: rows n_rows * row_bytes, entry by entry, in entry order, each entry's rows in position order.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      await ctx.stepOk(t, b, [
        ctx.entry(b, { slot: 2, anchorPos: 1, nRows: 1, flags: 3 }),
        ctx.entry(b, { slot: 0, anchorPos: 3, nRows: 3, flags: 3 }),
      ]);
      await ctx.stepOk(t, b, [
        ctx.entry(b, { slot: 0, anchorPos: 4, nRows: 1 }),
        ctx.entry(b, { slot: 2, anchorPos: 2, nRows: 1 }),
      ]);
    },
  },

  // 7.4 reply layout.
  walk(
    "7.4.1",
    "the reply has exactly the size for its n_req, N and flags (odd n_req: padded arrays)",
    "CONTRACT 7.4: the reply has exactly this size for its n_req, N and flags.",
    () => [[0, 1, 2].map((s) => ({ slot: s, anchorPos: 1, nRows: 1, flags: 3 }))],
  ),
  walk(
    "7.4.2",
    "MARGIN is set exactly when the session asked WANT_MARGIN",
    "CONTRACT 7.4: MARGIN is set exactly when the session asked WANT_MARGIN.",
    () => [[{ slot: 0, anchorPos: 1, nRows: 1, flags: 3 }]],
    { margin: true },
  ),
  walk(
    "7.4.3",
    "MARGIN is not set (no margin array) without WANT_MARGIN",
    "CONTRACT 7.4: MARGIN is set exactly when the session asked WANT_MARGIN.",
    () => [[{ slot: 0, anchorPos: 1, nRows: 1, flags: 3 }]],
    { margin: false },
  ),
  walk(
    "7.4.4",
    "SAMPLED is not set in a greedy session",
    "CONTRACT 7.4: SAMPLED exactly in TOP32 sessions.",
    () => [[{ slot: 0, anchorPos: 1, nRows: 1, flags: 3 }]],
    { sampled: false },
  ),
  walk(
    "7.4.5",
    "SAMPLED is set in a TOP32 session",
    "CONTRACT 7.4: SAMPLED exactly in TOP32 sessions.",
    () => [[{ slot: 0, anchorPos: 1, nRows: 1, flags: 3 }]],
    { sampled: true },
  ),
  {
    id: "7.4.6",
    title: "step_id 0xfeedf00d, n_req and num_spec are echoed; each generation is echoed, stale ones too",
    cite: "CONTRACT 7.4: the client also checks step_id, n_req, num_spec and every generation echo.",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t);
      await ctx.stepOk(t, b, [
        ctx.entry(b, { slot: 0, anchorPos: 1, nRows: 1, flags: 3, generation: 0x77777777 }),
      ]);
      await ctx.stepOk(
        t,
        b,
        [
          ctx.entry(b, { slot: 0, anchorPos: 1, generation: 0x77777776 }),
          ctx.entry(b, { slot: 1, anchorPos: 0, generation: 0xabcdef01 }),
        ],
        { stepId: 0xfeedf00d },
      );
    },
  },
  walk(
    "7.4.7",
    "a one-entry reply: status and window_rows padding bytes are zero",
    "CONTRACT 7.4: status u8[n], zero-padded to 4; window_rows u16[n], zero-padded to 4.",
    () => [[{ slot: 0, anchorPos: 1, nRows: 1, flags: 3 }]],
  ),

  // 8 TOP32.
  walk(
    "8.1",
    "sampled entries (temp_milli 800, top_k 8): mask 1, distinct support in vocab, q >= 1 summing to 2^24, draft id in the support",
    "CONTRACT 8: each consumed position of an entry whose temp_milli > 0 is sampled: sampled_mask = 1; support_ids[0..top_k) distinct in [0, vocab_size), rest 0; proposal_q[0..top_k) >= 1 summing to exactly 2^24, rest 0; the draft id is one of the support ids.",
    () => [[0, 1, 2].map((s) => ({ slot: s, anchorPos: 2, nRows: 2, flags: 3, tempMilli: 800, topK: 8 }))],
    { sampled: true },
  ),
  walk(
    "8.2",
    "top_k 1: q[0] = 2^24 and the draft is the support id",
    "CONTRACT 8.",
    () => [[{ slot: 0, anchorPos: 2, nRows: 2, flags: 3, tempMilli: 1000, topK: 1 }]],
    { sampled: true },
  ),
  walk(
    "8.3",
    "top_k 32: 32 distinct support ids",
    "CONTRACT 8.",
    () => [[{ slot: 0, anchorPos: 2, nRows: 2, flags: 3, tempMilli: 1500, topK: 32 }]],
    { sampled: true },
  ),
  walk(
    "8.4",
    "greedy entries (temp_milli 0) in a TOP32 session: mask 0, support and q zero",
    "CONTRACT 8: greedy entries (temp_milli == 0) and non-consumed positions have mask 0 and zero support and q.",
    () => [[{ slot: 0, anchorPos: 2, nRows: 2, flags: 3, tempMilli: 0, topK: 8 }]],
    { sampled: true },
  ),
  walk(
    "8.5",
    "non-consumed positions (n_out 1) of a sampled entry: mask 0, zero support and q",
    "CONTRACT 8: non-consumed positions have mask 0 and zero support and q.",
    () => [[{ slot: 0, anchorPos: 2, nRows: 2, flags: 3, tempMilli: 700, topK: 4, nOut: 1 }]],
    { sampled: true },
  ),
  walk(
    "8.6",
    "a NEED_RESYNC sampled entry: all zero",
    "CONTRACT 8, 6.3.",
    () => [[{ slot: 0, anchorPos: 9, flags: 1, tempMilli: 700 }]],
    { sampled: true },
  ),
  walk(
    "8.7",
    "a STEP mixing greedy and sampled entries",
    "CONTRACT 8.",
    () => [
      [
        { slot: 0, anchorPos: 2, nRows: 2, flags: 3, tempMilli: 0 },
        { slot: 1, anchorPos: 2, nRows: 2, flags: 3, tempMilli: 900, topK: 16 },
        { slot: 2, anchorPos: 1, nRows: 1, flags: 2, tempMilli: 900 },
      ],
    ],
    { sampled: true },
  ),
  walk(
    "8.8",
    "sampled entries with MARGIN off: values still valid",
    "CONTRACT 7.4, 8.",
    () => [[{ slot: 0, anchorPos: 2, nRows: 2, flags: 3, tempMilli: 800 }]],
    { sampled: true, margin: false },
  ),
  {
    id: "8.9",
    title: "the same window, anchor and seed give the same sampled draft twice",
    cite: "CONTRACT 8: the draft id is one of the support ids, drawn from q with the entry's seed.",
    level: "INFO",
    async run(ctx: WorkerCtx, t: CaseCheck) {
      const b = await ctx.bound(t, { sampled: true });
      const e = { slot: 0, anchorPos: 2, nRows: 2, flags: 3, tempMilli: 800, seed: 12345 };
      const a = await ctx.stepOk(t, b, [ctx.entry(b, e)]);
      const c = await ctx.stepOk(t, b, [ctx.entry(b, { ...e, nRows: 0, flags: 1 })]);
      const x = Array.from(a.r.draftIds).join(",");
      const y = Array.from(c.r.draftIds).join(",");
      t.expect(x === y, `the same drafts ${x}`, y);
    },
  },
];
