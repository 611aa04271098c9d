// RemoteDraftClient + RoundCore against the real worker in a child process (tapwire-worker with
// the NullDrafter) over tcp, unix and zmq: rounds, restarts with the same or other identities,
// real BUSY / NO_SESSION / STALE_SEQ / fatal statuses, and faults through the fault proxy.
import { type ChildHandle, endpointFor, killAllChildren, spawnBin, startFaultProxy } from "@tapwire/testing";
import { afterEach, describe, expect, test } from "vitest";
import {
  RemoteDraftClient,
  type RemoteDraftClientOptions,
  RoundCore,
  type RoundRequest,
} from "../src/index.js";
import {
  checkOutcomesAgainstTable,
  clientOptions,
  DRAFTER_ID,
  GEO,
  hex,
  identity,
  MARKOV_ID,
  makeRows,
  until,
} from "./helpers.js";
import { WORKER_BIN } from "./worker-bin.js";

const open: { close(): unknown }[] = [];
afterEach(async () => {
  for (const o of open.splice(0).reverse()) await o.close();
  await killAllChildren();
});

async function spawnWorker(
  listenOn: string,
  extra: string[] = [],
  ids: { drafter: Uint8Array; markov: Uint8Array } = { drafter: DRAFTER_ID, markov: MARKOV_ID },
): Promise<{ child: ChildHandle; endpoint: string }> {
  const child = await spawnBin(WORKER_BIN, [
    "--drafter",
    "null",
    "--listen",
    listenOn,
    "--window",
    String(GEO.window),
    "--num-spec",
    String(GEO.numSpec),
    "--vocab",
    String(GEO.vocabSize),
    "--num-taps",
    String(GEO.numTaps),
    "--hidden",
    String(GEO.hidden),
    "--drafter-identity",
    hex(ids.drafter),
    "--markov-identity",
    hex(ids.markov),
    "--log-level",
    "info",
    ...extra,
  ]);
  const eps = child.readyLine.json?.endpoints as string[];
  return { child, endpoint: eps[0]! };
}

function client(endpoint: string, extra: Partial<RemoteDraftClientOptions> = {}): RemoteDraftClient {
  const c = checkOutcomesAgainstTable(new RemoteDraftClient(clientOptions(endpoint, extra)));
  open.push(c);
  return c;
}

/** A tiny engine: per slot a request that accepts `step` tokens per round. */
class Engine {
  reqs = new Map<number, { gen: number; anchor: number; sent: number }>();
  gen = 1;
  start(slot: number, prompt: number): void {
    this.reqs.set(slot, { gen: this.gen++, anchor: prompt, sent: 0 });
  }
  advance(n: number): void {
    for (const r of this.reqs.values()) r.anchor += n;
  }
  input(): RoundRequest[] {
    return [...this.reqs].map(([slot, r]) => {
      const n = r.anchor - r.sent;
      const req: RoundRequest = {
        slot,
        generation: r.gen,
        anchorPos: r.anchor,
        anchorToken: r.anchor % GEO.vocabSize,
        newRows: n > 0 ? makeRows(slot, r.sent, n) : null,
      };
      r.sent = r.anchor;
      return req;
    });
  }
}

async function stats(c: RemoteDraftClient): Promise<Record<string, unknown>> {
  return (await c.stats()) as Record<string, unknown>;
}

describe.each(["tcp", "unix", "zmq+tcp", "shm+unix"] as const)("real worker over %s", (scheme) => {
  test.each(["stage", "parts"] as const)(
    "rounds (%s): resync then new rows, drafts, RELEASE frees the window",
    async (rowsMode) => {
      const { endpoint } = await spawnWorker(endpointFor(scheme));
      const c = client(endpoint);
      const core = new RoundCore({ client: c, rowsMode });
      expect(await c.waitReady(10_000)).toBe(true);
      const eng = new Engine();
      eng.start(0, 12);
      eng.start(5, 3);
      let r = await core.round({ requests: eng.input() });
      expect(r.outcome).toBe("ok");
      expect(r.resynced).toBe(2);
      expect(r.drafts.map((d) => [d.reason, d.k])).toEqual([
        ["ok", GEO.numSpec],
        ["ok", GEO.numSpec],
      ]);
      eng.advance(2);
      r = await core.round({ requests: eng.input() });
      expect(r.resynced).toBe(0);
      expect(r.rowsSent).toBe(4);
      expect(r.drafts.every((d) => d.reason === "ok")).toBe(true);
      expect((await stats(c)).windows_held).toBe(2);
      eng.reqs.delete(5);
      r = await core.round({ requests: eng.input(), release: [5] });
      expect(r.released).toBe(1);
      expect((await stats(c)).windows_held).toBe(1);
      expect(await c.ping(new Uint8Array([9]))).toBeGreaterThan(0);
      await core.reset();
      expect((await stats(c)).windows_held).toBe(0);
      eng.advance(1);
      r = await core.round({ requests: eng.input() });
      expect(r.resynced).toBe(1);
      expect(r.drafts[0]!.reason).toBe("ok");
    },
  );

  test("worker killed and restarted: same identities reconnect and resync; other identities disable", async () => {
    const first = await spawnWorker(endpointFor(scheme));
    const c = client(first.endpoint, { backoffMs: 20, backoffMaxMs: 50 });
    const core = new RoundCore({ client: c });
    expect(await c.waitReady(10_000)).toBe(true);
    const eng = new Engine();
    eng.start(1, 9);
    expect((await core.round({ requests: eng.input() })).outcome).toBe("ok");
    await first.child.kill("SIGKILL");
    eng.advance(1);
    const failed = await core.round({ requests: eng.input() });
    expect(["timeout", "transport_error", "not_ready"]).toContain(failed.outcome);
    expect(failed.drafts[0]!.k).toBe(0);
    const second = await spawnWorker(first.endpoint);
    await until(() => c.ready, 15_000, "reconnect to the restarted worker");
    expect(c.epoch).toBe(2);
    eng.advance(1);
    const r = await core.round({ requests: eng.input() });
    expect(r.outcome).toBe("ok");
    expect(r.resynced).toBe(1);
    expect(r.drafts[0]!.reason).toBe("ok");
    await second.child.kill("SIGKILL");
    await spawnWorker(first.endpoint, [], { drafter: identity(40), markov: MARKOV_ID });
    // the client learns of a dead connection from its next request (the engine's next round)
    eng.advance(1);
    expect((await core.round({ requests: eng.input() })).drafts[0]!.k).toBe(0);
    await until(() => c.disabled, 15_000, "disabled by the other worker");
    expect(c.disabledReason).toContain("IDENTITY_MISMATCH");
    expect(c.disabledReason).toContain(hex(identity(40)));
    expect(c.disabledReason).toContain(hex(DRAFTER_ID));
    const off = await core.round({ requests: eng.input() });
    expect(off.outcome).toBe("disabled");
    expect(off.drafts[0]!.reason).toBe("disabled");
  });
});

describe("real worker statuses (tcp)", () => {
  test("NO_SESSION when another session took over; STALE_SEQ from a stale seq of the same session", async () => {
    const { endpoint } = await spawnWorker(endpointFor("tcp"));
    const a = client(endpoint, { backoffMs: 60_000, backoffMaxMs: 60_000 });
    const coreA = new RoundCore({ client: a });
    expect(await a.waitReady(10_000)).toBe(true);
    const eng = new Engine();
    eng.start(0, 5);
    expect((await coreA.round({ requests: eng.input() })).outcome).toBe("ok");
    const b = client(endpoint);
    expect(await b.waitReady(10_000)).toBe(true);
    eng.advance(1);
    const r = await coreA.round({ requests: eng.input() });
    expect(r.outcome).toBe("frame_no_session");
    // reconnect without backoff (the backoff is 60 s here)
    await until(() => a.ready, 10_000, "reconnect at once after NO_SESSION");
    eng.advance(1);
    const again = await coreA.round({ requests: eng.input() });
    expect(again.outcome).toBe("ok");
    expect(again.resynced).toBe(1);
    await b.close();

    // a second client with A's session and a newer seq: A's next seq is stale
    const twin = client(endpoint, { sessionId: a.sessionId, initialSeq: a.lastSeq + 1000 });
    expect(await twin.waitReady(10_000)).toBe(true);
    eng.advance(1);
    const st = await coreA.round({ requests: eng.input() });
    expect(st.outcome).toBe("frame_stale_seq");
    expect(a.disabled).toBe(false);
  });

  test("a peer that advanced the session's seq far ahead cannot lock the client out (CONTRACT 6.2, 1.1)", async () => {
    const { endpoint } = await spawnWorker(endpointFor("tcp"));
    const a = client(endpoint, { backoffMs: 60_000, backoffMaxMs: 60_000 });
    const core = new RoundCore({ client: a });
    expect(await a.waitReady(10_000)).toBe(true);
    const eng = new Engine();
    eng.start(0, 5);
    expect((await core.round({ requests: eng.input() })).outcome).toBe("ok");
    const first = a.sessionId;
    // another connection says HELLO for A's session with a seq 2^30 ahead, then goes away
    const peer = client(endpoint, { sessionId: first, initialSeq: a.lastSeq + 2 ** 30 });
    expect(await peer.waitReady(10_000)).toBe(true);
    await peer.close();
    eng.advance(1);
    expect((await core.round({ requests: eng.input() })).outcome).toMatch(/^frame_(stale_seq|no_session)$/);
    // the HELLO of A's session is now STALE_SEQ forever: A leaves it at once (backoff is 60 s)
    await until(() => a.ready, 10_000, "ready on a new session");
    expect(a.sessionId).not.toBe(first);
    expect(a.snapshot().counters.new_sessions_stale_seq).toBe(1);
    expect(a.snapshot().counters.connect_failures).toBe(0);
    eng.advance(1);
    const r = await core.round({ requests: eng.input() });
    expect(r.outcome).toBe("ok");
    expect(r.resynced).toBe(1);
  });

  test("takeover refuse: BUSY on HELLO is a connect failure, not fatal", async () => {
    const { endpoint } = await spawnWorker(endpointFor("tcp"), ["--takeover", "refuse"]);
    const a = client(endpoint);
    expect(await a.waitReady(10_000)).toBe(true);
    await a.ping();
    const b = client(endpoint, { backoffMs: 60_000, backoffMaxMs: 60_000 });
    await until(() => b.snapshot().counters.connect_failures! >= 1, 10_000, "BUSY");
    expect(b.lastError).toContain("BUSY");
    expect(b.disabled).toBe(false);
    expect(b.ready).toBe(false);
  });

  test("fatal HELLO answers disable with a reason: UNAUTHORIZED, CONFIG_MISMATCH, IDENTITY_MISMATCH", async () => {
    const { endpoint } = await spawnWorker(endpointFor("tcp"), ["--token", "s3cret"]);
    const good = client(endpoint, { token: "s3cret" });
    expect(await good.waitReady(10_000)).toBe(true);
    await good.close();
    const noAuth = client(endpoint);
    await until(() => noAuth.disabled, 10_000, "UNAUTHORIZED");
    expect(noAuth.disabledReason).toBe("HELLO refused: UNAUTHORIZED");
    const cfg = client(endpoint, { token: "s3cret", window: 16 });
    await until(() => cfg.disabled, 10_000, "CONFIG_MISMATCH");
    expect(cfg.disabledReason).toContain("CONFIG_MISMATCH");
    expect(cfg.disabledReason).toContain("window");
    const other = client(endpoint, { token: "s3cret", markovIdentity: identity(77) });
    await until(() => other.disabled, 10_000, "IDENTITY_MISMATCH");
    expect(other.disabledReason).toContain(hex(identity(77)));
    expect(other.disabledReason).toContain(hex(MARKOV_ID));
  });

  test("seq wrap starts a new session that the worker accepts", async () => {
    const { endpoint } = await spawnWorker(endpointFor("tcp"));
    const c = client(endpoint, { initialSeq: 0xffffffff - 2 });
    const core = new RoundCore({ client: c });
    expect(await c.waitReady(10_000)).toBe(true);
    const s0 = c.sessionId;
    const eng = new Engine();
    eng.start(0, 4);
    expect((await core.round({ requests: eng.input() })).outcome).toBe("ok");
    const wrap = await core.round({ requests: eng.input() });
    expect(wrap.outcome).toBe("not_ready");
    expect(c.sessionId).not.toBe(s0);
    expect(await c.waitReady(10_000)).toBe(true);
    const r = await core.round({ requests: eng.input() });
    expect(r.outcome).toBe("ok");
    expect(r.resynced).toBe(1);
    expect((await stats(c)).session).toBe(c.sessionId);
  });
});

describe("faults through the proxy (tcp)", () => {
  async function proxied(extra: Partial<RemoteDraftClientOptions> = {}) {
    const { endpoint } = await spawnWorker(endpointFor("tcp"));
    const port = Number(new URL(endpoint).port);
    const proxy = await startFaultProxy({ host: "127.0.0.1", port });
    open.push(proxy);
    const c = client(proxy.endpoint, { requestTimeoutMs: 300, backoffMs: 10, backoffMaxMs: 20, ...extra });
    const core = new RoundCore({ client: c });
    expect(await c.waitReady(10_000)).toBe(true);
    const eng = new Engine();
    eng.start(2, 6);
    expect((await core.round({ requests: eng.input() })).outcome).toBe("ok");
    return { proxy, c, core, eng };
  }

  test("stall and latency: timeout, unknown apply, resync after reconnect", async () => {
    const { proxy, c, core, eng } = await proxied();
    for (const fault of [{ kind: "stall" } as const, { kind: "latency", ms: 1000 } as const]) {
      proxy.setFault(fault);
      eng.advance(1);
      const r = await core.round({ requests: eng.input() });
      expect(r.outcome).toBe("timeout");
      expect(core.slotView(2).needResync).toBe(true);
      proxy.setFault(null);
      await until(() => c.ready, 10_000, "reconnect");
      eng.advance(1);
      const ok = await core.round({ requests: eng.input() });
      expect(ok.outcome).toBe("ok");
      expect(ok.resynced).toBe(1);
    }
  });

  test("connection reset mid-reply: transport_error", async () => {
    const { proxy, c, core, eng } = await proxied();
    proxy.setFault({ kind: "drop_after", bytes: 10, direction: "down" });
    eng.advance(1);
    const r = await core.round({ requests: eng.input() });
    expect(r.outcome).toBe("transport_error");
    expect(core.slotView(2).needResync).toBe(true);
    proxy.setFault(null);
    await until(() => c.ready, 10_000, "reconnect");
    eng.advance(1);
    expect((await core.round({ requests: eng.input() })).outcome).toBe("ok");
  });

  test("a corrupted reply byte is bad_reply, recorded", async () => {
    const { proxy, c, core, eng } = await proxied();
    // one connection so far: its down stream is at bytesDown; +4 (length prefix) +8 is the reply's seq
    proxy.setFault({ kind: "corrupt", offset: proxy.stats.bytesDown + 4 + 8, direction: "down" });
    eng.advance(1);
    const bad = await core.round({ requests: eng.input() });
    expect(bad.outcome).toBe("bad_reply");
    expect(c.snapshot().info.last_bad_reply).toContain("seq=");
    proxy.setFault(null);
    await until(() => c.ready, 10_000, "reconnect");
    eng.advance(1);
    expect((await core.round({ requests: eng.input() })).outcome).toBe("ok");
  });

  test("corrupted request magic / version: the worker answers BAD_FRAME / BAD_VERSION, which disable", async () => {
    for (const [offset, name] of [
      [4 + 0, "BAD_FRAME"],
      [4 + 4, "BAD_VERSION"],
    ] as const) {
      const { proxy, c, core, eng } = await proxied();
      const already = proxy.stats.bytesUp;
      proxy.setFault({ kind: "corrupt", offset: already + offset, direction: "up" });
      eng.advance(1);
      const r = await core.round({ requests: eng.input() });
      expect(r.outcome).toBe(`frame_${name.toLowerCase()}`);
      expect(c.disabledReason).toBe(`STEP refused: ${name}`);
    }
  });

  test("refused connections are counted connect failures", async () => {
    const { proxy, c } = await proxied();
    proxy.setFault({ kind: "refuse" });
    proxy.dropAll();
    await expect(c.ping()).rejects.toMatchObject({ code: "CLIENT_TRANSPORT" });
    await until(() => (c.snapshot().counters.connect_failures ?? 0) >= 2, 10_000, "connect failures");
    expect(c.ready).toBe(false);
    proxy.setFault(null);
    await until(() => c.ready, 10_000, "reconnect");
  });
});

// issue 23: on shm+unix the engine's rows written through rowsTarget live in the client's
// shared-memory arena and leave by offset; the real worker copies them once into its windows.
test("shm+unix: rowsTarget views lie in the shared arena; rounds through the real worker draft from them", async () => {
  const { child, endpoint } = await spawnWorker(endpointFor("shm+unix"));
  const c = client(endpoint);
  expect(c.allocRows(64)).not.toBeNull(); // an arena exists (koffi is installed in the workspace)
  const core = new RoundCore({ client: c, rowsMode: "parts" });
  expect(await c.waitReady(10_000)).toBe(true);
  const views = core.rowsTarget(2, 1, 0, 4);
  for (const v of views) expect(v.buffer).toBe(c.sendBuffer.buffer);
  const rows = makeRows(2, 0, 4);
  let off = 0;
  for (const v of views) {
    v.set(rows.subarray(off, off + v.length));
    off += v.length;
  }
  const r = await core.round({
    requests: [{ slot: 2, generation: 1, anchorPos: 4, anchorToken: 4 % GEO.vocabSize, rowsInRing: 4 }],
  });
  expect(r.outcome).toBe("ok");
  expect(r.drafts[0]!.reason).toBe("ok");
  expect(r.drafts[0]!.windowRows).toBe(4);
  // the worker placed the STEP's rows (copied once from the mapping, not reassembled)
  const cn = (await stats(c)).counters as Record<string, number>;
  expect([cn.steps_placed, cn.rows_placed, cn.transport_server_placed_messages]).toEqual([1, 4, 1]);
  // the rows did not cross the socket: fewer socket bytes in than request bytes handled
  expect(cn.transport_server_bytes_in!).toBeLessThan(cn.request_bytes!);
  expect(child.pid).toBeGreaterThan(0);
});
