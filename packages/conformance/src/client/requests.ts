/**
 * The client mode's request checks: a rank-0 client's HELLO (CONTRACT 6.1) and STEP (7.2, 7.3)
 * parsed and checked by the tester itself, field by field from the tables.
 */
import type { EntryFields, HelloFields } from "../frames.js";
import { rowsOffsetFor, u16, u32 } from "../frames.js";

/** A parsed HELLO body; null when not 160 bytes. */
export function parseHello(b: Uint8Array): HelloFields | null {
  if (b.length !== 160) return null;
  let end = b.subarray(128, 160).indexOf(0);
  if (end < 0) end = 32;
  return {
    drafterIdentity: b.slice(0, 32),
    markovIdentity: b.slice(32, 64),
    window: u16(b, 64),
    numSpec: u16(b, 66),
    sampleMode: b[68]!,
    rowDtype: b[69]!,
    numTaps: u16(b, 70),
    hidden: u32(b, 72),
    rowBytes: u32(b, 76),
    vocabSize: u32(b, 80),
    maxSlots: u32(b, 84),
    maxRowsPerStep: u32(b, 88),
    helloFlags: u32(b, 92),
    auth: b.slice(96, 128),
    clientName: Buffer.from(b.subarray(128, 128 + end)).toString("utf8"),
  };
}

/** A parsed STEP request. */
export interface StepRequestFields {
  stepId: number;
  stepFlags: number;
  nReq: number;
  nRows: number;
  entries: EntryFields[];
  /** Byte offset of each entry's first row in the body. */
  rowOffsets: number[];
}

/** Session shape a STEP is checked against. */
export interface SessionShape {
  sampled: boolean;
  maxSlots: number;
  maxRowsPerStep: number;
  rowBytes: number;
  numSpec: number;
}

/**
 * Parses a STEP body and runs every structural check of CONTRACT 7.2 on it; returns the first
 * problem as a string (what a worker would answer BAD_FRAME or TOO_LARGE for).
 */
export function parseStep(b: Uint8Array, s: SessionShape): StepRequestFields | string {
  if (b.length < 16) return `CONTRACT 7.3: STEP body of ${b.length} bytes is shorter than its prefix`;
  const stepFlags = u32(b, 4);
  const nReq = u32(b, 8);
  const nRows = u32(b, 12);
  if (nReq > s.maxSlots) return `CONTRACT 7.2: n_req ${nReq} > max_slots ${s.maxSlots}`;
  if (nRows > s.maxRowsPerStep)
    return `CONTRACT 7.2: n_rows ${nRows} > max_rows_per_step ${s.maxRowsPerStep}`;
  const off = rowsOffsetFor(nReq, s.sampled);
  if (b.length !== off + nRows * s.rowBytes)
    return `CONTRACT 7.3: STEP body is ${b.length} bytes; n_req ${nReq} and n_rows ${nRows} make it ${off + nRows * s.rowBytes}`;
  if (stepFlags !== 0) return `CONTRACT 7.2: step_flags ${stepFlags} is not 0`;
  const entries: EntryFields[] = [];
  const rowOffsets: number[] = [];
  const seen = new Set<number>();
  let o = 16 + (s.sampled ? 8 * nReq : 0);
  let sum = 0;
  for (let i = 0; i < nReq; i++) {
    const e: EntryFields = {
      slot: u32(b, o),
      generation: u32(b, o + 4),
      anchorPos: u32(b, o + 8),
      anchorToken: u32(b, o + 12),
      rowStart: u32(b, o + 16),
      nRows: u32(b, o + 20),
      nOut: u16(b, o + 24),
      flags: u16(b, o + 26),
      reserved: u32(b, o + 28),
    };
    if (s.sampled) {
      const m = 16 + 8 * i;
      e.seed = u32(b, m);
      e.topK = u16(b, m + 4);
      e.tempMilli = u16(b, m + 6);
      if (e.topK < 1 || e.topK > 32) return `CONTRACT 7.2: slot ${e.slot} top_k ${e.topK} outside 1..32`;
    }
    o += 32;
    if (e.slot >= s.maxSlots) return `CONTRACT 7.2: slot ${e.slot} >= max_slots ${s.maxSlots}`;
    if (seen.has(e.slot)) return `CONTRACT 7.2: slot ${e.slot} twice`;
    seen.add(e.slot);
    if (e.nOut > s.numSpec) return `CONTRACT 7.2: slot ${e.slot} n_out ${e.nOut} > N ${s.numSpec}`;
    if (e.nRows > 0 && e.rowStart + e.nRows !== e.anchorPos)
      return `CONTRACT 7.2: slot ${e.slot} row_start ${e.rowStart} + n_rows ${e.nRows} != anchor_pos ${e.anchorPos}`;
    if ((e.flags & ~7) !== 0) return `CONTRACT 7.2: slot ${e.slot} flags ${e.flags} has unknown bits`;
    if (e.reserved !== 0) return `CONTRACT 7.2: slot ${e.slot} reserved ${e.reserved} is not 0`;
    if ((e.flags & 4) !== 0 && (e.flags !== 4 || e.nRows !== 0))
      return `CONTRACT 7.2: slot ${e.slot} RELEASE does not come alone (flags ${e.flags}, n_rows ${e.nRows})`;
    rowOffsets.push(off + sum * s.rowBytes);
    sum += e.nRows;
    entries.push(e);
  }
  if (sum !== nRows) return `CONTRACT 7.2: sum of entries' n_rows ${sum} != n_rows ${nRows}`;
  return { stepId: u32(b, 0), stepFlags, nReq, nRows, entries, rowOffsets };
}
