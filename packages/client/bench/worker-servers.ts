// Bench child (issue 21, pool rows): several independent tapwire workers in ONE process, each
// `createWorker` of @tapwire/worker with its own WorkerCore (sessions, windows, seq), its own
// listener and a NullDrafter, one event loop for all. A pool of two of them against one of them
// then runs on as many processes as a client and one worker (docs/benchmarks/client.md, "Pool
// rows"). The geometry flags are those of `tapwire-worker`. Prints
// `{"msg":"listening","endpoints":[...]}` once every worker is bound; SIGTERM closes them.
import { parseArgs } from "node:util";
import { createWorker, NullDrafter, type Worker } from "@tapwire/worker";

const { values: v } = parseArgs({
  options: {
    workers: { type: "string" },
    listen: { type: "string" },
    window: { type: "string" },
    "num-spec": { type: "string" },
    vocab: { type: "string" },
    "num-taps": { type: "string" },
    hidden: { type: "string" },
    "drafter-identity": { type: "string" },
    "markov-identity": { type: "string" },
    "max-slots": { type: "string" },
    "max-rows-per-step": { type: "string" },
    "max-sessions": { type: "string" },
    "slot-buffer-windows": { type: "string" },
  },
});

function int(name: keyof typeof v): number {
  const x = Number(v[name]);
  if (!Number.isInteger(x) || x <= 0) {
    process.stderr.write(`worker-servers: --${name} must be a positive integer, got ${String(v[name])}\n`);
    process.exit(2);
  }
  return x;
}

function id(name: "drafter-identity" | "markov-identity"): Uint8Array {
  const h = v[name] ?? "";
  if (!/^[0-9a-f]{64}$/i.test(h)) {
    process.stderr.write(`worker-servers: --${name} must be 64 hex digits\n`);
    process.exit(2);
  }
  return Buffer.from(h, "hex");
}

const count = int("workers");
const geom = {
  window: int("window"),
  numSpec: int("num-spec"),
  vocabSize: int("vocab"),
  numTaps: int("num-taps"),
  hidden: int("hidden"),
  drafterIdentity: id("drafter-identity"),
  markovIdentity: id("markov-identity"),
};
const workers: Worker[] = [];
for (let i = 0; i < count; i++) {
  workers.push(
    await createWorker({
      drafter: new NullDrafter(geom),
      listen: [v.listen ?? "tcp://127.0.0.1:0"],
      maxSlots: int("max-slots"),
      maxRowsPerStep: int("max-rows-per-step"),
      maxSessions: int("max-sessions"),
      ...(v["slot-buffer-windows"] === undefined ? {} : { slotBufferWindows: int("slot-buffer-windows") }),
    }),
  );
}
process.stdout.write(
  `${JSON.stringify({ msg: "listening", endpoints: workers.map((w) => w.endpoints[0]) })}\n`,
);
process.on("SIGTERM", () => {
  Promise.all(workers.map((w) => w.close())).finally(() => process.exit(0));
});
