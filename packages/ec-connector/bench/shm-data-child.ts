/**
 * The producer side of the bench's data-plane-only shm row (issue 23): a `SocketDataTransport`
 * on `shm+unix://` in its own process, one entry per size; a line on stdin `<bytes>` makes a
 * grant and answers `{key, blocks}`. Prints its metadata first. `EC_BENCH_SHM_REGION=1`: the
 * cache region is shared (docs/ec-protocol.md 3.4 "Shared region", the producer's
 * `--shm-share-region`), else the per-connection ring serves.
 */
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { DEFAULT_SHM_DIR, ShmSharedRegion } from "../src/data/shm-map.js";
import { EmbeddingCache, SocketDataTransport, syntheticEmbedding } from "../src/index.js";

const BB = 65_536;
const NB = 512;
const sizes = process.argv.slice(2).map(Number);
const shared =
  process.env["EC_BENCH_SHM_REGION"] === "1" ? ShmSharedRegion.create(DEFAULT_SHM_DIR, NB * BB) : null;
const cache = new EmbeddingCache({
  numBlocks: NB,
  blockBytes: BB,
  ...(shared === null ? {} : { region: shared.bytes }),
});
const t = await SocketDataTransport.create({
  name: "bench-producer",
  region: cache.region,
  numBlocks: NB,
  blockBytes: BB,
  listen: `shm+unix://${join(tmpdir(), `ec-bench-data-${process.pid}.sock`)}`,
  ...(shared === null ? {} : { shmRegion: shared }),
  ...(process.env["EC_BENCH_SHM_SLOTS"]
    ? {
        shm: {
          slots: Number(process.env["EC_BENCH_SHM_SLOTS"]),
          slotBytes: Number(process.env["EC_BENCH_SHM_SLOT_KIB"]) * 1024,
        },
      }
    : {}),
});
const blocks = new Map<number, readonly number[]>();
for (const n of sizes) {
  cache.allocate(`e${n}`, n);
  cache.write(`e${n}`, 0, syntheticEmbedding(`e${n}`, n));
  blocks.set(n, cache.markReady(`e${n}`).blocks);
}
let k = 0;
createInterface({ input: process.stdin }).on("line", (l) => {
  const n = Number(l);
  const key = `s:${k++}`;
  t.grant(key, blocks.get(n)!, Number.POSITIVE_INFINITY, n);
  process.stdout.write(`${JSON.stringify({ key, blocks: blocks.get(n) })}\n`);
});
process.stdout.write(
  `${JSON.stringify({
    msg: "listening",
    meta: Buffer.from(t.getAgentMetadata()).toString("base64"),
    desc: Buffer.from(t.getMemDescriptor()).toString("base64"),
  })}\n`,
);
setInterval(() => t.getNewNotifs(), 5);
