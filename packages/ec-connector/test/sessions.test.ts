import { encode } from "@msgpack/msgpack";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  ConsumerXfer,
  decodeXferAck,
  EcError,
  encodeXferAck,
  LoopbackFabric,
  nackAck,
  syntheticEmbedding,
  XferState,
  XferStatus,
} from "../src/index.js";
import type { Consumer, Producer } from "./helpers/loop.js";
import { Clock, COMPAT, makeConsumer, makeProducer, start, step } from "./helpers/loop.js";

function setup(entries: [string, number][] = [["img", 200]], extra = {}) {
  const clock = new Clock();
  const fabric = new LoopbackFabric({ now: clock.now });
  const p = makeProducer(fabric, clock, entries, extra);
  const c = makeConsumer(fabric, p);
  return { clock, fabric, p, c };
}

function await_(p: Promise<unknown>): void {
  void p;
}

function counters(r: { snapshot(): { counters: Record<string, number> } }): Record<string, number> {
  return r.snapshot().counters;
}

function bytesEqual(c: Consumer, mmHash: string, nbytes: number): boolean {
  return Buffer.from(c.cache.view(mmHash)).equals(Buffer.from(syntheticEmbedding(mmHash, nbytes)));
}

/** Section 8 invariants: bookkeeping holds, no pins, free counts back. */
function invariants(p: Producer, c: Consumer): void {
  p.cache.check();
  c.cache.check();
  expect(p.cache.pinnedBlocks).toBe(0);
  expect(p.session.grantCount).toBe(0);
  expect(p.cache.freeBlocks).toBe(p.initialFree);
  expect(c.cache.freeBlocks + c.cache.retiredBlocks + usedBy(c)).toBe(c.cache.numBlocks);
}

function usedBy(c: Consumer): number {
  let n = 0;
  for (const k of c.cache.keys()) n += c.cache.get(k)!.blocks.length;
  return n + c.cache.detachedBlocks;
}

describe("ConsumerSession + ProducerSession over the loopback data plane (EC-CONTRACT 4, 6.3)", () => {
  it("WAITING_ACK -> READING -> DONE: completes byte-identical and the notification unpins", () => {
    const { clock, p, c } = setup();
    const blocks = start(c, clock, "img", 200);
    expect(c.session.stateOf("img")).toBe(XferState.WAITING_ACK);
    p.session.pollStep(); // grant: pinned
    expect(p.cache.get("img")!.pins).toBe(1);
    c.session.poll(p.router.take(c.identity), clock.now());
    // loopback completes on the first check, which happens in the same poll
    const r = c.session.takeResults();
    expect(r.completed).toEqual([{ mmHash: "img", blocks, nbytes: 200, crc32: p.cache.get("img")!.crc32 }]);
    c.cache.markReady("img", r.completed[0]!.crc32);
    expect(bytesEqual(c, "img", 200)).toBe(true);
    p.session.pollStep(); // notification drained: unpinned
    expect(p.cache.get("img")!.pins).toBe(0);
    expect(counters(p.registry)["producer_completions"]).toBe(1);
    expect(counters(c.registry)["consumer_reads_completed"]).toBe(1);
    c.cache.free("img");
    invariants(p, c);
  });

  it("ACK_TIMEOUT: no ack before the deadline -> retryable, blocks handed back", () => {
    const { clock, p, c } = setup();
    c.dropRequests = true;
    const blocks = start(c, clock, "img", 200, 2_000);
    clock.advance(2_000);
    step(p, c, clock);
    expect(c.session.takeResults().retryable).toEqual([]);
    clock.advance(1);
    step(p, c, clock);
    const r = c.session.takeResults();
    expect(r.retryable).toEqual([{ mmHash: "img", blocks, reason: "ack_timeout" }]);
    expect(counters(c.registry)["consumer_ack_timeouts"]).toBe(1);
    c.cache.free("img");
    invariants(p, c);
  });

  it("NACK_NOT_READY -> retryable; NACK_MISSING -> tombstoned (EC-CONTRACT 3, 4.2)", () => {
    const { clock, p, c } = setup();
    p.cache.allocate("encoding", 100); // exists but not ready
    start(c, clock, "encoding", 100);
    start(c, clock, "absent", 100);
    step(p, c, clock);
    const r = c.session.takeResults();
    expect(r.retryable.map((x) => [x.mmHash, x.reason])).toEqual([["encoding", "NACK_NOT_READY"]]);
    expect(r.tombstoned.map((x) => [x.mmHash, x.reason])).toEqual([["absent", "NACK_MISSING"]]);
    expect(counters(p.registry)["producer_nacks_not_ready"]).toBe(1);
    expect(counters(p.registry)["producer_nacks_missing"]).toBe(1);
    expect(counters(c.registry)["consumer_nacks_missing"]).toBe(1);
    expect(p.cache.get("encoding")!.pins).toBe(0);
  });

  it("onMiss that starts an encode turns MISSING into NOT_READY, then OK once ready", () => {
    const clock = new Clock();
    const fabric = new LoopbackFabric({ now: clock.now });
    let cache: Producer["cache"] | undefined;
    const p = makeProducer(fabric, clock, [], {
      onMiss: (h: string) => {
        cache!.allocate(h, 130);
        return true;
      },
    });
    cache = p.cache;
    const c = makeConsumer(fabric, p);
    start(c, clock, "new", 130);
    step(p, c, clock);
    expect(c.session.takeResults().retryable.map((x) => x.reason)).toEqual(["NACK_NOT_READY"]);
    p.cache.write("new", 0, syntheticEmbedding("new", 130));
    p.cache.markReady("new");
    c.session.startXfer("new", c.cache.get("new")!.blocks, clock.now() + 2_000, 130);
    step(p, c, clock);
    expect(c.session.takeResults().completed.map((x) => x.mmHash)).toEqual(["new"]);
  });

  it("NACK_INCOMPAT, NACK_VERSION and NACK_INTERNAL (EC-CONTRACT 2, 4.2)", () => {
    const clock = new Clock();
    const fabric = new LoopbackFabric({ now: clock.now });
    const p = makeProducer(fabric, clock, [["img", 100]]);
    const c = makeConsumer(fabric, p, { compatibilityHash: "0".repeat(64) });
    start(c, clock, "img", 100);
    step(p, c, clock);
    expect(c.session.takeResults().tombstoned.map((x) => x.reason)).toEqual(["NACK_INCOMPAT"]);
    const raw = (req: object) => {
      p.router.inbox.push({ identity: Buffer.from("raw"), frames: [encode(req)] });
      p.session.pollStep();
      return decodeXferAck(p.router.take("raw")[0]!, 64).status;
    };
    const base = { mm_hash: "img", compatibility_hash: COMPAT, session_id: "s", connector_version: 2 };
    expect(raw({ ...base, connector_version: 1 })).toBe(XferStatus.NACK_VERSION);
    expect(raw({ ...base, session_id: "" })).toBe(XferStatus.NACK_INTERNAL);
    expect(raw({ ...base, session_id: "a:b" })).toBe(XferStatus.NACK_INTERNAL);
    // version is checked before the hash
    expect(raw({ ...base, connector_version: 3, compatibility_hash: "x" })).toBe(XferStatus.NACK_VERSION);
    expect(p.cache.get("img")!.pins).toBe(0);
  });

  it("ERR -> READ_FAILED -> tombstoned; the producer's lease then unpins (EC-CONTRACT 4.4)", () => {
    const { clock, p, c } = setup();
    c.data.injectFault({ kind: "error" });
    start(c, clock, "img", 200);
    step(p, c, clock);
    const r = c.session.takeResults();
    expect(r.tombstoned.map((x) => x.reason)).toEqual(["read_error: injected error"]);
    expect(p.cache.get("img")!.pins).toBe(1);
    clock.advance(5_001);
    p.session.pollStep();
    expect(p.cache.get("img")!.pins).toBe(0);
    expect(counters(p.registry)["producer_lease_expiries"]).toBe(1);
    c.cache.free("img");
    invariants(p, c);
  });

  it("an exception from checkXferState or postRead tombstones; nothing raises out of poll", () => {
    const { clock, p, c } = setup([
      ["a", 64],
      ["b", 64],
    ]);
    c.data.injectFault({ kind: "throw_on_check" });
    c.data.injectFault({ kind: "throw_on_post" });
    start(c, clock, "a", 64);
    start(c, clock, "b", 64);
    expect(() => step(p, c, clock)).not.toThrow();
    const r = c.session.takeResults();
    expect(r.tombstoned.map((x) => [x.mmHash, x.reason]).sort()).toEqual([
      ["a", "check_failed"],
      ["b", "post_failed"],
    ]);
    expect(c.data.openHandles).toBe(0);
  });

  it("an exception while registering the peer tombstones (bad agent metadata in the ack)", () => {
    const { clock, p, c } = setup();
    start(c, clock, "img", 200);
    p.session.pollStep();
    const good = decodeXferAck(p.router.take(c.identity)[0]!, 64);
    c.session.poll([encodeXferAck({ ...good, agentMetadata: new Uint8Array([1, 2, 3]) })], clock.now());
    expect(c.session.takeResults().tombstoned.map((x) => x.reason)).toEqual(["post_failed"]);
  });

  it("PROC past the read deadline -> QUARANTINED (blocks kept) -> leaves PROC -> SETTLED", () => {
    const { clock, p, c } = setup();
    c.data.injectFault({ kind: "stuck" });
    start(c, clock, "img", 200);
    step(p, c, clock);
    expect(c.session.stateOf("img")).toBe(XferState.READING);
    clock.advance(1_001);
    step(p, c, clock);
    let r = c.session.takeResults();
    expect(r.quarantined).toEqual(["img"]);
    expect(r.tombstoned).toEqual([]);
    expect(c.session.stateOf("img")).toBe(XferState.QUARANTINED);
    // the caller detaches the blocks (never frees them) while quarantined
    const held = c.cache.detach("img");
    clock.advance(500);
    step(p, c, clock);
    expect(c.session.takeResults().settled).toEqual([]);
    c.data.unstick();
    step(p, c, clock);
    r = c.session.takeResults();
    expect(r.settled.map((x) => [x.mmHash, x.reason])).toEqual([["img", "settled_DONE"]]);
    expect(counters(c.registry)["consumer_settles"]).toBe(1);
    c.cache.releaseDetached(held, true);
    p.session.pollStep();
    invariants(p, c);
  });

  it("quarantine timeout: released with the guarantee -> READ_FAILED, blocks freeable", () => {
    const { clock, p, c } = setup();
    c.data.injectFault({ kind: "stuck" });
    start(c, clock, "img", 200);
    step(p, c, clock);
    clock.advance(1_001);
    step(p, c, clock);
    expect(c.session.takeResults().quarantined).toEqual(["img"]);
    clock.advance(3_001);
    step(p, c, clock);
    const r = c.session.takeResults();
    expect(r.tombstoned.map((x) => x.reason)).toEqual(["quarantine_timeout"]);
    expect(r.retired).toEqual([]);
    expect(counters(c.registry)["consumer_quarantine_timeouts"]).toBe(1);
    expect(c.data.openHandles).toBe(0);
  });

  it("quarantine timeout without the guarantee retires the blocks; a late write lands only there (EC-CONTRACT 5.2, 8)", () => {
    const { clock, p, c } = setup([
      ["img", 200],
      ["other", 200],
    ]);
    c.data.injectFault({ kind: "stuck_unguaranteed" });
    const blocks = start(c, clock, "img", 200);
    step(p, c, clock);
    clock.advance(1_001);
    step(p, c, clock);
    const held = c.cache.detach("img");
    clock.advance(3_001);
    step(p, c, clock);
    const r = c.session.takeResults();
    expect(r.retired).toEqual([{ mmHash: "img", blocks, reason: "quarantine_timeout" }]);
    expect(counters(c.registry)["consumer_blocks_retired"]).toBe(blocks.length);
    c.cache.releaseDetached(held, false);
    // fill the rest of the cache: the retired blocks are never handed out again
    start(c, clock, "other", 200);
    step(p, c, clock);
    c.cache.markReady("other", c.session.takeResults().completed[0]!.crc32);
    const free = c.cache.freeBlocks;
    const filler = c.cache.allocate("filler", free * 64);
    expect(filler.some((b) => blocks.includes(b))).toBe(false);
    c.data.unstick(); // the late DMA lands in the retired blocks
    expect(c.data.stats.landedAfterRelease).toBe(1);
    expect(bytesEqual(c, "other", 200)).toBe(true);
    c.cache.check();
  });

  it("an exception while polling a quarantined read keeps it quarantined (does not settle)", () => {
    const { clock, p, c } = setup();
    c.data.injectFault({ kind: "stuck" });
    start(c, clock, "img", 200);
    step(p, c, clock);
    clock.advance(1_001);
    step(p, c, clock);
    c.session.takeResults();
    // make every later check throw
    const orig = c.data.checkXferState.bind(c.data);
    c.data.checkXferState = () => {
      throw new Error("boom");
    };
    clock.advance(100);
    step(p, c, clock);
    expect(c.session.takeResults().settled).toEqual([]);
    expect(c.session.stateOf("img")).toBe(XferState.QUARANTINED);
    c.data.checkXferState = orig;
    c.data.unstick();
    step(p, c, clock);
    expect(c.session.takeResults().settled.map((x) => x.mmHash)).toEqual(["img"]);
  });

  it("onPeerDown: WAITING_ACK -> retryable, READING -> QUARANTINED that settles (the seed's leak, EC-CONTRACT 6.4)", () => {
    const { clock, p, c } = setup([
      ["a", 64],
      ["b", 64],
    ]);
    c.data.injectFault({ kind: "stuck" });
    start(c, clock, "a", 64);
    step(p, c, clock); // a is READING (stuck)
    c.dropRequests = true;
    start(c, clock, "b", 64); // b is WAITING_ACK
    c.session.onPeerDown(clock.now());
    let r = c.session.takeResults();
    expect(r.retryable.map((x) => [x.mmHash, x.reason])).toEqual([["b", "peer_down"]]);
    expect(r.quarantined).toEqual(["a"]);
    expect(c.session.stateOf("a")).toBe(XferState.QUARANTINED);
    c.data.unstick();
    step(p, c, clock);
    r = c.session.takeResults();
    expect(r.settled.map((x) => x.mmHash)).toEqual(["a"]);
    expect(c.session.hasInFlight()).toBe(false);
  });

  it("ignores duplicate, unknown and foreign-session acks; drops malformed ones (EC-CONTRACT 6.2)", () => {
    const { clock, p, c } = setup();
    start(c, clock, "img", 200);
    p.session.pollStep();
    const ack = p.router.take(c.identity)[0]!;
    const decoded = decodeXferAck(ack, 64);
    const foreign = encodeXferAck({ ...decoded, sessionId: "someone-else" });
    const unknown = encodeXferAck(nackAck("never-asked", XferStatus.NACK_MISSING));
    c.session.poll([foreign, unknown, new Uint8Array([0xc1]), encode([1, 2]), ack, ack], clock.now());
    const r = c.session.takeResults();
    expect(r.completed.map((x) => x.mmHash)).toEqual(["img"]);
    const k = counters(c.registry);
    expect(k["consumer_ignored_acks"]).toBe(3); // foreign, unknown, duplicate
    expect(k["consumer_malformed_messages"]).toBe(2);
    expect(k["consumer_reads"]).toBe(1);
  });

  it("an OK ack with the wrong block count or nbytes is tombstoned", () => {
    const { clock, p, c } = setup([["img", 200]]);
    start(c, clock, "img", 200);
    p.session.pollStep();
    const good = decodeXferAck(p.router.take(c.identity)[0]!, 64);
    c.session.poll([encodeXferAck({ ...good, srcBlockIndices: good.srcBlockIndices.slice(1) })], clock.now());
    expect(c.session.takeResults().tombstoned[0]!.reason).toMatch(/blocks for 4 local blocks/);
    c.cache.free("img");
    start(c, clock, "img", 200);
    c.session.poll([encodeXferAck({ ...good, nbytes: 100 })], clock.now());
    expect(c.session.takeResults().tombstoned[0]!.reason).toMatch(/nbytes 100 does not fill exactly 4/);
  });

  it("checksum mismatch -> tombstoned and counted; with the check off the corruption gets through", () => {
    const { clock, fabric, p, c } = setup();
    c.data.injectFault({ kind: "corrupt" });
    start(c, clock, "img", 200);
    step(p, c, clock);
    const r = c.session.takeResults();
    expect(r.tombstoned.map((x) => x.reason)).toEqual(["checksum_mismatch"]);
    expect(counters(c.registry)["consumer_checksum_failures"]).toBe(1);
    const c2 = makeConsumer(fabric, p, { verifyChecksum: false });
    c2.data.injectFault({ kind: "corrupt" });
    start(c2, clock, "img", 200);
    step(p, c2, clock);
    expect(c2.session.takeResults().completed.map((x) => x.mmHash)).toEqual(["img"]);
  });

  it("bytes copied from other than the ack's blocks -> tombstoned and counted, with the CRC check off too (docs/ec-protocol.md 3.4)", () => {
    const { clock, fabric, p, c } = setup([
      ["img", 200],
      ["other", 300],
    ]);
    for (const verifyChecksum of [true, false]) {
      const cc = verifyChecksum ? c : makeConsumer(fabric, p, { verifyChecksum });
      cc.data.injectFault({ kind: "wrong_source" });
      start(cc, clock, "img", 200);
      step(p, cc, clock);
      const r = cc.session.takeResults();
      expect(r.completed).toEqual([]);
      expect(r.tombstoned.map((x) => x.reason)).toEqual(["source_mismatch"]);
      expect(counters(cc.registry)["consumer_source_mismatches"]).toBe(1);
      expect(counters(cc.registry)["consumer_checksum_failures"] ?? 0).toBe(0);
      // never promoted (the entry is not ready); freed, then read again from the right blocks
      expect(cc.cache.get("img")?.ready ?? false).toBe(false);
      if (cc.cache.get("img") !== undefined) cc.cache.free("img");
      start(cc, clock, "img", 200);
      step(p, cc, clock);
      const done = cc.session.takeResults().completed;
      expect(done.map((x) => x.mmHash)).toEqual(["img"]);
      cc.cache.markReady("img", done[0]!.crc32);
      expect(bytesEqual(cc, "img", 200)).toBe(true);
      expect(counters(cc.registry)["consumer_source_mismatches"]).toBe(1);
    }
  });

  it("a lost notification leaves the grant until the lease expires (EC-CONTRACT 4.4)", () => {
    const { clock, p, c } = setup();
    c.data.injectFault({ kind: "lost_notification" });
    start(c, clock, "img", 200);
    step(p, c, clock);
    expect(c.session.takeResults().completed).toHaveLength(1);
    p.session.pollStep();
    expect(p.cache.get("img")!.pins).toBe(1);
    clock.advance(5_001);
    p.session.pollStep();
    expect(p.cache.get("img")!.pins).toBe(0);
    expect(p.data.grantCount).toBe(0);
    expect(counters(p.registry)["producer_lease_expiries"]).toBe(1);
  });

  it("a delayed read completes once the clock passes the delay", () => {
    const { clock, p, c } = setup();
    c.data.injectFault({ kind: "delay", ms: 500 });
    start(c, clock, "img", 200);
    step(p, c, clock);
    expect(c.session.takeResults().completed).toEqual([]);
    clock.advance(500);
    step(p, c, clock);
    expect(c.session.takeResults().completed).toHaveLength(1);
  });

  it("re-request while a grant is held releases the old pin first (the seed's fix)", () => {
    const { clock, p, c } = setup();
    c.dropRequests = false;
    start(c, clock, "img", 200);
    p.session.pollStep();
    p.router.take(c.identity); // the ack is lost: the consumer times out and asks again
    clock.advance(2_001);
    step(p, c, clock);
    expect(c.session.takeResults().retryable).toHaveLength(1);
    c.session.startXfer("img", c.cache.get("img")!.blocks, clock.now() + 2_000, 200);
    p.session.pollStep();
    expect(p.cache.get("img")!.pins).toBe(1); // not 2
    expect(counters(p.registry)["producer_regrants"]).toBe(1);
    c.session.poll(p.router.take(c.identity), clock.now());
    expect(c.session.takeResults().completed).toHaveLength(1);
    p.session.pollStep();
    expect(p.cache.get("img")!.pins).toBe(0);
  });

  it("a notification still in flight when the same key is re-granted is stale: it does not end the new grant", () => {
    const { clock, p, c } = setup();
    start(c, clock, "img", 200);
    step(p, c, clock); // read 1 done; its notification waits in the producer's data plane
    c.cache.markReady("img", c.session.takeResults().completed[0]!.crc32);
    c.cache.free("img");
    start(c, clock, "img", 200); // same session, same key, reaches the producer in the same step
    p.session.pollStep(); // regrant first (4.1 order), then the old notification is drained
    expect(p.data.stats.staleNotifications).toBe(1);
    expect(p.cache.get("img")!.pins).toBe(1); // the new grant holds its pin
    c.session.poll(p.router.take(c.identity), clock.now());
    expect(c.session.takeResults().completed).toHaveLength(1); // read 2 is served
    p.session.pollStep();
    expect(p.cache.get("img")!.pins).toBe(0);
    expect(counters(p.registry)["producer_regrants"]).toBe(1);
  });

  it("producer restart: new metadata -> the consumer re-registers the peer", () => {
    const clock = new Clock();
    const fabric = new LoopbackFabric({ now: clock.now });
    const p1 = makeProducer(fabric, clock, [["img", 200]]);
    const c = makeConsumer(fabric, p1);
    start(c, clock, "img", 200);
    step(p1, c, clock);
    expect(c.session.takeResults().completed).toHaveLength(1);
    const first = c.session.agentName;
    await_(p1.data.close());
    c.cache.free("img");
    // the restarted producer has the same name, a new instance id, and the same router inbox
    const p2 = makeProducer(fabric, clock, [["img", 200]]);
    start(c, clock, "img", 200);
    p2.router.inbox.push(...p1.router.inbox.splice(0));
    step(p2, c, clock);
    const done = c.session.takeResults().completed;
    expect(done).toHaveLength(1);
    expect(c.session.agentName).not.toBe(first);
    c.cache.markReady("img", done[0]!.crc32);
    expect(bytesEqual(c, "img", 200)).toBe(true);
  });

  it("reads outside a grant are refused by the remote (EC-CONTRACT 5.3)", () => {
    const { clock, p, c } = setup([["img", 200]]);
    start(c, clock, "img", 200);
    p.session.pollStep();
    const ack = decodeXferAck(p.router.take(c.identity)[0]!, 64);
    const agent = c.data.addRemotePeer(ack.agentMetadata, ack.memDescriptor);
    const key = new TextEncoder().encode(`${c.session.sessionId}:img`);
    const local = c.cache.get("img")!.blocks;
    const wrongBlocks = ack.srcBlockIndices.map((b) => b + 1);
    const h1 = c.data.postRead(local, agent, wrongBlocks, key);
    expect(c.data.checkXferState(h1)).toBe("ERR");
    const h2 = c.data.postRead(local, agent, ack.srcBlockIndices, new TextEncoder().encode("nobody:img"));
    expect(c.data.checkXferState(h2)).toBe("ERR");
    expect(p.data.stats.refused).toBe(2);
    const h3 = c.data.postRead(local, agent, ack.srcBlockIndices, key);
    expect(c.data.checkXferState(h3)).toBe("DONE");
  });

  it("malformed control messages reach the producer: dropped, counted, nothing sent back", () => {
    const { p } = setup();
    const id = Buffer.from("x");
    for (const frames of [
      [new Uint8Array([0xc1])],
      [encode("str")],
      [encode({ mm_hash: 1 })],
      [],
      [encode({}), encode({})],
    ]) {
      p.router.inbox.push({ identity: id, frames });
    }
    p.session.pollStep();
    expect(p.router.take("x")).toEqual([]);
    expect(counters(p.registry)["producer_malformed_messages"]).toBe(5);
  });

  it("close() on the producer unpins every grant exactly once (EC-CONTRACT 4.5)", async () => {
    const { clock, p, c } = setup([
      ["a", 64],
      ["b", 64],
    ]);
    c.data.setFault({ kind: "stuck" });
    start(c, clock, "a", 64);
    start(c, clock, "b", 64);
    step(p, c, clock);
    expect(p.cache.pinnedBlocks).toBe(2);
    await p.session.close();
    expect(p.cache.pinnedBlocks).toBe(0);
    expect(p.router.closed).toBe(true);
    c.session.close();
    const r = c.session.takeResults();
    expect(r.tombstoned.map((x) => x.reason)).toEqual(["session_closed", "session_closed"]);
  });

  it("counts producer evictions and keeps the free/pinned gauges current", () => {
    const { p } = setup([["img", 200]]);
    p.cache.allocate("filler", 61 * 64); // 60 blocks are free: img (LRU, unpinned) is evicted
    p.session.pollStep();
    const snap = p.registry.snapshot();
    expect(snap.counters["producer_evictions"]).toBe(1);
    expect(snap.gauges["producer_free_blocks"]).toBe(3);
    expect(snap.gauges["producer_pinned_blocks"]).toBe(0);
  });

  it("guards transitions", () => {
    const x = new ConsumerXfer("h", [0], 0, undefined, { debug() {} } as never);
    expect(() => x.transition([XferState.READING], XferState.DONE)).toThrow(EcError);
    x.transition([XferState.WAITING_ACK], XferState.READING);
    expect(() => x.transition([XferState.READING], XferState.SETTLED)).toThrow(/READING -> SETTLED/);
  });

  it("keeps section 8 invariants under random faults (property)", () => {
    const fault = fc.constantFrom(
      null,
      { kind: "delay", ms: 300 } as const,
      { kind: "stuck" } as const,
      { kind: "stuck_unguaranteed" } as const,
      { kind: "error" } as const,
      { kind: "lost_notification" } as const,
      { kind: "corrupt" } as const,
      { kind: "throw_on_check" } as const,
      { kind: "throw_on_post" } as const,
    );
    const action = fc.record({
      hash: fc.constantFrom("a", "b", "c", "d", "missing"),
      fault,
      dropReq: fc.boolean(),
      advance: fc.integer({ min: 0, max: 1_500 }),
      peerDown: fc.boolean(),
      unstick: fc.boolean(),
    });
    fc.assert(
      fc.property(fc.array(action, { minLength: 1, maxLength: 30 }), (actions) => {
        const clock = new Clock();
        const fabric = new LoopbackFabric({ now: clock.now });
        const sizes: [string, number][] = [
          ["a", 64],
          ["b", 200],
          ["c", 1],
          ["d", 640],
        ];
        const p = makeProducer(fabric, clock, sizes);
        const c = makeConsumer(fabric, p);
        const held = new Map<string, number>();
        const size = new Map(sizes);
        const collect = () => {
          const r = c.session.takeResults();
          // quarantined first: a read can be quarantined and settle within one poll
          for (const h of r.quarantined) held.set(h, c.cache.detach(h));
          for (const x of r.completed) {
            c.cache.markReady(x.mmHash, x.crc32);
            expect(bytesEqual(c, x.mmHash, x.nbytes)).toBe(true);
            c.cache.free(x.mmHash);
          }
          for (const x of [...r.tombstoned, ...r.retryable, ...r.settled, ...r.retired]) {
            const h = held.get(x.mmHash);
            const reuse = !r.retired.includes(x);
            if (h !== undefined) {
              held.delete(x.mmHash);
              c.cache.releaseDetached(h, reuse);
            } else if (reuse) c.cache.free(x.mmHash);
            else c.cache.retire(x.mmHash);
          }
        };
        for (const a of actions) {
          if (a.fault !== null) c.data.injectFault(a.fault);
          c.dropRequests = a.dropReq;
          if (c.session.stateOf(a.hash) === undefined && !held.has(a.hash) && !c.cache.has(a.hash)) {
            start(c, clock, a.hash, size.get(a.hash) ?? 100);
          }
          step(p, c, clock);
          collect();
          if (a.peerDown) c.session.onPeerDown(clock.now());
          if (a.unstick) c.data.unstick();
          clock.advance(a.advance);
          step(p, c, clock);
          collect();
          p.cache.check();
          c.cache.check();
        }
        // settle everything: let every timer fire
        c.data.unstick();
        for (let i = 0; i < 4; i++) {
          clock.advance(6_000);
          step(p, c, clock);
          collect();
        }
        expect(c.session.hasInFlight()).toBe(false);
        expect(held.size).toBe(0);
        invariants(p, c);
        expect(c.cache.freeBlocks + c.cache.retiredBlocks).toBe(c.cache.numBlocks);
      }),
      { numRuns: 150 },
    );
  });
});
