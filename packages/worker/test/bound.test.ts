// CONTRACT 6.2 "Bound connections (1.1)", 10 (STATS on unbound connections) and 11 (tokens):
// STEP and RESET only on a connection bound by an OK HELLO of the current session, over real
// sockets (tcp, and ZeroMQ where a "connection" is the peer routing id).
import { encodeHello, FrameStatus, frame, helloAuth, Op, serialAdd } from "@tapwire/wire";
import { afterEach, describe, expect, test } from "vitest";
import type { Worker, WorkerOptions } from "../src/index.js";
import { createWorker } from "../src/index.js";
import { entry, helloFor, nullDrafter, Raw, Sess, stepFrame } from "./helpers.js";

const open: { workers: Worker[]; raws: Raw[] } = { workers: [], raws: [] };
afterEach(async () => {
  for (const r of open.raws.splice(0)) r.close();
  await Promise.all(open.workers.splice(0).map((w) => w.close()));
});

const d = nullDrafter();

async function start(over: Partial<WorkerOptions> = {}, ep = "tcp://127.0.0.1:0"): Promise<Worker> {
  const w = await createWorker({ drafter: d, listen: [ep], maxSlots: 32, maxRowsPerStep: 256, ...over });
  open.workers.push(w);
  return w;
}

async function conn(w: Worker): Promise<Raw> {
  const r = await new Raw(w.endpoints[0]!).connect();
  open.raws.push(r);
  return r;
}

async function session(w: Worker, id: number, token: string | null = null): Promise<Sess> {
  const s = new Sess(await conn(w), id, d, helloFor(d), token);
  expect((await s.doHello()).status).toBe(FrameStatus.OK);
  return s;
}

function counters(w: Worker): Record<string, number> {
  return w.stats().counters as Record<string, number>;
}

const oneRow = (slot = 0) => [entry({ slot, anchorPos: 1, nRows: 1 })];

describe("CONTRACT 6.2 (1.1): bound connections", () => {
  test("STEP and RESET on a connection that never said HELLO are NO_SESSION, whatever they carry; nothing changes", async () => {
    const w = await start();
    const s = await session(w, 0x1001);
    expect((await s.step(oneRow())).status).toBe(FrameStatus.OK);
    const before = { seq: w.stats().highest_seq, win: w.debugWindow(0) };
    const x = await conn(w);
    // The right session id and a newer seq (learned or guessed): still NO_SESSION.
    const st = stepFrame({
      seq: s.seq + 1,
      session: s.session,
      entries: [entry({ slot: 0, anchorPos: 2, rowStart: 1, nRows: 1 })],
    });
    expect((await x.send(st)).status).toBe(FrameStatus.NO_SESSION);
    expect((await x.send(frame({ op: Op.RESET, seq: s.seq + 1, session: s.session }))).status).toBe(
      FrameStatus.NO_SESSION,
    );
    // Check order: bound before seq, size and structure.
    const stale = stepFrame({ seq: s.seq, session: s.session, entries: oneRow() });
    expect((await x.send(stale)).status).toBe(FrameStatus.NO_SESSION);
    const badStructure = stepFrame({ seq: s.seq + 6, session: s.session, entries: [entry({ slot: 40 })] });
    expect((await x.send(badStructure)).status).toBe(FrameStatus.NO_SESSION);
    // Above 4 KiB before HELLO the transport hands over only the header (CONTRACT 11): NO_SESSION,
    // and the connection is closed.
    const huge = stepFrame({
      seq: s.seq + 5,
      session: s.session,
      entries: [entry({ slot: 0, anchorPos: 300, nRows: 300 })],
    });
    expect((await x.send(huge)).status).toBe(FrameStatus.NO_SESSION);
    expect({ seq: w.stats().highest_seq, win: w.debugWindow(0) }).toEqual(before);
    expect(counters(w).unbound_refused).toBe(4);
    expect(counters(w).oversize_unbound).toBe(1);
    // The session's own connection goes on with the next seq.
    expect((await s.step([entry({ slot: 0, anchorPos: 2, rowStart: 1, nRows: 1 })])).status).toBe(
      FrameStatus.OK,
    );
  });

  test("on a bound connection the order is seq (STALE_SEQ) -> size (TOO_LARGE) -> structure (BAD_FRAME)", async () => {
    const w = await start();
    const s = await session(w, 0x1002);
    const huge = (seq: number) =>
      stepFrame({ seq, session: s.session, entries: [entry({ slot: 40, anchorPos: 300, nRows: 300 })] });
    expect((await s.raw.send(huge(s.seq))).status).toBe(FrameStatus.STALE_SEQ);
    expect((await s.raw.send(huge(s.seq + 1))).status).toBe(FrameStatus.TOO_LARGE);
    const bad = stepFrame({ seq: s.seq + 1, session: s.session, entries: [entry({ slot: 40 })] });
    expect((await s.raw.send(bad)).status).toBe(FrameStatus.BAD_FRAME);
  });

  test("a RESET with seq + 2^30 from an unbound peer locks nobody out", async () => {
    const w = await start();
    const s = await session(w, 0x1003);
    const x = await conn(w);
    const jump = frame({ op: Op.RESET, seq: serialAdd(s.seq, 2 ** 30), session: s.session });
    expect((await x.send(jump)).status).toBe(FrameStatus.NO_SESSION);
    expect((await s.step(oneRow())).status).toBe(FrameStatus.OK);
    expect((await s.doHello()).status).toBe(FrameStatus.OK);
  });

  test("a same-session re-HELLO binds its own connection and leaves the others bound", async () => {
    const w = await start();
    const a = await session(w, 0x1004);
    const b = new Sess(await conn(w), a.session, d);
    b.seq = a.seq;
    expect((await b.doHello()).status).toBe(FrameStatus.OK);
    a.seq = b.seq;
    expect((await a.step(oneRow(0))).status).toBe(FrameStatus.OK);
    b.seq = a.seq;
    expect((await b.step(oneRow(1))).status).toBe(FrameStatus.OK);
    a.seq = b.seq;
    expect((await a.simple(Op.RESET)).status).toBe(FrameStatus.OK);
    expect(w.stats().bound_connections).toBe(2);
  });

  test("a HELLO making a new session current unbinds every other connection; a session taken back is new", async () => {
    const w = await start();
    const a = await session(w, 0x2001);
    const a2 = new Sess(await conn(w), a.session, d);
    a2.seq = a.seq;
    expect((await a2.doHello()).status).toBe(FrameStatus.OK);
    a.seq = a2.seq;
    expect((await a.step(oneRow())).status).toBe(FrameStatus.OK);
    // Another session takes over on a third connection.
    const b = await session(w, 0x2002);
    expect(counters(w).connections_unbound).toBe(2);
    expect((await a.step(oneRow())).status).toBe(FrameStatus.NO_SESSION);
    expect((await b.step(oneRow())).status).toBe(FrameStatus.OK);
    // Session A is taken back on its first connection: a new session (no windows kept) ...
    const back = await a.doHello();
    expect(back.status).toBe(FrameStatus.OK);
    expect(back.reply!.windowsKept).toBe(0);
    // Only B's connection was unbound by it (the HELLO's own connection is bound to the new take).
    expect(counters(w).connections_unbound).toBe(3);
    expect((await a.step(oneRow())).status).toBe(FrameStatus.OK);
    // ... and A's other connection, bound to the earlier take of A, stays unbound.
    a2.seq = a.seq;
    expect((await a2.step(oneRow(1))).status).toBe(FrameStatus.NO_SESSION);
    // B's connection was unbound by the takeover too.
    expect((await b.step(oneRow())).status).toBe(FrameStatus.NO_SESSION);
  });

  test("zmq: a connection is the peer routing id", async () => {
    const w = await start({}, "zmq+tcp://127.0.0.1:0");
    const s = new Sess(await conn(w), 0x3001, d, helloFor(d, { maxRowsPerStep: 256 }));
    expect((await s.doHello()).status).toBe(FrameStatus.OK);
    const x = await conn(w);
    const st = stepFrame({ seq: s.seq + 1, session: s.session, entries: oneRow() });
    expect((await x.send(st)).status).toBe(FrameStatus.NO_SESSION);
    // Above 4 KiB from a peer that never said HELLO (CONTRACT 11): answered from the header.
    const big = stepFrame({
      seq: s.seq + 2,
      session: s.session,
      entries: [entry({ slot: 0, anchorPos: 300, nRows: 300 })],
    });
    expect((await x.send(big)).status).toBe(FrameStatus.NO_SESSION);
    expect((await s.step(oneRow())).status).toBe(FrameStatus.OK);
    // The bound peer may send more than 4 KiB.
    const own = stepFrame({
      seq: s.seq + 1,
      session: s.session,
      entries: [entry({ slot: 1, anchorPos: 256, nRows: 256 })],
    });
    expect((await s.raw.send(own)).status).toBe(FrameStatus.OK);
  });
});

describe("CONTRACT 10 (1.1): STATS on an unbound connection", () => {
  test("holds neither the session id nor its seq; a bound connection sees both", async () => {
    const w = await start();
    const s = await session(w, 0x5eed5);
    await s.step(oneRow());
    const x = await conn(w);
    const a = await x.send(frame({ op: Op.STATS, seq: 1, session: 0 }));
    expect(a.status).toBe(FrameStatus.OK);
    const text = Buffer.from(a.body).toString("utf8");
    const snap = JSON.parse(text) as Record<string, unknown>;
    expect(snap).not.toHaveProperty("session");
    expect(snap).not.toHaveProperty("session_hex");
    expect(snap).not.toHaveProperty("highest_seq");
    expect(text).not.toContain("5eed5");
    expect(snap.windows_held).toBe(1);
    const highest = s.seq;
    const mine = JSON.parse(Buffer.from((await s.simple(Op.STATS)).body).toString("utf8")) as Record<
      string,
      unknown
    >;
    expect(mine.session).toBe(0x5eed5);
    expect(mine.highest_seq).toBe(highest);
  });
});

describe("CONTRACT 11 (1.1): tokens", () => {
  const TOKEN = "s3cret";
  test("with a token the default takeover is refuse: a replayed or new HELLO during the lease is BUSY", async () => {
    const w = await start({ token: TOKEN });
    const s = await session(w, 0x4001, TOKEN);
    // A captured HELLO replayed on another connection: same session, same seq -> STALE_SEQ.
    const captured = frame(
      { op: Op.HELLO, seq: s.seq, session: s.session },
      encodeHello({ ...helloFor(d), auth: helloAuth(TOKEN, s.session, s.seq) }),
    );
    const x = await conn(w);
    expect((await x.send(captured)).status).toBe(FrameStatus.STALE_SEQ);
    // Another session, properly authenticated, inside the lease: BUSY (not a takeover).
    const other = new Sess(await conn(w), 0x4002, d, helloFor(d), TOKEN);
    expect((await other.doHello()).status).toBe(FrameStatus.BUSY);
    expect((await s.step(oneRow())).status).toBe(FrameStatus.OK);
    expect(w.stats().session).toBe(0x4001);
  });

  test("with a token and takeover: allow, a new session takes over", async () => {
    const w = await start({ token: TOKEN, takeover: "allow" });
    await session(w, 0x4003, TOKEN);
    const other = new Sess(await conn(w), 0x4004, d, helloFor(d), TOKEN);
    expect((await other.doHello()).status).toBe(FrameStatus.OK);
  });

  test("without a token the default stays allow", async () => {
    const w = await start();
    await session(w, 0x4005);
    expect((await session(w, 0x4006)).session).toBe(0x4006);
  });
});
