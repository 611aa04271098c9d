/**
 * The STEP request checks of `decodeStepRequest` (@tapwire/wire, CONTRACT 7.2/7.3) for a STEP
 * whose rows were received in place: only the head (prefix, sample meta, entries, padding) is
 * at hand, the body length comes from the frame header. Same checks, same order, same messages
 * and statuses; test/step-head.test.ts checks it against `decodeStepRequest` on random bodies.
 */
import type { ReqEntry, SampleMeta, StepLimits, StepRequest } from "@tapwire/wire";
import {
  ENTRY_FLAGS_MASK,
  EntryFlag,
  maxStepBodySize,
  REQ_ENTRY_SIZE,
  rowsOffsetFor,
  SAMPLE_META_SIZE,
  STEP_PREFIX_SIZE,
  TOP_K_MAX,
  WireError,
  WireErrorCode,
} from "@tapwire/wire";

function rd16(b: Uint8Array, o: number): number {
  return b[o]! | (b[o + 1]! << 8);
}

function rd32(b: Uint8Array, o: number): number {
  return (b[o]! | (b[o + 1]! << 8) | (b[o + 2]! << 16) | (b[o + 3]! << 24)) >>> 0;
}

function badFrame(message: string): WireError {
  return new WireError(WireErrorCode.BAD_FRAME, message);
}

const NO_ROWS = new Uint8Array(0);

/**
 * Decodes the head of a STEP body of `bodyLen` bytes: `head` holds at least its first
 * `rowsOffsetFor(n_req)` bytes (fewer only when the checks fail before they are needed, which
 * then throws like a short body). `rows` of the result is empty: the rows are elsewhere.
 * @throws WireError exactly as `decodeStepRequest` would for the whole body.
 */
export function decodeStepHead(head: Uint8Array, bodyLen: number, limits: StepLimits): StepRequest {
  const len = bodyLen;
  const max = maxStepBodySize(limits);
  if (len > max) {
    throw new WireError(
      WireErrorCode.TOO_LARGE,
      `STEP body of ${len} bytes is above the session maximum ${max} (max_slots ${limits.maxSlots}, max_rows_per_step ${limits.maxRowsPerStep}, row_bytes ${limits.rowBytes})`,
    );
  }
  if (len < STEP_PREFIX_SIZE || head.length < STEP_PREFIX_SIZE) {
    throw badFrame(`STEP body of ${len} bytes is shorter than the 16-byte prefix`);
  }
  const stepId = rd32(head, 0);
  const stepFlags = rd32(head, 4);
  const nReq = rd32(head, 8);
  const nRows = rd32(head, 12);
  if (stepFlags !== 0) throw badFrame(`step_flags is 0x${stepFlags.toString(16)}, not 0`);
  if (nReq > limits.maxSlots) throw badFrame(`n_req ${nReq} > max_slots ${limits.maxSlots}`);
  if (nRows > limits.maxRowsPerStep) {
    throw badFrame(`n_rows ${nRows} > max_rows_per_step ${limits.maxRowsPerStep}`);
  }
  const sampled = limits.sampled;
  const rowsOffset = rowsOffsetFor(nReq, sampled);
  const want = rowsOffset + nRows * limits.rowBytes;
  if (len !== want) {
    throw badFrame(
      `STEP body is ${len} bytes, want ${want} for n_req ${nReq}, n_rows ${nRows}, row_bytes ${limits.rowBytes}${sampled ? " (TOP32)" : ""}`,
    );
  }
  if (head.length < rowsOffset) throw badFrame(`STEP head of ${head.length} bytes misses its entries`);
  let o = STEP_PREFIX_SIZE;
  let sampleMeta: SampleMeta[] | null = null;
  if (sampled) {
    sampleMeta = new Array<SampleMeta>(nReq);
    for (let i = 0; i < nReq; i++, o += SAMPLE_META_SIZE) {
      const topK = rd16(head, o + 4);
      if (topK < 1 || topK > TOP_K_MAX) throw badFrame(`entry ${i}: top_k ${topK} outside 1..32`);
      sampleMeta[i] = { seed: rd32(head, o), topK, tempMilli: rd16(head, o + 6) };
    }
  }
  const entries = new Array<ReqEntry>(nReq);
  const seen = new Set<number>();
  let sumRows = 0;
  for (let i = 0; i < nReq; i++, o += REQ_ENTRY_SIZE) {
    const e: ReqEntry = {
      slot: rd32(head, o),
      generation: rd32(head, o + 4),
      anchorPos: rd32(head, o + 8),
      anchorToken: rd32(head, o + 12),
      rowStart: rd32(head, o + 16),
      nRows: rd32(head, o + 20),
      nOut: rd16(head, o + 24),
      flags: rd16(head, o + 26),
    };
    const where = `entry ${i} (slot ${e.slot})`;
    if (e.slot >= limits.maxSlots) throw badFrame(`${where}: slot >= max_slots ${limits.maxSlots}`);
    if (seen.has(e.slot)) throw badFrame(`${where}: slot appears twice`);
    seen.add(e.slot);
    if (e.nOut > limits.numSpec) throw badFrame(`${where}: n_out ${e.nOut} > num_spec ${limits.numSpec}`);
    if ((e.flags & ~ENTRY_FLAGS_MASK) !== 0) {
      throw badFrame(`${where}: unknown flag bits 0x${(e.flags & ~ENTRY_FLAGS_MASK).toString(16)}`);
    }
    const reserved = rd32(head, o + 28);
    if (reserved !== 0) throw badFrame(`${where}: reserved is ${reserved}, not 0`);
    if ((e.flags & EntryFlag.RELEASE) !== 0 && (e.flags !== EntryFlag.RELEASE || e.nRows !== 0)) {
      throw badFrame(
        `${where}: RELEASE must come alone (flags 0x${e.flags.toString(16)}, n_rows ${e.nRows})`,
      );
    }
    if (e.nRows > 0 && e.rowStart + e.nRows !== e.anchorPos) {
      throw badFrame(`${where}: row_start ${e.rowStart} + n_rows ${e.nRows} != anchor_pos ${e.anchorPos}`);
    }
    sumRows += e.nRows;
    entries[i] = e;
  }
  if (sumRows !== nRows) throw badFrame(`entries carry ${sumRows} rows, n_rows is ${nRows}`);
  return { stepId, stepFlags, nReq, nRows, entries, sampleMeta, rows: NO_ROWS, rowsOffset };
}
