// RemoteDraftClient against a scripted worker behind a real transport server (tcp, unix, zmq):
// the STEP outcomes of CONTRACT 9.2 for replies the real worker never sends (bad echoes, values
// breaking 6.3 / 7.4, q breaking 8, every frame status), timeouts, closes, seq wrap, PING /
// STATS / RESET, close() with a request in flight.
import { endpointFor, FakeClock } from "@tapwire/testing";
import { listen, type RpcServer } from "@tapwire/transport";
import {
  EntryFlag,
  FRAME_STATUS_NAMES,
  FrameStatus,
  frame,
  ReplyFlag,
  type ReqEntry,
  type SampleMeta,
} from "@tapwire/wire";
import { afterEach, describe, expect, test } from "vitest";
import {
  ClientError,
  RemoteDraftClient,
  type RemoteDraftClientOptions,
  RoundCore,
  STEP_OUTCOMES,
  type StepCall,
} from "../src/index.js";
import {
  checkOutcomesAgainstTable,
  clientOptions,
  GEO,
  makeRows,
  ROW_BYTES,
  ScriptedWorker,
  until,
} from "./helpers.js";

const open: { close(): unknown }[] = [];
afterEach(async () => {
  for (const o of open.splice(0).reverse()) await o.close();
});

interface Rig {
  worker: ScriptedWorker;
  server: RpcServer;
  client: RemoteDraftClient;
  stall: { on: boolean; release: () => void };
  clock: FakeClock | null;
}

async function rig(
  scheme: (typeof SCHEMES)[number],
  extra: Partial<RemoteDraftClientOptions> = {},
  fake = false,
): Promise<Rig> {
  const worker = new ScriptedWorker();
  let releaseAll: (() => void)[] = [];
  const stall = {
    on: false,
    release: () => {
      for (const r of releaseAll) r();
      releaseAll = [];
    },
  };
  const server = await listen(
    endpointFor(scheme),
    async (req) => {
      if (stall.on && req[6] === 2) await new Promise<void>((r) => releaseAll.push(r));
      return worker.handle(req);
    },
    { closeTimeoutMs: 50 },
  );
  open.push(server);
  open.push({ close: () => stall.release() });
  const clock = fake ? new FakeClock() : null;
  const client = checkOutcomesAgainstTable(
    new RemoteDraftClient(clientOptions(server.endpoint, { ...(clock ? { clock } : {}), ...extra })),
  );
  open.push(client);
  expect(await waitReady(client, clock)).toBe(true);
  return { worker, server, client, stall, clock };
}

async function waitReady(client: RemoteDraftClient, clock: FakeClock | null): Promise<boolean> {
  if (clock === null) return client.waitReady(10_000);
  await until(() => client.ready || client.disabled, 10_000, "ready");
  return client.ready;
}

function entry(slot: number, anchorPos: number, nRows: number, extra: Partial<ReqEntry> = {}): ReqEntry {
  return {
    slot,
    generation: 1,
    anchorPos,
    anchorToken: 5,
    rowStart: nRows > 0 ? anchorPos - nRows : 0,
    nRows,
    nOut: 0,
    flags: EntryFlag.NEED_DRAFT | (nRows > 0 ? EntryFlag.RESYNC : 0),
    ...extra,
  };
}

/** Stages rows in the client's send buffer and returns the STEP call (CONTRACT 7.3). */
function staged(
  client: RemoteDraftClient,
  entries: ReqEntry[],
  stepId = 1,
  sampleMeta?: SampleMeta[],
): StepCall {
  let off = client.rowsOffset(entries.length);
  let nRows = 0;
  for (const e of entries) {
    const rows = makeRows(e.slot, e.rowStart, e.nRows);
    client.sendBuffer.set(rows, off);
    off += rows.length;
    nRows += e.nRows;
  }
  return {
    stepId,
    entries,
    nRows,
    epoch: client.connectionEpoch() ?? 0,
    ...(sampleMeta ? { sampleMeta } : {}),
  };
}

// issue 23: shm+unix too (unix doorbells, the send buffer and rings in shared memory)
const SCHEMES = ["tcp", "unix", "zmq+tcp", "shm+unix"] as const;

describe.each(SCHEMES)("scripted worker over %s", (scheme) => {
  test("ok: rows staged in the send buffer go out unchanged; drafts validated; parts mode too", async () => {
    const { worker, client } = await rig(scheme);
    const out = await client.step(staged(client, [entry(0, 10, 8), entry(3, 4, 4, { nOut: 2 })]));
    expect(out.reason).toBe("ok");
    expect(out.ok).toBe(true);
    expect(out.unknownApply).toBe(false);
    expect(out.rttUs).toBeGreaterThan(0);
    expect(Array.from(out.reply!.draftIds.subarray(0, 4))).toEqual([6, 7, 8, 9]);
    const seen = worker.steps[0]!;
    expect(Buffer.from(seen.rows)).toEqual(Buffer.concat([makeRows(0, 2, 8), makeRows(3, 0, 4)]));
    const rows = makeRows(1, 6, 2);
    const out2 = await client.step({
      stepId: 2,
      entries: [entry(1, 8, 2)],
      nRows: 2,
      rows: [rows.subarray(0, ROW_BYTES), rows.subarray(ROW_BYTES)],
    });
    expect(out2.reason).toBe("ok");
    expect(Buffer.from(worker.steps[1]!.rows)).toEqual(Buffer.from(rows));
    const snap = client.snapshot();
    expect(snap.counters.step_ok).toBe(2);
    expect(snap.histograms.step_rtt_seconds!.count).toBe(2);
    expect(snap.counters.bytes_sent).toBeGreaterThan(8 * ROW_BYTES);
    // the seed's stats: hellos, bytes both ways, worker info of the connection
    expect(snap.counters.hellos).toBe(1);
    expect(snap.counters.bytes_received).toBeGreaterThan(0);
    expect(JSON.parse(snap.info.worker!)).toMatchObject({ name: "scripted" });
    expect(snap.gauges.epoch).toBe(1);
    expect(snap.gauges.ready).toBe(1);
  });

  test("bad echoes and values breaking 6.3 / 7.4 are bad_reply (unknown apply), recorded, reconnected", async () => {
    const { worker, client } = await rig(scheme);
    const cases: [
      string,
      Parameters<NonNullable<ScriptedWorker["onStep"]>>[0] extends infer H
        ? (h: H) => Uint8Array | null | undefined
        : never,
      string,
    ][] = [
      ["seq", (h) => frame({ op: 2, status: 0, seq: h.header.seq + 1, session: h.header.session }), "seq="],
      [
        "session",
        (h) => frame({ op: 2, status: 0, seq: h.header.seq, session: (h.header.session ^ 1) >>> 0 }),
        "session=",
      ],
      ["op", (h) => frame({ op: 3, status: 0, seq: h.header.seq, session: h.header.session }), "op=3"],
      [
        "step_id",
        (h) => void new DataView(h.buf.buffer, h.buf.byteOffset).setUint32(24, 99, true),
        "step_id",
      ],
      [
        "generation",
        (h) => {
          h.views.generation[0] = 7;
        },
        "generation",
      ],
      [
        "draft id",
        (h) => {
          h.views.draftIds[1] = GEO.vocabSize;
        },
        "draft id 1000",
      ],
      [
        "confidence NaN",
        (h) => {
          h.views.confidence[0] = Number.NaN;
        },
        "confidence",
      ],
      [
        "confidence > 1",
        (h) => {
          h.views.confidence[2] = 1.5;
        },
        "confidence",
      ],
      [
        "margin < 0",
        (h) => {
          h.views.margin![0] = -1;
        },
        "margin",
      ],
      [
        "past n_out",
        (h) => {
          h.views.draftIds[4 + 3] = 1;
        },
        "position 3",
      ],
      [
        "window_rows",
        (h) => {
          h.views.windowRows[0] = 9;
        },
        "window_rows",
      ],
      [
        "unknown status",
        (h) => {
          h.views.status[0] = 9;
        },
        "status",
      ],
      ["truncated", (h) => h.buf.slice(0, h.views.frameLength - 4), ""],
      [
        "unknown frame status",
        (h) => frame({ op: 2, status: 42, seq: h.header.seq, session: h.header.session }),
        "42",
      ],
    ];
    let epoch = client.epoch;
    for (const [name, hook, msg] of cases) {
      worker.onStep = hook;
      const out = await client.step(staged(client, [entry(0, 10, 8), entry(1, 3, 3, { nOut: 3 })]));
      expect(out.reason, `${name}: ${out.error}`).toBe("bad_reply");
      expect(out.unknownApply, name).toBe(true);
      expect(out.reply).toBeNull();
      expect(out.error, name).toContain(msg);
      expect(client.snapshot().info.last_bad_reply, name).toBe(out.error);
      expect(client.ready).toBe(false);
      worker.onStep = null;
      expect(await client.waitReady(10_000)).toBe(true);
      expect(client.epoch).toBe(epoch + 1);
      epoch = client.epoch;
    }
    expect(client.snapshot().counters.step_bad_reply).toBe(cases.length);
  });

  test("frame statuses: reconnect at once, reconnect with backoff, or disable (CONTRACT 5, 9.2)", async () => {
    const reconnectNow = [FrameStatus.NO_SESSION, FrameStatus.STALE_SEQ];
    const withBackoff = [FrameStatus.BUSY, FrameStatus.INTERNAL];
    for (const st of [...reconnectNow, ...withBackoff]) {
      const { worker, client, clock } = await rig(scheme, { backoffMs: 60_000, backoffMaxMs: 60_000 }, true);
      worker.stepStatus.push(st);
      const out = await client.step(staged(client, [entry(0, 4, 4)]));
      expect(out.reason).toBe(
        `frame_${st === 1 ? "no_session" : st === 2 ? "stale_seq" : st === 10 ? "busy" : "internal"}`,
      );
      expect(out.unknownApply).toBe(false);
      expect(client.disabled).toBe(false);
      if (reconnectNow.includes(st as 1 | 2)) {
        await until(() => client.ready, 10_000, "reconnect without backoff");
        expect(worker.hellos.length).toBe(2);
      } else {
        await clock!.advanceAsync(59_000);
        expect(client.ready).toBe(false);
        expect(worker.hellos.length).toBe(1);
        await clock!.advanceAsync(1_000);
        await until(() => client.ready, 10_000, "reconnect after backoff");
      }
      expect(client.epoch).toBe(2);
    }
    for (const st of [3, 4, 5, 6, 7, 8, 9]) {
      const { worker, client } = await rig(scheme);
      worker.stepStatus.push(st);
      const out = await client.step(staged(client, [entry(0, 4, 4)]));
      const name = FRAME_STATUS_NAMES[st]!;
      expect(out.reason).toBe(`frame_${name.toLowerCase()}`);
      expect(STEP_OUTCOMES[out.reason].action).toBe("disable");
      expect(out.unknownApply).toBe(false);
      expect(client.disabled).toBe(true);
      expect(client.disabledReason).toBe(`STEP refused: ${name}`);
      expect((await client.step(staged(client, [entry(0, 4, 4)]))).reason).toBe("disabled");
    }
  });

  test("a HELLO answered STALE_SEQ starts a new session at once, counted (CONTRACT 6.2, 1.1)", async () => {
    const { worker, client, clock } = await rig(scheme, { backoffMs: 60_000, backoffMaxMs: 60_000 }, true);
    const first = client.sessionId;
    // another peer advanced the session's seq far ahead (a RESET with seq + 2^30 elsewhere)
    const highest = new Map<number, number>([[first, 2 ** 30]]);
    const sessions: number[] = [];
    worker.onFrame = (h) => {
      if (h.op !== 1) return undefined;
      sessions.push(h.session);
      const top = highest.get(h.session);
      if (top !== undefined && h.seq <= top) return frame({ ...h, status: FrameStatus.STALE_SEQ });
      highest.set(h.session, h.seq);
      return undefined;
    };
    worker.stepStatus.push(FrameStatus.STALE_SEQ);
    expect((await client.step(staged(client, [entry(0, 4, 4)]))).reason).toBe("frame_stale_seq");
    // no backoff anywhere: the fake clock never moves
    await until(() => client.ready, 10_000, "ready on a new session");
    expect(client.sessionId).not.toBe(first);
    expect(sessions).toEqual([first, client.sessionId]);
    const c = client.snapshot().counters;
    expect(c.new_sessions_stale_seq).toBe(1);
    expect(c.new_sessions).toBe(1);
    expect(c.connect_failures).toBe(0);
    expect(client.epoch).toBe(2);
    expect((await client.step(staged(client, [entry(0, 4, 4)]))).reason).toBe("ok");

    // a worker that answers STALE_SEQ to the fresh session too cannot spin the loop: backoff
    worker.onFrame = (h) => (h.op === 1 ? frame({ ...h, status: FrameStatus.STALE_SEQ }) : undefined);
    client.markFailed("test", { backoff: false });
    await until(() => client.snapshot().counters.connect_failures === 1, 10_000, "a failure");
    expect(client.snapshot().counters.new_sessions_stale_seq).toBe(2);
    const hellosBefore = sessions.length;
    await clock!.advanceAsync(30_000);
    expect(sessions.length).toBe(hellosBefore);
    expect(client.ready).toBe(false);
  });

  test("timeout and transport error: unknown apply, drop and reconnect", async () => {
    const { worker, client, stall } = await rig(scheme, { requestTimeoutMs: 150 });
    stall.on = true;
    const t = await client.step(staged(client, [entry(0, 4, 4)]));
    expect(t.reason).toBe("timeout");
    expect(t.unknownApply).toBe(true);
    stall.on = false;
    stall.release();
    expect(await client.waitReady(10_000)).toBe(true);
    worker.onStep = () => null; // the server closes the connection (ZeroMQ has none: no reply, a timeout)
    const e = await client.step(staged(client, [entry(0, 4, 4)]));
    expect(e.reason).toBe(scheme === "zmq+tcp" ? "timeout" : "transport_error");
    expect(e.unknownApply).toBe(true);
    worker.onStep = null;
    expect(await client.waitReady(10_000)).toBe(true);
    expect(client.snapshot().counters.disconnects).toBe(2);
  });

  test("a STEP built for an older epoch is not sent (reconnected)", async () => {
    const { worker, client } = await rig(scheme);
    const call = staged(client, [entry(0, 4, 4)]);
    client.markFailed("test", { backoff: false });
    expect(await client.waitReady(10_000)).toBe(true);
    const out = await client.step(call);
    expect(out.reason).toBe("reconnected");
    expect(worker.steps.length).toBe(0);
  });

  test("PING, STATS and RESET on the engine's connection", async () => {
    const { worker, client } = await rig(scheme);
    expect(await client.ping(new Uint8Array([1, 2, 3]))).toBeGreaterThan(0);
    await client.step(staged(client, [entry(0, 4, 4)]));
    expect(await client.stats()).toEqual({ steps: 1 });
    await client.reset();
    expect(worker.ops.filter((o) => o === 5).length).toBe(1);
    await expect(client.ping(new Uint8Array(2000))).rejects.toMatchObject({ code: "CLIENT_BAD_ARGUMENT" });
    worker.session = 1; // RESET from a session the worker does not hold
    await expect(client.reset()).rejects.toMatchObject({
      code: "CLIENT_REFUSED",
      status: FrameStatus.NO_SESSION,
    });
    expect(await client.waitReady(10_000)).toBe(true);
  });

  test("seq wrap: a new session before the seq wraps (CONTRACT 6.2)", async () => {
    const { worker, client } = await rig(scheme, { initialSeq: 0xffffffff - 2 });
    const first = client.sessionId;
    expect(worker.hellos.length).toBe(1);
    const a = await client.step(staged(client, [entry(0, 4, 4)])); // seq 0xffffffff
    expect(a.reason).toBe("ok");
    expect(client.lastSeq).toBe(0xffffffff);
    const b = await client.step(staged(client, [entry(0, 4, 4)]));
    expect(b.reason).toBe("not_ready");
    expect(client.sessionId).not.toBe(first);
    expect(await client.waitReady(10_000)).toBe(true);
    expect(worker.session).toBe(client.sessionId);
    expect(client.lastSeq).toBe(1);
    expect((await client.step(staged(client, [entry(0, 4, 4)]))).reason).toBe("ok");
    expect(client.snapshot().counters.new_sessions).toBe(1);
  });

  test("close() with a STEP in flight resolves it; nothing is left pending", async () => {
    const { client, stall } = await rig(scheme, { requestTimeoutMs: 30_000 });
    stall.on = true;
    const pending = client.step(staged(client, [entry(0, 4, 4)]));
    const stats = client.stats();
    await new Promise((r) => setTimeout(r, 20));
    await client.close();
    const out = await pending;
    expect(out.reason).toBe("transport_error");
    await expect(stats).rejects.toBeInstanceOf(ClientError);
    expect((await client.step(staged(client, [entry(0, 4, 4)]))).reason).toBe("not_ready");
  });
});

describe("sampled sessions over tcp (CONTRACT 8)", () => {
  const meta: SampleMeta[] = [
    { seed: 1, topK: 4, tempMilli: 700 },
    { seed: 2, topK: 1, tempMilli: 0 },
  ];
  test("valid q passes; q breaking CONTRACT 8 is bad_reply", async () => {
    const { worker, client } = await rig("tcp", { sampleMode: "top32" });
    const ok = await client.step(staged(client, [entry(0, 4, 4), entry(1, 4, 4)], 1, meta));
    expect(ok.reason).toBe("ok");
    expect(ok.reply!.sampledMask![0]).toBe(1);
    const cases: [string, (h: Parameters<NonNullable<ScriptedWorker["onStep"]>>[0]) => void, string][] = [
      [
        "sum",
        (h) => {
          h.views.proposalQ![0] = h.views.proposalQ![0]! + 1;
        },
        "",
      ],
      [
        "duplicate support",
        (h) => {
          h.views.supportIds![1] = h.views.supportIds![0]!;
        },
        "",
      ],
      [
        "draft outside support",
        (h) => {
          h.views.draftIds[0] = 999;
        },
        "",
      ],
      [
        "q on greedy entry",
        (h) => {
          h.views.proposalQ![4 * 32] = 1;
        },
        "",
      ],
      [
        "missing SAMPLED",
        (h) => void new DataView(h.buf.buffer, h.buf.byteOffset).setUint16(24 + 10, ReplyFlag.MARGIN, true),
        "",
      ],
    ];
    for (const [name, hook] of cases) {
      worker.onStep = (h) => {
        hook(h);
        return undefined;
      };
      const out = await client.step(staged(client, [entry(0, 4, 4), entry(1, 4, 4)], 1, meta));
      expect(out.reason, name).toBe("bad_reply");
      worker.onStep = null;
      expect(await client.waitReady(10_000)).toBe(true);
    }
    await expect(client.step(staged(client, [entry(0, 4, 4)]))).rejects.toMatchObject({
      code: "CLIENT_BAD_ARGUMENT",
    });
  });

  test("RoundCore copies q and support out per slot; RELEASE entries carry greedy meta", async () => {
    const { worker, client } = await rig("tcp", { sampleMode: "top32" });
    const core = new RoundCore({ client });
    const res = await core.round({
      requests: [
        {
          slot: 2,
          generation: 1,
          anchorPos: 3,
          anchorToken: 7,
          newRows: makeRows(2, 0, 3),
          sampleMeta: { seed: 9, topK: 3, tempMilli: 800 },
        },
        { slot: 4, generation: 1, anchorPos: 1, anchorToken: 7, newRows: makeRows(4, 0, 1) },
      ],
    });
    expect(res.outcome).toBe("ok");
    const d = res.drafts[0]!;
    expect(d.sampledMask![0]).toBe(1);
    let sum = 0;
    for (let t = 0; t < 32; t++) sum += d.proposalQ![t]!;
    expect(sum).toBe(2 ** 24);
    expect(Array.from(d.supportIds!.subarray(0, 3))).toEqual([8, 9, 10]);
    expect(res.drafts[1]!.sampledMask![0]).toBe(0);
    await core.round({ requests: [], release: [2, 4] });
    const last = worker.steps.at(-1)!;
    expect(last.entries.map((e) => e.flags)).toEqual([EntryFlag.RELEASE, EntryFlag.RELEASE]);
    expect(last.sampleMeta).toEqual([
      { seed: 0, topK: 1, tempMilli: 0 },
      { seed: 0, topK: 1, tempMilli: 0 },
    ]);
  });

  test("q on a greedy session is bad_reply", async () => {
    const { worker, client } = await rig("tcp");
    worker.onStep = (h) => {
      // the same reply with SAMPLED set: its size no longer matches a greedy reply
      new DataView(h.buf.buffer, h.buf.byteOffset).setUint16(
        24 + 10,
        ReplyFlag.MARGIN | ReplyFlag.SAMPLED,
        true,
      );
      return undefined;
    };
    const out = await client.step(staged(client, [entry(0, 4, 4)]));
    expect(out.reason).toBe("bad_reply");
  });
});
