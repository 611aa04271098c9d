/**
 * The attacker of bench/attack.ts, in a process of its own so that its connects do not share
 * an event loop with the measured client: waves of `connections` connections to `endpoint`, each
 * announcing `announced` bytes and sending nothing more, reopened as the server closes them,
 * until `durationMs` has passed. Prints one JSON line of totals.
 * Usage: node --import tsx bench/flood.ts ENDPOINT CONNECTIONS ANNOUNCED DURATION_MS
 */
import { announce, openMany } from "@tapwire/testing";

const [endpoint, connections, announced, durationMs] = process.argv.slice(2);
const end = Date.now() + Number(durationMs);
let opened = 0;
let closedByPeer = 0;
const failed: Record<string, number> = {};
while (Date.now() < end) {
  const f = await openMany(endpoint!, Number(connections), {
    send: announce(Number(announced)),
    concurrency: 100,
    timeoutMs: 30_000,
  });
  opened += f.opened;
  for (const [k, v] of Object.entries(f.failed)) failed[k] = (failed[k] ?? 0) + v;
  await f.waitClosedByPeer(Math.floor(f.opened * 0.9), 20_000).catch(() => undefined);
  closedByPeer += f.closedByPeer;
  await f.close();
}
process.stdout.write(`${JSON.stringify({ opened, closedByPeer, failed })}\n`);
