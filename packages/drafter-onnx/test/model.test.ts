/**
 * Models that do not fit or misbehave (issue 14): a clear error at load, or DRAFT_FAILED for the
 * entry (failed[]) or the STEP (a rejected draft), never a crash or a wrong draft. Also the
 * options, the stateless logits-output path, and the Markov-style previous-token input.
 */
import { existsSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { exportReferenceHead, Input, Meta, OnnxDrafter, OnnxDrafterError, Output } from "../src/index.js";
import { defaultPair, makeOutput } from "./helpers.js";
import { editModel, setMeta, TOY, toyModel } from "./toy.js";

const V = TOY.vocab;
const fav = (t: number) => (5 * t + 1) % V;

function entries(anchors: number[], k: number = TOY.numSpec) {
  const rb = TOY.numTaps * TOY.hidden * 2;
  return anchors.map((a, i) => ({
    index: i,
    slot: i,
    anchorPos: 3,
    anchorToken: a,
    k,
    rows: new Uint8Array(3 * rb).fill(0x3f),
    nRows: 3,
    sample: null,
  }));
}

async function loadError(model: Uint8Array | string, options = {}): Promise<OnnxDrafterError> {
  try {
    const d = await OnnxDrafter.create(model, options);
    await d.release();
  } catch (e) {
    expect(e).toBeInstanceOf(OnnxDrafterError);
    return e as OnnxDrafterError;
  }
  throw new Error("the model loaded");
}

describe("a stateless logits-output head (toy bigram)", () => {
  let d: OnnxDrafter;
  beforeAll(async () => {
    d = await OnnxDrafter.create(toyModel());
  });
  afterAll(() => d.release());

  it("announces the metadata geometry; no state, full logits, TOP32", () => {
    expect(d.info).toMatchObject({ output: "logits", stateSize: 0, windowRows: 2, top32: true });
    expect([d.window, d.numSpec, d.vocabSize, d.numTaps, d.hidden]).toEqual([4, 3, V, 2, 8]);
    expect(d.capabilities).toBe(7);
  });

  it("feeds each position the previous position's draft (Markov-style chains)", async () => {
    const out = makeOutput(3, TOY.numSpec, false);
    await d.draft(entries([0, 7, 63]), out);
    for (const [i, a] of [0, 7, 63].entries()) {
      const want = [fav(a), fav(fav(a)), fav(fav(fav(a)))];
      expect(Array.from(out.draftIds.subarray(i * 3, i * 3 + 3))).toEqual(want);
      for (let j = 0; j < 3; j++) {
        expect(out.confidence[i * 3 + j]).toBeGreaterThan(0.2);
        expect(out.confidence[i * 3 + j]).toBeLessThanOrEqual(1);
        expect(out.margin![i * 3 + j]).toBeGreaterThan(2.9);
      }
    }
    expect(Array.from(out.failed!)).toEqual([0, 0, 0]);
  });

  it("one session.run per draft position for the whole batch", async () => {
    const before = d.runs;
    await d.draft(entries([1, 2, 3, 4, 5, 6, 7, 8, 9], 2), makeOutput(9, TOY.numSpec, false));
    expect(d.runs - before).toBe(2);
  });

  it("an anchor outside the vocabulary fails that entry alone", async () => {
    const out = makeOutput(2, TOY.numSpec, false);
    await d.draft(entries([V + 5, 2]), out);
    expect(Array.from(out.failed!)).toEqual([1, 0]);
    expect(out.draftIds[3]).toBe(fav(2));
  });
});

describe("rows: the last R window rows, right-aligned, zero-padded", () => {
  it("the model sees the entry's last row at index R - 1, whatever the window's length", async () => {
    const d = await OnnxDrafter.create(toyModel({ probeRows: true }));
    try {
      const rb = TOY.numTaps * TOY.hidden * 2;
      const windowOf = (firsts: number[]) => {
        const rows = new Uint8Array(firsts.length * rb);
        firsts.forEach((f, r) => {
          rows[r * rb] = f;
        });
        return rows;
      };
      const wins = [[5], [1, 2, 9], [7, 11], [4, 3, 2, 13]];
      const batch = wins.map((w, i) => ({
        index: i,
        slot: i,
        anchorPos: w.length,
        anchorToken: 0,
        k: 2,
        rows: windowOf(w),
        nRows: w.length,
        sample: null,
      }));
      const out = makeOutput(wins.length, TOY.numSpec, false);
      await d.draft(batch, out);
      // Then a shorter window in the same slots: no row of the previous STEP may remain.
      const out2 = makeOutput(1, TOY.numSpec, false);
      await d.draft([{ ...batch[0]!, rows: new Uint8Array(0), nRows: 0 }], out2);
      expect([0, 1, 2, 3].map((i) => out.draftIds[i * TOY.numSpec])).toEqual([5, 9, 11, 13]);
      expect([0, 1, 2, 3].map((i) => out.draftIds[i * TOY.numSpec + 1])).toEqual([5, 9, 11, 13]);
      expect(out2.draftIds[0]).toBe(0);
    } finally {
      await d.release();
    }
  });
});

describe("non-finite outputs and a model that throws", () => {
  it("NaN logits fail exactly the entries they reach (failed[]), the rest are drafted", async () => {
    const d = await OnnxDrafter.create(toyModel({ nanRows: [3] }));
    try {
      // Anchor 3: NaN at position 0; an anchor whose favourite successor is 3: NaN at position 1.
      const reachesAtOne = [...Array(V).keys()].find((a) => fav(a) === 3)!;
      const out = makeOutput(3, TOY.numSpec, false);
      await d.draft(entries([3, reachesAtOne, 10]), out);
      expect(Array.from(out.failed!)).toEqual([1, 1, 0]);
      expect(out.draftIds[6]).toBe(fav(10));
    } finally {
      await d.release();
    }
  });

  it("a run that throws rejects the draft (the worker answers DRAFT_FAILED), and the next STEP works", async () => {
    const d = await OnnxDrafter.create(toyModel({ throwAfterPosition0: true }));
    try {
      await expect(d.draft(entries([1, 2], 2), makeOutput(2, TOY.numSpec, false))).rejects.toThrow(
        /Gather|indices|out of/i,
      );
      const out = makeOutput(2, TOY.numSpec, false);
      await d.draft(entries([1, 2], 1), out);
      expect([out.draftIds[0], out.draftIds[3]]).toEqual([fav(1), fav(2)]);
    } finally {
      await d.release();
    }
  });

  it("ids beyond the declared vocabulary (metadata smaller than the model's) fail the entry, never reach the reply", async () => {
    const { head } = defaultPair();
    const small = editModel(exportReferenceHead(head), (m) => setMeta(m, Meta.VOCAB_SIZE, "1000"));
    const d = await OnnxDrafter.create(small);
    try {
      expect(d.vocabSize).toBe(1000);
      const rb = head.numTaps * head.hidden * 2;
      const batch = Array.from({ length: 16 }, (_, i) => ({
        index: i,
        slot: i,
        anchorPos: 9,
        anchorToken: i * 61,
        k: 4,
        rows: new Uint8Array(rb).fill(i * 13),
        nRows: 1,
        sample: null,
      }));
      const out = makeOutput(16, 4, false);
      await d.draft(batch, out);
      let failedCount = 0;
      for (let i = 0; i < 16; i++) {
        if (out.failed![i] === 1) failedCount++;
        else for (let j = 0; j < 4; j++) expect(out.draftIds[i * 4 + j]).toBeLessThan(1000);
      }
      expect(failedCount).toBeGreaterThan(0);
    } finally {
      await d.release();
    }
  });
});

describe("models that do not fit the signature are refused at load, naming the problem", () => {
  const cases: [string, () => Uint8Array, RegExp, string][] = [
    [
      "a wrong input name",
      () =>
        toyModel({
          edit: (m) => {
            m.graph!.input![3]!.name = "previous_token";
          },
        }),
      /unknown input "previous_token"/,
      "ONNX_DRAFTER_BAD_SIGNATURE",
    ],
    [
      "a missing input",
      () => toyModel({ edit: (m) => void m.graph!.input!.splice(4, 1) }),
      /input position is missing/,
      "ONNX_DRAFTER_BAD_SIGNATURE",
    ],
    [
      "rows as float32",
      () =>
        toyModel({
          edit: (m) => {
            m.graph!.input![0]!.type!.tensorType!.elemType = 1;
          },
        }),
      /input rows is float32, the signature needs uint16/,
      "ONNX_DRAFTER_BAD_SIGNATURE",
    ],
    [
      "logits of another vocabulary than tapwire.vocab_size",
      () => toyModel({ edit: (m) => setMeta(m, Meta.VOCAB_SIZE, "65") }),
      /output logits dim 1 is 64, expected 65/,
      "ONNX_DRAFTER_BAD_SIGNATURE",
    ],
    [
      "rows of other taps than tapwire.num_taps",
      () => toyModel({ edit: (m) => setMeta(m, Meta.NUM_TAPS, "3") }),
      /input rows dim 2 is 2, expected 3/,
      "ONNX_DRAFTER_BAD_SIGNATURE",
    ],
    [
      "no confidence output",
      () => toyModel({ edit: (m) => void m.graph!.output!.splice(1, 1) }),
      /output confidence is missing/,
      "ONNX_DRAFTER_BAD_SIGNATURE",
    ],
    [
      "no signature metadata",
      () => toyModel({ edit: (m) => setMeta(m, Meta.SIGNATURE, undefined) }),
      /tapwire.signature is missing/,
      "ONNX_DRAFTER_BAD_SIGNATURE",
    ],
    [
      "a window it cannot hold",
      () => toyModel({ edit: (m) => setMeta(m, Meta.WINDOW, "5000") }),
      /tapwire.window = 5000 outside 1..4096/,
      "ONNX_DRAFTER_BAD_SIGNATURE",
    ],
    [
      "a recorded identity its weights do not hash to",
      () => toyModel({ edit: (m) => setMeta(m, Meta.DRAFTER_IDENTITY, "00".repeat(32)) }),
      /tapwire.drafter_identity is 0{64}, but the drafter initializers hash to [0-9a-f]{64}/,
      "ONNX_DRAFTER_IDENTITY_MISMATCH",
    ],
    ["garbage bytes", () => new Uint8Array(1000).fill(0xff), /not an ONNX model/, "ONNX_DRAFTER_BAD_MODEL"],
    [
      "a graph ONNX Runtime cannot run (unknown operator)",
      () =>
        toyModel({
          edit: (m) => {
            m.graph!.node![0]!.opType = "NoSuchOp";
          },
        }),
      /ONNX Runtime refused the model/,
      "ONNX_DRAFTER_SESSION",
    ],
  ];
  for (const [what, make, msg, code] of cases) {
    it(what, async () => {
      const e = await loadError(make());
      expect(e.code).toBe(code);
      expect(e.message).toMatch(msg);
    });
  }

  it("changed weights under a recorded identity (the exported head, one byte flipped)", async () => {
    const { head } = defaultPair();
    const bytes = editModel(exportReferenceHead(head), (m) => {
      const t = m.graph!.initializer!.find((x) => x.name === "markov.out")!;
      t.rawData = Uint8Array.from(t.rawData!);
      t.rawData[5] = t.rawData[5]! ^ 1;
    });
    const e = await loadError(bytes);
    expect(e.code).toBe("ONNX_DRAFTER_IDENTITY_MISMATCH");
    expect(e.message).toContain("tapwire.markov_identity");
  });

  it("a truncated exported model", async () => {
    const { head } = defaultPair();
    const bytes = exportReferenceHead(head);
    const e = await loadError(bytes.subarray(0, bytes.length >> 1));
    expect(["ONNX_DRAFTER_BAD_MODEL", "ONNX_DRAFTER_BAD_SIGNATURE"]).toContain(e.code);
  });

  it("a file that is not there", async () => {
    const e = await loadError("/nonexistent/head.onnx");
    expect(e.code).toBe("ONNX_DRAFTER_BAD_MODEL");
    expect(e.message).toContain("/nonexistent/head.onnx");
  });

  it("the input and output names are those of the signature", () => {
    expect(Object.values(Input)).toEqual([
      "rows",
      "row_count",
      "anchor_token",
      "prev_token",
      "position",
      "state",
      "top_k",
    ]);
    expect(Object.values(Output)).toEqual(["logits", "top_logits", "top_ids", "confidence", "next_state"]);
  });
});

describe("options are validated before loading, naming the bad one", () => {
  const bad: [Record<string, unknown>, RegExp][] = [
    [{ intraOpThreads: 0 }, /intraOpThreads 0 outside 1..64/],
    [{ interOpThreads: 1.5 }, /interOpThreads 1.5 outside/],
    [{ executionProvider: "tpu" }, /executionProvider tpu is not cpu or cuda/],
    [{ graphOptimization: "max" }, /graphOptimization max is not one of/],
    [{ cudaDeviceId: 1 }, /cudaDeviceId needs executionProvider cuda/],
    [{ numSpec: 33 }, /numSpec 33 outside 1..32/],
    [{ window: 1 }, /window 1 is below the 2 rows the model reads/],
    [{ numSpec: 4 }, /numSpec 4 is above the model's tapwire.num_spec 3/],
    [{ thread: 2 }, /unknown option thread/],
  ];
  for (const [opts, msg] of bad) {
    it(JSON.stringify(opts), async () => {
      const e = await loadError(toyModel(), opts);
      expect(e.code).toBe("ONNX_DRAFTER_BAD_OPTION");
      expect(e.message).toMatch(msg);
    });
  }

  it("every graph optimisation level and 2 intra-op threads give the same drafts", async () => {
    const { head } = defaultPair();
    const bytes = exportReferenceHead(head);
    const rb = head.numTaps * head.hidden * 2;
    const batch = Array.from({ length: 5 }, (_, i) => ({
      index: i,
      slot: i,
      anchorPos: 9,
      anchorToken: i * 101,
      k: 4,
      rows: new Uint8Array(rb).map((_, t) => (t * 7 + i) & 0x3f),
      nRows: 1,
      sample: null,
    }));
    let first: number[] | null = null;
    for (const graphOptimization of ["disabled", "basic", "extended", "all"] as const) {
      const d = await OnnxDrafter.create(bytes, { graphOptimization, intraOpThreads: 2 });
      const out = makeOutput(5, 4, false);
      await d.draft(batch, out);
      await d.release();
      first ??= Array.from(out.draftIds);
      expect(Array.from(out.draftIds), graphOptimization).toEqual(first);
    }
  });

  it("cuda: drafts on a GPU host; elsewhere a clear session error naming the CUDA provider", async () => {
    const gpu = existsSync("/dev/nvidia0");
    const { head } = defaultPair();
    if (gpu) {
      const d = await OnnxDrafter.create(exportReferenceHead(head), { executionProvider: "cuda" });
      expect(d.options.executionProvider).toBe("cuda");
      await d.release();
    } else {
      const e = await loadError(exportReferenceHead(head), { executionProvider: "cuda" });
      expect(e.code).toBe("ONNX_DRAFTER_SESSION");
      expect(e.message).toMatch(/CUDA|Cuda/);
    }
  });
});
