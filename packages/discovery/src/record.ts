// The member record (schema 1): one JSON value per server process under
// `<prefix><kind>/<incarnation>`, kept under a lease. Documented field by field in the package
// README and docs/operations.md so that a router in another language can read it; parseRecord
// is the one reader of this package, strict on what a pool relies on and tolerant of fields it
// does not know (a newer writer may add some).
import { createHash, randomBytes } from "node:crypto";
import { DiscoveryError } from "./errors.js";

/** Version of the record schema (`schema` field). */
export const RECORD_SCHEMA_VERSION = 1;

/** The default key prefix. */
export const DEFAULT_PREFIX = "/tapwire/v1/";

/** Kinds of servers that register. */
export const RECORD_KINDS = ["worker", "encoder"] as const;

/** One of {@link RECORD_KINDS}. */
export type RecordKind = (typeof RECORD_KINDS)[number];

/** Largest record value accepted, bytes (a record is a few hundred). */
export const MAX_RECORD_BYTES = 16 * 1024;

/**
 * Issue 22: where an encoder publishes its residency stream (EC-CONTRACT 10.1, 10.2), carried by
 * an `encoder` record as the optional `residency` object. Absent when the producer runs without
 * `--events-listen`.
 */
export interface ResidencyEndpoints {
  /** The events PUB endpoint (EC-CONTRACT 10.1), advertised. */
  readonly events: string;
  /** The replay ROUTER endpoint (EC-CONTRACT 10.2), advertised. */
  readonly replay: string;
  /** The stream's incarnation (the `incarnation` of its messages, EC-CONTRACT 10.1), or "" when unknown. */
  readonly incarnation: string;
}

/** What a server registers (the input of `register`, the output of {@link parseRecord}). */
export interface MemberRecord {
  /** {@link RECORD_SCHEMA_VERSION}. */
  readonly schema: number;
  /** `"worker"` (a drafter worker, CONTRACT 12) or `"encoder"` (an EC producer). */
  readonly kind: RecordKind;
  /** Random 128-bit hex id of the process: a restarted server has a new one. */
  readonly incarnation: string;
  /** Process start, RFC 3339 UTC (`2026-12-02T01:00:00.000Z`). */
  readonly startedAt: string;
  /** Advertised endpoint URLs, primary first (what the bin reports, e.g. `tcp://10.0.0.5:7878`). */
  readonly endpoints: readonly string[];
  /** A human name (the worker's `worker_name`), or "". */
  readonly name: string;
  /** Identities, lower-case hex (a worker: `drafter`, `markov`: SHA-256 of the weights). */
  readonly identities: Readonly<Record<string, string>>;
  /** Geometry a client must match (a worker: `window`, `num_spec`, `vocab_size`, `row_bytes`, `num_taps`, `hidden`, `sample_modes`). */
  readonly geometry: Readonly<Record<string, number | string | readonly string[]>>;
  /** SHA-256 hex of the canonical identities and geometry ({@link compatHash}): equal hashes serve the same clients. */
  readonly compat: string;
  /** Capacity (a worker: `max_sessions`, `max_slots`, `max_rows_per_step`). */
  readonly capacity: Readonly<Record<string, number>>;
  /** The registering process id (for operators). */
  readonly pid: number;
  /** Issue 22, encoders only: the residency stream endpoints (absent when not configured). */
  readonly residency?: ResidencyEndpoints;
}

/** Input of {@link makeRecord}: a record without the fields that are derived or defaulted. */
export interface RecordInput {
  /** `"worker"` or `"encoder"`. */
  kind: RecordKind;
  /** Advertised endpoints, primary first (at least one). */
  endpoints: readonly string[];
  /** A name (default ""). */
  name?: string;
  /** Identities (hex strings). */
  identities?: Record<string, string>;
  /** Geometry. */
  geometry?: Record<string, number | string | readonly string[]>;
  /** Capacity. */
  capacity?: Record<string, number>;
  /** The incarnation (default {@link newIncarnation}). */
  incarnation?: string;
  /** Start time (default now). */
  startedAt?: Date;
  /** Issue 22, encoders: events and replay endpoints and the stream incarnation (`incarnation` default ""). */
  residency?: {
    /** The events PUB endpoint (advertised). */
    events: string;
    /** The replay ROUTER endpoint (advertised). */
    replay: string;
    /** The stream incarnation (default ""). */
    incarnation?: string;
  };
}

/** A new random incarnation: 32 lower-case hex digits. */
export function newIncarnation(): string {
  return randomBytes(16).toString("hex");
}

function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
  if (v !== null && typeof v === "object") {
    const o = v as Record<string, unknown>;
    return `{${Object.keys(o)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical(o[k])}`)
      .join(",")}}`;
  }
  return JSON.stringify(v);
}

/**
 * SHA-256 hex of `{"geometry":…,"identities":…}` serialised with sorted keys and no spaces: two
 * servers with equal hashes serve the same clients.
 */
export function compatHash(identities: Record<string, string>, geometry: Record<string, unknown>): string {
  return createHash("sha256").update(canonical({ geometry, identities })).digest("hex");
}

const HEX32 = /^[0-9a-f]{32}$/;
const ENDPOINT = /^[a-z][a-z0-9+.-]*:\/\/./;

function bad(what: string): DiscoveryError {
  return new DiscoveryError("DISCOVERY_BAD_RECORD", what);
}

/**
 * A complete record from `input` (incarnation and start time defaulted, compat hash computed).
 *
 * @throws DiscoveryError `DISCOVERY_BAD_RECORD` for a kind, endpoint or field of the wrong type.
 */
export function makeRecord(input: RecordInput): MemberRecord {
  const identities = { ...(input.identities ?? {}) };
  const geometry = { ...(input.geometry ?? {}) };
  const rec: MemberRecord = {
    schema: RECORD_SCHEMA_VERSION,
    kind: input.kind,
    incarnation: input.incarnation ?? newIncarnation(),
    startedAt: (input.startedAt ?? new Date()).toISOString(),
    endpoints: [...input.endpoints],
    name: input.name ?? "",
    identities,
    geometry,
    compat: compatHash(identities, geometry),
    capacity: { ...(input.capacity ?? {}) },
    pid: process.pid,
    ...(input.residency === undefined
      ? {}
      : {
          residency: {
            events: input.residency.events,
            replay: input.residency.replay,
            incarnation: input.residency.incarnation ?? "",
          },
        }),
  };
  checkRecord(rec);
  return rec;
}

/** The key of a record: `<prefix><kind>/<incarnation>`. */
export function recordKey(prefix: string, rec: Pick<MemberRecord, "kind" | "incarnation">): string {
  return `${prefix}${rec.kind}/${rec.incarnation}`;
}

/** The JSON value stored for a record (snake_case fields, docs/operations.md). */
export function encodeRecord(rec: MemberRecord): string {
  return JSON.stringify({
    schema: rec.schema,
    kind: rec.kind,
    incarnation: rec.incarnation,
    started_at: rec.startedAt,
    endpoints: rec.endpoints,
    name: rec.name,
    identities: rec.identities,
    geometry: rec.geometry,
    compat: rec.compat,
    capacity: rec.capacity,
    pid: rec.pid,
    // issue 22: optional, so schema-1 readers that do not know it are unaffected
    ...(rec.residency === undefined ? {} : { residency: rec.residency }),
  });
}

function checkRecord(r: MemberRecord): void {
  if (r.schema !== RECORD_SCHEMA_VERSION)
    throw bad(`schema ${String(r.schema)} is not ${RECORD_SCHEMA_VERSION}`);
  if (!(RECORD_KINDS as readonly string[]).includes(r.kind))
    throw bad(`kind ${String(r.kind)} is not worker or encoder`);
  if (typeof r.incarnation !== "string" || !HEX32.test(r.incarnation)) {
    throw bad(`incarnation ${String(r.incarnation)} is not 32 lower-case hex digits`);
  }
  if (typeof r.startedAt !== "string" || Number.isNaN(Date.parse(r.startedAt))) {
    throw bad(`started_at ${String(r.startedAt)} is not an RFC 3339 time`);
  }
  if (!Array.isArray(r.endpoints) || r.endpoints.length === 0 || r.endpoints.length > 16) {
    throw bad("endpoints must be a list of 1..16 URLs");
  }
  for (const e of r.endpoints) {
    if (typeof e !== "string" || e.length > 1024 || !ENDPOINT.test(e))
      throw bad(`endpoint ${String(e)} is not a URL`);
  }
  if (typeof r.name !== "string" || r.name.length > 256)
    throw bad("name must be a string of at most 256 characters");
  for (const [field, o] of [
    ["identities", r.identities],
    ["geometry", r.geometry],
    ["capacity", r.capacity],
  ] as const) {
    if (o === null || typeof o !== "object" || Array.isArray(o)) throw bad(`${field} must be an object`);
  }
  for (const [k, v] of Object.entries(r.identities)) {
    if (typeof v !== "string" || !/^[0-9a-f]{1,128}$/.test(v))
      throw bad(`identities.${k} is not lower-case hex`);
  }
  for (const [k, v] of Object.entries(r.geometry)) {
    const ok =
      (typeof v === "number" && Number.isFinite(v)) ||
      typeof v === "string" ||
      (Array.isArray(v) && v.every((x) => typeof x === "string"));
    if (!ok) throw bad(`geometry.${k} is not a number, a string or a list of strings`);
  }
  for (const [k, v] of Object.entries(r.capacity)) {
    if (typeof v !== "number" || !Number.isFinite(v)) throw bad(`capacity.${k} is not a number`);
  }
  if (typeof r.compat !== "string" || !/^[0-9a-f]{64}$/.test(r.compat))
    throw bad("compat is not a SHA-256 hex");
  if (!Number.isInteger(r.pid) || r.pid < 0) throw bad("pid is not a non-negative integer");
  if (r.residency !== undefined) checkResidency(r);
}

function checkResidency(r: MemberRecord): void {
  const z = r.residency as unknown;
  if (z === null || typeof z !== "object" || Array.isArray(z)) throw bad("residency must be an object");
  if (r.kind !== "encoder") throw bad(`residency is for encoder records, not ${r.kind}`);
  const o = z as Record<string, unknown>;
  for (const k of ["events", "replay"] as const) {
    const e = o[k];
    if (typeof e !== "string" || e.length > 1024 || !ENDPOINT.test(e))
      throw bad(`residency.${k} ${String(e)} is not a URL`);
  }
  if (typeof o.incarnation !== "string" || Buffer.byteLength(o.incarnation) > 256)
    throw bad("residency.incarnation must be a string of at most 256 bytes");
}

/**
 * Reads a stored record value (bytes or string). Unknown fields are ignored.
 *
 * @throws DiscoveryError `DISCOVERY_BAD_RECORD` naming the first problem (not JSON, too large,
 *   a missing or mistyped field, a compat hash that does not match).
 */
export function parseRecord(value: string | Uint8Array): MemberRecord {
  const text = typeof value === "string" ? value : Buffer.from(value).toString("utf8");
  if (Buffer.byteLength(text) > MAX_RECORD_BYTES)
    throw bad(`record of ${Buffer.byteLength(text)} bytes exceeds ${MAX_RECORD_BYTES}`);
  let j: Record<string, unknown>;
  try {
    j = JSON.parse(text) as Record<string, unknown>;
  } catch (e) {
    throw bad(`record is not JSON: ${e instanceof Error ? e.message : String(e)}`);
  }
  if (j === null || typeof j !== "object" || Array.isArray(j)) throw bad("record is not a JSON object");
  const rec = {
    schema: j.schema,
    kind: j.kind,
    incarnation: j.incarnation,
    startedAt: j.started_at,
    endpoints: j.endpoints,
    name: j.name ?? "",
    identities: j.identities ?? {},
    geometry: j.geometry ?? {},
    compat: j.compat,
    capacity: j.capacity ?? {},
    pid: j.pid ?? 0,
    // a reader ignores residency on other kinds (a newer writer may add one)
    ...(j.residency === undefined || j.kind !== "encoder"
      ? {}
      : {
          residency:
            j.residency !== null && typeof j.residency === "object" && !Array.isArray(j.residency)
              ? {
                  events: (j.residency as Record<string, unknown>).events,
                  replay: (j.residency as Record<string, unknown>).replay,
                  incarnation: (j.residency as Record<string, unknown>).incarnation ?? "",
                }
              : j.residency,
        }),
  } as MemberRecord;
  checkRecord(rec);
  if (rec.compat !== compatHash(rec.identities, rec.geometry))
    throw bad("compat does not match identities and geometry");
  return rec;
}
