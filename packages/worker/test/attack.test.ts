// Attacks on a running tapwire-worker (the built bin, a real child process, loopback only),
// CONTRACT 11 "Before HELLO" and "Memory and connections": pre-HELLO giant length prefixes from
// many connections (RSS stays flat), oversize prefixes with a readable header (NO_SESSION /
// TOO_LARGE, then closed), slowloris, idle floods past max_connections and at a lowered fd limit.
// Each asserts the worker stays up, a legitimate client is served during and after, and the
// counters name what was refused. Bounded here; `pnpm test:soak` scales them up
// (TAPWIRE_ATTACK_SCALE).
import { connect, type Socket } from "node:net";
import type { ChildHandle } from "@tapwire/testing";
import {
  announce,
  isAlive,
  makeTlsCredentials,
  openMany,
  rssOf,
  slowloris,
  spawnBin,
  watchRss,
  withFdLimit,
} from "@tapwire/testing";
import { encodeHeader, encodeHello, FrameStatus, frame, Op, splitFrame } from "@tapwire/wire";
import { afterEach, describe, expect, test } from "vitest";
import { createWorker, NullDrafter } from "../src/index.js";
import { entry, helloFor, Raw, Sess } from "./helpers.js";
import { BIN } from "./spawn.js";

const SCALE = Number(process.env.TAPWIRE_ATTACK_SCALE ?? "1");
const MiB = 1 << 20;
// The harness geometry: rows of 3 x 4096 bf16 (24 KiB), so the largest STEP is about 96 MiB.
const GEO = { numTaps: 3, hidden: 4096, window: 8, numSpec: 4, vocabSize: 2048 } as const;
const drafter = new NullDrafter(GEO);

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const f of cleanups.splice(0).reverse()) await f();
});

async function startWorker(
  args: string[] = [],
  nofile?: number,
): Promise<{ child: ChildHandle; ep: string }> {
  const argv = [
    "--drafter",
    "null",
    "--listen",
    "tcp://127.0.0.1:0",
    "--hidden",
    String(GEO.hidden),
    "--window",
    String(GEO.window),
    "--log-level",
    "warn",
    ...args,
  ];
  const child = await spawnBin(BIN, argv, nofile !== undefined ? withFdLimit(nofile) : {});
  cleanups.push(() => (isAlive(child.pid) ? child.kill("SIGKILL") : undefined));
  const ep = (child.readyLine.json as { endpoints: string[] }).endpoints[0]!;
  return { child, ep };
}

/** A legitimate client: HELLO, then STEPs of one 24 KiB row per slot (only a bound connection carries them). */
async function legit(ep: string, session: number): Promise<{ s: Sess; round: () => Promise<void> }> {
  const raw = await new Raw(ep).connect();
  cleanups.push(() => raw.close());
  const s = new Sess(raw, session, drafter, helloFor(drafter, { maxSlots: 16, maxRowsPerStep: 64 }));
  expect((await s.doHello()).status).toBe(FrameStatus.OK);
  let pos = 0;
  const round = async () => {
    const r = await s.step(
      [0, 1].map((slot) => entry({ slot, rowStart: pos, nRows: 1, anchorPos: pos + 1 })),
    );
    expect(r.status).toBe(FrameStatus.OK);
    pos++;
  };
  await round();
  return { s, round };
}

async function counters(s: Sess): Promise<Record<string, number>> {
  const a = await s.simple(Op.STATS);
  return (JSON.parse(Buffer.from(a.body).toString("utf8")) as { counters: Record<string, number> }).counters;
}

/** Writes `bytes` on a new raw connection and reads one length-prefixed reply (or null) until close. */
function rawExchange(ep: string, bytes: Uint8Array): Promise<{ reply: Uint8Array | null; closed: boolean }> {
  const m = /^tcp:\/\/(.+):(\d+)$/.exec(ep)!;
  return new Promise((resolve) => {
    const sock: Socket = connect({ host: m[1]!, port: Number(m[2]) }, () => sock.write(bytes));
    let acc = Buffer.alloc(0);
    sock.on("data", (d: Buffer) => {
      acc = Buffer.concat([acc, d]);
    });
    sock.on("error", () => {});
    const timer = setTimeout(() => {
      sock.destroy();
      resolve({ reply: null, closed: false });
    }, 10_000);
    sock.on("close", () => {
      clearTimeout(timer);
      const n = acc.length >= 4 ? acc.readUInt32LE(0) : -1;
      resolve({ reply: n >= 0 && acc.length >= 4 + n ? acc.subarray(4, 4 + n) : null, closed: true });
    });
  });
}

function oversizeHead(op: number, declared: number): Uint8Array {
  const b = new Uint8Array(4 + 24);
  new DataView(b.buffer).setUint32(0, declared, true);
  encodeHeader(b, 4, { op, status: 0, seq: 77, session: 0x1234, bodyLen: declared - 24 });
  return b;
}

describe("CONTRACT 11 before HELLO: a worker under attack", () => {
  test("pre-HELLO connections announcing 96 MiB: RSS flat, legitimate client served, refusals counted", async () => {
    const { child, ep } = await startWorker();
    const { s, round } = await legit(ep, 0xa001);
    for (let i = 0; i < 20; i++) await round();
    const idle = rssOf(child.pid);
    const watch = watchRss(child.pid, { intervalMs: 20 });
    const n = 300 * SCALE;
    // Each announces 96 MiB and sends 512 KiB of it (one shared buffer): a server that buffers
    // before HELLO would hold n x 512 KiB.
    const send = new Uint8Array(4 + 512 * 1024);
    send.set(announce(96 * MiB), 0);
    const flood = openMany(ep, n, { send, concurrency: 50, timeoutMs: 60_000 });
    let rounds = 0;
    let done = false;
    void flood.then(() => {
      done = true;
    });
    while (!done) {
      await round();
      rounds++;
    }
    const f = await flood;
    for (let i = 0; i < 20; i++) await round();
    const peak = watch.stop().peakBytes;
    await f.close();
    expect(isAlive(child.pid)).toBe(true);
    expect(rounds).toBeGreaterThan(0);
    // Nothing of a 96 MiB announcement is buffered before HELLO (CONTRACT 11: 4 KiB limit).
    expect(peak - idle).toBeLessThan(64 * MiB);
    const c = await counters(s);
    expect(c.transport_server_too_large).toBeGreaterThanOrEqual(1);
    // The flood sent no header after its prefixes: closed unanswered, never handed to the core.
    expect(c.transport_server_too_large).toBeLessThanOrEqual(n);
    expect(c.replies_ok).toBeGreaterThan(rounds);
  });

  test("an oversize prefix with a readable header: STEP and RESET NO_SESSION, others TOO_LARGE, then closed", async () => {
    const { ep } = await startWorker();
    const { s, round } = await legit(ep, 0xa002);
    for (const [op, status] of [
      [Op.STEP, FrameStatus.NO_SESSION],
      [Op.RESET, FrameStatus.NO_SESSION],
      [Op.PING, FrameStatus.TOO_LARGE],
      [Op.HELLO, FrameStatus.TOO_LARGE],
    ] as const) {
      const r = await rawExchange(ep, oversizeHead(op, 8 * MiB));
      expect(r.closed).toBe(true);
      expect(r.reply, `op ${op}`).not.toBeNull();
      const { header } = splitFrame(r.reply!, r.reply!.length);
      expect({ op: header.op, status: header.status, seq: header.seq, session: header.session }).toEqual({
        op,
        status,
        seq: 77,
        session: 0x1234,
      });
    }
    // No readable header (bad magic): just closed.
    const junk = oversizeHead(Op.STEP, 8 * MiB);
    junk[4] = 0;
    expect(await rawExchange(ep, junk)).toEqual({ reply: null, closed: true });
    await round();
    const c = await counters(s);
    expect(c.oversize_unbound).toBe(5);
    expect(c.transport_server_oversize_replies).toBe(4);
  });

  test("slowloris: unbound connections dripping bytes are closed after unbound-idle-ms", async () => {
    const { ep } = await startWorker(["--unbound-idle-ms", "800"]);
    const { s, round } = await legit(ep, 0xa003);
    // A well-formed HELLO (188 bytes with its prefix), one byte every 100 ms: it would take 19 s.
    const hello = frame({ op: Op.HELLO, seq: 1, session: 0xbad }, encodeHello(helloFor(drafter)));
    const payload = new Uint8Array(4 + hello.length);
    new DataView(payload.buffer).setUint32(0, hello.length, true);
    payload.set(hello, 4);
    const attack = slowloris(ep, {
      connections: 20 * SCALE,
      payload,
      intervalMs: 100,
      durationMs: 5000 * SCALE,
    });
    let done = false;
    void attack.then(() => {
      done = true;
    });
    // The legitimate (bound) client is not idle-closed, however slow.
    while (!done) {
      await round();
      await new Promise((r) => setTimeout(r, 200));
    }
    const r = await attack;
    expect(r.closedByPeer).toBe(r.opened);
    expect(r.stillOpen).toBe(0);
    // Closed by the unbound idle timer, not by the end of the drip.
    expect(r.closeAfterMs[r.closeAfterMs.length - 1]!).toBeLessThan(4000);
    const c = await counters(s);
    // At most half of --max-connections (32) are held unbound: the rest are evicted at once.
    const idleClosed = c.transport_server_unbound_idle_closed ?? 0;
    expect(idleClosed).toBeGreaterThanOrEqual(Math.min(r.opened, 32));
    expect(idleClosed + (c.transport_server_connections_evicted ?? 0)).toBeGreaterThanOrEqual(r.opened);
  });

  test("idle flood past max-connections: the longest-idle unbound connections are evicted, clients still get in", async () => {
    const { ep } = await startWorker(["--max-connections", "16"]);
    const { s, round } = await legit(ep, 0xa004);
    const flood = await openMany(ep, 200 * SCALE, { concurrency: 20 });
    // A new client gets a connection (an idle unbound one is evicted for it) and takes over.
    const other = await legit(ep, 0xa005);
    await other.round();
    expect(flood.open).toBeLessThanOrEqual(8);
    const c = await counters(other.s);
    expect(c.transport_server_connections_evicted).toBeGreaterThan(0);
    await flood.close();
    void s;
    void round;
  });

  test("idle flood at a lowered fd limit: the worker stays up and keeps serving", async () => {
    const { child, ep } = await startWorker(["--max-connections", "32"], 64);
    const { s, round } = await legit(ep, 0xa006);
    const flood = await openMany(ep, 300 * SCALE, { concurrency: 20, connectTimeoutMs: 2000 });
    await round();
    const fresh = await legit(ep, 0xa006 + 1);
    await fresh.round();
    expect(isAlive(child.pid)).toBe(true);
    await flood.close();
    void s;
  });
});

describe("CONTRACT 11 tokens and TLS: a refused client certificate", () => {
  test("a TLS handshake refused for a bad client certificate is logged with the reason and counted", async () => {
    const creds = makeTlsCredentials();
    const lines: { obj: Record<string, unknown>; msg: string | undefined }[] = [];
    const logger = {
      info() {},
      debug() {},
      error() {},
      warn(obj: object, msg?: string) {
        lines.push({ obj: obj as Record<string, unknown>, msg });
      },
    };
    const w = await createWorker({
      drafter: new NullDrafter({ window: 8 }),
      listen: ["tls://127.0.0.1:0"],
      tls: { cert: creds.serverCert, key: creds.serverKey, ca: creds.ca, requestCert: true },
      logger,
    });
    cleanups.push(() => w.close());
    const bad = new Raw(w.endpoints[0]!, {
      tls: { ca: creds.ca, cert: creds.wrongClientCert, key: creds.wrongClientKey },
    });
    await expect(
      bad.connect().then(() => bad.send(frame({ op: Op.PING, seq: 1, session: 0 }))),
    ).rejects.toThrow();
    bad.close();
    for (let i = 0; i < 200 && lines.length === 0; i++) await new Promise((r) => setTimeout(r, 10));
    const refused = lines.find((l) => l.msg === "TLS handshake refused");
    expect(refused?.obj.reason).toBe("bad_certificate");
    const c = w.stats().counters as Record<string, number>;
    expect(c.transport_server_tls_failures_bad_certificate).toBe(1);
    // A client with a good certificate is served.
    const good = await new Raw(w.endpoints[0]!, {
      tls: { ca: creds.ca, cert: creds.clientCert, key: creds.clientKey },
    }).connect();
    cleanups.push(() => good.close());
    expect((await good.send(frame({ op: Op.PING, seq: 1, session: 0 }))).status).toBe(FrameStatus.OK);
  });
});
