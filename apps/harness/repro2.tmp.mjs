import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { RemoteDraftClient, RoundCore } from "@tapwire/client";
import { startFaultProxy } from "@tapwire/testing";

const w = spawn(
  process.execPath,
  [
    "../../packages/worker/dist/bin/worker.js",
    "--drafter",
    "null",
    "--listen",
    "tcp://127.0.0.1:0",
    "--num-taps",
    "3",
    "--hidden",
    "1024",
  ],
  { stdio: ["ignore", "pipe", "inherit"] },
);
const ep = await new Promise((res) =>
  createInterface({ input: w.stdout }).on("line", (l) => {
    const o = JSON.parse(l);
    if (o.msg === "listening") res(o.endpoints[0]);
  }),
);
const port = Number(ep.split(":").pop());
const proxy = await startFaultProxy({ host: "127.0.0.1", port });
const client = new RemoteDraftClient({
  endpoint: proxy.endpoint,
  window: 16,
  numSpec: 4,
  numTaps: 3,
  hidden: 1024,
  vocabSize: 2048,
  maxSlots: 4,
  maxRowsPerStep: 64,
  drafterIdentity: new Uint8Array(32),
  markovIdentity: new Uint8Array(32),
  requestTimeoutMs: 200,
  connectTimeoutMs: 500,
  backoffMs: 25,
  backoffMaxMs: 400,
});
console.log("ready", await client.waitReady(5000));
const core = new RoundCore({ client });
const t0 = Date.now();
let anchor = 8;
const row = new Uint8Array(6144 * 8);
for (let i = 0; i < 400; i++) {
  if (i === 20) {
    proxy.setFault({ kind: "stall" });
    setTimeout(() => {
      proxy.setFault(null);
      console.log("cleared at", Date.now() - t0);
    }, 400);
    console.log("stall at", Date.now() - t0);
  }
  const r = await core.round({
    requests: [{ slot: 0, generation: 1, anchorPos: anchor, anchorToken: 5, newRows: row }],
  });
  anchor += 8;
  if (r.outcome !== "ok" || i % 50 === 0)
    console.log(i, Date.now() - t0, r.outcome, "epoch", client.epoch, client.lastError);
  await new Promise((r) => setTimeout(r, 5));
}
await client.close();
await proxy.close();
w.kill();
