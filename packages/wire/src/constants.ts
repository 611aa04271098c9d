/**
 * Tables and sizes of the DSPK frames (CONTRACT 2, 4, 5, 6.1, 7.2, 7.3, 7.4, 8).
 * Every table is an `as const` object plus a name lookup; no TS enums.
 */

/** Operation codes of the header's `op` byte (CONTRACT 4). */
export const Op = { HELLO: 1, STEP: 2, PING: 3, STATS: 4, RESET: 5 } as const;
/** One of the {@link Op} codes. */
export type Op = (typeof Op)[keyof typeof Op];
/** Name of each {@link Op} code, for messages and logs. */
export const OP_NAMES: Readonly<Record<number, string>> = invert(Op);

/** Frame statuses of a reply's header `status` byte (CONTRACT 5). */
export const FrameStatus = {
  OK: 0,
  NO_SESSION: 1,
  STALE_SEQ: 2,
  BAD_FRAME: 3,
  BAD_VERSION: 4,
  IDENTITY_MISMATCH: 5,
  CONFIG_MISMATCH: 6,
  UNKNOWN_OP: 7,
  UNAUTHORIZED: 8,
  TOO_LARGE: 9,
  BUSY: 10,
  INTERNAL: 11,
} as const;
/** One of the {@link FrameStatus} codes. */
export type FrameStatus = (typeof FrameStatus)[keyof typeof FrameStatus];
/** Name of each {@link FrameStatus} code. */
export const FRAME_STATUS_NAMES: Readonly<Record<number, string>> = invert(FrameStatus);
/** Frame statuses that disable a client for the rest of the run (CONTRACT 5, 9.3). */
export const FATAL_FRAME_STATUS: ReadonlySet<number> = new Set([3, 4, 5, 6, 7, 8, 9]);

/** Per-entry request statuses of a STEP reply (CONTRACT 7.2). */
export const ReqStatus = {
  OK: 0,
  PARTIAL_WINDOW: 1,
  NEED_RESYNC: 2,
  STALE_GENERATION: 3,
  SKIPPED: 4,
  DRAFT_FAILED: 5,
} as const;
/** One of the {@link ReqStatus} codes. */
export type ReqStatus = (typeof ReqStatus)[keyof typeof ReqStatus];
/** Name of each {@link ReqStatus} code. */
export const REQ_STATUS_NAMES: Readonly<Record<number, string>> = invert(ReqStatus);
/** Request statuses whose drafts the client may use: OK and PARTIAL_WINDOW (CONTRACT 7.2). */
export const USABLE_REQ_STATUS: ReadonlySet<number> = new Set([0, 1]);

/** ReqEntry `flags` bits (CONTRACT 7.3). */
export const EntryFlag = { NEED_DRAFT: 1, RESYNC: 2, RELEASE: 4 } as const;
/** One of the {@link EntryFlag} bits. */
export type EntryFlag = (typeof EntryFlag)[keyof typeof EntryFlag];
/** Name of each {@link EntryFlag} bit. */
export const ENTRY_FLAG_NAMES: Readonly<Record<number, string>> = invert(EntryFlag);
/** Every defined ReqEntry flag bit; any other bit is BAD_FRAME (CONTRACT 7.2). */
export const ENTRY_FLAGS_MASK = 7;
/** HelloReply `capabilities` bits (CONTRACT 6.1). */
export const Capability = { TAPS_BF16: 1, TOP32: 2, MARGIN: 4, SHARED: 8 } as const;
/** One of the {@link Capability} bits. */
export type Capability = (typeof Capability)[keyof typeof Capability];
/** Name of each {@link Capability} bit. */
export const CAPABILITY_NAMES: Readonly<Record<number, string>> = invert(Capability);
/** HELLO `hello_flags` bits (CONTRACT 6.1). */
export const HelloFlag = { WANT_MARGIN: 1 } as const;
/** One of the {@link HelloFlag} bits. */
export type HelloFlag = (typeof HelloFlag)[keyof typeof HelloFlag];
/** Name of each {@link HelloFlag} bit. */
export const HELLO_FLAG_NAMES: Readonly<Record<number, string>> = invert(HelloFlag);
/** Every defined HELLO flag bit; a worker refuses others with CONFIG_MISMATCH (CONTRACT 6.1). */
export const HELLO_FLAGS_MASK = 1;
/** HELLO `sample_mode` values (CONTRACT 6.1, 8). */
export const SampleMode = { GREEDY: 0, TOP32: 1 } as const;
/** One of the {@link SampleMode} values. */
export type SampleMode = (typeof SampleMode)[keyof typeof SampleMode];
/** Name of each {@link SampleMode}. */
export const SAMPLE_MODE_NAMES: Readonly<Record<number, string>> = invert(SampleMode);
/** STEP reply `reply_flags` bits (CONTRACT 7.4). */
export const ReplyFlag = { MARGIN: 1, SAMPLED: 2 } as const;
/** One of the {@link ReplyFlag} bits. */
export type ReplyFlag = (typeof ReplyFlag)[keyof typeof ReplyFlag];
/** Name of each {@link ReplyFlag} bit. */
export const REPLY_FLAG_NAMES: Readonly<Record<number, string>> = invert(ReplyFlag);
/** HELLO `row_dtype` values (CONTRACT 6.1). */
export const RowDtype = { BF16: 1 } as const;

/** Header magic, the bytes "DSPK" (CONTRACT 4). */
export const MAGIC: Uint8Array = Uint8Array.of(0x44, 0x53, 0x50, 0x4b);
/** The header magic read as a little-endian u32. */
export const MAGIC_U32 = 0x4b505344;
/** Protocol version of the header (CONTRACT 4). */
export const VERSION = 1;
/** Size of the application header (CONTRACT 4). */
export const APP_HEADER_SIZE = 24;
/** Size of a HELLO request body (CONTRACT 6.1). */
export const HELLO_BODY_SIZE = 160;
/** Size of a HelloReply body (CONTRACT 6.1). */
export const HELLO_REPLY_BODY_SIZE = 128;
/** Size of the STEP request prefix `step_id, step_flags, n_req, n_rows` (CONTRACT 7.3). */
export const STEP_PREFIX_SIZE = 16;
/** Size of the STEP reply prefix `step_id, n_req, num_spec, reply_flags, worker_us` (CONTRACT 7.4). */
export const STEP_REPLY_PREFIX_SIZE = 16;
/** Size of one ReqEntry (CONTRACT 7.3). */
export const REQ_ENTRY_SIZE = 32;
/** Size of one per-entry sample meta record in TOP32 sessions (CONTRACT 7.3). */
export const SAMPLE_META_SIZE = 8;
/** Support size of a sampled position: `support_ids`/`proposal_q` hold 32 slots each (CONTRACT 7.4, 8). */
export const TOP_K_MAX = 32;
/** `proposal_q` units: q values over `top_k` sum to exactly 2^24 (CONTRACT 8). */
export const DYADIC_ONE = 2 ** 24;
/** Largest window `W` a HELLO may ask (CONTRACT 6.1). */
export const MAX_WINDOW = 4096;
/** Largest `num_spec` a HELLO may ask (CONTRACT 6.1). */
export const MAX_NUM_SPEC = 32;
/** Largest PING body echoed; above is TOO_LARGE (CONTRACT 10). */
export const PING_MAX_BODY = 1024;
/** Largest STATS request body accepted; above is TOO_LARGE (CONTRACT 10). */
export const STATS_MAX_BODY = 1024;
/** Rows start at a frame offset that is a multiple of this (CONTRACT 7.3). */
export const ROWS_ALIGN = 64;
/** Length of the HELLO identities, SHA-256 digests (CONTRACT 6.1). */
export const IDENTITY_SIZE = 32;
/** Length of the HELLO auth field, an HMAC-SHA256 (CONTRACT 6.1). */
export const AUTH_SIZE = 32;
/** Bytes of the NUL-padded `client_name` / `worker_name` fields (CONTRACT 6.1). */
export const NAME_SIZE = 32;

const TWO_32 = 2 ** 32;

/**
 * RFC 1982 serial comparison on u32 (CONTRACT 2): true when `a` is newer than `b`, that is
 * `(a - b) mod 2^32` lies in `[1, 2^31)`.
 */
export function serialNewer(a: number, b: number): boolean {
  const d = (a - b) >>> 0;
  return d !== 0 && d < 0x80000000;
}

/** `(a + n) mod 2^32` for u32 serial numbers (CONTRACT 2); `n` may be negative. */
export function serialAdd(a: number, n: number): number {
  const r = (a + n) % TWO_32;
  return r < 0 ? r + TWO_32 : r;
}

/** Name of an op code, or `OP_<n>` when unknown. */
export function opName(op: number): string {
  return OP_NAMES[op] ?? `OP_${op}`;
}

/** Name of a frame status, or `STATUS_<n>` when unknown. */
export function frameStatusName(status: number): string {
  return FRAME_STATUS_NAMES[status] ?? `STATUS_${status}`;
}

/** Name of a request status, or `REQ_STATUS_<n>` when unknown. */
export function reqStatusName(status: number): string {
  return REQ_STATUS_NAMES[status] ?? `REQ_STATUS_${status}`;
}

/**
 * Names of the bits set in `bits`, lowest first, from a bit-name table such as
 * {@link ENTRY_FLAG_NAMES} or {@link CAPABILITY_NAMES}; unknown bits read `BIT_<n>`. For messages
 * and logs: `flagNames(ENTRY_FLAG_NAMES, 3)` is `["NEED_DRAFT", "RESYNC"]`.
 */
export function flagNames(names: Readonly<Record<number, string>>, bits: number): string[] {
  const out: string[] = [];
  const u = bits >>> 0; // a u32 field; also accepts the negative result of `x & ~mask`
  for (let b = 0; b < 32; b++) {
    const bit = 2 ** b;
    if (Math.floor(u / bit) % 2 === 1) out.push(names[bit] ?? `BIT_${b}`);
  }
  return out;
}

function invert(table: Readonly<Record<string, number>>): Readonly<Record<number, string>> {
  const out: Record<number, string> = {};
  for (const [name, code] of Object.entries(table)) out[code] = name;
  return Object.freeze(out);
}
