// A consumer in its own process (for the "consumer killed" test): requests one embedding from the
// producer given on the command line and keeps polling; prints one JSON line per event.
import { ConsumerConnector } from "../../dist/index.js";

const [producer, compat, mmHash, nbytes] = process.argv.slice(2);
const conn = await ConsumerConnector.create({ numBlocks: 2048, blockBytes: 65536, compatibility: compat });
conn.request(mmHash, producer, Number(nbytes), performance.now() + 60_000);
process.stdout.write(`${JSON.stringify({ msg: "listening", pid: process.pid })}\n`);
const tick = () => {
  const r = conn.poll();
  if (r.loaded.length > 0 || r.failed.length > 0)
    process.stdout.write(`${JSON.stringify({ msg: "result", ...r })}\n`);
  setTimeout(tick, 1);
};
tick();
