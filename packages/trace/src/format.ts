/**
 * The trace file layout (docs/trace.md). Every offset is a named constant; little-endian
 * throughout like the link itself (CONTRACT 2).
 */

/** `"TAPTRACE"`: the first 8 bytes of every trace file. */
export const TRACE_MAGIC = new Uint8Array([0x54, 0x41, 0x50, 0x54, 0x52, 0x41, 0x43, 0x45]);

/** Version of the trace file format this package writes and reads (docs/trace.md). */
export const TRACE_FORMAT_VERSION = 1;

/** Size of the file header in format version 1 (docs/trace.md "File header"). */
export const TRACE_HEADER_SIZE = 256;

/** Size of a record's fixed part (docs/trace.md "Records"). */
export const RECORD_HEAD_SIZE = 32;

/** Records start and end at multiples of this many bytes (so frame bytes are 8-aligned in the file). */
export const RECORD_ALIGN = 8;

/** Offsets of the file header (docs/trace.md "File header"). */
export const TraceHeaderOffset = {
  /** 8 bytes {@link TRACE_MAGIC}. */
  MAGIC: 0,
  /** u16 format version. */
  VERSION: 8,
  /** u16 bytes of the file header; records start here. */
  HEADER_LEN: 10,
  /** u8 {@link TraceSource}. */
  SOURCE: 12,
  /** u8 {@link RowsPolicy}. */
  ROWS_POLICY: 13,
  /** u16 with SAMPLED rows: one STEP in this many keeps its rows. */
  ROWS_EVERY: 14,
  /** u64 wall clock (Unix ms) when the trace began. */
  START_UNIX_MS: 16,
  /** u32 row_bytes of the HELLO (CONTRACT 6.1). */
  ROW_BYTES: 24,
  /** u16 num_spec N. */
  NUM_SPEC: 28,
  /** u16 window W. */
  WINDOW: 30,
  /** u8 sample_mode (0 GREEDY, 1 TOP32). */
  SAMPLE_MODE: 32,
  /** u8 1 when the HELLO asked WANT_MARGIN. */
  MARGIN: 33,
  /** u16 reserved, 0. */
  RESERVED0: 34,
  /** u32 max_slots. */
  MAX_SLOTS: 36,
  /** u32 vocab_size. */
  VOCAB_SIZE: 40,
  /** u32 bytes of the HELLO body that follows (160). */
  HELLO_LEN: 44,
  /** 16 reserved bytes, 0. */
  RESERVED1: 48,
  /** The first HELLO body of the trace (CONTRACT 6.1), `auth` zeroed. */
  HELLO: 64,
  /** 32 bytes UTF-8, NUL-padded: who wrote the trace (client name, worker name). */
  WRITER_NAME: 224,
} as const;

/** Offsets inside a record (docs/trace.md "Records"). */
export const RecordOffset = {
  /** u32 bytes of the whole record including this field and padding (a multiple of 8). */
  RECORD_LEN: 0,
  /** u8 {@link RecordKind}. */
  KIND: 4,
  /** u8 {@link RecordFlag} bits. */
  FLAGS: 5,
  /** u16 reserved, 0. */
  RESERVED: 6,
  /** u64 microseconds since the trace began (monotonic clock). */
  T_US: 8,
  /** u32 the frame's seq (a copy of its header field); 0 for GAP and END. */
  SEQ: 16,
  /** u32 bytes of the frame as it was on the wire. */
  FRAME_LEN: 20,
  /** u32 bytes of the frame stored after the fixed part (`frame[0, stored_len)`). */
  STORED_LEN: 24,
  /** u32 REPLY: RTT in µs as measured by the writer; GAP / END: records dropped. */
  AUX: 28,
  /** The stored frame bytes. */
  FRAME: 32,
} as const;

/** Record kinds (docs/trace.md "Records"). */
export const RecordKind = {
  /** A request frame (client to worker): HELLO, STEP, RESET, ... */
  REQUEST: 1,
  /** A reply frame (worker to client), after its request. */
  REPLY: 2,
  /** Records were dropped here because the ring was full; AUX counts them. */
  GAP: 3,
  /** The last record of a cleanly closed trace; AUX counts every record dropped. */
  END: 4,
} as const;
/** One of the {@link RecordKind} values. */
export type RecordKind = (typeof RecordKind)[keyof typeof RecordKind];

/** Record flag bits (docs/trace.md "Records"). */
export const RecordFlag = {
  /** `frame[stored_len, frame_len)`, the STEP's rows, were not stored (read them as zeros). */
  ROWS_OMITTED: 1,
  /** A HELLO whose `auth` field was zeroed before storing. */
  AUTH_ZEROED: 2,
} as const;

/** Who wrote the trace (file header `source`). */
export const TraceSource = { CLIENT: 1, WORKER: 2 } as const;
/** One of the {@link TraceSource} values. */
export type TraceSource = (typeof TraceSource)[keyof typeof TraceSource];

/** Which STEP rows the trace keeps (file header `rows_policy`). */
export const RowsPolicy = {
  /** Every STEP keeps its rows. */
  ALL: 0,
  /** One STEP in `rows_every` keeps its rows; the others have ROWS_OMITTED. */
  SAMPLED: 1,
  /** No STEP keeps its rows. */
  NONE: 2,
} as const;
/** One of the {@link RowsPolicy} values. */
export type RowsPolicy = (typeof RowsPolicy)[keyof typeof RowsPolicy];

/** Rounds `n` up to {@link RECORD_ALIGN}. */
export function recordPad(n: number): number {
  return (n + RECORD_ALIGN - 1) & ~(RECORD_ALIGN - 1);
}
