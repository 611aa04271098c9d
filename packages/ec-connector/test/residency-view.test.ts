import { encode } from "@msgpack/msgpack";
import { describe, expect, it } from "vitest";
import type { ReplayRequest, ResidencyMessage } from "../src/index.js";
import { decodeResidencyMessage, EcError, ResidencyView } from "../src/index.js";

// EC-CONTRACT 10.3: the view as one state machine, driven by hand-made messages and a fake clock.
const INC = "11111111-2222-4333-8444-555555555555";
const INC2 = "99999999-2222-4333-8444-555555555555";

function msg(
  seq: number,
  kind: string,
  hashes: string[] = [],
  over: Partial<ResidencyMessage> = {},
): ResidencyMessage {
  return {
    incarnation: INC,
    seq,
    kind,
    mmHashes: hashes,
    freeBlocks: 10,
    numBlocks: 64,
    heartbeatMs: kind === "hello" || kind === "end" ? 100 : -1,
    requestId: null,
    page: -1,
    more: false,
    ...over,
  };
}

function harness() {
  const asks: ReplayRequest[] = [];
  const trust: string[] = [];
  const set = new Set<string>();
  const v = new ResidencyView(
    {
      add: (h) => set.add(h),
      remove: (h) => set.delete(h),
      trust: (t, why) => trust.push(`${t}:${why}`),
      ask: (r) => asks.push(r),
    },
    0,
  );
  return { v, asks, trust, set };
}

/** A trusted view of INC at seq 3 holding {a, b}. */
function trusted() {
  const h = harness();
  h.v.onLive(msg(1, "hello"), 1);
  h.v.onLive(msg(2, "stored", ["a", "b"]), 2);
  h.v.onLive(msg(3, "stored", ["c"]), 3);
  h.v.onLive(msg(4, "evicted", ["c"]), 4);
  return h;
}

describe("ResidencyView (EC-CONTRACT 10.3)", () => {
  it('a late start asks at once with no view (incarnation "", since 0)', () => {
    const { asks } = harness();
    expect(asks).toEqual([{ requestId: "r1", incarnation: "", since: 0 }]);
  });

  it("an incarnation seen from seq 1 is trusted; messages apply in order (a change and its reversal)", () => {
    const { v, set } = trusted();
    expect(v.trusted).toBe(true);
    expect(v.seq).toBe(4);
    expect([...set].sort()).toEqual(["a", "b"]);
    expect(v.heartbeatMs).toBe(100);
  });

  it("a gap makes the view untrusted and asks a replay since the last applied seq; the replay closes it", () => {
    const h = trusted();
    h.v.onLive(msg(6, "stored", ["f"]), 10); // seq 5 lost
    expect(h.v.trusted).toBe(false);
    expect(h.v.gaps).toBe(1);
    const ask = h.asks.at(-1)!;
    expect(ask).toMatchObject({ incarnation: INC, since: 4 });
    const rid = ask.requestId;
    h.v.onReply(msg(5, "stored", ["e"], { requestId: rid }), 11);
    h.v.onReply(msg(6, "stored", ["f"], { requestId: rid }), 11);
    h.v.onReply(msg(6, "end", [], { requestId: rid }), 11);
    expect(h.v.trusted).toBe(true);
    expect([...h.set].sort()).toEqual(["a", "b", "e", "f"]);
  });

  it("live messages held during the replay are applied after its end (none lost, none twice)", () => {
    const h = trusted();
    h.v.onLive(msg(6, "stored", ["f"]), 10);
    const rid = h.asks.at(-1)!.requestId;
    h.v.onLive(msg(7, "evicted", ["a"]), 10); // arrives before the answer
    h.v.onReply(msg(5, "stored", ["e"], { requestId: rid }), 11);
    h.v.onReply(msg(6, "stored", ["f"], { requestId: rid }), 11);
    h.v.onReply(msg(6, "end", [], { requestId: rid }), 11);
    expect(h.v.trusted).toBe(true);
    expect(h.v.seq).toBe(7);
    expect([...h.set].sort()).toEqual(["b", "e", "f"]);
  });

  it("a snapshot replaces the set (pages in order, same seq); a missing page asks again, at most once per heartbeat_ms", () => {
    const h = trusted();
    h.v.onLive(msg(9, "stored", ["x"]), 10);
    const r1 = h.asks.at(-1)!.requestId;
    // The answer is a snapshot at seq 9 whose page 1 is lost.
    h.v.onReply(msg(9, "snapshot", ["a"], { requestId: r1, page: 0, more: true }), 11);
    h.v.onReply(msg(9, "snapshot", ["x"], { requestId: r1, page: 2, more: false }), 11);
    h.v.onReply(msg(9, "end", [], { requestId: r1 }), 11);
    expect(h.v.trusted).toBe(false);
    const n = h.asks.length;
    h.v.tick(50); // within heartbeat_ms (100) of the last ask: no new ask
    expect(h.asks.length).toBe(n);
    h.v.tick(120);
    expect(h.asks.length).toBe(n + 1);
    const r2 = h.asks.at(-1)!.requestId;
    h.v.onReply(msg(9, "snapshot", ["a", "q"], { requestId: r2, page: 0, more: true }), 121);
    h.v.onReply(msg(9, "snapshot", ["x"], { requestId: r2, page: 1, more: false }), 121);
    h.v.onReply(msg(9, "end", [], { requestId: r2 }), 121);
    expect(h.v.trusted).toBe(true);
    expect([...h.set].sort()).toEqual(["a", "q", "x"]); // b gone: the snapshot replaced the set
    expect(h.v.snapshots).toBe(1);
  });

  it("an answer to an older request is ignored", () => {
    const h = trusted();
    h.v.onLive(msg(6, "stored", ["f"]), 10);
    h.v.onReply(msg(5, "stored", ["zzz"], { requestId: "not-ours" }), 11);
    h.v.onReply(msg(6, "end", [], { requestId: "not-ours" }), 11);
    expect(h.v.trusted).toBe(false);
    expect(h.set.has("zzz")).toBe(false);
  });

  it("a new incarnation replaces the set: untrusted until its replay or snapshot", () => {
    const h = trusted();
    h.v.onLive(msg(40, "hello", [], { incarnation: INC2 }), 10);
    expect(h.v.trusted).toBe(false);
    expect(h.set.size).toBe(0);
    expect(h.asks.at(-1)).toMatchObject({ incarnation: INC2, since: 0 });
    const rid = h.asks.at(-1)!.requestId;
    h.v.onReply(msg(40, "snapshot", ["n"], { incarnation: INC2, requestId: rid, page: 0, more: false }), 11);
    h.v.onReply(msg(40, "end", [], { incarnation: INC2, requestId: rid }), 11);
    expect(h.v.trusted).toBe(true);
    expect([...h.set]).toEqual(["n"]);
  });

  it("three missed heartbeats: gone, set dropped; heard again: resynced", () => {
    const h = trusted();
    h.v.tick(4 + 299);
    expect(h.v.gone).toBe(false);
    h.v.tick(4 + 301);
    expect(h.v.gone).toBe(true);
    expect(h.v.trusted).toBe(false);
    expect(h.set.size).toBe(0);
    h.v.onLive(msg(5, "hello"), 400);
    expect(h.v.gone).toBe(false);
    expect(h.asks.at(-1)).toMatchObject({ incarnation: INC, since: 0 });
  });

  it("a kind this version does not know is skipped but counts for the seq", () => {
    const h = trusted();
    h.v.onLive(msg(5, "moved", ["a"]), 10);
    h.v.onLive(msg(6, "stored", ["z"]), 10);
    expect(h.v.trusted).toBe(true);
    expect(h.v.seq).toBe(6);
    expect([...h.set].sort()).toEqual(["a", "b", "z"]);
  });
});

describe("decodeResidencyMessage (EC-CONTRACT 10.1, 9.1)", () => {
  const ok = { incarnation: INC, seq: 3, kind: "stored", mm_hashes: ["a"], free_blocks: 1, num_blocks: 2 };
  it("decodes an event, ignores unknown keys", () => {
    const m = decodeResidencyMessage(encode({ ...ok, later: "x" }));
    expect(m).toMatchObject({ incarnation: INC, seq: 3, kind: "stored", mmHashes: ["a"], freeBlocks: 1 });
  });
  it.each([
    ["a nested array in mm_hashes", { ...ok, mm_hashes: [["a"]] }],
    ["an integer in mm_hashes", { ...ok, mm_hashes: [1] }],
    ["a float seq", { ...ok, seq: 2.5 }],
    ["a missing num_blocks", { ...ok, num_blocks: undefined }],
    ["more than 1,024 hashes", { ...ok, mm_hashes: Array.from({ length: 1025 }, (_, i) => `h${i}`) }],
    ["a hello without heartbeat_ms", { ...ok, kind: "hello", mm_hashes: [] }],
    ["a nested map", { ...ok, x: { y: 1 } }],
  ])("refuses %s", (_what, value) => {
    expect(() => decodeResidencyMessage(encode(value, { ignoreUndefined: true }))).toThrow(EcError);
  });
});
