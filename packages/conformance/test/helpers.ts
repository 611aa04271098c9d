import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import type { ChildHandle } from "@tapwire/testing";
import { makeTlsCredentials, spawnBin, uniqueSocketPath } from "@tapwire/testing";

const require = createRequire(import.meta.url);

/** Absolute path of bin `name` of package `pkg` (from its package.json `bin`), as apps/harness/src/procs.ts resolves it. */
export function binPath(pkg: string, name: string): string {
  const pj = require.resolve(`${pkg}/package.json`);
  const meta = JSON.parse(readFileSync(pj, "utf8")) as { bin?: string | Record<string, string> };
  const rel = typeof meta.bin === "string" ? meta.bin : meta.bin?.[name];
  if (rel === undefined) throw new Error(`${pkg} has no bin ${name}`);
  return join(dirname(pj), rel);
}

/** The built tapwire-conformance bin of this package. */
export const CONFORMANCE_BIN = join(
  dirname(new URL(import.meta.url).pathname),
  "..",
  "dist",
  "bin",
  "conformance.js",
);

/** Geometry every test worker uses (small rows keep the suites fast). */
export const GEOMETRY = [
  "--num-taps",
  "2",
  "--hidden",
  "32",
  "--window",
  "8",
  "--num-spec",
  "4",
  "--vocab",
  "512",
];

let tlsFiles: { cert: string; key: string } | null = null;
/** PEM files of a test certificate for 127.0.0.1. */
export function tlsFilesForTest(): { cert: string; key: string } {
  if (tlsFiles === null) {
    const c = makeTlsCredentials();
    const dir = mkdtempSync(join(tmpdir(), "tapwire-conf-tls-"));
    writeFileSync(join(dir, "cert.pem"), c.serverCert);
    writeFileSync(join(dir, "key.pem"), c.serverKey);
    tlsFiles = { cert: join(dir, "cert.pem"), key: join(dir, "key.pem") };
  }
  return tlsFiles;
}

/** Spawns tapwire-worker listening on tcp, unix, tls, zmq+tcp and shm+unix; returns it and its endpoints by scheme. */
export async function spawnWorker(
  drafter: "null" | "reference",
  extra: string[] = [],
): Promise<{ child: ChildHandle; endpoints: Record<string, string> }> {
  const tls = tlsFilesForTest();
  const child = await spawnBin(
    binPath("@tapwire/worker", "tapwire-worker"),
    [
      "--drafter",
      drafter,
      "--listen",
      "tcp://127.0.0.1:0",
      "--listen",
      `unix://${uniqueSocketPath("conf")}`,
      "--listen",
      "tls://127.0.0.1:0",
      "--listen",
      "zmq+tcp://127.0.0.1:0",
      "--listen",
      `shm+unix://${uniqueSocketPath("conf-shm")}`,
      "--tls-cert",
      tls.cert,
      "--tls-key",
      tls.key,
      "--log-level",
      "error",
      ...GEOMETRY,
      ...extra,
    ],
    { timeoutMs: 30_000 },
  );
  const eps = (child.readyLine.json?.endpoints ?? []) as string[];
  const endpoints: Record<string, string> = {};
  for (const e of eps) endpoints[e.slice(0, e.indexOf("://"))] = e;
  return { child, endpoints };
}

/** Defects a {@link BrokenProxy} plants in front of a conforming worker. */
export interface Defects {
  /** Write reply length prefixes big-endian. */
  bigEndianReplies?: boolean;
  /** Also accept a big-endian request prefix (a reader that "detects" the byte order). */
  lenientPrefix?: boolean;
  /** Consume the seq of a STEP answered BAD_FRAME (an empty STEP with that seq is slipped in). */
  consumeBadFrameSeq?: boolean;
  /** Keep windows across a new session (every session is mapped onto the first one the worker saw). */
  keepWindowsAcrossSessions?: boolean;
  /**
   * CONTRACT 12.1 broken: a shared worker that drops a live session to admit another. A HELLO
   * answered BUSY makes the proxy close the connections of the session bound first (the worker
   * sees them close, so that session becomes droppable) and send the HELLO again until admitted.
   */
  dropLiveOnBusy?: boolean;
}

const rd32 = (b: Uint8Array, o: number) =>
  (b[o]! | (b[o + 1]! << 8) | (b[o + 2]! << 16) | (b[o + 3]! << 24)) >>> 0;
const wr32 = (b: Uint8Array, o: number, v: number) => {
  const x = v >>> 0;
  b[o] = x & 0xff;
  b[o + 1] = (x >>> 8) & 0xff;
  b[o + 2] = (x >>> 16) & 0xff;
  b[o + 3] = (x >>> 24) & 0xff;
};

/** Splits a stream into u32-prefixed messages. */
class Deframer {
  private buf = Buffer.alloc(0);
  constructor(
    private readonly lenient: boolean,
    private readonly onMsg: (m: Buffer) => void,
    private readonly onBad: () => void,
  ) {}
  push(d: Buffer): void {
    this.buf = Buffer.concat([this.buf, d]);
    for (;;) {
      if (this.buf.length < 4) return;
      let len = this.buf.readUInt32LE(0);
      if (len > 64 * 1024 * 1024) {
        const be = this.buf.readUInt32BE(0);
        if (this.lenient && be <= 64 * 1024 * 1024) len = be;
        else {
          this.onBad();
          return;
        }
      }
      if (this.buf.length < 4 + len) return;
      const m = this.buf.subarray(4, 4 + len);
      this.buf = this.buf.subarray(4 + len);
      this.onMsg(Buffer.from(m));
    }
  }
}

/**
 * A deliberately non-conforming worker: a tcp proxy in front of a conforming one that plants
 * the given defects. Returns its endpoint and a close function.
 */
export async function startBrokenProxy(
  upstreamPort: number,
  d: Defects,
): Promise<{ endpoint: string; close(): Promise<void> }> {
  // CONTRACT 6.2 session aliasing (keepWindowsAcrossSessions): the worker only ever sees `base`.
  let base = 0;
  let hi = 0;
  let current = 0;
  const offsets = new Map<number, number>();
  const sockets = new Set<net.Socket>();
  // dropLiveOnBusy: connections by the session they were bound to, in bind order.
  const boundPairs: { session: number; end: () => void }[] = [];
  const server = net.createServer((client) => {
    sockets.add(client);
    const up = net.connect({ host: "127.0.0.1", port: upstreamPort });
    sockets.add(up);
    let swallow = 0;
    const pending: { session: number; op: number }[] = [];
    let lastHello: Buffer | null = null;
    let retries = 0;
    const end = () => {
      client.destroy();
      up.destroy();
    };
    client.on("error", end);
    up.on("error", end);
    client.on("close", end);
    up.on("close", end);
    const sendUp = (m: Buffer) => {
      const p = Buffer.alloc(4);
      p.writeUInt32LE(m.length);
      up.write(Buffer.concat([p, m]));
    };
    const fromClient = new Deframer(
      d.lenientPrefix === true,
      (m) => {
        if (d.dropLiveOnBusy === true && m.length >= 24 && m[6] === 1) {
          lastHello = m;
          retries = 0;
        }
        if (d.keepWindowsAcrossSessions === true && m.length >= 24) {
          const op = m[6]!;
          const s = rd32(m, 12);
          const seq = rd32(m, 8);
          pending.push({ session: s, op });
          if (s !== 0 && (op === 1 || op === 2 || op === 5)) {
            if (base === 0 && op === 1) base = s;
            if (op === 1 && s !== current) offsets.set(s, (hi + 1 - seq) >>> 0);
            const off = offsets.get(s);
            if (off !== undefined && base !== 0) {
              wr32(m, 12, base);
              wr32(m, 8, seq + off);
            }
          }
        }
        sendUp(m);
      },
      end,
    );
    const fromUp = new Deframer(
      false,
      (m) => {
        if (swallow > 0) {
          swallow--;
          return;
        }
        if (d.dropLiveOnBusy === true && m.length >= 24 && m[6] === 1 && lastHello !== null) {
          const asked = rd32(m, 12);
          if (m[7] === 0) boundPairs.push({ session: asked, end });
          if (m[7] === 10 && retries < 100) {
            retries++;
            const victim = boundPairs.find((p) => p.session !== asked);
            if (victim !== undefined) {
              for (const p of boundPairs.filter((q) => q.session === victim.session)) p.end();
              for (let i = boundPairs.length - 1; i >= 0; i--)
                if (boundPairs[i]!.session === victim.session) boundPairs.splice(i, 1);
            }
            const again = lastHello;
            setTimeout(() => sendUp(again), 20);
            return;
          }
        }
        if (d.keepWindowsAcrossSessions === true && m.length >= 24) {
          const req = pending.shift();
          if (
            req !== undefined &&
            (req.op === 1 || req.op === 2 || req.op === 5) &&
            req.session !== 0 &&
            rd32(m, 12) === base &&
            offsets.has(req.session)
          ) {
            const iseq = rd32(m, 8);
            if (m[7] === 0 && (m[6] === 1 || m[6] === 2 || m[6] === 5)) {
              hi = iseq;
              if (m[6] === 1) current = req.session;
            }
            wr32(m, 12, req.session);
            wr32(m, 8, iseq - offsets.get(req.session)!);
          }
        }
        const p = Buffer.alloc(4);
        if (d.bigEndianReplies === true) p.writeUInt32BE(m.length);
        else p.writeUInt32LE(m.length);
        client.write(Buffer.concat([p, m]));
        if (d.consumeBadFrameSeq === true && m.length >= 24 && m[6] === 2 && m[7] === 3) {
          // An empty STEP (n_req 0: body = rows_offset_for(0) = 40 zero bytes) with the refused seq.
          const f = Buffer.alloc(24 + 40);
          f.set([0x44, 0x53, 0x50, 0x4b, 1, 0, 2, 0]);
          wr32(f, 8, rd32(m, 8));
          wr32(f, 12, rd32(m, 12));
          wr32(f, 16, 40);
          swallow++;
          sendUp(f);
        }
      },
      end,
    );
    client.on("data", (b: Buffer) => fromClient.push(b));
    up.on("data", (b: Buffer) => fromUp.push(b));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  const port = (server.address() as net.AddressInfo).port;
  return {
    endpoint: `tcp://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}
