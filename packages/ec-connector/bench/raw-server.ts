/**
 * The raw baseline's server, run as a child process by bench/index.ts: for each 4-byte little-endian (u32 LE, like every tapwire length)
 * request N it streams N bytes from one preallocated buffer (1 MiB writes with backpressure, like
 * the ec data server). Prints one JSON "listening" line. A second argument asks for that SO_SNDBUF
 * on each connection, as the ec data server does by default (`src/data/sockbuf.ts`; issue 23: the
 * raw baseline with the same socket buffer, for an honest per-byte comparison).
 */
import { randomBytes } from "node:crypto";
import * as net from "node:net";
import { setSendBuffer } from "../src/data/sockbuf.js";

const MiB = 1024 * 1024;
const src = randomBytes(64 * MiB);
const arg = process.argv[2] ?? "tcp://127.0.0.1:0";
const sndbuf = Number(process.argv[3] ?? 0);
const server = net.createServer({ noDelay: true }, (s) => {
  if (sndbuf > 0) setSendBuffer(s, sndbuf);
  let pending = Buffer.alloc(0);
  let busy = Promise.resolve();
  s.on("error", () => {});
  s.on("data", (d: Buffer) => {
    pending = Buffer.concat([pending, d]);
    while (pending.length >= 4) {
      const n = pending.readUInt32LE(0);
      pending = pending.subarray(4);
      busy = busy.then(async () => {
        for (let off = 0; off < n; off += MiB) {
          const ok = s.write(src.subarray(off, Math.min(n, off + MiB)));
          if (!ok && off + MiB < n) await new Promise((r) => s.once("drain", r));
        }
      });
    }
  });
});
const onListening = () => {
  const a = server.address();
  const endpoint = typeof a === "object" && a !== null ? `tcp://127.0.0.1:${a.port}` : arg;
  process.stdout.write(`${JSON.stringify({ msg: "listening", endpoint })}\n`);
};
if (arg.startsWith("unix://")) server.listen(arg.slice("unix://".length), onListening);
else server.listen(Number(arg.split(":").pop()), "127.0.0.1", onListening);
process.on("SIGTERM", () => process.exit(0));
