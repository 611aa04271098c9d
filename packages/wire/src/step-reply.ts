import { checkU16, checkU32, IS_LITTLE_ENDIAN, isZero, pad4, rd16, rd32, wr16, wr32 } from "./bytes.js";
import {
  APP_HEADER_SIZE,
  FrameStatus,
  Op,
  ReplyFlag,
  STEP_REPLY_PREFIX_SIZE,
  TOP_K_MAX,
} from "./constants.js";
import { badArgument, badReply } from "./errors.js";
import { writeHeaderUnchecked } from "./header.js";

// CONTRACT 7.4: STEP reply prefix offsets (body-relative).
const R_STEP_ID = 0; // u32
const R_N_REQ = 4; // u32
const R_NUM_SPEC = 8; // u16
const R_FLAGS = 10; // u16: bit 0 MARGIN, bit 1 SAMPLED
const R_WORKER_US = 12; // u32
const KNOWN_REPLY_FLAGS = ReplyFlag.MARGIN | ReplyFlag.SAMPLED;

/** The shape a STEP reply must have (CONTRACT 7.4): its size follows from these four. */
export interface ReplyShape {
  /** Entries of the request. */
  nReq: number;
  /** `N` of the session. */
  numSpec: number;
  /** MARGIN: the session asked WANT_MARGIN. */
  margin: boolean;
  /** SAMPLED: the session is TOP32. */
  sampled: boolean;
}

/** Body offsets of every array of a STEP reply (CONTRACT 7.4); -1 for an absent array. */
export interface StepReplyLayout {
  /** `status u8[n]`. */
  status: number;
  /** `window_rows u16[n]`. */
  windowRows: number;
  /** `generation u32[n]`. */
  generation: number;
  /** `draft_ids i32[n*N]`. */
  draftIds: number;
  /** `confidence f32[n*N]`. */
  confidence: number;
  /** `margin f32[n*N]`, -1 without MARGIN. */
  margin: number;
  /** `sampled_mask u8[n*N]`, -1 without SAMPLED. */
  sampledMask: number;
  /** `support_ids i32[n*N*32]`, -1 without SAMPLED. */
  supportIds: number;
  /** `proposal_q u32[n*N*32]`, -1 without SAMPLED. */
  proposalQ: number;
  /** Total body size. */
  size: number;
}

/**
 * Typed-array views of a STEP reply body (CONTRACT 7.4). Per-position arrays are `[nReq, numSpec]`
 * row-major (entry `e` position `j` at `e * numSpec + j`); `supportIds`/`proposalQ` are
 * `[nReq, numSpec, 32]`.
 */
export interface StepReplyViews {
  /** Echo of the request's `step_id`. */
  stepId: number;
  /** Entries answered (the request's `n_req`). */
  nReq: number;
  /** `N` of the session. */
  numSpec: number;
  /** {@link ReplyFlag} bits. */
  replyFlags: number;
  /** Worker time for the STEP in microseconds. */
  workerUs: number;
  /** Request status per entry ({@link ReqStatus}). */
  status: Uint8Array;
  /** Rows held per entry (CONTRACT 7.2 step 6). */
  windowRows: Uint16Array;
  /** Echo of each entry's generation. */
  generation: Uint32Array;
  /** Draft token ids, `[nReq, numSpec]`. */
  draftIds: Int32Array;
  /** Confidence (top-1 probability) per draft position, `[nReq, numSpec]`. */
  confidence: Float32Array;
  /** Top-1 minus top-2 logit per position; present exactly when MARGIN. */
  margin: Float32Array | null;
  /** Present exactly when SAMPLED. */
  sampledMask: Uint8Array | null;
  /** Present exactly when SAMPLED. */
  supportIds: Int32Array | null;
  /** Present exactly when SAMPLED. */
  proposalQ: Uint32Array | null;
}

/** Offsets and size of a STEP reply body of the given shape (CONTRACT 7.4). */
export function stepReplyLayout(shape: ReplyShape): StepReplyLayout {
  const n = shape.nReq;
  const nn = n * shape.numSpec;
  const status = STEP_REPLY_PREFIX_SIZE;
  const windowRows = status + pad4(n);
  const generation = windowRows + pad4(2 * n);
  const draftIds = generation + 4 * n;
  const confidence = draftIds + 4 * nn;
  let o = confidence + 4 * nn;
  let margin = -1;
  if (shape.margin) {
    margin = o;
    o += 4 * nn;
  }
  let sampledMask = -1;
  let supportIds = -1;
  let proposalQ = -1;
  if (shape.sampled) {
    sampledMask = o;
    supportIds = sampledMask + pad4(nn);
    proposalQ = supportIds + 4 * TOP_K_MAX * nn;
    o = proposalQ + 4 * TOP_K_MAX * nn;
  }
  return {
    status,
    windowRows,
    generation,
    draftIds,
    confidence,
    margin,
    sampledMask,
    supportIds,
    proposalQ,
    size: o,
  };
}

/** Body size of a STEP reply of the given shape (CONTRACT 7.4). */
export function stepReplyBodySize(shape: ReplyShape): number {
  return stepReplyLayout(shape).size;
}

/**
 * The shape a STEP reply body announces in its prefix (`n_req`, `num_spec`, MARGIN, SAMPLED),
 * without checking it against anything: for tools that decode replies without knowing the request
 * (e.g. the conformance command). Clients pass their own expected shape to {@link decodeStepReply}.
 */
export function peekStepReplyShape(body: Uint8Array): ReplyShape {
  if (body.length < STEP_REPLY_PREFIX_SIZE) {
    throw badReply(`STEP reply body of ${body.length} bytes is shorter than the 16-byte prefix`);
  }
  const flags = rd16(body, R_FLAGS);
  return {
    nReq: rd32(body, R_N_REQ),
    numSpec: rd16(body, R_NUM_SPEC),
    margin: (flags & ReplyFlag.MARGIN) !== 0,
    sampled: (flags & ReplyFlag.SAMPLED) !== 0,
  };
}

function views(
  body: Uint8Array,
  l: StepReplyLayout,
  n: number,
  numSpec: number,
  flags: number,
  stepId: number,
  workerUs: number,
): StepReplyViews {
  const ab = body.buffer;
  const base = body.byteOffset;
  const nn = n * numSpec;
  const sampled = l.sampledMask >= 0;
  return {
    stepId,
    nReq: n,
    numSpec,
    replyFlags: flags,
    workerUs,
    status: new Uint8Array(ab, base + l.status, n),
    windowRows: new Uint16Array(ab, base + l.windowRows, n),
    generation: new Uint32Array(ab, base + l.generation, n),
    draftIds: new Int32Array(ab, base + l.draftIds, nn),
    confidence: new Float32Array(ab, base + l.confidence, nn),
    margin: l.margin >= 0 ? new Float32Array(ab, base + l.margin, nn) : null,
    sampledMask: sampled ? new Uint8Array(ab, base + l.sampledMask, nn) : null,
    supportIds: sampled ? new Int32Array(ab, base + l.supportIds, nn * TOP_K_MAX) : null,
    proposalQ: sampled ? new Uint32Array(ab, base + l.proposalQ, nn * TOP_K_MAX) : null,
  };
}

function requireLittleEndian(): void {
  // Typed-array views read host byte order; the wire is little-endian (CONTRACT 2).
  if (!IS_LITTLE_ENDIAN) throw badArgument("typed-array views of STEP replies need a little-endian host");
}

/**
 * Client side: checks a STEP reply body against the expected shape and returns typed-array views
 * into it (CONTRACT 7.4). Copies only when `body` is not 4-aligned in its ArrayBuffer (a
 * 4-aligned receive buffer makes the body aligned, CONTRACT 2). Checks: `n_req` and `num_spec`
 * equal the expected ones, `reply_flags` has MARGIN exactly when `expect.margin` and SAMPLED
 * exactly when `expect.sampled` and no other bit, the size is exact, and padding bytes are 0.
 * Step id, generation echoes and values are checked by {@link checkReplyValues}.
 * @throws WireError `WIRE_BAD_REPLY` naming the first problem.
 */
export function decodeStepReply(body: Uint8Array, expect: ReplyShape): StepReplyViews {
  requireLittleEndian();
  const len = body.length;
  if (len < STEP_REPLY_PREFIX_SIZE) {
    throw badReply(`STEP reply body of ${len} bytes is shorter than the 16-byte prefix`);
  }
  const stepId = rd32(body, R_STEP_ID);
  const n = rd32(body, R_N_REQ);
  const numSpec = rd16(body, R_NUM_SPEC);
  const flags = rd16(body, R_FLAGS);
  const workerUs = rd32(body, R_WORKER_US);
  if (n !== expect.nReq) throw badReply(`reply n_req ${n} != ${expect.nReq} entries sent`);
  if (numSpec !== expect.numSpec)
    throw badReply(`reply num_spec ${numSpec} != session num_spec ${expect.numSpec}`);
  if ((flags & ~KNOWN_REPLY_FLAGS) !== 0) {
    throw badReply(`reply_flags has unknown bits 0x${(flags & ~KNOWN_REPLY_FLAGS).toString(16)}`);
  }
  const hasMargin = (flags & ReplyFlag.MARGIN) !== 0;
  if (hasMargin !== expect.margin) {
    throw badReply(
      expect.margin ? "reply lacks MARGIN the session asked for" : "reply has MARGIN the session did not ask",
    );
  }
  const hasSampled = (flags & ReplyFlag.SAMPLED) !== 0;
  if (hasSampled !== expect.sampled) {
    throw badReply(
      expect.sampled
        ? "reply lacks SAMPLED in a TOP32 session (sampled ids without q)"
        : "reply has SAMPLED (q) in a greedy session",
    );
  }
  const l = stepReplyLayout(expect);
  if (len !== l.size) {
    throw badReply(
      `STEP reply body is ${len} bytes, want ${l.size} for n_req ${n}, num_spec ${numSpec}, flags 0x${flags.toString(16)}`,
    );
  }
  const nn = n * numSpec;
  if (!isZero(body, l.status + n, l.windowRows)) throw badReply("status padding is not zero");
  if (!isZero(body, l.windowRows + 2 * n, l.generation)) throw badReply("window_rows padding is not zero");
  if (hasSampled && !isZero(body, l.sampledMask + nn, l.supportIds)) {
    throw badReply("sampled_mask padding is not zero");
  }
  let b = body;
  if ((body.byteOffset & 3) !== 0) {
    b = new Uint8Array(len);
    b.set(body);
  }
  return views(b, l, n, numSpec, flags, stepId, workerUs);
}

/**
 * Worker side: starts a STEP reply in `buf` (frame offset 0): zero-fills the body, writes the
 * header (status OK, body_len) and the prefix (worker_us 0), and returns writable views of every
 * array plus `frameLength`. The drafter writes into the views; {@link setReplyWorkerUs} fills the
 * time at the end. `buf` MUST be 4-aligned in its ArrayBuffer (then the body at 24 is too).
 * @throws WireError `WIRE_BAD_ARGUMENT` when a field is out of range, `buf` is unaligned or small.
 */
export function beginStepReply(
  buf: Uint8Array,
  h: { seq: number; session: number; stepId: number } & ReplyShape,
): StepReplyViews & {
  /** Bytes of the whole reply frame in `buf` (24-byte header + body): what to send. */
  frameLength: number;
} {
  requireLittleEndian();
  checkU32("seq", h.seq);
  checkU32("session", h.session);
  checkU32("stepId", h.stepId);
  checkU32("nReq", h.nReq);
  checkU16("numSpec", h.numSpec);
  if ((buf.byteOffset & 3) !== 0)
    throw badArgument(`reply buffer byteOffset ${buf.byteOffset} is not 4-aligned`);
  const l = stepReplyLayout(h);
  const frameLength = APP_HEADER_SIZE + l.size;
  if (frameLength > buf.length) {
    throw badArgument(`STEP reply of ${frameLength} bytes does not fit a buffer of ${buf.length}`);
  }
  const flags = (h.margin ? ReplyFlag.MARGIN : 0) | (h.sampled ? ReplyFlag.SAMPLED : 0);
  buf.fill(0, APP_HEADER_SIZE, frameLength);
  writeHeaderUnchecked(buf, 0, Op.STEP, FrameStatus.OK, h.seq, h.session, l.size);
  const b = APP_HEADER_SIZE;
  wr32(buf, b + R_STEP_ID, h.stepId);
  wr32(buf, b + R_N_REQ, h.nReq);
  wr16(buf, b + R_NUM_SPEC, h.numSpec);
  wr16(buf, b + R_FLAGS, flags);
  const body = buf.subarray(APP_HEADER_SIZE, frameLength);
  const v = views(body, l, h.nReq, h.numSpec, flags, h.stepId, 0) as StepReplyViews & { frameLength: number };
  v.frameLength = frameLength;
  return v;
}

/**
 * Writes `worker_us` into the STEP reply that starts at offset 0 of `buf` (body offset 12,
 * CONTRACT 7.4). Rounded and clamped to `[0, 2^32 - 1]` (NaN writes 0).
 */
export function setReplyWorkerUs(buf: Uint8Array, workerUs: number): void {
  const v = Number.isNaN(workerUs) ? 0 : Math.min(Math.max(Math.round(workerUs), 0), 0xffffffff);
  if (buf.length < APP_HEADER_SIZE + STEP_REPLY_PREFIX_SIZE) {
    throw badArgument(`buffer of ${buf.length} bytes holds no STEP reply prefix`);
  }
  wr32(buf, APP_HEADER_SIZE + R_WORKER_US, v);
}
