import { createHmac, timingSafeEqual } from "node:crypto";
import { checkU8, checkU16, checkU32, rd16, rd32, toHex, wr16, wr32 } from "./bytes.js";
import {
  AUTH_SIZE,
  Capability,
  HELLO_BODY_SIZE,
  HELLO_FLAGS_MASK,
  HELLO_REPLY_BODY_SIZE,
  HelloFlag,
  IDENTITY_SIZE,
  MAX_NUM_SPEC,
  MAX_WINDOW,
  NAME_SIZE,
  RowDtype,
  SampleMode,
  TOP_K_MAX,
} from "./constants.js";
import { badArgument, badFrame, badReply } from "./errors.js";

// CONTRACT 6.1: HELLO request body offsets (160 bytes).
const H_DRAFTER = 0; // drafter_identity, 32 bytes
const H_MARKOV = 32; // markov_identity, 32 bytes
const H_WINDOW = 64; // u16
const H_NUM_SPEC = 66; // u16
const H_SAMPLE_MODE = 68; // u8
const H_ROW_DTYPE = 69; // u8
const H_NUM_TAPS = 70; // u16
const H_HIDDEN = 72; // u32
const H_ROW_BYTES = 76; // u32
const H_VOCAB = 80; // u32
const H_MAX_SLOTS = 84; // u32
const H_MAX_ROWS = 88; // u32
const H_FLAGS = 92; // u32
const H_AUTH = 96; // 32 bytes
const H_NAME = 128; // 32 bytes, UTF-8, NUL-padded

// CONTRACT 6.1: HelloReply body offsets (128 bytes).
const R_DRAFTER = 0;
const R_MARKOV = 32;
const R_WINDOW = 64; // u16
const R_NUM_SPEC = 66; // u16
const R_CAPS = 68; // u32
const R_MAX_SLOTS = 72; // u32
const R_MAX_ROWS = 76; // u32
const R_VOCAB = 80; // u32
const R_ROW_BYTES = 84; // u32
const R_WINDOWS_KEPT = 88; // u32
const R_RESERVED = 92; // u32, 0
const R_NAME = 96; // 32 bytes

/** A HELLO request body (CONTRACT 6.1). Byte strings are 32 bytes. */
export interface Hello {
  /** SHA-256 of the drafter's weights (32 bytes). */
  drafterIdentity: Uint8Array;
  /** SHA-256 of the Markov head's weights (32 bytes). */
  markovIdentity: Uint8Array;
  /** Window `W` in rows (1..4096). */
  window: number;
  /** Drafts per entry `N` (1..32). */
  numSpec: number;
  /** {@link SampleMode}. */
  sampleMode: number;
  /** {@link RowDtype}; 1 = bf16. */
  rowDtype: number;
  /** Tap vectors per row. */
  numTaps: number;
  /** bf16 values per tap vector. */
  hidden: number;
  /** Bytes per row; MUST be `numTaps * hidden * 2`. */
  rowBytes: number;
  /** Vocabulary size of the target. */
  vocabSize: number;
  /** Slots the session needs. */
  maxSlots: number;
  /** Rows per STEP the session needs. */
  maxRowsPerStep: number;
  /** {@link HelloFlag} bits. */
  helloFlags: number;
  /** 32 zero bytes (or empty when encoding), or {@link helloAuth}. */
  auth: Uint8Array;
  /** Client name, at most 32 bytes of UTF-8 without NUL. */
  clientName: string;
}

/** A HelloReply body (CONTRACT 6.1), sent with OK, IDENTITY_MISMATCH and CONFIG_MISMATCH. */
export interface HelloReply {
  /** The worker's drafter identity (32 bytes). */
  drafterIdentity: Uint8Array;
  /** The worker's Markov identity (32 bytes). */
  markovIdentity: Uint8Array;
  /** The worker's window. */
  window: number;
  /** The worker's num_spec. */
  numSpec: number;
  /** {@link Capability} bits. */
  capabilities: number;
  /** The worker's slot limit. */
  maxSlots: number;
  /** The worker's rows-per-STEP limit. */
  maxRowsPerStep: number;
  /** The worker's vocabulary size. */
  vocabSize: number;
  /** The worker's row size in bytes. */
  rowBytes: number;
  /** Slot windows kept from before this HELLO (0 for a new session). */
  windowsKept: number;
  /** Worker name, at most 32 bytes of UTF-8 without NUL. */
  workerName: string;
}

const utf8 = new TextEncoder();
const utf8Decoder = new TextDecoder("utf-8");

function writeBytes(what: string, out: Uint8Array, o: number, v: Uint8Array, allowEmpty: boolean): void {
  if (v.length === IDENTITY_SIZE) out.set(v, o);
  else if (allowEmpty && v.length === 0) out.fill(0, o, o + IDENTITY_SIZE);
  else throw badArgument(`${what} has ${v.length} bytes, want 32`);
}

function writeName(what: string, out: Uint8Array, o: number, name: string): void {
  if (name.includes("\0")) throw badArgument(`${what} contains a NUL character`);
  const bytes = utf8.encode(name);
  if (bytes.length > NAME_SIZE) throw badArgument(`${what} is ${bytes.length} bytes of UTF-8, above 32`);
  out.set(bytes, o);
  out.fill(0, o + bytes.length, o + NAME_SIZE);
}

function readName(b: Uint8Array, o: number): string {
  let end = o;
  while (end < o + NAME_SIZE && b[end] !== 0) end++;
  return utf8Decoder.decode(b.subarray(o, end));
}

/** An integer field of a fixed-layout body: its name (in the object and in errors), width in bits, offset. */
type IntField<T> = readonly [name: keyof T & string, bits: 8 | 16 | 32, offset: number];

/** HELLO's integer fields (CONTRACT 6.1), in layout order. */
const HELLO_INTS: ReadonlyArray<IntField<Hello>> = [
  ["window", 16, H_WINDOW],
  ["numSpec", 16, H_NUM_SPEC],
  ["sampleMode", 8, H_SAMPLE_MODE],
  ["rowDtype", 8, H_ROW_DTYPE],
  ["numTaps", 16, H_NUM_TAPS],
  ["hidden", 32, H_HIDDEN],
  ["rowBytes", 32, H_ROW_BYTES],
  ["vocabSize", 32, H_VOCAB],
  ["maxSlots", 32, H_MAX_SLOTS],
  ["maxRowsPerStep", 32, H_MAX_ROWS],
  ["helloFlags", 32, H_FLAGS],
];

/** HelloReply's integer fields (CONTRACT 6.1), in layout order (the reserved u32 is written as 0). */
const REPLY_INTS: ReadonlyArray<IntField<HelloReply>> = [
  ["window", 16, R_WINDOW],
  ["numSpec", 16, R_NUM_SPEC],
  ["capabilities", 32, R_CAPS],
  ["maxSlots", 32, R_MAX_SLOTS],
  ["maxRowsPerStep", 32, R_MAX_ROWS],
  ["vocabSize", 32, R_VOCAB],
  ["rowBytes", 32, R_ROW_BYTES],
  ["windowsKept", 32, R_WINDOWS_KEPT],
];

/** Range-checks every integer field of `v`, in order (`WIRE_BAD_ARGUMENT` naming the first). */
function checkInts<T>(v: T, fields: ReadonlyArray<IntField<T>>): void {
  for (const [name, bits] of fields) {
    const x = v[name] as unknown as number;
    if (bits === 8) checkU8(name, x);
    else if (bits === 16) checkU16(name, x);
    else checkU32(name, x);
  }
}

/** Writes every integer field of `v` little-endian at `o` + its offset (checked already). */
function writeInts<T>(b: Uint8Array, o: number, v: T, fields: ReadonlyArray<IntField<T>>): void {
  for (const [name, bits, offset] of fields) {
    const x = v[name] as unknown as number;
    if (bits === 8) b[o + offset] = x;
    else if (bits === 16) wr16(b, o + offset, x);
    else wr32(b, o + offset, x);
  }
}

function target(out: Uint8Array | undefined, offset: number, size: number): Uint8Array {
  if (out === undefined) return new Uint8Array(size);
  if (!Number.isInteger(offset) || offset < 0 || offset + size > out.length) {
    throw badArgument(`a ${size}-byte body at offset ${offset} does not fit a buffer of ${out.length} bytes`);
  }
  return out;
}

/**
 * Encodes a HELLO body (160 bytes, CONTRACT 6.1) into `out` at `offset`, or into a new buffer.
 * Returns the 160-byte body (a view of `out` when given).
 * @throws WireError `WIRE_BAD_ARGUMENT` naming the first field out of range.
 */
export function encodeHello(h: Hello, out?: Uint8Array, offset = 0): Uint8Array {
  const b = target(out, offset, HELLO_BODY_SIZE);
  const o = out === undefined ? 0 : offset;
  checkInts(h, HELLO_INTS);
  writeBytes("drafterIdentity", b, o + H_DRAFTER, h.drafterIdentity, false);
  writeBytes("markovIdentity", b, o + H_MARKOV, h.markovIdentity, false);
  writeBytes("auth", b, o + H_AUTH, h.auth, true);
  writeName("clientName", b, o + H_NAME, h.clientName);
  writeInts(b, o, h, HELLO_INTS);
  return b.subarray(o, o + HELLO_BODY_SIZE);
}

/**
 * Decodes a HELLO body. Only the size is checked here (`WIRE_BAD_FRAME` unless exactly 160
 * bytes, CONTRACT 6.1); the value checks (CONFIG_MISMATCH, ...) are the worker's, see
 * {@link checkHelloConfig}. Byte strings are copies; names stop at the first NUL.
 */
export function decodeHello(body: Uint8Array): Hello {
  if (body.length !== HELLO_BODY_SIZE) {
    throw badFrame(`HELLO body is ${body.length} bytes, want ${HELLO_BODY_SIZE}`);
  }
  return {
    drafterIdentity: body.slice(H_DRAFTER, H_DRAFTER + IDENTITY_SIZE),
    markovIdentity: body.slice(H_MARKOV, H_MARKOV + IDENTITY_SIZE),
    window: rd16(body, H_WINDOW),
    numSpec: rd16(body, H_NUM_SPEC),
    sampleMode: body[H_SAMPLE_MODE]!,
    rowDtype: body[H_ROW_DTYPE]!,
    numTaps: rd16(body, H_NUM_TAPS),
    hidden: rd32(body, H_HIDDEN),
    rowBytes: rd32(body, H_ROW_BYTES),
    vocabSize: rd32(body, H_VOCAB),
    maxSlots: rd32(body, H_MAX_SLOTS),
    maxRowsPerStep: rd32(body, H_MAX_ROWS),
    helloFlags: rd32(body, H_FLAGS),
    auth: body.slice(H_AUTH, H_AUTH + AUTH_SIZE),
    clientName: readName(body, H_NAME),
  };
}

/**
 * Encodes a HelloReply body (128 bytes, CONTRACT 6.1) into `out` at `offset`, or into a new
 * buffer; returns the body.
 * @throws WireError `WIRE_BAD_ARGUMENT` naming the first field out of range.
 */
export function encodeHelloReply(r: HelloReply, out?: Uint8Array, offset = 0): Uint8Array {
  const b = target(out, offset, HELLO_REPLY_BODY_SIZE);
  const o = out === undefined ? 0 : offset;
  checkInts(r, REPLY_INTS);
  writeBytes("drafterIdentity", b, o + R_DRAFTER, r.drafterIdentity, false);
  writeBytes("markovIdentity", b, o + R_MARKOV, r.markovIdentity, false);
  writeName("workerName", b, o + R_NAME, r.workerName);
  writeInts(b, o, r, REPLY_INTS);
  wr32(b, o + R_RESERVED, 0);
  return b.subarray(o, o + HELLO_REPLY_BODY_SIZE);
}

/**
 * Decodes a HelloReply body (client side): exactly 128 bytes and reserved 0, else
 * `WIRE_BAD_REPLY`.
 */
export function decodeHelloReply(body: Uint8Array): HelloReply {
  if (body.length !== HELLO_REPLY_BODY_SIZE) {
    throw badReply(`HelloReply body is ${body.length} bytes, want ${HELLO_REPLY_BODY_SIZE}`);
  }
  const reserved = rd32(body, R_RESERVED);
  if (reserved !== 0) throw badReply(`HelloReply reserved field is ${reserved}, not 0`);
  return {
    drafterIdentity: body.slice(R_DRAFTER, R_DRAFTER + IDENTITY_SIZE),
    markovIdentity: body.slice(R_MARKOV, R_MARKOV + IDENTITY_SIZE),
    window: rd16(body, R_WINDOW),
    numSpec: rd16(body, R_NUM_SPEC),
    capabilities: rd32(body, R_CAPS),
    maxSlots: rd32(body, R_MAX_SLOTS),
    maxRowsPerStep: rd32(body, R_MAX_ROWS),
    vocabSize: rd32(body, R_VOCAB),
    rowBytes: rd32(body, R_ROW_BYTES),
    windowsKept: rd32(body, R_WINDOWS_KEPT),
    workerName: readName(body, R_NAME),
  };
}

const AUTH_LABEL = utf8.encode("tapwire/hello");

/**
 * The HELLO auth field (CONTRACT 6.1): HMAC-SHA256 with key = the shared token over
 * `"tapwire/hello" ‖ session u32 LE ‖ seq u32 LE`. Returns 32 bytes.
 */
export function helloAuth(token: string | Uint8Array, session: number, seq: number): Uint8Array {
  checkU32("session", session);
  checkU32("seq", seq);
  const msg = new Uint8Array(AUTH_LABEL.length + 8);
  msg.set(AUTH_LABEL, 0);
  wr32(msg, AUTH_LABEL.length, session);
  wr32(msg, AUTH_LABEL.length + 4, seq);
  const digest = createHmac("sha256", token).update(msg).digest();
  return new Uint8Array(digest.buffer, digest.byteOffset, digest.length);
}

/** True when `auth` is the {@link helloAuth} of `token`, `session` and `seq` (constant-time compare). */
export function verifyHelloAuth(
  token: string | Uint8Array,
  session: number,
  seq: number,
  auth: Uint8Array,
): boolean {
  if (auth.length !== AUTH_SIZE) return false;
  return timingSafeEqual(helloAuth(token, session, seq), auth);
}

function eqBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/**
 * The client checks of an OK HelloReply (CONTRACT 6.1): identities equal; window and num_spec
 * equal; TOP32 capability when sampling; TAPS_BF16; MARGIN when WANT_MARGIN; `maxSlots` and
 * `maxRowsPerStep` at least what was asked; vocab_size and row_bytes equal. Returns null when
 * all hold, else a reason that lists every difference (identities in hex), for the client's
 * `disabled_reason` (CONTRACT 9.3).
 */
export function checkHelloReply(hello: Hello, reply: HelloReply): string | null {
  const p: string[] = [];
  if (!eqBytes(hello.drafterIdentity, reply.drafterIdentity)) {
    p.push(`drafter identity: worker ${toHex(reply.drafterIdentity)}, ours ${toHex(hello.drafterIdentity)}`);
  }
  if (!eqBytes(hello.markovIdentity, reply.markovIdentity)) {
    p.push(`markov identity: worker ${toHex(reply.markovIdentity)}, ours ${toHex(hello.markovIdentity)}`);
  }
  if (reply.window !== hello.window) p.push(`window: worker ${reply.window}, ours ${hello.window}`);
  if (reply.numSpec !== hello.numSpec) p.push(`num_spec: worker ${reply.numSpec}, ours ${hello.numSpec}`);
  if (hello.sampleMode === SampleMode.TOP32 && (reply.capabilities & Capability.TOP32) === 0) {
    p.push("worker lacks the TOP32 capability a TOP32 session needs");
  }
  if ((reply.capabilities & Capability.TAPS_BF16) === 0) p.push("worker lacks the TAPS_BF16 capability");
  if ((hello.helloFlags & HelloFlag.WANT_MARGIN) !== 0 && (reply.capabilities & Capability.MARGIN) === 0) {
    p.push("worker lacks the MARGIN capability asked by WANT_MARGIN");
  }
  if (reply.maxSlots < hello.maxSlots)
    p.push(`max_slots: worker ${reply.maxSlots} < ${hello.maxSlots} asked`);
  if (reply.maxRowsPerStep < hello.maxRowsPerStep) {
    p.push(`max_rows_per_step: worker ${reply.maxRowsPerStep} < ${hello.maxRowsPerStep} asked`);
  }
  if (reply.vocabSize !== hello.vocabSize)
    p.push(`vocab_size: worker ${reply.vocabSize}, ours ${hello.vocabSize}`);
  if (reply.rowBytes !== hello.rowBytes)
    p.push(`row_bytes: worker ${reply.rowBytes}, ours ${hello.rowBytes}`);
  return p.length === 0 ? null : p.join("; ");
}

/**
 * The CONFIG_MISMATCH checks of CONTRACT 6.1 that depend on the HELLO alone: window in 1..4096,
 * num_spec in 1..32, a known sample mode, `row_dtype` 1, `row_bytes == num_taps*hidden*2`, no
 * unknown `hello_flags` bits, and `vocab_size >= 32` for TOP32. Returns null when all hold, else
 * the first problem. A worker still compares the HELLO with its own drafter and limits.
 */
export function checkHelloConfig(hello: Hello): string | null {
  if (hello.window < 1 || hello.window > MAX_WINDOW) {
    return `window ${hello.window} outside 1..${MAX_WINDOW}`;
  }
  if (hello.numSpec < 1 || hello.numSpec > MAX_NUM_SPEC) {
    return `num_spec ${hello.numSpec} outside 1..${MAX_NUM_SPEC}`;
  }
  if (hello.sampleMode !== SampleMode.GREEDY && hello.sampleMode !== SampleMode.TOP32) {
    return `unknown sample_mode ${hello.sampleMode}`;
  }
  if (hello.rowDtype !== RowDtype.BF16) return `row_dtype ${hello.rowDtype} is not 1 (bf16)`;
  if (hello.rowBytes !== hello.numTaps * hello.hidden * 2) {
    return `row_bytes ${hello.rowBytes} != num_taps ${hello.numTaps} * hidden ${hello.hidden} * 2`;
  }
  const unknownFlags = (hello.helloFlags & ~HELLO_FLAGS_MASK) >>> 0;
  if (unknownFlags !== 0) return `unknown hello_flags bits 0x${unknownFlags.toString(16)}`;
  if (hello.sampleMode === SampleMode.TOP32 && hello.vocabSize < TOP_K_MAX) {
    return `TOP32 needs vocab_size >= ${TOP_K_MAX}, got ${hello.vocabSize}`;
  }
  return null;
}
