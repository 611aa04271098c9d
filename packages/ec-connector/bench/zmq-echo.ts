/**
 * The control plane's raw baseline, run as a child process by bench/index.ts: a plain ZeroMQ
 * ROUTER (same socket options as the producer's: linger 0, 64 KiB message cap, default
 * heartbeats) that echoes every message to its sender. Prints one JSON "listening" line.
 */
import { Router } from "zeromq";

const sock = new Router({
  linger: 0,
  maxMessageSize: 64 * 1024,
  heartbeatInterval: 2_000,
  heartbeatTimeout: 4_000,
  heartbeatTimeToLive: 8_000,
});
await sock.bind("tcp://127.0.0.1:0");
process.stdout.write(`${JSON.stringify({ msg: "listening", endpoint: sock.lastEndpoint })}\n`);
for await (const [id, ...frames] of sock) await sock.send([id!, ...frames]);
