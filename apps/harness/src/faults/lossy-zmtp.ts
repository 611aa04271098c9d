/**
 * `--faults` with two encoders: a TCP relay in front of an encoder's events PUB that understands
 * just enough ZMTP 3 (the 64-byte greeting, then frames: a flags byte, a 1- or 8-byte size, the
 * body) to drop whole messages at a given rate while passing the handshake, commands (READY,
 * PING/PONG) and subscriptions. The subscriber sees real gaps in `seq` (EC-CONTRACT 10.1) and must
 * close them by replay (10.2).
 */
import * as net from "node:net";

/** A running relay. */
export interface LossyZmtp {
  /** `tcp://127.0.0.1:port` to connect a SUB to. */
  endpoint: string;
  /** Messages dropped so far. */
  readonly dropped: number;
  /** Messages passed so far. */
  readonly passed: number;
  close(): Promise<void>;
}

const GREETING = 64;

/** Starts a relay to `target` (`tcp://host:port`) that drops a `rate` fraction of PUB→SUB messages. */
export async function startLossyZmtp(target: string, rate: number, random: () => number): Promise<LossyZmtp> {
  const m = /^tcp:\/\/([^:]+):(\d+)$/.exec(target);
  if (m === null) throw new Error(`lossy relay: ${target} is not tcp://host:port`);
  const host = m[1] as string;
  const port = Number(m[2]);
  const stats = { dropped: 0, passed: 0 };
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const up = net.connect(port, host);
    sockets.add(client);
    sockets.add(up);
    const end = () => {
      client.destroy();
      up.destroy();
      sockets.delete(client);
      sockets.delete(up);
    };
    client.on("error", end).on("close", end);
    up.on("error", end).on("close", end);
    client.pipe(up); // subscriptions and the SUB's handshake pass untouched
    let buf: Buffer = Buffer.alloc(0);
    let greeting = GREETING;
    let dropping = false; // the current multipart message is being dropped
    let inMessage = false;
    up.on("data", (chunk: Buffer) => {
      buf = buf.length === 0 ? chunk : Buffer.concat([buf, chunk]);
      const out: Buffer[] = [];
      if (greeting > 0) {
        const n = Math.min(greeting, buf.length);
        out.push(buf.subarray(0, n));
        buf = buf.subarray(n);
        greeting -= n;
      }
      while (greeting === 0 && buf.length >= 2) {
        const flags = buf[0] as number;
        const long = (flags & 0x02) !== 0;
        const head = long ? 9 : 2;
        if (buf.length < head) break;
        const size = long ? Number(buf.readBigUInt64BE(1)) : (buf[1] as number);
        if (buf.length < head + size) break;
        const frame = buf.subarray(0, head + size);
        buf = buf.subarray(head + size);
        const command = (flags & 0x04) !== 0;
        if (command) {
          out.push(frame);
          continue;
        }
        if (!inMessage) {
          dropping = random() < rate;
          if (dropping) stats.dropped++;
          else stats.passed++;
        }
        inMessage = (flags & 0x01) !== 0;
        if (!dropping) out.push(frame);
      }
      if (out.length > 0) client.write(Buffer.concat(out));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const addr = server.address() as net.AddressInfo;
  return {
    endpoint: `tcp://127.0.0.1:${addr.port}`,
    get dropped() {
      return stats.dropped;
    },
    get passed() {
      return stats.passed;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
