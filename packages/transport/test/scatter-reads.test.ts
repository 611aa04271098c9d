// Issue 23: with koffi installed, the rest of a placed message (ServerOptions.receiveInto) is read
// with readv(2) into many segments per syscall instead of one libuv read per segment. The bytes
// must land exactly where the plan says, a read must never cross the message's end (the next
// message's bytes stay for the next message, CONTRACT 3 framing), a peer that dies mid-message
// gets its request dropped, and without koffi the same traffic takes libuv's reads. Frames here
// are built by hand from CONTRACT 3 (u32 little-endian length, then the body).
import type * as net from "node:net";
import { afterEach, describe, expect, test } from "vitest";
import { listen, type ReceivePlan, type RpcServer } from "../src/index.js";
import { setNativeKoffiForTest } from "../src/native.js";
import { caseOf, pattern, sleep } from "./helpers/env.js";
import { closed, rawConnect } from "./helpers/raw.js";

const ROW = 24 * 1024;
const SLOTS = 64;
const HEAD = 1792;

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  setNativeKoffiForTest(null);
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

/** Replies arrive as CONTRACT 3 frames; this splits them. */
function replies(s: net.Socket): { got: Buffer[] } {
  const out = { got: [] as Buffer[] };
  let acc = Buffer.alloc(0);
  s.on("data", (d: Buffer) => {
    acc = Buffer.concat([acc, d]);
    while (acc.length >= 4 && acc.length >= 4 + acc.readUInt32LE(0)) {
      const n = acc.readUInt32LE(0);
      out.got.push(acc.subarray(4, 4 + n));
      acc = acc.subarray(4 + n);
    }
  });
  s.on("error", () => {});
  return out;
}

interface Server {
  srv: RpcServer;
  /** Per handled message: the head and a copy of every segment (or the whole message). */
  seen: { head: Buffer; segs: Buffer[] | null }[];
  counter(name: string): number;
}

/**
 * A server placing the rows of a "STEP-like" message (a HEAD-byte head, then SLOTS rows of ROW
 * bytes) into SLOTS separate views: the even rows into one large shared buffer (like slot windows
 * of one arena), the odd ones into their own buffers. Echoes head and segments.
 */
async function placingServer(scheme: "tcp" | "unix"): Promise<Server> {
  const arena = new Uint8Array(SLOTS * ROW * 2);
  const own = Array.from({ length: SLOTS }, () => new Uint8Array(ROW + 512));
  const s: Server = {
    srv: null as unknown as RpcServer,
    seen: [],
    counter: (name) => s.srv.registry.snapshot().counters[name] ?? 0,
  };
  s.srv = await listen(
    caseOf(scheme).listen(),
    (req, _conn, plan?: ReceivePlan) => {
      s.seen.push({
        head: Buffer.from(req),
        segs: plan === undefined ? null : plan.segments.map((x) => Buffer.from(x)),
      });
      return plan === undefined ? req : [req, ...plan.segments];
    },
    {
      maxMessageBytes: 8 << 20,
      closeTimeoutMs: 200,
      receiveInto: (head, length) => {
        if (length !== HEAD + SLOTS * ROW) return null;
        if (head.length < HEAD) return HEAD;
        const segments: Uint8Array[] = [];
        for (let i = 0; i < SLOTS; i++) {
          // leave gaps between the arena's views, so that an off-by-one address shows
          segments.push(
            i % 2 === 0
              ? arena.subarray(i * 2 * ROW + 64, i * 2 * ROW + 64 + ROW)
              : own[i]!.subarray(256, 256 + ROW),
          );
        }
        return { headBytes: HEAD, segments };
      },
    },
  );
  cleanups.push(() => s.srv.close());
  return s;
}

function stepLike(seed: number): Buffer {
  return pattern(HEAD + SLOTS * ROW, seed);
}

function expectPlacedExactly(seen: Server["seen"][number], msg: Buffer): void {
  expect(seen.segs).not.toBeNull();
  expect(seen.head.equals(msg.subarray(0, HEAD))).toBe(true);
  const segs = seen.segs as Buffer[];
  expect(segs.length).toBe(SLOTS);
  for (let i = 0; i < SLOTS; i++) {
    const want = msg.subarray(HEAD + i * ROW, HEAD + (i + 1) * ROW);
    if (!segs[i]!.equals(want)) throw new Error(`segment ${i} differs`);
  }
}

for (const scheme of ["tcp", "unix"] as const) {
  describe(`${scheme}: scatter reads into placed segments (issue 23, CONTRACT 3)`, () => {
    test("with koffi: rows land exactly in 64 segments through readv", async () => {
      const s = await placingServer(scheme);
      const sock = await rawConnect(s.srv.endpoint);
      cleanups.push(() => sock.destroy());
      const r = replies(sock);
      for (let k = 0; k < 4; k++) {
        const msg = stepLike(k + 1);
        sock.write(frame(msg));
        await until(() => r.got.length === k + 1, `reply ${k}`);
        expectPlacedExactly(s.seen[k]!, msg);
        expect(r.got[k]!.equals(msg)).toBe(true);
      }
      expect(s.counter("transport_server_placed_messages")).toBe(4);
      const scatter = s.counter("transport_server_placed_scatter_reads");
      expect(scatter).toBeGreaterThan(0);
    });

    test("a read never crosses the message's end: a second message sent in the same write stays whole", async () => {
      const s = await placingServer(scheme);
      const sock = await rawConnect(s.srv.endpoint);
      cleanups.push(() => sock.destroy());
      const r = replies(sock);
      const a = stepLike(7);
      const b = Buffer.from("the next message, not rows");
      const c = stepLike(8);
      // one request outstanding is the rule; the server must still keep the stream position
      sock.write(Buffer.concat([frame(a), frame(b), frame(c)]));
      await until(() => r.got.length === 3, "three replies");
      expectPlacedExactly(s.seen[0]!, a);
      expect(s.seen[1]!.segs).toBeNull();
      expect(s.seen[1]!.head.equals(b)).toBe(true);
      expect(r.got[1]!.equals(b)).toBe(true);
      expectPlacedExactly(s.seen[2]!, c);
      expect(r.got[2]!.equals(c)).toBe(true);
    });

    test("the peer dies mid-rows: the request is dropped (never handled) and counted; the server goes on", async () => {
      const s = await placingServer(scheme);
      const sock = await rawConnect(s.srv.endpoint);
      const msg = frame(stepLike(9));
      const cut = 4 + HEAD + 20 * ROW + 100;
      await new Promise<void>((res) => sock.write(msg.subarray(0, cut), () => res()));
      await sleep(50); // let the server take the head and place (not an assertion about time)
      sock.destroy();
      await closed(sock);
      await until(() => s.counter("transport_server_errors") === 1, "truncated request counted");
      expect(s.seen.length).toBe(0);
      // a new connection is served as usual
      const again = await rawConnect(s.srv.endpoint);
      cleanups.push(() => again.destroy());
      const r = replies(again);
      const m = stepLike(10);
      again.write(frame(m));
      await until(() => r.got.length === 1, "reply on a new connection");
      expectPlacedExactly(s.seen[0]!, m);
    });

    test("without koffi: the same traffic takes libuv's reads (no readv) and lands the same", async () => {
      setNativeKoffiForTest(() => {
        throw new Error("Cannot find module 'koffi'");
      });
      const s = await placingServer(scheme);
      const sock = await rawConnect(s.srv.endpoint);
      cleanups.push(() => sock.destroy());
      const r = replies(sock);
      const msg = stepLike(11);
      sock.write(frame(msg));
      await until(() => r.got.length === 1, "reply");
      expectPlacedExactly(s.seen[0]!, msg);
      expect(s.counter("transport_server_placed_messages")).toBe(1);
      expect(s.counter("transport_server_placed_scatter_reads")).toBe(0);
    });
  });
}
