import { IS_LITTLE_ENDIAN, isIntIn, rd16, rd32, viewOf, wordsOf } from "./bytes.js";
import {
  APP_HEADER_SIZE,
  ENTRY_FLAGS_MASK,
  EntryFlag,
  Op,
  REQ_ENTRY_SIZE,
  ROWS_ALIGN,
  SAMPLE_META_SIZE,
  STEP_PREFIX_SIZE,
  TOP_K_MAX,
} from "./constants.js";
import { badArgument, badFrame, WireError, WireErrorCode } from "./errors.js";
import { writeHeaderUnchecked } from "./header.js";

/**
 * Body-relative byte offsets of the STEP request prefix (CONTRACT 7.3): `step_id`, `step_flags`
 * (0), `n_req`, `n_rows`, u32 each.
 */
export const StepPrefixOffset = { STEP_ID: 0, STEP_FLAGS: 4, N_REQ: 8, N_ROWS: 12 } as const;
const P_STEP_ID = StepPrefixOffset.STEP_ID;
const P_STEP_FLAGS = StepPrefixOffset.STEP_FLAGS;
const P_N_REQ = StepPrefixOffset.N_REQ;
const P_N_ROWS = StepPrefixOffset.N_ROWS;
// CONTRACT 7.3: sample meta record offsets (8 bytes per entry, TOP32 sessions only).
const M_SEED = 0; // u32
const M_TOP_K = 4; // u16, 1..32
const M_TEMP = 6; // u16, temperature x 1000
// CONTRACT 7.3: ReqEntry offsets (32 bytes).
const E_SLOT = 0; // u32
const E_GENERATION = 4; // u32
const E_ANCHOR_POS = 8; // u32
const E_ANCHOR_TOKEN = 12; // u32
const E_ROW_START = 16; // u32
const E_N_ROWS = 20; // u32
const E_N_OUT = 24; // u16
const E_FLAGS = 26; // u16
const E_RESERVED = 28; // u32, 0

/** One entry of a STEP request (CONTRACT 7.3). All fields are u32 except `nOut`/`flags` (u16). */
export interface ReqEntry {
  /** Slot index `< max_slots`. */
  slot: number;
  /** The slot's generation (serial number, CONTRACT 7.1). */
  generation: number;
  /** Position of the anchor token; rows exist for positions `[0, anchorPos)`. */
  anchorPos: number;
  /** The anchor token id. */
  anchorToken: number;
  /** Position of the first carried row. */
  rowStart: number;
  /** Rows carried for this entry. */
  nRows: number;
  /** Drafts wanted; 0 means `N` (CONTRACT 6.3). */
  nOut: number;
  /** {@link EntryFlag} bits. */
  flags: number;
}

/** Per-entry sampling parameters of a TOP32 session (CONTRACT 7.3, 8). */
export interface SampleMeta {
  /** Sampling seed (u32). */
  seed: number;
  /** Support size, 1..32. */
  topK: number;
  /** Temperature x 1000 (u16); 0 = greedy for this entry. */
  tempMilli: number;
}

/** The session limits a STEP request is checked against (CONTRACT 6.2, 7.2, 11). */
export interface StepLimits {
  /** TOP32 session: sample meta present. */
  sampled: boolean;
  /** Bytes per row. */
  rowBytes: number;
  /** Slots of the session. */
  maxSlots: number;
  /** Rows per STEP of the session. */
  maxRowsPerStep: number;
  /** `N` of the session (n_out <= N). */
  numSpec: number;
}

/** A decoded STEP request. `rows` is a view of the body (no copy). */
export interface StepRequest {
  /** The client's step id (u32); the reply echoes it. */
  stepId: number;
  /** Always 0 (anything else is BAD_FRAME). */
  stepFlags: number;
  /** Entries in the request. */
  nReq: number;
  /** Rows carried in total (the sum of the entries' `nRows`). */
  nRows: number;
  /** The entries in request order. */
  entries: ReqEntry[];
  /** One record per entry in TOP32 sessions, else null. */
  sampleMeta: SampleMeta[] | null;
  /** The rows, `nRows * rowBytes` bytes, a view of the body (empty from `decodeStepHead`). */
  rows: Uint8Array;
  /** Body offset of the rows. */
  rowsOffset: number;
}

/**
 * Body offset of the rows of a STEP request with `nReq` entries (CONTRACT 7.3): the smallest
 * offset at or after the entries such that `24 + offset` is a multiple of 64.
 */
export function rowsOffsetFor(nReq: number, sampled: boolean): number {
  const end = STEP_PREFIX_SIZE + (sampled ? SAMPLE_META_SIZE * nReq : 0) + REQ_ENTRY_SIZE * nReq;
  return Math.ceil((APP_HEADER_SIZE + end) / ROWS_ALIGN) * ROWS_ALIGN - APP_HEADER_SIZE;
}

/** Body size of a STEP request (CONTRACT 7.3). */
export function stepRequestBodySize(nReq: number, nRows: number, rowBytes: number, sampled: boolean): number {
  return rowsOffsetFor(nReq, sampled) + nRows * rowBytes;
}

/**
 * Largest STEP body of a session (CONTRACT 7.2): `rows_offset_for(max_slots) + max_rows_per_step *
 * row_bytes`; a larger body is TOO_LARGE.
 */
export function maxStepBodySize(limits: StepLimits): number {
  return rowsOffsetFor(limits.maxSlots, limits.sampled) + limits.maxRowsPerStep * limits.rowBytes;
}

/** The 16-byte STEP request prefix as it stands (CONTRACT 7.3), read by {@link peekStepPrefix}. */
export interface StepPrefix {
  /** `step_id` (u32). */
  stepId: number;
  /** `step_flags` (u32; 0 in a valid STEP). */
  stepFlags: number;
  /** `n_req` (u32). */
  nReq: number;
  /** `n_rows` (u32). */
  nRows: number;
}

/**
 * The STEP request prefix at the start of `body`, unchecked, or null when fewer than 16 bytes
 * are present. With `n_req` a receiver that sees a STEP's first bytes knows how long its head is
 * (`rowsOffsetFor(n_req)`, CONTRACT 7.3) before anything of it is checked; {@link decodeStepHead}
 * does the checks. Never throws.
 */
export function peekStepPrefix(body: Uint8Array): StepPrefix | null {
  if (body.length < STEP_PREFIX_SIZE) return null;
  return {
    stepId: rd32(body, P_STEP_ID),
    stepFlags: rd32(body, P_STEP_FLAGS),
    nReq: rd32(body, P_N_REQ),
    nRows: rd32(body, P_N_ROWS),
  };
}

/** Parameters of {@link writeStepPrefix}. */
export interface StepPrefixParams {
  /** Header `seq` (u32). */
  seq: number;
  /** Header `session` (u32, non-zero for STEP). */
  session: number;
  /** Prefix `step_id` (u32). */
  stepId: number;
  /** The entries, in the order their rows were written. */
  entries: readonly ReqEntry[];
  /** Entries to write, the first `nEntries` of `entries` (default all). */
  nEntries?: number;
  /** One record per written entry in TOP32 sessions; null/omitted in greedy sessions. */
  sampleMeta?: readonly SampleMeta[] | null;
  /** Rows the caller wrote at `24 + rowsOffsetFor(n, sampled)`; MUST equal the sum of the entries' nRows. */
  nRows: number;
  /** Bytes per row of the session (`num_taps * hidden * 2`). */
  rowBytes: number;
}

function u32ok(v: number): boolean {
  return v >>> 0 === v;
}
function u16ok(v: number): boolean {
  return (v & 0xffff) === v && v >= 0;
}

/**
 * Writes header, prefix, sample meta, entries and zero padding of a STEP request into `buf`, in
 * front of the `nRows * rowBytes` row bytes the caller already wrote at
 * `24 + rowsOffsetFor(n, sampled)` (CONTRACT 7.3; the seed's `pack_step_prefix`). The rows are
 * not touched. Allocates nothing. Returns the frame length `24 + body_len`.
 * @throws WireError `WIRE_BAD_ARGUMENT` when a field is out of range, the entries' rows do not
 *   sum to `nRows`, sample meta is missing or short, or `buf` cannot hold the frame.
 */
export function writeStepPrefix(buf: Uint8Array, p: StepPrefixParams): number {
  const n = p.nEntries ?? p.entries.length;
  if (!isIntIn(n, 0, p.entries.length)) {
    throw badArgument(`nEntries ${n} outside 0..${p.entries.length}`);
  }
  const meta = p.sampleMeta ?? null;
  const sampled = meta !== null;
  if (sampled && meta.length < n) throw badArgument(`sampleMeta has ${meta.length} records for ${n} entries`);
  if (!u32ok(p.seq)) throw badArgument(`seq ${p.seq} is not a u32`);
  if (!u32ok(p.session)) throw badArgument(`session ${p.session} is not a u32`);
  if (!u32ok(p.stepId)) throw badArgument(`stepId ${p.stepId} is not a u32`);
  if (!u32ok(p.nRows)) throw badArgument(`nRows ${p.nRows} is not a u32`);
  if (!u32ok(p.rowBytes)) throw badArgument(`rowBytes ${p.rowBytes} is not a u32`);
  const rowsOffset = rowsOffsetFor(n, sampled);
  const bodyLen = rowsOffset + p.nRows * p.rowBytes;
  const frameLen = APP_HEADER_SIZE + bodyLen;
  if (!u32ok(bodyLen)) throw badArgument(`STEP body of ${bodyLen} bytes is above u32`);
  if (frameLen > buf.length) throw badArgument(`STEP frame of ${frameLen} bytes does not fit ${buf.length}`);

  const dv = viewOf(buf);
  const bo = buf.byteOffset;
  let o = APP_HEADER_SIZE + STEP_PREFIX_SIZE;
  if (sampled) {
    for (let i = 0; i < n; i++, o += SAMPLE_META_SIZE) {
      const m = meta[i]!;
      if (!u32ok(m.seed)) throw badArgument(`sampleMeta[${i}].seed ${m.seed} is not a u32`);
      if (!isIntIn(m.topK, 1, TOP_K_MAX)) {
        throw badArgument(`sampleMeta[${i}].topK ${m.topK} outside 1..32`);
      }
      if (!u16ok(m.tempMilli)) throw badArgument(`sampleMeta[${i}].tempMilli ${m.tempMilli} is not a u16`);
      dv.setUint32(bo + o + M_SEED, m.seed, true);
      dv.setUint16(bo + o + M_TOP_K, m.topK, true);
      dv.setUint16(bo + o + M_TEMP, m.tempMilli, true);
    }
  }
  let sumRows = 0;
  // Entries start 4-aligned in the body (CONTRACT 2); with a 4-aligned buffer on a little-endian
  // host they are written as whole u32 words, several times faster than DataView stores.
  const fast = IS_LITTLE_ENDIAN && (bo & 3) === 0;
  const w32 = fast ? wordsOf(buf) : null;
  for (let i = 0; i < n; i++, o += REQ_ENTRY_SIZE) {
    const e = p.entries[i]!;
    if (
      !(
        u32ok(e.slot) &&
        u32ok(e.generation) &&
        u32ok(e.anchorPos) &&
        u32ok(e.anchorToken) &&
        u32ok(e.rowStart) &&
        u32ok(e.nRows) &&
        u16ok(e.nOut) &&
        u16ok(e.flags)
      )
    ) {
      throw badArgument(`entry ${i} (slot ${e.slot}) has a field out of range`);
    }
    sumRows += e.nRows;
    const a = bo + o;
    if (w32 !== null) {
      const x = a >> 2;
      w32[x] = e.slot;
      w32[x + 1] = e.generation;
      w32[x + 2] = e.anchorPos;
      w32[x + 3] = e.anchorToken;
      w32[x + 4] = e.rowStart;
      w32[x + 5] = e.nRows;
      w32[x + 6] = e.nOut | (e.flags << 16); // n_out u16 then flags u16, little-endian
      w32[x + 7] = 0;
      continue;
    }
    dv.setUint32(a + E_SLOT, e.slot, true);
    dv.setUint32(a + E_GENERATION, e.generation, true);
    dv.setUint32(a + E_ANCHOR_POS, e.anchorPos, true);
    dv.setUint32(a + E_ANCHOR_TOKEN, e.anchorToken, true);
    dv.setUint32(a + E_ROW_START, e.rowStart, true);
    dv.setUint32(a + E_N_ROWS, e.nRows, true);
    dv.setUint16(a + E_N_OUT, e.nOut, true);
    dv.setUint16(a + E_FLAGS, e.flags, true);
    dv.setUint32(a + E_RESERVED, 0, true);
  }
  if (sumRows !== p.nRows) throw badArgument(`entries carry ${sumRows} rows, nRows is ${p.nRows}`);
  buf.fill(0, o, APP_HEADER_SIZE + rowsOffset);
  writeHeaderUnchecked(buf, 0, Op.STEP, 0, p.seq, p.session, bodyLen);
  const b = bo + APP_HEADER_SIZE;
  dv.setUint32(b + P_STEP_ID, p.stepId, true);
  dv.setUint32(b + P_STEP_FLAGS, 0, true);
  dv.setUint32(b + P_N_REQ, n, true);
  dv.setUint32(b + P_N_ROWS, p.nRows, true);
  return frameLen;
}

const NO_ROWS = new Uint8Array(0);

/**
 * Decodes a STEP request body on the worker and makes every structural check of CONTRACT 7.2:
 * body above the session's maximum → `WIRE_TOO_LARGE` (status TOO_LARGE); otherwise any of
 * `step_flags != 0`, `n_req > max_slots`, `n_rows > max_rows_per_step`, body size not
 * `rows_offset_for(n_req) + n_rows*row_bytes`, `top_k` outside 1..32 (TOP32), slot `>= max_slots`,
 * a slot twice, `n_out > N`, unknown flag bits, reserved != 0, RELEASE not alone,
 * `row_start + n_rows != anchor_pos` when carrying rows, `sum(n_rows) != n_rows` →
 * `WIRE_BAD_FRAME` (status BAD_FRAME) naming the first problem. `rows` is a view of `body`.
 */
export function decodeStepRequest(body: Uint8Array, limits: StepLimits): StepRequest {
  const r = decodeStepHead(body, body.length, limits);
  r.rows = body.subarray(r.rowsOffset, r.rowsOffset + r.nRows * limits.rowBytes);
  return r;
}

/**
 * {@link decodeStepRequest} for a STEP whose rows are elsewhere (received in place, CONTRACT
 * 7.2): `head` holds at least the body's first `rowsOffsetFor(n_req)` bytes and `bodyLen` is the
 * whole body's length (from the frame header). The same checks in the same order, with the same
 * codes and messages; a head too short for its entries is `WIRE_BAD_FRAME`. `rows` of the result
 * is empty.
 */
export function decodeStepHead(head: Uint8Array, bodyLen: number, limits: StepLimits): StepRequest {
  const body = head;
  const len = bodyLen;
  const max = maxStepBodySize(limits);
  if (len > max) {
    throw new WireError(
      WireErrorCode.TOO_LARGE,
      `STEP body of ${len} bytes is above the session maximum ${max} (max_slots ${limits.maxSlots}, max_rows_per_step ${limits.maxRowsPerStep}, row_bytes ${limits.rowBytes})`,
    );
  }
  if (len < STEP_PREFIX_SIZE || body.length < STEP_PREFIX_SIZE) {
    throw badFrame(`STEP body of ${len} bytes is shorter than the 16-byte prefix`);
  }
  const stepId = rd32(body, P_STEP_ID);
  const stepFlags = rd32(body, P_STEP_FLAGS);
  const nReq = rd32(body, P_N_REQ);
  const nRows = rd32(body, P_N_ROWS);
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
  if (body.length < rowsOffset) throw badFrame(`STEP head of ${body.length} bytes misses its entries`);
  let o = STEP_PREFIX_SIZE;
  let sampleMeta: SampleMeta[] | null = null;
  if (sampled) {
    sampleMeta = new Array<SampleMeta>(nReq);
    for (let i = 0; i < nReq; i++, o += SAMPLE_META_SIZE) {
      const topK = rd16(body, o + M_TOP_K);
      if (topK < 1 || topK > TOP_K_MAX) throw badFrame(`entry ${i}: top_k ${topK} outside 1..32`);
      sampleMeta[i] = { seed: rd32(body, o + M_SEED), topK, tempMilli: rd16(body, o + M_TEMP) };
    }
  }
  const entries = new Array<ReqEntry>(nReq);
  const seen = new Set<number>();
  let sumRows = 0;
  for (let i = 0; i < nReq; i++, o += REQ_ENTRY_SIZE) {
    const e: ReqEntry = {
      slot: rd32(body, o + E_SLOT),
      generation: rd32(body, o + E_GENERATION),
      anchorPos: rd32(body, o + E_ANCHOR_POS),
      anchorToken: rd32(body, o + E_ANCHOR_TOKEN),
      rowStart: rd32(body, o + E_ROW_START),
      nRows: rd32(body, o + E_N_ROWS),
      nOut: rd16(body, o + E_N_OUT),
      flags: rd16(body, o + E_FLAGS),
    };
    const where = `entry ${i} (slot ${e.slot})`;
    if (e.slot >= limits.maxSlots) throw badFrame(`${where}: slot >= max_slots ${limits.maxSlots}`);
    if (seen.has(e.slot)) throw badFrame(`${where}: slot appears twice`);
    seen.add(e.slot);
    if (e.nOut > limits.numSpec) throw badFrame(`${where}: n_out ${e.nOut} > num_spec ${limits.numSpec}`);
    if ((e.flags & ~ENTRY_FLAGS_MASK) !== 0) {
      throw badFrame(`${where}: unknown flag bits 0x${(e.flags & ~ENTRY_FLAGS_MASK).toString(16)}`);
    }
    const reserved = rd32(body, o + E_RESERVED);
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
  return {
    stepId,
    stepFlags,
    nReq,
    nRows,
    entries,
    sampleMeta,
    rows: NO_ROWS,
    rowsOffset,
  };
}
