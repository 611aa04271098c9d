// A flood of well-formed XferReqs in its own process (issue 19, the producer-flood tests):
// `node flood-child.mjs <control> <compat> <dealers> <mm_hash,...>`. Every DEALER sends requests
// as fast as its socket takes them (built from the EC-CONTRACT 3 key table with @msgpack/msgpack);
// the even ones read their replies, the odd ones never do. Prints {"msg":"flooding"} once every
// DEALER has sent its first request and a {"msg":"sent"} count line every 2000 sends per DEALER 0;
// runs until killed (the tests end it with SIGKILL, abruptly).
import { encode } from "@msgpack/msgpack";
import { Dealer } from "zeromq";

const [control, compat, dealersArg, hashesArg] = process.argv.slice(2);
const hashes = hashesArg.split(",");
const dealers = Number(dealersArg);
let started = 0;
let sent = 0;
for (let i = 0; i < dealers; i++) {
  const d = new Dealer({ linger: 0, sendHighWaterMark: 1000, receiveHighWaterMark: 1000 });
  d.connect(control);
  const reads = i % 2 === 0;
  if (reads) {
    void (async () => {
      try {
        for await (const _ of d) {
          // drop the reply
        }
      } catch {}
    })();
  }
  void (async () => {
    let k = 0;
    for (let n = 0; n < (process.env.FLOOD_COUNT ? Number(process.env.FLOOD_COUNT) : Infinity); n++) {
      const msg = encode({
        mm_hash: hashes[k % hashes.length],
        compatibility_hash: compat,
        session_id: `flood-${i}-${k % 64}`,
        connector_version: 2,
      });
      try {
        await d.send(msg);
      } catch {
        return;
      }
      k++;
      sent++;
      if (k === 1 && ++started === dealers)
        process.stdout.write(`${JSON.stringify({ msg: "flooding", dealers })}\n`);
      if (i === 0 && k % 2000 === 0) process.stdout.write(`${JSON.stringify({ msg: "sent", sent })}\n`);
    }
  })();
}
