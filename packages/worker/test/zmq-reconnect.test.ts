// CONTRACT 6.2 and 11 (1.1) over ZeroMQ: a client that reconnects one session on a new DEALER
// each time (as RemoteDraftClient does after a timeout). A ROUTER never hears that the old
// DEALERs went away, so their bound peers stay; past maxConnections (64 by default) the transport
// forgets the bound peer idle longest instead of refusing every new peer (docs/contract-notes.md).
import { FrameStatus, frame, Op } from "@tapwire/wire";
import { afterEach, expect, test } from "vitest";
import type { Worker } from "../src/index.js";
import { createWorker } from "../src/index.js";
import { entry, helloFor, nullDrafter, Raw, Sess } from "./helpers.js";

const open: { workers: Worker[]; raws: Raw[] } = { workers: [], raws: [] };
afterEach(async () => {
  for (const r of open.raws.splice(0)) r.close();
  await Promise.all(open.workers.splice(0).map((w) => w.close()));
});

const d = nullDrafter();

async function dealer(w: Worker): Promise<Raw> {
  const r = await new Raw(w.endpoints[0] as string).connect();
  open.raws.push(r);
  return r;
}

test("70 reconnects of one session, each HELLO on a new DEALER: a new peer's PING and the last one's STEP are answered", async () => {
  const w = await createWorker({
    drafter: d,
    listen: ["zmq+tcp://127.0.0.1:0"],
    maxSlots: 32,
    maxRowsPerStep: 256,
  });
  open.workers.push(w);
  let s = new Sess(await dealer(w), 0x7e1, d, helloFor(d));
  expect((await s.doHello()).status).toBe(FrameStatus.OK);
  for (let i = 0; i < 70; i++) {
    s.raw.close();
    const next = new Sess(await dealer(w), s.session, d, s.hello);
    next.seq = s.seq;
    s = next;
    const a = await s.doHello();
    expect(a.status, `HELLO on DEALER ${i + 2}`).toBe(FrameStatus.OK);
  }
  const counters = () => w.stats().counters as Record<string, number>;
  // 71 bound peers, at most 64 held at once: 7 forgotten, none refused.
  expect(counters().transport_server_bound_evicted).toBe(7);
  const ping = await (await dealer(w)).send(frame({ op: Op.PING, seq: 1, session: 0 }));
  expect(ping.op).toBe(Op.PING);
  expect(ping.status).toBe(FrameStatus.OK);
  expect(counters().transport_server_bound_evicted).toBe(8);
  expect(counters().transport_server_connections_refused ?? 0).toBe(0);
  expect((await s.step([entry({ slot: 0, anchorPos: 1, nRows: 1 })])).status).toBe(FrameStatus.OK);
  // The worker heard of each forgotten peer (onClose): 72 peers, 8 forgotten, the PING one unbound.
  expect(w.stats().bound_connections).toBe(63);
});
