/**
 * The --events cases must fail a broken producer: a relay in front of a conforming
 * tapwire-ec-producer (its PUB re-published, its replay ROUTER proxied) plants one defect, and
 * exactly the cases that check that rule FAIL.
 */
import type { ChildHandle } from "@tapwire/testing";
import { killAllChildren, spawnBin } from "@tapwire/testing";
import { afterAll, beforeAll, expect, it } from "vitest";
import { Dealer, Publisher, Router, Subscriber } from "zeromq";
import type { Typed } from "../src/ec/msgpack.js";
import { decodeTyped, mpMap, mpStr, mpUint } from "../src/ec/msgpack.js";
import { runEcEventsSuite } from "../src/index.js";
import { binPath } from "./helpers.js";

function enc(t: Typed): Uint8Array {
  switch (t.t) {
    case "int":
      return mpUint(t.v);
    case "str":
      return mpStr(t.v);
    case "bool":
      return Uint8Array.of(t.v ? 0xc3 : 0xc2);
    case "nil":
      return Uint8Array.of(0xc0);
    case "array": {
      const head =
        t.v.length < 16
          ? Uint8Array.of(0x90 | t.v.length)
          : Uint8Array.of(0xdc, t.v.length >> 8, t.v.length & 0xff);
      return new Uint8Array(Buffer.concat([head, ...t.v.map(enc)]));
    }
    case "map":
      return mpMap(t.v.map(([k, v]) => [(k as { v: string }).v, enc(v)]));
    default:
      throw new Error(`relay cannot re-encode ${t.t}`);
  }
}

/** Rewrites the int under `key` of a map message. */
function mapKey(bytes: Uint8Array, key: string, f: (n: number) => number): Uint8Array {
  let t: Typed;
  try {
    t = decodeTyped(bytes, 4);
  } catch {
    return bytes;
  }
  if (t.t !== "map") return bytes;
  for (const e of t.v)
    if (e[0].t === "str" && e[0].v === key && e[1].t === "int") e[1] = { t: "int", v: f(e[1].v) };
  return enc(t);
}

function kindOf(bytes: Uint8Array): string {
  const t = decodeTyped(bytes, 4);
  if (t.t !== "map") return "";
  const k = t.v.find(([x]) => x.t === "str" && x.v === "kind")?.[1];
  return k?.t === "str" ? k.v : "";
}

interface Defect {
  /** Every seq from this one on is published one higher (a skipped seq), on both sockets. */
  skipAfter?: number;
  /** Swap each pair of consecutive stored/evicted live messages. */
  reorder?: boolean;
}

async function relay(events: string, replay: string, d: Defect) {
  const sub = new Subscriber({ linger: 0 });
  sub.subscribe();
  sub.connect(events);
  const pub = new Publisher({ linger: 0 });
  await pub.bind("tcp://127.0.0.1:0");
  const router = new Router({ linger: 0 });
  await router.bind("tcp://127.0.0.1:0");
  const up = new Dealer({ linger: 0 });
  up.connect(replay);
  const k = d.skipAfter ?? Number.POSITIVE_INFINITY;
  const out = (s: number) => (s >= k ? s + 1 : s);
  const inn = (s: number) => (s >= k + 1 ? s - 1 : s);
  let pubChain = Promise.resolve();
  let routerChain = Promise.resolve();
  const send = (m: Uint8Array) => {
    pubChain = pubChain.then(() => pub.send(m)).catch(() => undefined);
  };
  const ids: Buffer[] = [];
  void (async () => {
    let held: Uint8Array | null = null;
    for await (const [m] of sub) {
      const x = mapKey(m!, "seq", out);
      const kind = kindOf(x);
      if (d.reorder === true && (kind === "stored" || kind === "evicted")) {
        if (held === null) {
          held = x;
          continue;
        }
        send(x);
        send(held);
        held = null;
        continue;
      }
      if (held !== null) send(held);
      held = null;
      send(x);
    }
  })().catch(() => undefined);
  void (async () => {
    for await (const [id, m] of router) {
      ids.push(id!); // one tester peer at a time in these cases: answers go to the last asker
      await up.send(mapKey(m!, "since", inn));
    }
  })().catch(() => undefined);
  void (async () => {
    for await (const [m] of up) {
      const id = ids.at(-1);
      if (id === undefined) continue;
      const x = mapKey(m!, "seq", out);
      routerChain = routerChain.then(() => router.send([id, x])).catch(() => undefined);
    }
  })().catch(() => undefined);
  return {
    events: pub.lastEndpoint!,
    replay: router.lastEndpoint!,
    close() {
      for (const s of [sub, pub, router, up]) s.close();
    },
  };
}

let p: ChildHandle;
let l: Record<string, unknown> = {};
beforeAll(async () => {
  p = await spawnBin(
    binPath("@tapwire/ec-connector", "tapwire-ec-producer"),
    [
      "--num-blocks",
      "2048",
      "--block-bytes",
      "1024",
      "--events-listen",
      "tcp://127.0.0.1:0",
      "--replay-listen",
      "tcp://127.0.0.1:0",
      "--events-heartbeat-ms",
      "300",
      "--log-level",
      "error",
    ],
    { timeoutMs: 30_000 },
  );
  l = p.readyLine.json ?? {};
});
afterAll(async () => {
  await p?.kill("SIGTERM");
  await killAllChildren();
});

const CASES = "10.1.1,10.1.2,10.1.4,10.1.5,10.1.6,10.1.7,10.1.9,10.1.10,10.1.11,10.1.3,10.2.1,10.2.2,10.2.3";

async function failed(d: Defect): Promise<string[]> {
  const r = await relay(String(l["events"]), String(l["replay"]), d);
  try {
    const rep = await runEcEventsSuite(
      { events: r.events, replay: r.replay, admin: String(l["admin"]), numBlocks: 2048, blockBytes: 1024 },
      { cases: CASES },
    );
    return rep.results.filter((x) => x.verdict === "FAILED").map((x) => x.id);
  } finally {
    r.close();
  }
}

it("EC-CONTRACT 10.1/10.2: the relay without a defect passes", { timeout: 120_000 }, async () => {
  expect(await failed({})).toEqual([]);
});

it("a producer that skips a seq fails exactly the seq cases (10.1.3 live; 10.1.9, 10.2.2, 10.2.3 replaying across the skip)", {
  timeout: 120_000,
}, async () => {
  const seq = Number((await fetchSeq()) ?? 0);
  expect(await failed({ skipAfter: seq + 3 })).toEqual(["10.1.9", "10.1.3", "10.2.2", "10.2.3"]);
});

it("a producer that reorders changes fails exactly the order cases (10.1.7 and 10.1.3)", {
  timeout: 120_000,
}, async () => {
  expect(await failed({ reorder: true })).toEqual(["10.1.7", "10.1.3"]);
});

/** The producer's current seq (from a replay end, asked directly). */
async function fetchSeq(): Promise<number | null> {
  const d = new Dealer({ linger: 0, receiveTimeout: 5000 });
  d.connect(String(l["replay"]));
  try {
    await d.send(
      mpMap([
        ["request_id", mpStr("s")],
        ["incarnation", mpStr("")],
        ["since", mpUint(1 << 30)],
      ]),
    );
    for (;;) {
      const [m] = await d.receive();
      const t = decodeTyped(m!, 4);
      if (t.t !== "map") continue;
      const get = (k: string) => t.v.find(([x]) => x.t === "str" && x.v === k)?.[1];
      const kind = get("kind");
      if (kind?.t === "str" && kind.v === "end") {
        const s = get("seq");
        return s?.t === "int" ? s.v : null;
      }
    }
  } finally {
    d.close();
  }
}
