import { makeTlsCredentials, uniqueSocketPath } from "@tapwire/testing";
import type { ClientOptions } from "@tapwire/transport";
import { TransportError } from "@tapwire/transport";
import { FrameStatus, frame, Op, ReqStatus, splitFrame } from "@tapwire/wire";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import type { Worker, WorkerOptions } from "../src/index.js";
import { createWorker } from "../src/index.js";
import { entry, helloFor, nullDrafter, Raw, Sess } from "./helpers.js";

/**
 * The worker over every transport scheme (CONTRACT 3): one worker listening on all of them at
 * once, driven with raw frames. The protocol itself is covered over tcp in protocol.test.ts.
 */
const creds = makeTlsCredentials();
const CASES: { scheme: string; listen: string; client: ClientOptions; stream: boolean }[] = [
  { scheme: "tcp", listen: "tcp://127.0.0.1:0", client: {}, stream: true },
  { scheme: "unix", listen: `unix://${uniqueSocketPath("wk")}`, client: {}, stream: true },
  { scheme: "tls", listen: "tls://127.0.0.1:0", client: { tls: { ca: creds.ca } }, stream: true },
  { scheme: "zmq+tcp", listen: "zmq+tcp://127.0.0.1:0", client: {}, stream: false },
  { scheme: "zmq+ipc", listen: `zmq+ipc://${uniqueSocketPath("wz")}`, client: {}, stream: false },
  // issue 23: doorbells on a unix socket, request bytes through a /dev/shm mapping
  { scheme: "shm+unix", listen: `shm+unix://${uniqueSocketPath("wm")}`, client: {}, stream: true },
];

const drafter = nullDrafter();
let worker: Worker;
beforeAll(async () => {
  const opts: WorkerOptions = {
    drafter,
    listen: CASES.map((c) => c.listen),
    tls: { cert: creds.serverCert, key: creds.serverKey },
    maxSlots: 4,
    maxRowsPerStep: 16,
  };
  worker = await createWorker(opts);
});
afterAll(async () => {
  await worker.close();
});

describe.each(CASES.map((c, i) => [c.scheme, c, i] as const))("worker over %s", (_s, c, i) => {
  const ep = () => worker.endpoints[i]!;

  test("binds the endpoint it was given (port 0 resolved); HELLO, STEP, PING", async () => {
    expect(ep().startsWith(`${c.scheme}://`)).toBe(true);
    expect(ep()).not.toMatch(/:0$/);
    const raw = await new Raw(ep(), c.client).connect();
    try {
      const s = new Sess(raw, 0x100 + i, drafter, helloFor(drafter, { maxSlots: 4, maxRowsPerStep: 16 }));
      expect((await s.doHello()).status).toBe(FrameStatus.OK);
      const r = await s.step([entry({ slot: 1, anchorPos: 3, nRows: 3 })]);
      expect(r.status).toBe(FrameStatus.OK);
      expect([r.views!.status[0], r.views!.windowRows[0]]).toEqual([ReqStatus.OK, 3]);
      expect(worker.debugWindow(1).nRows).toBe(3);
      expect((await raw.send(frame({ op: Op.PING, seq: 1, session: 0 }))).status).toBe(FrameStatus.OK);
    } finally {
      raw.close();
    }
  });

  test("an unreadable header is answered BAD_FRAME (stream transports then close the connection)", async () => {
    const raw = await new Raw(ep(), c.client).connect();
    try {
      const a = await raw.send(new Uint8Array(10));
      expect(a.status).toBe(FrameStatus.BAD_FRAME);
      if (c.stream) {
        await expect(raw.send(frame({ op: Op.PING, seq: 1, session: 0 }))).rejects.toBeInstanceOf(
          TransportError,
        );
      }
    } finally {
      raw.close();
    }
  });

  test("a message above the worker's maximum is refused by the transport; the worker keeps serving", async () => {
    const raw = await new Raw(ep(), { ...c.client, maxMessageBytes: 1 << 26 }).connect();
    const big = frame({ op: Op.PING, seq: 1, session: 0 }, new Uint8Array(worker.core.maxMessageBytes));
    try {
      const buf = new Uint8Array(64);
      const err = await raw.client.request(big, buf, 1500).then(
        (n: number) => n,
        (e: unknown) => e,
      );
      if (c.stream) {
        // CONTRACT 11 (1.1): before HELLO the worker reads the header alone, answers TOO_LARGE
        // (NO_SESSION for a STEP or RESET) and closes the connection.
        expect(typeof err).toBe("number");
        expect(splitFrame(buf, err as number).header).toMatchObject({
          op: Op.PING,
          status: FrameStatus.TOO_LARGE,
        });
        return;
      }
      expect(err).toBeInstanceOf(TransportError);
      // Stream servers close at once; libzmq drops the pipe (the client may only see its timeout).
      expect(["TRANSPORT_CLOSED", "TRANSPORT_TIMEOUT"]).toContain((err as TransportError).code);
      if (c.stream) expect((err as TransportError).code).toBe("TRANSPORT_CLOSED");
    } finally {
      raw.close();
    }
    const again = await new Raw(ep(), c.client).connect();
    try {
      expect((await again.send(frame({ op: Op.PING, seq: 2, session: 0 }))).status).toBe(FrameStatus.OK);
    } finally {
      again.close();
    }
  });
});
