// Over 500 lines on purpose: one table of the ec-producer --events cases, one per sentence of
// EC-CONTRACT 10.1 / 10.2 / 10.5; the sockets and checks they share are in events-ctx.ts.
/**
 * The ec-producer `--events` mode: EC-CONTRACT 10.1 (the PUB stream), 10.2 (replay and snapshot)
 * and 10.5 (admin evict) against a producer's events and replay endpoints, from raw ZeroMQ
 * sockets, every message decoded by the tester's own type-keeping MessagePack reader and checked
 * against the tables of the contract. Changes are driven through the producer's admin socket
 * (`encode` / `evict`, EC-CONTRACT 9.3 and 10.5) when `--admin` is given.
 */
import { randomUUID } from "node:crypto";
import { Dealer } from "zeromq";
import type { RunReport } from "../report.js";
import { makeReport } from "../report.js";
import type { CaseCheck, CaseDef, RunOptions } from "../runner.js";
import { runCases } from "../runner.js";
import type { EcEventsSuiteOptions, Ev } from "./events-ctx.js";
import {
  applyLog,
  checkAnswer,
  EcEventsCtx,
  EVENT_KEYS,
  flat,
  hex,
  MAX_PEERS,
  MIN_RING,
  problemsOf,
  setOfSnapshot,
  str,
  tag,
} from "./events-ctx.js";
import type { Typed } from "./msgpack.js";
import { decodeTyped, mapEntries, mpFloat, mpMap, mpNestingBomb, mpStr, mpUint } from "./msgpack.js";

export type { EcEventsSuiteOptions } from "./events-ctx.js";
export { EcEventsCtx } from "./events-ctx.js";

type E = CaseDef<EcEventsCtx>;

const C101 =
  'EC-CONTRACT 10.1: one MessagePack map per message: single-frame, no topic prefix, at most 65,280 bytes, flat (the only array is mm_hashes, of strings); every event map has {"incarnation": str, "seq": int, "kind": str, "mm_hashes": [str], "free_blocks": int, "num_blocks": int}; incarnation is a UUID (lowercase, 8-4-4-4-12).';
const C102 =
  "EC-CONTRACT 10.2: when incarnation is the producer's and messages since + 1 .. are all still in its ring (at least the last 4,096 messages), the answer is those messages in order, each as published plus request_id; either answer ends with {kind: end, request_id, incarnation, seq, heartbeat_ms}.";
const C102S =
  'EC-CONTRACT 10.2: otherwise the answer is a snapshot: pages {"kind": "snapshot", "request_id", "incarnation", "seq", "page": int, "more": bool, "mm_hashes": [str], "free_blocks", "num_blocks"}, numbered from 0, every page with the same seq (the last published message), each page within the limits of 10.1, the last with more: false.';
const C102M =
  "EC-CONTRACT 10.2: the request is decoded as in 3 (unknown keys ignored; malformed, a negative since included: dropped unanswered, counted); request_id at most 64 bytes.";

const EVENT_CASES: E[] = [
  {
    id: "10.1.1",
    title:
      "a live message is one single-frame flat map with exactly the keys and types of 10.1; incarnation a lowercase UUID",
    cite: C101,
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const e = await ctx.waitLive(() => true, 0, 3 * 2000 + ctx.timeoutMs);
      t.must(
        e !== null,
        "a live message within three default heartbeats (a hello every heartbeat_ms)",
        "none",
      );
      t.must(e.problems.length === 0, "a message within the table of 10.1", () => e.problems.join("; "));
      const extra = [...e.m.keys()].filter((k) => !EVENT_KEYS.includes(k) && k !== "heartbeat_ms");
      if (extra.length > 0) t.note(`extra keys ${extra.join(", ")} (allowed: subscribers ignore them)`);
    },
  },
  {
    id: "10.1.2",
    title: "hellos carry heartbeat_ms and come every heartbeat_ms whether or not anything changed",
    cite: 'EC-CONTRACT 10.1: "hello": no hashes, with one more key "heartbeat_ms": int; sent as seq 1 at start and then every heartbeat_ms (default 2,000), whether or not anything changed.',
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const a = await ctx.nextHello();
      t.must(a !== null, "a hello", "none within three heartbeats");
      // Three intervals, averaged: one late timer or a busy tester does not decide the case.
      let b: Ev = a;
      for (let i = 0; i < 3; i++) {
        const n = await ctx.nextHello(ctx.live.indexOf(b) + 1);
        t.must(n !== null, `another hello within three heartbeats (${3 * a.hb} ms)`, "none");
        b = n;
      }
      const gap = (b.at - a.at) / 3;
      t.must(
        gap >= a.hb * 0.5,
        `hellos about heartbeat_ms ${a.hb} apart (mean of three), not much sooner`,
        `${gap.toFixed(0)} ms`,
      );
      t.should(
        gap <= a.hb * 2,
        `hellos about heartbeat_ms ${a.hb} apart (mean of three)`,
        `${gap.toFixed(0)} ms`,
      );
      t.must(b.hb === a.hb, "the same heartbeat_ms in every hello", `${a.hb} then ${b.hb}`);
    },
  },
  {
    id: "10.1.4",
    title: "an admin encode of a new mm_hash publishes it as stored; free_blocks right after the change",
    cite: "EC-CONTRACT 10.1: \"stored\": these entries became ready; free_blocks is the cache's free count right after the message's last change.",
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      ctx.needAdmin(t);
      const h = tag();
      const from = ctx.live.length;
      const before = ctx.live.at(-1);
      const r = await ctx.admin("encode", { mm_hash: str(h), nbytes: mpUint(3000) });
      t.must(r?.get("result")?.t === "str", "an admin encode result", "no reply");
      const e = await ctx.waitLive((x) => x.kind === "stored" && x.hashes.includes(h), from, 3 * 2000);
      t.must(e !== null, `a stored message naming ${h}`, "none");
      const bb = ctx.opts.blockBytes;
      const only = ctx.live.slice(from, ctx.live.indexOf(e) + 1).filter((x) => x.kind !== "hello");
      if (bb !== undefined && before !== undefined && only.length === 1 && e.hashes.length === 1) {
        const need = Math.ceil(3000 / bb);
        t.must(
          before.free - e.free === need,
          `free_blocks down by ${need} blocks`,
          `${before.free} → ${e.free}`,
        );
      } else t.note("free_blocks arithmetic not checked (no --block-bytes or other changes in between)");
    },
  },
  {
    id: "10.1.5",
    title: "re-encoding a ready entry publishes nothing",
    cite: "EC-CONTRACT 10.1: re-encoding an entry that is already ready publishes nothing.",
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      ctx.needAdmin(t);
      const h = tag();
      await ctx.admin("encode", { mm_hash: str(h), nbytes: mpUint(100) });
      const first = await ctx.waitLive((x) => x.kind === "stored" && x.hashes.includes(h), 0, 6000);
      t.must(first !== null, `a stored message naming ${h}`, "none");
      const from = ctx.live.length;
      await ctx.admin("encode", { mm_hash: str(h), nbytes: mpUint(100) });
      const hello = await ctx.nextHello(from);
      t.must(hello !== null, "the next hello", "none");
      const again = ctx.live.slice(from).filter((x) => x.hashes.includes(h));
      t.must(again.length === 0, `no message naming ${h} again`, () =>
        again.map((x) => `${x.kind}@${x.seq}`).join(","),
      );
    },
  },
  {
    id: "10.1.6",
    title: "an admin evict publishes evicted; evicting a missing entry publishes nothing",
    cite: 'EC-CONTRACT 10.1: "evicted": these entries left the cache, for any reason (eviction to make room, admin evict).',
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      ctx.needAdmin(t);
      const h = tag();
      await ctx.admin("encode", { mm_hash: str(h), nbytes: mpUint(100) });
      await ctx.waitLive((x) => x.kind === "stored" && x.hashes.includes(h), 0, 6000);
      const from = ctx.live.length;
      const r = await ctx.admin("evict", { mm_hash: str(h) });
      const res = r?.get("result");
      t.must(res?.t === "str" && res.v === "evicted", 'admin evict → "evicted"', () => JSON.stringify(res));
      const e = await ctx.waitLive((x) => x.kind === "evicted" && x.hashes.includes(h), from, 6000);
      t.must(e !== null, `an evicted message naming ${h}`, "none");
      const from2 = ctx.live.length;
      const r2 = await ctx.admin("evict", { mm_hash: str(h) });
      const res2 = r2?.get("result");
      t.must(res2?.t === "str" && res2.v === "missing", 'a second evict → "missing"', () =>
        JSON.stringify(res2),
      );
      await ctx.nextHello(from2);
      t.must(
        !ctx.live.slice(from2).some((x) => x.hashes.includes(h)),
        "no event for the missing entry",
        "one",
      );
    },
  },
  {
    id: "10.1.7",
    title: "changes are published in the order they happened; a change and its reversal are both published",
    cite: "EC-CONTRACT 10.1: changes are published within one poll_step of happening, in the order they happened; a change and its reversal within one step are both published (the stream is a log, never a diff).",
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      ctx.needAdmin(t);
      const [a, b] = [tag(), tag()];
      const from = ctx.live.length;
      const res = await ctx.adminBatch([
        ["encode", { mm_hash: str(a), nbytes: mpUint(100) }],
        ["encode", { mm_hash: str(b), nbytes: mpUint(100) }],
        ["evict", { mm_hash: str(a) }],
        ["encode", { mm_hash: str(a), nbytes: mpUint(100) }],
        ["evict", { mm_hash: str(b) }],
      ]);
      t.must(res.join(",") === "ready,ready,evicted,ready,evicted", "the five admin results", res.join(","));
      const want = [`stored:${a}`, `stored:${b}`, `evicted:${a}`, `stored:${a}`, `evicted:${b}`];
      const done = await ctx.waitLive(
        () => flat(ctx.live.slice(from)).filter((x) => x.endsWith(a) || x.endsWith(b)).length >= 5,
        from,
        6000,
      );
      const got = flat(ctx.live.slice(from)).filter((x) => x.endsWith(a) || x.endsWith(b));
      t.must(done !== null && got.join(" ") === want.join(" "), want.join(" "), got.join(" "));
    },
  },
  {
    id: "10.1.8",
    title:
      "1,300 changes at once (1,000 short and 300 of 250-byte hashes): split over consecutive messages of at most 1,024 hashes and 65,280 bytes",
    cite: "EC-CONTRACT 10.1: a message carries at most 1,024 hashes and never passes that size: longer lists are split over consecutive messages.",
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      ctx.needAdmin(t);
      const nb = ctx.opts.numBlocks;
      if (nb === undefined || nb < 1400)
        t.info("a cache of at least 1,400 blocks (--num-blocks)", String(nb ?? "not given"));
      const base = tag();
      const hs = [
        ...Array.from({ length: 1000 }, (_, i) => `${base}-${i}`),
        ...Array.from({ length: 300 }, (_, i) => `${base}-${i}-${"x".repeat(250 - base.length - 8)}`),
      ];
      const from = ctx.live.length;
      const res = await ctx.adminBatch(hs.map((h) => ["encode", { mm_hash: str(h), nbytes: mpUint(1) }]));
      t.must(
        res.length === hs.length && res.every((r) => r === "ready"),
        "1,300 ready",
        () => `${res.filter((r) => r === "ready").length} ready`,
      );
      const mine = (x: Ev) => x.hashes.some((h) => h.startsWith(base));
      await ctx.waitLive(() => flat(ctx.live.slice(from).filter(mine)).length >= hs.length, from, 10_000);
      const evs = ctx.live.slice(from).filter(mine);
      t.must(problemsOf(evs) === "", "every message within the limits", () => problemsOf(evs));
      const got = flat(evs);
      t.must(
        got.join("\n") === hs.map((h) => `stored:${h}`).join("\n"),
        "every change once, in order",
        `${got.length} changes`,
      );
      const maxH = Math.max(...evs.map((e) => e.hashes.length));
      const maxB = Math.max(...evs.map((e) => e.bytes.length));
      t.note(`${evs.length} messages, at most ${maxH} hashes and ${maxB} bytes`);
      const res2 = await ctx.adminBatch(hs.map((h) => ["evict", { mm_hash: str(h) }]));
      t.must(
        res2.every((r) => r === "evicted"),
        "1,300 evicted",
        () => `${res2.filter((r) => r === "evicted").length}`,
      );
    },
  },
  {
    id: "10.1.9",
    title: "seq 1 is the hello; entries held at start (prepopulated) are published as stored after it",
    cite: 'EC-CONTRACT 10.1: a new incarnation starts empty in its subscribers\' eyes: entries it holds at start (prepopulated) are published as "stored" after its first hello.',
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const inc = ctx.incarnation;
      t.must(inc !== "", "a live message (the incarnation)", "none");
      const a = await ctx.ask(inc, 0);
      if (a.msgs[0]?.kind === "snapshot") t.info("a ring still holding seq 1", "a snapshot answer");
      const kind = checkAnswer(t, a, 0);
      t.must(kind === "replay", "a replay from seq 1", kind);
      t.must(a.msgs[0]?.kind === "hello", "seq 1 is a hello", a.msgs[0]?.kind ?? "nothing");
      const h = ctx.opts.mmHash;
      if (h === undefined) {
        t.note("no --mm-hash: the prepopulated entry not checked");
        return;
      }
      const at = a.msgs.findIndex((e) => e.kind === "stored" && e.hashes.includes(h));
      t.must(at > 0, `the prepopulated ${h} stored after the first hello`, "not in the log");
    },
  },
  {
    id: "10.1.10",
    title: "a replayed message is the live one plus request_id",
    cite: "EC-CONTRACT 10.1: every message, hellos included, is kept for replay (10.2); 10.2: each as published plus request_id.",
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      await ctx.nextHello();
      const lastLive = ctx.live.slice(-10);
      const first = lastLive[0]!;
      const a = await ctx.ask(first.incarnation, first.seq - 1);
      checkAnswer(t, a, first.seq - 1);
      for (const e of lastLive) {
        const r = a.msgs.find((x) => x.seq === e.seq);
        t.must(r !== undefined, `seq ${e.seq} in the replay`, "missing");
        const pick = (m: Map<string, Typed>) =>
          JSON.stringify([...m].filter(([k]) => k !== "request_id").sort(([x], [y]) => (x < y ? -1 : 1)));
        t.must(
          pick(r.m) === pick(e.m),
          `seq ${e.seq} replayed as published`,
          () => `${pick(r.m)} vs ${pick(e.m)}`,
        );
      }
    },
  },
  {
    id: "10.1.11",
    title:
      "num_blocks the same in every message (and --num-blocks when given); 0 <= free_blocks <= num_blocks",
    cite: C101,
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const evs = ctx.live.filter((e) => e.num >= 0);
      t.must(evs.length > 0, "live messages", "none");
      const nums = new Set(evs.map((e) => e.num));
      t.must(nums.size === 1, "one num_blocks", [...nums].join(","));
      const nb = ctx.opts.numBlocks;
      if (nb !== undefined) t.must(nums.has(nb), `num_blocks ${nb}`, [...nums].join(","));
      t.must(
        evs.every((e) => e.free >= 0 && e.free <= e.num),
        "free_blocks within [0, num_blocks]",
        "out of range",
      );
    },
  },
  {
    id: "10.1.3",
    title: "over the whole run: seq grows by exactly 1 per message of an incarnation, in arrival order",
    cite: "EC-CONTRACT 10.1: seq starts at 1 and grows by exactly 1 per message of that incarnation (below 2^53).",
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const evs = ctx.live.filter((e) => e.seq >= 0);
      t.must(evs.length >= 3, "live messages", String(evs.length));
      for (let i = 1; i < evs.length; i++) {
        const [a, b] = [evs[i - 1]!, evs[i]!];
        if (a.incarnation !== b.incarnation) continue;
        t.must(b.seq === a.seq + 1, `seq ${a.seq + 1} after ${a.seq}`, () => `${b.seq} (${b.kind})`);
      }
      t.note(`${evs.length} live messages checked`);
    },
  },
];

const REPLAY_CASES: E[] = [
  {
    id: "10.2.1",
    title:
      "an up-to-date subscriber (since = the last seq) gets the end alone (or only what was published meanwhile)",
    cite: `${C102} An up-to-date subscriber gets this alone.`,
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const h = await ctx.nextHello();
      t.must(h !== null, "a hello", "none");
      const a = await ctx.ask(h.incarnation, h.seq);
      checkAnswer(t, a, h.seq);
      t.must(
        a.end!.incarnation === h.incarnation,
        "the end names the producer's incarnation",
        a.end!.incarnation,
      );
      t.must(a.end!.hb === h.hb, `the end's heartbeat_ms ${h.hb}`, String(a.end!.hb));
    },
  },
  {
    id: "10.2.2",
    title:
      "since = last - 50 (or 1) of this incarnation: exactly messages since + 1 .. in order, then the end",
    cite: C102,
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const h = await ctx.nextHello();
      t.must(h !== null && h.seq > 2, "a hello after two messages", String(h?.seq));
      const since = Math.max(1, h.seq - 50);
      const a = await ctx.ask(h.incarnation, since);
      t.must(checkAnswer(t, a, since) === "replay", "a replay", "a snapshot");
    },
  },
  {
    id: "10.2.3",
    title: "another incarnation → a snapshot whose set equals the log replayed from seq 1",
    cite: C102S,
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const inc = ctx.incarnation;
      const snap = await ctx.ask(randomUUID(), 5);
      t.must(checkAnswer(t, snap, 5) === "snapshot", "a snapshot", "a replay");
      const log = await ctx.ask(inc, 0);
      if (log.msgs[0]?.kind !== "hello" || log.end === null) {
        t.note("the ring no longer holds seq 1: the set is not cross-checked");
        return;
      }
      checkAnswer(t, log, 0);
      const atSnap = log.msgs.filter((e) => e.seq <= snap.end!.seq);
      const want = applyLog(atSnap);
      const got = setOfSnapshot(snap);
      const miss = [...want].filter((x) => !got.has(x)).length;
      const extra = [...got].filter((x) => !want.has(x)).length;
      t.must(
        miss === 0 && extra === 0,
        `the snapshot set (${want.size} entries) as of seq ${snap.end!.seq}`,
        `${miss} missing, ${extra} extra`,
      );
    },
  },
  {
    id: "10.2.4",
    title: 'no view (incarnation "", since 0) → a snapshot',
    cite: `${C102S} ("0 and \\"\\" when it has no view")`,
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const a = await ctx.ask("", 0);
      t.must(checkAnswer(t, a, 0) === "snapshot", "a snapshot", "a replay");
      const pages = a.msgs.length - 1;
      t.note(`${pages} page(s), ${setOfSnapshot(a).size} entries`);
    },
  },
  {
    id: "10.2.5",
    title: "since past the last published seq → a snapshot",
    cite: `${C102S} (a since past the last published seq included)`,
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const a = await ctx.ask(ctx.incarnation, 2 ** 31);
      t.must(checkAnswer(t, a, 2 ** 31) === "snapshot", "a snapshot", "a replay");
    },
  },
  {
    id: "10.2.6",
    title:
      "after 4,200 more messages: since = last - 4,096 is replayed whole even when read late (the ring and the send queue); since = 1 is never a partial replay",
    cite: `${C102} The producer's replay socket holds one whole answer per peer in its send queue.`,
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      ctx.needAdmin(t);
      const h = tag();
      const ops: [string, Record<string, Uint8Array>][] = [];
      for (let i = 0; i < 2100; i++)
        ops.push(["encode", { mm_hash: str(h), nbytes: mpUint(1) }], ["evict", { mm_hash: str(h) }]);
      const res = await ctx.adminBatch(ops);
      t.must(res.length === ops.length, `${ops.length} admin replies`, String(res.length));
      const hello = await ctx.nextHello();
      t.must(
        hello !== null && hello.seq > MIN_RING + 10,
        `more than ${MIN_RING} messages`,
        String(hello?.seq),
      );
      // Room for a few hellos published while the request travels; the rule is judged against the
      // end's seq (the last message when the producer answered): since >= end - 4,096 must replay.
      const since = hello.seq - MIN_RING + 16;
      const a = await ctx.ask(hello.incarnation, since, ctx.dealer(), 500);
      if (a.end !== null && since < a.end.seq - MIN_RING)
        t.info(`at most 16 messages published while asking`, `${a.end.seq - hello.seq}`);
      t.must(
        checkAnswer(t, a, since) === "replay",
        `a replay of the last ${MIN_RING} messages`,
        "a snapshot",
      );
      const old = await ctx.ask(hello.incarnation, 1);
      const kind = checkAnswer(t, old, 1);
      if (kind === "replay") t.note("the ring holds every message since seq 2 (a ring larger than 4,096)");
    },
  },
  {
    id: "10.2.7",
    title:
      "snapshot pages stay within 1,024 hashes and 65,280 bytes (a set of 1,200 entries, 200 of 250 bytes)",
    cite: C102S,
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      ctx.needAdmin(t);
      const nb = ctx.opts.numBlocks;
      if (nb === undefined || nb < 1300)
        t.info("a cache of at least 1,300 blocks (--num-blocks)", String(nb ?? "not given"));
      const base = tag();
      const hs = [
        ...Array.from({ length: 1000 }, (_, i) => `${base}-${i}`),
        ...Array.from({ length: 200 }, (_, i) => `${base}-${i}-${"y".repeat(250 - base.length - 8)}`),
      ];
      await ctx.adminBatch(hs.map((x) => ["encode", { mm_hash: str(x), nbytes: mpUint(1) }]));
      const a = await ctx.ask("", 0);
      t.must(checkAnswer(t, a, 0) === "snapshot", "a snapshot", "a replay");
      const got = setOfSnapshot(a);
      t.must(
        hs.every((x) => got.has(x)),
        "every entry in the pages",
        `${hs.filter((x) => got.has(x)).length} of ${hs.length}`,
      );
      t.must(a.msgs.length - 1 >= 2, "more than one page", String(a.msgs.length - 1));
      await ctx.adminBatch(hs.map((x) => ["evict", { mm_hash: str(x) }]));
    },
  },
  ...(
    [
      ["10.2.8", "not MessagePack", () => Uint8Array.of(0xc1, 0x00)],
      ["10.2.9", "not a map (an array)", () => Uint8Array.of(0x93, 1, 2, 3)],
      ["10.2.10", "since missing", (c: EcEventsCtx) => c.req("a", "", 0, { since: null })],
      ["10.2.11", "since -1", (c: EcEventsCtx) => c.req("a", "", 0, { since: Uint8Array.of(0xff) })],
      ["10.2.12", "since 2.0 (a float)", (c: EcEventsCtx) => c.req("a", "", 0, { since: mpFloat(2) })],
      [
        "10.2.13",
        "since true (a boolean)",
        (c: EcEventsCtx) => c.req("a", "", 0, { since: Uint8Array.of(0xc3) }),
      ],
      ["10.2.14", "request_id of 65 bytes", (c: EcEventsCtx) => c.req("r".repeat(65), "", 0)],
      [
        "10.2.15",
        "incarnation an integer",
        (c: EcEventsCtx) => c.req("a", "", 0, { incarnation: mpUint(7) }),
      ],
      ["10.2.16", "a nested map", (c: EcEventsCtx) => c.req("a", "", 0, { x: mpMap([["y", mpUint(1)]]) })],
      [
        "10.2.17",
        "a nesting bomb (60 KiB)",
        () => {
          const b = new Uint8Array(60 * 1024);
          b.set([0x81, 0xa1, 0x61], 0);
          b.set(mpNestingBomb(60 * 1024 - 4), 3);
          return b;
        },
      ],
      [
        "10.2.18",
        "a declared string length past the end",
        () => Uint8Array.of(0x81, 0xaa, ...Buffer.from("request_id"), 0xdb, 0x7f, 0xff, 0xff, 0xff),
      ],
      ["10.2.19", "two frames", (c: EcEventsCtx) => [c.req("a", "", 0), c.req("b", "", 0)]],
      [
        "10.2.20",
        "over 64 KiB",
        (c: EcEventsCtx) => {
          const big = Buffer.alloc(5 + 70_000, 0x78);
          big[0] = 0xdb; // str32: a string of 70,000 bytes
          big.writeUInt32BE(70_000, 1);
          return c.req("a", "", 0, { incarnation: new Uint8Array(big) });
        },
      ],
    ] as [string, string, (c: EcEventsCtx) => Uint8Array | Uint8Array[]][]
  ).map(
    ([id, what, build]): E => ({
      id,
      title: `a request that is ${what}: dropped unanswered; the producer answers a proper one after`,
      cite: `${C102M} EC-CONTRACT 9.1: messages are bounded as in 9.1.`,
      async run(ctx: EcEventsCtx, t: CaseCheck) {
        const d = ctx.dealer();
        const m = build(ctx);
        await d.send(Array.isArray(m) ? m : [m]);
        t.must(await ctx.silent(d), "no reply", "a reply");
        const ok = await ctx.ask("", 0, id === "10.2.20" ? ctx.dealer() : d);
        t.must(ok.end !== null, "a proper request answered after it", "no end");
      },
    }),
  ),
  {
    id: "10.2.21",
    title: "unknown extra keys in a request are ignored: answered; every reply carries the request_id",
    cite: "EC-CONTRACT 10.2: the request is decoded as in 3 (unknown keys ignored); every reply map carries the request's request_id.",
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const d = ctx.dealer();
      const id = `x-${hex(randomUUID())}`;
      ctx.peers.set(d, performance.now());
      await d.send(ctx.req(id, "", 0, { later_field: mpStr("v"), another: mpUint(3) }));
      const a = await ctx.collect(d, null, ctx.timeoutMs);
      t.must(a.end !== null, "an answer with an end", "none");
      t.must(
        a.msgs.every((e) => e.requestId === id),
        `request_id ${id} on every reply`,
        () => a.msgs.map((e) => e.requestId).join(","),
      );
    },
  },
  {
    id: "10.5.1",
    title:
      'admin evict answers {op: evict, mm_hash, result}: "evicted", "missing", and "pinned" for an entry a grant pins',
    cite: 'EC-CONTRACT 10.5: the admin socket (9.3) takes {"op": "evict", "mm_hash": str} and answers {"op": "evict", "mm_hash", "result": "evicted" | "missing" | "pinned"} (a pinned entry is not evicted).',
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      ctx.needAdmin(t);
      const h = tag();
      await ctx.admin("encode", { mm_hash: str(h), nbytes: mpUint(100) });
      const r = await ctx.admin("evict", { mm_hash: str(h) });
      const keys = r === null ? "no reply" : [...r.keys()].sort().join(",");
      t.must(keys === "mm_hash,op,result", "exactly op, mm_hash, result", keys);
      t.must(r?.get("op")?.t === "str" && (r.get("op") as { v: string }).v === "evict", "op evict", "other");
      const m = r?.get("mm_hash");
      t.must(m?.t === "str" && m.v === h, `mm_hash ${h} echoed`, JSON.stringify(m));
      const miss = (await ctx.admin("evict", { mm_hash: str(h) }))?.get("result");
      t.must(miss?.t === "str" && miss.v === "missing", "missing", JSON.stringify(miss));
      const { control, compatibilityHash, mmHash } = ctx.opts;
      if (control === undefined || compatibilityHash === undefined || mmHash === undefined) {
        t.note("pinned not checked (needs the control endpoint, --compatibility-hash and --mm-hash)");
        return;
      }
      const c = new Dealer({ linger: 0, receiveTimeout: ctx.timeoutMs });
      c.connect(control);
      try {
        await c.send(
          mpMap([
            ["mm_hash", mpStr(mmHash)],
            ["compatibility_hash", mpStr(compatibilityHash)],
            ["session_id", mpStr(randomUUID())],
            ["connector_version", mpUint(2)],
          ]),
        );
        const [ack] = await c.receive();
        const st = mapEntries(decodeTyped(ack!, 8))?.get("status");
        t.must(st?.t === "int" && st.v === 0, "an OK grant (the entry pinned)", JSON.stringify(st));
        const p = (await ctx.admin("evict", { mm_hash: str(mmHash) }))?.get("result");
        t.must(p?.t === "str" && p.v === "pinned", "pinned (not evicted)", JSON.stringify(p));
      } finally {
        c.close();
      }
    },
  },
  {
    id: "10.2.22",
    title: `beyond ${MAX_PEERS} peers within 30 s, requests of new peers are dropped; a known peer is still answered (runs last)`,
    cite: "EC-CONTRACT 10.2: a peer is a routing id that sent a well-formed request within the last 30 s; beyond 256 of them, requests of new peers are dropped and counted.",
    async run(ctx: EcEventsCtx, t: CaseCheck) {
      const now = performance.now();
      const recent = [...ctx.peers.values()].filter((at) => now - at < 30_000).length;
      const n = MAX_PEERS - recent + 20;
      const ds = Array.from({ length: n }, () => ctx.dealer());
      const ok = await Promise.all(ds.map((d) => ctx.ask("", 1 << 30, d).then((a) => a.end !== null)));
      const answered = ok.filter(Boolean).length;
      t.must(
        answered <= MAX_PEERS - recent,
        `at most ${MAX_PEERS - recent} of ${n} new peers answered`,
        String(answered),
      );
      t.must(answered > 0, "new peers answered up to the cap", "none");
      const k = ds[ok.indexOf(true)] ?? ds[0]!;
      const again = await ctx.ask("", 1 << 30, k);
      t.must(again.end !== null, "a known peer still answered", "no end");
    },
  },
];

/** Every --events case, in run order. */
export const EC_EVENTS_CASES: readonly CaseDef<EcEventsCtx>[] = [...EVENT_CASES, ...REPLAY_CASES];

/** Runs the --events cases against `opts.events` / `opts.replay`. */
export async function runEcEventsSuite(opts: EcEventsSuiteOptions, run: RunOptions = {}): Promise<RunReport> {
  const started = new Date();
  const ctx = new EcEventsCtx(opts);
  ctx.start();
  try {
    const results = await runCases(EC_EVENTS_CASES, ctx, {
      caseTimeoutMs: 60_000,
      ...run,
      after: async () => ctx.closeCase(),
    });
    return makeReport(
      "ec-producer --events",
      opts.events,
      {
        replay: opts.replay,
        admin: opts.admin ?? "none",
        mm_hash: opts.mmHash ?? "none",
        num_blocks: opts.numBlocks ?? "unknown",
      },
      results,
      started,
    );
  } finally {
    ctx.close();
  }
}
