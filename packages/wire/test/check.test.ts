// CONTRACT 6.3, 7.2 steps 5-6, 7.4 echoes (checkReplyValues) and CONTRACT 8 (validateSampled).
import { describe, expect, test } from "vitest";
import {
  checkReplyValues,
  consumedPositions,
  DYADIC_ONE,
  decodeStepReply,
  EntryFlag,
  entryValueProblem,
  type ReplyContext,
  ReqStatus,
  type StepReplyViews,
  validateSampled,
} from "../src/index.js";
import { expectWireError, validReply } from "./helpers.js";

describe("consumedPositions (CONTRACT 6.3)", () => {
  test("k = n_out == 0 ? N : min(n_out, N) for consumed entries, else 0", () => {
    const nd = EntryFlag.NEED_DRAFT;
    expect(consumedPositions({ nOut: 0, flags: nd }, ReqStatus.OK, 4)).toBe(4);
    expect(consumedPositions({ nOut: 2, flags: nd }, ReqStatus.PARTIAL_WINDOW, 4)).toBe(2);
    expect(consumedPositions({ nOut: 9, flags: nd }, ReqStatus.OK, 4)).toBe(4);
    expect(consumedPositions({ nOut: 2, flags: 0 }, ReqStatus.OK, 4)).toBe(0);
    for (const s of [2, 3, 4, 5]) expect(consumedPositions({ nOut: 2, flags: nd }, s, 4)).toBe(0);
  });
});

describe("checkReplyValues", () => {
  test("a valid reply passes (greedy and sampled, with and without margin)", () => {
    for (const margin of [false, true]) {
      for (const sampled of [false, true]) {
        const v = validReply(40, 8, { margin, sampled });
        checkReplyValues(v.views, v.ctx);
        validateSampled(v.views, v.ctx);
      }
    }
  });

  // [what, mutate(reply views, ctx), message]
  type M = Parameters<typeof validReply>[2];
  const table: [string, (v: ReturnType<typeof validReply>) => void, string, M?][] = [
    ["step_id echo", (v) => (v.ctx.stepId = 6), "reply step_id 5 != 6"],
    ["n_req echo", (v) => (v.ctx.nEntries = 2), "reply n_req 3 != 2"],
    ["num_spec echo", (v) => (v.ctx.numSpec = 5), "reply num_spec 4 != session num_spec 5"],
    ["generation echo", (v) => (v.views.generation[1] = 7), "slot 1: generation echo 7 != 1001"],
    ["unknown request status", (v) => (v.views.status[2] = 6), "slot 2: unknown request status 6"],
    [
      "window_rows above min(W, anchor_pos)",
      (v) => (v.views.windowRows[0] = 17),
      "slot 0: window_rows 17 > 16 readable rows",
    ],
    [
      "OK with a short window",
      (v) => (v.views.windowRows[0] = 15),
      "slot 0: status OK with window_rows 15 != 16",
    ],
    [
      "PARTIAL_WINDOW with a full window",
      (v) => (v.views.status[0] = ReqStatus.PARTIAL_WINDOW),
      "slot 0: PARTIAL_WINDOW with window_rows 16, want 1..15",
    ],
    [
      "PARTIAL_WINDOW with no rows",
      (v) => {
        v.views.status[0] = ReqStatus.PARTIAL_WINDOW;
        v.views.windowRows[0] = 0;
      },
      "slot 0: PARTIAL_WINDOW with window_rows 0",
    ],
    [
      "NEED_RESYNC with rows",
      (v) => (v.views.status[1] = ReqStatus.NEED_RESYNC),
      "slot 1: NEED_RESYNC with window_rows 16, want 0",
    ],
    [
      "STALE_GENERATION with rows",
      (v) => (v.views.status[1] = ReqStatus.STALE_GENERATION),
      "slot 1: window_rows 16 for a STALE_GENERATION entry",
    ],
    [
      "RELEASE with rows",
      (v) => ((v.ctx.entries[2] as { flags: number }).flags = EntryFlag.RELEASE),
      "slot 2: window_rows 16 for a RELEASE entry",
    ],
    [
      "draft id >= V",
      (v) => (v.views.draftIds[4 * 1 + 0] = 1000),
      "slot 1 position 0: draft id 1000 outside [0, 1000)",
    ],
    ["draft id < 0", (v) => (v.views.draftIds[2] = -1), "slot 0 position 2: draft id -1 outside [0, 1000)"],
    [
      "confidence NaN",
      (v) => (v.views.confidence[3] = Number.NaN),
      "slot 0 position 3: confidence NaN is not a probability",
    ],
    ["confidence > 1", (v) => (v.views.confidence[3] = 1.5), "slot 0 position 3: confidence 1.5"],
    ["confidence < 0", (v) => (v.views.confidence[0] = -0.25), "slot 0 position 0: confidence -0.25"],
    ["margin negative", (v) => (v.views.margin![1] = -1), "slot 0 position 1: margin -1 is not a finite"],
    [
      "margin infinite",
      (v) => (v.views.margin![1] = Number.POSITIVE_INFINITY),
      "slot 0 position 1: margin Infinity",
    ],
    ["margin NaN", (v) => (v.views.margin![1] = Number.NaN), "slot 0 position 1: margin NaN"],
    // entry 1 has n_out 1: positions 1..3 are tails
    [
      "tail draft id",
      (v) => (v.views.draftIds[4 + 1] = 7),
      "slot 1 position 1: draft id 7 where CONTRACT 6.3 requires 0 (n_out 1",
    ],
    ["tail confidence", (v) => (v.views.confidence[4 + 3] = 0.5), "slot 1 position 3: confidence 0.5 where"],
    [
      "tail confidence -0.0",
      (v) => (v.views.confidence[4 + 3] = -0),
      "slot 1 position 3: confidence -0 where",
    ],
    ["tail margin", (v) => (v.views.margin![4 + 2] = 1e-30), "slot 1 position 2: margin"],
    [
      "values of an entry that was not consumed (no NEED_DRAFT)",
      (v) => ((v.ctx.entries[0] as { flags: number }).flags = 0),
      "slot 0 position 0: confidence 0.5 where CONTRACT 6.3 requires 0.0",
    ],
    [
      "values of an entry with NEED_RESYNC",
      (v) => {
        v.views.status[0] = ReqStatus.NEED_RESYNC;
        v.views.windowRows[0] = 0;
      },
      "slot 0 position 0: confidence 0.5 where CONTRACT 6.3 requires 0.0",
    ],
  ];
  for (const [name, mutate, text] of table) {
    test(name, () => {
      const v = validReply(3, 4, { margin: true });
      mutate(v);
      const err = expectWireError(() => checkReplyValues(v.views, v.ctx), "WIRE_BAD_REPLY", text);
      // The per-entry rule a worker calls names the same first value violation.
      if (/ position \d+: /.test(err.message)) expect(firstEntryProblem(v.views, v.ctx)).toBe(err.message);
    });
  }
  test("position names: the first violation in entry order, then position order", () => {
    const v = validReply(3, 4);
    v.views.draftIds[4 * 2 + 1] = -5; // slot 2 position 1
    v.views.confidence[4 * 2 + 3] = 2; // slot 2 position 3
    v.views.draftIds[4 * 1 + 3] = 9; // slot 1 position 3 (tail)
    expectWireError(
      () => checkReplyValues(v.views, v.ctx),
      "WIRE_BAD_REPLY",
      "slot 1 position 3: draft id 9",
    );
  });
  test("boundary values pass: id 0 and V-1, confidence 0 and 1, margin 0 and max f32", () => {
    const v = validReply(1, 4);
    v.views.draftIds.set([0, 999, 0, 999]);
    v.views.confidence.set([0, 1, 0, 1]);
    v.views.margin!.set([0, 3.4028234663852886e38, -0, 0]);
    checkReplyValues(v.views, v.ctx);
  });
  test("windows: anchor_pos below W, and anchor_pos 0", () => {
    const v = validReply(2, 2);
    (v.ctx.entries[0] as { anchorPos: number }).anchorPos = 5;
    v.views.windowRows[0] = 5;
    (v.ctx.entries[1] as { anchorPos: number }).anchorPos = 0;
    v.views.windowRows[1] = 0;
    checkReplyValues(v.views, v.ctx);
    v.views.windowRows[0] = 6;
    expectWireError(
      () => checkReplyValues(v.views, v.ctx),
      "WIRE_BAD_REPLY",
      "window_rows 6 > 5 readable rows",
    );
  });
  test("SKIPPED and DRAFT_FAILED: any window up to min(W, anchor_pos), no drafts", () => {
    const v = validReply(2, 2);
    for (const i of [0, 1]) {
      v.views.status[i] = i === 0 ? ReqStatus.SKIPPED : ReqStatus.DRAFT_FAILED;
      v.views.windowRows[i] = 3;
      v.views.draftIds.fill(0, i * 2, i * 2 + 2);
      v.views.confidence.fill(0, i * 2, i * 2 + 2);
      v.views.margin!.fill(0, i * 2, i * 2 + 2);
    }
    checkReplyValues(v.views, v.ctx);
  });
  test("context argument checks", () => {
    const v = validReply(2, 2);
    expectWireError(
      () => checkReplyValues(v.views, { ...v.ctx, nEntries: 3 }),
      "WIRE_BAD_ARGUMENT",
      "nEntries",
    );
  });
});

describe("validateSampled (CONTRACT 8)", () => {
  const T = 32;
  // validReply(3, 2, sampled): entry i has top_k i+1, n_out i % 3 → k = [2, 1, 2]
  const fresh = () => validReply(3, 2, { sampled: true });
  const table: [string, (v: ReturnType<typeof fresh>) => void, string][] = [
    [
      "support id out of range",
      (v) => (v.views.supportIds![(2 * 2 + 0) * T + 1] = 1000),
      "slot 2 position 0: support id 1000 at index 1 outside [0, 1000)",
    ],
    [
      "support id negative",
      (v) => (v.views.supportIds![1 * T + 0] = -3),
      "slot 0 position 1: support id -3 at index 0",
    ],
    [
      "support ids repeat",
      (v) => (v.views.supportIds![(2 * 2 + 1) * T + 2] = v.views.supportIds![(2 * 2 + 1) * T + 0]!),
      "slot 2 position 1: support id",
    ],
    [
      "q zero within top_k",
      (v) => {
        const b = 2 * 2 * T;
        v.views.proposalQ![b + 2] = v.views.proposalQ![b + 2]! + v.views.proposalQ![b + 0]!;
        v.views.proposalQ![b + 0] = 0;
      },
      "slot 2 position 0: proposal_q 0 at index 0 is below 1",
    ],
    [
      "q sum off by one",
      (v) => (v.views.proposalQ![2 * 2 * T + 1]! += 1),
      `slot 2 position 0: proposal_q sums to ${DYADIC_ONE + 1}`,
    ],
    [
      "support beyond top_k",
      (v) => (v.views.supportIds![1 * T + 1] = 5),
      "slot 0 position 1: support id 5 at index 1 >= top_k 1",
    ],
    [
      "q beyond top_k",
      (v) => (v.views.proposalQ![2 * 2 * T + 3] = 1),
      "slot 2 position 0: proposal_q 1 at index 3 >= top_k 3",
    ],
    [
      "draft id not in the support",
      (v) => (v.views.draftIds[2 * 2 + 1] = 999),
      "slot 2 position 1: draft id 999 is not in the support",
    ],
    [
      "mask 0 on a sampled position",
      (v) => (v.views.sampledMask![2] = 0),
      "slot 1 position 0: sampled_mask 0, want 1",
    ],
    ["mask 2", (v) => (v.views.sampledMask![0] = 2), "slot 0 position 0: sampled_mask 2"],
    [
      "mask on a position beyond k",
      (v) => (v.views.sampledMask![3] = 1),
      "slot 1 position 1: sampled_mask 1 on a position not consumed",
    ],
    [
      "support on a position beyond k",
      (v) => (v.views.supportIds![3 * T + 31] = 1),
      "slot 1 position 1: support id 1 at index 31 on a position not consumed",
    ],
    [
      "q on a position beyond k",
      (v) => (v.views.proposalQ![3 * T + 0] = 1),
      "slot 1 position 1: proposal_q 1 at index 0",
    ],
    [
      "values on a greedy entry (temp 0)",
      (v) => {
        (v.ctx.sampleMeta![0] as { tempMilli: number }).tempMilli = 0;
      },
      "slot 0 position 0: sampled_mask 1 on a greedy entry (temp_milli 0)",
    ],
    [
      "values on an entry that was not drafted",
      (v) => {
        v.views.status[0] = ReqStatus.NEED_RESYNC;
      },
      "slot 0 position 0: sampled_mask 1 on a position not consumed (k 0)",
    ],
  ];
  test("the fresh reply passes", () => {
    const v = fresh();
    for (let i = 0; i < v.views.nReq; i++) expect(entryValueProblem(v.views, i, v.ctx)).toBeNull();
    checkReplyValues(v.views, v.ctx);
    validateSampled(v.views, v.ctx);
  });
  for (const [name, mutate, text] of table) {
    test(name, () => {
      const v = fresh();
      mutate(v);
      const err = expectWireError(() => validateSampled(v.views, v.ctx), "WIRE_BAD_REPLY", text);
      let draftValuesOk = true;
      try {
        checkReplyValues(v.views, v.ctx);
      } catch {
        draftValuesOk = false;
      }
      if (draftValuesOk) expect(firstEntryProblem(v.views, v.ctx)).toBe(err.message);
    });
  }
  test("top_k 32 with all distinct ids and q summing to 2^24 passes; a repeat at index 31 is found", () => {
    const v = validReply(32, 1, { sampled: true }); // entry 31 has top_k 32
    validateSampled(v.views, v.ctx);
    const b = 31 * T;
    v.views.supportIds![b + 31] = v.views.supportIds![b + 30]!;
    expectWireError(
      () => validateSampled(v.views, v.ctx),
      "WIRE_BAD_REPLY",
      "slot 31 position 0: support id",
    );
  });
  test("q on a greedy session is refused", () => {
    const v = fresh();
    expectWireError(
      () => validateSampled(v.views, { ...v.ctx, sampleMeta: null }),
      "WIRE_BAD_REPLY",
      "greedy session",
    );
  });
  test("sampled ids without q are refused", () => {
    const g = validReply(3, 2, { sampled: false });
    const ctx = { ...g.ctx, sampleMeta: fresh().ctx.sampleMeta ?? null };
    expectWireError(() => validateSampled(g.views, ctx), "WIRE_BAD_REPLY", "sampled ids without q");
    // and at decode time: a greedy-shaped reply where SAMPLED is expected
    expectWireError(
      () => decodeStepReply(g.body, { nReq: 3, numSpec: 2, margin: true, sampled: true }),
      "WIRE_BAD_REPLY",
      "sampled ids without q",
    );
  });
  test("a greedy session with a greedy reply passes", () => {
    const g = validReply(3, 2);
    validateSampled(g.views, g.ctx);
  });
  test("bad top_k in the context is an argument error", () => {
    const v = fresh();
    (v.ctx.sampleMeta![1] as { topK: number }).topK = 33;
    expectWireError(() => validateSampled(v.views, v.ctx), "WIRE_BAD_ARGUMENT", "topK 33");
  });
});

function firstEntryProblem(views: StepReplyViews, ctx: ReplyContext): string | null {
  for (let i = 0; i < views.nReq; i++) {
    const why = entryValueProblem(views, i, ctx);
    if (why !== null) return why;
  }
  return null;
}
