/** Version of the trace file format this package writes and reads (docs/trace.md). */
export const TRACE_FORMAT_VERSION = 1;
