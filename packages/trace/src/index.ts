/**
 * `@tapwire/trace`: link traces (docs/trace.md): a versioned, length-prefixed capture of every
 * STEP request and reply as it was on the wire, written off the hot path by a
 * {@link TraceWriter}; a reader ({@link parseTrace}); and {@link replayTrace}, the engine of
 * `tapwire-replay`, which replays a trace against a worker and reports parity.
 * @packageDocumentation
 */
export { TraceError, TraceErrorCode } from "./errors.js";
export {
  RECORD_ALIGN,
  RECORD_HEAD_SIZE,
  RecordFlag,
  RecordKind,
  RecordOffset,
  RowsPolicy,
  recordPad,
  TRACE_FORMAT_VERSION,
  TRACE_HEADER_SIZE,
  TRACE_MAGIC,
  TraceHeaderOffset,
  TraceSource,
} from "./format.js";
export type { Trace, TraceHeader, TraceRecord } from "./reader.js";
export { parseTrace, readTrace, recordFrame } from "./reader.js";
export type {
  IdentityPair,
  ParityDifference,
  ParityReport,
  ReplayIdentity,
  ReplayOptions,
  ReplayTraceInfo,
  RttSummary,
} from "./replay.js";
export { formatParityReport, REPLAY_DEFAULTS, replayTrace, rttSummary } from "./replay.js";
export type { LinkTap, TraceWriterOptions, TraceWriterStats } from "./writer.js";
export { TRACE_WRITER_DEFAULTS, TraceWriter } from "./writer.js";
