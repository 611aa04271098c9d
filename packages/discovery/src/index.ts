/** Version of the discovery record schema (docs/operations.md). */
export const RECORD_SCHEMA_VERSION = 1;
