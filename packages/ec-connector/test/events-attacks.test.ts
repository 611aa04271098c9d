import { connect } from "node:net";
import { isAlive, rssOf, watchRss } from "@tapwire/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Dealer, Subscriber } from "zeromq";
import { EcAdminClient, EcDirectory, EcProducer, newCurveKeyPair } from "../src/index.js";
import type { ProducerProc } from "./helpers/proc.js";
import { spawnProducer, until } from "./helpers/proc.js";
// @ts-expect-error: plain .mjs written from the contract (no types on purpose)
import { decode, encodeFlat } from "./independent/subscriber.mjs";

// EC-CONTRACT 10.2 / 9.1 / 9.4 on the two new sockets: hostile peers on loopback, bounded in count
// and time. Each attack checks that the producer stays up, keeps answering a well-formed request,
// and that a counter names what was dropped.
const MiB = 1024 * 1024;
const te = new TextEncoder();

type Msg = Record<string, unknown>;

/** A replay client from the contract: sends one map, collects replies until `end`. */
async function ask(endpoint: string, req: Msg, timeoutMs = 15_000, d?: Dealer): Promise<Msg[]> {
  const dealer = d ?? new Dealer({ linger: 0 });
  if (d === undefined) dealer.connect(endpoint);
  dealer.receiveTimeout = timeoutMs;
  try {
    await dealer.send(encodeFlat(req));
    const out: Msg[] = [];
    for (;;) {
      const [f] = await dealer.receive();
      const m = decode(f) as Msg;
      if (m["request_id"] !== req["request_id"]) continue;
      out.push(m);
      if (m["kind"] === "end") return out;
    }
  } finally {
    if (d === undefined) dealer.close();
  }
}

async function sendRaw(endpoint: string, msgs: Uint8Array[][]): Promise<void> {
  const d = new Dealer({ linger: 0 });
  d.connect(endpoint);
  try {
    for (const m of msgs) await d.send(m);
    await new Promise((r) => setTimeout(r, 50));
  } finally {
    d.close();
  }
}

describe("the events and replay sockets under attack (EC-CONTRACT 10.2, 9.1)", () => {
  let p: ProducerProc;
  let admin: EcAdminClient;
  let replay: string;
  let events: string;
  let incarnation: string;

  beforeAll(async () => {
    p = await spawnProducer([
      "--num-blocks",
      "256",
      "--block-bytes",
      "1024",
      "--events-listen",
      "tcp://127.0.0.1:0",
      "--replay-listen",
      "tcp://127.0.0.1:0",
      "--events-heartbeat-ms",
      "500",
      "--log-level",
      "error",
    ]);
    const l = p.handle.readyLine.json!;
    replay = String(l["replay"]);
    events = String(l["events"]);
    incarnation = String(l["incarnation"]);
    admin = new EcAdminClient(p.admin);
    const batch: Promise<unknown>[] = [];
    for (let i = 0; i < 2000; i++) batch.push(admin.encode(`h${i}`, 100 + (i % 900)));
    await Promise.all(batch);
  });
  afterAll(async () => {
    admin.close();
    await p.kill();
  });

  async function counters(): Promise<Record<string, number>> {
    const s = (await admin.stats()) as { metrics: { counters: Record<string, number> } };
    return s.metrics.counters;
  }

  /** A well-formed request from a fresh peer is answered, ending with `end`. */
  async function served(): Promise<void> {
    const r = await ask(replay, { request_id: "ok", incarnation, since: 1_000_000 });
    expect(r.at(-1)?.["kind"]).toBe("end");
  }

  it("garbage, nesting, wrong types, a long request_id, a negative since and multipart: dropped unanswered and counted", async () => {
    const before = (await counters())["producer_replay_malformed"] ?? 0;
    const nested = new Uint8Array(60 * 1024).fill(0x91);
    nested.set([0x81, 0xaa, ...te.encode("request_id")], 0);
    const bad: Uint8Array[][] = [
      [new Uint8Array([0xc1, 0x00, 0xff])], // not MessagePack
      [nested], // a nesting bomb: refused at its first nested byte
      [encodeFlat({ request_id: "a", incarnation: "", since: "zero" })], // since is not an integer
      [encodeFlat({ request_id: "x".repeat(65), incarnation: "", since: 0 })], // request_id over 64 bytes
      [encodeFlat({ request_id: "a", incarnation: "" })], // since missing
      [
        Uint8Array.from([
          0x83,
          0xaa,
          ...te.encode("request_id"),
          0xa1,
          0x61,
          0xab,
          ...te.encode("incarnation"),
          0xa0,
          0xa5,
          ...te.encode("since"),
          0xff,
        ]),
      ], // since -1
      [
        Uint8Array.from([
          0x83,
          0xaa,
          ...te.encode("request_id"),
          0xa1,
          0x61,
          0xab,
          ...te.encode("incarnation"),
          0xa0,
          0xa5,
          ...te.encode("since"),
          0xcb,
          0x40,
          0,
          0,
          0,
          0,
          0,
          0,
          0,
        ]),
      ], // since 2.0 (a float)
      [encodeFlat({ request_id: "a", incarnation: "", since: 0 }), new Uint8Array([0x90])], // multipart
    ];
    const d = new Dealer({ linger: 0 });
    d.connect(replay);
    d.receiveTimeout = 300;
    for (const m of bad) await d.send(m);
    await until(async () => {
      const c = await counters();
      return (c["producer_replay_malformed"] ?? 0) - before >= bad.length ? true : undefined;
    });
    // Nothing came back for any of them.
    await expect(d.receive()).rejects.toThrow();
    d.close();
    expect(((await counters())["producer_replay_malformed"] ?? 0) - before).toBe(bad.length);
    await served();
  });

  it("an over-64-KiB request is dropped by the socket (connection closed, counted); raw garbage on both ports does not stop the stream", async () => {
    const before = (await counters())["producer_replay_disconnects"] ?? 0;
    await sendRaw(replay, [[encodeFlat({ request_id: "a", incarnation: "x".repeat(100 * 1024), since: 0 })]]);
    await until(async () => ((await counters())["producer_replay_disconnects"] ?? 0) > before || undefined);
    for (const ep of [replay, events]) {
      const [host, port] = ep.replace("tcp://", "").split(":");
      await new Promise<void>((resolve) => {
        // Not a ZMTP greeting; the socket may wait for more, so the attacker hangs up itself.
        const s = connect(Number(port), host!, () => {
          s.write(Buffer.alloc(4096, 0xab));
          setTimeout(() => s.destroy(), 300);
        });
        s.on("close", () => resolve());
        s.on("error", () => resolve());
      });
    }
    const sub = new Subscriber({ linger: 0, receiveTimeout: 10_000 });
    sub.subscribe();
    sub.connect(events);
    const [hello] = await sub.receive();
    sub.close();
    expect((decode(hello) as Msg)["incarnation"]).toBe(incarnation);
    await served();
    expect(isAlive(p.child.pid!)).toBe(true);
  });

  it("a flood of 1,000 full replays from one peer that never reads: older answers replaced, RSS within 64 MiB", async () => {
    const idle = rssOf(p.child.pid!);
    const rss = watchRss(p.child.pid!);
    const before = await counters();
    const d = new Dealer({ linger: 0, receiveHighWaterMark: 10 });
    d.connect(replay);
    for (let i = 0; i < 1000; i++) await d.send(encodeFlat({ request_id: `f${i}`, incarnation, since: 1 }));
    await until(async () => {
      const c = await counters();
      return (c["producer_replay_requests"] ?? 0) - (before["producer_replay_requests"] ?? 0) >= 1000
        ? c
        : undefined;
    }, 60_000);
    await served(); // during: another peer is answered
    const after = await counters();
    const peak = rss.stop().peakBytes;
    d.close();
    expect(
      after["producer_replay_answers_replaced"]! - (before["producer_replay_answers_replaced"] ?? 0),
    ).toBeGreaterThan(0);
    expect(peak - idle).toBeLessThan(64 * MiB);
    await served(); // after
  });

  it("beyond 256 peers within 30 s, requests of new peers are dropped and counted; known peers are still served", async () => {
    const before = (await counters())["producer_replay_peers_refused"] ?? 0;
    const peers: Dealer[] = [];
    try {
      // Earlier tests made a few peers already; fill the table to 256 and then 20 more.
      const known = (await counters())["producer_replay_requests"] ?? 0;
      void known;
      let answered = 0;
      for (let i = 0; i < 276; i++) {
        const d = new Dealer({ linger: 0 });
        d.connect(replay);
        peers.push(d);
      }
      const results = await Promise.all(
        peers.map((d, i) =>
          ask(replay, { request_id: `p${i}`, incarnation, since: 1_000_000 }, 3_000, d).then(
            () => true,
            () => false,
          ),
        ),
      );
      answered = results.filter(Boolean).length;
      const refused = ((await counters())["producer_replay_peers_refused"] ?? 0) - before;
      expect(answered).toBeLessThanOrEqual(256);
      expect(answered + refused).toBe(276);
      expect(refused).toBeGreaterThanOrEqual(20);
      // A peer already in the table is still answered.
      const first = results.indexOf(true);
      const again = await ask(
        replay,
        { request_id: "again", incarnation, since: 1_000_000 },
        5_000,
        peers[first]!,
      );
      expect(again.at(-1)?.["kind"]).toBe("end");
    } finally {
      for (const d of peers) d.close();
    }
    expect(isAlive(p.child.pid!)).toBe(true);
  });
});

it("EC-CONTRACT 9.4: with CURVE keys both new sockets accept only allowed subscribers (refusals counted)", async () => {
  const server = newCurveKeyPair();
  const allowed = newCurveKeyPair();
  const other = newCurveKeyPair();
  const { makeTlsCredentials } = await import("@tapwire/testing");
  const tls = makeTlsCredentials();
  const producer = await EcProducer.start({
    numBlocks: 64,
    blockBytes: 1024,
    data: "tls://127.0.0.1:0",
    curve: { ...server, allow: [allowed.publicKey] },
    tls: { cert: tls.serverCert, key: tls.serverKey, ca: tls.ca },
    events: "tcp://127.0.0.1:0",
    replay: "tcp://127.0.0.1:0",
    eventsHeartbeatMs: 100,
    prepopulate: [["img", 1000]],
  });
  const ev = producer.events!;
  const keys = (k: typeof allowed) => ({
    curveServerKey: server.publicKey,
    curvePublicKey: k.publicKey,
    curveSecretKey: k.secretKey,
  });
  const good = new Dealer({ linger: 0, ...keys(allowed) });
  good.connect(ev.replayEndpoint);
  const goodSub = new Subscriber({ linger: 0, receiveTimeout: 10_000, ...keys(allowed) });
  goodSub.subscribe();
  goodSub.connect(ev.eventsEndpoint);
  const bad = new Dealer({ linger: 0, receiveTimeout: 1_000, ...keys(other) });
  bad.connect(ev.replayEndpoint);
  const badSub = new Subscriber({ linger: 0, receiveTimeout: 1_000, ...keys(other) });
  badSub.subscribe();
  badSub.connect(ev.eventsEndpoint);
  const plain = new Subscriber({ linger: 0, receiveTimeout: 1_000 });
  plain.subscribe();
  plain.connect(ev.eventsEndpoint);
  try {
    const r = await ask(ev.replayEndpoint, { request_id: "k", incarnation: "", since: 0 }, 10_000, good);
    expect(r.find((m) => m["kind"] === "snapshot")?.["mm_hashes"]).toEqual(["img"]);
    expect((decode((await goodSub.receive())[0]) as Msg)["kind"]).toBe("hello");
    void bad.send(encodeFlat({ request_id: "b", incarnation: "", since: 0 })).catch(() => undefined);
    await expect(bad.receive()).rejects.toThrow();
    await expect(badSub.receive()).rejects.toThrow();
    await expect(plain.receive()).rejects.toThrow();
    expect(producer.registry.snapshot().counters["producer_curve_handshakes_refused"]).toBeGreaterThanOrEqual(
      2,
    );
    // EcDirectory with the allowed key pair follows the producer; with another key it never trusts it
    const rec = { control: producer.controlEndpoint, events: ev.eventsEndpoint, replay: ev.replayEndpoint };
    const dir = new EcDirectory({ producers: [rec], curve: { ...allowed, serverKey: server.publicKey } });
    const stranger = new EcDirectory({ producers: [rec], curve: { ...other, serverKey: server.publicKey } });
    try {
      await until(
        () => (dir.holders("img").length === 1 ? true : undefined),
        10_000,
        "curve directory trusted",
      );
      expect(stranger.view(rec.control)?.trusted).toBe(false);
    } finally {
      dir.close();
      stranger.close();
    }
  } finally {
    for (const s of [good, goodSub, bad, badSub, plain]) s.close();
    await producer.close();
  }
});
