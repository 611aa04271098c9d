import { readFileSync } from "node:fs";
import { expect } from "vitest";
import {
  beginStepReply,
  DYADIC_ONE,
  EntryFlag,
  type Hello,
  type HelloReply,
  type ReplyContext,
  type ReqEntry,
  ReqStatus,
  type SampleMeta,
  type StepReplyViews,
  TOP_K_MAX,
  WireError,
  type WireErrorCode,
} from "../src/index.js";

export const FIXTURE = new URL("./fixtures/wire-v1.json", import.meta.url);

export interface FixtureCase {
  name: string;
  hex: string;
  fields: Record<string, unknown>;
  valid: boolean;
  expect?: string;
}

export function loadCases(): FixtureCase[] {
  return (JSON.parse(readFileSync(FIXTURE, "utf8")) as { cases: FixtureCase[] }).cases;
}

/** Runs `fn`, asserts it throws a WireError with `code` whose message contains `text`; returns it. */
export function expectWireError(fn: () => unknown, code: WireErrorCode, text?: string | RegExp): WireError {
  let err: unknown;
  try {
    fn();
  } catch (e) {
    err = e;
  }
  expect(err, "expected a WireError").toBeInstanceOf(WireError);
  const we = err as WireError;
  expect(we.code, we.message).toBe(code);
  if (text !== undefined) {
    if (typeof text === "string") expect(we.message).toContain(text);
    else expect(we.message).toMatch(text);
  }
  return we;
}

export function bytes(n: number, fill: number): Uint8Array {
  return new Uint8Array(n).fill(fill);
}

export function sampleHello(over: Partial<Hello> = {}): Hello {
  return {
    drafterIdentity: bytes(32, 0xaa),
    markovIdentity: bytes(32, 0xbb),
    window: 16,
    numSpec: 4,
    sampleMode: 0,
    rowDtype: 1,
    numTaps: 3,
    hidden: 64,
    rowBytes: 384,
    vocabSize: 1000,
    maxSlots: 64,
    maxRowsPerStep: 256,
    helloFlags: 1,
    auth: bytes(32, 0),
    clientName: "rank0",
    ...over,
  };
}

export function sampleHelloReply(over: Partial<HelloReply> = {}): HelloReply {
  return {
    drafterIdentity: bytes(32, 0xaa),
    markovIdentity: bytes(32, 0xbb),
    window: 16,
    numSpec: 4,
    capabilities: 7,
    maxSlots: 128,
    maxRowsPerStep: 512,
    vocabSize: 1000,
    rowBytes: 384,
    windowsKept: 0,
    workerName: "worker",
    ...over,
  };
}

export function entry(over: Partial<ReqEntry> = {}): ReqEntry {
  return {
    slot: 0,
    generation: 1,
    anchorPos: 10,
    anchorToken: 5,
    rowStart: 9,
    nRows: 1,
    nOut: 0,
    flags: EntryFlag.NEED_DRAFT,
    ...over,
  };
}

/** A 4-aligned buffer (a fresh ArrayBuffer). */
export function alignedBuf(n: number): Uint8Array {
  return new Uint8Array(new ArrayBuffer(n));
}

export interface ValidReply {
  buf: Uint8Array;
  frameLength: number;
  body: Uint8Array;
  views: StepReplyViews;
  ctx: ReplyContext;
}

/**
 * A valid STEP reply for `n` entries with num_spec `N` (slots 0..n-1, anchor_pos 40, W 16): every
 * entry NEED_DRAFT with status OK, n_out cycling 0..N, drafted values filled; with `sampled`
 * every entry samples (temp 700) with top_k cycling 1..32.
 */
export function validReply(
  n: number,
  N: number,
  opts: { margin?: boolean; sampled?: boolean } = {},
): ValidReply {
  const margin = opts.margin ?? true;
  const sampled = opts.sampled ?? false;
  const V = 1000;
  const W = 16;
  const entries: ReqEntry[] = [];
  const meta: SampleMeta[] = [];
  for (let i = 0; i < n; i++) {
    entries.push(entry({ slot: i, generation: 1000 + i, anchorPos: 40, rowStart: 39, nOut: i % (N + 1) }));
    meta.push({ seed: i, topK: (i % TOP_K_MAX) + 1, tempMilli: 700 });
  }
  const size = 24 + 16 + 4 * n + 4 * n * N * 3 + 4 * n + 4 * n + 4 * n * N * 2 * TOP_K_MAX + 1024;
  const buf = alignedBuf(size);
  const v = beginStepReply(buf, { seq: 9, session: 77, stepId: 5, nReq: n, numSpec: N, margin, sampled });
  for (let i = 0; i < n; i++) {
    const e = entries[i]!;
    v.status[i] = ReqStatus.OK;
    v.windowRows[i] = W;
    v.generation[i] = e.generation;
    const k = e.nOut === 0 ? N : Math.min(e.nOut, N);
    for (let j = 0; j < k; j++) {
      const p = i * N + j;
      v.draftIds[p] = (i * 31 + j * 7) % V;
      v.confidence[p] = 0.5;
      if (v.margin) v.margin[p] = 1.25;
      if (sampled && v.sampledMask && v.supportIds && v.proposalQ) {
        const topK = meta[i]!.topK;
        v.sampledMask[p] = 1;
        let rest = DYADIC_ONE;
        for (let t = 0; t < topK; t++) {
          v.supportIds[p * TOP_K_MAX + t] = (v.draftIds[p]! + t) % V;
          const q = t === topK - 1 ? rest : Math.floor(DYADIC_ONE / topK);
          v.proposalQ[p * TOP_K_MAX + t] = q;
          rest -= q;
        }
      }
    }
  }
  return {
    buf,
    frameLength: v.frameLength,
    body: buf.subarray(24, v.frameLength),
    views: v,
    ctx: { stepId: 5, vocabSize: V, window: W, numSpec: N, entries, sampleMeta: sampled ? meta : null },
  };
}
