// Issue 22: the optional `residency` object of an `encoder` record (docs/operations.md "Discovery
// records"), schema still 1: written only when given, read back, validated, tolerated as absent
// (an issue-21 writer) and ignored on other kinds; directoryRecordOf maps it to the
// EcDirectory's record shape (EC-CONTRACT 10.3).
import { describe, expect, test } from "vitest";
import {
  DiscoveryError,
  directoryRecordOf,
  encodeRecord,
  etcdDirectorySource,
  makeRecord,
  parseRecord,
  RECORD_SCHEMA_VERSION,
} from "../src/index.js";

const residency = {
  events: "tcp://10.0.0.7:7001",
  replay: "tcp://10.0.0.7:7002",
  incarnation: "6f1c2a9e-0b7d-4d2e-9a55-3f2b8c1d4e60",
};

const encoder = (extra: Record<string, unknown> = {}) =>
  makeRecord({
    kind: "encoder",
    endpoints: ["tcp://10.0.0.7:7000", "tcp://10.0.0.7:7010"],
    identities: { ec_compat: "ab".repeat(32) },
    geometry: { data_kind: "tcp" },
    capacity: { num_blocks: 64, block_bytes: 1024 },
    ...extra,
  });

describe("encoder record: residency (issue 22)", () => {
  test("written as an optional snake_case object, read back, schema unchanged", () => {
    const r = encoder({ residency });
    const j = JSON.parse(encodeRecord(r));
    expect(j.schema).toBe(RECORD_SCHEMA_VERSION);
    expect(j.residency).toEqual(residency);
    expect(parseRecord(encodeRecord(r)).residency).toEqual(residency);
    expect(directoryRecordOf(parseRecord(encodeRecord(r)))).toEqual({
      control: "tcp://10.0.0.7:7000",
      events: residency.events,
      replay: residency.replay,
      incarnation: residency.incarnation,
    });
  });

  test("absent when not configured: the issue-21 record is unchanged and has no directory record", () => {
    const r = encoder();
    expect("residency" in JSON.parse(encodeRecord(r))).toBe(false);
    expect(parseRecord(encodeRecord(r)).residency).toBeUndefined();
    expect(directoryRecordOf(r)).toBeNull();
  });

  test("an empty incarnation is allowed and left out of the directory record", () => {
    const r = encoder({ residency: { events: residency.events, replay: residency.replay } });
    expect(r.residency!.incarnation).toBe("");
    expect(directoryRecordOf(r)).toEqual({
      control: "tcp://10.0.0.7:7000",
      events: residency.events,
      replay: residency.replay,
    });
  });

  test("hostile residency values are typed errors naming the field", () => {
    const base = JSON.parse(encodeRecord(encoder({ residency })));
    for (const [bad, what] of [
      [{ ...residency, events: "not a url" }, /residency\.events/],
      [{ ...residency, replay: 7 }, /residency\.replay/],
      [{ ...residency, incarnation: "x".repeat(300) }, /residency\.incarnation/],
      [{ ...residency, incarnation: { nested: [] } }, /residency\.incarnation/],
      [[residency], /residency must be an object/],
      [null, /residency must be an object/],
    ] as const) {
      const text = JSON.stringify({ ...base, residency: bad });
      expect(() => parseRecord(text)).toThrow(DiscoveryError);
      expect(() => parseRecord(text)).toThrow(what);
    }
    expect(() => makeRecord({ kind: "worker", endpoints: ["tcp://h:1"], residency })).toThrow(
      /residency is for encoder records/,
    );
  });

  test("a reader ignores residency on a worker record (a newer writer may add fields)", () => {
    const w = makeRecord({ kind: "worker", endpoints: ["tcp://10.0.0.5:7878"] });
    const text = JSON.stringify({ ...JSON.parse(encodeRecord(w)), residency });
    expect(parseRecord(text).residency).toBeUndefined();
  });

  test("etcdDirectorySource validates its options naming the bad one", () => {
    expect(() => etcdDirectorySource({ etcd: "etcd://127.0.0.1:1", ecCompat: "XYZ" })).toThrow(/ecCompat/);
    expect(() => etcdDirectorySource({ etcd: "nope" })).toThrow(DiscoveryError);
  });
});
