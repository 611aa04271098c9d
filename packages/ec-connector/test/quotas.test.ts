import { encode } from "@msgpack/msgpack";
import { describe, expect, it } from "vitest";
import { Dealer } from "zeromq";
import {
  decodeXferAck,
  EcProducer,
  encodeXferReq,
  LoopbackFabric,
  MAX_CONTROL_MESSAGE_BYTES,
  XferStatus,
} from "../src/index.js";
import { BLOCK, Clock, COMPAT, makeProducer } from "./helpers/loop.js";

// EC-CONTRACT 9.2 (pin quotas) and 9.1/9.3 at the producer session, with an in-memory ROUTER.
const ENTRY = 4 * BLOCK; // 4 of the cache's 64 blocks: default quota 16 per peer/session, fraction 48

function producer(entries: number, extra = {}) {
  const list: [string, number][] = Array.from({ length: entries }, (_, i) => [`e${i}`, ENTRY]);
  return makeProducer(new LoopbackFabric(), new Clock(), list, extra);
}

function ask(p: ReturnType<typeof producer>, peer: string, session: string, h: string): number {
  p.router.inbox.push({
    identity: Buffer.from(peer),
    frames: [
      encodeXferReq({ mmHash: h, compatibilityHash: COMPAT, sessionId: session, connectorVersion: 2 }),
    ],
  });
  p.session.pollStep();
  const out = p.router.take(peer);
  expect(out).toHaveLength(1);
  return decodeXferAck(out[0]!, 64).status;
}

const refused = (p: ReturnType<typeof producer>) =>
  p.registry.snapshot().counters["producer_grants_refused_quota"];

describe("pin quotas (EC-CONTRACT 9.2)", () => {
  it("one session: 16 blocks (a quarter of the cache), then NACK_NOT_READY, counted", () => {
    const p = producer(8);
    const st = [0, 1, 2, 3, 4, 5].map((i) => ask(p, "peer-a", "s1", `e${i}`));
    expect(st).toEqual([0, 0, 0, 0, XferStatus.NACK_NOT_READY, XferStatus.NACK_NOT_READY]);
    expect(refused(p)).toBe(2);
    expect(p.cache.pinnedBlocks).toBe(16); // a refused grant leaves no pin behind
    // the same session from another peer is still over its quota
    expect(ask(p, "peer-b", "s1", "e6")).toBe(XferStatus.NACK_NOT_READY);
    // another session on another peer is not affected
    expect(ask(p, "peer-b", "s2", "e6")).toBe(XferStatus.OK);
  });

  it("one peer with many sessions: the per-peer quota holds", () => {
    const p = producer(8);
    const st = [0, 1, 2, 3, 4].map((i) => ask(p, "peer-a", `s${i}`, `e${i}`));
    expect(st).toEqual([0, 0, 0, 0, XferStatus.NACK_NOT_READY]);
    expect(refused(p)).toBe(1);
  });

  it("max_pinned_fraction: grants never pin more than 3/4 of the cache", () => {
    const p = producer(16);
    const st = Array.from({ length: 13 }, (_, i) => ask(p, `peer-${i % 4}`, `s${i}`, `e${i}`));
    expect(st.slice(0, 12).every((s) => s === XferStatus.OK)).toBe(true); // 48 blocks = 3/4 of 64
    expect(st[12]).toBe(XferStatus.NACK_NOT_READY);
    expect(p.cache.pinnedBlocks).toBe(48);
    // an entry pinned already adds no blocks: a second grant of e0 (another session) is fine
    expect(ask(p, "peer-9", "s99", "e0")).toBe(XferStatus.OK);
  });

  it("a peer holding nothing may take one grant larger than its quota; the quota frees with the pins", () => {
    const p = makeProducer(new LoopbackFabric(), new Clock(), [
      ["big", 20 * BLOCK],
      ["small", BLOCK],
    ]);
    expect(ask(p, "peer-a", "s1", "big")).toBe(XferStatus.OK);
    expect(ask(p, "peer-a", "s1", "small")).toBe(XferStatus.NACK_NOT_READY);
    // a re-request of the same key releases the old pin first, so it is not counted twice
    expect(ask(p, "peer-a", "s1", "big")).toBe(XferStatus.OK);
    expect(p.cache.pinnedBlocks).toBe(20);
  });

  it("options are validated naming the option", () => {
    expect(() => producer(1, { maxPinnedBlocksPerPeer: 0 })).toThrow(/maxPinnedBlocksPerPeer/);
    expect(() => producer(1, { maxPinnedFraction: 1.5 })).toThrow(/maxPinnedFraction/);
    const p = producer(8, { maxPinnedBlocksPerPeer: 8 });
    expect([0, 1, 2].map((i) => ask(p, "peer-a", "s", `e${i}`))).toEqual([0, 0, XferStatus.NACK_NOT_READY]);
  });
});

describe("control-socket hygiene at the session (EC-CONTRACT 9.1, 9.3)", () => {
  it("multipart messages are malformed and admin maps are refused; neither is answered", () => {
    const p = producer(2);
    const req = encodeXferReq({
      mmHash: "e0",
      compatibilityHash: COMPAT,
      sessionId: "s",
      connectorVersion: 2,
    });
    p.router.inbox.push({ identity: Buffer.from("x"), frames: [req, req] });
    p.router.inbox.push({
      identity: Buffer.from("x"),
      frames: [encode({ op: "encode", mm_hash: "z", nbytes: 64 })],
    });
    p.router.inbox.push({ identity: Buffer.from("x"), frames: [encode({ op: "stats" })] });
    p.session.pollStep();
    expect(p.router.take("x")).toEqual([]);
    const c = p.registry.snapshot().counters;
    expect(c["producer_malformed_messages"]).toBe(1);
    expect(c["producer_admin_refused"]).toBe(2);
    expect(c["producer_requests"]).toBe(0);
    expect(p.cache.has("z")).toBe(false);
  });

  it("an ack that would exceed 64 KiB is a terminal NACK_INTERNAL and leaves no pin", async () => {
    // 14 000 blocks with ids above 65 535: 5 bytes of MessagePack each, ~70 KB of ack
    const prod = await EcProducer.start({
      numBlocks: 80_000,
      blockBytes: 16,
      prepopulate: [
        ["filler", 66_000 * 16],
        ["huge", 14_000 * 16],
      ],
      maxPinnedFraction: 1,
    });
    const d = new Dealer({ linger: 0 });
    try {
      d.connect(prod.controlEndpoint);
      await d.send(
        encodeXferReq({
          mmHash: "huge",
          compatibilityHash: prod.compatibilityHash,
          sessionId: "s",
          connectorVersion: 2,
        }),
      );
      const [raw] = await d.receive();
      expect(raw!.length).toBeLessThan(MAX_CONTROL_MESSAGE_BYTES);
      expect(decodeXferAck(raw!, 80_000).status).toBe(XferStatus.NACK_INTERNAL);
      expect(prod.cache.pinnedBlocks).toBe(0);
      expect(prod.session.grantCount).toBe(0);
    } finally {
      d.close();
      await prod.close();
    }
  });
});
