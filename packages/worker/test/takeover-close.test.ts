// CONTRACT 6.2 (1.2): a session is protected from takeover only while at least one connection
// bound to it is open. Issue 19: a client with a token restarts; the new process's HELLO (a new
// session id) must be admitted at once after the old process's connection closed, not refused
// BUSY for the rest of a lease its predecessor left. Over real sockets.
import { FrameStatus } from "@tapwire/wire";
import { afterEach, describe, expect, test } from "vitest";
import type { Worker } from "../src/index.js";
import { createWorker } from "../src/index.js";
import { entry, helloFor, nullDrafter, Raw, Sess } from "./helpers.js";

const TOKEN = "restart-token";
const d = nullDrafter();
const open: { workers: Worker[]; raws: Raw[] } = { workers: [], raws: [] };
afterEach(async () => {
  for (const r of open.raws.splice(0)) r.close();
  await Promise.all(open.workers.splice(0).map((w) => w.close()));
});

async function waitFor(cond: () => boolean, what: string, ms = 20_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

async function client(w: Worker, id: number): Promise<Sess> {
  const r = await new Raw(w.endpoints[0]!).connect();
  open.raws.push(r);
  return new Sess(r, id, d, helloFor(d), TOKEN);
}

describe("CONTRACT 6.2 (1.2): takeover protection ends with the last bound connection", () => {
  test("a restarted engine with a token is admitted at once after its predecessor's connection closed", async () => {
    // A lease far longer than the test: only the close can end the protection.
    const w = await createWorker({
      drafter: d,
      listen: ["tcp://127.0.0.1:0"],
      token: TOKEN,
      sessionLease: 600_000,
    });
    open.workers.push(w);
    const old = await client(w, 0x5101);
    expect((await old.doHello()).status).toBe(FrameStatus.OK);
    expect((await old.step([entry({ slot: 0, anchorPos: 1, nRows: 1 })])).status).toBe(FrameStatus.OK);
    // While the old process's connection is open, its lease protects it (CONTRACT 11 tokens).
    const early = await client(w, 0x5102);
    expect((await early.doHello()).status).toBe(FrameStatus.BUSY);
    // The old process stops: its connection closes; the worker sees the close.
    old.raw.close();
    await waitFor(() => w.stats().bound_connections === 0, "the worker to see the close");
    // The restarted process (a new session id): admitted on its first HELLO.
    const fresh = await client(w, 0x5103);
    const a = await fresh.doHello();
    expect(a.status).toBe(FrameStatus.OK);
    expect(a.reply!.windowsKept).toBe(0);
    expect(w.stats().session).toBe(0x5103);
    expect((await fresh.step([entry({ slot: 0, anchorPos: 1, nRows: 1 })])).status).toBe(FrameStatus.OK);
  });

  test("one of two bound connections closing keeps the protection", async () => {
    const w = await createWorker({
      drafter: d,
      listen: ["tcp://127.0.0.1:0"],
      token: TOKEN,
      sessionLease: 600_000,
    });
    open.workers.push(w);
    const a = await client(w, 0x5201);
    expect((await a.doHello()).status).toBe(FrameStatus.OK);
    const r2 = await new Raw(w.endpoints[0]!).connect();
    open.raws.push(r2);
    const a2 = new Sess(r2, 0x5201, d, helloFor(d), TOKEN);
    a2.seq = a.seq;
    expect((await a2.doHello()).status).toBe(FrameStatus.OK);
    a.raw.close();
    await waitFor(() => w.stats().bound_connections === 1, "the worker to see one close");
    const other = await client(w, 0x5202);
    expect((await other.doHello()).status).toBe(FrameStatus.BUSY);
  });
});
