// The record schema (docs/operations.md "Discovery records"): what register() stores is what a
// router in another language reads; hostile values are typed errors naming the problem.
import fc from "fast-check";
import { describe, expect, test } from "vitest";
import {
  compatHash,
  DiscoveryError,
  encodeRecord,
  etcdHosts,
  MAX_RECORD_BYTES,
  makeRecord,
  memberInfoOf,
  parseRecord,
  recordKey,
} from "../src/index.js";

const worker = () =>
  makeRecord({
    kind: "worker",
    endpoints: ["tcp://10.0.0.5:7878", "unix:///run/w.sock"],
    name: "w1",
    identities: { drafter: "ab".repeat(32), markov: "cd".repeat(32) },
    geometry: {
      window: 16,
      num_spec: 4,
      vocab_size: 32000,
      row_bytes: 6144,
      sample_modes: ["greedy", "top32"],
    },
    capacity: { max_sessions: 4, max_slots: 256, max_rows_per_step: 4096 },
  });

describe("record schema 1", () => {
  test("the stored JSON has the documented snake_case fields and parses back", () => {
    const r = worker();
    const j = JSON.parse(encodeRecord(r));
    expect(Object.keys(j).sort()).toEqual(
      [
        "capacity",
        "compat",
        "endpoints",
        "geometry",
        "identities",
        "incarnation",
        "kind",
        "name",
        "pid",
        "schema",
        "started_at",
      ].sort(),
    );
    expect(j.schema).toBe(1);
    expect(j.incarnation).toMatch(/^[0-9a-f]{32}$/);
    expect(recordKey("/tapwire/v1/", r)).toBe(`/tapwire/v1/worker/${r.incarnation}`);
    expect(parseRecord(encodeRecord(r))).toEqual(r);
    expect(memberInfoOf(r)).toMatchObject({
      endpoint: "tcp://10.0.0.5:7878",
      incarnation: r.incarnation,
      compat: { drafterIdentity: "ab".repeat(32), window: 16, numSpec: 4, vocabSize: 32000, rowBytes: 6144 },
    });
  });

  test("a record written by another language (hand-made JSON, extra fields) is read", () => {
    const identities = { drafter: "00".repeat(32), markov: "11".repeat(32) };
    const geometry = { window: 8, num_spec: 2 };
    const text = `{"schema":1,"kind":"worker","incarnation":"${"e".repeat(32)}","started_at":"2026-12-02T01:00:00Z",
      "endpoints":["tcp://127.0.0.1:7878"],"identities":${JSON.stringify(identities)},"geometry":${JSON.stringify(geometry)},
      "compat":"${compatHash(identities, geometry)}","capacity":{},"future_field":[1,2]}`;
    const r = parseRecord(text);
    expect(r.endpoints).toEqual(["tcp://127.0.0.1:7878"]);
    expect(r.name).toBe("");
  });

  test("compat is sha256 of the canonical identities and geometry (key order does not matter)", () => {
    expect(compatHash({ a: "01", b: "02" }, { x: 1, y: [] as string[] })).toBe(
      compatHash({ b: "02", a: "01" }, { y: [], x: 1 }),
    );
    expect(compatHash({ a: "01" }, { x: 1 })).not.toBe(compatHash({ a: "01" }, { x: 2 }));
  });

  const bads: [string, (j: Record<string, unknown>) => void, RegExp][] = [
    ["schema", (j) => (j.schema = 2), /schema/],
    ["kind", (j) => (j.kind = "router"), /kind/],
    ["incarnation", (j) => (j.incarnation = "xyz"), /incarnation/],
    ["started_at", (j) => (j.started_at = "yesterday"), /started_at/],
    ["endpoints empty", (j) => (j.endpoints = []), /endpoints/],
    ["endpoint", (j) => (j.endpoints = ["not a url"]), /endpoint/],
    ["identities", (j) => (j.identities = { drafter: "ZZ" }), /identities/],
    ["geometry", (j) => (j.geometry = { window: { deep: 1 } }), /geometry/],
    ["capacity", (j) => (j.capacity = { max_slots: "many" }), /capacity/],
    ["compat", (j) => (j.compat = "00".repeat(32)), /compat/],
  ];
  test.each(bads)("refused: %s", (_n, edit, re) => {
    const j = JSON.parse(encodeRecord(worker()));
    edit(j);
    expect(() => parseRecord(JSON.stringify(j))).toThrow(re);
  });

  test("garbage, oversize and deep nesting are DISCOVERY_BAD_RECORD, never another error", () => {
    expect(() => parseRecord("x".repeat(MAX_RECORD_BYTES + 1))).toThrow(/exceeds/);
    expect(() => parseRecord(`${"[".repeat(5000)}${"]".repeat(5000)}`)).toThrow(DiscoveryError);
    fc.assert(
      fc.property(
        fc.oneof(
          fc.string(),
          fc.uint8Array({ maxLength: 300 }),
          fc.json().map((s) => s),
        ),
        (v) => {
          try {
            parseRecord(v);
          } catch (e) {
            expect(e).toBeInstanceOf(DiscoveryError);
            expect((e as DiscoveryError).code).toBe("DISCOVERY_BAD_RECORD");
          }
        },
      ),
      { numRuns: 300 },
    );
  });

  test("etcd URLs", () => {
    expect(etcdHosts("etcd://127.0.0.1:2379")).toEqual(["http://127.0.0.1:2379"]);
    expect(etcdHosts("etcd://a:1,b:2")).toEqual(["http://a:1", "http://b:2"]);
    expect(() => etcdHosts("etcd://")).toThrow(/etcd/);
    expect(() => etcdHosts("redis://x:1")).toThrow(/etcd/);
  });
});
