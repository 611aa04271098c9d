// Receive placement (ServerOptions.receiveInto): the rest of a large request read into
// handler-chosen segments. Bytes must land exactly where the plan says for every split of the
// stream (byte at a time, every offset across segment boundaries, random reads), the handler must
// see the head and the plan, bad plans must close only that connection, and the counters must
// show which path ran. CONTRACT 3 framing throughout.
import type * as net from "node:net";
import fc from "fast-check";
import { afterEach, describe, expect, test } from "vitest";
import {
  type ConnInfo,
  listen,
  makeClient,
  type ReceiveInto,
  type ReceivePlan,
  type RpcServer,
  TransportError,
} from "../src/index.js";
import { type Case, caseOf, dataEventCases, pattern, sleep } from "./helpers/env.js";
import { closed, rawConnect } from "./helpers/raw.js";

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const f of cleanups.splice(0).reverse()) await f();
});

async function until(cond: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 2000 && !cond(); i++) await sleep(5);
  expect(cond(), what).toBe(true);
}

function frame(body: Uint8Array): Buffer {
  const h = Buffer.alloc(4);
  h.writeUInt32LE(body.length);
  return Buffer.concat([h, body]);
}

function writeAsync(s: net.Socket, b: Uint8Array): Promise<void> {
  return new Promise((resolve) => {
    if (s.destroyed) resolve();
    else s.write(b, () => resolve());
  });
}

function collect(s: net.Socket): { bytes(): Buffer; closed: Promise<void> } {
  const chunks: Buffer[] = [];
  s.on("data", (d: Buffer) => chunks.push(d));
  s.on("error", () => {});
  return { bytes: () => Buffer.concat(chunks), closed: closed(s) };
}

/** How the test hook places the next message: head bytes to ask for, to keep, segment sizes. */
interface Layout {
  ask: number;
  keep: number;
  /** Segment sizes but the last; the last segment takes what is left. */
  sizes: number[];
}

interface Seen {
  head: Buffer;
  /** Copies of the segments (null: not placed, `head` is the whole message). */
  segs: Buffer[] | null;
  plan: ReceivePlan | undefined;
  conn: ConnInfo;
}

interface Placing {
  srv: RpcServer;
  seen: Seen[];
  plans: ReceivePlan[];
  calls: { headLen: number; length: number }[];
  errors: unknown[];
  /** The layout the hook uses; null: decline. */
  layout: Layout | null;
  counter(name: string): number;
}

/** An echo server whose hook places by `layout` (head, then the segments, echoed as parts). */
async function placing(t: Case, hook?: ReceiveInto): Promise<Placing> {
  const p: Placing = {
    srv: null as unknown as RpcServer,
    seen: [],
    plans: [],
    calls: [],
    errors: [],
    layout: { ask: 1, keep: 1, sizes: [] },
    counter: (name) => p.srv.registry.snapshot().counters[name] ?? 0,
  };
  const dflt: ReceiveInto = (head, length) => {
    p.calls.push({ headLen: head.length, length });
    const l = p.layout;
    if (l === null) return null;
    if (head.length < l.ask) return l.ask;
    const keep = Math.min(l.keep, head.length);
    const rest = length - keep;
    const segments: Uint8Array[] = [];
    let used = 0;
    for (const n of l.sizes) {
      const k = Math.min(n, rest - used);
      segments.push(new Uint8Array(k));
      used += k;
    }
    segments.push(new Uint8Array(rest - used));
    const plan = { headBytes: keep, segments };
    p.plans.push(plan);
    return plan;
  };
  p.srv = await (t.listenFn ?? listen)(
    t.listen(),
    (req, conn, plan) => {
      p.seen.push({
        head: Buffer.from(req),
        segs: plan === undefined ? null : plan.segments.map((s) => Buffer.from(s)),
        plan,
        conn,
      });
      return plan === undefined ? req : [req, ...plan.segments];
    },
    {
      ...t.server,
      maxMessageBytes: 1 << 22,
      closeTimeoutMs: 200,
      receiveInto: hook ?? dflt,
      onError: (e) => p.errors.push(e),
    },
  );
  cleanups.push(() => p.srv.close());
  return p;
}

function whole(s: Seen): Buffer {
  return s.segs === null ? s.head : Buffer.concat([s.head, ...s.segs]);
}

const STREAM: Case[] = [caseOf("tcp"), caseOf("unix"), caseOf("tls"), ...dataEventCases()];

test("option receiveInto: not a function is TRANSPORT_BAD_OPTION naming it", async () => {
  const bad = listen("tcp://127.0.0.1:0", (r) => r, { receiveInto: 5 as unknown as ReceiveInto });
  await expect(bad).rejects.toThrow(TransportError);
  await expect(bad).rejects.toThrow(/receiveInto/);
});

for (const t of STREAM) {
  const onread = t.scheme === "tcp" || t.scheme === "unix";
  describe(`${t.scheme}: receiveInto (CONTRACT 3 framing)`, () => {
    test("a large message goes into the segments; the handler gets the head and the plan; counters show the path", async () => {
      const p = await placing(t);
      p.layout = { ask: 100, keep: 64, sizes: [1000, 0, 300_000] };
      const c = makeClient(p.srv.endpoint, t.client);
      cleanups.push(() => c.close());
      await c.connect(10_000);
      const msg = pattern(2 << 20, 5);
      const reply = Buffer.alloc(3 << 20);
      expect(await c.request(msg, reply, 20_000)).toBe(msg.length);
      expect(Buffer.compare(reply.subarray(0, msg.length), msg)).toBe(0);
      const s = p.seen[0] as Seen;
      expect(s.plan).toBe(p.plans[0]);
      expect(s.head.toString("hex")).toBe(msg.subarray(0, 64).toString("hex"));
      expect(s.segs?.map((b) => b.length)).toEqual([1000, 0, 300_000, msg.length - 64 - 301_000]);
      expect(Buffer.compare(whole(s), msg)).toBe(0);
      expect(p.counter("transport_server_placed_messages")).toBe(1);
      const placed = p.counter("transport_server_placed_bytes");
      const copied = p.counter("transport_server_placed_copied_bytes");
      expect(placed).toBe(msg.length - 64);
      if (onread) {
        // Read in place: only what came with the head's read was copied.
        expect(copied).toBeLessThan(placed / 4);
      } else {
        expect(copied).toBe(placed);
      }
      expect(p.counter("transport_server_bytes_in")).toBe(msg.length + 4);
      // A small message that arrives whole is not placed, and the hook is not consulted.
      const calls = p.calls.length;
      expect(await c.request(Buffer.from("small"), reply, 10_000)).toBe(5);
      expect(p.calls.length).toBe(calls);
      expect(p.seen[1]?.plan).toBeUndefined();
      expect(p.counter("transport_server_placed_messages")).toBe(1);
    });

    test("declined (null): the message is reassembled as usual and the handler gets no plan", async () => {
      const p = await placing(t);
      p.layout = null;
      const c = makeClient(p.srv.endpoint, t.client);
      cleanups.push(() => c.close());
      await c.connect(10_000);
      const msg = pattern(500_000, 9);
      const reply = Buffer.alloc(600_000);
      expect(await c.request(msg, reply, 20_000)).toBe(msg.length);
      expect(p.seen[0]?.plan).toBeUndefined();
      expect(Buffer.compare(p.seen[0]?.head as Buffer, msg)).toBe(0);
      expect(p.calls.length).toBe(1);
      expect(p.counter("transport_server_placed_messages")).toBe(0);
    });

    test("asking for a head at or beyond the message length: received as usual, the hook not called again", async () => {
      const p = await placing(t, (head, length) => {
        p.calls.push({ headLen: head.length, length });
        return length + 5;
      });
      const c = makeClient(p.srv.endpoint, t.client);
      cleanups.push(() => c.close());
      await c.connect(10_000);
      const msg = pattern(300_000, 8);
      const reply = Buffer.alloc(400_000);
      expect(await c.request(msg, reply, 20_000)).toBe(msg.length);
      expect(Buffer.compare(p.seen[0]?.head as Buffer, msg)).toBe(0);
      expect(p.seen[0]?.plan).toBeUndefined();
      expect(p.calls.length).toBe(1);
      expect(p.counter("transport_server_errors")).toBe(0);
    });

    test("the rest of a placed message byte at a time, and split at every offset across segment boundaries", async () => {
      const p = await placing(t);
      // Head of 9 bytes asked, 6 kept (3 spill into the segments), segments 5, 0, 1, 7, rest.
      p.layout = { ask: 9, keep: 6, sizes: [5, 0, 1, 7] };
      const raw = await rawConnect(p.srv.endpoint);
      const got = collect(raw);
      const body = pattern(40, 3);
      const f = frame(body);
      const sent: Buffer[] = [];
      for (const b of f) {
        await writeAsync(raw, Buffer.from([b]));
        await new Promise((r) => setImmediate(r));
      }
      sent.push(body);
      for (let k = 5; k < f.length; k++) {
        const bk = pattern(40, 100 + k);
        const fk = frame(bk);
        await writeAsync(raw, fk.subarray(0, k));
        await sleep(3);
        await writeAsync(raw, fk.subarray(k));
        sent.push(bk);
        await until(() => p.seen.length === sent.length, `message split at ${k} handled`);
      }
      const expected = Buffer.concat(sent.map(frame));
      await until(() => got.bytes().length >= expected.length, "every echo received");
      expect(Buffer.compare(got.bytes(), expected)).toBe(0);
      expect(p.seen.map((s) => whole(s).toString("hex"))).toEqual(sent.map((b) => b.toString("hex")));
      for (const s of p.seen) {
        if (s.segs === null) continue;
        expect(s.head.length).toBe(6);
        expect(s.segs.map((b) => b.length)).toEqual([5, 0, 1, 7, 40 - 6 - 13]);
      }
      // Byte at a time and every split after the head's first read are placed.
      expect(p.counter("transport_server_placed_messages")).toBeGreaterThanOrEqual(f.length - 5);
      expect(p.counter("transport_server_errors")).toBe(0);
      raw.end();
      await got.closed;
    });

    test("a connection closing mid-placement never reaches the handler and is counted; others are served", async () => {
      const p = await placing(t);
      p.layout = { ask: 8, keep: 8, sizes: [50] };
      const raw = await rawConnect(p.srv.endpoint);
      const got = collect(raw);
      const f = frame(pattern(200, 1));
      await writeAsync(raw, f.subarray(0, 4 + 8));
      await sleep(5);
      await writeAsync(raw, f.subarray(12, 12 + 100));
      await until(() => p.plans.length === 1, "placement planned");
      raw.end();
      await got.closed;
      await until(() => p.counter("transport_server_errors") === 1, "truncated request counted");
      expect(p.seen).toEqual([]);
      expect(p.counter("transport_server_placed_messages")).toBe(0);
      const c = makeClient(p.srv.endpoint, t.client);
      cleanups.push(() => c.close());
      await c.connect(10_000);
      expect(await c.request(Buffer.from("ok"), Buffer.alloc(8), 10_000)).toBe(2);
    });

    const bad: [string, ReceiveInto, RegExp][] = [
      [
        "a hook that throws",
        () => {
          throw new Error("boom");
        },
        /boom/,
      ],
      ["a wrong total", (_h, n) => ({ headBytes: 1, segments: [new Uint8Array(n)] }), /hold/],
      [
        "a segment that is not a Uint8Array",
        (_h, n) => ({ headBytes: 1, segments: [new Array(n - 1).fill(0) as unknown as Uint8Array] }),
        /segments\[0\]/,
      ],
      [
        "headBytes above the head",
        (h, n) => ({ headBytes: h.length + 1, segments: [new Uint8Array(n - h.length - 1)] }),
        /headBytes/,
      ],
      ["headBytes negative", (_h, n) => ({ headBytes: -1, segments: [new Uint8Array(n + 1)] }), /headBytes/],
      ["segments not an array", () => ({ headBytes: 0, segments: null as unknown as Uint8Array[] }), /array/],
      ["a number not above the head", (h) => h.length, /head size/],
      ["a string", () => "x" as unknown as null, /not a plan/],
    ];
    for (const [what, hook, re] of bad) {
      test(`${what}: that connection is closed, counted and reported; the handler never runs`, async () => {
        let consulted = 0;
        const p = await placing(t, (h, n, c) => {
          consulted++;
          return hook(h, n, c);
        });
        const raw = await rawConnect(p.srv.endpoint);
        const got = collect(raw);
        const f = frame(pattern(300, 2));
        await writeAsync(raw, f.subarray(0, 20));
        // Not one read with the rest (a loaded machine coalesces): the hook sees the start alone.
        await until(() => consulted > 0, "hook consulted");
        await writeAsync(raw, f.subarray(20));
        await got.closed;
        expect(got.bytes().length).toBe(0);
        await until(() => p.counter("transport_server_errors") === 1, "counted");
        expect(p.seen).toEqual([]);
        expect(p.errors.length).toBe(1);
        expect(String((p.errors[0] as Error).message)).toMatch(re);
        if (!/boom/.test(String(re)))
          expect((p.errors[0] as TransportError).code).toBe("TRANSPORT_BAD_OPTION");
      });
    }

    test("property: random sizes, layouts and read splits: bytes land exactly in the segments, the handler sees the head", async () => {
      const p = await placing(t);
      const raw = await rawConnect(p.srv.endpoint);
      const got = collect(raw);
      let echoed = 0;
      let n = 0;
      const frames: Buffer[] = [];
      await fc.assert(
        fc.asyncProperty(
          fc.integer({ min: 1, max: 200_000 }),
          fc.integer({ min: 1, max: 120 }),
          fc.nat({ max: 120 }),
          fc.array(fc.nat({ max: 90_000 }), { maxLength: 5 }),
          fc.array(fc.integer({ min: 1, max: 100_000 }), { minLength: 1, maxLength: 8 }),
          async (len, ask, keep, sizes, cuts) => {
            p.layout = { ask, keep, sizes };
            const body = pattern(len, ++n);
            const f = frame(body);
            const before = p.seen.length;
            let off = 0;
            for (let i = 0; off < f.length; i++) {
              const k = cuts[i % cuts.length] as number;
              await writeAsync(raw, f.subarray(off, off + k));
              off += k;
              await new Promise((r) => setImmediate(r));
            }
            echoed += f.length;
            frames.push(f);
            await until(() => got.bytes().length >= echoed, "echo received");
            expect(p.seen.length).toBe(before + 1);
            const s = p.seen[before] as Seen;
            expect(Buffer.compare(whole(s), body)).toBe(0);
            if (s.segs !== null) {
              const plan = s.plan as ReceivePlan;
              expect(s.head.length).toBe(plan.headBytes);
              expect(Buffer.compare(s.head, body.subarray(0, plan.headBytes))).toBe(0);
              // Each segment holds exactly its slice of the message.
              let o = plan.headBytes;
              for (const seg of s.segs) {
                expect(Buffer.compare(seg, body.subarray(o, o + seg.length))).toBe(0);
                o += seg.length;
              }
              expect(o).toBe(len);
            }
          },
        ),
        { numRuns: t.scheme.startsWith("tls") || !onread ? 25 : 40 },
      );
      // The echoes (head then segments as reply parts) are the frames sent, in order.
      expect(Buffer.compare(got.bytes(), Buffer.concat(frames))).toBe(0);
      expect(p.counter("transport_server_placed_messages")).toBeGreaterThan(0);
      expect(p.counter("transport_server_errors")).toBe(0);
      raw.end();
      await got.closed;
    });
  });
}

test("zmq: receiveInto is accepted and ignored (whole messages, no plan)", async () => {
  let calls = 0;
  const srv = await listen("zmq+tcp://127.0.0.1:0", (req, _c, plan) => (plan === undefined ? req : null), {
    receiveInto: () => {
      calls++;
      return null;
    },
  });
  cleanups.push(() => srv.close());
  const c = makeClient(srv.endpoint);
  cleanups.push(() => c.close());
  await c.connect(10_000);
  const msg = pattern(300_000, 4);
  const reply = Buffer.alloc(400_000);
  expect(await c.request(msg, reply, 20_000)).toBe(msg.length);
  expect(calls).toBe(0);
});
